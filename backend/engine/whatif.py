"""What if a request's blocks were read in physical order? A one-step what-if on a copy.

The seed text says sorting a block table by physical block number "would
scramble the token history rather than improve it". `physical_order` shows
what happens: it copies the K/V pool, and recomputes the request's next-token
prediction (the forward of its last token, the step that produced its
pending logits) twice on the copy: once through its table as it is, and once
through the same blocks sorted by physical id. The table order gives the
pending logits back (to float rounding): paging is only correct in logical
order. The sorted order changes what the model reads:

- each key carries its own position (rotary embeddings rotate it when it is
  written), so attention, a weighted sum over the keys read, is the same
  for the same set of slots in any order; but the kernel reads every slot of
  each logical block but the last, and only the first k of the last. Sorted,
  the partly filled block may sit in the middle, read whole with its empty
  slots, while a full block becomes the last and is cut to k slots;
- the last token's own K/V is written where the sorted table says, over
  another token's.

Nothing of the engine changes: the forwards run on a copy of its pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.core.errors import PagedLabError
from backend.engine.beams import log_probs
from backend.engine.engine import Engine
from backend.engine.prompts import next_token
from backend.engine.results import logit_tolerance
from backend.kernels import KernelBackend, StepPlan
from backend.models.batch import ForwardBatch

TOP_K = 5


@dataclass(slots=True)
class _PoolCopy:
    """The engine's K/V tensors, cloned: the what-if's forwards write into these."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]


class _Recording:
    """The engine's kernels, keeping each layer's attention output of the last token."""

    def __init__(self, inner: KernelBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.device = inner.device
        self.outputs: list[torch.Tensor] = []

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        self.inner.write_kv(key, value, k_cache, v_cache, slot_mapping)

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, *,
                        out: torch.Tensor | None = None, num_splits: int | None = None,
                        check_bounds: bool | None = None,
                        plan: StepPlan | None = None) -> torch.Tensor:
        result = self.inner.paged_attention(query, k_cache, v_cache, block_tables, seq_lens,
                                            query_start_loc, scale, out=out,
                                            num_splits=num_splits, check_bounds=check_bounds,
                                            plan=plan)
        self.outputs.append(result[-1].detach().float().cpu().clone())
        return result

    def copy_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        self.inner.copy_blocks(src_cache, dst_cache, src_ids, dst_ids)


@dataclass(frozen=True, slots=True)
class Reading:
    """The last token's forward through one order of the request's blocks."""

    table: list[int]                       # the block table the forward read through
    logits_diff: float                     # max |logits - the engine's pending logits|
    # The token the engine's sampling draws; None for a beam, which no draw picks: the
    # search keeps its group's best extensions by cumulative log-probability.
    next_token: int | None
    top: list[tuple[int, float]]           # (token, probability), most probable first
    attention: list[torch.Tensor]          # per layer: the last token's output [H, D]


