"""The control-run panel: the same operations without shuffle, preemption or prefix cache.

The Scenarios page shows the control run that follows its scenario step by
step; the Playground replays its operation log on two fresh engines when
asked (backend/engine/control.py says what is compared).
"""

from __future__ import annotations

import math
import time

import streamlit as st

from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.control import ControlReport, compare_with_control, control_config
from backend.engine.engine import Engine
from backend.engine.ops import Op, describe_op, parse_op
from backend.sessions.budget import SERVER_BUDGET
from backend.sessions.oplog import OpLog
from backend.views import Snapshot
from backend.views.control import NOT_PERTURBED, WITHOUT, control_frame, control_sentence
from backend.views.text import plain_md
from ui.bars import Advance, progress_bar
from ui.kept import keep_result, kept_result
from ui.session import get_owner

# The perturbations named in the title, since the panel is drawn, closed, on scenarios
# that have none.
TITLE = f"Control run: the same operations {NOT_PERTURBED}"
# How long the Playground's replay may run: its two engines redo every operation of the
# session, and a session of long steps on a real model would otherwise hold the page
# (and a server thread) for as long again, twice.
REPLAY_LIMIT_S = 120
# The replay's bar is redrawn at most this often: a step may run thousands of
# iterations a second, and each redraw is a message to the browser.
REDRAW_S = 0.1
# What a control run is for: its panel opens by itself once one of these happened.
PERTURBATIONS = frozenset({"move", "preempt", "prefix_hit", "swap_out"})
PLAYGROUND = "control_report"


def perturbed(snap: Snapshot) -> bool:
    """Whether blocks moved, a request was preempted or a prefix hit happened so far."""
    return any(e["kind"] in PERTURBATIONS for e in snap["events"])


def show(report: ControlReport, engine: Engine) -> None:
    """The sentence (green when the runs agree), the table, and what was left out."""
    # Plain text: the sentence may name a request, whose id is the user's text.
    (st.success if report.agrees else st.error)(plain_md(control_sentence(report)))
    # Short headers, the long names as tooltips, so the comparison's figures fit the
    # Scenarios page's narrow column; the two texts follow, scrolled to, with each row's
    # request pinned in view.
    text = st.column_config.TextColumn
    st.dataframe(control_frame(report, engine.model.codec.decode), hide_index=True,
                 width="stretch", height=min(35 + 35 * len(report.requests) + 3, 280),
                 column_config={
                     "request": text(pinned=True),
                     "tokens compared": st.column_config.NumberColumn(
                         "tokens", help="tokens compared: those both runs reached"),
                     "same tokens": text("same", help="whether every compared token is the "
                                                      "control's"),
                     "first difference": text(
                         "first diff", help="the first token position that differs"),
                     "logits compared": st.column_config.NumberColumn(
                         "logits", help="positions whose next-token logits were compared"),
                     "largest |Δ logit|": text("max |Δ|", help="largest |Δ logit| over the "
                                                               "positions compared")})
    if report.not_replayed:
        st.caption(plain_md("Left out of the control: " + "; ".join(report.not_replayed) + "."))


def _key(where: str, snap: Snapshot) -> str:
    """The panel's expander key: kept while nothing is perturbed, then a new one, so that
    it opens by itself at the first perturbation and otherwise stays as the person left it
    when an element above it comes or goes (unkeyed, it was drawn anew, closed)."""
    return f"{where}ctl_open_{int(perturbed(snap))}"


def scenario_panel(report: ControlReport | None, problem: str | None, snap: Snapshot,
                   engine: Engine) -> None:
    with st.expander(TITLE, expanded=perturbed(snap), key=_key("tour_", snap)):
        st.caption(f"A second engine runs this scenario's steps with {WITHOUT}, step by "
                   "step beside this one, and the two are compared token by token."
                   + ("" if perturbed(snap) else
                      " No block has moved, no request was preempted and no prefix hit "
                      "happened so far: the panel opens by itself at the first of these."))
        if report is not None:
            show(report, engine)
        else:
            st.caption(problem or "Take a step: the control follows every step.")


