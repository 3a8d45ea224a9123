"""The contiguous arena's ASCII memory map: its segments, one glyph per slot or group.

`ContiguousArena.render` hands its `segments` here. Drawing needs only the
segments and the capacity, never the arena, so this module sits beside
contiguous_types and below backend.lab.contiguous.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.lab.contiguous_types import SEGMENT_KINDS, Segment, SegmentKind

# One glyph per kind for the text rendering (legend printed with it).
GLYPHS: dict[SegmentKind, str] = {
    "token_states": "#", "reservation": "+", "internal_fragmentation": "~",
    "external_fragmentation": "x", "free": ".",
}


def _dominant_kind(counts: dict[SegmentKind, int]) -> SegmentKind:
    """The state holding most slots of a rendered cell; ties go to the one listed first."""
    return max(SEGMENT_KINDS, key=lambda k: (counts.get(k, 0), -SEGMENT_KINDS.index(k)))


def _dominant_owner(counts: dict[str, int]) -> str:
    """First character of the request holding most slots of a cell, or a blank."""
    return max(counts, key=lambda r: counts[r])[:1] if counts else " "


def render_segments(segments: Sequence[Segment], capacity: int, *, width: int) -> str:
    """An ASCII memory map of `capacity` slots, `width` characters wide at most.

    With more slots than `width`, each character stands for
    ceil(capacity / width) slots and shows the state holding most of them.
    The owner line shows each region's owner (first character of its id).
    """
    per = -(-capacity // width)
    cells = -(-capacity // per)
    kinds: list[dict[SegmentKind, int]] = [{} for _ in range(cells)]
    owners: list[dict[str, int]] = [{} for _ in range(cells)]
    for seg in segments:
        pos, end = seg.start, seg.start + seg.length
        while pos < end:
            cell = pos // per
            take = min(end, (cell + 1) * per) - pos
            kinds[cell][seg.kind] = kinds[cell].get(seg.kind, 0) + take
            if seg.owner is not None:
                owners[cell][seg.owner] = owners[cell].get(seg.owner, 0) + take
            pos += take
    kind_line = "".join(GLYPHS[_dominant_kind(c)] for c in kinds)
    owner_line = "".join(_dominant_owner(o) for o in owners)
    scale = "1 slot" if per == 1 else f"{per} slots"
    # Legend lines of at most 40 characters: a phone's code block (390 px) shows about
    # that many; the arena lines above scroll sideways only where they are longer.
    legend = ("# token  + reservation  ~ internal frag.\n"
              "x external frag.  . free\n"
              f"one character = {scale}")
    return f"kind   {kind_line}\nowner  {owner_line.rstrip()}\n{legend}"
