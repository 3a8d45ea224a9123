"""A restored engine's K/V and logits, recomputed from its tokens.

A snapshot holds tokens, not tensors: restore rebuilds every block table
first (backend/io/restore.py), then `recompute_kv` writes each used, cached
and swapped-out block's K/V from a plain contiguous forward over the tokens
that lead to it, gives every running request its pending logits back, and
scores every beam from the same forwards (backend/io/restore_scores.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from backend.engine.engine import Engine
from backend.io.restore_scores import BeamScores
from backend.models.batch import ContiguousOutput
from backend.paging.hashing import BlockHash

# Called after each forward with (forwards done, forwards in all).
Progress = Callable[[int, int], None]


def recompute_kv(engine: Engine, progress: Progress | None = None, *,
                 scores: bool = True) -> dict[str, float]:
    """Recompute every used, cached and swapped-out block's K/V, and the logits;
    return each beam's cumulative log-probability as the model gives it (restore
    checks the snapshot's against it: backend/io/restore_scores.py), or, with
    `scores=False`, nothing (no beam is scored, and no forward made for one).

    K/V come from the plain contiguous forward pass over each block's full
    token prefix, so they equal what the paged prefill wrote, up to rounding.
    One forward per running or swapped request and one per cached chain; for the beams
    these leave unscored (finished or waiting beams whose tokens no other forward
    covers), one over their prompt and a few passes over the sequences going on from
    it. `progress` hears of each.
    """
    cache = engine.cache
    bs = engine.config.block_size
    done: set[int] = set()
    beams = BeamScores(engine if scores else None)

    def forward(tokens: list[int]) -> ContiguousOutput:
        out = engine.model.forward_contiguous(tokens)
        beams.offer(tokens, out.logits)
        return out

    def write(tokens: list[int], targets: list[tuple[int, int]]) -> torch.Tensor:
        """Compute `tokens`; store logical block i's K/V at physical b for each (i, b)."""
        out = forward(tokens)
        for i, b in targets:
            if b in done:
                continue
            n = min(bs, len(tokens) - i * bs)
            for layer in range(engine.config.num_layers):
                cache.k[layer][b, :n] = out.keys[layer][i * bs:i * bs + n]
                cache.v[layer][b, :n] = out.values[layer][i * bs:i * bs + n]
            done.add(b)
        return out.logits[-1].cpu()

    chains = _cached_chains(engine, done)
    planned = [engine.requests[rid].tokens[:engine.requests[rid].num_computed]
               for rid in (*engine.running, *engine.swapped)]
    extra = beams.extra_forwards(planned + [tokens for tokens, _ in chains])
    total = (len(planned) + len(chains)
             + sum(bool(prefix) + len(passes) for prefix, passes in extra))
    finished = 0

    def tick() -> None:
        nonlocal finished
        finished += 1
        if progress is not None:
            progress(finished, total)

    for rid in engine.running:
        req = engine.requests[rid]
        logits = write(req.tokens[:req.num_computed],
                       list(enumerate(engine.manager.block_table(rid))))
        req.logits = None if req.prefilling else logits
        tick()
    host = engine.host
    for rid in engine.swapped:
        assert host is not None
        req = engine.requests[rid]
        out = forward(req.tokens[:req.num_computed])
        for i, b in enumerate(host.tables[rid]):
            n = min(bs, req.num_computed - i * bs)
            rows = slice(i * bs, i * bs + n)
            for layer in range(engine.config.num_layers):
                host.cache.k[layer][b, :n] = out.keys[layer][rows].to(host.cache.device)
                host.cache.v[layer][b, :n] = out.values[layer][rows].to(host.cache.device)
        req.logits = None if req.prefilling else out.logits[-1].cpu()
        tick()
    # Blocks the tables share with a chain were written above; `write` skips them.
    for tokens, targets in chains:
        write(tokens, targets)
        tick()
    # Beams only their scores need: a prompt once, then its continuations side by side.
    for prefix, passes in extra:
        past = None
        if prefix:
            past = forward(prefix)
            tick()
        for suffixes in passes:
            out = engine.model.forward_contiguous([t for s in suffixes for t in s], past=past,
                                                  branches=[len(s) for s in suffixes])
            row = 0
            for suffix in suffixes:
                beams.offer(prefix + suffix, out.logits[row:row + len(suffix)],
                            first=len(prefix))
                row += len(suffix)
            tick()
    return beams.found


def _cached_chains(engine: Engine, held: set[int]
                   ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """The cached blocks to recompute, grouped by hash chain: per chain end, its tokens
    and (depth, block) targets. Blocks in `held` (filled as the tables are written)
    are skipped when written, so the chains may be listed before."""
    pool = engine.manager.pool

    # Cached blocks, grouped by hash chain: one forward per chain end recomputes
    # every cached block on the chain. Ancestors may live elsewhere or have been
    # evicted; their tokens are in the chain.
    pending: dict[str, list[int]] = {}
    keys: dict[str, BlockHash] = {}
    for block in pool.blocks:
        if block.ref_count == 0 and block.hash is not None and block.id not in held:
            pending.setdefault(block.hash.digest, []).append(block.id)
            keys[block.hash.digest] = block.hash
    inner: set[str] = set()
    for key in keys.values():
        parent = key.parent
        while parent is not None and parent.digest not in inner:
            inner.add(parent.digest)
            parent = parent.parent
    out: list[tuple[list[int], list[tuple[int, int]]]] = []
    for digest, leaf in keys.items():
        if digest in inner:
            continue
        chain: list[BlockHash] = []
        node: BlockHash | None = leaf
        while node is not None:
            chain.append(node)
            node = node.parent
        chain.reverse()
        # By each key's own depth: a salted chain starts from its salt's root, a key
        # with no block and no tokens (depth -1), so a link's place in the list is
        # not its logical block.
        targets = [(link.depth(), b) for link in chain for b in pending.get(link.digest, [])]
        out.append(([t for link in chain for t in link.tokens], targets))
    return out
