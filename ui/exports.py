"""Download what a page shows, and upload a snapshot to continue from it.

Downloads are built from the snapshot dict the page draws, so a file holds
exactly what the person sees. Every file (the snapshot JSON, the same bytes
`python -m backend run --out` writes for that state, the tables, images and
the run's zip) is built only when its button is clicked: a long session's
snapshot runs to megabytes, and building it on every rerun would slow every
click.
No download reruns the page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import streamlit as st

from backend import views
from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import counted, sentence
from backend.io.export import (
    TABLES,
    TableName,
    chart_png,
    chart_svg,
    run_zip,
    snapshot_bytes,
    table,
    to_csv,
    to_parquet,
)
from backend.io.scenario_export import scenario_json
from backend.io.snapshot import MAX_SNAPSHOT_BYTES, parse_snapshot_text
from backend.sessions.history import History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import Known, known_snapshots
from backend.views.text import plain_md
from ui import restore, session
from ui.kept import keep_result, kept_result
from ui.uploads import limit_help, uploader_mib

Snapshot = dict[str, Any]


# ---- deferred builders (called by Streamlit when a button is clicked) -----------------

def _csv(snap: Snapshot, name: TableName) -> bytes:
    return to_csv(table(snap, name))


def _parquet(snap: Snapshot, name: TableName) -> bytes:
    return to_parquet(table(snap, name))


def _png(snap: Snapshot, page: int) -> bytes:
    return chart_png(views.grid_chart(snap, page=page, selectable=False))


def _svg(snap: Snapshot, page: int) -> bytes:
    return chart_svg(views.grid_chart(snap, page=page, selectable=False)).encode()


def _zip(snapshots: Sequence[Snapshot] | History) -> bytes:
    # A History rebuilds each step's snapshot as it is iterated: only on a click. Its
    # steps read back from a saved session are checked first, so that no file in the
    # zip is one an upload would refuse.
    if isinstance(snapshots, History):
        return run_zip(known_snapshots(snapshots).snapshots)
    return run_zip(list(snapshots))


def _button(row: Any, label: str, data: bytes | Callable[[], bytes], file_name: str, mime: str,
            key: str, help_text: str, *, icon: bool = True) -> None:
    # As wide as its label: in a column of a fixed share of the page a label is cut
    # short with "…" wherever the page is narrower than planned (800 px with the sidebar
    # open left "Snaps…" and two "Grid (…" buttons).
    row.download_button(label, data=data, file_name=file_name, mime=mime, key=key,
                        on_click="ignore", help=help_text, width="content",
                        icon=":material/download:" if icon else None)


def _row() -> Any:
    """A row of buttons as wide as their labels, wrapping onto another line where the
    page is too narrow for all of them."""
    return st.container(horizontal=True, gap="small")


def downloads(snap: Snapshot, *, stem: str, prefix: str,
              run: Sequence[Snapshot] | History | None = None, run_help: str = "") -> None:
    """Download buttons for one snapshot and, given `run`, for a whole run as a zip.

    `stem` starts every file name (the step number follows); `prefix` keys the
    buttons, so two pages keep theirs apart.
    """
    name = f"{stem}-step-{snap['step']:04d}"
    page = st.session_state.get(f"{prefix}grid_page") or 0
    # Short labels, the details in each button's help.
    row = _row()
    _button(row, "Snapshot", partial(snapshot_bytes, snap), f"{name}.json",
            "application/json",
            f"{prefix}dl_snapshot",
            "This state as a snapshot file, JSON (CONTRACT.md): upload it on the Playground, "
            "or pass it to `python -m backend run --from`.")
    _button(row, "Grid (PNG)", partial(_png, snap, page), f"{name}-grid.png",
            "image/png", f"{prefix}dl_png", "The block grid and its legend as a picture, for "
                                            "slides.")
    _button(row, "Grid (SVG)", partial(_svg, snap, page), f"{name}-grid.svg",
            "image/svg+xml", f"{prefix}dl_svg", "The block grid and its legend as a vector "
                                                "drawing.")
    if run:
        first, last = run[0]["step"], run[-1]["step"]
        _button(row, "Run (zip)", partial(_zip, run),
                f"{stem}-run-steps-{first:04d}-{last:04d}.zip", "application/zip",
                f"{prefix}dl_zip",
                f"The whole run: {counted(len(run), 'snapshot')}, one per step, steps "
                f"{first}–{last} (step-NNNN.json). {run_help}")
    else:
        st.caption("No steps yet: the run's zip appears after the first step.")
    # A row per format, the tables in the same order in each.
    csv_row, parquet_row = _row(), _row()
    for t in TABLES:
        _button(csv_row, f"{t.capitalize()} (CSV)", partial(_csv, snap, t),
                f"{name}-{t}.csv", "text/csv", f"{prefix}dl_{t}_csv",
                f"The {t} table of this step as CSV.", icon=False)
        _button(parquet_row, f"{t.capitalize()} (Parquet)", partial(_parquet, snap, t),
                f"{name}-{t}.parquet", "application/vnd.apache.parquet",
                f"{prefix}dl_{t}_parquet", f"The {t} table of this step as Parquet.",
                icon=False)


# ---- import ------------------------------------------------------------------------

IMPORT_KEY = "import_snapshot"
# How many times the uploader was drawn afresh (its key then says so): a file it still
# holds once its note is gone (another session opened, a reset) would read as loaded,
# and a file uploader's value cannot be cleared but by a new key.
IMPORT_GEN = "import_gen"
# (file name, outcome) of the last upload, beside the uploader, kept for the engine it
# left on the page (ui/kept.py): once another replaces it (a session opened, Back
# or Forward, New session, a reset), "restored." would sit beside a state it did not make.
IMPORT_NOTE = "import_note"


def _import_key() -> str:
    """The uploader's key now: IMPORT_KEY, then numbered once drawn afresh."""
    gen = st.session_state.get(IMPORT_GEN, 0)
    return IMPORT_KEY if not gen else f"{IMPORT_KEY}_{gen}"


