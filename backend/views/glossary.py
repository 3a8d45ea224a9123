"""What the pages' terms mean, a sentence each: the tooltips on metrics, checks, columns, events.

One place for the words, so a metric's tooltip on the Playground and the same
number's tooltip in a scenario's checks say the same thing. Keys are the
snapshot's own names (CONTRACT.md): `metrics.<key>`, `requests.<id>.<key>`, ...
"""

from __future__ import annotations

EVENTS: dict[str, str] = {
    "alloc": "A request took a free block (the free queue's front, or a seeded random one).",
    "free": "A request let go of a block: its reference count fell by one. At 0 the block is "
            "free, or cached if it is full (prompt or generated tokens) and prefix caching "
            "is on.",
    "share": "A block got one more holder (a fork): nothing is copied, its reference count "
             "rises.",
    "cow": "Copy-on-write: a request was about to write into a block other tables share, so "
           "it got a private copy first.",
    "prefix_hit": "A prompt's full block was found in the prefix cache: shared with the "
                  "requests holding it, or taken back from the free queue where it waited, "
                  "cached; not recomputed either way.",
    "evict": "A cached block was handed out again, so the K/V it kept for a prefix hit is "
             "gone.",
    "preempt": "The pool ran out: the most recently admitted request gave back its blocks; it "
               "waits and is recomputed later (or, with swap preemption, its K/V waits in "
               "the host pool).",
    "move": "A block's K/V was copied to another physical block and the tables rewritten "
            "(shuffle). A shuffle's moves happen together, as one permutation: each block's "
            "data lands where its move points, whatever order the log lists them in.",
    "swap_out": "Swap preemption: a block's K/V was copied to a block of the host pool, and "
                "the device block given back; the request waits there, nothing recomputed. "
                "Beams of one group that share a device block share its one host copy.",
    "swap_in": "A swapped request came back: its K/V was copied from the host pool into a "
               "device block it took again (a beam shares, rather than copies, a block "
               "another beam of its group brought back).",
    "fork": "A new request was made from another (a parallel sample, a beam, a fork op): it "
            "shares every block of its parent's table, nothing copied; its share events, "
            "one per block, are in the same step.",
}

METRICS: dict[str, str] = {
    "used_blocks": "Blocks held by at least one block table (ref count ≥ 1).",
    "free_blocks": "Empty blocks (ref count 0, no K/V kept), not counting cached ones; used + "
                   "cached + free is the pool.",
    "cached_blocks": "Blocks in the free queue (ref count 0) that still hold a full block's "
                     "K/V, reusable by a prefix hit until handed out again.",
    "filled_slots": "Token slots written in used blocks, each physical block counted once.",
    "internal_waste_slots": "Empty slots inside used blocks: the unfilled tail of each last "
                            "block (tail waste).",
    "shared_blocks": "Used blocks with ref count ≥ 2: forks and prefix hits.",
    "blocks_saved_by_sharing": "Block-table entries minus distinct used blocks: the blocks "
                               "sharing avoided.",
    "cow_copies": "Private copies made before writing into a shared, partly filled block.",
    "prefix_hit_blocks": "Prompt blocks served from the prefix cache instead of recomputed.",
    "prefix_hit_tokens": "The tokens in those blocks.",
    "prefix_queries": "Lookups in the prefix cache: one for each prompt admitted, and one "
                      "each time a preempted request's tokens are admitted again "
                      "(recomputed, or swapped back in). A prompt placed in blocks you "
                      "picked (Pin to blocks) is not looked up, so it is not counted.",
    "prefix_floor_tokens": "Prompt tokens a block-granular cache can never serve (a "
                           "snapshot's prefix_floor_tokens: past the floor of whole blocks "
                           "before the last token). The last "
                           "prompt token is always computed (its logits give the first new "
                           "token), so the block holding it is too: the partial last block, "
                           "or, for a prompt that fills its blocks exactly, the whole last "
                           "block (16 tokens in blocks of 4: 4 lost). Counted at each "
                           "lookup (see Prefix-cache queries), a swapped-in request's too, "
                           "though its host blocks bring that K/V back rather than a "
                           "recomputation.",
    "swapped": "Requests preempted by swap: their K/V waits in the host pool, holding no "
               "device block, until room lets them swap back in.",
    "preemptions": "Times a request's blocks were taken back because the pool ran out.",
}

