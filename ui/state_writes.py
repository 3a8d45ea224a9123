"""Session-state writes that must land even if Streamlit stops the run that makes them.

Streamlit stops a superseded run by raising from its next Streamlit call, and a
superseded run's `st.session_state` access raises the same way (ui/progress.py). An
operation that has changed the engine queues its bookkeeping here instead (`Queued`),
and whichever run gets there first performs it: the operation's own, or the next.
Plain Python, no Streamlit: the queue is reached without session state.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

# `Queued.put`'s "whatever the key holds".
_ANY = object()


class Queued:
    """Session-state writes that must land even if Streamlit stops this run.

    A superseded run's next `st.session_state` access raises (its safe state
    yields to the runner), so after an operation has changed the engine its
    bookkeeping must not write there directly: a stopped step would leave the
    session's keys describing the state before it. Such writes are queued
    here (a plain object, reached without session state) and `apply`
    performs them; what an interrupted `apply` did not write stays queued for
    the next run's, which `ui.session` calls before anything reads those keys.
    """

    def __init__(self, remembered: Collection[str] = ()) -> None:
        self._lock = threading.Lock()
        # key -> its writes, oldest first: (value, the value the key must still hold for
        # the write to land). Keys in the order their last write was made.
        self._writes: dict[str, list[tuple[Any, Any]]] = {}
        self._expected: weakref.WeakSet[Expected] = weakref.WeakSet()
        self._busy: set[str] = set()     # keys whose write a run is making now
        # The last unconditional write of each key in `remembered`, kept once applied
        # (see `last`): only small values (the status line), never an engine.
        self._remembered = frozenset(remembered)
        self._last: dict[str, Any] = {}

    def expect(self, key: str, value: Any) -> Expected:
        """What `key` holds when an operation is clicked (`value`), for a conditional
        `put` once it is done: the person's selection, as this queue's own writes carry
        it forward. Two Adds in a row both see A picked; when the first's write moves
        the pick to its new request, the second's expectation moves with it, so the
        second's request is picked too."""
        expected = Expected(key, value)
        with self._lock:
            self._expected.add(expected)
        return expected

    def put(self, key: str, value: Any, *, if_still: Any = _ANY) -> None:
        """Queue `state[key] = value`; with `if_still` (a value, or an `expect`ation),
        only if the key then still holds it: a selection the person changed while an
        operation waited is theirs."""
        with self._lock:
            # An unconditional write makes the key's earlier ones moot. A conditional one
            # waits behind them (a new engine's "nothing picked" lands first, and the
            # condition is asked of what it leaves).
            writes = [] if if_still is _ANY else self._writes.pop(key, [])
            self._writes.pop(key, None)
            writes.append((value, if_still))
            self._writes[key] = writes
            if if_still is _ANY and key in self._remembered:
                self._last[key] = value

    def last(self, key: str) -> Any:
        """The last value put for `key` (one of `remembered`) unconditionally, applied or
        not (None if none): what a run that may no longer read session state can learn
        of another's write."""
        with self._lock:
            return self._last.get(key)

    def write(self, state: Any, key: str, value: Any) -> None:
        """Mutates: `state[key] = value` now, an app's own write (a page correcting a pick
        that is gone), which expectations follow as they follow queued writes."""
        before = state.get(key)
        state[key] = value
        self._carry(key, before, value)

    def _carry(self, key: str, before: Any, after: Any) -> None:
        with self._lock:
            # Values are compared only for a key someone expects (a pick): other keys
            # hold engines and logs, whose comparison would be deep or ambiguous.
            waiting = [e for e in self._expected if e.key == key]
            if not waiting or before == after:
                return
            for expected in waiting:
                if expected.value == before:
                    expected.value = after

    def apply(self, state: Any, skip: Collection[str] = ()) -> bool:
        """Write everything queued into `state` (st.session_state), each key's writes in
        the order they were made, except the keys in `skip`, which stay queued. Whether
        any write stayed for them.

        Two runs may apply at once. A write is taken off the queue before it is made
        (so it is made once) and put back first if making it raises; while one run
        makes a key's write, the other leaves that key's later writes to it (so they
        land after it, not before)."""
        while True:
            with self._lock:
                key = next((k for k in self._writes
                            if k not in skip and k not in self._busy), None)
                if key is None:
                    return any(k in skip for k in self._writes)
                writes = self._writes[key]
                write = writes.pop(0)
                if not writes:
                    del self._writes[key]
                self._busy.add(key)
                value, if_still = write
                wanted = _wanted(if_still)
            try:
                before = state.get(key)
                if if_still is _ANY or before == wanted:
                    state[key] = value      # may raise: then it goes back, first
                    self._carry(key, before, value)
            except BaseException:
                with self._lock:
                    self._writes.setdefault(key, []).insert(0, write)
                raise
            finally:
                with self._lock:
                    self._busy.discard(key)


@dataclass(eq=False, slots=True, weakref_slot=True)
class Expected:
    """See `Queued.expect`. Held by the operation's callback; forgotten with it."""

    key: str
    value: Any


def _wanted(if_still: Any) -> Any:
    return if_still.value if isinstance(if_still, Expected) else if_still
