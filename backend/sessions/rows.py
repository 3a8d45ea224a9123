"""What a saved session's row holds: its parts as written and as read back.

A row is written from a Head (label, step, settings, the zlib snapshot) and, when
a session starts, is copied or restarts, a Full (the head with the operation log,
its base snapshot and the kept history steps). What comes back is a StoredSession,
made by `check_row`: data only (JSON through the bounded decoder, zlib with a
bound on the output), checked for shape. Whether it is a consistent engine state
is backend/sessions/saved.py's check, through the snapshot restore.

The SQL that stores these parts is backend/sessions/store.py's.
"""

from __future__ import annotations

import hmac
import json
import os
import zlib
from dataclasses import dataclass
from typing import Any

from backend.core.errors import PagedLabError
from backend.io.json_input import decode_json
from backend.sessions.oplog import MAX_OP_BYTES, MAX_OPS

ROW_FORMAT = 1
MIB = 1 << 20
DAY = 86_400.0


class StoreError(PagedLabError):
    """The store cannot be opened, or a row cannot be read back as a session."""


class StoreUnavailableError(StoreError):
    """The database failed a query (locked by another process past the wait, read-only,
    damaged): a passing or server-side problem, not one of the row asked for."""


class StoreDamagedError(StoreUnavailableError):
    """The database file itself is damaged (SQLite finds it malformed, or no database):
    unlike a lock, waiting will not mend it."""


class TooLargeError(StoreError):
    """A session's state is over the size a row may hold: it is not written."""


