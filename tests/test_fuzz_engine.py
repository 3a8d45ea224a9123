"""Random operations, valid and not, on small pools: every invariant after every one.

The sequences come from bench/soak.py (which runs the same thing as long as
asked); here a fixed, seeded set small enough for every `make test`: eight
pool configs (block sizes 1 to 16, fifo and random allocation, prefix
caching on and off), one seeded sequence of 40 operations each. After every
operation `check_integrity` passes; after every refused one the snapshot is
byte-identical to before; each sequence's snapshot survives export,
restore, export unchanged.
"""

from __future__ import annotations

from bench.soak import SoakStats, soak_configs, soak_sequence

CONFIGS = soak_configs(12)
OPS = 40


def test_random_operations_keep_every_invariant() -> None:
    totals = SoakStats()
    for seed, config in enumerate(CONFIGS):
        # Raises SoakError naming the config, seed and operation that broke.
        stats = soak_sequence(config, seed=seed, num_ops=OPS)
        assert sum(stats.applied.values()) + sum(stats.refused.values()) == OPS
        totals.add(stats)
    # A fuzz that never shared, copied, evicted or preempted, or never had an
    # operation of each kind both applied and refused, would test little.
    for kind in ("alloc", "free", "share", "cow", "prefix_hit", "evict", "preempt", "move"):
        assert totals.events[kind] > 0, (kind, dict(totals.events))
    for op in ("add", "grow", "fork", "finish", "step", "shuffle"):
        assert totals.applied[op] > 0 and totals.refused[op] > 0, (op, totals)


def test_a_beam_group_readmitted_beside_its_own_prefix_hits() -> None:
    # Found by bench/soak.py: a beam group preempted by recomputation came back with
    # plans made before any of its beams took blocks, so a later beam hit blocks the
    # earlier one had just taken and admission's bookkeeping disagreed with the pool.
    stats = soak_sequence(soak_configs(16)[0], seed=100, num_ops=250)
    assert stats.events["preempt"] > 0
