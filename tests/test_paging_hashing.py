"""Block keys and events: the fast constructions give exactly what the plain ones gave.

Digests are part of the snapshot format, so `block_digest` is checked
against the definition written out plainly (SHA-256 of salt, 0x00, parent,
0x00, the ids one byte each if all fit, else four bytes little-endian).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import pytest

from backend.paging.events import Event, new_event
from backend.paging.hashing import BlockHash, block_digest, hash_block, hash_prompt_blocks


def reference_digest(parent: str | None, tokens: Sequence[int], salt: str) -> str:
    h = hashlib.sha256()
    h.update(salt.encode())
    h.update(b"\x00")
    h.update((parent or "").encode())
    h.update(b"\x00")
    if all(0 <= t <= 255 for t in tokens):
        h.update(bytes(tokens))
    else:
        h.update(b"".join(int(t).to_bytes(4, "little") for t in tokens))
    return h.hexdigest()[:16]


def test_block_digest_matches_its_definition() -> None:
    rng = random.Random(0)
    for _ in range(3000):
        n = rng.randrange(0, 20)
        top = rng.choice([255, 256, 49151, 2**32 - 1])
        tokens = [rng.randrange(top + 1) for _ in range(n)]
        if n and rng.random() < 0.3:  # byte ids with one wide id somewhere
            tokens = [rng.randrange(256) for _ in range(n)]
            tokens[rng.randrange(n)] = rng.randrange(256, top + 2)
        salt = rng.choice(["", "x", "model=tiny", "ü"])
        parent = rng.choice([None, "", "abcdef0123456789"])
        want = reference_digest(parent, tokens, salt)
        assert block_digest(parent, tokens, salt) == want
        assert block_digest(parent, tuple(tokens), salt) == want


def test_known_digests_are_unchanged() -> None:
    # Pinned values: a first block of byte ids, and a wide block after a parent.
    assert block_digest(None, list(b"abcd"), "") == "75db84293b0435cd"
    assert block_digest("0123456789abcdef", [300, 5], "m") == "722cf019d27506c4"
    # Two byte ids are two bytes, not the eight bytes of their wide encoding.
    assert block_digest(None, [1, 2], "") != reference_digest(None, [1, 0, 0, 0, 2, 0, 0, 0], "")


@pytest.mark.parametrize("block_size", [1, 2, 4, 16])
def test_prompt_keys_equal_keys_built_block_by_block(block_size: int) -> None:
    rng = random.Random(block_size)
    for _ in range(200):
        tokens = [rng.randrange(rng.choice([256, 40000])) for _ in range(rng.randrange(0, 70))]
        salt = rng.choice(["", "s"])
        parent = None if rng.random() < 0.5 else hash_block(None, [7] * block_size, salt)
        keys = hash_prompt_blocks(tokens, block_size, salt, parent)
        node = parent
        assert len(keys) == len(tokens) // block_size
        for i, key in enumerate(keys):
            chunk = tokens[i * block_size:(i + 1) * block_size]
            assert key.parent is node and key.tokens == tuple(chunk)
            assert key.digest == reference_digest(node and node.digest, chunk, salt)
            assert key.depth() == (0 if parent is None else 1) + i
            node = key


def test_block_hash_keeps_its_fields_repr_and_identity_equality() -> None:
    a = BlockHash("d0", None, (1, 2))
    b = BlockHash("d1", a, (3, 4))
    assert (b.digest, b.parent, b.tokens, b.parent_digest, b.depth()) == ("d1", a, (3, 4), "d0", 1)
    assert repr(a) == "BlockHash(digest='d0', parent=None, tokens=(1, 2))"
    assert a != BlockHash("d0", None, (1, 2))  # keys compare by identity
    assert hash_block(b, [5, 6], "").depth() == 2


def test_new_event_is_the_event() -> None:
    e = new_event(3, "cow", "A", 7, 2, 7, 1)
    assert e == Event(3, "cow", "A", 7, src=2, dst=7, ref_count=1)
    assert type(e) is Event and e.kind == "cow" and e.src == 2
    assert repr(e) == ("Event(step=3, kind='cow', request='A', block=7, src=2, dst=7, "
                       "ref_count=1)")
    assert Event.from_json(e.to_json()) == e
    with pytest.raises(AttributeError):
        e.kind = "alloc"  # type: ignore[misc]
