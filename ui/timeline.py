"""The Playground's timeline: the live engine's run, row by row, linked to the grid.

The engine records a row after every scheduler iteration and after every other
operation (backend/engine/timeline.py); each row names the operation (`step`)
it belongs to. Picking a row (a bar of the strip chart, or the number field)
shows the state after that operation where the Playground's History still
holds it: the page draws that kept snapshot instead of the live one, and the
engine is only read. History keeps a state per operation, not per iteration,
and only the newest operations (session.MAX_HISTORY): an older pick says so
and the page stays live.

The section's charts, tables and downloads are in an expander that runs only
while open: a long run's frames are built on no rerun that does not show them.
The timeline is the engine's, not the session's: a reload, a restore or a new
engine starts a new one.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from backend.core.errors import PagedLabError
from backend.core.words import counted, sentence
from backend.engine.engine import Engine
from backend.engine.timeline import COLUMNS
from backend.io.export import to_csv, to_parquet
from backend.sessions.history import History
from backend.sessions.playground import kept_snapshot, kept_steps
from backend.views.compare.timeline import binned, timeline_chart
from backend.views.text import plain_md
from backend.views.timeline import (
    latency_frame,
    strip_description,
    timeline_frame,
    unlisted_note,
)
from ui import clicks, session
from ui.numbers import number_text, whole, whole_input

PICK = session.TIMELINE_PICK
STEP_PICK = session.STEP_PICK
PAST_PREFIX = "past_"           # the past state's view widgets (session.VIEW_PREFIXES)
STRIP = "tl_strip"
SELECTION = "pick"
PICK_PROBLEM = "tl_pick_problem"
_CHARTS = "tl_charts"           # the frame and charts last built (`_charts`)
STEP_COLUMN = COLUMNS.index("step")
SCHEDULED_COLUMN = COLUMNS.index("scheduled")

NOT_SAVED = ("The timeline belongs to this engine and is not saved with the session: a "
             "reload, a restored snapshot or a new engine starts a new one.")
HELP = ("The engine's run, one row per scheduler iteration and per other operation: "
        "requests, blocks, tokens, preemptions, and each request's time to first token and "
        "per output token. Pick a row to see the state after its step.")

LATENCY_HELP: dict[str, str] = {
    "request": "The request's id.",
    "arrived": "The row (iteration, as the chart numbers them) of the operation that "
               "added it: its add, or the fork that made it.",
    "first_token": "The row in which it produced its first token.",
    "finished": "The row in which it finished.",
    "generated": "Tokens it generated itself since it arrived. A forked request's tokens "
                 "from before the fork are its parent's: the block tables count them too.",
    "ttft_iterations": "Time to first token, in scheduler iterations from its add. A Grow "
                       "makes its tokens outside the scheduler's iterations, so a request "
                       "grown (or forked) by hand can show 0.",
    "tpot_iterations": "Time per output token after the first, in scheduler iterations: "
                       "below 1 where Grow made several tokens in one operation.",
    "ttft_ms": "Time to first token, in ms of the engine's work (not time between clicks).",
    "tpot_ms": "Time per output token after the first, in ms of the engine's work.",
}


@dataclass(frozen=True, slots=True)
class Picked:
    """The timeline row a person picked, and what the page shows for it."""

    iteration: int | None                   # None: a step picked from the history alone
    step: int
    rows: int                               # rows of that step (its iterations)
    snapshot: dict[str, Any] | None         # its kept state; None: live (or not kept)
    live: bool                              # the step is the engine's current state


def _rows(engine: Engine) -> list[tuple[int, ...]]:
    return engine.timeline.rows


def picked(engine: Engine, history: History) -> Picked | None:
    """The row picked on the timeline and its step's kept state; None: nothing picked.

    A pick outside the timeline (a new engine has a new one) is cleared. Call it
    with the engine's lock held, before the timeline's widgets are drawn.
    """
    ss = st.session_state
    it = _whole_pick(PICK, "Show the state after iteration")
    rows = _rows(engine)
    if it is None:
        return _picked_step(engine, history) if not rows else None
    first = rows[0][0] if rows else 0
    if not rows or not first <= it < first + len(rows):
        # A number typed past the rows (a new engine clears the pick itself): said by the
        # field's name under it, and the live state shown.
        ss[PICK] = None
        if rows:
            last = first + len(rows) - 1
            span = f"{first:,}" if first == last else f"{first:,} to {last:,}"
            ss[PICK_PROBLEM] = (f"Show the state after iteration: {number_text(it)} is not "
                                f"a row of this timeline; enter {span}. Showing the live "
                                "state.")
        return None
    step = rows[it - first][STEP_COLUMN]
    n = sum(1 for r in rows if r[STEP_COLUMN] == step)
    if step == engine.step:
        return Picked(it, step, n, None, True)
    return _past(PICK, Picked(it, step, n, None, False), history)


def _past(key: str, p: Picked, history: History) -> Picked | None:
    """`p` with its step's kept state; None, the pick in field `key` cleared and the
    reason said under it, where a saved session's step is found damaged."""
    try:
        # A step read back from a saved session is checked the first time it is shown:
        # seconds for a pool of tens of thousands of blocks. Streamlit shows the spinner
        # only past half a second, so a quick read draws nothing.
        with st.spinner(f"Reading the state after step {p.step:,}…"):
            snapshot = kept_snapshot(history, p.step)
    except PagedLabError as exc:
        st.session_state[key] = None
        st.session_state[PICK_PROBLEM] = f"{sentence(str(exc))}. Showing the live state."
        return None
    return dataclasses.replace(p, snapshot=snapshot)


