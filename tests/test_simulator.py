"""Workloads, the event-driven replay against a slow per-token reference (with and without
vLLM's scheduler budgets), preemption counts, Figure 2. The command line: test_traces_cli.py."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from backend.core.errors import PagedLabError
from backend.lab.contiguous import ContiguousArena
from backend.lab.sim.replay import ReplayTotals, replay
from backend.lab.sim.simulator import (
    POLICIES,
    SimConfig,
    SimRun,
    make_policy,
    simulate,
    simulate_run,
    simulate_workload,
    sweep,
    sweep_points,
)
from backend.lab.sim.timeline import COLUMNS
from backend.lab.workloads import WORKLOADS, Trace, expected_means, make_trace
from backend.paging.block_manager import BlockManager

# ---- workloads ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
def test_sample_means_land_near_the_paper_means(name: str) -> None:
    w = WORKLOADS[name]
    # The fitted length model hits the paper's means exactly...
    mp, mo = expected_means(name)
    assert mp == pytest.approx(w.prompt_mean, rel=1e-6)
    assert mo == pytest.approx(w.output_mean, rel=1e-6)
    # ...and a 50k sample lands near them (sampling error is well under 2%).
    t = make_trace(name, 50_000, 2.0, seed=1)
    assert t.prompt_len.mean() == pytest.approx(w.prompt_mean, rel=0.02)
    assert t.output_len.mean() == pytest.approx(w.output_mean, rel=0.02)
    assert t.prompt_len.min() >= 1 and t.output_len.min() >= 1
    assert t.final_len.max() <= 2048
    # Poisson arrivals: the mean gap is 1 / rate.
    assert np.diff(t.arrival_s).min() >= 0
    assert t.arrival_s[-1] / len(t) == pytest.approx(0.5, rel=0.02)


def test_traces_are_seeded_and_prefix_stable() -> None:
    a = make_trace("sharegpt", 5000, 3.0, seed=7)
    b = make_trace("sharegpt", 5000, 3.0, seed=7)
    c = make_trace("sharegpt", 5000, 3.0, seed=8)
    short = make_trace("sharegpt", 100, 3.0, seed=7)
    slow = make_trace("sharegpt", 5000, 1.5, seed=7)
    assert np.array_equal(a.prompt_len, b.prompt_len)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert not np.array_equal(a.prompt_len, c.prompt_len)
    assert np.array_equal(short.output_len, a.output_len[:100])
    assert np.array_equal(short.arrival_s, a.arrival_s[:100])
    assert np.array_equal(slow.prompt_len, a.prompt_len)
    assert np.allclose(slow.arrival_s, 2 * a.arrival_s)


def test_workload_arguments_are_checked() -> None:
    with pytest.raises(PagedLabError, match="unknown workload"):
        make_trace("lmsys", 10, 1.0)
    with pytest.raises(PagedLabError, match="requests must be"):
        make_trace("alpaca", 0, 1.0)
    with pytest.raises(PagedLabError, match="rate must be"):
        make_trace("alpaca", 10, math.inf)
    with pytest.raises(PagedLabError, match="seed must be"):
        make_trace("alpaca", 10, 1.0, seed=-1)


# ---- hand-worked replays -------------------------------------------------------


def trace_of(prompts: list[int], outputs: list[int], arrivals: list[float] | None = None
             ) -> Trace:
    n = len(prompts)
    arr = np.zeros(n) if arrivals is None else np.asarray(arrivals, dtype=np.float64)
    return Trace("hand", 1.0, 0, arr, np.asarray(prompts, dtype=np.int64),
                 np.asarray(outputs, dtype=np.int64))


def test_oracle_by_hand() -> None:
    # Capacity 10. r0: prompt 3, output 3 (final 6); r1: prompt 2, output 2 (final 4).
    # it0: both admitted, hold 4 and 3 tokens of regions 6 and 4: tokens 7, reservation 3.
    # it1: 5 and 4 tokens (r1 done): tokens 9, reservation 1.
    # it2: r0 alone at 6 tokens, 4 slots free: tokens 6.
    r = simulate(trace_of([3, 2], [3, 2]),
                 SimConfig(policy="oracle", capacity_tokens=10, iteration_s=1.0))
    assert r.iterations == 3
    assert r.mean_batch_size == 5 / 3 and r.max_batch_size == 2
    assert r.memory == {"token_states": 22 / 30, "reservation": 4 / 30,
                        "internal_fragmentation": 0.0, "external_fragmentation": 0.0,
                        "free": 4 / 30}
    assert r.preemptions == 0
    # r1 finishes at the end of it1 (t = 2 s), r0 at the end of it2 (t = 3 s).
    assert r.duration_s == 3.0
    assert r.mean_latency_s == 2.5


def test_a_request_held_back_by_a_budget_does_not_wait_for_memory() -> None:
    # r0 and r1: prompt 2, output 2 (3 tokens on admission, 4 at the end). With room for
    # both but one at a time, r1 waits out r0's 2 iterations for max_num_seqs, none for
    # memory. In 5 slots of 1 instead it waits as long, for memory: r0 holds 3, then 4.
    trace = trace_of([2, 2], [2, 2])
    budget = simulate(trace, SimConfig(policy="paged", capacity_tokens=64, block_size=1,
                                       watermark=0.0, iteration_s=1.0, max_num_seqs=1))
    tight = simulate(trace, SimConfig(policy="paged", capacity_tokens=5, block_size=1,
                                      watermark=0.0, iteration_s=1.0))
    assert budget.iterations == tight.iterations == 4
    assert budget.memory_wait_iterations == 0
    assert tight.memory_wait_iterations == 2
    # A wait for memory, then one for the budget alone: only the first kind counts. 10
    # slots of 1, max_num_seqs 2. r0 (7 + 2) runs it0-it1 while r1 (2 + 5, 3 slots on
    # admission) waits for memory; r1 and r2 (1 + 5) run from it2; r3 (1 + 1) arrives in
    # it4 and waits for the budget, with two running; in it5 r2's growth preempts it (the
    # newest), and in it6 it waits for memory again (5 slots, 3 free) until r1 ends.
    # Memory: it0, it1, it5, it6; it4 is the budget's.
    mixed = simulate(trace_of([7, 2, 1, 1], [2, 5, 5, 1], [0, 0, 0, 3.5]),
                     SimConfig(policy="paged", capacity_tokens=10, block_size=1, watermark=0.0,
                               iteration_s=1.0, max_num_seqs=2))
    assert mixed.preemptions == 1 and mixed.iterations == 9
    assert mixed.memory_wait_iterations == 4
    # Counted through a quiet span too (iterations the replay skips, nothing changing): the
    # oracle reserves r0's 7 slots of 8 in it0, and r1 (3 slots) waits until r0 ends in it4.
    oracle = simulate(trace_of([2, 2], [5, 1]),
                      SimConfig(policy="oracle", capacity_tokens=8, iteration_s=1.0))
    assert oracle.iterations == 6 and oracle.memory_wait_iterations == 5


def test_paged_preemption_by_hand() -> None:
    # 8 slots = 4 blocks of 2, no watermark. r0: prompt 2, output 4; r1: prompt 2, output 3.
    # it0: both admitted with 3 tokens (2 blocks each): pool full.
    # it1: both reach 4 tokens, still in 2 blocks each.
    # it2: r0's 5th token needs a block; none is free, so r1 (newest) is preempted
    #      holding 4 tokens; r0 takes a block. No admission in a preempting iteration.
    # it3: r0 reaches 6 tokens (3 blocks) and finishes; r1 (5 tokens = 3 blocks) waits.
    # it4: r1 is recomputed: 4 tokens as a prompt plus its last one, and finishes. The
    #      4 (2 prompt, 2 generated) are the tokens computed again.
    trace = trace_of([2, 2], [4, 3])
    cfg = SimConfig(policy="paged", capacity_tokens=8, block_size=2, watermark=0.0,
                    iteration_s=1.0)
    r = simulate(trace, cfg)
    assert r.preemptions == 1
    assert r.recomputed_tokens == 4
    assert r.iterations == 5
    # r1 waited for memory at the end of it2 (preempted) and it3 (its 3 blocks not free).
    assert r.memory_wait_iterations == 2
    assert r.mean_batch_size == 7 / 5
    # tokens 6+8+5+6+5 = 30 of 40 slot-iterations; blocks hold 8+8+6+6+6 = 34 slots.
    assert r.memory == {"token_states": 30 / 40, "reservation": 0.0,
                        "internal_fragmentation": 4 / 40, "external_fragmentation": 0.0,
                        "free": 6 / 40}
    assert r.duration_s == 5.0


def test_max_policy_waits_for_a_whole_region_by_hand() -> None:
    # Capacity 10, max_len 6: one region at a time. r1 arrives at once but waits for
    # r0's region; while it waits, the 4 free slots could not hold a region of 6 even in
    # one piece: they are free, not external fragmentation.
    r = simulate(trace_of([2, 1], [2, 2]),
                 SimConfig(policy="max", capacity_tokens=10, max_len=6, iteration_s=1.0))
    # it0: r0 holds 3 of final 4 in 6 slots; it1: 4 tokens, done. it2..3: r1 (2, then 3).
    assert r.iterations == 4
    assert r.memory["token_states"] == (3 + 4 + 2 + 3) / 40
    assert r.memory["reservation"] == (1 + 0 + 1 + 0) / 40
    assert r.memory["internal_fragmentation"] == (2 + 2 + 3 + 3) / 40
    assert r.memory["external_fragmentation"] == 0.0
    assert r.memory["free"] == (4 + 4 + 4 + 4) / 40
    assert r.max_len == 6


def test_free_slots_in_pieces_that_would_hold_the_head_together_are_external() -> None:
    # Oracle, capacity 10. r0 (2 + 1), r1 (1 + 3) and r2 (2 + 1) fill slots 0-2, 3-6 and
    # 7-9 in it0; r3 (4 + 1) needs 5 slots and waits. r0 and r2 end in it0, leaving holes
    # of 3 at 0-2 and 7-9: 6 slots free in all, enough for 5, but in no one piece, so
    # through it1 and it2 (r1 at 3, then 4 tokens) all 6 are external fragmentation. In
    # it3 r3 takes r1's place and ends.
    cfg = SimConfig(policy="oracle", capacity_tokens=10, iteration_s=1.0)
    trace = trace_of([2, 1, 2, 4], [1, 3, 1, 1])
    r = simulate(trace, cfg)
    assert r.iterations == 4
    assert r.memory["external_fragmentation"] == (0 + 6 + 6 + 0) / 40
    assert r.memory["free"] == (0 + 0 + 0 + 5) / 40
    check_against_reference(trace, cfg)


def test_an_idle_gap_is_not_averaged_in() -> None:
    # r1 arrives long after r0 finished: the engine idles in between.
    r = simulate(trace_of([1, 1], [2, 2], [0.0, 100.0]),
                 SimConfig(policy="oracle", capacity_tokens=4, iteration_s=1.0))
    assert r.iterations == 4
    assert r.memory["token_states"] == (2 + 3 + 2 + 3) / 16
    assert r.duration_s == 102.0


def test_preempted_prefill_counts_its_computed_chunks() -> None:
    # 10 slots of 1, no watermark, 3 tokens per iteration. r0: prompt 2, output 5; r1:
    # prompt 6, output 1. it0: r0 takes 3 slots and 2 tokens of the budget; r1 takes the
    # other 7 slots and prefills 1 token. it1: r0's 4th token finds no slot, so r1 (the
    # newest) is preempted with 1 prompt token computed: that token is computed again.
    # r1 returns after r0 ends in it4 and prefills its 6 tokens over it5 and it6.
    cfg = SimConfig(policy="paged", capacity_tokens=10, block_size=1, watermark=0.0,
                    iteration_s=1.0, max_num_batched_tokens=3)
    trace = trace_of([2, 6], [5, 1])
    r = simulate(trace, cfg)
    assert r.preemptions == 1
    assert r.recomputed_tokens == 1
    assert check_against_reference(trace, cfg).result.recomputed_tokens == 1


# ---- the event-driven replay against a per-token reference ------------------------


def reference(trace: Trace, cfg: SimConfig) -> tuple[ReplayTotals, list[int], dict[str, list[int]]]:
    """Step every iteration and every token through the real manager or arena.

    Independent of the replay's closed forms and event skipping: memory is read
    from `BlockManager.metrics()` and `ContiguousArena.breakdown()` every
    iteration, and the budgets are applied as vLLM states them (decodes, then
    prefills in progress, then admissions, while sequences and tokens last).
    Returns the totals, each request's finish iteration and the timeline.
    """
    dt = cfg.iteration_s
    arr = np.ceil(trace.arrival_s / dt).astype(np.int64).tolist()
    final = trace.final_len.tolist()
    prefill = trace.prompt_len.tolist()
    n = len(final)
    paged = cfg.policy == "paged"
    seq_cap = cfg.max_num_seqs or n + 1
    tok_cap = cfg.max_num_batched_tokens
    if paged:
        m = BlockManager(cfg.capacity_tokens // cfg.block_size, cfg.block_size,
                         prefix_caching=False, record_events=False)
        wm = (int(cfg.watermark * m.num_blocks) if cfg.watermark_blocks is None
              else cfg.watermark_blocks)
    else:
        arena = ContiguousArena(cfg.capacity_tokens, cfg.policy,  # type: ignore[arg-type]
                                max_len=cfg.max_len)
    tok = [0] * n            # tokens held (computed, or allocated while prefilling)
    done = [0] * n           # prompt tokens computed so far, while prefilling
    finish = [0] * n
    running: list[int] = []
    prefilling: set[int] = set()
    waiting: deque[int] = deque()
    tot = ReplayTotals()
    timeline: dict[str, list[int]] = {c: [] for c in COLUMNS}
    nxt = fin = k = 0
    while fin < n:
        if not running and not waiting:
            k = max(k, arr[nxt])
        while nxt < n and arr[nxt] <= k:
            waiting.append(nxt)
            nxt += 1
        preempted = decoded = 0
        for i in list(running):
            if i not in running or i in prefilling:
                continue
            if paged:
                while m.blocks_needed_to_append(str(i), 1) > m.num_free_blocks:
                    v = running.pop()
                    m.free(str(v), preempted=True)
                    # What had K/V is lost and computed again: the chunks done, or
                    # every token a decoding victim held.
                    if v in prefilling:
                        prefilling.discard(v)
                        tot.recomputed_tokens += done[v]
                    else:
                        prefill[v] = tok[v]
                        tot.recomputed_tokens += tok[v]
                    waiting.appendleft(v)
                    tot.preemptions += 1
                    preempted += 1
                    if v == i:
                        break
                if i not in running:
                    continue
                m.append(str(i), num_tokens=1)
            else:
                arena.grow(str(i))
            tok[i] += 1
            decoded += 1
        left = math.inf if tok_cap is None else tok_cap - decoded
        assert left >= 0
        chunks = admitted = 0
        for i in running:
            if i in prefilling:
                c = int(min(prefill[i] - done[i], left))
                left -= c
                chunks += c
                done[i] += c
                if done[i] == prefill[i]:
                    prefilling.discard(i)
        while waiting and not preempted and len(running) < seq_cap and left > 0:
            i = waiting[0]
            c = prefill[i] + 1
            if paged:
                if m.blocks_for(c) + wm > m.num_free_blocks:
                    break
                m.allocate(str(i), [0] * c)
            else:
                if not arena.fits(final[i]).fits:
                    break
                arena.reserve(str(i), final[i], tokens=c)
            waiting.popleft()
            running.append(i)
            admitted += 1
            tok[i] = c
            chunk = int(min(prefill[i], left))
            left -= chunk
            chunks += chunk
            done[i] = chunk
            if chunk < prefill[i]:
                prefilling.add(i)
        if running:
            # A request still prefilling holds its prompt's memory, computed or not.
            computed = sum(done[i] if i in prefilling else tok[i] for i in running)
            tot.busy_iterations += 1
            tot.batch_sum += len(running)
            tot.max_batch = max(tot.max_batch, len(running))
            tot.token_sum += computed
            tot.pending_prefill_sum += sum(tok[i] - done[i] for i in prefilling)
            used = cached = free = -1
            if paged:
                met = m.metrics()
                tot.allocated_sum += met.used_blocks * cfg.block_size
                assert met.filled_slots == sum(tok[i] for i in running)
                used, cached, free = met.used_blocks, met.cached_blocks, met.free_blocks
                allocated = met.used_blocks * cfg.block_size
            else:
                required = arena.reservation_size(final[waiting[0]]) if waiting else None
                b = arena.breakdown(required)
                assert b.token_states == sum(tok[i] for i in running)
                tot.committed_sum += b.token_states + b.reservation
                allocated = b.token_states + b.reservation + b.internal_fragmentation
                tot.allocated_sum += allocated
                tot.external_sum += b.external_fragmentation
            ending = [i for i in running if i not in prefilling and tok[i] == final[i]]
            row = (k, len(running), len(prefilling), len(waiting), admitted, chunks, decoded,
                   preempted, len(ending), computed, allocated, used, cached, free)
            for c, v in zip(COLUMNS, row, strict=True):
                timeline[c].append(v)
            for i in ending:
                running.remove(i)
                if paged:
                    m.free(str(i))
                else:
                    arena.release(str(i))
                finish[i] = k
                fin += 1
        k += 1
    return tot, finish, timeline


FIELDS = ("busy_iterations", "batch_sum", "max_batch", "preemptions", "recomputed_tokens",
          "token_sum", "allocated_sum", "external_sum", "pending_prefill_sum")


def check_against_reference(trace: Trace, cfg: SimConfig) -> SimRun:
    """The replay, its timeline and its totals equal the per-token reference's."""
    arrival_it = np.ceil(trace.arrival_s / cfg.iteration_s).astype(np.int64)
    got = replay(arrival_it, trace.prompt_len, trace.final_len, make_policy(cfg),
                 budgets=cfg.budgets)
    want, finish, timeline = reference(trace, cfg)
    for f in FIELDS:
        assert getattr(got, f) == getattr(want, f), f
    if cfg.policy != "paged":
        assert got.committed_sum == want.committed_sum
    assert got.finish_iteration is not None
    assert got.finish_iteration.tolist() == finish
    run = simulate_run(trace, cfg)
    assert run.timeline is not None
    for c in COLUMNS:
        assert run.timeline.columns[c].tolist() == timeline[c], c
    return run