def _on_import(key: str) -> None:
    """Uploader callback: restore the file's state into the Playground, or say why not."""
    uploaded = st.session_state.get(key)
    if uploaded is None:   # the file was removed from the uploader (import_panel drops its note)
        return
    source = f"the snapshot in {uploaded.name!r}"

    def refused(problem: str) -> str:
        return f"Refused {source}: {problem}. The playground is unchanged."

    problem = None
    said = False    # the restore said its own refusal
    # The size is known before reading: an oversized file is never read into memory.
    if uploaded.size > MAX_SNAPSHOT_BYTES:
        problem = (f"it is {uploaded.size:,} bytes; the limit is "
                   f"{MAX_SNAPSHOT_BYTES >> 20} MiB")
    else:
        try:
            data = parse_snapshot_text(uploaded.getvalue())
        except PagedLabError as exc:
            problem = str(exc)
        else:
            # A refusal after waiting behind an operation is said by the restore, below
            # that operation's line (see OpSession.flash).
            problem = restore.snapshot(data, source, refused)
            said = True
    if problem is not None and not said:
        session.flash("error", refused(problem))
    # The status line is at the top of the page, and the next operation replaces it; the
    # uploader may be far below it. So the note beside the file says the outcome itself.
    keep_result(IMPORT_NOTE, session.get_engine(), (
        uploaded.name, f"Last upload, {uploaded.name}: "
        + (f"refused: {problem}. The playground is unchanged." if problem is not None
           else "restored.")))


