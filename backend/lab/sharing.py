"""Memory saved by sharing KV blocks in parallel sampling and beam search.

Both run on PagedLab's own `BlockManager` (prefix caching off): `fork` shares
every block of a sequence, `append` copies a shared, partially filled last
block before writing into it (copy-on-write), and `free` drops references.
After every decode step we count

    used      distinct physical blocks held (what paging with sharing needs)
    unshared  the sum over live sequences of ceil(tokens / block_size)
              (what each sequence would need with its own copy of everything)

and report saved = 1 - sum(used) / sum(unshared) over all steps of all
requests: a time average, as in the PagedAttention paper's Figure 15, which
measured 6.1%-9.8% for parallel sampling and 37.6%-55.2% for beam search on
Alpaca with OPT-13B (n / width 2, 4, 6).

Parallel sampling (n samples of one prompt): the samples share the prompt's
blocks; each draws its own output length from the workload's output
distribution and frees its blocks when done. The shared last prompt block,
if partly filled, is copied on the first write of every sample but the last.

Beam search (width k). There is no trained model here, so the beam choices
are modelled, and the model is stated plainly: at step 1 the prompt yields k
beams. At every later step each of the k new beams picks its parent uniformly
at random among the k current beams (with replacement: a Wright-Fisher
resampling). A beam picked by several children is forked, one picked by none
dies and is freed, and every new beam then appends one token. All beams run
for the request's output length. Real beam search picks parents by score,
which usually concentrates on fewer parents (the lineages merge sooner and
more is shared) and ends beams at different lengths; the uniform model
reproduces the paper's mechanism (candidates share their ancestors' blocks,
Figure 14/15) and its order of magnitude, not its exact numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from backend.core.checks import check_int
from backend.core.errors import PagedLabError
from backend.core.sharing import PAPER_SAVINGS, SharingKind, SharingResult, SharingTrace
from backend.lab.workloads import MAX_TOTAL, make_trace
from backend.paging.block_manager import BlockManager

# (step, width, rng) -> the parent index (0..width-1) of each of the width new beams.
ParentChooser = Callable[[int, int, np.random.Generator], Sequence[int]]


def uniform_parents(step: int, width: int, rng: np.random.Generator) -> list[int]:
    """Each new beam's parent, uniformly among the current beams (with replacement)."""
    return rng.integers(0, width, size=width).tolist()


class _Counter:
    """Accumulates used / unshared blocks after each step."""

    def __init__(self, manager: BlockManager) -> None:
        self.m = manager
        self.steps = self.used = self.unshared = self.peak_used = self.peak_unshared = 0

    def sample(self, live_tokens: Sequence[int]) -> None:
        m = self.m
        used = m.num_blocks - m.num_free_blocks
        unshared = sum(m.blocks_for(t) for t in live_tokens)
        self.steps += 1
        self.used += used
        self.unshared += unshared
        self.peak_used = max(self.peak_used, used)
        self.peak_unshared = max(self.peak_unshared, unshared)

    def result(self) -> SharingTrace:
        return SharingTrace(self.steps, self.used, self.unshared, self.m.cow_copies,
                            self.peak_used, self.peak_unshared)


