"""What restore noted of a snapshot besides the state: fields it did not read, fields
it derived, and a log it kept as partial, per restored engine (backend/io/restore.py).

The notes are what a person who restored a file should be told ("Note: ...") on the
Playground and by the command line; they live as long as the engine does.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

from backend.engine.engine import Engine
from backend.io.json_input import unread_note
from backend.io.restore_derive import Derived, derived_note


def keep_notes(engine: Engine, unread: tuple[str, ...], derived: Derived,
               partial: str | None) -> None:
    """Mutates: note what restore found of the snapshot `engine` was restored from, where
    there is anything to note."""
    if unread or derived.fields or partial is not None:
        with _RECORD_LOCK:
            _RECORD[engine] = _Record(unread, derived, partial)


@dataclass(frozen=True)
class _Record:
    """What restore noted of one engine's snapshot: the fields it did not read, what it
    derived, and why the log cannot be a whole run's (a partial log it kept), if so."""

    unread: tuple[str, ...] = ()
    derived: Derived = field(default_factory=Derived)
    partial: str | None = None


# Per restored engine, until it is collected (engines with nothing to note are not
# listed). Restores run in many sessions' threads at once: hence the lock.
_RECORD: weakref.WeakKeyDictionary[Engine, _Record] = weakref.WeakKeyDictionary()
_RECORD_LOCK = threading.Lock()


def _record(engine: Engine) -> _Record:
    with _RECORD_LOCK:
        return _RECORD.get(engine, _Record())


def unread_fields(engine: Engine) -> tuple[str, ...]:
    """The path of each field ("snapshot.requests[0].max_new_tokns") that the snapshot
    `engine` was restored from holds and restore did not read, in file order. Empty for
    an engine no restore built, or whose snapshot held only fields PagedLab reads."""
    return _record(engine).unread


def derived_fields(engine: Engine) -> Derived:
    """What restore derived of DERIVABLE's fields for the snapshot `engine` was restored
    from, which lacked them (restore_derive.py); nothing for any other engine."""
    return _record(engine).derived


def restore_notes(engine: Engine) -> list[str]:
    """What the user who restored `engine` should be told besides the state, as sentences
    without their final full stop (shown as "Note: ...."): the fields restore ignored
    (`unread_fields`, the first NOTED_FIELDS of them, the rest counted), the fields it
    derived, what of them the log could not fix (`derived_fields`), and a log kept as
    partial because it cannot be every event of a run that reached the state."""
    record = _record(engine)
    notes = [*unread_note(record.unread),
             *derived_note(record.derived.names, record.derived.caveats)]
    if record.partial is not None:
        notes.append(f"the event log does not lead to this state on its own: "
                     f"{record.partial}; it is kept as a partial log, so the timeline and "
                     "the counts read from it (swap-outs and returns) cover only the events "
                     "it holds, and this engine's snapshots say events_partial")
    return notes
