"""The Scenarios page's controls and views: the picker, Back, Next, Play, the narration, the arena.

Every control is a callback on ui.tour's state, so the page drawn after it
already shows its effect.

Time travel: Next applies the next step, or only moves the view when that
step was already computed; Back and the slider move the view over the frames
already computed (nothing is recomputed); Reset starts the run again.

Play and Pause are one button whose label changes: two buttons swapping places
would leave the old one on screen until a run ends, which under play is never,
and the row would jump under the pointer.
"""

from __future__ import annotations

import itertools

import streamlit as st

from backend.core.errors import PagedLabError
from backend.core.words import agrees, counted
from backend.engine.ops import label_narration
from backend.io.scenario import MAX_SCENARIO_BYTES
from backend.sessions.tour import (
    Frame,
    TourRun,
    parse_scenario_upload,
    shipped_paths,
    shipped_scenario,
)
from backend.views import tour as tour_views
from backend.views.text import md_code, notes_text, plain_md
from ui import a11y, clicks, restore, tour
from ui.panels import fitted
from ui.tour import UPLOAD, load, say, state
from ui.uploads import limit_help, uploader_mib

SPEEDS = (0.25, 0.5, 1.0, 2.0)
# The scenario picker's least width: the longest shipped name, "14 · Tokens, not text:
# what a real tokenizer lets blocks share", in full.
PICKER_REM = 32
# Numbers each drawing of the messages (see `messages`).
_SAID = itertools.count(1)


# ---- callbacks ---------------------------------------------------------------------------

def _run() -> TourRun:
    run = state().run
    assert run is not None
    return run


@tour.one_at_a_time
def _on_next() -> None:
    t = state()
    t.playing = False
    run = _run()
    if t.view < run.taken:
        t.view += 1
        return
    frame, shown = tour.advance(run)
    if frame is not None:
        t.view = run.taken
    shown.finish()


@tour.one_at_a_time
def _on_back() -> None:
    t = state()
    t.playing = False
    t.view = max(0, t.view - 1)


def _on_play_pause(playing: bool) -> None:
    # Sets rather than toggles: Streamlit may replay a click's callback when the run
    # it started is cut short, and a toggle would then undo itself. One store, so no
    # lock: waiting for it behind a long step would hold up the click's other
    # callbacks (a Stop) for that step's whole length; `finish` reads the flag under
    # the lock before each step of a play.
    state().playing = playing


def _on_reset() -> None:
    ctx = tour.LoadContext.read()
    # Its run is thrown away: a step under way is stopped, not waited out.
    with tour.held(stop=True):
        load(_run().key, ctx)


def _on_slider() -> None:
    # Read before waiting for the state's lock (see ui/tour.py's `state`).
    value = int(st.session_state["tour_slider"])
    speed_changed = st.session_state.get("tour_speed") != state().speed_drawn
    with tour.held():
        tour.slid_to(value, speed_changed=speed_changed)


def _on_pick() -> None:
    # Read before waiting for the state's lock (see ui/tour.py's `state`).
    key, ctx = st.session_state["tour_pick"], tour.LoadContext.read()
    with tour.held(stop=True) as t:
        left = t.run
        if load(key, ctx) and left is not None and left.taken and left.key != key:
            # Its run is not kept (an engine per scenario would keep its K/V): say so,
            # and how to get back to it, rather than lose it without a word.
            say("info", f"Left “{left.title}” after {left.taken} of its "
                        f"{counted(left.total, 'step')}: picking it again starts it over "
                        "(the browser's Back returns to it where it was).")