def _env_int(name: str, default: int, lo: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isascii() or not raw.isdigit() or int(raw) < lo:
        raise StoreError(f"{name} must be a whole number >= {lo}, got {raw!r}")
    return int(raw)


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_snapshot_bytes: int = 16 * MIB
    max_sessions: int = 200
    ttl_s: float = 14 * DAY
    max_total_bytes: int = 1024 * MIB

    @classmethod
    def from_env(cls) -> StoreLimits:
        return cls(_env_int("PAGEDLAB_SESSION_MAX_MIB", 16) * MIB,
                   _env_int("PAGEDLAB_MAX_SESSIONS", 200),
                   _env_int("PAGEDLAB_SESSION_TTL_DAYS", 14) * DAY,
                   _env_int("PAGEDLAB_STORE_MAX_MIB", 1024) * MIB)


# ---- encoding -------------------------------------------------------------------------

def _json_text(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _pack(obj: Any) -> tuple[bytes, int]:
    """zlib of `obj`'s compact JSON, and the JSON's length."""
    text = _json_text(obj).encode()
    return zlib.compress(text, 1), len(text)


def _unpack(blob: Any, limit: int, what: str) -> Any:
    """The JSON value in a zlib blob, never inflating more than `limit` bytes."""
    if not isinstance(blob, bytes):
        raise StoreError(f"{what} is not stored data")
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(blob, limit + 1)
    except zlib.error as exc:
        raise StoreError(f"{what} is damaged ({exc})") from None
    if len(text) > limit:
        raise StoreError(f"{what} inflates past {limit:,} bytes")
    if not inflater.eof:
        raise StoreError(f"{what} is cut short")
    return decode_json(text, what)


@dataclass(frozen=True, slots=True)
class Head:
    """What every write puts in a session's row."""

    label: str
    step: int
    settings: str
    snapshot: bytes
    snapshot_bytes: int


@dataclass(frozen=True, slots=True)
class StepRow:
    step: int
    body: bytes
    num_events: int


def make_head(settings: dict[str, Any], snapshot: dict[str, Any], label: str,
              limits: StoreLimits) -> Head:
    """A row's head for this state. Raises TooLargeError over `limits.max_snapshot_bytes`."""
    blob, size = _pack(snapshot)
    if size > limits.max_snapshot_bytes:
        raise TooLargeError(f"its snapshot is {size / MIB:,.1f} MiB of JSON; a saved session may "
                       f"hold {limits.max_snapshot_bytes / MIB:,.0f} MiB")
    return Head(label, int(snapshot["step"]), _json_text(settings), blob, size)


def make_step(snapshot: dict[str, Any]) -> StepRow:
    """A history step's row: the snapshot without its events, and their number."""
    body = {k: ([] if k == "events" else v) for k, v in snapshot.items()}
    return StepRow(int(snapshot["step"]), _pack(body)[0], len(snapshot["events"]))


def op_text(op: dict[str, Any]) -> str:
    return _json_text(op)


@dataclass(frozen=True, slots=True)
class Full:
    """Everything a row holds: written whole when a session starts, is copied or restarts."""

    head: Head
    base: bytes | None
    ops: list[str]
    ops_complete: bool
    steps: list[StepRow]


def make_full(head: Head, base: dict[str, Any] | None, ops: list[dict[str, Any]],
              ops_complete: bool, steps: list[StepRow]) -> Full:
    return Full(head, None if base is None else _pack(base)[0], [op_text(o) for o in ops],
                ops_complete, steps)


# ---- what is read back -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One line of a browser's session list: read without decoding the state."""

    id: str
    label: str
    step: int
    created: float
    updated: float
    note: str | None


@dataclass(frozen=True, slots=True)
class StoredSession:
    """A row read back and checked for shape (saved.py checks it is a real state)."""

    id: str
    browser: str
    holder: str
    revision: int          # what a conditional claim compares (see store.SessionStore.claim)
    settings: dict[str, Any]
    snapshot: dict[str, Any]
    base: dict[str, Any] | None
    ops: list[dict[str, Any]]
    ops_complete: bool
    steps: list[tuple[int, dict[str, Any], int]]   # (step, body, num_events), oldest first
    note: str | None
    # Why its history of earlier steps could not be read back (then `steps` is empty): the
    # session still opens, from its snapshot, without them (saved.resume says so).
    history_problem: str | None = None
    # Why its operation log (or the base snapshot it starts from) could not be read back
    # (then `base` is None, `ops` empty and `ops_complete` False): the session opens
    # without it, so it can no longer be exported as a scenario.
    ops_problem: str | None = None

    def owned_by(self, browser: str) -> bool:
        return hmac.compare_digest(self.browser, browser)


def check_row(sid: str, row: tuple[Any, ...], ops: list[tuple[Any, ...]],
              steps: list[tuple[Any, ...]], limits: StoreLimits) -> StoredSession:
    """A row read back as a StoredSession: its format, JSON shapes, the log's sequence
    and bounds checked. Raises StoreError naming the first thing that is wrong."""
    browser, holder, fmt, revision, settings_text, snap_blob, base_blob, complete, note = row
    if fmt != ROW_FORMAT:
        raise StoreError(f"it was saved in session format {fmt!r}; this PagedLab reads "
                         f"format {ROW_FORMAT}")
    if not isinstance(settings_text, str):
        raise StoreError("its settings are not text")
    settings = decode_json(settings_text, "its settings")
    if not isinstance(settings, dict):
        raise StoreError("its settings are not a JSON object")
    snapshot = _unpack(snap_blob, limits.max_snapshot_bytes, "its snapshot")
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("events"), list) \
            or type(snapshot.get("step")) is not int:
        raise StoreError("its snapshot is not a snapshot object")
    ops_problem = None
    try:
        base, log = _oplog(base_blob, complete, ops, limits)
    except PagedLabError as exc:
        # Only what turns the session into a scenario file: the snapshot holds the
        # session whole. (Its JSON reader raises PagedLabError itself.)
        base, log, complete, ops_problem = None, [], 0, str(exc)
    history: list[tuple[int, dict[str, Any], int]] = []
    problem = None
    try:
        for step, blob, num_events in steps:
            body = _unpack(blob, limits.max_snapshot_bytes, f"its history step {step}")
            if not (isinstance(body, dict) and isinstance(num_events, int)
                    and 0 <= num_events <= len(snapshot["events"])
                    and body.get("step") == step):
                raise StoreError(f"its history step {step!r} is damaged")
            history.append((int(step), body, num_events))
    except PagedLabError as exc:
        # Only the timeline's earlier states: the snapshot holds the session whole. (Its
        # JSON reader raises PagedLabError itself: a body that is not valid JSON.)
        history, problem = [], str(exc)
    return StoredSession(sid, str(browser), str(holder), int(revision), settings, snapshot,
                         base, log, bool(complete), history,
                         None if note is None else str(note), problem, ops_problem)


def _oplog(base_blob: Any, complete: Any, ops: list[tuple[Any, ...]], limits: StoreLimits
           ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A row's base snapshot (None: a fresh engine) and operation log, read back and
    checked for shape. Raises PagedLabError naming the first thing that is wrong; an
    operation by the step it made."""
    if complete not in (0, 1):
        raise StoreError("its flag is neither 0 nor 1")
    base = None
    if base_blob is not None:
        base = _unpack(base_blob, limits.max_snapshot_bytes, "its base snapshot")
        if not isinstance(base, dict) or type(base.get("step")) is not int:
            raise StoreError("its base snapshot is not a snapshot object")
    if len(ops) > MAX_OPS:
        raise StoreError(f"it holds {len(ops):,} operations; at most {MAX_OPS:,}")
    first = 1 if base is None else base["step"] + 1
    log: list[dict[str, Any]] = []
    for i, (seq, text) in enumerate(ops):
        if seq != i or not isinstance(text, str) or len(text) > MAX_OP_BYTES:
            raise StoreError(f"its entry for step {first + i} is missing or damaged")
        op = decode_json(text, f"the operation of step {first + i}")
        if not isinstance(op, dict):
            raise StoreError(f"the operation of step {first + i} is not a JSON object")
        log.append(op)
    return base, log
