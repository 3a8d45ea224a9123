"""Shared test setup."""

from __future__ import annotations

import os
import tempfile
import zlib
from typing import Any

import pytest
import torch
from hypothesis import settings

# The models and kernels under test are tiny: on a small shared CPU, torch's
# thread pool costs far more in contention than it gains in parallelism.
torch.set_num_threads(1)

# Saved sessions go to this run's own directory, never the repository's data/.
# Set at import, before any test opens the store (ui/store.py reads it whenever
# it opens one); the browser tests' streamlit servers inherit it. Removed at exit.
_DATA_DIR = tempfile.TemporaryDirectory(prefix="pagedlab-test-data-")
os.environ["PAGEDLAB_DATA_DIR"] = _DATA_DIR.name

# Property tests draw the same examples on every run (CI reports a failure that
# reproduces); HYPOTHESIS_PROFILE=explore searches afresh each run, with a database.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(autouse=True)
def _seed(request: pytest.FixtureRequest) -> None:
    """A fresh, reproducible random stream per test: seeded by the test's id, so stable
    across runs, orderings and xdist's split of files between workers."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


# Browser fixtures (a live streamlit server, Debian's chromium) for the browser tests.
pytest_plugins = ["tests.browser_support"]


@pytest.fixture(scope="module")
def hf() -> Any:
    """transformers' LlamaForCausalLM in float32 from SmolLM2's GGUF: the oracle the
    real-model tests hold our forward, greedy runs and beam search to."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaForCausalLM

    from backend.models.gguf_loader import find_gguf

    path = find_gguf()
    model = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                             dtype=torch.float32)
    return model.eval()