def _whole_pick(key: str, label: str) -> int | None:
    """The number picked in field `key`; a fraction typed there is cleared and said
    by `label` under the field, and the live state shown."""
    ss = st.session_state
    try:
        return whole(label, ss.get(key))
    except PagedLabError as exc:
        ss[key] = None
        ss[PICK_PROBLEM] = f"{exc}. Showing the live state."
        return None


def _picked_step(engine: Engine, history: History) -> Picked | None:
    """A step picked from the history while the timeline has no rows, or None."""
    ss = st.session_state
    step = _whole_pick(STEP_PICK, "Show the state after step")
    if step is None:
        return None
    kept = kept_steps(history)
    if kept is None or not kept[0] <= step <= kept[1]:
        ss[STEP_PICK] = None
        held = f"enter {kept[0]:,} to {kept[1]:,}" if kept is not None else "it keeps none"
        ss[PICK_PROBLEM] = (f"Show the state after step: the history does not keep step "
                            f"{number_text(step)}; {held}. Showing the live state.")
        return None
    if step == engine.step:
        return Picked(None, step, 1, None, True)
    return _past(STEP_PICK, Picked(None, step, 1, None, False), history)


# Set by Back to live, for the next drawing to say where it went: the banner it removed
# was what a screen reader had last, and the page's next change read instead was the
# translator's arithmetic or an inspected block.
BACK_TO_LIVE = "tl_back_to_live"


def _back_to_live() -> None:
    st.session_state[PICK] = None
    st.session_state[STEP_PICK] = None
    st.session_state[BACK_TO_LIVE] = True


def _of_step(p: Picked) -> str:
    if p.iteration is None:
        return f"Step {p.step}"
    many = f" (a step of {p.rows} iterations)" if p.rows > 1 else ""
    return f"Iteration {p.iteration} belongs to step {p.step}{many}"


