"""`python -m backend simulate`: synthetic, recorded and CSV traces, budgets, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend.io import simulate_cli
from backend.io.cli import main
from backend.lab.traces import recorded_trace, replay_trace

# ---- the command line --------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    """`python -m backend simulate ARGV` in this process: its exit status."""
    try:
        return main(["simulate", *argv])
    except SystemExit as exit_:  # argparse's own refusals (a missing option)
        return int(exit_.code or 0)


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
    # Both missing options are named at once, with a usage line that shows them required.
    ([], "error: the following arguments are required: --workload, --policy; usage: python -m "
         "backend simulate [-h] --workload {sharegpt,alpaca,azure-code,azure-conv,TRACE.csv} "
         "--policy {paged,max,pow2,oracle} [--requests N]"),
    (["--workload", "alpaca"], "error: the following arguments are required: --policy; usage:"),
    (["--workload", "lmsys", "--policy", "paged"], "error: --workload must be one of"),
    (["--workload", "alpaca", "--policy", "lru"], "error: --policy must be one of"),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "0"],
     "error: --requests must be an integer in 1.."),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "ten"],
     "error: --requests must be an integer in 1..10,000,000, got 'ten'"),
    # A whole number written as a float gets the way to write it, only when in range.
    (["--workload", "alpaca", "--policy", "paged", "--requests", "1e3"],
     "error: --requests must be an integer in 1..10,000,000, got '1e3' (write it as 1000, "
     "without a decimal point or exponent)"),
    (["--workload", "alpaca", "--policy", "paged", "--seed", "7.0"],
     "error: --seed must be an integer in 0..9,223,372,036,854,775,807, got '7.0' (write it as 7,"),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "2e7"],
     "error: --requests must be an integer in 1..10,000,000, got '2e7'\n"),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "1.5"],
     "error: --requests must be an integer in 1..10,000,000, got '1.5'\n"),
    # Read exactly: not whole although a float would say so; whole past a float's 2^53.
    (["--workload", "alpaca", "--policy", "paged", "--seed", "1000.00000000000001"],
     "error: --seed must be an integer in 0..9,223,372,036,854,775,807, got "
     "'1000.00000000000001'\n"),
    (["--workload", "alpaca", "--policy", "paged", "--seed", "1e18"],
     "error: --seed must be an integer in 0..9,223,372,036,854,775,807, got '1e18' (write it "
     "as 1000000000000000000,"),
    # int() and float() take digit separators and other scripts' digits; a flag does not.
    (["--workload", "alpaca", "--policy", "paged", "--requests", "1_000"],
     "error: --requests must be an integer in 1..10,000,000, got '1_000'\n"),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "\u0661\u0660"],
     "error: --requests must be an integer in 1..10,000,000, got '\u0661\u0660'\n"),
    (["--workload", "alpaca", "--policy", "paged", "--requests", "1_000.0"],
     "error: --requests must be an integer in 1..10,000,000, got '1_000.0'\n"),
    (["--workload", "alpaca", "--policy", "paged", "--rate", "1_0"],
     "error: --rate must be a number of requests per second, got '1_0'\n"),
    (["--workload", "alpaca", "--policy", "paged", "--rate", "0"], "error: --rate must be"),
    (["--workload", "alpaca", "--policy", "paged", "--rate", "inf"], "error: --rate must be"),
    (["--workload", "alpaca", "--policy", "paged", "--block-size", "257"],
     "error: --block-size must be an integer in 1..256"),
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


def test_cli_replays_an_azure_trace_prefix(tmp_path: Path) -> None:
    out = tmp_path / "R.json"
    rc = run_cli(["--workload", "azure-code", "--policy", "paged", "--requests", "300",
                  "--time-scale", "20", "--capacity-tokens", "200000", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert (data["workload"], data["requests"], data["time_scale"]) == ("azure-code", 300, 20.0)
    # The recorded lengths, exactly.
    full = recorded_trace("azure-code")
    assert data["prompt_tokens"] == int(full.prompt_len[:300].sum())
    assert data["output_tokens"] == int(full.output_len[:300].sum())
    # --rate R instead: the same prefix rescaled to a mean rate of R.
    rc = run_cli(["--workload", "azure-code", "--policy", "oracle", "--requests", "300",
                  "--rate", "50", "--capacity-tokens", "200000", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["rate"] == pytest.approx(50.0)
    # The prefix's own mean rate, not the whole trace's, is what is rescaled.
    prefix = replay_trace(full, requests=300)
    assert data["time_scale"] == pytest.approx(50.0 / prefix.rate)


def test_cli_max_policy_reserves_what_a_recorded_trace_needs(tmp_path: Path) -> None:
    out = tmp_path / "R.json"

    def reserved(workload: str, *flags: str) -> dict[str, Any]:
        """RESULT.json of the max policy on `workload` with `flags`."""
        assert run_cli(["--workload", workload, "--policy", "max", *flags,
                        "--out", str(out)]) == 0
        data: dict[str, Any] = json.loads(out.read_text())
        return data

    # Azure's requests run past the 2,048-token default: without --max-len the max policy
    # reserves the next power of two that holds the whole trace's longest (7,841 tokens in
    # azure-code: 8,192), as the page's field does, so every policy replays every workload.
    assert int(recorded_trace("azure-code").final_len.max()) == 7841
    data = reserved("azure-code", "--requests", "300", "--capacity-tokens", "40000")
    assert data["max_len"] == 8192 and data["mean_batch_size"] <= 40000 // 8192
    # Also for a prefix whose own longest is shorter: azure-conv's first 5 reach 934
    # tokens, the whole trace 14,089 (16,384).
    assert int(replay_trace(recorded_trace("azure-conv"), requests=5).final_len.max()) == 934
    assert reserved("azure-conv", "--requests", "5",
                    "--capacity-tokens", "70000")["max_len"] == 16384
    # At most the capacity: azure-conv's 16,384 in the default 15,360 slots.
    assert reserved("azure-conv", "--requests", "5")["max_len"] == 15360
    # Given, --max-len is the reservation, here and for a synthetic trace.
    assert reserved("azure-code", "--requests", "300", "--capacity-tokens", "40000",
                    "--max_len", "10000")["max_len"] == 10000
    assert reserved("sharegpt", "--requests", "50", "--max-len", "4096")["max_len"] == 4096
    assert reserved("sharegpt", "--requests", "50")["max_len"] == 2048


def test_cli_takes_the_scheduler_budgets_by_either_spelling(tmp_path: Path) -> None:
    out = tmp_path / "R.json"
    rc = run_cli(["--workload", "azure-conv", "--policy", "paged", "--requests", "400",
                  "--time-scale", "10", "--capacity-tokens", "60000",
                  "--max-num-seqs", "32", "--max_num_batched_tokens", "2048",
                  "--watermark-blocks", "40", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert (data["max_num_seqs"], data["max_num_batched_tokens"], data["watermark_blocks"]) == (
        32, 2048, 40)
    assert data["max_batch_size"] <= 32
    assert data["max_batched_tokens"] <= 2048


def test_cli_replays_a_csv_of_ones_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2024-01-01 00:00:00.5,100,20\n2024-01-01 00:00:01,50,10\n"
                     "2024-01-01 00:00:01,30,5\n")
    assert run_cli(["--workload", str(trace), "--policy", "paged"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["workload"], data["requests"]) == (str(trace), 3)
    assert (data["prompt_tokens"], data["output_tokens"]) == (180, 35)

    # An --out that names the trace itself is refused, the trace left as it was.
    before = trace.read_bytes()
    assert run_cli(["--workload", str(trace), "--policy", "paged", "--out", str(trace)]) == 2
    assert capsys.readouterr().err == (f"error: --out {str(trace)!r} is the trace file itself: "
                                       "the result would replace it; name another file\n")
    assert trace.read_bytes() == before
    # A workload's name is no file, even where a file of that name is at hand.
    named = tmp_path / "alpaca"
    named.write_text("not a trace")
    assert run_cli(["--workload", "alpaca", "--requests", "5", "--policy", "paged",
                    "--out", str(named)]) == 0
    assert json.loads(named.read_text())["requests"] == 5


def test_cli_reports_a_trace_named_with_a_line_break_on_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "a\nb.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,x,5\n")
    assert run_cli(["--workload", str(bad), "--policy", "paged"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a\\nb.csv" in err, err


@pytest.mark.parametrize(("body", "message"), [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1.5,x,3\n",
     "row 2 (line 3): ContextTokens must be an integer in 1..16,777,216, got 'x'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,10,0\n",
     "row 2 (line 3): GeneratedTokens must be an integer in 1..16,777,216, got '0'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n5,10,5\n1,10,3\n",
     "row 2 (line 3): TIMESTAMP '1' is earlier than the row before it"),
    ("Time,Prompt,Output\n0,1,1\n", "the header must name the columns TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "the trace holds no request"),
])
def test_cli_refuses_a_bad_csv_naming_the_row(tmp_path: Path, body: str, message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(body)
    out = tmp_path / "R.json"
    assert run_cli(["--workload", str(bad), "--policy", "paged", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: ")
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()   # nothing half-done


def test_cli_reads_a_trace_file_only_up_to_its_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.csv"
    big.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "0,10,5\n" * 100)
    monkeypatch.setattr(simulate_cli, "MAX_TRACE_BYTES", 200)
    assert run_cli(["--workload", str(big), "--policy", "paged"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: trace '{big}' is ") and "the limit is 200 bytes" in err
    assert run_cli(["--workload", str(tmp_path), "--policy", "paged"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert run_cli(["--workload", str(tmp_path / "none.csv"), "--policy", "paged"]) == 2
    assert "No such file" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "azure-code", "--policy", "paged", "--requests", "9000"],
     "error: --requests must be at most 8,819, the requests azure-code holds, got 9,000"),
    (["--workload", "azure-code", "--policy", "paged", "--rate", "5", "--time-scale", "2"],
     "error: --rate and --time-scale both set the arrival rate: give one"),
    (["--workload", "azure-conv", "--policy", "paged", "--time-scale", "0"],
     "error: --time-scale must be between"),
    (["--workload", "azure-conv", "--policy", "paged", "--time-scale", "fast"],
     "error: --time-scale must be a number, got 'fast'"),
    (["--workload", "alpaca", "--policy", "paged", "--max-num-seqs", "0"],
     "error: --max-num-seqs must be an integer in 1.."),
    (["--workload", "alpaca", "--policy", "paged", "--max-num-batched-tokens", "-4"],
     "error: --max-num-batched-tokens must be an integer in 1.."),
    (["--workload", "alpaca", "--policy", "paged", "--watermark-blocks", "many"],
     "error: --watermark-blocks must be an integer in 0..1,073,741,824, got 'many'"),
    (["--workload", "alpaca", "--policy", "paged", "--watermark-blocks", "950"],
     "error: the longest request needs"),
    (["--workload", "alpaca", "--policy", "paged", "--watermark-blocks", "999999"],
     "error: a watermark of 999,999 blocks is not below the pool's 960: no request could "
     "ever be admitted; use a watermark under 960"),
    (["--workload", "alpaca", "--policy", "paged", "--capacity-tokens", "1"],
     "error: a capacity of 1 token holds no block of 16 tokens"),
    (["--workload", "azure-conv", "--policy", "max", "--max-len", "2048"],
     "error: the longest request cannot run: a request of 14,089 tokens is longer than the "
     "maximum sequence length 2,048 that the max policy reserves"),
    (["--workload", "alpaca", "--policy", "max", "--max-len", "0"],
     "error: --max-len must be an integer in 1..16,777,216, got 0"),
])
def test_cli_trace_and_budget_flags_are_checked(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in err
