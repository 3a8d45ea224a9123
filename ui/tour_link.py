"""The Scenarios page's address, and `sync`, which each run of the page starts with.

The link: `?scenario=<file stem>&step=<n>` follows the view, with
`&applied=<m>` while steps past the view were taken; an upload's scenario is
`upload-<digest of the file>` (ui.tour.upload_link), which only the tab holding that
upload can open. A link that differs from what the page last wrote (a new session, a
reload, or an edited address) is applied: that scenario, run up to step m (or n),
viewing step n. Bad values get a message and the first scenario or step 0; a bad
`applied` is ignored. The state it reads and writes is ui.tour's `TourState`.
"""

from __future__ import annotations

import streamlit as st

from backend.core.errors import PagedLabError
from backend.sessions.tour import Frame, TourRun, parse_step, shipped_paths, shipped_scenario
from ui import history, session
from ui.tour import (
    PLAYGROUND_PAGE,
    UPLOAD,
    Link,
    TourState,
    first_stem,
    held,
    load,
    say,
    state,
)

LINK_PARAMS = ("scenario", "step", "applied")
MAX_QUOTED = 40              # characters of a link's value that a message repeats
# Links written that a click may still carry: a browser a few clicks behind is a few
# links behind (on a slow machine during a play, several steps).
WRITTEN_KEPT = 64


def sync() -> tuple[TourRun, Frame]:
    """Apply a new link, make sure a run exists on the sidebar's kernel, settle play, and
    write the link of the view to draw.

    Returns the run and the frame to draw. Switches to the Playground when
    "Continue in the Playground" asked for it.
    """
    t = state()
    if t.goto_playground:
        t.goto_playground = False
        st.switch_page(PLAYGROUND_PAGE)
    if history.went_back_or_forward():
        # Noted before waiting for the state's lock (see `back_to`).
        t.back_to = _given_link()
    with held():
        _apply_link()
        if t.run is None:
            load(first_stem())
        run = t.run
        assert run is not None
        s = session.get_settings()
        if (run.device, run.kernel) != (s.device, s.kernel):
            try:
                run.set_kernels(s.device, s.kernel)
            except PagedLabError as exc:
                say("error", f"The scenario keeps its kernel: {exc}")
        t.view = max(0, min(t.view, run.taken))
        if t.playing and t.view >= run.taken and not run.can_advance:
            t.playing = False
            if run.error is None and run.stopped is None:
                say("info", f"Played to the end: step {run.taken} of {run.total}.")
        # A widget's state may be set only before it is drawn: the slider follows the view.
        st.session_state["tour_slider"] = t.view
        # The link now, before the view is drawn: the browser has the step's entry by the
        # time the step shows. Written after drawing, a Back pressed as the step showed
        # went back past it, from an entry the step had not yet written. (The address is
        # now a moment ahead instead: a Back while a play draws its next step goes to the
        # step still shown, and stops the play there.)
        _write_link(run)
        return run, run.frame(t.view)


def _given_link() -> Link:
    """The link in the address this run came with."""
    params = st.query_params
    return (params.get("scenario"), params.get("step"), params.get("applied"))