def banner(p: Picked | None, history: History) -> dict[str, Any] | None:
    """Above the state views: what a pick shows, with a way back; returns the past
    snapshot to draw (None: draw the live state)."""
    back = st.session_state.pop(BACK_TO_LIVE, False)
    if p is None:
        latest = history.latest()
        if back and latest is not None:
            # Once, where the banner was (keyed for ui/a11y.py's read-out too).
            st.container(key="tl_banner").caption(
                f"Back to the live state, after step {latest['step']:,}.")
        return None
    # Keyed for ui/a11y.py, which reads what a pick shows out to a screen reader.
    said = st.container(key="tl_banner")
    # Only a pick inside a step of several iterations shows a state other than its own.
    within = p.iteration is not None and p.rows > 1
    if p.live:
        said.info(f"{_of_step(p)}, the latest: this is the live state"
                  + (", after its last iteration (the history keeps the state after each "
                     "operation, not each iteration)." if within else "."))
        return None
    if p.snapshot is None:
        kept = kept_steps(history)
        held = f" (steps {kept[0]}–{kept[1]})" if kept is not None else ""
        said.warning(f"{_of_step(p)}, whose state is no longer kept: the history holds the "
                     f"newest {session.MAX_HISTORY} operations at most{held}. Showing the "
                     "live state.")
        clicks.button(st, "Back to live", key="tl_live_top", on_click=_back_to_live)
        return None
    where = ("The history keeps the state after each operation, not each iteration. "
             if p.iteration is None else
             f"{_of_step(p)}; the history keeps the state after each operation, not each "
             "iteration. " if within else f"{_of_step(p)}, its only iteration. ")
    said.info(f"Showing the past: the state after step {p.step}. {where}The live engine is "
              "unchanged, and the controls above act on it.")
    clicks.button(st, "Back to live", key="tl_live_top", type="primary",
                  on_click=_back_to_live)
    snap: dict[str, Any] = p.snapshot
    return snap


def section(engine: Engine, history: History) -> None:
    """The timeline: a summary, the row picker, and (when opened) the charts, the
    latency table and the downloads."""
    rows = _rows(engine)
    if not rows:
        # The charts kept for another engine's timeline go (they hold its rows).
        st.session_state.pop(_CHARTS, None)
        # A restored or reopened engine starts a new timeline at the step it holds.
        since = ("yet" if not engine.step else
                 f"since this engine was restored at step {engine.step}")
        st.caption(f"Nothing run {since}: each operation adds a row, each scheduler "
                   "iteration of a step one more. " + NOT_SAVED)
        _step_picker(history)
        return
    tl = engine.timeline
    scheduled = sum(r[SCHEDULED_COLUMN] for r in rows)
    first, last = rows[0][0], rows[-1][0]
    dropped = f" (the oldest {tl.dropped:,} dropped)" if tl.dropped else ""
    span = f"iteration {first}" if first == last else f"iterations {first}–{last}"
    st.caption(f"{counted(len(rows), 'row')}, {span}{dropped}: "
               f"{counted(scheduled, 'scheduler iteration')} and "
               f"{counted(len(rows) - scheduled, 'other operation')}. " + NOT_SAVED)
    _picker(first, last)
    with st.expander("Chart, latencies and downloads", key="tl_open",
                     on_change="rerun") as box:
        if box.open:
            _details(engine, history)
        else:
            # Kept only while the section is open: its frame and charts are megabytes
            # for a long timeline.
            st.session_state.pop(_CHARTS, None)


def _picker(first: int, last: int) -> None:
    _pick_field("Show the state after iteration", PICK,
                f"{first:,} to {last:,}. The grid, metrics and tables above show the state "
                "after this row's operation, while the history keeps it. Blank: live.")


def _step_picker(history: History) -> None:
    """Without rows, the history's kept steps can still be shown, picked by number."""
    kept = kept_steps(history)
    if kept is not None and kept[0] < kept[1]:
        _pick_field("Show the state after step", STEP_PICK,
                    f"{kept[0]:,} to {kept[1]:,}: the history this session kept. The views "
                    "above show the state after that operation. Blank: live.")
    else:
        _pick_problem()


