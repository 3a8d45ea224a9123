"""Saved Playground sessions: an embedded SQLite database, one row per session.

Where: `sessions.sqlite3` in the data directory, PAGEDLAB_DATA_DIR (default
`data/` beside the code, git-ignored), created on first use. The journal is
WAL with synchronous=NORMAL: readers never wait for the writer, and a killed
server keeps every transaction it committed (an operating-system crash may
lose the last few; PagedLab's sessions are worth that trade).

Layout (`PRAGMA user_version` 3; each row also carries its own `format`):

    sessions  id (random, in the address), browser (SHA-256 of the browser's
              secret: whose session it is), holder (the one tab that writes
              it), revision (a random number every write replaces: what a tab
              read is still the row only while it is unchanged, whatever the
              clock does; never 0, which an older PagedLab's rows read as.
              Triggers refuse an update that keeps it and an insert without
              one, so a server of an older PagedLab still running on the
              upgraded file fails to save, saying why, rather than write past
              it), format, created, updated, label, step, settings (JSON),
              snapshot (zlib JSON), snapshot_bytes, base (zlib JSON or NULL:
              the snapshot the operation log starts from), ops_complete,
              stored_bytes, note (why the row is behind the live session)
    ops       (session, seq, op): the operation log, one JSON object a row
    steps     (session, step, body, num_events): the history kept, each
              snapshot without its events (they are a prefix of the row's
              snapshot's events) and how many it had

Bounds, from the environment: PAGEDLAB_SESSION_MAX_MIB (16) a session's
snapshot JSON, PAGEDLAB_MAX_SESSIONS (200) rows kept, newest first,
PAGEDLAB_SESSION_TTL_DAYS (14) days a row may go unused, PAGEDLAB_STORE_MAX_MIB
(1024) all rows' stored bytes together. Older rows go first; the row being
written never does.

What a row holds, and the shape check of what is read back, are
backend/sessions/rows.py's. Every query is parameterised. Thread-safe: a
writing connection and a reading one, each behind its own lock, so that a
save waiting for SQLite's write lock (another process holding it) never holds
up a read, such as a new visitor's list of sessions; and each write waits for
that lock at most BUSY_TIMEOUT_S, counted from when it was asked for (a save
makes one write, at times two), then fails with a message (the next save
writes the session whole) rather than hold up every session's saves behind it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

from backend.sessions.rows import (
    ROW_FORMAT,
    Full,
    Head,
    SessionInfo,
    StepRow,
    StoreDamagedError,
    StoredSession,
    StoreError,
    StoreLimits,
    StoreUnavailableError,
    check_row,
)

FILE_NAME = "sessions.sqlite3"
DB_LAYOUT = 3
ID_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
MIN_ID, MAX_ID = 16, 64
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
# How long one query waits for a lock another process holds (a save's write lock;
# a read waits only while a checkpoint resets the log).
BUSY_TIMEOUT_S = 5.0

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, browser TEXT NOT NULL, holder TEXT NOT NULL,
    revision INTEGER NOT NULL DEFAULT 0, format INTEGER NOT NULL, created REAL NOT NULL,
    updated REAL NOT NULL,
    label TEXT NOT NULL, step INTEGER NOT NULL, settings TEXT NOT NULL,
    snapshot BLOB NOT NULL, snapshot_bytes INTEGER NOT NULL, base BLOB,
    ops_complete INTEGER NOT NULL, stored_bytes INTEGER NOT NULL, note TEXT)""",
    "CREATE INDEX IF NOT EXISTS sessions_by_browser ON sessions (browser, updated)",
    "CREATE INDEX IF NOT EXISTS sessions_by_updated ON sessions (updated)",
    """CREATE TABLE IF NOT EXISTS ops (
    session TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL, op TEXT NOT NULL, PRIMARY KEY (session, seq))""",
    """CREATE TABLE IF NOT EXISTS steps (
    session TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    step INTEGER NOT NULL, body BLOB NOT NULL, num_events INTEGER NOT NULL,
    PRIMARY KEY (session, step))""",
    # Every write of a row's content replaces its revision; an older PagedLab's does not:
    # its updates keep it, and its inserts (a session written whole) give none.
    """CREATE TRIGGER IF NOT EXISTS sessions_revised BEFORE UPDATE OF holder, step,
    settings, snapshot, note ON sessions WHEN NEW.revision = OLD.revision
    BEGIN SELECT RAISE(ABORT, 'this store was upgraded by a newer PagedLab, which this
    server must be too: its writes leave a session''s revision as it was'); END""",
    """CREATE TRIGGER IF NOT EXISTS sessions_revised_new BEFORE INSERT ON sessions
    WHEN NEW.revision = 0
    BEGIN SELECT RAISE(ABORT, 'this store was upgraded by a newer PagedLab, which this
    server must be too: its writes give a session no revision'); END""",
)
# Layout 1 (before rows had a revision): its rows read as revision 0 until their next write.
# Layout 2 had the column but not yet the triggers, which the schema adds.
_FROM_LAYOUT_1 = "ALTER TABLE sessions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0"


