"""Workloads, the event-driven replay (against a slow per-token reference), the CLI."""

from __future__ import annotations

import argparse
import json
import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from backend.core.errors import PagedLabError
from backend.io.simulate_cli import add_simulate_arguments, run_simulate
from backend.lab.contiguous import ContiguousArena
from backend.lab.sim.replay import ReplayTotals, replay
from backend.lab.sim.simulator import (
    POLICIES,
    SimConfig,
    make_policy,
    simulate,
    simulate_workload,
    sweep,
    sweep_points,
)
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


def test_paged_preemption_by_hand() -> None:
    # 8 slots = 4 blocks of 2, no watermark. r0: prompt 2, output 4; r1: prompt 2, output 3.
    # it0: both admitted with 3 tokens (2 blocks each): pool full.
    # it1: both reach 4 tokens, still in 2 blocks each.
    # it2: r0's 5th token needs a block; none is free, so r1 (newest) is preempted
    #      holding 4 tokens; r0 takes a block. No admission in a preempting iteration.
    # it3: r0 reaches 6 tokens (3 blocks) and finishes; r1 (5 tokens = 3 blocks) waits.
    # it4: r1 is recomputed: 4 tokens as a prompt plus its last one, and finishes.
    trace = trace_of([2, 2], [4, 3])
    cfg = SimConfig(policy="paged", capacity_tokens=8, block_size=2, watermark=0.0,
                    iteration_s=1.0)
    r = simulate(trace, cfg)
    assert r.preemptions == 1
    assert r.recomputed_tokens == 2
    assert r.iterations == 5
    assert r.mean_batch_size == 7 / 5
    # tokens 6+8+5+6+5 = 30 of 40 slot-iterations; blocks hold 8+8+6+6+6 = 34 slots.
    assert r.memory == {"token_states": 30 / 40, "reservation": 0.0,
                        "internal_fragmentation": 4 / 40, "external_fragmentation": 0.0,
                        "free": 6 / 40}
    assert r.duration_s == 5.0


def test_max_policy_waits_for_a_whole_region_by_hand() -> None:
    # Capacity 10, max_len 6: one region at a time. r1 arrives at once but waits for
    # r0's region; while it waits, the 4 free slots are external fragmentation.
    r = simulate(trace_of([2, 1], [2, 2]),
                 SimConfig(policy="max", capacity_tokens=10, max_len=6, iteration_s=1.0))
    # it0: r0 holds 3 of final 4 in 6 slots; it1: 4 tokens, done. it2..3: r1 (2, then 3).
    assert r.iterations == 4
    assert r.memory["token_states"] == (3 + 4 + 2 + 3) / 40
    assert r.memory["reservation"] == (1 + 0 + 1 + 0) / 40
    assert r.memory["internal_fragmentation"] == (2 + 2 + 3 + 3) / 40
    assert r.memory["external_fragmentation"] == (4 + 4) / 40
    assert r.memory["free"] == (4 + 4) / 40
    assert r.max_len == 6


def test_an_idle_gap_is_not_averaged_in() -> None:
    # r1 arrives long after r0 finished: the engine idles in between.
    r = simulate(trace_of([1, 1], [2, 2], [0.0, 100.0]),
                 SimConfig(policy="oracle", capacity_tokens=4, iteration_s=1.0))
    assert r.iterations == 4
    assert r.memory["token_states"] == (2 + 3 + 2 + 3) / 16
    assert r.duration_s == 102.0


# ---- the event-driven replay against a per-token reference ------------------------


def reference(trace: Trace, cfg: SimConfig) -> tuple[ReplayTotals, list[int]]:
    """Step every iteration and every token through the real manager or arena.

    Independent of the replay's closed forms: memory is read from
    `BlockManager.metrics()` and `ContiguousArena.breakdown()` every iteration.
    """
    dt = cfg.iteration_s
    arr = np.ceil(trace.arrival_s / dt).astype(np.int64).tolist()
    final = trace.final_len.tolist()
    prefill = trace.prompt_len.tolist()
    prompt = list(prefill)
    n = len(final)
    paged = cfg.policy == "paged"
    if paged:
        m = BlockManager(cfg.capacity_tokens // cfg.block_size, cfg.block_size,
                         prefix_caching=False, record_events=False)
        wm = int(cfg.watermark * m.num_blocks)
    else:
        arena = ContiguousArena(cfg.capacity_tokens, cfg.policy,  # type: ignore[arg-type]
                                max_len=cfg.max_len)
    tok = [0] * n
    finish = [0] * n
    running: list[int] = []
    waiting: deque[int] = deque()
    tot = ReplayTotals()
    nxt = done = k = 0
    while done < n:
        if not running and not waiting:
            k = max(k, arr[nxt])
        while nxt < n and arr[nxt] <= k:
            waiting.append(nxt)
            nxt += 1
        for i in list(running):
            if i not in running:
                continue
            if paged:
                while m.blocks_needed_to_append(str(i), 1) > m.num_free_blocks:
                    v = running.pop()
                    m.free(str(v), preempted=True)
                    prefill[v] = tok[v]
                    waiting.appendleft(v)
                    tot.preemptions += 1
                    if v == i:
                        break
                if i not in running:
                    continue
                m.append(str(i), num_tokens=1)
            else:
                arena.grow(str(i))
            tok[i] += 1
        while waiting:
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
            tok[i] = c
            tot.recomputed_tokens += prefill[i] - prompt[i]
        if running:
            tot.busy_iterations += 1
            tot.batch_sum += len(running)
            tot.max_batch = max(tot.max_batch, len(running))
            if paged:
                met = m.metrics()
                tot.token_sum += met.filled_slots
                tot.allocated_sum += met.used_blocks * cfg.block_size
                assert met.filled_slots == sum(tok[i] for i in running)
            else:
                required = arena.reservation_size(final[waiting[0]]) if waiting else None
                b = arena.breakdown(required)
                tot.token_sum += b.token_states
                tot.committed_sum += b.token_states + b.reservation
                tot.allocated_sum += b.token_states + b.reservation + b.internal_fragmentation
                tot.external_sum += b.external_fragmentation
        for i in [i for i in running if tok[i] == final[i]]:
            running.remove(i)
            if paged:
                m.free(str(i))
            else:
                arena.release(str(i))
            finish[i] = k
            done += 1
        k += 1
    return tot, finish


