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

A request may also carry a cache salt of its own (vLLM's `cache_salt`): a
name for anything its K/V must not be shared across that the tokens do not
show (a tenant, an adapter, a system setting). Its chain then starts from a
`SaltRoot`, a key with no tokens and no block, whose digest commits to the
salt; the first block's key names it as its parent, so the same tokens under
two salts never share a block:

    unsalted:         h0 = H(salt, -, t0..t3)
    cache_salt "a":   r  = H(salt|cache_salt=a, -, nothing)
                      h0 = H(salt, r, t0..t3)

A root holds no tokens, so joining a chain's tokens passes it unchanged; but
a walk that numbers the links must go by `depth()` (the root's is -1), not by
a link's place in the walk.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.core.checks import shown
from backend.core.errors import PagedLabError

DIGEST_HEX_CHARS = 16


@dataclass(slots=True, eq=False, init=False)
class BlockHash:
    """The prefix-cache key of one full block, linked to its parent's key.

    Immutable by contract: nothing assigns a field after construction. It
    is not a frozen dataclass because a frozen __init__ sets every field
    through object.__setattr__ and costs about three times as much, and a
    key is built for every block that fills. Equality is identity.
    """

    digest: str
    parent: BlockHash | None
    tokens: tuple[int, ...]
    # Stored, not walked: a chain is built parents first, so each key's depth
    # is its parent's plus one, and asking every node of a chain its depth
    # (a snapshot export sorts by it) stays linear instead of quadratic.
    _depth: int = field(repr=False, compare=False)
    # (parent digest, tokens): what the digest commits to, and the prefix
    # cache's key for it (BlockPool.by_content). Built once with the key, so
    # caching and evicting a block build no tuple.
    content: tuple[str | None, tuple[int, ...]] = field(repr=False, compare=False)

    def __init__(self, digest: str, parent: BlockHash | None, tokens: tuple[int, ...]) -> None:
        self.digest = digest
        self.parent = parent
        self.tokens = tokens
        if parent is None:
            self._depth = 0
            self.content = (None, tokens)
        else:
            self._depth = parent._depth + 1
            self.content = (parent.digest, tokens)

    @property
    def parent_digest(self) -> str | None:
        return self.content[0]

    def depth(self) -> int:
        """Logical index of the block this key describes (0 for the first block)."""
        return self._depth


class SaltRoot(BlockHash):
    """The parentless, tokenless key a salted request's chain starts from.

    Never a block's key: only the parent of a salted chain's first block.
    Its depth is -1, so the first block is still logical block 0.
    """

    __slots__ = ("cache_salt",)

    def __init__(self, digest: str, cache_salt: str) -> None:
        super().__init__(digest, None, ())
        self._depth = -1
        self.cache_salt = cache_salt


MAX_CACHE_SALT_CHARS = 64


def check_cache_salt(value: object, field: str = "cache_salt") -> str:
    """A request's cache salt: 1..64 printable characters, no space at either end (the
    Add form drops those, so a file may not keep them: one salt, one spelling).
    Raises PagedLabError."""
    if not isinstance(value, str) or not value.strip():
        raise PagedLabError(f"{field} must be a non-empty string, got {shown(value)}")
    if len(value) > MAX_CACHE_SALT_CHARS:
        raise PagedLabError(f"{field} must be at most {MAX_CACHE_SALT_CHARS} characters; got "
                            f"{len(value):,}")
    odd = next((c for c in value if not c.isprintable()), None)
    if odd is not None:
        raise PagedLabError(f"{field} {shown(value)} contains U+{ord(odd):04X}, which is not a "
                            "printable character (letters, digits, punctuation and the plain "
                            "space are)")
    if value != value.strip():
        raise PagedLabError(f"{field} {shown(value)} begins or ends with a space")
    return value


def salt_root_digest(salt: str, cache_salt: str) -> str:
    """The digest of a cache salt's root under the model settings `salt`.

    SHA-256 of ``salt|cache_salt=S 0x00 0x00`` (what `block_digest` gives a
    first block of no tokens under that salt): no block's input has that form
    (a block's hashed salt is the bare model salt, followed by 0x00), and a
    printable salt holds no 0x00, so a root never shares a digest with a block.
    Hashed directly, not through the cache of salted states, which is for the
    few model salts a process hashes blocks under.
    """
    data = f"{salt}|cache_salt={cache_salt}".encode() + b"\x00\x00"
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX_CHARS]


def salt_root(salt: str, cache_salt: str) -> SaltRoot:
    """The root key of chains salted with `cache_salt` under the model settings `salt`."""
    return SaltRoot(salt_root_digest(salt, cache_salt), cache_salt)


def block_digest(parent_digest: str | None, tokens: Sequence[int], salt: str) -> str:
    """Hex digest of (salt, parent digest, token ids).

    Ids that all fit a byte are hashed one byte each (tiny-byte's digests, which
    every existing snapshot holds, stay as they were); a block holding a larger id
    is hashed four bytes per id, little-endian. The two encodings of a block
    differ in length, so they never produce the same input. The digest is
    SHA-256 of ``salt 0x00 parent 0x00 token-bytes`` (parent empty for a first
    block), truncated to DIGEST_HEX_CHARS hex characters.
    """
    h = _salted(salt).copy()
    h.update(parent_digest.encode() + b"\x00" if parent_digest else b"\x00")
    h.update(token_bytes(tokens))
    return h.hexdigest()[:DIGEST_HEX_CHARS]


def token_bytes(tokens: Sequence[int]) -> bytes:
    """The bytes a block's ids are hashed as: one byte each if all fit, else four each."""
    # The first id decides most wide blocks without a scan; max() runs in C.
    # bytes() checks the range again (a negative id, which no valid block
    # holds, raises ValueError there).
    if not tokens or (tokens[0] <= 255 and max(tokens) <= 255):
        return bytes(tokens)
    return _wide(len(tokens)).pack(*tokens)


def hash_block(parent: BlockHash | None, tokens: Sequence[int], salt: str) -> BlockHash:
    """The key of one full block of `tokens` after `parent` (None for a first block).

    `block_digest` with `token_bytes`, `_salted` and `_wide` inlined: a decode
    keys a block every block_size tokens.
    """
    toks = tuple(tokens)
    h = (_SALTED.get(salt) or _salted(salt)).copy()
    h.update(parent.digest.encode() + b"\x00" if parent is not None and parent.digest
             else b"\x00")
    h.update(bytes(toks) if not toks or (toks[0] <= 255 and max(toks) <= 255)
             else (_WIDE.get(len(toks)) or _wide(len(toks))).pack(*toks))
    return BlockHash(h.hexdigest()[:DIGEST_HEX_CHARS], parent, toks)


def hash_prompt_blocks(tokens: Sequence[int], block_size: int, salt: str,
                       parent: BlockHash | None = None) -> list[BlockHash]:
    """Keys of every full block of `tokens`, chained from `parent`.

    The same keys as `hash_block` block by block, in one loop (a prompt's
    blocks are all hashed when it is admitted): `block_digest` and
    `token_bytes` are inlined.
    """
    out: list[BlockHash] = []
    n = len(tokens) - block_size + 1
    if n <= 0:
        return out
    base = _salted(salt)
    wide = _wide(block_size)
    prefix = parent.digest.encode() + b"\x00" if parent is not None and parent.digest else b"\x00"
    for start in range(0, n, block_size):
        toks = tuple(tokens[start:start + block_size])
        h = base.copy()
        h.update(prefix)
        h.update(bytes(toks) if toks[0] <= 255 and max(toks) <= 255 else wide.pack(*toks))
        digest = h.hexdigest()[:DIGEST_HEX_CHARS]
        parent = BlockHash(digest, parent, toks)
        out.append(parent)
        prefix = digest.encode() + b"\x00"
    return out


# SHA-256 states that have absorbed a salt and its separator, so each block
# copies one instead of hashing the salt again. Few salts exist per process
# (one per model setting); the cap only bounds a pathological caller.
_SALTED: dict[str, Any] = {}
_MAX_SALTS = 64
# struct formats packing n ids four bytes each, by n (n is a block size: <= 256).
_WIDE: dict[int, struct.Struct] = {}


def _salted(salt: str) -> Any:
    h = _SALTED.get(salt)
    if h is None:
        if len(_SALTED) >= _MAX_SALTS:
            _SALTED.clear()
        h = _SALTED[salt] = hashlib.sha256(salt.encode() + b"\x00")
    return h


def _wide(n: int) -> struct.Struct:
    wide = _WIDE.get(n)
    if wide is None:
        wide = _WIDE[n] = struct.Struct(f"<{n}I")
    return wide
