"""A hypothesis state machine over allocate / append / append_one / fork / free / remap.

Besides `check_integrity()` after every rule, the machine keeps a simple model
of what the pool holds: a token for every physical slot, written only where
the manager says (new slots, copy-on-write copies, moves). Reading each
sequence back through its block table must give exactly the tokens the model
says that sequence has, so a wrong slot, a missed copy, a shared block written
in place, or a prefix hit on different tokens all fail.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from backend.core.errors import OutOfBlocksError
from backend.paging.block_manager import BlockManager
from backend.paging.integrity import prefix_count_problem

# Two-letter alphabet so prompts often share prefixes and hit the cache.
tokens_st = st.lists(st.sampled_from([97, 98]), min_size=1, max_size=12)


class BlockManagerMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.m: BlockManager
        self.memory: dict[int, int] = {}  # slot -> token written there
        self.tokens: dict[str, list[int]] = {}
        self.next_id = 0

    @initialize(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4),
                caching=st.booleans(), random_mode=st.booleans(), seed=st.integers(0, 3))
    def setup(self, num_blocks: int, block_size: int, caching: bool, random_mode: bool,
              seed: int) -> None:
        self.m = BlockManager(num_blocks, block_size, prefix_caching=caching,
                              allocation="random" if random_mode else "fifo", seed=seed)

    def _new_id(self) -> str:
        self.next_id += 1
        return f"s{self.next_id}"

    @rule(target=seqs, tokens=tokens_st)
    def allocate(self, tokens: list[int]) -> str:
        sid = self._new_id()
        m = self.m
        if m.blocks_for(len(tokens)) > m.num_blocks:
            return "none"
        plan = m.plan_prompt(tokens)
        try:
            alloc = m.allocate(sid, tokens)
        except OutOfBlocksError:
            assert not plan.fits_now
            return "none"
        assert plan.fits_now
        # Hit blocks must already hold exactly these tokens.
        for p in range(alloc.num_cached_tokens):
            assert self.memory[m.translate(sid, p).slot] == tokens[p]
        for p, slot in enumerate(m.slots_of(sid, alloc.num_cached_tokens, len(tokens)),
                                 start=alloc.num_cached_tokens):
            self.memory[slot] = tokens[p]
        self.tokens[sid] = list(tokens)
        return sid

    @rule(sid=seqs, tokens=tokens_st)
    def append(self, sid: str, tokens: list[int]) -> None:
        if sid not in self.tokens:
            return
        m = self.m
        needed = m.blocks_needed_to_append(sid, len(tokens))
        try:
            r = m.append(sid, tokens)
        except OutOfBlocksError:
            assert needed > m.num_free_blocks
            return
        assert needed <= m.num_blocks
        if r.cow is not None:
            bs = m.block_size
            for o in range(r.cow.num_filled):
                self.memory[r.cow.dst * bs + o] = self.memory[r.cow.src * bs + o]
        for slot, t in zip(r.slots, tokens, strict=True):
            self.memory[slot] = t
        self.tokens[sid].extend(tokens)

    @rule(sid=seqs, token=st.sampled_from([97, 98]))
    def append_one(self, sid: str, token: int) -> None:
        """The decode step's call: one token, its slot and any copy-on-write."""
        if sid not in self.tokens:
            return
        m = self.m
        needed = m.blocks_needed_to_append(sid, 1)
        try:
            slot, cow = m.append_one(sid, token)
        except OutOfBlocksError:
            assert needed > m.num_free_blocks
            return
        if cow is not None:
            bs = m.block_size
            for o in range(cow.num_filled):
                self.memory[cow.dst * bs + o] = self.memory[cow.src * bs + o]
        self.memory[slot] = token
        self.tokens[sid].append(token)

    @rule(target=seqs, sid=seqs)
    def fork(self, sid: str) -> str:
        if sid not in self.tokens:
            return "none"
        child = self._new_id()
        self.m.fork(sid, child)
        self.tokens[child] = list(self.tokens[sid])
        return child

    @rule(sid=consumes(seqs), preempted=st.booleans())
    def free(self, sid: str, preempted: bool) -> None:
        if sid not in self.tokens:
            return
        self.m.free(sid, preempted=preempted)
        del self.tokens[sid]

    @precondition(lambda self: self.m.num_blocks > 1)
    @rule(seed=st.integers(0, 1000))
    def remap(self, seed: int) -> None:
        m = self.m
        used = {b for s in self.tokens for b in m.block_table(s)}
        mapping = m.plan_remap(seed)
        assert all(mapping[b] != b for b in used)
        moves = m.apply_remap(mapping)
        bs = m.block_size
        old = dict(self.memory)
        for mv in moves:
            for o in range(bs):
                if mv.src * bs + o in old:
                    self.memory[mv.dst * bs + o] = old[mv.src * bs + o]

    @invariant()
    def integrity(self) -> None:
        self.m.check_integrity()

    @invariant()
    def every_sequence_reads_back_its_tokens(self) -> None:
        m = self.m
        for sid, toks in self.tokens.items():
            assert m.num_tokens(sid) == len(toks)
            got = [self.memory[m.translate(sid, p).slot] for p in range(len(toks))]
            assert got == toks, sid

    @invariant()
    def counts_match_the_model(self) -> None:
        m = self.m
        tables = [m.block_table(s) for s in self.tokens]
        distinct = {b for t in tables for b in t}
        met = m.metrics()
        assert met.used_blocks == len(distinct)
        assert met.used_blocks + met.cached_blocks + met.free_blocks == m.num_blocks
        assert met.logical_tokens == sum(len(t) for t in self.tokens.values())
        assert met.blocks_saved_by_sharing == sum(len(t) for t in tables) - len(distinct)
        assert prefix_count_problem(met, prefix_caching=m.prefix_caching) is None


BlockManagerMachine.TestCase.settings = settings(
    # Derandomized by tests/conftest.py's profile (HYPOTHESIS_PROFILE=explore searches).
    max_examples=250, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockManagerMachine = BlockManagerMachine.TestCase