def _pick_field(label: str, key: str, help_text: str) -> None:
    """A picker's number field beside Back to live, then why the last pick was refused."""
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    # No bounds in the browser: it would keep a number past them to itself, the field
    # red and the page unchanged; `picked` refuses it in words instead.
    whole_input(c1, label, key=key, placeholder="the live state", help=help_text)
    clicks.button(c2, "Back to live", key="tl_live", on_click=_back_to_live,
                  disabled=st.session_state.get(key) is None, width="stretch")
    _pick_problem()


def _pick_problem() -> None:
    problem = st.session_state.pop(PICK_PROBLEM, None)
    if problem is not None:
        st.error(plain_md(problem))


def _charts(engine: Engine, history: History) -> tuple[pd.DataFrame, alt.VConcatChart,
                                                       alt.LayerChart]:
    """The timeline's frame and its two charts, built again only when what they show
    changed.

    Building the two Altair charts took some 60 ms of a rerun with this section open
    (bench: 220 rows), though most reruns (a request picked, a block inspected, a
    panel opened) leave the timeline as it was. Its rows are only ever appended (the
    oldest dropped), so the timeline object, its count of rows recorded and of rows
    dropped name what it holds; the strip chart also greys the steps the history no
    longer keeps. The entry keeps the timeline object, compared by identity: another
    engine's (a reset, a restore) is another timeline. Redrawing the same chart is
    safe (see ui/memo.py)."""
    c = engine.config
    tl = engine.timeline
    key = (tl.iteration, tl.dropped, len(tl.rows), c.num_blocks, c.block_size,
           kept_steps(history))
    entry = st.session_state.get(_CHARTS)
    if entry is not None and entry[0] is tl and entry[1] == key:
        return entry[2]
    df = timeline_frame(tl, c.num_blocks, c.block_size)
    # Narrow enough for the main column beside an open sidebar on a 1024 px laptop.
    built = (df, timeline_chart(df, paged=True, width=420), strip_chart(df, history))
    st.session_state[_CHARTS] = (tl, key, built)
    return built


def _details(engine: Engine, history: History) -> None:
    df, chart, strip = _charts(engine, history)
    lat = latency_frame(engine.timeline)
    st.altair_chart(chart, key="tl_chart")
    st.caption("Requests running and waiting; used, cached and free blocks; prompt and "
               "decode tokens per row; preemptions. Rows with `scheduled` 0 are operations "
               "other than a step's iterations.")
    st.markdown("**Pick a moment**")
    st.altair_chart(strip, key=STRIP, on_select=_on_strip,
                    selection_mode=SELECTION)
    st.caption("Click a bar, or enter its iteration under *Show the state after iteration*: "
               "the views above show the state after its step (light blue: a bar inside a "
               "step of several iterations, whose state is kept only at the step's end; grey: "
               "that state is no longer kept).")
    st.markdown("**Latency per request**")
    if lat.empty:
        st.caption("No request has arrived on this timeline yet.")
    else:
        # A time still to come (a request not finished yet) is a dash, not "None".
        st.dataframe(lat, hide_index=True, width="stretch", placeholder="—",
                     column_config={k: st.column_config.Column(help=h)
                                    for k, h in LATENCY_HELP.items()})
        st.caption("TTFT (time to first token) counts from a request's add to its first "
                   "token, TPOT (time per output token) from its "
                   "first token to its last over the tokens after the first: in scheduler "
                   "iterations (a Grow's tokens take none), and in ms of the engine's own "
                   "work. `generated` counts what each request generated itself, not what a "
                   "fork inherited.")
    missing = unlisted_note(engine.timeline, list(engine.requests))
    if missing:
        st.caption(plain_md(missing))
    _downloads(df, lat, engine.step)


# The strip's colours: the state after the row is kept, only the state after its step
# (the row is not its step's last iteration), or neither.
KEPT, STEP_END_KEPT, NOT_KEPT = "kept", "kept at its step's end", "not kept"


