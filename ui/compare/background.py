"""Long runs on the "Contiguous vs paged" page that outlive the page run that started them.

A click on another tab, or any field's change, reruns the page, and Streamlit
stops the run in progress at its next call: a replay of 20,000 requests, or a
dozen engine runs, was lost with it, and the person pressed the button again.
So the work runs in a thread the browser session keeps (`start`), and the
section shows its bar by polling it (`follow`): a rerun stops the polling, not
the work, and the next run that draws the section follows it again and takes
its result, whichever tab was open meanwhile.

The work reads no session state and draws nothing (it runs outside any page
run); what it needs is passed in, and it reports progress through the
`Advance` it is given. A section records the result with the inputs the job
was started with (`Job.inputs`): the fields may have changed since.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from ui.bars import Advance

# How often a followed job's bar is redrawn.
POLL_S = 0.25


@dataclass(eq=False)
class Job:
    """One long run: its inputs, its progress so far, and, once `ended`, its outcome."""

    inputs: Any
    text: str
    fraction: float = 0.0
    result: Any = None
    error: BaseException | None = None
    ended: threading.Event = field(default_factory=threading.Event)

    def advance(self, fraction: float, text: str) -> None:
        # Two attribute writes, each atomic: a poll between them shows the new fraction
        # with the old text for one redraw at most.
        self.fraction, self.text = min(max(fraction, 0.0), 1.0), text


def running(key: str) -> bool:
    """Whether this browser session's job `key` is still at work."""
    job: Job | None = st.session_state.get(key)
    return job is not None and not job.ended.is_set()


def start(key: str, inputs: Any, work: Callable[[Advance], Any], text: str) -> None:
    """Mutates: run `work(advance)` in a thread as this session's job `key`, unless one is
    running already (a second click while it runs changes nothing: `follow` shows it)."""
    if running(key):
        return
    job = Job(inputs, text)

    def body() -> None:
        try:
            job.result = work(job.advance)
        except BaseException as exc:   # handed to the page run that follows the job
            job.error = exc
        finally:
            job.ended.set()

    st.session_state[key] = job
    threading.Thread(target=body, name=f"pagedlab-{key}", daemon=True).start()


def follow(key: str) -> Job | None:
    """This session's job `key` once it has ended, its bar drawn here until then; None if
    there is none. Raises what the work raised (the job is then forgotten); a job that
    ended well stays until `forget`, so a run stopped before recording it records it
    the next time."""
    job: Job | None = st.session_state.get(key)
    if job is None:
        return None
    # A job that ends at once (its runs cached) shows no bar that would only flicker.
    if not job.ended.wait(0.05):
        bar = st.progress(job.fraction, text=job.text)
        while not job.ended.wait(POLL_S):
            bar.progress(job.fraction, text=job.text)
        bar.empty()
    if job.error is not None:
        forget(key)
        raise job.error
    return job


def forget(key: str) -> None:
    """Mutates: the job `key`'s result is recorded; drop it."""
    st.session_state.pop(key, None)
