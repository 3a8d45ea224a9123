"""Chained prefix-cache keys for full KV blocks.

A full block's key commits to everything its K/V values depend on: the key of
the block before it (and so, transitively, every earlier token), its own token
ids, and a salt naming the model settings (weights seed, shapes, dtype). Two
prompts share a block only when all three agree, which is exactly when the
cached K/V would be bit-for-bit what a fresh prefill computes.

    prompt tokens:  [ t0 t1 t2 t3 | t4 t5 t6 t7 | t8 ]      block_size = 4
    keys:             h0 = H(salt, -, t0..t3)
                                    h1 = H(salt, h0, t4..t7)
                                                  (partial: no key)

Each `BlockHash` keeps its parent and its own tokens, so a lookup can re-check
the tokens (a digest match alone is never trusted) and the full token prefix
of any cached block can be recovered by walking the chain, which is what lets
a snapshot restore recompute a cached block's K/V.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

DIGEST_HEX_CHARS = 16


@dataclass(frozen=True, slots=True, eq=False)
class BlockHash:
    """The prefix-cache key of one full block, linked to its parent's key."""

    digest: str
    parent: BlockHash | None
    tokens: tuple[int, ...]
    # Stored, not walked: a chain is built parents first, so each key's depth
    # is its parent's plus one, and asking every node of a chain its depth
    # (a snapshot export sorts by it) stays linear instead of quadratic.
    _depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_depth", 0 if self.parent is None else self.parent._depth + 1)

    @property
    def parent_digest(self) -> str | None:
        return None if self.parent is None else self.parent.digest

    def depth(self) -> int:
        """Logical index of the block this key describes (0 for the first block)."""
        return self._depth


def block_digest(parent_digest: str | None, tokens: Sequence[int], salt: str) -> str:
    """Hex digest of (salt, parent digest, token ids).

    Ids that all fit a byte are hashed one byte each (tiny-byte's digests, which
    every existing snapshot holds, stay as they were); a block holding a larger id
    is hashed four bytes per id. The two encodings of a block differ in length,
    so they never produce the same input.
    """
    h = hashlib.sha256()
    h.update(salt.encode())
    h.update(b"\x00")
    h.update((parent_digest or "").encode())
    h.update(b"\x00")
    if all(0 <= t <= 255 for t in tokens):
        h.update(bytes(tokens))
    else:
        h.update(b"".join(int(t).to_bytes(4, "little") for t in tokens))
    return h.hexdigest()[:DIGEST_HEX_CHARS]


def hash_block(parent: BlockHash | None, tokens: Sequence[int], salt: str) -> BlockHash:
    toks = tuple(tokens)
    parent_digest = None if parent is None else parent.digest
    return BlockHash(block_digest(parent_digest, toks, salt), parent, toks)


def hash_prompt_blocks(tokens: Sequence[int], block_size: int, salt: str,
                       parent: BlockHash | None = None) -> list[BlockHash]:
    """Keys of every full block of `tokens`, chained from `parent`."""
    out: list[BlockHash] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block(parent, tokens[start:start + block_size], salt)
        out.append(parent)
    return out
