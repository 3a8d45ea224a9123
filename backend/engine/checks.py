"""Checks of an engine's state that recompute from scratch: never on a hot path.

`verify_recomputation` compares the cache with a model that never pages;
`check_requests` proves the engine's bookkeeping agrees with the allocator's.
"""

from __future__ import annotations

import math

import torch

from backend.core.errors import IntegrityError
from backend.engine.kv_cache import KVCache
from backend.engine.request import Request
from backend.engine.results import Verification
from backend.engine.scheduler import Scheduler
from backend.engine.swap import HostPool, sharing_problem
from backend.models.base import LanguageModel
from backend.paging.block_manager import BlockManager


def _check(ok: bool, message: str) -> None:
    """An invariant check that survives `python -O` (snapshot restore relies on it)."""
    if not ok:
        raise IntegrityError(message)


def verify_recomputation(model: LanguageModel, cache: KVCache, manager: BlockManager,
                          running: list[Request], host: HostPool | None = None,
                          swapped: list[Request] | None = None) -> Verification:
    """Reads only: compare the paged state with a from-scratch contiguous pass.

    For every running request the model recomputes all its tokens with
    plain causal attention and no cache at all; the result is compared
    with the K/V read back through the request's block table and with its
    pending logits. Unlike `kernel_report.max_abs_err` (the kernel against
    a reference reading the same cache), this catches a wrong block, a
    missed copy-on-write, a bad move or a prefix hit on other tokens.
    """
    kv_err = logit_err = 0.0
    kv_worst = logit_worst = (0.0, 0.0)
    tokens = 0
    # Values compared, and those left out (the recomputation's own is not finite).
    counts = {"kv": [0, 0], "logits": [0, 0]}
    bs = manager.block_size
    held = [(req, cache, manager.slots_of(req.id, 0, req.num_computed)) for req in running]
    if host is not None:
        # A swapped request's K/V lives in its host blocks, in table order.
        held += [(req, host.cache, [host.tables[req.id][i // bs] * bs + i % bs
                                    for i in range(req.num_computed)])
                 for req in swapped or []]
    for req, where, slots in held:
        # A prompt still being prefilled is compared over the tokens computed so far.
        ref = model.forward_contiguous(req.tokens[:req.num_computed])
        for layer in range(len(where.k)):
            keys, values = where.read_slots(layer, slots)
            for got, want in ((keys, ref.keys[layer]), (values, ref.values[layer])):
                worst = _error(got, want, counts["kv"])
                kv_err = max(kv_err, worst[0])
                kv_worst = max(kv_worst, worst, key=_relative)
        if not req.prefilling:
            assert req.logits is not None
            worst = _error(req.logits, ref.logits[-1].cpu(), counts["logits"])
            logit_err = max(logit_err, worst[0])
            logit_worst = max(logit_worst, worst, key=_relative)
        tokens += req.num_computed
    (kv_values, kv_out), (logit_values, logits_out) = counts["kv"], counts["logits"]
    return Verification(len(held), tokens, kv_err, logit_err, kv_worst, logit_worst,
                        kv_values, kv_out, logit_values, logits_out)


def _error(got: torch.Tensor, want: torch.Tensor, counts: list[int]) -> tuple[float, float]:
    """The largest |got - want| and the largest |want| over the values compared; `counts`
    (values, left out) grows by this comparison's.

    A value is left out where the model overflowed its dtype on both sides, paged and
    recomputed: each is NaN or infinite, or at the dtype's limit beside the other's
    overflow (rounding in another order tips one over). That says nothing about the
    paging. Anywhere else a NaN or infinite value on either side is an error of inf:
    a finite value facing an overflow is a real difference, and garbage never compares
    as agreement. Value by value, so an overflow in one layer hides nothing in another.
    """
    limit = 0.99 * torch.finfo(got.dtype).max if got.is_floating_point() else math.inf
    got, want = got.float(), want.float()

    def overflowed(t: torch.Tensor) -> torch.Tensor:
        return ~torch.isfinite(t) | (t.abs() >= limit)

    out = overflowed(got) & overflowed(want) & ~(torch.isfinite(got) & torch.isfinite(want))
    kept = ~out
    n_kept = int(kept.sum())
    counts[0] += want.numel()
    counts[1] += want.numel() - n_kept
    if n_kept == 0:
        return 0.0, 0.0
    err = float((got - want)[kept].abs().max())
    judged = kept & torch.isfinite(want)
    scale = float(want[judged].abs().max()) if bool(judged.any()) else 0.0
    return (err if math.isfinite(err) else math.inf), scale


def _relative(error_and_scale: tuple[float, float]) -> float:
    err, scale = error_and_scale
    return err / max(1.0, scale)


def check_requests(requests: dict[str, Request], scheduler: Scheduler,
                   manager: BlockManager, *, logits: bool = True) -> None:
    """The engine's invariants on top of the allocator's (not rechecked here).

    Queues agree with statuses, tables with tokens, sharers with each other.
    `logits=False`: no forward has run (a snapshot's state checked without its K/V),
    so which requests hold logits is not checked.
    """
    running = {r.id for r in requests.values() if r.status == "running"}
    _check(running == set(scheduler.running) == set(manager.seqs)
           and len(running) == len(scheduler.running), "running sets disagree")
    waiting = {r.id for r in requests.values() if r.status == "waiting"}
    _check(waiting == set(scheduler.waiting) and len(waiting) == len(scheduler.waiting),
           "waiting sets disagree")
    bs = manager.block_size
    swapped = {r.id for r in requests.values() if r.status == "swapped"}
    _check(swapped == set(scheduler.swapped) and len(swapped) == len(scheduler.swapped),
           "swapped sets disagree")
    host = scheduler.host
    if host is None:
        _check(not swapped, "swapped requests without a host pool")
    else:
        _check(set(host.tables) == swapped, "host tables are not the swapped requests'")
        holders: dict[int, list[tuple[str, int]]] = {}
        for rid, table in host.tables.items():
            for i, b in enumerate(table):
                holders.setdefault(b, []).append((rid, i))
        free = set(host.free_ids)
        _check(len(free) == len(host.free_ids), "a host block is free twice")
        for hb in host.blocks:
            held = holders.get(hb.id, [])
            _check((hb.ref_count == 0) == (hb.id in free) and hb.ref_count == len(held),
                   f"host block {hb.id}: ref count")
            # Shared only as a beam group's swap-out shares: the K/V of one prefix.
            for other in held[1:]:
                why = sharing_problem(held[0], other, requests, host.tables, bs)
                _check(why is None, f"host block {hb.id}: {why}")
        _check(free.isdisjoint(holders) and len(free) + len(holders) == host.num_blocks,
               "host blocks are neither free nor held")
        for rid in swapped:
            req = requests[rid]
            table = host.tables[rid]
            _check(len(table) == -(-req.num_computed // bs), f"{rid}: host table length")
            _check(sum(host.blocks[b].num_filled for b in table) == req.num_computed,
                   f"{rid}: host slots filled")
            _check(not logits or (req.logits is None) == req.prefilling,
                   f"{rid}: swapped logits")
    # A beam group runs as one unit: its running beams stand side by side.
    groups = [requests[rid].group if requests[rid].beam_width is not None else None
              for rid in scheduler.running]
    runs = [g for i, g in enumerate(groups)
            if g is not None and (i == 0 or groups[i - 1] != g)]
    _check(len(runs) == len(set(runs)), "a beam group's running beams are not side by side")
    # A shared block's K/V depends on every token up to its end, so all of its
    # holders must have it at the same logical index after the same tokens.
    # Compare each pair of sharers once, over their longest shared prefix.
    first: dict[int, tuple[str, int]] = {}
    prefix_len: dict[tuple[str, str], int] = {}
    for rid in scheduler.running:
        req = requests[rid]
        _check(0 <= req.uncomputed < req.num_tokens, f"{rid}: prefill state")
        _check(req.pending_samples == 0 or (req.group is not None and req.prefilling),
               f"{rid}: samples still to fork, but its prompt is computed")
        _check(manager.num_tokens(rid) == req.num_computed, f"{rid}: token count")
        _check(not logits or (req.logits is None) == req.prefilling,
               f"{rid}: logits while prefilling or none to sample from")
        for i, b in enumerate(manager.block_table(rid)):
            block = manager.pool.blocks[b]
            if block.hash is not None:
                _check(list(block.hash.tokens) == req.tokens[i * bs:(i + 1) * bs], (
                    f"{rid}: block {b}'s hash does not match the request's tokens"))
            if block.ref_count < 2:
                continue
            holder, j = first.setdefault(b, (rid, i))
            _check(j == i, f"{rid} holds block {b} at logical {i}, {holder} at {j}")
            if holder != rid:
                end = i * bs + block.num_filled
                prefix_len[(holder, rid)] = max(prefix_len.get((holder, rid), 0), end)
    for (a, c), n in prefix_len.items():
        _check(requests[a].tokens[:n] == requests[c].tokens[:n], (
            f"{a} and {c} share blocks but hold different tokens in them"))
