"""Beam search run by the engine, on shared blocks.

`add` with `beam_width` W starts a group of beams from one prompt (ids
``ID.0``, ``ID.1``, ...). Each round, every live beam of the group has the
logits of its last token; each of its one-token extensions scores the beam's
cumulative log-probability plus the token's, and the best `keep` extensions
over the whole group survive (ties: lower token id, then the beam listed
first), where `keep` is W less the hypotheses already complete. Then, through
the block manager and with its events:

- a beam with no surviving extension is finished ("dropped"): its blocks'
  reference counts fall, and those only it held go back to the pool;
- a beam with one survivor takes that token; one with k survivors keeps the
  best and forks k - 1 children (new ids, in score order) that share all its
  blocks, so the next write to their shared last block copies it
  (copy-on-write);
- an extension that is the end-of-sequence token is a complete hypothesis:
  it finishes ("eos") without taking a slot, by the beam itself if that was
  its only survivor, else as a new finished request that never held a block.

The first round starts from ID.0 alone, so ID.0 .. ID.{W-1} are the first W
extensions in score order. The group decodes as one: a round runs only when
all its live beams are running with their logits; the scheduler admits,
preempts and swaps a group's beams together (backend/engine/scheduler.py), and
a beam's fork joins the running list beside its group, so the group stays
together there.

`reference_search` is the same search with no paging at all: every beam a
contiguous token list recomputed from scratch by the model. Tests hold the
engine to it token for token and score for score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from backend.engine.request import Request
from backend.engine.sampling import PRINTABLE_HI, PRINTABLE_LO
from backend.models.base import LanguageModel

if TYPE_CHECKING:
    from backend.engine.engine import Engine


@dataclass(frozen=True, slots=True)
class Extension:
    """One surviving one-token extension of a beam."""

    beam: int         # index of the beam it extends, in the round's order
    token: int
    score: float      # the beam's cumulative log-probability with this token


def log_probs(logits: torch.Tensor, byte_model: bool) -> torch.Tensor:
    """float64 log-probabilities [..., vocab] from float32 logits [..., vocab].

    For tiny-byte, as its sampling does, only printable ASCII may be chosen, so
    the distribution is renormalised over those bytes (the others are -inf).
    """
    scores = logits.detach().to("cpu", torch.float64)
    if byte_model:
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
        allowed[PRINTABLE_LO:PRINTABLE_HI + 1] = True
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def select(beams: Sequence[tuple[float, torch.Tensor]], keep: int) -> list[Extension]:
    """The `keep` best extensions of `beams` ((cumulative log-prob, log-probs) each),
    best first: by score, then lower token id, then the beam listed first."""
    found: list[tuple[float, int, int]] = []
    for b, (cum, lp) in enumerate(beams):
        # A stable descending sort lists equal log-probabilities by token id, so a
        # beam's first `keep` entries are its best `keep` under the tie rule too.
        values, tokens = torch.sort(lp, descending=True, stable=True)
        for v, t in zip(values[:keep].tolist(), tokens[:keep].tolist(), strict=True):
            if v != float("-inf"):
                found.append((-(cum + v), t, b))
    found.sort()
    return [Extension(b, t, -s) for s, t, b in found[:keep]]


def group_members(requests: dict[str, Request], group: str) -> list[Request]:
    """Every beam of `group`, finished ones included, in the order they were created."""
    return [r for r in requests.values() if r.group == group and r.beam_width is not None]


def keep_count(members: Sequence[Request]) -> int:
    """How many extensions a round keeps: the width less the beams that finished, by
    end-of-sequence or the token limit (complete hypotheses) or by a `finish` (which
    keeps its place too); dropped ones do not count."""
    width = members[0].beam_width
    assert width is not None
    done = sum(1 for r in members
               if r.status == "finished" and r.finish_reason not in ("dropped", None))
    return max(0, width - done)


def next_index(members: Sequence[Request], requests: Mapping[str, Request],
               start: int | None = None) -> int:
    """The number the group's next new beam takes (ID.k): the first from `start` (by
    default one past the group's largest so far) that no request holds. A request the
    user added or forked may have taken ID.k already: the beam numbers around it."""
    index = 1 + max(int(r.id.rsplit(".", 1)[1]) for r in members) if start is None else start
    group = members[0].group
    while f"{group}.{index}" in requests:
        index += 1
    return index


def run_round(engine: Engine, live: list[Request]) -> list[tuple[Request, int]]:
    """Mutates: one round of `live`'s group (all its running beams, with their logits).

    Drops, forks and finishes as the module docstring says, and returns the
    beams that go on with the token each appends now (the caller gives each a
    slot, in this order, and runs the batched forward). Empty if the group had
    to be preempted for room: what the round decided is then only its drops
    and finished beams, and it is run again, on the same beams, when the group
    is back.
    """
    sched = engine.scheduler
    members = group_members(engine.requests, live[0].group or "")
    keep = keep_count(members)
    # Best first (running order among equal scores): the order `select` breaks ties in.
    order = sorted(live, key=lambda r: -(r.cum_logprob or 0.0))
    byte_model = engine.model.vocab_size == 256
    scored = []
    for req in order:
        assert req.logits is not None and req.cum_logprob is not None
        scored.append((req.cum_logprob, log_probs(req.logits, byte_model)))
    chosen = select(scored, keep)
    eos = engine.model.eos_token_id
    goes: dict[int, list[Extension]] = {}
    for ext in chosen:
        if ext.token != eos:
            goes.setdefault(ext.beam, []).append(ext)
    ends = {ext.beam: ext for ext in chosen if ext.token == eos}
    # Beams with no survivor go first: their blocks are what the others may need.
    # One whose only survivor is the end-of-sequence token ends with it itself.
    for b, req in enumerate(order):
        if b in goes:
            continue
        if b in ends:
            _complete(engine, req, ends[b])
        else:
            sched.finish(req, "dropped")
    going = [(order[b], exts) for b, exts in sorted(goes.items())]
    if not going:
        return []
    # Each beam's next token, and one more per fork: a new block where its last block
    # is full, else a copy for every writer of the shared last block but the last.
    need = sum(engine.manager.blocks_needed_to_append(req.id, 1) + len(exts) - 1
               for req, exts in going)
    held = {b for req, _ in going for b in engine.manager.block_table(req.id)}
    if len(held) + need > engine.config.num_blocks:
        for req, _ in going:
            sched.finish(req, "capacity")
        return []
    if not sched.make_room_for([req for req, _ in going], need):
        return []
    # New beams (forks, and complete hypotheses beside a beam that goes on) are
    # numbered in score order.
    index = next_index(members, engine.requests)
    out: list[tuple[Request, int]] = []
    first = {exts[0] for _, exts in going}
    for ext in chosen:
        parent = order[ext.beam]
        if ext.beam not in goes:
            continue                     # its beam ended with it above
        if ext in first:
            parent.cum_logprob = ext.score
            out.append((parent, ext.token))
            continue
        child = Request(f"{parent.group}.{index}", parent.prompt_len, list(parent.tokens),
                        parent.max_new_tokens, arrival=len(engine.requests),
                        parent=parent.id, group=parent.group,
                        beam_width=parent.beam_width, cum_logprob=ext.score,
                        cache_salt=parent.cache_salt)
        engine.requests[child.id] = child
        index = next_index(members, engine.requests, index + 1)
        if ext.token == eos:
            # A complete hypothesis: it never needs a slot.
            child.tokens.append(ext.token)
            child.status = "finished"
            child.finish_reason = "eos"
            sched.outcome.finished.append(child.id)
            sched.outcome.generated.append((child.id, ext.token))
            engine.timeline.forked(parent.id, child.id)
            engine.timeline.generated(child.id)
            continue
        engine.manager.fork(parent.id, child.id)
        sched.insert_fork(parent, child)
        engine.timeline.forked(parent.id, child.id)
        out.append((child, ext.token))
    # Every fork exists before any beam writes, so the writes to a shared last block
    # copy it for all writers but the last.
    return out


def _complete(engine: Engine, req: Request, ext: Extension) -> None:
    """Mutates: `req` ends with the end-of-sequence token, a complete hypothesis."""
    engine.scheduler.finish(req, "eos")
    req.tokens.append(ext.token)
    req.cum_logprob = ext.score
    engine.scheduler.outcome.generated.append((req.id, ext.token))
    engine.timeline.generated(req.id)


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A finished beam of `reference_search`."""

    tokens: list[int]
    cum_logprob: float
    reason: str


