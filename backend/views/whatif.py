"""The physical-order what-if's verdict in words (backend/engine/whatif.py computes it).

The explanation comes from what sorting did to the table (whether the last block stayed
last), the size of the change from the logits against the dtype's tolerance: a small
change is not called a change, and the cause named is the one the tables show.
"""

from __future__ import annotations

from backend.engine.whatif import OrderWhatIf, Reading

_ANOTHER_LAST = ("Sorted, another block is read last, cut to the last token's position, and "
                 "the new K/V is written into it over another token's")


def outcome(w: OrderWhatIf) -> str:
    """What sorting did to the request's next-token prediction, and why."""
    diffs = ", ".join(f"layer {i}: {d:.3g}" for i, d in enumerate(w.attention_diff))
    moved = (f"The last token's attention output moved by at most "
             f"{max(w.attention_diff):.3g} ({diffs}) and its logits by "
             f"{w.physical_order.logits_diff:.3g}")
    if w.sorted_already:
        return moved + "."
    rounding = f"within float rounding (under {w.tolerance:g})"
    if w.last_block_stays:
        return (moved + (f", {rounding}" if not w.physical_changed else "") + ". Sorted, "
                "the request's last block stays last (it has the highest number), so the "
                "kernel reads the same slots and writes the new K/V to the same one; each key "
                "carries its position, so the same keys in another order sum the same. "
                "Shuffle the pool until the last block is not the highest-numbered, and "
                "sorting changes the reading.")
    if not w.physical_changed:
        return (moved + f", {rounding}. {_ANOTHER_LAST}; the slots that changed carried "
                "little of the attention.")
    drawn = w.table_order.next_token
    same = drawn == w.physical_order.next_token
    return (moved + f". {_ANOTHER_LAST}: what attention read changed, and with it the "
            "next-token distribution (the tables of probabilities)"
            + (". " + ("The seeded draw happens to give the same token." if same else
                       "The seeded draw gives another token.") if drawn is not None
               else ", from which the beam search picks its group's best extensions."))


def draw_note(r: Reading, temperature: float | None, top_p: float | None) -> str:
    """Why the drawn token is missing from the table of the most likely ones ('' when it
    is there): the draw samples, with the engine's settings, while the table lists the
    model's plain (temperature 1) probabilities. `temperature` and `top_p` are the ones
    the draw used (None: plain softmax, no nucleus)."""
    if r.next_token is None or any(t == r.next_token for t, _ in r.top):
        return ""
    how = [f"temperature {temperature:g}" if temperature is not None else "temperature 1"]
    if top_p is not None:
        how.append(f"top-p {top_p:g}")
    return (f" (a seeded draw at {', '.join(how)}: not among the {len(r.top)} most likely "
            "below, the plain probabilities)")