def strip_chart(df: pd.DataFrame, history: History) -> alt.LayerChart:
    """Used blocks per row as bars to click, each row's iteration the selection; a row
    whose step's state the history no longer keeps is grey."""
    shown, per = binned(df.drop(columns=["prefix_hit_rate"]))
    kept = kept_steps(history)
    steps = df.set_index("iteration")["step"]
    data = pd.DataFrame({
        "iteration": shown["iteration"].astype(int),
        "used_blocks": shown["used_blocks"].astype(float),
    })
    data["step"] = steps.reindex(data["iteration"]).to_numpy()
    # History keeps the state after each operation, not each iteration: a row inside a
    # step of several iterations shows the state after its step's last, which the bar's
    # own height is not (it was coloured "kept" all the same).
    last = df.groupby("step")["iteration"].max()
    data["kept"] = [
        NOT_KEPT if kept is None or not kept[0] <= s <= kept[1] else
        KEPT if it == last[s] else STEP_END_KEPT
        for it, s in zip(data["iteration"], data["step"], strict=True)]
    pick = alt.selection_point(name=SELECTION, fields=["iteration"], on="click")
    # A few rows keep narrow bars: one row's bar would fill the whole width.
    size = 24 if len(data) < 16 else alt.Undefined
    x = alt.X("iteration:O", title="iteration", axis=alt.Axis(labelOverlap=True, labelAngle=0))
    # Channel objects, not shorthand strings or condition dicts: Altair wraps those
    # through `from_dict`, which hashes its whole schema each time (some 5 ms a channel).
    tooltip = [alt.Tooltip("iteration:Q"), alt.Tooltip("step:Q"),
               alt.Tooltip("used_blocks:Q", format=",.1f"), alt.Tooltip("kept:N")]
    data["top"] = max(1.0, float(data["used_blocks"].max()))
    bars = alt.Chart(data).mark_bar(size=size).encode(
        x=x, y=alt.Y("used_blocks:Q", title="blocks used"),
        color=alt.Color("kept:N", title=None,
                        scale=alt.Scale(domain=[KEPT, STEP_END_KEPT, NOT_KEPT],
                                        range=["#1f4e8c", "#8fb1dc", "#BBBBBB"])),
        opacity=alt.OpacityValue(**alt.condition(pick, alt.value(1.0), alt.value(0.45))),
        tooltip=tooltip)
    # Over each bar, its column's whole height as the click target, all but invisible: a
    # row with no block used has no bar to click.
    target = alt.Chart(data).mark_bar(size=size, opacity=0.01, color="#1f4e8c").encode(
        x=x, y=alt.Y("top:Q"), tooltip=tooltip).add_params(pick)
    return alt.LayerChart(layer=[bars, target]).properties(
        height=170, description=strip_description(data, per))


def _on_strip() -> None:
    """A click on a bar picks its row (a click beside the bars clears the pick)."""
    ss = st.session_state
    points = (ss.get(STRIP) or {}).get("selection", {}).get(SELECTION, [])
    ss[PICK] = int(points[0]["iteration"]) if points else None


def _downloads(df: pd.DataFrame, lat: pd.DataFrame, step: int) -> None:
    # The frames are built under the engine's lock now; the files only on a click.
    cols = st.columns(4)
    files = (("timeline", df), ("latency", lat))
    i = 0
    for name, frame in files:
        for fmt, build, mime in (("csv", to_csv, "text/csv"),
                                 ("parquet", to_parquet, "application/vnd.apache.parquet")):
            cols[i].download_button(
                f"{name.capitalize()} ({'CSV' if fmt == 'csv' else 'Parquet'})",
                data=functools.partial(build, frame),
                file_name=f"playground-{name}-step-{step:04d}.{fmt}",
                mime=mime, on_click="ignore", key=f"tl_dl_{name}_{fmt}",
                icon=":material/download:", width="stretch")
            i += 1