REQUEST_FIELDS: dict[str, str] = {
    "status": "running (holds blocks), waiting (queued, holds none), swapped (preempted by "
              "swap: its K/V in the host pool) or finished (released them).",
    "block_table": "The request's block table: entry i is the physical block that holds its "
                   "logical block i.",
    "num_tokens": "Prompt and generated tokens so far.",
    "prompt_len": "Tokens in the prompt.",
    "num_preemptions": "Times this request was preempted: its blocks taken back, its K/V "
                       "recomputed when it resumes (or, with swap preemption, copied back "
                       "from the host pool).",
    "finish_reason": "Why it finished: by hand (Finish, or a finish operation), reached "
                     "its max new tokens, end of sequence, capacity (even an empty pool "
                     "could not hold its next token), context (it holds as many tokens as "
                     "a real model's context: its next one would have no position the "
                     "model was trained on), or dropped (a beam none of whose extensions a "
                     "round of beam search kept).",
    "tokens": "Token ids: bytes for the tiny-byte model, vocabulary ids for a real one.",
    "parent": "The request it was forked from: it shares all the parent's blocks at first.",
    "cache_salt": "Its cache salt (as vLLM's cache_salt): its blocks' keys are salted with "
                  "it, so it shares prefix-cache blocks only with requests of the same "
                  "salt, never with unsalted ones, whatever the tokens. Forks, samples and "
                  "beams inherit it.",
}

BLOCK_FIELDS: dict[str, str] = {
    "state": "used (in a table), cached (in the free queue, its K/V kept for a prefix hit) "
             "or free.",
    "ref_count": "How many block tables hold this block.",
    "num_filled": "Token slots written in this block.",
    "hash": "The prefix hash of a full block: the key a later prompt's prefix is found by.",
}

KERNEL_FIELDS: dict[str, str] = {
    "num_seqs": "Sequences in the last model step's batch.",
    "num_query_tokens": "Tokens the last model step computed (prefill and decode together).",
    "max_abs_err": "Largest difference between the kernel's output and a plain torch "
                   "reference over the same paged cache.",
    "time_ms": "How long the last model step took.",
}

CONTIGUOUS: dict[str, str] = {
    "token_states": "Slots of the contiguous arena holding tokens.",
    "reservation": "Slots reserved for a request's future tokens, not written yet.",
    "internal_fragmentation": "Slots reserved beyond a request's final length: never used.",
    "external_fragmentation": "Free slots that together would hold the waiting request's "
                              "region, in holes each too small for it.",
    "free": "Free slots otherwise: nobody waits, a hole holds the waiting request, or all "
            "the free slots together could not.",
    "holes": "The free runs of the arena: where they start and how long they are.",
    "regions": "A request's one contiguous region: where it starts, how much is reserved, "
               "how much holds tokens.",
    "waiting": "Requests waiting for a region, first come, first served: the first "
               "needs a hole big enough for it.",
    "free_total": "All free slots of the arena, in any hole.",
    "largest_hole": "The longest free run: the largest request the arena can place now.",
    "next_fit": "Whether the first waiting request fits, and why not.",
    "finished": "Requests the arena has served to the end and released.",
    "never_fits": "Requests longer than the arena can ever place.",
    "out_of_step": "Placed requests holding a different number of tokens here from the "
                   "paged pool: the arena runs on its own clock, so a request that waited "
                   "here for a region is behind, and one the pool kept waiting is ahead.",
    "required": "The region size the first waiting request needs.",
}

ADDRESS = ("Where a token's K/V lives: position ÷ block size gives the logical block and "
           "offset; the block table maps it to a physical block; slot = physical block × "
           "block size + offset.")
TEXT = "The request's tokens decoded as text."


def path_help(path: str) -> str:
    """What the value at an expectation's `path` means, or "" for a path we have no words for."""
    parts = path.split(".")
    head, rest = parts[0], parts[1:]
    if head == "metrics" and rest:
        return METRICS.get(rest[0], "")
    if head == "requests" and len(rest) >= 2:
        # Ids may hold dots ("A.1"): the field is the last part that names one.
        return next((REQUEST_FIELDS[p] for p in reversed(rest[1:]) if p in REQUEST_FIELDS), "")
    if head == "blocks" and len(rest) == 2:
        return BLOCK_FIELDS.get(rest[1], "")
    if head == "kernel" and rest:
        return KERNEL_FIELDS.get(rest[0], "")
    if head in ("events", "step_events") and rest:
        return EVENTS.get(rest[0], "")
    if head == "address":
        return ADDRESS
    if head == "text":
        return TEXT
    if head == "contiguous" and rest:
        return CONTIGUOUS.get(rest[-1], "") or CONTIGUOUS.get(rest[0], "")
    return ""
