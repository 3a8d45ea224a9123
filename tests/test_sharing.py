"""Memory saved by block sharing: exact small cases and trends."""

from __future__ import annotations

import numpy as np
import pytest

from backend.core.errors import PagedLabError
from backend.lab.sharing import (
    PAPER_SAVINGS,
    SharingTrace,
    beam_search,
    parallel_sampling,
    sharing_experiment,
)


def test_two_samples_of_a_nine_token_prompt_by_hand() -> None:
    # Block size 4: the prompt fills blocks [4, 4, 1]. Step 1: sample 0 writes into the
    # shared partial block, so it gets a copy (copy-on-write); sample 1 then owns the
    # original. Used: 2 shared full + 2 tails = 4; unshared: 2 x ceil(10 / 4) = 6.
    # Steps 2-3 (11, 12 tokens) stay at 4 vs 6; step 4 (13 tokens) needs a new block
    # each: 6 vs 8.
    t = parallel_sampling(9, [4, 4], block_size=4)
    assert t == SharingTrace(steps=4, used_block_steps=4 + 4 + 4 + 6,
                             unshared_block_steps=6 + 6 + 6 + 8, cow_copies=1,
                             peak_used_blocks=6, peak_unshared_blocks=8)
    assert t.saved_fraction == 1 - 18 / 26


def test_samples_that_finish_early_free_their_blocks() -> None:
    # Prompt of 8 (two full blocks, nothing partial: no copy). Sample 1 stops after 1 token.
    t = parallel_sampling(8, [3, 1], block_size=4)
    # Step 1: 2 shared + 1 tail each = 4 vs 2 x 3 = 6; steps 2-3: 3 vs 3.
    assert (t.used_block_steps, t.unshared_block_steps, t.cow_copies) == (10, 12, 0)


def test_beam_search_by_hand() -> None:
    # Prompt of 4 tokens (one full block P), width 2, block size 4, 3 steps.
    # Step 1: both beams fork from the prompt and start private blocks: P, X, Y (3 vs 4).
    # Step 2: both new beams descend from beam 0: beam 1 dies (Y freed), beam 0 forks;
    #         the first write into the shared X copies it: P, X, X' (3 vs 4).
    # Step 3: each beam keeps its own line: 3 vs 4.
    def script(step: int, width: int, rng: np.random.Generator) -> list[int]:
        return [0, 0] if step == 2 else [0, 1]

    t = beam_search(4, 3, 2, block_size=4, choose=script)
    assert (t.used_block_steps, t.unshared_block_steps, t.cow_copies) == (9, 12, 1)
    assert t.saved_fraction == 0.25


def test_beams_that_never_merge_share_only_the_prompt() -> None:
    def keep(step: int, width: int, rng: np.random.Generator) -> list[int]:
        return list(range(width))

    # Prompt 8 = 2 full blocks, shared by all 3 beams; each beam has its own tail blocks.
    t = beam_search(8, 4, 3, block_size=4, choose=keep)
    # 12 tokens: 2 shared + 3 x 1 = 5 used vs 3 x 3 = 9 unshared, at every step.
    assert (t.used_block_steps, t.unshared_block_steps) == (4 * 5, 4 * 9)


def test_bad_parent_choices_are_refused() -> None:
    with pytest.raises(PagedLabError, match="must be 2 indices"):
        beam_search(4, 3, 2, block_size=4, choose=lambda s, w, r: [0, 5])
    with pytest.raises(PagedLabError, match="at least one sample"):
        parallel_sampling(4, [])
    with pytest.raises(PagedLabError, match="kind must be"):
        sharing_experiment("greedy")  # type: ignore[arg-type]


def test_savings_grow_with_n_on_alpaca() -> None:
    parallel = sharing_experiment("parallel", (1, 2, 4, 6), requests=150, seed=0)
    beam = sharing_experiment("beam", (1, 2, 4, 6), requests=80, seed=0)
    p = [r.saved_fraction for r in parallel]
    b = [r.saved_fraction for r in beam]
    # One sample or one beam shares nothing.
    assert p[0] == 0.0 and b[0] == 0.0
    assert p[1] < p[2] < p[3]
    assert b[1] < b[2] < b[3]
    # Sharing the prompt saves a few percent; beams share most of their history.
    assert 0.01 < p[3] < 0.2
    assert b[1] > 0.25
    assert b[3] < 0.9
    assert all(r.paper_low == PAPER_SAVINGS["parallel"][0] for r in parallel)


def test_experiment_is_seeded() -> None:
    a = sharing_experiment("beam", (3,), requests=20, seed=4)
    b = sharing_experiment("beam", (3,), requests=20, seed=4)
    c = sharing_experiment("beam", (3,), requests=20, seed=5)
    assert a == b
    assert a != c