def _on_upload() -> None:
    # Read and checked before waiting for the state's lock (see ui/tour.py's `state`).
    uploaded = st.session_state.get("tour_file")
    if uploaded is None:   # the file was removed from the uploader
        return
    # The size is known before reading: an oversized file is never read into memory.
    if uploaded.size > MAX_SCENARIO_BYTES:
        say("error", f"Scenario file refused: {uploaded.name} is {uploaded.size:,} bytes; "
                      f"the limit is {MAX_SCENARIO_BYTES >> 20} MiB.")
        return
    try:
        scenario = parse_scenario_upload(uploaded.getvalue(), uploaded.name)
    except PagedLabError as exc:
        say("error", f"Scenario file refused: {exc}")
        return
    ctx = tour.LoadContext.read()
    with tour.held(stop=True) as t:
        # Held only once its run starts: a refused one (the server's K/V limit) leaves the
        # upload before it, whose run may be the one shown, and whose link names it.
        before = t.uploaded, t.upload_name
        t.uploaded = (f"{scenario.name} (uploaded: {uploaded.name})", scenario)
        t.upload_name = tour.upload_link(uploaded.getvalue())
        if not load(UPLOAD, ctx):
            t.uploaded, t.upload_name = before
        else:
            # A file of no steps is a config to look at: there is nothing to apply.
            then = (" Press Next to apply the first." if scenario.steps else
                    " It has no step to apply: the view shows its empty pool.")
            said = notes_text(scenario.notes())
            say("success", f"Loaded {uploaded.name}: “{scenario.name}”, "
                            f"{counted(len(scenario.steps), 'step')}.{then}{said}")


def _on_continue() -> None:
    t = state()
    t.playing = False
    run = _run()
    frame = run.frame(t.view)
    # The message goes on with the restored step: "Restored “Title”: step 3, ...".
    # The frame is this server's engine's own export: its beams' scores are the engine's.
    problem = restore.snapshot(frame.snapshot, f"“{run.title}”", own=True)
    if problem is not None:
        say("error", f"Could not continue from here: {problem}")
        return
    t.goto_playground = True


# ---- drawing -----------------------------------------------------------------------------

def messages() -> None:
    """The outcome of the last action, once."""
    t = state()
    shown, t.messages = t.messages, []
    # One block here whether or not there is a message, so that the picker below keeps its
    # place in the page when one goes. Moved up a place, its upload popover was drawn
    # afresh, and a file still uploading (a large one, picked in place of a refused one,
    # whose removal reruns the page first) was dropped without a word.
    slot = st.container()
    if not shown:
        return
    # Keyed for ui/a11y.py, which reads new messages out to a screen reader; each
    # message is drawn once, so each draw is numbered as new (the same words again:
    # "Played to the end" after a second play).
    with slot.container(key=f"tour_messages--{next(_SAID)}"):
        for kind, text in shown:
            # Messages quote file names, scenario names and link values: plain text.
            {"error": st.error, "info": st.info, "success": st.success}[kind](plain_md(text))


def picker(run: TourRun) -> None:
    """Choose a shipped scenario, or upload one."""
    t = state()
    keys = list(shipped_paths())
    if t.uploaded is not None:
        keys.append(UPLOAD)
    if st.session_state.get("tour_pick") not in keys:
        st.session_state["tour_pick"] = run.key if run.key in keys else keys[0]

    def label(key: str) -> str:
        if key == UPLOAD:
            return t.uploaded[0] if t.uploaded else key
        return f"{key[:2]} · {shipped_scenario(key).name}"

    # The picker takes what the upload's button leaves, which is as wide as its label
    # (in a column of a fixed share it was cut to "Upload your own …" at 800 px), but
    # not less than the longest name needs: where the row is narrower than both, the
    # button goes below. A name still too long for the page ends in an ellipsis, not
    # mid-word ("what a real tokenizer lets bl").
    st.html(f"<style>.st-key-tour_pick {{ min-width: min(100%, {PICKER_REM}rem); }}"
            " .st-key-tour_pick input { text-overflow: ellipsis; }</style>")
    row = st.container(horizontal=True, vertical_alignment="bottom", gap="small")
    row.selectbox("Scenario", keys, key="tour_pick", format_func=label, on_change=_on_pick)
    with row.popover("Upload your own scenario", icon=":material/upload_file:",
                     key="tour_upload_popover"):
        # No type filter, as for snapshots (ui/exports.py): the content is checked.
        st.file_uploader(
            "Scenario file (JSON)", key="tour_file", on_change=_on_upload,
            max_upload_size=uploader_mib(MAX_SCENARIO_BYTES),
            help="CONTRACT.md's scenario format: config, steps, and optionally a narration "
                 "and expected numbers per step. Its form is checked whole before anything "
                 "runs; a step the engine refuses (a request that does not exist) stops the "
                 "run at that step, with the reason. An upload is not saved: a reload of the "
                 "page forgets it." + limit_help(MAX_SCENARIO_BYTES))


