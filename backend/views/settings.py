"""An engine's config as read-only rows: what the Scenarios page's sidebar lists.

A scenario runs on its own engine with the config its file sets, so the
Playground's pool fields would change nothing there; the sidebar shows these
rows instead. Pure functions of an EngineConfig, like the other views.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from backend.core.config import TINY_BYTE, EngineConfig, ModelDims
from backend.models.registry import ModelCard
from backend.views.model import format_bytes

# The Playground's words for the two allocation orders (its sidebar's radio).
ALLOCATION_WORDS = {"fifo": "queue order", "random": "scattered"}


# The scheduler budgets in vLLM's terms: the sidebar's help and the read-only rows.
BUDGET_HELP = {
    "max_num_seqs": "vLLM's max_num_seqs: at most this many requests run in one scheduler "
                    "iteration, decoding and prefilling together; the rest wait. 0: no limit "
                    "(blank where none is set).",
    "max_num_batched_tokens": "vLLM's max_num_batched_tokens: at most this many tokens are "
                              "processed in one iteration, prefill and decode together. "
                              "Running requests decode first (one token each), then prompts "
                              "still prefilling, then admissions; a longer prompt is prefilled "
                              "in chunks over several steps (chunked prefill). 0: no "
                              "limit (blank where none is set).",
    "watermark_blocks": "vLLM's watermark: a waiting request is admitted only if this many "
                        "blocks stay free after it takes its own, so running requests keep "
                        "room to grow instead of being preempted. Less than the pool size. "
                        "0: none.",
    "preemption": "What a preempted request does with its blocks. Recompute: they are "
                  "released, and its tokens are prefilled again when it is readmitted. Swap: "
                  "its K/V is copied to a host block pool and back when there is room "
                  "(vLLM v0's swap space); a victim that does not fit there is recomputed.",
    "num_cpu_blocks": "Blocks of the host pool that swap copies K/V to (vLLM's swap space), "
                      "drawn beside the device pool.",
}


@dataclass(frozen=True, slots=True)
class SettingItem:
    label: str
    value: str
    help: str


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def config_items(config: EngineConfig) -> list[SettingItem]:
    """Every setting that shapes a run, formatted, each with what it means."""
    c = config
    model = (f"{c.model} ({c.num_layers} layers, {c.num_heads} heads, "
             f"{c.num_kv_heads} KV heads, head dim {c.head_dim})")
    model_help = ("The model whose K/V the blocks hold: bytes in, bytes out."
                  if c.model == TINY_BYTE else
                  "A real model whose K/V the blocks hold; its tokenizer makes the tokens.")
    items = [
        SettingItem("Pool size", _count(c.num_blocks, "block"), "Physical KV blocks in the pool."),
        SettingItem("Block size", _count(c.block_size, "slot"), "Token positions per block."),
        SettingItem("Allocation", ALLOCATION_WORDS.get(c.allocation, c.allocation),
                    "Which free block a request gets: the queue's front, or a seeded random "
                    "one."),
        SettingItem("Prefix caching", "on" if c.prefix_caching else "off",
                    "Whether full prompt blocks already cached are shared rather than "
                    "recomputed."),
        SettingItem("Model", model, model_help),
        SettingItem("dtype", c.dtype, "The K/V tensors' element type."),
        SettingItem("K/V per block", format_bytes(c.bytes_per_block),
                    "2 (K and V) × layers × KV heads × head dim × block size × bytes per "
                    "element."),
        SettingItem("Seed", str(c.seed), "Seeds the model weights, random prompts and "
                                         "sampling."),
        SettingItem("Default max new tokens",
                    "no limit" if c.max_new_tokens is None else str(c.max_new_tokens),
                    "For requests added without their own limit."),
    ]
    if c.temperature is not None:
        items.append(SettingItem("Temperature", f"{c.temperature:g}",
                                 "0 picks the most likely token; higher spreads the choice."))
    if c.top_p is not None:
        items.append(SettingItem("Top-p", f"{c.top_p:g}",
                                 "Sampling keeps the most likely tokens up to this total "
                                 "probability."))
    # vLLM's scheduler budgets, only when set: a scenario without them has no limits.
    if c.max_num_seqs is not None:
        items.append(SettingItem("Max running requests", str(c.max_num_seqs),
                                 BUDGET_HELP["max_num_seqs"]))
    if c.max_num_batched_tokens is not None:
        items.append(SettingItem("Token budget per step",
                                 _count(c.max_num_batched_tokens, "token"),
                                 BUDGET_HELP["max_num_batched_tokens"]))
    if c.watermark_blocks is not None:
        items.append(SettingItem("Watermark", _count(c.watermark_blocks, "block"),
                                 BUDGET_HELP["watermark_blocks"]))
    if c.preemption == "swap":
        items.append(SettingItem("Preemption", f"swap to {_count(c.num_cpu_blocks, 'host block')}",
                                 BUDGET_HELP["preemption"]))
    return items


def format_count(n: int) -> str:
    """134515008 -> '134.5M', 61504 -> '61.5k': a parameter count at a glance."""
    # Rounded before the unit is chosen: 999,950 read "1000.0k".
    if n >= 999_950:
        return f"{n / 1e6:.1f}M"
    if n >= 1_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


def model_cost_text(card: ModelCard, *, loaded: bool) -> str:
    """What a model costs in this process, as one line for the model picker's caption:
    parameters, K/V bytes per token, its weights and whether they are loaded."""
    weights = format_bytes(card.weight_bytes)
    if card.shared_weights:
        where = (f"{weights} of weights, shared by every session; "
                 + ("loaded in this process" if loaded else
                    "not loaded yet: the first engine loads them (seconds)"))
    else:
        where = f"{weights} of seeded weights, built per engine in milliseconds"
    return (f"{format_count(card.num_parameters)} parameters, {card.num_layers} layers · "
            f"K/V {format_bytes(card.kv_bytes_per_token)} per token · {where}.")


def fixed_dims_text(model: str, dims: ModelDims) -> str:
    """Why a real model has no size fields: its weights fix them."""
    return (f"{model}'s weights fix its shape: {dims.num_layers} layers, {dims.num_heads} "
            f"heads sharing {dims.num_kv_heads} KV heads, head dim {dims.head_dim}, "
            f"a vocabulary of {dims.vocab_size:,} tokens, a context of "
            f"{dims.context_length:,} (the most tokens a request may hold).")


def config_html(items: list[SettingItem]) -> str:
    """The rows as a compact list; each value carries its label (`data-label`), like metrics."""
    rows = "".join(
        f"<div title='{escape(i.help, quote=True)}' style='display:flex;"
        f"justify-content:space-between;gap:8px;padding:1px 0;border-bottom:1px solid #EEE'>"
        f"<span style='color:#555'>{escape(i.label)}</span>"
        f"<b style='text-align:right' data-label='{escape(i.label, quote=True)}'>"
        f"{escape(i.value)}</b></div>" for i in items)
    return f"<div class='pl-scenario-config' style='font-size:13px'>{rows}</div>"
