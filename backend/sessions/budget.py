"""How much K/V memory the app's engines may hold: per browser session and per server.

`EngineConfig` already refuses a single pool over 2 GiB (the command line's
limit). The app serves many sessions from one process, so it also caps each
session's engines together and all sessions together. An engine is counted
from the moment its bytes are claimed (checked and counted in one locked step,
before it is built) until its session replaces it or it is garbage-collected
(a session that ends gives the bytes back), so a refused request says how much
is in use and what would fit.

The limits come from the environment, in MiB: PAGEDLAB_SESSION_KV_MIB
(default 512) and PAGEDLAB_SERVER_KV_MIB (default 4096).

A browser tab that closed (or reloaded) leaves its session, and its engines, to
the server for a while in case it reconnects. When the server's limit refuses a
new engine, a `Reclaimer` the front end sets may end such sessions, when their
engines would make the room; the check or claim then waits briefly for those
engines to be collected (and for those of sessions ended just before, by another
claim or by the front end: `ending`) before it refuses.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backend.core.config import TINY_BYTE, EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import counted, tenths
from backend.engine.engine import Engine
from backend.views.model import format_bytes

MIB = 1 << 20
DEFAULT_SESSION_MIB = 512
DEFAULT_SERVER_MIB = 4096
# How often a refused form check may collect garbage, server-wide (`KVBudget._reserve`).
COLLECT_EVERY_S = 10.0
# How long a check or claim waits for ended sessions to give their engines back, and
# how often it collects garbage meanwhile (each collection holds the GIL, every
# session's, for up to a tenth of a second on a loaded server).
RECLAIM_WAIT_S = 3.0
RECLAIM_POLL_S = 0.25

# Asked with the bytes each other owner holds and the bytes short: ends the sessions of
# owners whose browser tabs have gone, if together they hold at least that much, and
# returns the owners it ended (none otherwise). Their engines are given back as they
# are collected.
Reclaimer = Callable[[dict[str, int], int], frozenset[str]]


# The engines a new one replaces (their bytes are given back first): none, one, or
# several (a scenario run's engine and its control run's).
Replaced = Engine | Sequence[Engine] | None


def _engines(replacing: Replaced) -> set[Engine]:
    """`replacing` as a set: an engine listed twice is given back once."""
    if replacing is None:
        return set()
    return {replacing} if isinstance(replacing, Engine) else set(replacing)


def _mib(value: int) -> str:
    """Bytes of K/V in MiB, to a tenth; under a twentieth of one (which reads "0.0 MiB")
    as format_bytes gives them: "2.0 KiB"."""
    return format_bytes(value) if 0 < value < MIB // 20 else f"{tenths(value / MIB)} MiB"


def _held(value: int, limit: int) -> str:
    """`_mib(value)` for bytes held short of `limit`, never reading as the limit itself:
    511.96 MiB held of 512 reads "511.9 MiB", where rounding said "512.0"."""
    shown = _mib(value)
    if value < limit and shown == _mib(limit):
        shown = f"{math.floor(value / MIB * 10) / 10:,.1f} MiB"
    return shown


def _env_mib(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default * MIB
    if not raw.isdigit() or int(raw) < 1:
        raise PagedLabError(f"{name} must be a whole number of MiB >= 1, got {raw!r}")
    return int(raw) * MIB


@dataclass(frozen=True, slots=True)
class _Holding:
    owner: str
    nbytes: int


@dataclass(frozen=True, slots=True)
class _Refusal:
    text: str
    # Bytes the server is short of because other sessions' engines fill it (0 when
    # another limit refuses: no other session's ending would help).
    shortfall: int = 0


def engine_bytes(engine: Engine) -> int:
    """The K/V an engine holds: its device pool and, with swap preemption, its host pool."""
    host = engine.host
    return engine.cache.total_bytes + (host.cache.total_bytes if host is not None else 0)


class KVBudget:
    """Counts the K/V bytes of live engines by owner (a browser session). Thread-safe."""

    def __init__(self, per_session: int, per_server: int) -> None:
        self.per_session = per_session
        self.per_server = per_server
        self._lock = threading.Lock()
        self._held: dict[int, _Holding] = {}
        # Keys whose engines were collected. A finalizer may run at any allocation,
        # inside a locked section too (while `_held` is being summed), so it only
        # appends here, without the lock; every locked section drains it first.
        self._gone: deque[int] = deque()
        self._keys: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
        self._next = 0
        self._collected = -math.inf     # when a check last collected garbage
        self._reclaimer: Reclaimer | None = None
        # Owners whose sessions were ended and whose engines may not be collected yet,
        # with when to stop waiting for them (a session that is never collected, by some
        # leak, would otherwise make every refusal wait).
        self._ending: dict[str, float] = {}
        # One reclaim at a time, from reading what others hold to noting what it ended:
        # two at once would each end sessions for room the other's are already making.
        self._reclaiming = threading.Lock()
        self._swept = -math.inf          # when a wait last collected garbage

    def set_reclaimer(self, reclaimer: Reclaimer | None) -> None:
        """Mutates: who may end gone sessions when the server is full (see the module)."""
        self._reclaimer = reclaimer

    def ending(self, owners: frozenset[str]) -> None:
        """Mutates: these owners' sessions have been ended; a check or claim the server
        refuses waits a moment for their engines (see the module)."""
        now = time.monotonic()
        with self._lock:
            # Those past their wait go here as well as in `_awaited`: on a server never
            # full, no refusal runs that, and every closed tab left an entry for good.
            self._ending = {o: until for o, until in self._ending.items() if now < until}
            self._ending.update(dict.fromkeys(owners, now + RECLAIM_WAIT_S))

    def _may_collect(self) -> bool:
        """Whether a form's check may collect garbage now (see `_reserve`)."""
        now = time.monotonic()
        with self._lock:
            if now - self._collected < COLLECT_EVERY_S:
                return False
            self._collected = now
            return True

    @classmethod
    def from_env(cls) -> KVBudget:
        return cls(_env_mib("PAGEDLAB_SESSION_KV_MIB", DEFAULT_SESSION_MIB),
                   _env_mib("PAGEDLAB_SERVER_KV_MIB", DEFAULT_SERVER_MIB))

    def in_use(self, owner: str | None = None) -> int:
        with self._lock:
            self._drain()
            return sum(h.nbytes for h in self._held.values() if owner in (None, h.owner))

    def check_size(self, config: EngineConfig, num_blocks: int | None = None,
                   num_cpu_blocks: int | None = None) -> None:
        """Raise PagedLabError if one engine with `config` alone would pass a session's
        limit, naming the pool to change (num_blocks, or swap's num_cpu_blocks) and how
        many of its blocks would fit. Depends on no other engine, so a settings form can
        refuse it before anything is built.

        `num_blocks` and `num_cpu_blocks` (default: the config's) ask about pools of that
        many blocks of the config's size, even past what a config may hold.
        """
        blocks = config.num_blocks if num_blocks is None else num_blocks
        cpu = config.num_cpu_blocks if num_cpu_blocks is None else num_cpu_blocks
        per = config.bytes_per_block
        need = blocks * per
        # Swap's host pool is this session's memory as much as the device pool (on a CPU,
        # the very same RAM).
        host = cpu * per if config.preemption == "swap" else 0
        if need + host <= self.per_session:
            return
        if host and need + per <= self.per_session:
            # The pool fits with room for a host block (swap needs one): the host pool is
            # what to shrink.
            raise PagedLabError(
                f"num_cpu_blocks: {counted(cpu, 'host block')} of {format_bytes(per)} would "
                f"take {_mib(host)} of K/V beside the pool's {_mib(need)}, but a browser "
                f"session may hold at most {_mib(self.per_session)}, which leaves room for "
                f"{counted((self.per_session - need) // per, 'host block')}")
        if host >= self.per_session:
            # The host pool alone passes the limit: no pool beside it could fit.
            raise PagedLabError(
                f"num_cpu_blocks: {counted(cpu, 'host block')} of {format_bytes(per)} would "
                f"take {_mib(host)} of K/V, more than the {_mib(self.per_session)} a browser "
                f"session may hold with its pool besides: "
                f"{counted(self.per_session // per, 'block')} of this size in all, pool and "
                "host pool together")
        fits = (self.per_session - host) // per
        beside = (f" beside the host pool's {_mib(host)} ({counted(cpu, 'host block')})"
                  if host else "")
        # A real model's shape is its weights': only the pool and its blocks can change.
        shape = (", fewer layers or heads, or a 2-byte dtype" if config.model == TINY_BYTE
                 else "")
        # Swap needs a host block: with one, only the device pool can shrink.
        smaller_host = " (a smaller host pool leaves room for more)" if cpu > 1 else ""
        room = (f"which is {counted(fits, 'block')} of this size{beside}. Use fewer or "
                "smaller blocks" if fits else
                f"less than one block of this size{beside}. Use smaller blocks")
        raise PagedLabError(
            f"num_blocks: {counted(blocks, 'block')} of {format_bytes(per)} would take "
            f"{_mib(need)} of K/V, but a browser session may hold at most "
            f"{_mib(self.per_session)}, {room}{shape}{smaller_host}")

    def _problem(self, need: int, owner: str, replacing: Replaced) -> _Refusal | None:
        """Why `need` more bytes for `owner` would pass a limit, or None. Call with the
        lock held. `replacing`'s holdings are given back first."""
        freed = 0
        for engine in _engines(replacing):
            key = self._keys.get(engine)
            held = self._held.get(key) if key is not None else None
            freed += held.nbytes if held is not None else 0
        mine = sum(h.nbytes for h in self._held.values() if h.owner == owner) - freed
        total = sum(h.nbytes for h in self._held.values()) - freed
        if need > self.per_server:
            # No wait helps: the server could never hold it, even with no other session.
            return _Refusal(f"{_mib(need)} of K/V is more than the {_mib(self.per_server)} the "
                            "server's sessions may hold together. Try a smaller pool")
        if mine + need > self.per_session:
            return _Refusal(f"this session's engines already hold "
                            f"{_held(mine, self.per_session)} of K/V; "
                            f"{_mib(need)} more would pass the {_mib(self.per_session)} a "
                            "session may hold")
        if total + need > self.per_server:
            wait = ("again when other sessions have ended" if self._reclaimer is not None
                    else "again in a few minutes (a browser tab keeps its engines for "
                         "about two minutes after it closes, in case it reconnects)")
            return _Refusal(f"the server's sessions hold {_held(total, self.per_server)} of "
                            f"K/V; {_mib(need)} "
                            f"more would pass its limit of {_mib(self.per_server)}. Try a "
                            f"smaller pool, or {wait}", total + need - self.per_server)
        return None

    def _try(self, need: int, owner: str, replacing: Replaced,
             keep: bool) -> tuple[int | None, _Refusal | None]:
        """One locked check of `need` (with `keep`, counted when it passes): the claim's key
        (None unless kept) and no refusal, or None and the refusal."""
        with self._lock:
            self._drain()
            problem = self._problem(need, owner, replacing)
            if problem is not None:
                return None, problem
            return (self._count(owner, need) if keep else None), None

    def _others(self, owner: str) -> tuple[dict[str, int], int]:
        """The bytes each owner but `owner` holds, leaving out those ending, and the
        bytes those ending still hold (room on its way back)."""
        held: dict[str, int] = {}
        coming = 0
        with self._lock:
            self._drain()
            for h in self._held.values():
                if h.owner in self._ending:
                    coming += h.nbytes
                elif h.owner != owner:
                    held[h.owner] = held.get(h.owner, 0) + h.nbytes
        return held, coming

    def _awaited(self) -> int:
        """Mutates: the bytes ending owners still hold, counting only those within
        RECLAIM_WAIT_S of their ending (the others are forgotten)."""
        now = time.monotonic()
        with self._lock:
            self._drain()
            holding: dict[str, int] = {}
            for h in self._held.values():
                holding[h.owner] = holding.get(h.owner, 0) + h.nbytes
            self._ending = {o: until for o, until in self._ending.items()
                            if o in holding and now < until}
            return sum(holding[o] for o in self._ending)

    def _sweep(self) -> None:
        """Collect garbage for the waits, at most every RECLAIM_POLL_S across the server:
        each waiting check or claim collecting on its own would multiply the GIL's cost."""
        now = time.monotonic()
        with self._lock:
            if now - self._swept < RECLAIM_POLL_S:
                return
            self._swept = now
        gc.collect()

    def _reserve(self, config: EngineConfig, owner: str, replacing: Replaced,
                 keep: bool) -> int | None:
        """Check `config` against both limits; with `keep`, count its bytes for `owner`
        in the same locked step (the key of the claim). Raises PagedLabError."""
        self.check_size(config)
        need = config.kv_bytes + config.host_kv_bytes
        key, problem = self._try(need, owner, replacing, keep)
        if problem is None:
            return key
        # Engines dropped but not yet collected (reference cycles) still count: collect
        # them before refusing, since their memory is about to come back. A claim always
        # does; a form's question (`check`, asked on every run of a page while refused)
        # at most every COLLECT_EVERY_S seconds across the server: a full collection
        # holds the GIL, every session's, for tens of milliseconds.
        if keep or self._may_collect():
            gc.collect()
            key, problem = self._try(need, owner, replacing, keep)
            if problem is None:
                return key
        assert problem is not None
        if not problem.shortfall:
            raise PagedLabError(problem.text)
        reclaimer = self._reclaimer
        if reclaimer is not None:
            with self._reclaiming:
                self._awaited()             # forgets those ending too long
                held, coming = self._others(owner)
                if coming < problem.shortfall:
                    self.ending(reclaimer(held, problem.shortfall - coming))
        # Sessions that this or another claim (or the front end) ended: their engines
        # come back as those sessions are collected (at once, those in no reference
        # cycle). Try again, and wait while what they still hold would make the room,
        # for RECLAIM_WAIT_S at most. Each round counts what they hold before it tries,
        # so engines let go after a try are seen by the next one.
        deadline = time.monotonic() + RECLAIM_WAIT_S
        while True:
            coming = self._awaited()
            key, problem = self._try(need, owner, replacing, keep)
            if problem is None:
                return key
            if not 0 < problem.shortfall <= coming or time.monotonic() >= deadline:
                raise PagedLabError(problem.text)
            time.sleep(RECLAIM_POLL_S)
            self._sweep()

    def check(self, config: EngineConfig, owner: str, *,
              replacing: Replaced = None) -> None:
        """Raise PagedLabError if an engine with `config` would exceed a limit.

        `replacing` is the owner's engine that the new one replaces: its bytes
        are given back with it (see `claim`), so they are not counted against it.
        Counts nothing: a form's answer, cheap enough for every run of a page (before
        refusing it collects engines dropped but not yet collected at most every
        COLLECT_EVERY_S seconds, where `claim` always does). When other sessions fill
        the server it may, as a claim does, end sessions whose tabs have gone, and
        wait up to RECLAIM_WAIT_S while ended sessions' engines would make the room:
        a session is ended once, so a page waits once for it. To build the engine,
        `claim` its bytes.
        """
        self._reserve(config, owner, replacing, keep=False)

    def claim(self, config: EngineConfig, owner: str, *,
              replacing: Replaced = None) -> int:
        """Mutates: `check`, and count the engine's bytes for `owner` in the same locked
        step, so two sessions building at once cannot both pass on the same room.

        Returns the claim's key for `bind` (the engine is built) or `cancel` (it was
        not). Raises PagedLabError, counting nothing.
        """
        key = self._reserve(config, owner, replacing, keep=True)
        assert key is not None
        return key

    def claim_unchecked(self, config: EngineConfig, owner: str) -> int:
        """Mutates: count an engine's bytes without refusing it: a new session's default
        pool, which a full server must still give every visitor."""
        with self._lock:
            self._drain()
            return self._count(owner, config.kv_bytes + config.host_kv_bytes)

    def bind(self, key: int, engine: Engine) -> Engine:
        """Mutates: the claim `key` now counts `engine` (its exact bytes) until its session
        replaces it (`retire`) or it is garbage-collected."""
        with self._lock:
            self._drain()
            owner = self._held[key].owner
            self._held[key] = _Holding(owner, engine_bytes(engine))
            self._keys[engine] = key
        weakref.finalize(engine, self._release, key)
        return engine

    def built(self, key: int, make: Callable[[], Engine]) -> Engine:
        """Mutates: the engine `make()` builds for the claim `key`, bound to it; if building
        fails, in any way, the claim is given back and the failure raised."""
        try:
            engine = make()
        except BaseException:
            self.cancel(key)
            raise
        return self.bind(key, engine)

    def cancel(self, key: int) -> None:
        """Mutates: give back a claim whose engine was never built."""
        self._release(key)

    def retire(self, engine: Engine) -> None:
        """Mutates: stop counting `engine`, which its session has replaced. Streamlit keeps
        a session's previous state until that session's next run, so the engine may
        outlive its replacement by minutes; other sessions should not pay for it."""
        with self._lock:
            self._drain()
            key = self._keys.pop(engine, None)
            if key is not None:
                self._held.pop(key, None)

    def track(self, engine: Engine, owner: str) -> Engine:
        """Mutates: count `engine`'s K/V against `owner` until it is garbage-collected."""
        with self._lock:
            self._drain()
            key = self._count(owner, engine_bytes(engine))
        return self.bind(key, engine)

    def _count(self, owner: str, nbytes: int) -> int:
        """A new holding of `nbytes` for `owner`; its key. Call with the lock held."""
        key = self._next
        self._next += 1
        self._held[key] = _Holding(owner, nbytes)
        return key

    def _release(self, key: int) -> None:
        self._gone.append(key)

    def _drain(self) -> None:
        """Drop the holdings of collected engines. Call with the lock held."""
        while self._gone:
            self._held.pop(self._gone.popleft(), None)


# The app's one budget, shared by every session of the process.
SERVER_BUDGET = KVBudget.from_env()