FIELDS = ("busy_iterations", "batch_sum", "max_batch", "preemptions", "recomputed_tokens",
          "token_sum", "allocated_sum", "external_sum")


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
    arrival_it = np.ceil(trace.arrival_s / cfg.iteration_s).astype(np.int64)
    got = replay(arrival_it, trace.prompt_len, trace.final_len, make_policy(cfg))
    want, finish = reference(trace, cfg)
    for f in FIELDS:
        assert getattr(got, f) == getattr(want, f), f
    if policy != "paged":
        assert got.committed_sum == want.committed_sum
    assert got.finish_iteration is not None
    assert got.finish_iteration.tolist() == finish
    if policy == "paged" and rate >= 20:
        assert got.preemptions > 0   # the case under test really preempts


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
    with pytest.raises(PagedLabError, match="block_size must be"):
        simulate(trace, SimConfig(block_size=0))
    # max_len above the capacity: every region is the whole arena, one at a time.
    r = simulate(trace_of([100, 100], [50, 50]),
                 SimConfig(policy="max", capacity_tokens=200, iteration_s=1.0))
    assert r.max_batch_size == 1 and r.max_len == 200


# ---- the command line --------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m backend simulate")
    add_simulate_arguments(parser)
    return run_simulate(parser.parse_args(argv))


def test_cli_writes_result_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "RESULT.json"
    rc = run_cli(["--workload", "alpaca", "--policy", "paged", "--requests", "200",
                  "--rate", "10", "--capacity-tokens", "4096", "--block-size", "8",
                  "--seed", "3", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    for key in ("policy", "workload", "requests", "mean_batch_size", "max_batch_size",
                "preemptions", "memory"):
        assert key in data
    assert (data["policy"], data["workload"], data["requests"]) == ("paged", "alpaca", 200)
    assert (data["block_size"], data["capacity_tokens"], data["seed"]) == (8, 4096, 3)
    assert set(data["memory"]) == {"token_states", "reservation", "internal_fragmentation",
                                   "external_fragmentation", "free"}
    assert sum(data["memory"].values()) == pytest.approx(1.0)
    assert "batch: mean" in capsys.readouterr().out
    # Without --out the JSON goes to stdout.
    assert run_cli(["--workload", "alpaca", "--policy", "oracle", "--requests", "50"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "oracle"


@pytest.mark.parametrize(("argv", "message"), [
    ([], "error: --workload is required: one of sharegpt, alpaca"),
    (["--workload", "alpaca"], "error: --policy is required"),
    (["--workload", "lmsys", "--policy", "paged"], "error: --workload must be one of"),
    (["--workload", "alpaca", "--policy", "lru"], "error: --policy must be one of"),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "0"],
     "error: --requests must be in 1.."),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "ten"],
     "error: --requests must be an integer, got 'ten'"),
    (["--workload", "alpaca", "--policy", "paged", "--rate", "0"], "error: --rate must be"),
    (["--workload", "alpaca", "--policy", "paged", "--rate", "inf"], "error: --rate must be"),
    (["--workload", "alpaca", "--policy", "paged", "--block-size", "257"],
     "error: --block-size must be in 1..256"),
    (["--workload", "alpaca", "--policy", "paged", "--seed", "-1"], "error: --seed must be"),
    (["--workload", "alpaca", "--policy", "paged", "--capacity-tokens", "64"],
     "error: the longest request needs"),
    (["--workload", "alpaca", "--policy", "paged", "--out", "/no/such/dir/R.json"],
     "error: cannot write /no/such/dir/R.json"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1
    assert "Traceback" not in err