def import_panel() -> None:
    """Upload a snapshot to restore that exact state and keep working from it."""
    note = kept_result(IMPORT_NOTE, session.get_engine())
    held = st.session_state.get(_import_key())
    if held is not None and (note is None or held.name != note[0]):
        # Its note went with the engine it was for: the file goes too.
        st.session_state[IMPORT_GEN] = st.session_state.get(IMPORT_GEN, 0) + 1
        held = None
    key = _import_key()
    # No type filter: the content is checked, and a snapshot saved as .txt is still one;
    # a filter's refusal would be Streamlit's chip, which stays beside later uploads.
    st.file_uploader(
        "Upload a snapshot (JSON)", key=key, on_change=_on_import, args=(key,),
        max_upload_size=uploader_mib(MAX_SNAPSHOT_BYTES),
        help="A snapshot downloaded here or written by `python -m backend run --out`. Its "
             "requests, blocks, reference counts, cached hashes, tokens and events are "
             "restored exactly, K/V recomputed from the tokens; the pool and model settings "
             "become the snapshot's. A malformed or inconsistent file is refused and the "
             "current state kept." + limit_help(MAX_SNAPSHOT_BYTES))
    if note is not None and (held is None or held.name != note[0]):
        # The file left the uploader (removed, or the uploader not drawn on another page,
        # which Streamlit forgets without a callback): its note goes with it.
        del st.session_state[IMPORT_NOTE]
    elif note is not None:
        # The note quotes the uploaded file's name: plain text, never Markdown.
        st.caption(plain_md(note[1]))


# ---- the session as a scenario -------------------------------------------------------------

def _scenario_bytes(config: EngineConfig, base: Snapshot | None, ops: tuple[dict[str, Any], ...],
                    final: Snapshot, history: History) -> bytes:
    """The scenario file, built on click. The history's snapshots give earlier steps'
    `expect` values when it is still the run that ended at `final`."""
    latest = history.latest()
    found = (known_snapshots(history) if latest is not None
             and latest["step"] == final["step"] else Known([]))
    known = [s for s in found.snapshots if s["step"] <= final["step"]]
    n = len(final["requests"])
    # Built in the download's thread, after the page is drawn: what was left out can be
    # said in the file alone.
    refused = ("" if found.refused is None else
               f" {sentence(found.refused)}. The steps from that one on that were saved "
               "before this session was opened carry no expect values here.")
    log = OpLog(base, list(ops))
    scenario = log.scenario(
        config, final, known, name=f"playground-session-step-{final['step']}",
        description=f"A PagedLab Playground session exported at step {final['step']} with "
                    f"{counted(n, 'request')}; each step's expect values are what the session "
                    f"showed.{refused}", base_file=_base_name(log.base_step))
    return scenario_json(scenario).encode()


def _base_name(step: int) -> str:
    """The file name a restored session's starting snapshot is downloaded as."""
    return f"playground-base-step-{step:04d}.json"


def scenario_download(oplog: OpLog, config: EngineConfig, snap: Snapshot,
                      history: History) -> None:
    """Download this Playground session as a scenario file (and its base snapshot, if any).

    Call with the engine's lock held, so the log and `snap` describe the same state.
    """
    problem = oplog.why_not_exportable()
    if problem is None and oplog.base_step + len(oplog.ops) != snap["step"]:
        problem = "its operation log does not reach this step"
    if problem is not None:
        st.caption(plain_md(f"Scenario file: not available, {problem}."))
        return
    name = f"playground-scenario-step-{snap['step']:04d}.json"
    row = _row()
    _button(row, "Session as a scenario", partial(_scenario_bytes, config, oplog.base,
                                                   tuple(oplog.ops), snap, history),
            name, "application/json", "dl_scenario",
            "Every operation since the engine started or was restored, as a scenario file "
            "(CONTRACT.md) whose last step expects exactly this state.")
    base = oplog.base
    if base is None or not oplog.needs_base:
        # File names are ours (a step number), so the command may be shown as code.
        st.caption("Step through it on the *Scenarios* page (*Upload your own scenario*): "
                   "it replays on a fresh engine, one step at a time, each step's "
                   f"expectations checked beside it. From a terminal, `python -m backend run "
                   f"{name} --check` does the same.")
        return
    base_name = _base_name(oplog.base_step)
    _button(row, "Its starting snapshot", partial(snapshot_bytes, base), base_name,
            "application/json", "dl_scenario_base",
            "The restored snapshot this session started from: the scenario replays from it.")
    st.caption("This session started from a restored snapshot, so its scenario replays "
               "from that snapshot (the file names it), which the *Scenarios* page cannot "
               f"start from; from a terminal: `python -m backend run {name} --from "
               f"{base_name} --check`.")
