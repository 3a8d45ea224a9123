"""Recorded traces: the shipped Azure files, the CSV parser, prefixes and time scales, the
deployment preset and its Figure 13 ordering, and the page's run cache and progress."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from backend.core.errors import PagedLabError
from backend.lab import deployment as dep
from backend.lab.sim.runs import RunCache, RunProgress, run_policies
from backend.lab.sim.simulator import SimConfig, simulate, simulate_workload
from backend.lab.traces import (
    RECORDED,
    TRACE_DIR,
    parse_trace_csv,
    recorded_trace,
    replay_trace,
    workload_trace,
)
from backend.lab.workloads import make_trace
from backend.views.compare.deployment import figure13_holds

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"

# ---- the shipped files ---------------------------------------------------------------


def test_the_azure_files_ship_unchanged_with_their_license_and_credit() -> None:
    want = {"azure-code": ("54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
                           8819),
            "azure-conv": ("2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
                           19366)}
    for name, (digest, rows) in want.items():
        assert hashlib.sha256((TRACE_DIR / RECORDED[name]).read_bytes()).hexdigest() == digest
        assert len(recorded_trace(name)) == rows
    assert "Attribution 4.0 International" in (TRACE_DIR / "LICENSE-CC-BY-4.0.txt").read_text()
    readme = (TRACE_DIR / "README.md").read_text()
    for credit in ("Azure/AzurePublicDataset", "Creative Commons Attribution 4.0",
                   "Splitwise: Efficient generative LLM inference using phase splitting",
                   "Pratyush Patel", "ISCA 2024"):
        assert credit in readme


def test_the_azure_traces_read_as_recorded() -> None:
    code, conv = recorded_trace("azure-code"), recorded_trace("azure-conv")
    # The README's figures (from the files): prompt and output means, the span.
    assert code.prompt_len.mean() == pytest.approx(2047.8, abs=0.05)
    assert code.output_len.mean() == pytest.approx(27.9, abs=0.05)
    assert conv.prompt_len.mean() == pytest.approx(1154.7, abs=0.05)
    assert conv.output_len.max() == 1000
    # First rows: 2023-11-16 18:17:03.9799600,4808,10 then 18:17:04.0319600,3180,8.
    assert code.arrival_s[0] == 0.0 and code.arrival_s[1] == pytest.approx(0.052, abs=1e-9)
    assert (code.prompt_len[0], code.output_len[0]) == (4808, 10)
    assert conv.arrival_s[-1] == pytest.approx(3501.721937, abs=1e-6)
    assert (np.diff(conv.arrival_s) >= 0).all()
    # Cached and shared: nobody may change them.
    with pytest.raises(ValueError):
        code.prompt_len[0] = 1


# ---- the parser ------------------------------------------------------------------------


def test_a_csv_of_ones_own_in_any_column_order() -> None:
    t = parse_trace_csv(("\ufeffGeneratedTokens, TIMESTAMP ,ContextTokens\n"
                         "5,2024-01-01T00:00:00Z,10\n\n"
                         "7,2024-01-01 01:00:00.000000001+01:00,20\n").encode(), "mine.csv")
    # +01:00 is an hour ahead of UTC: the same instant plus a nanosecond.
    assert t.arrival_s.tolist() == [0.0, 1e-9]
    assert (t.prompt_len.tolist(), t.output_len.tolist()) == ([10, 20], [5, 7])
    s = parse_trace_csv((HEADER + "3.5,1,1\n3.5,2,2\n10,3,3\n").encode(), "s.csv")
    assert s.arrival_s.tolist() == [0.0, 0.0, 6.5]
    assert s.workload == "s.csv" and s.rate == pytest.approx(2 / 6.5)


@pytest.mark.parametrize(("body", "message"), [
    (b"", "the file is empty"),
    (HEADER.encode(), "the trace holds no request"),
    (b"TIMESTAMP,ContextTokens\n0,1\n", "the header must name the columns TIMESTAMP, "
                                       "ContextTokens, GeneratedTokens (missing "
                                       "GeneratedTokens)"),
    # What differs is said, not the header cut short (which hid the extra column).
    (b"TIMESTAMP,ContextTokens,GeneratedTokens,Extra,Extra\n0,1,1,1,1\n",
     "(not a column of the trace: 'Extra')"),
    (b"TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n0,1,1,1\n",
     "(named twice: ContextTokens)"),
    # A JSON file is said to be one, not refused for a header whose column is '{'.
    (b' {"schema_version": 1, "requests": []}', "this is a PagedLab snapshot, not a CSV "
                                                "trace; a trace's first line is the header "
                                                "TIMESTAMP,ContextTokens,GeneratedTokens"),
    (b'\xef\xbb\xbf{"steps": []}\n', "this is a PagedLab scenario, not a CSV trace"),
    (b"[[0, 10, 5]]", "this is a JSON file, not a CSV trace"),
    (b"{0,10,5\n", "the header must name the columns"),
    (b"[" * 100_000, "the header must name the columns"),
    ((HEADER + "0,10,5,9\n").encode(), "row 1 (line 2): expected 3 fields"),
    ((HEADER + "0,10,5\n1,10\n").encode(), "row 2 (line 3): expected 3 fields"),
    ((HEADER + "0,10,5\nyesterday,10,5\n").encode(),
     "row 2 (line 3): TIMESTAMP must be a date and time"),
    ((HEADER + "2023-02-30 00:00:00,10,5\n").encode(), "row 1 (line 2): TIMESTAMP must be"),
    ((HEADER + "2023-11-16 18:17:03+99:99,10,5\n").encode(), "row 1 (line 2): TIMESTAMP must"),
    ((HEADER + "\u0662023-11-16 18:17:03,10,5\n").encode(), "row 1 (line 2): TIMESTAMP must"),
    ((HEADER + "0,10,5\n2023-01-01 00:00:00,10,5\n").encode(),
     "row 2 (line 3): TIMESTAMP '2023-01-01 00:00:00' is not a number of seconds like row 1's"),
    ((HEADER + "0,10,5\n\n\n-1,10,5\n").encode(),
     "row 2 (line 5): TIMESTAMP '-1': a number of seconds is written in plain digits"),
    ((HEADER + "0,10,5\n1e15,10,5\n").encode(),
     "row 2 (line 3): TIMESTAMP '1e15': a number of seconds is written in plain digits, "
     "such as 1.5 (no sign, exponent or separators)"),
    ((HEADER + "0,10,5\n1000000000000000,10,5\n").encode(),
     "row 2 (line 3): TIMESTAMP '1000000000000000' is past the largest number of seconds, "
     "1,000,000,000,000 (about 31,700 years)"),
    ((HEADER + "2,10,5\n1,10,5\n").encode(), "is earlier than the row before it"),
    ((HEADER + "0,0,5\n").encode(), "row 1 (line 2): ContextTokens must be an integer"),
    ((HEADER + "0,1.5,5\n").encode(), "ContextTokens must be an integer in 1..16,777,216, "
                                      "got '1.5'"),
    ((HEADER + "0,10,99999999999\n").encode(), "row 1 (line 2): GeneratedTokens must be"),
    ((HEADER + "0,10,5\n").encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0); it "
                                              "may be a binary file, or text in another "
                                              "encoding"),
    ((HEADER + "\xff\xfe,1,2\n").encode("latin-1"), "(byte 0xff at offset 40)"),
    # A spreadsheet's "CSV UTF-8" starts with a byte-order mark: offsets count it.
    (b"\xef\xbb\xbf" + (HEADER + "\xff\xfe,1,2\n").encode("latin-1"),
     "(byte 0xff at offset 43)"),
    ((HEADER + '0,"10\n').encode(), "not valid CSV"),
    # The csv module's own words ("field larger than field limit (131072)") named its limit,
    # not what is wrong with the file.
    ((HEADER + "0," + "1" * 200_000 + ",5\n").encode(),
     "line 2: not valid CSV (a field is longer than 131,072 characters, where a trace's "
     "fields are a few dozen; it may not be a trace)"),
])
def test_a_bad_trace_is_refused_naming_its_row(body: bytes, message: str) -> None:
    with pytest.raises(PagedLabError, match=r"^bad\.csv: ") as e:
        parse_trace_csv(body, "bad.csv")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


# ---- prefixes and time scales -------------------------------------------------------------


def test_prefix_time_scale_and_rate() -> None:
    conv = recorded_trace("azure-conv")
    fast = replay_trace(conv, requests=500, time_scale=10)
    assert len(fast) == 500 and fast.time_scale == 10
    assert np.allclose(np.diff(fast.arrival_s), np.diff(conv.arrival_s[:500]) / 10)
    assert np.array_equal(fast.prompt_len, conv.prompt_len[:500])
    at = replay_trace(conv, requests=500, rate=30.0)
    assert at.rate == pytest.approx(30.0)
    assert (len(at.arrival_s) - 1) / at.arrival_s[-1] == pytest.approx(30.0)
    whole = replay_trace(conv)
    assert len(whole) == len(conv) and whole.time_scale == 1.0
    with pytest.raises(PagedLabError, match="not both"):
        replay_trace(conv, rate=2.0, time_scale=2.0)
    with pytest.raises(PagedLabError, match=r"requests for azure-conv must be an integer in "
                                            r"1\.\.19,366, got 20,000$"):
        replay_trace(conv, requests=20_000)
    with pytest.raises(PagedLabError, match="time scale must be"):
        replay_trace(conv, time_scale=0.0)
    one = parse_trace_csv((HEADER + "0,5,5\n").encode(), "one.csv")
    with pytest.raises(PagedLabError, match="at least two requests at different times"):
        replay_trace(one, rate=3.0)


def test_synthetic_workloads_are_unchanged() -> None:
    a, b = workload_trace("sharegpt", requests=300, rate=4.0, seed=0), make_trace(
        "sharegpt", 300, 4.0, 0)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.output_len,
                                                                       b.output_len)
    # Dividing Poisson gaps by F is Poisson at F times the rate.
    f = workload_trace("alpaca", requests=100, time_scale=4.0)
    assert f.rate == 16.0 and np.allclose(f.arrival_s, make_trace("alpaca", 100, 4.0).arrival_s / 4)
    with pytest.raises(PagedLabError, match="not both"):
        workload_trace("alpaca", rate=2.0, time_scale=4.0)
    # The default page run, as before issue 12 (the numbers CI has always checked).
    r = simulate_workload("sharegpt", SimConfig(policy="paged"), requests=1000, rate=4.0)
    assert (r.preemptions, round(r.mean_batch_size, 2)) == (937, 28.75)


# ---- the real-deployment preset, and the paper's Figure 13 ---------------------------------


def test_the_preset_is_llama_3_8b_on_an_h200() -> None:
    cap = dep.deployment_capacity()
    assert cap.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert cap.kv_tokens == 909_659
    d = dep.deployment("azure-conv")
    assert d.num_blocks == 56_853 and d.time_scale == 50.0
    # One request of 14,089 tokens exceeds the 8,192-token context.
    assert d.left_out == 1 and len(d.trace) == 19_365
    assert d.trace.final_len.max() <= dep.CONTEXT_LEN
    paged = d.config("paged")
    assert (paged.block_size, paged.capacity_tokens, paged.max_len) == (16, 909_659, 8192)
    with pytest.raises(PagedLabError, match="the deployment preset replays"):
        dep.deployment("sharegpt")


@pytest.mark.parametrize(("workload", "requests"), [("azure-code", None),
                                                    ("azure-conv", 3000)])
def test_figure_13_direction_on_both_azure_traces(workload: str, requests: int | None) -> None:
    # The whole code trace; the first 3,000 conversation requests (the whole one, in
    # bench/simulator.py --deployment, takes several seconds per policy).
    d = dep.deployment(workload, requests=requests)
    results = [simulate(d.trace, cfg) for cfg in d.configs(("max", "pow2", "oracle",
                                                            "paged"))]
    batch = [r.mean_batch_size for r in results]
    assert batch[0] < batch[1] < batch[2] < batch[3], batch
    assert figure13_holds(results)
    # Memory is the limit: at the recorded times every policy batches the same.
    slow = dep.deployment(workload, requests=1000, time_scale=1.0)
    same = {round(simulate(slow.trace, cfg).mean_batch_size, 6)
            for cfg in slow.configs(("pow2", "oracle", "paged"))}
    assert len(same) == 1


# ---- the page's runs: one progress, one cache -----------------------------------------------


def test_progress_text_says_what_the_bar_shows() -> None:
    reports: list[RunProgress] = []
    trace = make_trace("alpaca", 400, 40.0)
    configs = [SimConfig(p, capacity_tokens=4096) for p in ("max", "paged")]  # type: ignore[arg-type]
    runs = run_policies(trace, configs, progress=reports.append, timeline=False)
    assert [r.result.policy for r in runs] == ["max", "paged"]
    fractions = [p.fraction for p in reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    for p in reports:
        # The text leads with the bar's own fraction and count.
        overall = p.index * p.total + p.done
        assert p.text.startswith(f"{p.fraction:.0%}: {overall:,} of {2 * p.total:,} requests")
        assert overall / (2 * p.total) == pytest.approx(p.fraction)
    half = next(p for p in reports if p.policy == "paged")
    assert half.fraction >= 0.5 and f"paged, policy 2 of 2: {half.done:,} of 400" in half.text


def test_run_cache_is_bounded_and_supplies_runs() -> None:
    trace = make_trace("alpaca", 100, 40.0)
    cfg = SimConfig("oracle", capacity_tokens=4096)
    [run] = run_policies(trace, [cfg])
    cache = RunCache(max_entries=2, max_bytes=1 << 30)
    for key in "abc":
        cache.put(key, run)
    assert len(cache) == 2 and cache.get("a") is None and cache.get("c") is run
    reports: list[RunProgress] = []
    again = run_policies(trace, [cfg], progress=reports.append, cached=lambda _: run)
    assert again == [run] and reports[-1].fraction == 1.0
    tiny = RunCache(max_entries=8, max_bytes=16)
    tiny.put("x", run)   # larger than the whole cache: not kept
    assert len(tiny) == 0 and tiny.nbytes == 0


def test_a_rate_for_one_request_says_it_takes_one() -> None:
    with pytest.raises(PagedLabError, match=r"^a rate needs at least two requests at different "
                                            r"times; it takes one \(azure-conv\)$"):
        replay_trace(recorded_trace("azure-conv"), requests=1, rate=5.0)
