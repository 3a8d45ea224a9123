"""Shared test setup."""

from __future__ import annotations

import torch

# The models and kernels under test are tiny: on a small shared CPU, torch's
# thread pool costs far more in contention than it gains in parallelism.
torch.set_num_threads(1)

# Browser fixtures (a live streamlit server, Debian's chromium) for the browser tests.
pytest_plugins = ["tests.browser_support"]