class _Replay:
    """The replay's bar and clock: where it is (an operation, an iteration of it), and
    whether it is still within REPLAY_LIMIT_S.

    The bar is redrawn at most every REDRAW_S, from within an operation too, so it moves
    during a long step and a click elsewhere (a new run, which stops this one at its
    next drawing) ends the replay within an iteration, not after a whole operation."""

    def __init__(self, ops: list[Op], advance: Advance) -> None:
        self.ops = ops
        self.advance = advance
        self.started = time.monotonic()
        self.done = 0            # operations replayed whole
        # How far into the next one, as the bar shows it: never back, though both
        # engines count their iterations of it from 0.
        self.within = 0.0
        self._drawn = 0.0

    def after_op(self, done: int, total: int) -> bool:
        self.done, self.within = done, 0.0
        self._draw(force=True)
        return self._in_time()

    def within_op(self, done: int, total: int) -> bool:
        self.within = max(self.within, done / total if total else 0.0)
        self._draw()
        return self._in_time()

    def _in_time(self) -> bool:
        return time.monotonic() - self.started < REPLAY_LIMIT_S

    def _draw(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._drawn < REDRAW_S:
            return
        self._drawn = now
        n = len(self.ops)
        elapsed = min(math.ceil(now - self.started), REPLAY_LIMIT_S)
        doing = (f"operation {self.done + 1:,} of {n:,} ({describe_op(self.ops[self.done])})"
                 if self.done < n else f"all {n:,} operations")
        self.advance((self.done + self.within) / n,
                     plain_md(f"Replaying {doing} on both engines: {elapsed} s of the "
                              f"{REPLAY_LIMIT_S} s limit"))


def _on_run(engine: Engine, oplog: OpLog) -> None:
    ops = [parse_op(op, vocab_size=engine.config.vocab_size) for op in oplog.ops]
    with progress_bar("Replaying the operations on both engines...") as advance:
        replay = _Replay(ops, advance)
        # The replay's two engines are this session's memory while they run.
        claims: list[int] = []
        try:
            claims.append(SERVER_BUDGET.claim(engine.config, get_owner()))
            claims.append(SERVER_BUDGET.claim(control_config(engine.config, ops),
                                              get_owner()))
            report = compare_with_control(engine.config, ops, device=engine.device.type,
                                          progress=replay.after_op,
                                          keep_going=replay.within_op)
        except PagedLabError as exc:
            keep_result(PLAYGROUND, engine, (len(oplog.ops), str(exc)))
        else:
            keep_result(PLAYGROUND, engine, (len(oplog.ops), report))
        finally:
            for claim in claims:
                SERVER_BUDGET.cancel(claim)


def playground_panel(engine: Engine, oplog: OpLog, snap: Snapshot) -> None:
    with st.expander(TITLE, expanded=perturbed(snap), key=_key("", snap)):
        st.caption(f"Replays this session's operations on two fresh engines, as you ran them "
                   f"and with {WITHOUT}, and compares them token by token.")
        problem = oplog.why_not_exportable()
        if oplog.needs_base:
            problem = ("this engine started from a restored snapshot, so there is no "
                       "fresh start to replay from")
        if problem is not None:
            st.caption(plain_md(f"No control run: {problem}."))
            return
        if st.button("Run the control", key="btn_control"):
            _on_run(engine, oplog)
        kept = kept_result(PLAYGROUND, engine)
        if kept is None:
            return
        count, result = kept
        if count != len(oplog.ops):
            newer = len(oplog.ops) - count
            st.caption(f"As of {counted(count, 'operation')}; the session has "
                       f"{len(oplog.ops):,} now: run it again to include "
                       + ("the newest." if newer == 1 else f"the {newer:,} newest."))
        if isinstance(result, str):
            st.error(plain_md(result))
            return
        if result.stopped_after is not None:
            # (Its only stop: a click elsewhere ends the replay with its run, keeping
            # nothing.)
            done, total = result.stopped_after
            st.warning(f"Stopped at the {REPLAY_LIMIT_S} s limit after replaying {done:,} "
                       f"of {total:,} operations whole: the comparison covers the tokens "
                       "both runs reached by then.")
        show(result, engine)
