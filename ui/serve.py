"""`make run`: `streamlit run app.py` with the app's modules imported before it listens.

Streamlit imports a script's modules on its first run, which is the first
visitor's page load: on a 2-core CPU they made a 6 s first load of what is 2.5 s
without them (bench/first_load.py, docs/BENCHMARKS.md). Imported here
first, in the one process Streamlit then serves from, they are already in
`sys.modules` when that run asks for them. `streamlit run app.py` still works; its
first visitor waits for them.

    python -m ui.serve [streamlit run's options, e.g. --server.port 8501]
"""

from __future__ import annotations

import sys
from pathlib import Path

from streamlit.web import cli

APP = Path(__file__).resolve().parents[1] / "app.py"


def main(argv: list[str]) -> int:
    """Import what app.py's first run would, then serve it with `argv`'s options."""
    import ui.start  # noqa: F401  (torch, backend, pandas, Altair: the slow imports)

    # click's main exits the process itself; its status is returned where it does not.
    return cli.main(["run", str(APP), *argv], prog_name="streamlit")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
