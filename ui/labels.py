"""The sidebar's names for config fields, for refusals that would otherwise name them as
the scenario format does (num_blocks, max_num_seqs): the sidebar's own checks, and an
operation the Playground's scheduler settings refuse."""

from __future__ import annotations

import re

from backend.sessions.forms import NO_LIMIT_AT_0

# What each config field is called on screen (without its unit, which a refusal's
# numbers follow).
FIELD_LABELS = {
    "num_blocks": "Pool size", "block_size": "Block size",
    "num_layers": "Layers", "head_dim": "Head dim", "num_heads": "Heads",
    "num_kv_heads": "KV heads", "seed": "Seed", "max_new_tokens": "Default max new tokens",
    "max_num_seqs": "Max running requests", "max_num_batched_tokens": "Token budget per step",
    "watermark_blocks": "Watermark", "num_cpu_blocks": "Host pool",
    "temperature": "Temperature", "top_p": "Top-p",
}
_FIELD_NAME = re.compile(r"\b(" + "|".join(FIELD_LABELS) + r")\b")
# The backend's range check, said as the page's other number fields say it (ui/numbers.py).
_RANGE = re.compile(r"must be an integer in ([\d,-]+)\.\.([\d,]+), got ([\d,-]+)")
# The scheduler settings an operation's refusal names (backend/engine/operations.py).
# Only these: an operation's "max_new_tokens" is its own limit, not the sidebar's default.
_SCHEDULER_NAME = re.compile(r"\b(max_num_seqs|max_num_batched_tokens)\b")


def labelled(problem: str) -> str:
    """A refusal of the sidebar's config in the sidebar's words: "settings: num_blocks
    must be an integer in 1..65,536, got 0" reads "Pool size must be 1 to 65,536; got 0",
    as a refused Steps or Max new tokens field does. A refusal of several fields has a
    line for each."""
    return "\n".join(_labelled_line(line) for line in problem.splitlines())


def _labelled_line(problem: str) -> str:
    text = problem.removeprefix("settings: ")
    field = _FIELD_NAME.search(text)
    limit = field is not None and field.group(1) in NO_LIMIT_AT_0

    def said(m: re.Match[str]) -> str:
        # A limit's field takes blank or 0 too (no limit): say so where its range does not.
        either = ", or blank or 0 for no limit" if limit and m[1] != "0" else ""
        return f"must be {m[1]} to {m[2]}{either}; got {m[3]}"

    text = _RANGE.sub(said, text)
    text = _FIELD_NAME.sub(lambda m: FIELD_LABELS[m.group(1)], text)
    # Each line a sentence of its own, with or without the prefix ("the model's weights
    # would take …").
    return text[:1].upper() + text[1:]


def op_refusal(problem: str) -> str:
    """An operation's refusal as the Playground says it: "2 requests are running and
    max_num_seqs is 2" reads "… and Max running requests (sidebar, Scheduler) is 2"."""
    return _SCHEDULER_NAME.sub(lambda m: f"{FIELD_LABELS[m.group(1)]} (sidebar, Scheduler)",
                               problem)
