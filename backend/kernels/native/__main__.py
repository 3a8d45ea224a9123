"""Build PagedLab's compiled CPU operator: `python -m backend.kernels.native [--verbose]`.

Exits 0 once the library is built and stamped, or already is for this source and torch.
A failed build (no C++ compiler, say) prints why and exits 1; `--optional` makes that a
warning and exit 0, for `make run`, where PagedLab works without it (the torch path then
gathers, slower).
"""

from __future__ import annotations

import argparse
import sys

from backend.kernels import native


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verbose", action="store_true", help="show the compiler's output")
    parser.add_argument("--optional", action="store_true",
                        help="a failed build is a warning, not an error")
    args = parser.parse_args(argv)
    if native.built():
        print(f"native operator up to date: {native.LIBRARY}")
        return 0
    print("building the native CPU decode operator (about 15 s) ...", flush=True)
    try:
        path = native.build(verbose=args.verbose)
    except Exception as exc:  # the builder raises many kinds; all mean "not built"
        level = "warning" if args.optional else "error"
        print(f"{level}: the native operator did not build: {exc}", file=sys.stderr)
        print("the torch kernel still works without it (its decodes gather, slower)",
              file=sys.stderr)
        return 0 if args.optional else 1
    print(f"built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