def reference_search(model: LanguageModel, prompt: list[int], width: int,
                     max_new_tokens: int) -> tuple[list[Hypothesis], list[list[Hypothesis]]]:
    """Beam search with no paging and no cache: each round recomputes every live beam
    from its whole token list (`forward_contiguous`) and applies `select`.

    Returns (every finished hypothesis, in the order the rounds finished them, the
    beams alive after the last round last, as "max_new_tokens"; the live beams
    after each round, best first).
    """
    byte_model = model.vocab_size == 256
    eos = model.eos_token_id
    beams = [Hypothesis(list(prompt), 0.0, "live")]
    finished: list[Hypothesis] = []
    rounds: list[list[Hypothesis]] = []
    for _ in range(max_new_tokens):
        keep = width - len(finished)
        if keep <= 0 or not beams:
            break
        scored = [(b.cum_logprob,
                   log_probs(model.forward_contiguous(b.tokens).logits[-1], byte_model))
                  for b in beams]
        live: list[Hypothesis] = []
        for ext in select(scored, keep):
            tokens = [*beams[ext.beam].tokens, ext.token]
            if ext.token == eos:
                finished.append(Hypothesis(tokens, ext.score, "eos"))
            else:
                live.append(Hypothesis(tokens, ext.score, "live"))
        beams = live
        rounds.append(live)
    finished += [Hypothesis(b.tokens, b.cum_logprob, "max_new_tokens") for b in beams]
    return finished, rounds