@pytest.mark.parametrize(("policy", "block_size", "capacity", "rate"), [
    ("paged", 16, 4096, 20.0), ("paged", 1, 2048, 20.0), ("paged", 5, 3000, 3.0),
    ("paged", 64, 4096, 50.0), ("max", 16, 6000, 5.0), ("pow2", 16, 5000, 5.0),
    ("oracle", 16, 4100, 5.0), ("oracle", 16, 20000, 0.5),
])
def test_replay_equals_per_token_reference(policy: str, block_size: int, capacity: int,
                                           rate: float) -> None:
    trace = make_trace("alpaca", 150, rate, seed=3)
    # Longer requests too, so that regions and preemptions vary.
    trace = Trace(trace.workload, rate, 3, trace.arrival_s, trace.prompt_len * 4,
                  trace.output_len * 2)
    cfg = SimConfig(policy=policy, capacity_tokens=capacity,  # type: ignore[arg-type]
                    block_size=block_size, iteration_s=0.05)
    run = check_against_reference(trace, cfg)
    if policy == "paged" and rate >= 20:
        assert run.result.preemptions > 0   # the case under test really preempts


@pytest.mark.parametrize(("policy", "seqs", "tokens", "watermark"), [
    ("paged", None, 64, None), ("paged", 3, 7, 0), ("paged", 8, 300, 5),
    ("paged", None, 1, 0), ("paged", 32, None, 20), ("oracle", 3, 64, None),
    ("max", 8, 7, None), ("pow2", None, 300, None),
])
def test_budgets_replay_equals_per_token_reference(policy: str, seqs: int | None,
                                                   tokens: int | None,
                                                   watermark: int | None) -> None:
    # Prompts up to about 10x the token budget: chunked over many iterations.
    t = make_trace("alpaca", 80, 20.0, seed=5)
    trace = Trace(t.workload, t.rate, 5, t.arrival_s, t.prompt_len * 4, t.output_len * 2)
    cfg = SimConfig(policy=policy, capacity_tokens=4096, block_size=4,  # type: ignore[arg-type]
                    iteration_s=0.05, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                    watermark_blocks=watermark)
    run = check_against_reference(trace, cfg)
    r = run.result
    assert r.max_num_seqs == seqs and r.max_num_batched_tokens == tokens
    if seqs is not None:
        assert r.max_batch_size <= seqs
    if tokens is not None:
        assert r.max_batched_tokens <= tokens
        if policy == "paged" and tokens < int(trace.prompt_len.max()):
            # Chunked prompts hold their blocks before their tokens are computed.
            assert r.memory["reservation"] > 0
    if policy == "paged":
        assert r.watermark_blocks == (10 if watermark is None else watermark)