@dataclass(frozen=True, slots=True)
class OrderWhatIf:
    """Table order against physical order for one request's next token."""

    request: str
    position: int                          # the last token's position
    tokens: list[int]                      # the request's tokens at the time
    block_size: int
    table_order: Reading
    physical_order: Reading
    tolerance: float                       # logits closer than this are float rounding

    def blocks_as_read(self, order: list[int]) -> list[list[int]]:
        """The request's tokens block by block, in the order `order` reads its blocks."""
        bs = self.block_size
        logical = {b: i for i, b in enumerate(self.table_order.table)}
        return [self.tokens[logical[b] * bs:(logical[b] + 1) * bs] for b in order]

    def slots_read(self, order: list[int]) -> list[list[int | None]]:
        """What the forward through `order` reads, block by block and slot by slot: a
        token whose K/V sits in the slot, or None for a slot past the block's filled
        ones (zeros, or K/V a former holder of the block left there).

        Every block but the last is read whole (a partly filled one with its empty
        slots); the last only up to the last token's position within a block, and the
        slot at that position holds the last token, written there by this forward
        (over another token's, when `order` is not the table's).
        """
        bs = self.block_size
        read: list[list[int | None]] = []
        for block in self.blocks_as_read(order):
            read.append([*block, *[None] * (bs - len(block))])
        last = self.position % bs
        read[-1] = read[-1][:last + 1]
        read[-1][last] = self.tokens[self.position]
        return read

    def overwritten(self, order: list[int]) -> int | None:
        """The position of the token whose K/V the forward through `order` writes the
        last token's over (in the slot `slots_read` shows the last token in), or None
        when that slot is the last token's own (the table's order, or a sorted table
        whose last block stayed last). Any other block read last is full: every block
        of a table but its last is."""
        if order[-1] == self.table_order.table[-1]:
            return None
        logical = self.table_order.table.index(order[-1])
        return logical * self.block_size + self.position % self.block_size

    @property
    def last_block_stays(self) -> bool:
        """Whether sorting keeps the request's last block last (it has the highest id):
        then the same slots are read and the new K/V written to the same one."""
        return self.physical_order.table[-1] == self.table_order.table[-1]

    @property
    def physical_changed(self) -> bool:
        """Whether the sorted reading moved the logits past float rounding."""
        return self.physical_order.logits_diff > self.tolerance

    @property
    def sorted_already(self) -> bool:
        return self.table_order.table == self.physical_order.table

    @property
    def attention_diff(self) -> list[float]:
        """Per layer, max |physical - table| of the last token's attention output."""
        return [float((a - b).abs().max()) for a, b in
                zip(self.physical_order.attention, self.table_order.attention, strict=True)]


def physical_order(engine: Engine, request_id: str) -> OrderWhatIf:
    """Reads only (on a copy of the pool): the what-if of the module docstring.

    Raises PagedLabError unless the request is running with its logits.
    """
    with engine.lock:
        req = engine.request(request_id)
        if req.status != "running" or req.prefilling or req.logits is None:
            raise PagedLabError(f"request {request_id!r} must be running with its prompt "
                                "computed: the what-if recomputes its next-token prediction")
        table = engine.manager.block_table(request_id)
        pending = req.logits.float().cpu()
        position = req.num_tokens - 1
        tokens = list(req.tokens)
        last = tokens[-1]
        # One copy per reading: the sorted one writes the last token's K/V over another's.
        copies = [_PoolCopy([t.clone() for t in engine.cache.k],
                            [t.clone() for t in engine.cache.v]) for _ in range(2)]
        beam = req.beam_width is not None
    readings = [_read(engine, copy, t, request_id, last, position, pending, beam)
                for copy, t in zip(copies, (table, sorted(table)), strict=True)]
    return OrderWhatIf(request_id, position, tokens, engine.config.block_size,
                       readings[0], readings[1], logit_tolerance(engine.config.dtype))


def _read(engine: Engine, pool: _PoolCopy, table: list[int], request_id: str, token: int,
          position: int, pending: torch.Tensor, beam: bool) -> Reading:
    bs = engine.config.block_size
    slot = table[position // bs] * bs + position % bs
    batch = ForwardBatch.build([([token], position, [slot], table)], engine.device)
    kernels = _Recording(engine.kernels)
    with torch.no_grad():
        out = engine.model.forward(batch, pool, kernels, check=False)
    logits = out.logits[0].float().cpu()
    # Over the tokens the model may emit (tiny-byte: printable bytes), as its sampling.
    probs = torch.exp(log_probs(logits, engine.model.vocab_size == 256))
    top = torch.topk(probs, TOP_K)
    # The token the engine would draw from these logits (its seeded sampling).
    drawn = None if beam else next_token(logits, engine.config, engine.model, request_id,
                                         position + 1)
    return Reading(list(table), float((logits - pending).abs().max()), drawn,
                   [(int(t), float(p)) for p, t in zip(top.values, top.indices, strict=True)],
                   kernels.outputs)
