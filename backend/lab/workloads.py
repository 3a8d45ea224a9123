"""Synthetic request traces shaped like ShareGPT and Alpaca (the PagedAttention paper's §6).

A trace is a list of requests, each with an arrival time, a prompt length and
an output length (in tokens). Arrivals are a Poisson process at `rate`
requests per second: the gaps are independent exponentials with mean 1/rate.

Lengths. No dataset ships with PagedLab, so each length is drawn from a
discretised log-normal, L = max(1, floor(X + 0.5)) with log X ~ Normal(mu, sigma),
and a (prompt, output) pair whose total exceeds `max_total` (2048, the
context limit the paper's models share) is redrawn, as serving benchmarks
drop such requests. The sigmas are hand-picked shapes (ShareGPT's
conversations are long-tailed, Alpaca's instructions short and regular); the
mus are then fitted numerically so that the means *after* discretising and
redrawing equal the paper's dataset means:

    workload   prompt mean  sigma   output mean  sigma
    sharegpt   161.31       1.0     337.99       1.0
    alpaca     19.31        0.6     58.45        0.9

Determinism: a trace is a pure function of (workload, requests, rate, seed).
Arrival gaps and lengths come from two independent streams of
`numpy.random.SeedSequence(seed)`, drawn in fixed-size chunks, so the first
n requests of a longer trace are exactly the trace of n requests, and a trace
at another rate has the same lengths and proportionally scaled arrivals.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from backend.core.checks import check_int
from backend.core.errors import PagedLabError

WorkloadName = Literal["sharegpt", "alpaca"]
MAX_TOTAL = 2048
# Draws per chunk: fixed, so a trace's prefix never depends on its length.
_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Target means (tokens) and log-normal shapes of one workload's lengths."""

    name: WorkloadName
    prompt_mean: float
    output_mean: float
    prompt_sigma: float
    output_sigma: float
    max_total: int = MAX_TOTAL


# Means: the PagedAttention paper, §6.1 (ShareGPT 161.31 / 337.99 tokens,
# Alpaca 19.31 / 58.45 tokens of input / output).
WORKLOADS: dict[str, WorkloadSpec] = {
    "sharegpt": WorkloadSpec("sharegpt", 161.31, 337.99, 1.0, 1.0),
    "alpaca": WorkloadSpec("alpaca", 19.31, 58.45, 0.6, 0.9),
}


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests in arrival order. Arrays have one entry per request."""

    workload: str
    rate: float
    seed: int
    arrival_s: np.ndarray   # float64, non-decreasing
    prompt_len: np.ndarray  # int64, >= 1
    output_len: np.ndarray  # int64, >= 1
    # The gaps between arrivals were divided by this (recorded traces; 1 for synthetic).
    time_scale: float = 1.0

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def final_len(self) -> np.ndarray:
        """Prompt plus output: the tokens a request holds when it finishes."""
        return self.prompt_len + self.output_len


def spec(workload: str) -> WorkloadSpec:
    """The named workload, or PagedLabError listing the names."""
    found = WORKLOADS.get(workload)
    if found is None:
        raise PagedLabError(
            f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    return found


def _pmf(mu: float, sigma: float, n: int) -> np.ndarray:
    """P(L = k) for k = 1..n (at index k-1), L = max(1, floor(X + 0.5)), X log-normal."""
    edges = np.arange(1, n + 1, dtype=np.float64) + 0.5  # k + 0.5 for k = 1..n
    z = (np.log(edges) - mu) / (sigma * math.sqrt(2.0))
    cdf = 0.5 * (1.0 + np.array([math.erf(v) for v in z]))
    return np.diff(np.concatenate(([0.0], cdf)))


def _kept_means(mu_p: float, mu_o: float, w: WorkloadSpec) -> tuple[float, float]:
    """Exact means of (prompt, output) given prompt + output <= max_total."""
    n = w.max_total - 1
    pp = _pmf(mu_p, w.prompt_sigma, n)
    po = _pmf(mu_o, w.output_sigma, n)
    k = np.arange(1, n + 1, dtype=np.float64)
    # P(output <= max_total - p) for p = 1..n.
    keep_o = np.cumsum(po)[::-1]
    # P(prompt <= max_total - o), by symmetry of the constraint.
    keep_p = np.cumsum(pp)[::-1]
    mean_p = float((k * pp * keep_o).sum() / (pp * keep_o).sum())
    mean_o = float((k * po * keep_p).sum() / (po * keep_p).sum())
    return mean_p, mean_o


@functools.cache
def fitted_mus(workload: str) -> tuple[float, float]:
    """Reads only: log-normal mus whose redrawn, discretised means hit the targets."""
    w = spec(workload)
    mu_p = math.log(w.prompt_mean) - w.prompt_sigma ** 2 / 2
    mu_o = math.log(w.output_mean) - w.output_sigma ** 2 / 2
    for _ in range(100):
        mp, mo = _kept_means(mu_p, mu_o, w)
        if abs(mp / w.prompt_mean - 1) < 1e-10 and abs(mo / w.output_mean - 1) < 1e-10:
            break
        # The means grow monotonically with the mus: a multiplicative fixed point.
        mu_p += math.log(w.prompt_mean / mp)
        mu_o += math.log(w.output_mean / mo)
    return mu_p, mu_o


def expected_means(workload: str) -> tuple[float, float]:
    """Reads only: the exact (prompt, output) means of the fitted length model."""
    return _kept_means(*fitted_mus(workload), spec(workload))


def sample_lengths(workload: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """Draw n (prompt, output) pairs with prompt + output <= max_total, in fixed chunks."""
    w = spec(workload)
    mu_p, mu_o = fitted_mus(workload)
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    have = 0
    while have < n:
        p = np.maximum(1, np.floor(rng.lognormal(mu_p, w.prompt_sigma, _CHUNK) + 0.5))
        o = np.maximum(1, np.floor(rng.lognormal(mu_o, w.output_sigma, _CHUNK) + 0.5))
        keep = p + o <= w.max_total
        prompts.append(p[keep].astype(np.int64))
        outputs.append(o[keep].astype(np.int64))
        have += int(keep.sum())
    return np.concatenate(prompts)[:n], np.concatenate(outputs)[:n]


def make_trace(workload: str, requests: int, rate: float, seed: int = 0) -> Trace:
    """A seeded trace of `requests` Poisson arrivals at `rate` per second.

    Raises PagedLabError for an unknown workload, requests < 1, a rate that
    is not a positive finite number, or a negative seed.
    """
    spec(workload)
    check_int(requests, "requests", 1)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
            math.isfinite(rate) and rate > 0):
        raise PagedLabError(f"rate must be a positive number of requests per second, "
                            f"got {rate!r}")
    check_int(seed, "seed", 0)
    arrival_ss, length_ss = np.random.SeedSequence(seed).spawn(2)
    arng = np.random.default_rng(arrival_ss)
    chunks = -(-requests // _CHUNK)
    gaps = np.concatenate([arng.standard_exponential(_CHUNK) for _ in range(chunks)])
    arrival = np.cumsum(gaps[:requests]) / float(rate)
    prompt, output = sample_lengths(workload, requests, np.random.default_rng(length_ss))
    return Trace(workload, float(rate), seed, arrival, prompt, output)