def _new_revision() -> int:
    """A revision no earlier write of the row had, as far as 63 random bits go; never 0.

    Random, not a counter: a row deleted and written again starts afresh, and
    a counter starting afresh could come back to the number a tab read before.
    """
    return 1 + secrets.randbelow(2**63 - 1)


def valid_token(value: object) -> bool:
    """Is `value` a session id or browser secret as `secrets.token_urlsafe` makes them?

    ASCII letters, digits, "-" and "_", 16 to 64 of them: anything else in an
    address (quotes, SQL, non-ASCII, a megabyte of text) is no id of ours.
    """
    return (isinstance(value, str) and MIN_ID <= len(value) <= MAX_ID
            and all(c in ID_ALPHABET for c in value))


def browser_key(secret: str) -> str:
    """What a row stores of its browser's secret: its SHA-256, so the file gives no secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def data_dir() -> Path:
    """The data directory: PAGEDLAB_DATA_DIR, else `data/` beside the code."""
    raw = os.environ.get("PAGEDLAB_DATA_DIR", "").strip()
    return Path(raw).expanduser() if raw else DEFAULT_DATA_DIR


class Write(Enum):
    SAVED = "saved"
    TAKEN = "taken"        # another tab holds the row now: the writer must become a copy
    MISSING = "missing"    # the row is gone (expired, deleted): write it whole
    REVIVED = "revived"    # written whole where the row was gone: it is back in the list


class SessionStore:
    """The sessions database at `path` (see module doc). Thread-safe."""

    def __init__(self, path: Path, limits: StoreLimits | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.limits = limits or StoreLimits.from_env()
        self._clock = clock
        self._lock = threading.Lock()          # the writing connection, `_db`
        self._read_lock = threading.Lock()     # the reading one, `_reader`
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                       timeout=BUSY_TIMEOUT_S)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            if self._layout() != DB_LAYOUT:
                self._upgrade(path)
            self._reader = sqlite3.connect(path, isolation_level=None,
                                           check_same_thread=False, timeout=BUSY_TIMEOUT_S)
            self._reader.execute("PRAGMA query_only=ON")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the session store {str(path)!r}: {exc}") from None

    def _layout(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _upgrade(self, path: Path) -> None:
        """A new file gets the tables; a layout-1 file its revision column, and a layout-1
        or 2 file the triggers that guard it. One transaction, the layout read again
        inside it: of two servers starting on one file, the second finds the work done,
        and a failure leaves the file as it was."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            layout = self._layout()
            if layout not in (0, 1, 2, DB_LAYOUT):
                raise StoreError(f"{path} has session layout {layout}; this PagedLab reads "
                                 f"layouts 1 to {DB_LAYOUT}")
            if layout == 1:
                self._db.execute(_FROM_LAYOUT_1)
            if layout != DB_LAYOUT:
                for statement in _SCHEMA:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={DB_LAYOUT}")

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._db.close()
            self._reader.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction on the reading connection: its queries see one state."""
        with self._read_lock:
            try:
                self._reader.execute("BEGIN")
                try:
                    yield self._reader
                finally:
                    self._reader.execute("COMMIT")
            except sqlite3.Error as exc:
                raise _failed(exc) from None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction, holding the write lock from its start (BEGIN IMMEDIATE).

        It waits at most BUSY_TIMEOUT_S in all, for the saves queued before it and for
        SQLite's lock together: saves queued behind another process's lock fail one
        after another within that time, not N x the timeout.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        if not self._lock.acquire(timeout=BUSY_TIMEOUT_S):
            raise StoreUnavailableError("the session store failed: database is locked (the "
                                        "saves before this one are still waiting for it)")
        try:
            try:
                left_ms = max(0, int((deadline - time.monotonic()) * 1000))
                self._db.execute(f"PRAGMA busy_timeout={left_ms}")
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise _failed(exc) from None
        finally:
            self._lock.release()

    # ---- writes ------------------------------------------------------------------------

    def create(self, sid: str, browser: str, holder: str, full: Full) -> None:
        """Mutates: a new row `sid` holding `full`. Raises StoreError if `sid` exists."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id=?", (sid,)).fetchone():
                raise StoreError(f"session {sid} exists already")
            self._insert(db, sid, browser, holder, full)
            self._prune(db, sid)

    def write_full(self, sid: str, browser: str, holder: str, full: Full) -> Write:
        """Mutates: replace everything `sid` holds, if `holder` holds it (re-created if gone:
        then REVIVED, since the person may have deleted it from another tab)."""
        with self._tx() as db:
            row = db.execute("SELECT holder, created FROM sessions WHERE id=?",
                             (sid,)).fetchone()
            if row is not None and row[0] != holder:
                return Write.TAKEN
            if row is not None:
                # Its ops and steps go with it (ON DELETE CASCADE).
                db.execute("DELETE FROM sessions WHERE id=?", (sid,))
            self._insert(db, sid, browser, holder, full, created=None if row is None else row[1])
            self._prune(db, sid)
        return Write.REVIVED if row is None else Write.SAVED

    def write_op(self, sid: str, holder: str, head: Head, op: tuple[int, str] | None,
                 step: StepRow | None, keep_from: int | None, ops_complete: bool) -> Write:
        """Mutates: one more operation: the new head, the op (seq, JSON) and the history
        step, dropping history steps before `keep_from` and, once the log is no longer
        complete, the log."""
        with self._tx() as db:
            row = db.execute("SELECT holder FROM sessions WHERE id=?", (sid,)).fetchone()
            if row is None:
                return Write.MISSING
            if row[0] != holder:
                return Write.TAKEN
            db.execute("UPDATE sessions SET revision=?, updated=?, label=?, step=?, settings=?, "
                       "snapshot=?, snapshot_bytes=?, ops_complete=?, note=NULL WHERE id=?",
                       (_new_revision(), self._clock(), head.label, head.step, head.settings,
                        head.snapshot, head.snapshot_bytes, int(ops_complete), sid))
            if not ops_complete:
                db.execute("DELETE FROM ops WHERE session=?", (sid,))
            elif op is not None:
                db.execute("INSERT OR REPLACE INTO ops (session, seq, op) VALUES (?, ?, ?)",
                           (sid, op[0], op[1]))
            if step is not None:
                db.execute("INSERT OR REPLACE INTO steps (session, step, body, num_events) "
                           "VALUES (?, ?, ?, ?)", (sid, step.step, step.body, step.num_events))
            if keep_from is not None:
                db.execute("DELETE FROM steps WHERE session=? AND step<?", (sid, keep_from))
            self._count_bytes(db, sid)
            self._prune(db, sid)
        return Write.SAVED

    def claim(self, sid: str, holder: str, *, if_unchanged: int | None = None) -> bool:
        """Mutates: `holder` (a tab that opened the row) writes it from now on; with
        `if_unchanged` (the row's revision when that tab read it), only if no write
        has come since. Whether the row was taken."""
        with self._tx() as db:
            if if_unchanged is None:
                cur = db.execute("UPDATE sessions SET holder=?, revision=?, updated=? WHERE id=?",
                                 (holder, _new_revision(), self._clock(), sid))
            else:
                cur = db.execute("UPDATE sessions SET holder=?, revision=?, updated=? WHERE id=? "
                                 "AND revision=?",
                                 (holder, _new_revision(), self._clock(), sid, if_unchanged))
            return cur.rowcount > 0

    def set_note(self, sid: str, holder: str, note: str) -> None:
        """Mutates: say why the row is behind its live session (shown when it is opened)."""
        with self._tx() as db:
            db.execute("UPDATE sessions SET note=?, revision=? WHERE id=? AND holder=?",
                       (note, _new_revision(), sid, holder))

    def delete(self, sid: str, browser: str) -> bool:
        """Mutates: delete `sid` if it is `browser`'s. Whether a row went."""
        with self._tx() as db:
            cur = db.execute("DELETE FROM sessions WHERE id=? AND browser=?", (sid, browser))
            return cur.rowcount > 0

    def prune(self) -> None:
        """Mutates: apply the bounds now (they are also applied on every write)."""
        with self._tx() as db:
            self._prune(db, None)

    def _insert(self, db: sqlite3.Connection, sid: str, browser: str, holder: str,
                full: Full, created: float | None = None) -> None:
        now = self._clock()
        h = full.head
        db.execute("INSERT INTO sessions (id, browser, holder, revision, format, created, "
                   "updated, label, step, settings, snapshot, snapshot_bytes, base, "
                   "ops_complete, stored_bytes) VALUES "
                   "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                   (sid, browser, holder, _new_revision(), ROW_FORMAT,
                    now if created is None else created, now, h.label, h.step, h.settings,
                    h.snapshot, h.snapshot_bytes, full.base, int(full.ops_complete)))
        if full.ops_complete:
            db.executemany("INSERT INTO ops (session, seq, op) VALUES (?, ?, ?)",
                           [(sid, i, text) for i, text in enumerate(full.ops)])
        db.executemany("INSERT INTO steps (session, step, body, num_events) VALUES (?, ?, ?, ?)",
                       [(sid, s.step, s.body, s.num_events) for s in full.steps])
        self._count_bytes(db, sid)

    @staticmethod
    def _count_bytes(db: sqlite3.Connection, sid: str) -> None:
        db.execute("UPDATE sessions SET stored_bytes = length(snapshot) + ifnull(length(base), 0)"
                   " + (SELECT ifnull(sum(length(body)), 0) FROM steps WHERE session=?1)"
                   " + (SELECT ifnull(sum(length(op)), 0) FROM ops WHERE session=?1)"
                   " WHERE id=?1", (sid,))

    def _prune(self, db: sqlite3.Connection, keep: str | None) -> None:
        """Expired rows, then the oldest past the count, then the oldest past the bytes."""
        lim = self.limits
        keep = keep or ""
        db.execute("DELETE FROM sessions WHERE updated<? AND id<>?",
                   (self._clock() - lim.ttl_s, keep))
        db.execute("DELETE FROM sessions WHERE id IN (SELECT id FROM sessions WHERE id<>? "
                   "ORDER BY updated DESC LIMIT -1 OFFSET ?)",
                   (keep, lim.max_sessions - (1 if keep else 0)))
        total = db.execute("SELECT ifnull(sum(stored_bytes), 0) FROM sessions").fetchone()[0]
        if total <= lim.max_total_bytes:
            return
        doomed = []
        for sid, size in db.execute("SELECT id, stored_bytes FROM sessions WHERE id<>? "
                                    "ORDER BY updated ASC", (keep,)):
            if total <= lim.max_total_bytes:
                break
            doomed.append((sid,))
            total -= size
        db.executemany("DELETE FROM sessions WHERE id=?", doomed)

    # ---- reads -------------------------------------------------------------------------

    def _expired_before(self) -> float:
        return self._clock() - self.limits.ttl_s

    def recent(self, browser: str, limit: int = 20) -> list[SessionInfo]:
        """`browser`'s unexpired sessions, most recently used first.

        A row whose step or times are not numbers (a damaged file: SQLite keeps any
        value in any column) is left out of the list, which would otherwise fail for
        every visit from that browser; its address still opens it."""
        with self._read() as db:
            rows = db.execute(
                "SELECT id, label, step, created, updated, note FROM sessions "
                "WHERE browser=? AND updated>=? AND typeof(step)='integer' "
                "AND typeof(created) IN ('integer', 'real') "
                "AND typeof(updated) IN ('integer', 'real') ORDER BY updated DESC LIMIT ?",
                (browser, self._expired_before(), limit)).fetchall()
        return [SessionInfo(str(r[0]), str(r[1]), int(r[2]), float(r[3]), float(r[4]),
                            None if r[5] is None else str(r[5])) for r in rows]

    def holder(self, sid: str) -> str | None:
        """The tab that writes row `sid` now (see saved.py), or None if there is no such
        row. Reads one column: cheap, unlike `load`."""
        with self._read() as db:
            row = db.execute("SELECT holder FROM sessions WHERE id=?", (sid,)).fetchone()
        return None if row is None else str(row[0])

    def latest(self, browser: str) -> str | None:
        """The id of `browser`'s most recently used unexpired session, if it has one."""
        found = self.recent(browser, limit=1)
        return found[0].id if found else None

    def load(self, sid: str) -> StoredSession | None:
        """The unexpired row `sid`, checked for shape; None if there is none.

        Raises StoreError naming what is wrong with a row that cannot be read
        back: another format, damaged data, JSON of the wrong shape.
        """
        with self._read() as db:
            row = db.execute(
                "SELECT browser, holder, format, revision, settings, snapshot, base, "
                "ops_complete, note FROM sessions WHERE id=? AND updated>=?",
                (sid, self._expired_before())).fetchone()
            if row is None:
                return None
            ops = db.execute("SELECT seq, op FROM ops WHERE session=? ORDER BY seq",
                             (sid,)).fetchall()
            steps = db.execute("SELECT step, body, num_events FROM steps WHERE "
                               "session=? ORDER BY step", (sid,)).fetchall()
        return check_row(sid, row, ops, steps, self.limits)


def _failed(exc: sqlite3.Error) -> StoreUnavailableError:
    """A failed query as the error to report: a damaged file (which waiting will not mend)
    apart from a passing failure (a lock held past the wait, a full disk)."""
    code = getattr(exc, "sqlite_errorcode", None)
    # The extended code (SQLITE_CORRUPT_INDEX is 779): its low byte is the primary one.
    if code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return StoreDamagedError(f"the session store's file is damaged ({exc})")
    return StoreUnavailableError(f"the session store failed: {exc}")
