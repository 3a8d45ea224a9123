"""bench/allocator_vs_peers.py without copies of the peers: it says so and exits 0.

CI has no vLLM or nano-vllm; the benchmark must skip cleanly there, and it
must never leave the peers' files anywhere but its git-ignored folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_peer_benchmark_skips_without_the_peers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PAGEDLAB_VLLM_SRC", "PAGEDLAB_NANOVLLM_SRC")}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "allocator_vs_peers.py"),
                          "--nano-vllm", str(tmp_path / "absent")],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("skipped: no copy of vLLM or nano-vllm was given")


def test_the_peers_folder_is_ignored() -> None:
    out = subprocess.run(["git", "check-ignore", "-q", "bench/_peers/vllm/vllm/x.py"],
                         cwd=ROOT, check=False)
    assert out.returncode == 0
