"""Hostile input: files and snapshots built to make PagedLab slow, hang, crash or lie.

Each test bounds the time it allows far above what a correct implementation
needs, so a slow shared CPU does not make them flaky, but far below what the
attack used to cost.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Grow
from backend.io.json_input import read_bounded
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot, parse_snapshot_text, snapshot_json
from backend.paging.hashing import BlockHash, hash_block
from backend.sessions.tour import TourRun, parse_scenario_upload
from backend.views.tour import checks_html

ROOT = Path(__file__).resolve().parents[1]


def _bounded_memory() -> None:
    # A reader that trusts a file's reported size reads /dev/zero until memory
    # runs out: let it fail with MemoryError at 3 GiB instead of taking the
    # machine down with it.
    resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))


def run_backend(*args: str | Path, timeout: float = 60,
                stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """`python -m backend ...` in a real process (so a hang is a timeout, not a stuck suite)."""
    return subprocess.run([sys.executable, "-m", "backend", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, stdin=stdin,
                          preexec_fn=_bounded_memory)


def one_error_line(proc: subprocess.CompletedProcess[str], *parts: str) -> None:
    """Exit 2 with exactly one `error:` line on stderr containing every part, no traceback."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    for part in parts:
        assert part in proc.stderr, proc.stderr


# ---- A: prefix-cache chains deeper than any engine builds ----------------------------

def deep_chain_snapshot(depth: int, *, num_blocks: int = 2, block_size: int = 256,
                        min_bytes: int = 0) -> dict[str, Any]:
    """A fresh pool whose block 0 is cached under a chain of `depth` ancestors.

    Every digest is genuine, so only the chain's depth is wrong. With
    `min_bytes`, the chain is lengthened until the JSON is at least that big.
    """
    cfg = EngineConfig.from_json({"num_blocks": num_blocks, "block_size": block_size})
    snap = export_snapshot(Engine(cfg, kernel="torch"))
    salt = cfg.cache_salt()
    chain: list[BlockHash] = []
    node: BlockHash | None = None
    size = 0
    while len(chain) <= depth or size < min_bytes:
        node = hash_block(node, [(len(chain) * 7 + j) % 256 for j in range(block_size)], salt)
        chain.append(node)
        size += len(json.dumps({"hash": node.digest, "parent": node.parent_digest,
                                "tokens": list(node.tokens)}))
    assert node is not None
    snap["prefix_cache"] = [{"hash": n.digest, "parent": n.parent_digest,
                             "tokens": list(n.tokens)} for n in chain]
    snap["blocks"][0].update(state="cached", num_filled=block_size, hash=node.digest)
    snap["metrics"].update(cached_blocks=1, free_blocks=num_blocks - 1)
    return snap


def test_a_megabyte_chain_through_a_two_block_pool_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(deep_chain_snapshot(256, min_bytes=1 << 20)))
    assert path.stat().st_size >= 1 << 20
    empty = tmp_path / "empty.json"
    empty.write_text('{"steps": []}')
    out = tmp_path / "out.json"
    # The restore used to run one forward pass over the chain's every token
    # (quadratic attention): over 5 minutes for this file.
    proc = run_backend("run", empty, "--from", path, "--out", out, "--kernel", "torch")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: snapshot.prefix_cache[2]: ")
    assert "a pool of 2 blocks" in proc.stderr
    assert not out.exists()
    data = parse_snapshot_text(path.read_bytes())
    # CPU time, not the clock's: the check is the work's size, which a busy machine
    # (another test process beside this one) must not stretch.
    started = time.process_time()
    with pytest.raises(PagedLabError, match=r"prefix_cache\[2\]"):
        restore_engine(data, kernel="torch")
    assert time.process_time() - started < 10


def test_a_chain_one_block_deeper_than_the_pool_is_refused() -> None:
    with pytest.raises(PagedLabError, match=(
            r"snapshot.prefix_cache\[4\]: hash \w+ is logical block 4 of its chain, but a "
            r"pool of 4 blocks")):
        restore_engine(deep_chain_snapshot(4, num_blocks=4, block_size=4), kernel="torch")