def parallel_sampling(prompt_len: int, output_lens: Sequence[int],
                      block_size: int = 16) -> SharingTrace:
    """Blocks used by len(output_lens) samples of one prompt, with and without sharing.

    Sample j generates output_lens[j] tokens. Pure: builds its own manager.
    """
    check_int(prompt_len, "prompt_len", 1)
    outs = [check_int(o, "output length", 1) for o in output_lens]
    if not outs:
        raise PagedLabError("parallel sampling needs at least one sample")
    n = len(outs)
    need = -(-(prompt_len + max(outs)) // block_size)
    m = BlockManager(n * (need + 1), block_size, prefix_caching=False, record_events=False)
    m.allocate("s0", [0] * prompt_len)
    for j in range(1, n):
        m.fork("s0", f"s{j}")
    count = _Counter(m)
    live = list(range(n))
    for step in range(1, max(outs) + 1):
        for j in live:
            m.append(f"s{j}", num_tokens=1)
        count.sample([prompt_len + step] * len(live))
        for j in [j for j in live if outs[j] == step]:
            m.free(f"s{j}")
        live = [j for j in live if outs[j] > step]
    return count.result()


def beam_search(prompt_len: int, output_len: int, width: int, block_size: int = 16, *,
                rng: np.random.Generator | None = None,
                choose: ParentChooser = uniform_parents) -> SharingTrace:
    """Blocks used by a beam search of `width` beams over `output_len` steps.

    `choose(step, width, rng)` gives each new beam's parent for steps >= 2
    (default: uniform, see the module docstring); step 1 forks the prompt.
    Pure apart from drawing from `rng`.
    """
    check_int(prompt_len, "prompt_len", 1)
    check_int(output_len, "output_len", 1)
    check_int(width, "width", 1)
    if rng is None:
        rng = np.random.default_rng(0)
    need = -(-(prompt_len + output_len) // block_size)
    # Live beams never hold more than width private chains plus one copy each.
    m = BlockManager(width * (need + 1) + 1, block_size, prefix_caching=False,
                     record_events=False)
    m.allocate("b0", [0] * prompt_len)
    beams = ["b0"]
    made = 1
    count = _Counter(m)
    for step in range(1, output_len + 1):
        parents = [0] * width if step == 1 else list(choose(step, width, rng))
        if len(parents) != width or not all(0 <= p < len(beams) for p in parents):
            raise PagedLabError(f"step {step}: parents {parents} must be {width} indices "
                                f"into the {len(beams)} current beams")
        picked = Counter(parents)
        for j, sid in enumerate(beams):
            if not picked[j]:
                m.free(sid)
        new: list[str] = []
        # Fork every child before anyone writes, so all children of a parent
        # share its blocks; the writes then copy the shared tail on demand.
        for j in sorted(picked):
            new.append(beams[j])
            for _ in range(picked[j] - 1):
                child = f"b{made}"
                made += 1
                m.fork(beams[j], child)
                new.append(child)
        for sid in new:
            m.append(sid, num_tokens=1)
        beams = new
        count.sample([prompt_len + step] * width)
    return count.result()


def sharing_experiment(kind: SharingKind, ns: Sequence[int] = (2, 4, 6), *,
                       requests: int = 200, block_size: int = 16, seed: int = 0,
                       workload: str = "alpaca") -> list[SharingResult]:
    """Saved fractions for each n in `ns` over `requests` seeded workload requests.

    Every n sees the same prompts; parallel sampling gives sample j of every
    request the same output length whatever n is, so the trend in n is not
    blurred by drawing different lengths.
    """
    if kind not in PAPER_SAVINGS:
        raise PagedLabError(f"kind must be 'parallel' or 'beam', got {kind!r}")
    check_int(requests, "requests", 1)
    for n in ns:
        check_int(n, "n", 1)
    trace = make_trace(workload, requests, 1.0, seed)
    prompts = trace.prompt_len.tolist()
    top = max(ns)
    extra = make_trace(workload, requests * top, 1.0, seed + 1).output_len.reshape(requests, top)
    low, high = PAPER_SAVINGS[kind]
    out: list[SharingResult] = []
    for n in ns:
        total: SharingTrace | None = None
        for g, p in enumerate(prompts):
            room = MAX_TOTAL - p
            if kind == "parallel":
                t = parallel_sampling(p, [min(int(o), room) for o in extra[g, :n]], block_size)
            else:
                rng = np.random.default_rng([seed, n, g])
                t = beam_search(p, min(int(trace.output_len[g]), room), n, block_size, rng=rng)
            total = t if total is None else total + t
        assert total is not None
        out.append(SharingResult(kind, n, block_size, requests, total.saved_fraction, total,
                                 low, high))
    return out