def _apply_link() -> None:
    t = state()
    params = st.query_params
    want = _given_link()
    went = history.went_back_or_forward() or want == t.back_to
    t.back_to = None
    if went:
        # The browser's Back or Forward during a play: the person went to a view, and
        # the play stops there (it went on, and wrote its next step over that entry).
        t.playing = False
    if want == (None, None, None) and went:
        # An entry of the browser's history with a bare address is the view a bare
        # address stands for (_write_link leaves it bare). Opened as a link, not kept
        # as it is: Back from step 1 of it shows step 0.
        want = _bare_link()
    if (want == t.url or want[:2] == (None, None)
            or (not went and want in t.written)):
        # Nothing new: ours (the newest, or an older one, which a click sent before the
        # browser had the newer ones may carry: within a tab's session the address
        # changes only by the page's writes and by Back or Forward; a link opened anew
        # loads the page, a new session), or none at all (switching pages drops the
        # parameters).
        if want[:2] == (None, None) and want[2] is not None and want != t.url:
            say("info", f"The link's applied {_quoted(want[2])} counts only beside a "
                        "scenario and a step; it is ignored.")
        return
    name, step, applied = want
    # A parameter given twice (`&step=3&step=4`): the last counts, and the page says so
    # (the link written back then holds it once).
    for key in LINK_PARAMS:
        given = params.get_all(key)
        if len(given) > 1:
            times = "twice" if len(given) == 2 else f"{len(given)} times"
            say("info", f"The link gives {key} {times}; the last, "
                        f"{_quoted(given[-1])}, is used.")
    stems = shipped_paths()
    if name is not None and (t.run is None or name != _link_name(t.run)):
        if name in stems:
            load(name)
        elif name == t.upload_name and t.uploaded is not None:
            load(UPLOAD)         # Back or Forward to the upload's views: a fresh run of it
        elif name.startswith(f"{UPLOAD}-"):
            say("error", "The link names an uploaded scenario this tab no longer holds (an "
                          "upload is not saved: a reload forgets it, and another upload "
                          "replaces it); upload it again. Showing "
                          f"“{shipped_scenario(first_stem()).name}” instead.")
            load(first_stem())
            step = None
        else:
            say("error", f"The link names no scenario {_quoted(name)}; showing "
                          f"“{shipped_scenario(first_stem()).name}” instead.")
            load(first_stem())
            step = None
    if t.run is None:
        load(first_stem())
    run = t.run
    assert run is not None
    if step is None:
        if applied is not None and want[1] is None:
            # (A step dropped with an unknown scenario was reported with it.)
            say("info", f"The link's applied {_quoted(applied)} counts only beside a step; "
                        "it is ignored.")
        return
    n = parse_step(step, run.total)
    if n is None:
        dropped = ("" if applied is None else
                   f" Its applied {_quoted(applied)} is ignored with it.")
        say("error", f"The link's step {_quoted(step)} is not a step of this scenario (0 to "
                      f"{run.total}); showing step 0.{dropped}")
        t.view = 0
        return
    # Steps the link says were applied past the view are taken again (a reload after
    # stepping back keeps them); a count that is no step of the scenario is ignored.
    taken = parse_step(applied, run.total) if applied is not None else None
    if applied is not None and taken is None:
        say("info", f"The link's applied {_quoted(applied)} is not a step of this scenario "
                    f"(0 to {run.total}); it is ignored.")
    elif taken is not None and taken < n:
        # The view's own step is applied whatever the link says: fewer is no state.
        say("info", f"The link's applied {_quoted(applied or '')} is fewer than its step "
                    f"{n}, whose view applies {n}; it is ignored.")
    t.view = min(n, run.run_to(max(n, taken or 0)))


def _bare_link() -> Link:
    """The link a bare /tour stands for: the first scenario's fresh engine, the one view
    of a shipped scenario whose link is not written into a bare address."""
    return (first_stem(), "0", None)


def _quoted(value: str) -> str:
    """A link's value as a message quotes it: in quotes, and short (a link may be long)."""
    return repr(value if len(value) <= MAX_QUOTED else value[:MAX_QUOTED - 1] + "…")


def _link_name(run: TourRun) -> str:
    """`run`'s `scenario` in the address: its file's stem, or the upload's name."""
    name = state().upload_name if run.key == UPLOAD else None
    return name or run.key


def _write_link(run: TourRun) -> None:
    t = state()
    params = st.query_params
    applied = str(run.taken) if run.taken > t.view else None
    want: Link = (_link_name(run), str(t.view), applied)
    if want == _bare_link() and not any(name in params for name in LINK_PARAMS):
        # A bare address opens this view: it stays bare. A tab's first run writes its
        # link before the browser has assets/history.js, and Streamlit's entry for it
        # came after the bare one, which showed the same: Back went there, and the page
        # wrote the same link again.
        _remember(t, (None, None, None))
        return
    if (tuple(params.get(name) for name in LINK_PARAMS) != want
            or any(len(params.get_all(name)) > 1 for name in LINK_PARAMS)):
        # All at once: each separate change is an entry in the browser's history, and
        # one Back would then land on a half-written link that shows the same step.
        kept = {k: v for k, v in params.to_dict().items() if k not in LINK_PARAMS}
        params.from_dict({**kept, **{k: v for k, v in zip(LINK_PARAMS, want, strict=True)
                                     if v is not None}})
    _remember(t, want)


def _remember(t: TourState, link: Link) -> None:
    """`link` is the address now; the one before it joins `written`."""
    old = t.url
    if old is not None and old != link and old[:2] != (None, None):
        t.written = (*(w for w in t.written if w != old), old)[-WRITTEN_KEPT:]
    t.url = link