def test_the_deepest_chain_an_engine_builds_restores_exactly() -> None:
    # A request can fill the whole pool (its table has num_blocks entries), so a
    # cached chain may be exactly num_blocks deep; the bound must allow it.
    e = Engine(EngineConfig.from_json({"num_blocks": 4, "block_size": 4}), kernel="torch")
    e.apply(Add("A", prompt="fifteen tokens!"))
    e.apply(Grow("A", tokens=1))
    e.apply(Finish("A"))
    snap = export_snapshot(e)
    assert snap["metrics"]["cached_blocks"] == 4 and len(snap["prefix_cache"]) == 4
    assert snapshot_json(restore_engine(snap, kernel="torch")) == snapshot_json(e)
    # A cached block whose three ancestors were evicted (and kept in prefix_cache).
    evicted = deep_chain_snapshot(3, num_blocks=4, block_size=4)
    assert export_snapshot(restore_engine(evicted, kernel="torch")) == evicted


def test_exporting_a_long_chain_is_linear() -> None:
    # Sorting the prefix cache by depth walked every chain from each node:
    # about 10 s for 32,000 nodes.
    n = 32_000
    e = Engine(EngineConfig.from_json({"num_blocks": n, "block_size": 1}), kernel="torch")
    salt = e.config.cache_salt()
    node: BlockHash | None = None
    for i in range(n):
        node = hash_block(node, [i % 256], salt)
    assert node is not None and node.depth() == n - 1
    e.manager.pool.blocks[0].hash = node
    started = time.process_time()         # CPU time, as above
    snap = export_snapshot(e)
    assert time.process_time() - started < 5
    assert len(snap["prefix_cache"]) == n and snap["prefix_cache"][0]["parent"] is None
    assert snap["prefix_cache"][-1]["hash"] == node.digest


def test_a_table_that_holds_a_block_twice_is_refused_by_name() -> None:
    # 2,000 table entries in a 2-block pool, ref counts made to agree: the
    # integrity check would quote the whole table in its one line.
    e = Engine(EngineConfig.from_json({"num_blocks": 2, "block_size": 4}), kernel="torch")
    e.apply(Add("A", prompt="abc"))
    snap = export_snapshot(e)
    req = snap["requests"][0]
    req["tokens"] = [97] * 8000
    req["num_tokens"] = 8000
    req["block_table"] = [0, 1] * 1000
    for b in snap["blocks"]:
        b.update(state="used", ref_count=1000, num_filled=4)
    with pytest.raises(PagedLabError) as exc:
        restore_engine(snap, kernel="torch")
    assert str(exc.value) == "snapshot.requests[0]: its block_table holds block 0 twice"


# ---- B: expectations no float can equal, on the Scenarios page ---------------------

def test_a_non_numeric_expectation_is_a_cross_on_the_scenarios_page() -> None:
    upload = ('{"contiguous": {"capacity": 16, "policy": "oracle"}, "steps": ['
              '{"op": "add", "request": "A", "prompt": "hello", "expect": {'
              '"kernel.max_abs_err": "abc", "kernel.time_ms": 1' + "0" * 400 + ', '
              '"metrics.filled_slots": [1], "contiguous.capacity.x": 1, '
              '"metrics.used_blocks": 2}}, {"op": "step"}]}').encode()
    run = TourRun(parse_scenario_upload(upload, "mine.json"), "upload", "mine", kernel="torch")
    frame = run.advance()  # "Next"
    assert frame is not None and run.error is None
    ok = {c.path: c.ok for c in frame.checks}
    assert ok == {"kernel.max_abs_err": False, "kernel.time_ms": False,
                  "metrics.filled_slots": False, "contiguous.capacity.x": False,
                  "metrics.used_blocks": True}
    by_path = {c.path: c for c in frame.checks}
    assert by_path["kernel.max_abs_err"].got == frame.snapshot["kernel"]["max_abs_err"]
    assert by_path["contiguous.capacity.x"].got is None
    assert "not found" in (by_path["contiguous.capacity.x"].problem or "")
    html = checks_html(frame.checks)
    assert html.count("data-ok='0'") == 4 and html.count("✗") == 4
    assert run.advance() is not None and run.taken == 2


def test_samples_and_beams_beside_a_contiguous_arena_step_through() -> None:
    # The arena once looked up an `add`'s own id, which samples and beams do not keep.
    upload = (b'{"contiguous": {"capacity": 64, "policy": "pow2"}, "steps": ['
              b'{"op": "add", "request": "S", "prompt_len": 3, "max_new_tokens": 2, "n": 2},'
              b'{"op": "add", "request": "W", "prompt_len": 3, "max_new_tokens": 2, '
              b'"beam_width": 2}, {"op": "step", "count": 3}]}')
    run = TourRun(parse_scenario_upload(upload, "many.json"), "upload", "many", kernel="torch")
    assert run.run_to(3) == 3 and run.error is None
    arena = run.frame(3).arena
    assert arena is not None and arena["regions"] == {} and arena["waiting"] == []
    assert {"S.0", "S.1", "W.0", "W.1"} <= set(arena["finished"])


