"""Long runs on the "Contiguous vs paged" page that outlive the page run that started them.

A click on another tab, or any field's change, reruns the page, and Streamlit
stops the run in progress at its next call: a replay of 20,000 requests, or a
dozen engine runs, was lost with it, and the person pressed the button again.
So the work runs in a thread the browser session keeps (`start`), and the
section shows its bar by polling it (`follow`): a rerun stops the polling, not
the work, and the next run that draws the section follows it again and takes
its result, whichever tab was open meanwhile.

Bounds: one job per section and browser session; at most MAX_JOBS at work on the
server at once (they share its CPUs, and hold Python's lock for most of their
time); and a job whose browser session has ended (its tab closed, and the time
for a reconnect past, or the server's K/V limit ended it sooner: see
ui/reclaim.py) is stopped at its next progress report, as a closed tab's page run
used to be.

The work reads no session state and draws nothing (it runs outside any page
run); what it needs is passed in, and it reports progress through the
`Advance` it is given. A section records the result with the inputs the job
was started with (`Job.inputs`): the fields may have changed since.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from ui.bars import Advance

# How often a followed job's bar is redrawn.
POLL_S = 0.25
# Jobs at work on the server at once, every session's together.
MAX_JOBS = 2
_SLOTS = threading.BoundedSemaphore(MAX_JOBS)
# The session-state key of the object whose end stops the session's jobs.
_OWNER = "cmp_jobs_owner"

BUSY = ("The server is already running {n} long runs (every visitor's together); press "
        "again when one of them has ended.")
STILL_GOING = ("The run started earlier ({what}) is still going, or waiting to be shown: "
               "its result comes below when it ends; press again then for another.")


class StoppedError(Exception):
    """Raised inside a job's work by its progress report once its session has ended."""


@dataclass(eq=False)
class Job:
    """One long run: its inputs, its progress so far, and, once `ended`, its outcome."""

    inputs: Any
    text: str
    what: str = ""
    fraction: float = 0.0
    result: Any = None
    error: BaseException | None = None
    ended: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def advance(self, fraction: float, text: str) -> None:
        """The work's progress report; raises StoppedError once the job is to stop."""
        if self.stop.is_set():
            raise StoppedError
        # Two attribute writes, each atomic: a poll between them shows the new fraction
        # with the old text for one redraw at most.
        self.fraction, self.text = min(max(fraction, 0.0), 1.0), text


class _Owner:
    """Kept only in the session's state: collected with it, it stops the session's jobs."""

    def __init__(self) -> None:
        self.jobs: weakref.WeakSet[Job] = weakref.WeakSet()
        weakref.finalize(self, _stop_all, self.jobs)


def _stop_all(jobs: weakref.WeakSet[Job]) -> None:
    for job in list(jobs):
        job.stop.set()


def start(key: str, inputs: Any, work: Callable[[Advance], Any], text: str,
          what: str = "") -> str | None:
    """Mutates: run `work(advance)` in a thread as this session's job `key`.

    Returns None once it is started, or why it was not: this section's earlier job
    is still at work or not yet shown (`what` names a job's inputs in that message),
    or the server runs MAX_JOBS already. The page shows the reason."""
    ss = st.session_state
    earlier: Job | None = ss.get(key)
    if earlier is not None:
        return STILL_GOING.format(what=earlier.what or "its fields as they were then")
    owner: _Owner | None = ss.get(_OWNER)
    if owner is None:
        owner = ss[_OWNER] = _Owner()
    job = Job(inputs, text, what)
    owner.jobs.add(job)
    if not _SLOTS.acquire(blocking=False):
        return BUSY.format(n=MAX_JOBS)
    try:
        ss[key] = job
    except BaseException:
        # A superseded page run raises at its next session-state access: no thread
        # then, so the slot goes back at once.
        _SLOTS.release()
        raise

    def body() -> None:
        try:
            job.result = work(job.advance)
        except BaseException as exc:   # handed to the page run that follows the job
            job.error = exc
        finally:
            _SLOTS.release()
            job.ended.set()

    threading.Thread(target=body, name=f"pagedlab-{key}", daemon=True).start()
    return None


def follow(key: str, where: Any = None) -> Job | None:
    """This session's job `key` once it has ended, its bar drawn here (or in the
    placeholder `where`) until then; None if there is none.

    A job that ended well, or refused (PagedLabError), stays until `forget`, so that a
    page run stopped before it recorded the result, or drew the refusal, does so the
    next time; the refusal is raised. Any other failure is forgotten and raised."""
    job: Job | None = st.session_state.get(key)
    if job is None:
        return None
    # A job that ends at once (its runs cached) shows no bar that would only flicker.
    if not job.ended.wait(0.05):
        bar = (st if where is None else where).progress(job.fraction, text=job.text)
        while not job.ended.wait(POLL_S):
            bar.progress(job.fraction, text=job.text)
        bar.empty()
    if job.error is not None:
        if not isinstance(job.error, PagedLabError):
            forget(key)
        raise job.error
    return job


def begin(key: str, inputs: Any, work: Callable[[Advance], Any], text: str,
          what: str = "") -> None:
    """Mutates: `start`, saying on the page why the job was not started, if it was not."""
    reason = start(key, inputs, work, text, what)
    if reason is not None:
        st.warning(reason)


def take(key: str, record: Callable[[Job], None],
         refused: Callable[[PagedLabError], None], where: Any = None) -> None:
    """Mutates: follow the job `key` (`follow`, its bar at `where`); hand it to `record`
    once it has ended well, or its refusal to `refused`; then forget it."""
    try:
        job = follow(key, where)
    except PagedLabError as exc:
        refused(exc)
        forget(key)
        return
    if job is not None:
        record(job)
        forget(key)


def forget(key: str) -> None:
    """Mutates: the job `key`'s outcome is recorded (or its refusal drawn); drop it."""
    st.session_state.pop(key, None)
