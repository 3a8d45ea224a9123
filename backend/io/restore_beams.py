"""Restore's checks of beam search fields (`beam_width`, `cum_logprob`).

A beam carries its group's width and its cumulative log-probability; every
beam of a group has the same width, is named GROUP.k, and the group's beams
in one queue stand side by side there, as the scheduler keeps them (it
admits, preempts and swaps a group as one unit). A snapshot that breaks any
of these is refused before anything is restored.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from backend.core.checks import shown
from backend.core.errors import PagedLabError
from backend.engine.ops import MAX_SAMPLES
from backend.engine.request import Request
from backend.io.json_input import FieldReader


def beam_fields(r: FieldReader, group: str | None, max_new: int | None,
                reason: str | None) -> tuple[int | None, float | None]:
    """(beam_width, cum_logprob) of one request, both None unless it is a beam."""
    width = r.get("beam_width", int, optional=True)
    cum = r.get("cum_logprob", (int, float), optional=True)
    if width is None:
        if cum is not None:
            raise PagedLabError(f"{r.where}.cum_logprob belongs to a beam (with beam_width)")
        if reason == "dropped":
            raise PagedLabError(f"{r.where}: only a beam is dropped")
        return None, None
    if not 1 <= width <= MAX_SAMPLES:
        raise PagedLabError(f"{r.where}.beam_width must be in 1..{MAX_SAMPLES}")
    if group is None:
        raise PagedLabError(f"{r.where}: a beam carries the group it belongs to")
    if "cum_logprob" not in r.data:
        raise PagedLabError(f"{r.where}: missing field 'cum_logprob' (a beam carries its "
                            "cumulative log-probability)")
    if cum is None or not math.isfinite(cum) or cum > 0:
        raise PagedLabError(f"{r.where}.cum_logprob must be a finite log-probability "
                            f"(<= 0), got {shown(cum)}")
    if max_new is None:
        raise PagedLabError(f"{r.where}: a beam has a max_new_tokens limit")
    return width, float(cum)


def check_beam_groups(requests: dict[str, Request], queues: dict[str, Sequence[str]]) -> None:
    """Group-wide rules: one width and one token limit per group (a beam is forked with
    its parent's), at most that many beams alive (each round keeps the width's best),
    and each queue's beams of a group adjacent."""
    widths: dict[str, int] = {}
    limits: dict[str, int | None] = {}
    alive: Counter[str] = Counter()
    for req in requests.values():
        if req.beam_width is None:
            continue
        assert req.group is not None
        if widths.setdefault(req.group, req.beam_width) != req.beam_width:
            raise PagedLabError(f"snapshot: the beams of group {req.group!r} have different "
                                "beam_width values")
        if limits.setdefault(req.group, req.max_new_tokens) != req.max_new_tokens:
            raise PagedLabError(f"snapshot: the beams of group {req.group!r} have different "
                                "max_new_tokens values (a beam is forked with its parent's)")
        if req.status != "finished":
            alive[req.group] += 1
            if alive[req.group] > req.beam_width:
                raise PagedLabError(
                    f"snapshot: group {req.group!r} has {alive[req.group]} beams alive, more "
                    f"than its beam_width {req.beam_width} (each round keeps that many)")
        suffix = req.id[len(req.group) + 1:]
        if not suffix.isdigit():
            raise PagedLabError(f"snapshot: beam {req.id!r} is not named {req.group}.<k>")
    for name, queue in queues.items():
        seen: set[str] = set()
        previous: str | None = None
        for rid in queue:
            req = requests[rid]
            group = req.group if req.beam_width is not None else None
            if group is not None and group != previous and group in seen:
                raise PagedLabError(f"snapshot.scheduler.{name}: the beams of group {group!r} "
                                    "are not side by side")
            if group is not None:
                seen.add(group)
            previous = group