def test_unset_budgets_change_nothing() -> None:
    trace = make_trace("sharegpt", 400, 6.0, seed=2)
    plain = simulate(trace, SimConfig(policy="paged"))
    none = simulate(trace, SimConfig(policy="paged", max_num_seqs=None,
                                     max_num_batched_tokens=None, watermark_blocks=None))
    # 1% of 960 blocks is 9: the same watermark given in blocks.
    nine = simulate(trace, SimConfig(policy="paged", watermark_blocks=9))
    assert plain == none
    assert dataclasses.replace(nine, wall_s=0.0) == dataclasses.replace(plain, wall_s=0.0)
    assert plain.memory["reservation"] == 0.0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hst.data())
def test_budgets_hold_at_every_iteration(data: hst.DataObject) -> None:
    n = data.draw(hst.integers(1, 25), label="requests")
    prompts = data.draw(hst.lists(hst.integers(1, 90), min_size=n, max_size=n))
    outputs = data.draw(hst.lists(hst.integers(1, 40), min_size=n, max_size=n))
    gaps = data.draw(hst.lists(hst.sampled_from([0.0, 0.0, 0.05, 0.3, 2.0]), min_size=n,
                               max_size=n))
    block_size = data.draw(hst.sampled_from([1, 2, 4, 16]), label="block_size")
    seqs = data.draw(hst.none() | hst.integers(1, 6), label="max_num_seqs")
    tokens = data.draw(hst.none() | hst.integers(1, 120), label="max_num_batched_tokens")
    watermark = data.draw(hst.none() | hst.integers(0, 8), label="watermark_blocks")
    policy = data.draw(hst.sampled_from(["paged", "paged", "oracle"]), label="policy")
    trace = trace_of(prompts, outputs, np.cumsum(gaps).tolist())
    cfg = SimConfig(policy=policy, capacity_tokens=256, block_size=block_size,  # type: ignore[arg-type]
                    iteration_s=0.05, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                    watermark_blocks=watermark)
    try:
        run = simulate_run(trace, cfg)
    except PagedLabError:
        return   # some request cannot run even alone in this pool (checked elsewhere)
    tl = run.timeline
    assert tl is not None
    c = tl.columns
    batched = c["prefill_tokens"] + c["decode_tokens"]
    if seqs is not None:
        assert (c["running"] <= seqs).all()
    if tokens is not None:
        assert (batched <= tokens).all()
    # Every iteration makes progress: some token is processed.
    assert (batched >= 1).all()
    if policy == "paged":
        kept = run.result.watermark_blocks
        assert kept == (int(0.01 * (256 // block_size)) if watermark is None else watermark)
        # Admission is the last change before the sample: the watermark stayed free.
        admitting = c["admitted"] > 0
        assert (c["free_blocks"][admitting] >= kept).all()
    # And the whole timeline is the per-token reference's.
    _, _, want = reference(trace, cfg)
    for col in COLUMNS:
        assert c[col].tolist() == want[col], col


# ---- the paper's Figure 2 --------------------------------------------------------


def test_figure2_ordering_on_sharegpt() -> None:
    results = {p: simulate_workload("sharegpt", SimConfig(policy=p), requests=800, rate=8.0)
               for p in POLICIES}
    share = {p: r.memory["token_states"] for p, r in results.items()}
    assert share["max"] < share["pow2"] < share["oracle"] < share["paged"]
    assert share["paged"] > 0.85
    for p in ("max", "pow2", "oracle"):
        assert results["paged"].mean_batch_size > results[p].mean_batch_size
        assert results[p].preemptions == 0
    # Each policy's five shares sum to 1; paged reserves nothing and has no holes.
    for r in results.values():
        assert sum(r.memory.values()) == pytest.approx(1.0, abs=1e-12)
    assert results["paged"].memory["reservation"] == 0.0
    assert results["paged"].memory["external_fragmentation"] == 0.0
    assert results["oracle"].memory["internal_fragmentation"] == 0.0
    assert results["max"].memory["internal_fragmentation"] > 0.3


def test_same_seed_same_result() -> None:
    cfg = SimConfig(policy="paged", block_size=8)
    a = simulate_workload("sharegpt", cfg, requests=300, rate=6.0, seed=5)
    b = simulate_workload("sharegpt", cfg, requests=300, rate=6.0, seed=5)
    c = simulate_workload("sharegpt", cfg, requests=300, rate=6.0, seed=6)
    assert a == b   # wall_s is left out of the comparison
    assert a != c


def test_progress_is_reported_up_to_the_end() -> None:
    calls: list[tuple[int, int]] = []
    simulate_workload("alpaca", SimConfig(policy="paged"), requests=250, rate=50.0,
                      progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (250, 250)
    assert len(calls) >= 50
    assert [d for d, _ in calls] == sorted({d for d, _ in calls})


def test_sweep_is_the_same_on_any_number_of_workers() -> None:
    points = sweep_points("alpaca", ("paged", "oracle"), (8, 32), (20.0,), requests=200,
                          base=SimConfig(capacity_tokens=4096))
    assert [(p.config.policy, p.config.block_size) for p in points] == [
        ("paged", 8), ("paged", 32), ("oracle", 8)]
    one = sweep(points, workers=1)
    two = sweep(points, workers=2)
    assert one == two
    assert [r.block_size for r in one] == [8, 32, None]


def test_a_request_that_can_never_run_is_refused() -> None:
    trace = trace_of([100], [50])
    with pytest.raises(PagedLabError, match="use a capacity of at least 160 tokens"):
        simulate(trace, SimConfig(policy="paged", capacity_tokens=128, block_size=16,
                                  watermark=0.0))
    with pytest.raises(PagedLabError, match="can never fit in an arena of 128 slots"):
        simulate(trace, SimConfig(policy="oracle", capacity_tokens=128))
    # With the default watermark, 1% of the pool, the capacity suggested is one whose own
    # watermark still leaves the request room: it runs, and a block less would not.
    long = trace_of([100_000], [10])
    with pytest.raises(PagedLabError) as refused:
        simulate(long, SimConfig(policy="paged", capacity_tokens=15_360, block_size=16))
    least = int(str(refused.value).rsplit("at least ", 1)[1].split(" tokens")[0].replace(",", ""))
    assert simulate(long, SimConfig(policy="paged", capacity_tokens=least,
                                    block_size=16)).requests == 1
    with pytest.raises(PagedLabError, match="use a capacity of at least"):
        simulate(long, SimConfig(policy="paged", capacity_tokens=least - 16, block_size=16))
    # Near the largest capacity, a 1% watermark leaves no capacity that would do: said.
    huge = trace_of([16_776_000], [10])
    with pytest.raises(PagedLabError, match=r"no capacity up to 16,777,216 tokens admits it "
                                            "with this watermark; use a watermark of 0 "
                                            "blocks and a capacity of at least 16,776,016 "
                                            "tokens$"):
        simulate(huge, SimConfig(policy="paged", capacity_tokens=15_360, block_size=16))
    # Longer than the largest capacity: no advice to change a setting, since none would do.
    longest = trace_of([16_777_216], [1])
    with pytest.raises(PagedLabError, match=r"that is more than the largest capacity, "
                                            "16,777,216 tokens, so no setting admits it; "
                                            "leave it out of the trace$"):
        simulate(longest, SimConfig(policy="paged", capacity_tokens=15_360, block_size=16,
                                    watermark=0.0))
    # As long as the largest capacity, but past it in whole blocks of 3: a block size that
    # divides it would admit it, and the advice says so rather than that nothing does.
    with pytest.raises(PagedLabError, match=r"in blocks of 3 that is more than the largest "
                                            "capacity, 16,777,216 tokens; use a block size "
                                            "that divides 16,777,216"):
        simulate(trace_of([16_777_215], [1]),
                 SimConfig(policy="paged", capacity_tokens=15_360, block_size=3,
                           watermark=0.0))
    with pytest.raises(PagedLabError, match=r"of 150 tokens can never fit in an arena of 1 slot$"):
        simulate(trace, SimConfig(policy="oracle", capacity_tokens=1))
    with pytest.raises(PagedLabError, match="block_size must be"):
        simulate(trace, SimConfig(block_size=0))
    # max_len above the capacity: every region is the whole arena, one at a time.
    r = simulate(trace_of([100, 100], [50, 50]),
                 SimConfig(policy="max", capacity_tokens=200, iteration_s=1.0))
    assert r.max_batch_size == 1 and r.max_len == 200


# ---- preemptions -------------------------------------------------------------------


def test_the_preemption_count_of_issue_12_and_what_a_watermark_does() -> None:
    # The page's default run: 1,000 ShareGPT requests at 4/s in 15,360 slots.
    trace = make_trace("sharegpt", 1000, 4.0, seed=0)
    run = simulate_run(trace, SimConfig(policy="paged"))
    r = run.result
    assert (r.preemptions, r.watermark_blocks) == (937, 9)
    per = run.preemptions_per_request
    assert int(per.sum()) == r.preemptions == len(run.victim_ages)
    assert (r.preempted_requests, r.max_preemptions_per_request) == (518, 6)
    assert int((per == 0).sum()) == 482
    # Victims are the newest requests: half had been admitted at most 13 iterations before.
    assert int(np.median(run.victim_ages)) == 13
    # Every preemption happens while a queue waits (the trace overloads the memory).
    tl = run.timeline
    assert tl is not None
    assert (tl.columns["waiting"][tl.columns["preemptions"] > 0] > 0).all()
    # A watermark of 10% of the pool instead of 1%: 53 preemptions for 5% less batch.
    wide = simulate(trace, SimConfig(policy="paged", watermark_blocks=96))
    assert wide.preemptions == 53
    assert 0.9 * r.mean_batch_size < wide.mean_batch_size < r.mean_batch_size
    # At a rate the memory sustains, few.
    assert simulate(make_trace("sharegpt", 1000, 1.5, seed=0),
                    SimConfig(policy="paged")).preemptions == 18
