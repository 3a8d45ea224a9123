"""Edges of what a person or a file can hand PagedLab: numbers past a float, tiny
temperatures, quotes in tokens, and what the metrics count under swap preemption.

Each was found by trying: a snapshot with a 401-digit number crashed both the
command line and the Playground's upload; a temperature of 1e-320 sampled
another token than greedy decoding; a quote token read `'''`; a swapped request
was counted in no request metric.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from backend.core.checks import json_kind, shown
from backend.core.config import GREEDY_BELOW, EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step
from backend.engine.sampling import sample_token
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot, parse_snapshot_text
from backend.sessions.forms import config_from_fields
from backend.views.metrics import metric_items
from backend.views.tokens import quoted_piece
from tests.test_engine_swap import swapped_engine
from tests.test_hostile_input import one_error_line, run_backend
from ui.labels import labelled

HUGE = int("1" + "0" * 400)


def _snapshot() -> dict[str, object]:
    e = Engine(EngineConfig(num_blocks=16, block_size=4), kernel="torch")
    e.apply(Add("A", prompt="hello there"))
    e.apply(Step(1))
    return export_snapshot(e)


@pytest.mark.parametrize(("path", "value"), [
    (("kernel", "max_abs_err"), HUGE), (("kernel", "time_ms"), HUGE),
    (("kernel", "time_ms"), -HUGE)])
def test_a_number_past_any_float_is_refused_by_name(path: tuple[str, str],
                                                    value: int) -> None:
    snap = _snapshot()
    snap[path[0]][path[1]] = value  # type: ignore[index]
    text = json.dumps(snap)
    with pytest.raises(PagedLabError) as err:
        restore_engine(parse_snapshot_text(text))
    said = str(err.value)
    assert said.startswith(f"snapshot.{path[0]}.{path[1]} must be a finite number, got ")
    # Cut short, its digits counted: not 401 digits quoted whole.
    assert said.endswith("… (401 digits)") and len(said) < 120


def test_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    snap = _snapshot()
    snap["kernel"]["max_abs_err"] = HUGE  # type: ignore[index]
    bad = tmp_path / "huge.json"
    bad.write_text(json.dumps(snap))
    empty = tmp_path / "empty.json"
    empty.write_text('{"name": "e", "description": "d", "steps": []}')
    one_error_line(run_backend("run", empty, "--from", bad),
                   "snapshot.kernel.max_abs_err must be a finite number")


@pytest.mark.parametrize(("value", "said"), [
    (None, "null"), (True, "true"), ([1], "an array"), ({}, "an object"), ("x", "'x'"),
    (12345, "12,345"), ("y" * 100, "'" + "y" * 40 + "…'"),
    (-HUGE, "-100000000000… (401 digits)"), (0.5, "0.5"),
    (json.loads("NaN"), "NaN (not a number; JSON has no such value)"),
    (json.loads("1e400"), "Infinity (or a number too large to hold, such as 1e400)"),
    (json.loads("-Infinity"), "-Infinity (or a number too large to hold, such as -1e400)")])
def test_values_are_quoted_in_json_words_and_cut_short(value: object, said: str) -> None:
    assert shown(value) == said


@pytest.mark.parametrize(("scenario", "said"), [
    ({"steps": [None]}, "an operation must be an object, got null"),
    ({"steps": [{"op": None}]}, "step 1 (?): op must be the name of an operation, one of "
                                "add, grow, fork, finish, step, shuffle; got null"),
    # Left out is not null: said as missing.
    ({"steps": [{"request": "A"}]}, "step 1 (?): an operation needs an \"op\" field, one of "
                                    "add, grow, fork, finish, step, shuffle"),
    ({"steps": [{"op": "x" * 500}]},
     "step 1 (" + "x" * 40 + "…): unknown op '" + "x" * 40 + "…'; expected"),
    ({"steps": [{"op": "add", "request": "A", "messages": [{"role": None, "content": ""}]}]},
     "messages[0].role must be one of system, user, assistant, got null"),
    ({"config": [], "steps": []}, "config must be an object, got an array"),
    ({"config": {"num_blocks": 8, "block_size": 4, "temperature": HUGE}, "steps": []},
     "temperature is out of range, got 1000000000000… (401 digits)"),
    ({"config": {"num_blocks": float("nan"), "block_size": 4}, "steps": []},
     "num_blocks must be an integer in 1..65,536, got NaN (not a number; JSON has no such "
     "value)"),
])
def test_a_scenario_is_refused_in_json_words(tmp_path: Path, scenario: dict[str, object],
                                             said: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "s", "description": "d", **scenario}))
    one_error_line(run_backend("run", path), said)


def test_a_field_of_the_wrong_kind_is_named_in_json_words() -> None:
    snap = _snapshot()
    snap["kernel"]["max_abs_err"] = "x"  # type: ignore[index]
    with pytest.raises(PagedLabError, match=r"^snapshot\.kernel\.max_abs_err must be a "
                                            r"number, got 'x'$"):
        restore_engine(parse_snapshot_text(json.dumps(snap)))
    assert json_kind([]) == "an array" and json_kind(1.5) == "a number"


@pytest.mark.parametrize("temperature", [1e-320, 1e-300, 1e-9, GREEDY_BELOW / 2])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature: float) -> None:
    # Logits divided by 1e-320 are infinities, whose argmax was the lowest id among
    # them: the wrong token nearly every time.
    gen = torch.Generator().manual_seed(7)
    for i in range(50):
        logits = torch.randn(300, generator=gen)
        greedy = sample_token(logits, 0, "A", i, temperature=0, printable_only=False)
        assert greedy == int(torch.argmax(logits))
        assert sample_token(logits, 0, "A", i, temperature=temperature,
                            printable_only=False) == greedy


def test_a_config_says_which_temperatures_are_greedy() -> None:
    with pytest.raises(PagedLabError, match=re.escape("(0, or anything under 1e-05, is greedy)")):
        EngineConfig.from_json({"num_blocks": 8, "block_size": 4, "temperature": -1})


def test_a_temperature_of_minus_0_is_written_back_as_0() -> None:
    config = EngineConfig.from_json({"num_blocks": 8, "block_size": 4, "temperature": -0.0})
    assert json.dumps(config.to_json()["temperature"]) == "0.0"


@pytest.mark.parametrize(("piece", "quoted"), [
    (" cat", "' cat'"), ("'", '"\'"'), ("it's", '"it\'s"'), ('"', "'\"'"),
    ("'\"", "'\\'\"'")])
def test_a_quote_token_is_quoted_so_it_reads_as_one(piece: str, quoted: str) -> None:
    assert quoted_piece(piece) == quoted


def test_swapped_requests_are_counted_beside_running_and_waiting() -> None:
    e = swapped_engine()
    snap = export_snapshot(e)
    items = {m.label: m.value for m in metric_items(snap)}
    statuses = [r["status"] for r in snap["requests"]]
    assert items["Swapped requests"] == str(statuses.count("swapped")) != "0"
    counted = sum(int(items[f"{kind} requests"])
                  for kind in ("Running", "Waiting", "Swapped", "Finished"))
    assert counted == len(statuses)
    # Without swap preemption there is nothing to count: no such row.
    assert "Swapped requests" not in {m.label for m in metric_items(_snapshot())}


def _refusal(**fields: object) -> str:
    """What the sidebar's fields `fields` are refused with, as the page says it."""
    with pytest.raises(PagedLabError) as err:
        config_from_fields(fields, EngineConfig(num_blocks=32, block_size=4))
    return labelled(str(err.value))


