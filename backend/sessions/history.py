"""A Playground session's run: the snapshot after each operation, held as deltas.

Every snapshot carries every event so far, so keeping N of them whole costs
O(N x events): 2,500 operations held 1.3 GB. Events are append-only between
two restores, so the history keeps one shared list of event records and,
per step, the snapshot without its events plus how many events it had. A
step's whole snapshot is rebuilt on demand (a shallow copy and a slice), and
equals what `export_snapshot` returned for it.

The steps kept are bounded twice: at most `max_steps` of them, and at most
`max_cells` blocks plus tokens across them (a 65,536-block pool keeps fewer
steps than a 32-block one). The oldest go first; the newest always stays.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_STEPS = 100
MAX_CELLS = 2_000_000


@dataclass(slots=True)
class Entry:
    """One kept step. Its flags are read and set from any thread (single attribute
    reads and writes); the history's own lists are changed under its lock."""

    body: dict[str, Any]    # the snapshot with "events" still in place but empty
    num_events: int
    cells: int              # blocks + tokens: what this entry costs to keep
    # Read back from a saved session's row (a damaged row can hold any JSON), not the
    # engine's own export; such a step is shown only once restore's checks passed it.
    saved: bool
    checked: bool

    def snapshot(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """The whole snapshot, from the history's shared event records `events`."""
        head = events[:self.num_events]
        return {k: (head if k == "events" else v) for k, v in self.body.items()}


def _cells(snapshot: dict[str, Any]) -> int:
    return len(snapshot["blocks"]) + sum(len(r["tokens"]) for r in snapshot["requests"])


class History:
    """The snapshots of one engine's run, oldest first. Not shared between sessions, but
    read by the session's download callables, which Streamlit runs in a thread of their
    own: every method takes the history's lock, and iterating walks a copy."""

    def __init__(self, *, max_steps: int = MAX_STEPS, max_cells: int = MAX_CELLS) -> None:
        self.max_steps = max_steps
        self.max_cells = max_cells
        self._lock = threading.RLock()
        # Append-only until `clear` puts a new list in its place, so a copy of the
        # reference rebuilds any step it had, whatever is recorded after.
        self._events: list[dict[str, Any]] = []
        self._entries: deque[Entry] = deque()
        self._cells = 0
        # Why the steps read back from a saved session were dropped (`drop_saved`), for
        # every export of this run to say, not only the one that found it.
        self._dropped: str | None = None

    @property
    def dropped_because(self) -> str | None:
        """Why this run's steps read back from a saved session were dropped, or None."""
        with self._lock:
            return self._dropped

    def record(self, snapshot: dict[str, Any], *, saved: bool = False) -> None:
        """Mutates: keep `snapshot` as the newest step.

        Its events must extend the previous step's (they do between two
        restores: the engine only appends). A snapshot whose events do not is
        the start of another run, and the history starts again from it.
        `saved`: read back from a saved session, to be checked before it is shown
        (`playground.kept_snapshot`).
        """
        events = snapshot["events"]
        # Same keys in the same order (the JSON written from it must not change).
        body = {k: ([] if k == "events" else v) for k, v in snapshot.items()}
        entry = Entry(body, len(events), _cells(snapshot), saved, not saved)
        with self._lock:
            n = len(self._events)
            continues = len(events) >= n and (n == 0 or events[n - 1] == self._events[-1])
            if not continues:
                self.clear()
                n = 0
            self._events.extend(events[n:])
            self._entries.append(entry)
            self._cells += entry.cells
            while len(self._entries) > 1 and (len(self._entries) > self.max_steps
                                              or self._cells > self.max_cells):
                self._cells -= self._entries.popleft().cells

    def clear(self) -> None:
        """Mutates: forget every step."""
        with self._lock:
            self._events = []
            self._entries.clear()
            self._cells = 0
            self._dropped = None

    def entry(self, index: int) -> tuple[Entry, dict[str, Any]]:
        """Step `index`'s entry and its whole snapshot, read together."""
        with self._lock:
            entry = self._entries[index]
            return entry, entry.snapshot(self._events)

    def entries(self) -> list[tuple[Entry, dict[str, Any]]]:
        """Every step's entry and its whole snapshot, oldest first, read together."""
        with self._lock:
            return [(e, e.snapshot(self._events)) for e in self._entries]

    def mark_own(self, index: int) -> None:
        """Mutates: step `index` is the engine's own export (equal to it), read back or not."""
        with self._lock:
            entry = self._entries[index]
            entry.saved, entry.checked = False, True

    def drop_saved(self, because: str) -> None:
        """Mutates: forget every step read back from a saved session (one of them was
        found damaged, `because` says how, and the row that held it is suspect), so the
        steps kept still run without a gap. The newest, the live state's, stays."""
        with self._lock:
            if self._dropped is None:
                self._dropped = because
            kept = [e for i, e in enumerate(self._entries)
                    if not e.saved or i == len(self._entries) - 1]
            self._entries = deque(kept)
            self._cells = sum(e.cells for e in kept)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """The whole snapshot of a kept step (a new dict; its event records are shared)."""
        return self.entry(index)[1]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            entries, events = list(self._entries), self._events
        for e in entries:
            yield e.snapshot(events)

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self[-1] if self._entries else None

    @property
    def num_event_records(self) -> int:
        """Event records held (once each, however many steps refer to them)."""
        return len(self._events)
