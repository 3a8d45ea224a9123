"""PagedLab's BlockManager against vLLM's BlockPool and nano-vllm's BlockManager, one trace.

All three allocators replay the same operations in one process: requests
that open with one of 8 shared system prompts, multi-turn continuations
(a finished conversation comes back with its whole history plus a new user
turn, so its full blocks hit the prefix cache, often as cached free blocks),
decode one token at a time (a new block every 16 tokens), and frees. The pool
is first filled to 80%: long-lived requests hold most of it, so every pool
size replays the same mix of operations while the pool, its free queue and
its cache map grow from 10^3 to 10^6 blocks. Each system warms up on the same
operations untimed; then the timed operations run in rounds, the systems
taking turns in a rotating order, and the figures are medians over rounds.

The peers' code is copied at run time from copies the user provides (see
bench/peers.py; nothing of theirs is kept in this repository):

    python bench/allocator_vs_peers.py --vllm PATH --nano-vllm PATH
        [--sizes 1000,10000,100000,1000000] [--ops 200000] [--rounds 20]
        [--repeat N]

PATH is a git mirror, a source tree or a wheel; PAGEDLAB_VLLM_SRC and
PAGEDLAB_NANOVLLM_SRC name them too. Without both, the benchmark says so and
exits 0. All three hash blocks with SHA-256 (nano-vllm's xxhash is stubbed
by SHA-256). `--repeat N` measures each size N times over (fresh systems,
the same trace) and ends with each ratio's median and lowest over the N runs:
on a shared machine one run's ratio moves by about 0.1.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from backend.paging.block_manager import BlockManager

BLOCK_SIZE = 16
VOCAB = 32_000  # a Llama-sized vocabulary: token ids do not fit a byte
ALLOC, APPEND, FREE = 0, 1, 2
Op = tuple[int, str, Any]


# ---- the trace ---------------------------------------------------------------

def make_trace(num_blocks: int, num_ops: int, seed: int = 0, warm_ops: int = 50_000,
               vocab: int = VOCAB) -> tuple[list[Op], list[Op], dict[str, int]]:
    """Warm-up and timed operations for a pool of `num_blocks`, and the timed ones' counts.

    Long-lived requests (a system prompt and 128..768 more tokens) first fill
    the pool to 80% less the active budget (min(40%, 4,096 blocks)); then
    requests arrive, decode and finish. A new request is a conversation's
    first turn (one of 8 system prompts of 32..160 tokens plus 8..64 user
    tokens) or, half the time when one is waiting, a finished conversation's
    next turn (its whole history plus 8..64 tokens; up to 4 turns, the 256
    latest waiting); it decodes 16..160 tokens one at a time, in random
    interleaving with the others, and is freed after its last one.

    A reference BlockManager replays the trace as it is built, so that every
    operation fits: a request is admitted only while the blocks in use plus
    the blocks the running requests will still take stay within 80% of the
    pool, which leaves the peers 20% of headroom for eviction orders that
    differ from ours.
    """
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab) for _ in range(rng.randrange(32, 161))]
                for _ in range(8)]
    ref = BlockManager(num_blocks, BLOCK_SIZE, record_events=False, vocab_size=vocab)
    target = int(0.8 * num_blocks)
    active_budget = min(int(0.4 * num_blocks), 4096)
    bs = BLOCK_SIZE
    blocks_for = ref.blocks_for
    ops: list[Op] = []
    counts = {"allocate": 0, "prompt_tokens": 0, "hit_blocks": 0, "append": 0,
              "new_blocks": 0, "free": 0}
    next_id = 0
    reserved = 0  # blocks the running requests will still take

    def used() -> int:
        return num_blocks - ref.num_free_blocks

    def admit(prompt: list[int], out_len: int) -> str | None:
        nonlocal next_id, reserved
        plan = ref.plan_prompt(prompt)
        growth = blocks_for(len(prompt) + out_len) - blocks_for(len(prompt))
        if used() + reserved + plan.num_new_blocks + growth > target or not plan.fits_now:
            return None
        next_id += 1
        rid = f"r{next_id}"
        ref.allocate(rid, prompt)
        ops.append((ALLOC, rid, prompt))
        reserved += growth
        counts["allocate"] += 1
        counts["prompt_tokens"] += len(prompt)
        counts["hit_blocks"] += len(plan.hit_blocks)
        return rid

    # Long-lived requests hold the pool's bulk; they are never touched again.
    while used() < target - active_budget:
        body = [rng.randrange(vocab) for _ in range(rng.randrange(128, 769))]
        if admit(prefixes[rng.randrange(8)] + body, 0) is None:
            break

    live: list[str] = []
    history: dict[str, list[int]] = {}
    left: dict[str, int] = {}
    turns: dict[str, int] = {}
    pending: list[tuple[list[int], int]] = []

    def step() -> None:
        nonlocal reserved
        if pending and rng.random() < 0.5:
            hist, turn = pending.pop(rng.randrange(len(pending)))
        else:
            hist, turn = list(prefixes[rng.randrange(8)]), 0
        prompt = hist + [rng.randrange(vocab) for _ in range(rng.randrange(8, 65))]
        out_len = rng.randrange(16, 161)
        rid = admit(prompt, out_len)
        if rid is not None:
            live.append(rid)
            # A copy: the operation keeps the prompt, the history grows.
            history[rid], left[rid], turns[rid] = list(prompt), out_len, turn + 1
            return
        if not live:
            raise RuntimeError(f"a pool of {num_blocks} blocks is too small for this trace")
        i = rng.randrange(len(live))
        rid = live[i]
        token = rng.randrange(vocab)
        if ref.num_tokens(rid) % bs == 0:
            counts["new_blocks"] += 1
            reserved -= 1
        ref.append(rid, [token])
        ops.append((APPEND, rid, token))
        counts["append"] += 1
        history[rid].append(token)
        left[rid] -= 1
        if left[rid] == 0:
            counts["free"] += 1
            ref.free(rid)
            ops.append((FREE, rid, None))
            live[i] = live[-1]
            live.pop()
            hist = history.pop(rid)
            del left[rid]
            turn = turns.pop(rid)
            if turn < 4 and rng.random() < 0.5:
                pending.append((hist, turn))
                if len(pending) > 256:
                    pending.pop(0)

    warm_len = len(ops) + warm_ops
    while len(ops) < warm_len:
        step()
    warm = ops[:]
    del ops[:]
    for k in counts:
        counts[k] = 0
    while len(ops) < num_ops:
        step()
    return warm, ops, counts


# ---- the systems -------------------------------------------------------------

class System(NamedTuple):
    run: Callable[[list[Op]], None]  # replay operations
    used_blocks: Callable[[], int]
    hit_blocks: Callable[[], int]    # prefix-cache hit blocks so far


def pagedlab(num_blocks: int, vocab: int, record_events: bool) -> System:
    """Our BlockManager, through the calls the engine makes (append_one per token)."""
    m = BlockManager(num_blocks, BLOCK_SIZE, record_events=record_events, vocab_size=vocab)
    allocate, free = m.allocate, m.free
    if hasattr(m, "append_one"):
        append_one = m.append_one

        def run(ops: list[Op]) -> None:
            for kind, rid, arg in ops:
                if kind == APPEND:
                    append_one(rid, arg)
                elif kind == ALLOC:
                    allocate(rid, arg)
                else:
                    free(rid)
    else:  # an older BlockManager, before append_one: the call the engine made then
        append = m.append

        def run(ops: list[Op]) -> None:
            for kind, rid, arg in ops:
                if kind == APPEND:
                    append(rid, [arg])
                elif kind == ALLOC:
                    allocate(rid, arg)
                else:
                    free(rid)

    def used() -> int:
        m.check_integrity()
        return num_blocks - m.num_free_blocks
    return System(run, used, lambda: m.prefix_hit_blocks)


def vllm(num_blocks: int, vocab: int) -> System:
    """vLLM v1's BlockPool and FullAttentionManager, driven as its KVCacheManager drives them.

    A new request builds its Request (which hashes its full blocks), looks up
    the longest cache hit (all but the last token, as vLLM does), checks the
    free blocks, touches the hit blocks, allocates the rest and caches its
    full blocks; a decode token is appended to the Request (hashing a block
    that fills), then gets its slot and the filled block is cached. The pool
    has one block more, for vLLM's null block. KV events are off (vLLM's
    default).
    """
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.request import Request

    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, sha256)
    spec = FullAttentionSpec(block_size=BLOCK_SIZE)
    pool = BlockPool(num_blocks + 1, enable_caching=True, hash_block_size=BLOCK_SIZE)
    mgr = FullAttentionManager(spec, block_pool=pool, enable_caching=True,
                               kv_cache_group_id=0, scheduler_block_size=BLOCK_SIZE)
    find_hit = FullAttentionManager.find_longest_cache_hit
    reqs: dict[str, Any] = {}
    groups = [0]
    no_blocks: list[Any] = []
    hits = [0]

    def run(ops: list[Op]) -> None:
        num_free = pool.get_num_free_blocks
        to_allocate = mgr.get_num_blocks_to_allocate
        allocate_new = mgr.allocate_new_blocks
        cache = mgr.cache_blocks
        for kind, rid, arg in ops:
            if kind == APPEND:
                req = reqs[rid]
                req.append_output_token_ids(arg)
                n = req.num_tokens
                if to_allocate(rid, n, no_blocks, n - 1, 0, n) > num_free():
                    raise RuntimeError(f"vLLM is out of blocks for {rid}")
                allocate_new(rid, n, n)
                cache(req, n, replay_boundaries=())
            elif kind == ALLOC:
                req = Request(rid, arg, hasher)
                n = req.num_tokens
                (hit_blocks,), hit = find_hit(req.block_hashes, n - 1, groups, pool, spec,
                                              False, BLOCK_SIZE)
                if to_allocate(rid, n, hit_blocks, hit, hit, n) > num_free():
                    raise RuntimeError(f"vLLM is out of blocks for {rid}")
                mgr.add_local_computed_blocks(rid, hit_blocks, hit, 0)
                allocate_new(rid, n, n)
                cache(req, n, replay_boundaries=())
                reqs[rid] = req
                hits[0] += len(hit_blocks)
            else:
                mgr.free(rid)
                del reqs[rid]

    return System(run, lambda: num_blocks - pool.get_num_free_blocks(), lambda: hits[0])


def nano_vllm(num_blocks: int, vocab: int) -> System:
    """nano-vllm's BlockManager, driven as its Scheduler drives it.

    A new request: can_allocate, allocate, then (after its prefill)
    hash_blocks; a decode token: append_token, can_append, may_append, then
    hash_blocks for the token computed.
    """
    from nanovllm.engine.block_manager import BlockManager as NanoBlockManager
    from nanovllm.engine.sequence import Sequence

    Sequence.block_size = BLOCK_SIZE
    bm = NanoBlockManager(num_blocks, BLOCK_SIZE)
    seqs: dict[str, Any] = {}
    hits = [0]

    def run(ops: list[Op]) -> None:
        can_append, may_append, hash_blocks = bm.can_append, bm.may_append, bm.hash_blocks
        for kind, rid, arg in ops:
            if kind == APPEND:
                seq = seqs[rid]
                seq.append_token(arg)
                if not can_append(seq):
                    raise RuntimeError(f"nano-vllm is out of blocks for {rid}")
                may_append(seq)
                seq.num_scheduled_tokens = 1
                hash_blocks(seq)
                seq.num_cached_tokens += 1
                seq.num_scheduled_tokens = 0
            elif kind == ALLOC:
                seq = Sequence(arg)
                cached = bm.can_allocate(seq)
                if cached == -1:
                    raise RuntimeError(f"nano-vllm is out of blocks for {rid}")
                bm.allocate(seq, cached)
                seq.num_scheduled_tokens = seq.num_tokens - seq.num_cached_tokens
                hash_blocks(seq)
                seq.num_cached_tokens = seq.num_tokens
                seq.num_scheduled_tokens = 0
                seqs[rid] = seq
                hits[0] += cached
            else:
                bm.deallocate(seqs.pop(rid))

    return System(run, lambda: len(bm.used_block_ids), lambda: hits[0])


SYSTEMS: dict[str, Callable[[int, int], System]] = {
    "pagedlab": lambda n, v: pagedlab(n, v, record_events=True),
    "pagedlab-no-events": lambda n, v: pagedlab(n, v, record_events=False),
    "vllm": vllm,
    "nano-vllm": nano_vllm,
}


# ---- timing ------------------------------------------------------------------

def measure(num_blocks: int, num_ops: int, rounds: int, seed: int, vocab: int
            ) -> dict[str, Any]:
    """One pool size: build, warm up, then time every system on the same rounds."""
    warm, timed, counts = make_trace(num_blocks, num_ops, seed, vocab=vocab)
    systems = {name: make(num_blocks, vocab) for name, make in SYSTEMS.items()}
    for system in systems.values():
        system.run(warm)
    hits_before = {name: system.hit_blocks() for name, system in systems.items()}
    # Freeze what the warm-up built, so that a garbage collection during a round
    # scans only what the rounds allocate, not every system's whole pool.
    gc.collect()
    gc.freeze()
    chunk = -(-len(timed) // rounds)
    names = list(systems)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        ops = timed[r * chunk:(r + 1) * chunk]
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            systems[name].run(ops)
            seconds[name].append(time.perf_counter() - t0)
    gc.unfreeze()
    used = {name: system.used_blocks() for name, system in systems.items()}
    hits = {name: system.hit_blocks() - hits_before[name] for name, system in systems.items()}
    del systems
    gc.collect()
    sizes = [len(timed[r * chunk:(r + 1) * chunk]) for r in range(rounds)]
    ops_per_s = {name: statistics.median(n / t for n, t in zip(sizes, ts, strict=True))
                 for name, ts in seconds.items()}

    def ratio(a: str, b: str) -> float:
        """Median over rounds of a's speed over b's in the same round."""
        return statistics.median(tb / ta for ta, tb in zip(seconds[a], seconds[b], strict=True))

    return {"num_blocks": num_blocks, "ops": len(timed), "rounds": rounds, "counts": counts,
            "ops_per_s": ops_per_s, "used_blocks_at_end": used, "hit_blocks": hits,
            "ratios": {f"{a}/{b}": ratio(a, b) for a in ("pagedlab", "pagedlab-no-events")
                       for b in ("vllm", "nano-vllm")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm", type=Path, default=os.environ.get("PAGEDLAB_VLLM_SRC"),
                        help="vLLM: git mirror, source tree or wheel (PAGEDLAB_VLLM_SRC)")
    parser.add_argument("--nano-vllm", type=Path,
                        default=os.environ.get("PAGEDLAB_NANOVLLM_SRC"),
                        help="nano-vllm: git mirror, source tree or zip "
                             "(PAGEDLAB_NANOVLLM_SRC)")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--ops", type=int, default=200_000, help="timed operations per size")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=VOCAB, help="token ids are 0..vocab-1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure each size this many times; ends with medians and lows")
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    missing = [name for name, path in (("vLLM", args.vllm), ("nano-vllm", args.nano_vllm))
               if path is None or not Path(path).exists()]
    if missing:
        print(f"skipped: no copy of {' or '.join(missing)} was given (--vllm / --nano-vllm, "
              "or PAGEDLAB_VLLM_SRC / PAGEDLAB_NANOVLLM_SRC)")
        return
    import peers
    versions = peers.stage(args.vllm, args.nano_vllm)
    print(f"# block managers on one trace: {args.ops} timed ops per size in {args.rounds} "
          f"rounds, block size {BLOCK_SIZE}, ids < {args.vocab}, SHA-256 block hashes")
    print(f"# vLLM {versions['vllm']}; nano-vllm {versions['nano-vllm']}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {datetime.date.today()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'blocks':>9} {'pagedlab':>9} {'no events':>9} {'vllm':>9} {'nano-vllm':>9} "
          f"{'/vllm':>6} {'/nano':>6} {'ne/vllm':>7} {'ne/nano':>7}  (ops/s, medians; "
          "ne = no events)")
    rows = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        for rep in range(args.repeat):
            row = measure(size, args.ops, args.rounds, args.seed, args.vocab)
            row["repeat"] = rep
            rows.append(row)
            o, r = row["ops_per_s"], row["ratios"]
            print(f"{size:>9} {o['pagedlab']:>9.0f} {o['pagedlab-no-events']:>9.0f} "
                  f"{o['vllm']:>9.0f} {o['nano-vllm']:>9.0f} {r['pagedlab/vllm']:>6.2f} "
                  f"{r['pagedlab/nano-vllm']:>6.2f} {r['pagedlab-no-events/vllm']:>7.2f} "
                  f"{r['pagedlab-no-events/nano-vllm']:>7.2f}", flush=True)
            if rep == 0:
                print(f"{'':>9} ops {row['counts']}; hit blocks {row['hit_blocks']}; "
                      f"used at end {row['used_blocks_at_end']}", flush=True)
    if args.repeat > 1:
        print(f"# over {args.repeat} runs per size: median (lowest) of each ratio")
        for size in sizes:
            runs = [row["ratios"] for row in rows if row["num_blocks"] == size]
            print(f"{size:>9} " + "  ".join(
                f"{name} {statistics.median(r[name] for r in runs):.2f} "
                f"({min(r[name] for r in runs):.2f})" for name in runs[0]))
    if args.out:
        args.out.write_text(json.dumps({"versions": versions, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
