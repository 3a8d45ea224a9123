"""Beam search groups in a snapshot: each beam's text and score, and what sharing saved.

A beam carries `group`, `beam_width` and `cum_logprob` (CONTRACT.md); the
rows here are what the Playground shows beside the block tables, so a user
reads which beams are alive, which ended and why, and how many blocks the
live beams hold against the copies they would hold each on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from backend.core.words import counted, percent_of
from backend.views.model import status_text
from backend.views.tokens import Snapshot, answer_tokens, token_text

BEAM_COLUMNS = ["beam", "status", "log p", "generated text", "blocks"]

_ORDER = {"running": 0, "waiting": 1, "swapped": 1, "finished": 2}


@dataclass(frozen=True, slots=True)
class BeamGroup:
    """One search: its width, its beams by state, and the blocks its live beams hold."""

    group: str
    width: int
    live: int
    complete: int        # complete hypotheses: ended by end-of-sequence or max_new_tokens
    dropped: int
    # Ended by a Finish: no hypothesis the search found, though it keeps its place in the
    # width (backend.engine.beams.keep_count: later rounds keep W less both kinds).
    stopped: int
    held_blocks: int     # distinct device blocks the live beams hold
    unshared_blocks: int  # the sum of their table lengths: each holding its own copy

    @property
    def summary(self) -> str:
        saved = ""
        if self.unshared_blocks:
            pct = percent_of(self.unshared_blocks - self.held_blocks, self.unshared_blocks)
            saved = (f"; the live beams hold {counted(self.held_blocks, 'block')}, "
                     f"{self.unshared_blocks} without sharing ({pct} saved)")
        stopped = f", {self.stopped} finished by hand" if self.stopped else ""
        return (f"{self.group}: width {self.width} · {self.live} live, {self.complete} "
                f"complete, {self.dropped} dropped{stopped}{saved}")


def beam_groups(snap: Snapshot) -> list[BeamGroup]:
    """Every beam search in the snapshot, in the order the groups were added."""
    by_group: dict[str, list[dict]] = {}
    for req in snap["requests"]:
        if "beam_width" in req:
            by_group.setdefault(req["group"], []).append(req)
    out = []
    for group, beams in by_group.items():
        live = [r for r in beams if r["status"] != "finished"]
        reasons = [r.get("finish_reason") for r in beams if r["status"] == "finished"]
        held = {b for r in live if r["status"] == "running" for b in r["block_table"]}
        unshared = sum(len(r["block_table"]) for r in live if r["status"] == "running")
        out.append(BeamGroup(group, int(beams[0]["beam_width"]), len(live),
                             sum(1 for x in reasons if x not in ("dropped", "finished")),
                             reasons.count("dropped"), reasons.count("finished"), len(held),
                             unshared))
    return out


def beams_frame(snap: Snapshot, group: str) -> pd.DataFrame:
    """One row per beam of `group`: live beams best first, then finished ones (complete
    hypotheses and any finished by hand) best first, then dropped ones; with the text
    each generated."""
    rows = []
    for req in snap["requests"]:
        if "beam_width" not in req or req["group"] != group:
            continue
        reason = req.get("finish_reason")
        rank = 3 if reason == "dropped" else _ORDER.get(req["status"], 1)
        rows.append((rank, -float(req["cum_logprob"]), {
            # As the block tables say it: "finished (eos)", "finished (by hand)".
            "beam": req["id"], "status": status_text(req),
            "log p": round(float(req["cum_logprob"]), 3),
            "generated text": token_text(snap, answer_tokens(snap, req)),
            "blocks": len(req["block_table"]),
        }))
    rows.sort(key=lambda r: (r[0], r[1]))
    return pd.DataFrame([r[2] for r in rows], columns=BEAM_COLUMNS)