def _can_next(run: TourRun) -> bool:
    """Whether Next (and Next step over the pool) has a step to show or apply. Not while
    playing: the play applies the steps, and a Next meanwhile waited for the play's
    step, then stopped the play, whose steps until then were never shown."""
    t = state()
    return (t.view < run.taken or run.can_advance) and not t.playing


def controls(run: TourRun) -> None:
    """Back, Next, Play or Pause, speed, Reset; the slider over the steps taken."""
    t = state()
    can_next = _can_next(run)
    # The buttons as wide as their labels, the slider taking what is left, the row
    # wrapping where the page is narrow: in columns of fixed shares the labels were cut
    # to "B…" and "R…" at 800 px beside the sidebar.
    c = st.container(horizontal=True, vertical_alignment="bottom", gap="small")
    clicks.button(c, "Back", key="tour_back", on_click=_on_back, disabled=t.view == 0,
                  icon=":material/arrow_back:", help="View the previous step.")
    clicks.button(c, "Next", key="tour_next", on_click=_on_next, disabled=not can_next,
                  type="primary", icon=":material/arrow_forward:",
                  help="Apply the next step (or view it, if it was already applied). While "
                       "the scenario plays, Pause first.")
    if t.playing:
        clicks.button(c, "Pause", key="tour_play", on_click=_on_play_pause, args=(False,),
                      icon=":material/pause:", help="Stop playing at this step.")
    else:
        clicks.button(c, "Play", key="tour_play", on_click=_on_play_pause, args=(True,),
                      disabled=not can_next, icon=":material/play_arrow:",
                      help="Step forward at the chosen speed until the end.")
    t.speed_drawn = c.select_slider("Seconds per step", SPEEDS, key="tour_speed",
                                    persist_state="session", format_func=lambda s: f"{s:g} s")
    clicks.button(c, "Reset", key="tour_reset", on_click=_on_reset, icon=":material/replay:",
                  help="Start this scenario again from a fresh engine.")
    if run.taken >= 1:
        st.slider("Steps taken so far: view any of them", 0, run.taken, key="tour_slider",
                  on_change=_on_slider, help="Step 0 is the fresh engine. Looking back "
                  "recomputes nothing; Next continues from the newest step.")
    # The kernel the steps to come run on; a step viewed whose model steps ran on
    # another (the sidebar's kernel changed since) says so, rather than seem to have run
    # on this one.
    now = run.engine.kernels.name
    ran = run.frame(t.view).ran_on
    st.caption(f"Viewing step **{t.view}** of {run.total} · {run.taken} applied so far · "
               f"kernel {now} ({run.engine.device})"
               + ("" if ran is None or ran == now else f"; step {t.view} ran on {ran}"))
    if run.error is not None:
        st.error(plain_md(f"The engine refused {run.error}. The run stops there: step "
                          f"{run.taken} is the state before it."))
    if run.stopped is not None:
        # Plain text: a grow names its request, the file's own text.
        st.warning(plain_md(run.stopped))
    # While playing, each step's narration is read out as it is drawn (ui/a11y.py).
    a11y.play_state(t.playing)


def step_bar(run: TourRun) -> None:
    """Back and Next again, above the block pool, with the step in view: a person
    watching the grid and tables steps on without scrolling up to the controls."""
    t = state()
    can_next = _can_next(run)
    c = st.container(horizontal=True, vertical_alignment="center", gap="small")
    clicks.button(c, "Previous step", key="tour_back_pool", on_click=_on_back,
                  disabled=t.view == 0, icon=":material/arrow_back:")
    clicks.button(c, "Next step", key="tour_next_pool", on_click=_on_next, disabled=not can_next,
                  icon=":material/arrow_forward:")
    c.caption(f"Showing step **{t.view}** of {run.total} below.", width="content")