def test_a_limit_field_says_blank_or_0_is_no_limit() -> None:
    assert _refusal(max_num_seqs=-1) == ("Max running requests must be 1 to 1,073,741,824, "
                                         "or blank or 0 for no limit; got -1")
    assert _refusal(num_blocks=0) == "Pool size must be 1 to 65,536; got 0"


def test_every_field_refused_is_named_on_a_line_of_its_own() -> None:
    """The config's check stops at its first bad field: the sidebar named only the pool
    size, then, once fixed, the block size. Each line in its own field's words."""
    assert _refusal(num_blocks=-7, block_size=0, seed=-1, temperature=-0.5,
                    max_num_seqs=-2).splitlines() == [
        "Pool size must be 1 to 65,536; got -7",
        "Block size must be 1 to 256; got 0",
        "Seed must be 0 to 9,223,372,036,854,775,807; got -1",
        "Temperature must be >= 0 (0, or anything under 1e-05, is greedy), got -0.5",
        "Max running requests must be 1 to 1,073,741,824, or blank or 0 for no limit; got -2"]
    # One alone keeps the config's own words: a real model's pool past a session's room
    # says how many blocks fit rather than the range.
    assert _refusal(model="smollm2-135m", num_blocks=70_000, seed=0).startswith(
        "Pool size: 70,000 blocks of 180 KiB would take 12,304.7 MiB of K/V, but a browser "
        "session may hold at most 512.0 MiB, which is 2,912 blocks of this size")


def test_no_metric_s_meaning_repeats_its_name() -> None:
    """"What these numbers mean" writes each as "name — meaning": a meaning that opens
    with the name read "Copy-on-write copies — Copy-on-write copies: private copies ..."."""
    for item in [*metric_items(export_snapshot(swapped_engine())), *metric_items(_snapshot())]:
        assert not item.help.lower().startswith(item.label.lower()), item


def test_a_pool_of_one_block_is_said_in_the_singular() -> None:
    """"the pool has only 1 blocks", "a prompt of 1 tokens fills all 1 blocks", "1 host
    blocks of 11.3 MiB": a one-block pool is a setting the sidebar offers."""
    from backend.sessions.budget import MIB, KVBudget
    from backend.sessions.saved import label_of

    one = Engine(EngineConfig(num_blocks=1, block_size=4), kernel="torch")
    with pytest.raises(PagedLabError, match=(
            r"^a prompt of 5 tokens needs 2 blocks of 4 but the pool has only 1 block; "
            r"it can never fit$")):
        one.apply(Add("A", prompt_len=5))
    with pytest.raises(PagedLabError, match=(
            r"^a prompt of 4 tokens fills the pool's one block, leaving no block for its "
            r"first generated token; it could never run$")):
        one.apply(Add("A", prompt_len=4))
    one.apply(Add("A", prompt_len=1))
    assert label_of(export_snapshot(one)) == "1 request · 1 block of 4 · tiny-byte"
    big = EngineConfig(num_blocks=1, block_size=4, preemption="swap", num_cpu_blocks=1)
    with pytest.raises(PagedLabError, match=(
            r"^num_blocks: 1 block of 2\.0 KiB would take 2\.0 KiB of K/V, but a browser "
            r"session may hold at most 2\.9 KiB, less than one block of this size beside "
            r"the host pool's 2\.0 KiB \(1 host block\)")):
        KVBudget(per_session=3000, per_server=MIB).check_size(big)
    with pytest.raises(PagedLabError, match=(
            r"^num_cpu_blocks: 2 host blocks of 2\.0 KiB would take 4\.0 KiB of K/V beside "
            r"the pool's 4\.0 KiB, but a browser session may hold at most 6\.0 KiB, which "
            r"leaves room for 1 host block$")):
        KVBudget(per_session=4096 + 2048, per_server=MIB).check_size(
            EngineConfig(num_blocks=2, block_size=4, preemption="swap", num_cpu_blocks=2))