# ---- C: files that are not what their size says ----------------------------------

@pytest.fixture()
def empty_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "empty.json"
    path.write_text('{"steps": []}')
    return path


def test_dev_zero_is_refused_without_reading_it(empty_scenario: Path) -> None:
    # It reports size 0 and never ends: it used to be read until memory ran out.
    one_error_line(run_backend("run", "/dev/zero"),
                   "cannot read scenario '/dev/zero': it is a character device, not a "
                   "regular file")
    one_error_line(run_backend("run", empty_scenario, "--from", "/dev/zero"),
                   "cannot read snapshot '/dev/zero': it is a character device")


def test_a_fifo_without_a_writer_is_refused_without_waiting(tmp_path: Path,
                                                            empty_scenario: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    # Opening it for reading used to wait for a writer forever.
    one_error_line(run_backend("run", fifo), f"cannot read scenario '{fifo}': it is a FIFO")
    one_error_line(run_backend("run", empty_scenario, "--from", fifo),
                   f"cannot read snapshot '{fifo}': it is a FIFO")


def test_a_piped_stdin_is_refused_and_a_redirected_one_is_read(tmp_path: Path) -> None:
    # A pipe reports size 0, so a 5 MiB scenario (the limit is 4) was read
    # whole and run; a 600 MiB one was read before anything was refused.
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"description": "x" * (5 << 20), "steps": []}))
    proc = subprocess.Popen(["cat", str(big)], stdout=subprocess.PIPE)
    try:
        one_error_line(run_backend("run", "/dev/stdin", stdin=proc.stdout),
                       "cannot read scenario '/dev/stdin': it is a FIFO")
    finally:
        assert proc.stdout is not None
        proc.stdout.close()
        proc.wait(timeout=60)
    # Redirected from a regular file, /dev/stdin is that file and its size is true.
    small = tmp_path / "small.json"
    small.write_text('{"steps": [{"op": "add", "request": "A", "prompt": "hi"}]}')
    with small.open("rb") as f:
        ok = run_backend("run", "/dev/stdin", "--kernel", "torch", stdin=f)
    assert (ok.returncode, ok.stderr) == (0, "")
    with big.open("rb") as f:
        one_error_line(run_backend("run", "/dev/stdin", stdin=f),
                       "scenario '/dev/stdin' is 5,242", "the limit is 4,194,304 bytes")


def test_too_large_regular_files_are_refused(tmp_path: Path, empty_scenario: Path) -> None:
    scenario = tmp_path / "huge-scenario.json"
    with scenario.open("wb") as f:
        f.truncate((4 << 20) + 1)
    one_error_line(run_backend("run", scenario), f"scenario '{scenario}' is 4,194,305 bytes; "
                   "the limit is 4,194,304 bytes")
    snapshot = tmp_path / "huge-snapshot.json"
    with snapshot.open("wb") as f:  # sparse: no disk or time spent on it
        f.truncate((512 << 20) + 1)
    one_error_line(run_backend("run", empty_scenario, "--from", snapshot),
                   f"snapshot '{snapshot}' is 536,870,913 bytes; the limit is "
                   "536,870,912 bytes")


def test_a_directory_is_refused(tmp_path: Path, empty_scenario: Path) -> None:
    one_error_line(run_backend("run", tmp_path), f"cannot read scenario '{tmp_path}': it is a "
                   "directory")
    one_error_line(run_backend("run", empty_scenario, "--from", tmp_path),
                   f"cannot read snapshot '{tmp_path}': it is a directory")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_a_regular_file_that_reports_size_0_is_still_read_only_to_the_limit() -> None:
    # /proc files are regular and report size 0, whatever they hold.
    maps = Path("/proc/self/maps")
    assert maps.stat().st_size == 0
    with pytest.raises(PagedLabError, match=r"^scenario '/proc/self/maps' is more than 10 "
                                            r"bytes; the limit is 10 bytes$"):
        read_bounded(maps, "scenario", 10)
    assert len(read_bounded(maps, "scenario", 1 << 20)) > 10