def narration(run: TourRun, frame: Frame) -> None:
    """The viewed step: its operation, narration, what the engine did, the checked numbers."""
    with st.container(border=True, key="tour_narration"):
        if frame.step == 0:
            st.markdown(f"**Step 0 of {run.total}: the fresh engine**")
            # The description is the page's, above: this box says what state is shown.
            blocks = len(frame.snapshot["blocks"])
            # A file may list no steps: then the fresh engine is all there is to show.
            then = ("**Next** applies the first step." if run.total else
                    "This scenario has no steps: the fresh engine is all it shows.")
            st.markdown(f"Nothing has run yet: no request, and the pool's "
                        f"{counted(blocks, 'block')} {agrees(blocks, 'is', 'are all')} free. "
                        + then)
        else:
            # The step's operation, narration and summary quote the file's request
            # ids and texts: shown as written, never as Markdown.
            st.markdown(f"**Step {frame.step} of {run.total}:** {md_code(frame.label)}")
            # An exported Playground session narrates each step as its label, shown
            # just above: said once.
            if frame.narration and frame.narration != label_narration(frame.step, frame.label):
                st.markdown(plain_md(frame.narration))
            if frame.summary:
                st.caption(plain_md(frame.summary.replace("->", "→")))
            st.markdown("**What you should see**",
                        help="The values (numbers, tables, texts) this step's narration "
                             "promises, each checked against the engine right after the "
                             "step: ✓ it shows that value, ✗ it shows another. Hover a "
                             "line's name for what it means.")
            st.html(tour_views.checks_html(frame.checks))
            n = len(frame.checks)
            bad = sum(1 for c in frame.checks if not c.ok)
            if n and not bad:
                every = {1: "The narrated value matches", 2: "Both narrated values match"}
                st.caption(every.get(n, f"All {n} narrated values match")
                           + " the engine at this step.")
            elif bad:
                st.caption(f"{bad} of {counted(n, 'narrated value')} "
                           f"{'differs' if bad == 1 else 'differ'} from what the engine shows.")
        upcoming = run.next_label(frame.step)
        if upcoming is not None and run.error is not None and frame.step == run.taken:
            # The engine refused it (the message is above): there is no going on.
            st.caption(f"Step {frame.step + 1}, {md_code(upcoming)}, was refused: the run "
                       "ends here.")
        elif upcoming is not None and run.stopped is not None and frame.step == run.taken:
            # At the time limit, by its Stop button, or half-way by a failure: the
            # warning above says which.
            st.caption(f"Step {frame.step + 1}, {md_code(upcoming)}, was stopped: the run "
                       "ends here.")
        elif upcoming is not None:
            # Viewing the past, Next shows a step the engine has run, not runs it.
            done = " (already applied: Next views it)" if frame.step < run.taken else ""
            st.caption(f"Next: step {frame.step + 1}, {md_code(upcoming)}{done}.")
        elif frame.step == run.total and run.total:
            st.caption("This is the last step.")
    # Its label wraps where the narration's column is narrower than it (800 px beside
    # the sidebar cut it to "Continue in …").
    clicks.button(st, "Continue in the Playground", key="tour_continue",
                  on_click=_on_continue, icon=":material/call_split:", width="stretch",
                  wrap=True,
                  help="Put this exact state into the Playground and switch there. What "
                       "the Playground held stays saved as a session of its own (Recent "
                       "sessions), and this scenario run is kept.")


def arena(frame: Frame) -> None:
    """The contiguous arena beside the paged pool, for scenarios that name one."""
    a = frame.arena
    if a is None:
        return
    st.markdown(f"**The same requests in a contiguous arena of {a['capacity']} slots**")
    df, spec = tour_views.arena_spec(a, frame.snapshot)
    # As wide as the grid above it at any window width, so the slots line up.
    with fitted(spec, "tour_arena_box"):
        st.vega_lite_chart(df, spec, width="stretch", key="tour_arena")
    st.caption(plain_md(tour_views.arena_caption(a)))
    message = tour_views.arena_message(a)
    if message:
        st.warning(plain_md(message))
    st.html(tour_views.arena_legend_html())
