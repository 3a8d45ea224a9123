"""The seed's example says what the block manager did with B's freed blocks and what each
contiguous policy did with A, B and C; the memory maps space each run by its own length;
a block-size simulation is labelled with the inputs it ran."""

from __future__ import annotations

import pytest

from backend.core.words import percent
from backend.lab.compare.memory_maps import replay_maps, small_trace
from backend.lab.compare.seed_example import seed_example
from backend.views.compare import frames as views
from backend.views.compare import seed as seed_views
from backend.views.compare import tables
from tests.compare_support import BLOCK_SIZE, start, text

# ---- freed blocks: the block manager's own order ----------------------------------------


def test_defaults_say_d_takes_never_used_blocks_and_where_b_freed_ones_wait() -> None:
    ex = seed_example()
    # B held 2, 6 and 9 and released them tail first to the queue's back, behind 11-15.
    assert ex.freed == (9, 6, 2)
    assert ex.free_order == (11, 12, 13, 14, 15, 9, 6, 2)
    assert ex.d_table == (11, 12, 13, 14)
    assert (ex.reuse_length(), ex.reuse_length(every=True)) == (7, 9)
    said = seed_views.seed_reuse_sentence(ex)
    assert said.startswith("D takes blocks 11, 12, 13 and 14, never used before; blocks 2, "
                           "6 and 9 that B freed stay free.")
    assert said.endswith("Set D's final length to 7 to see it take block 9, or to 9 for all "
                         "of them.")
    assert "any free block will do" not in said


def test_a_longer_d_takes_b_freed_blocks_and_the_sentence_names_them() -> None:
    ex = seed_example(new_len=7)
    assert ex.d_table == (11, 12, 13, 14, 15, 9)
    assert seed_views.seed_reuse_sentence(ex).startswith(
        "D takes block 9 that B freed, and 11, 12, 13, 14 and 15, never used before.")
    ex = seed_example(new_len=9)
    assert ex.d_table == (11, 12, 13, 14, 15, 9, 6, 2)
    said = seed_views.seed_reuse_sentence(ex)
    assert said.startswith("D takes blocks 9, 6 and 2 that B freed, and 11, 12, 13, 14 and "
                           "15, never used before.")
    assert "takes all of them" not in said


@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_reuse_length_is_where_the_real_allocator_first_hands_out_a_freed_block(
        block_size: int) -> None:
    ex = seed_example(block_size=block_size)
    first, every = ex.reuse_length(), ex.reuse_length(every=True)
    assert first is not None and every is not None
    for new_len in range(2, 17):
        d = seed_example(block_size=block_size, new_len=new_len)
        if d.d_table is None:
            continue
        taken = set(d.d_table) & set(ex.freed)
        assert bool(taken) == (new_len >= first), new_len
        assert (taken == set(ex.freed)) == (new_len >= every), new_len


# ---- the narration follows the policy -----------------------------------------------


def test_each_policy_is_narrated_as_it_ran() -> None:
    oracle = seed_views.seed_arena_story(seed_example("oracle"))
    assert "A, B and C ask for 6, 3 and 5 slots; all three fit (slots 0–5, 6–8 and 9–13)." \
        in oracle
    assert "At the second decode step B reaches its 3 tokens and finishes, freeing slots " \
           "6–8." in oracle
    pow2 = seed_views.seed_arena_story(seed_example("pow2"))
    assert "A and B fit (slots 0–7 and 8–11); C waits: it needs 8 slots in one piece and " \
           "only 4 are free." in pow2
    assert "and C, waiting since it arrived, takes slots 8–15 and starts from its 2 prompt " \
           "tokens." in pow2
    ex = seed_example("max")
    mx = seed_views.seed_arena_story(ex)
    assert "B and C wait: each needs 16 slots in one piece and no slot is free." in mx
    assert "In the two decode steps no request finishes: A holds 4 of its 6 tokens." in mx
    assert "B and C are still waiting when D arrives" in mx
    assert "B reaches" not in mx
    # The stage table says the same.
    assert seed_views.seed_stage_table(ex)["waiting"].tolist() == ["B, C", "B, C", "B, C, D"]
    # The pool runs all three whatever the arena's policy, and B finishes there.
    assert seed_views.seed_pool_story(ex) == (
        "The paged pool takes blocks only for the tokens that exist, so all three start at "
        "once (2, 1 and 2 blocks of 1). At the second decode step B reaches its 3 tokens and "
        "finishes, freeing blocks 2, 6 and 9.")


def test_the_page_narrates_the_chosen_policy_and_the_freed_blocks() -> None:
    at = start()
    page = text(at)
    assert "After two decode steps B finishes" not in page
    assert seed_views.seed_reuse_sentence(seed_example()) in page
    at.selectbox(key="cmp_seed_policy").set_value("max").run()
    assert not at.exception
    page = text(at)
    assert seed_views.seed_arena_story(seed_example("max")) in page
    assert "Then D arrives with 4 tokens and will reach 5." in page
    at.number_input(key="cmp_seed_new_len").set_value(7).run()
    assert "D takes block 9 that B freed" in text(at)


# ---- the memory maps: each run spaced by its own length -------------------------------


def test_a_short_paged_run_gets_its_own_columns_and_axis() -> None:
    data = views.two_memories("alpaca", 200, 20.0, 0, 8192, 8192, "max", 16)
    left, right = data["left"], data["right"]
    # The contiguous max run takes 11,547 busy iterations, the paged one 610.
    assert left["domain"] == (5, 11552) and right["domain"] == (5, 615)
    assert not data["shared"]
    assert "5–11,551 and the paged run 5–614" in data["axes"]
    # Columns spaced by the paged run itself: dozens of them, not the 2 that a stride taken
    # from the shared 11,552-iteration axis gave (448 iterations each).
    assert right["stride"] < 64
    assert right["segments"]["iteration"].nunique() >= 20
    assert right["segments"]["iteration_end"].max() == 615
    # The share chart's points cover the run and average to the table's figure.
    fr = right["fractions"]
    tokens = fr[fr["kind"] == "token states"]
    assert tokens["iteration"].nunique() >= 100
    replay = replay_maps(small_trace("alpaca", 200, 20.0, 0, 8192), "paged", 8192,
                         block_size=16, max_len=8192)
    paged = next(r for r in data["table"] if r.policy == "paged")
    assert replay.breakdown()["token_states"] == pytest.approx(paged.memory["token_states"])
    assert f"token states {percent(paged.memory['token_states'])}" in right["shares"]
    assert percent(paged.memory["token_states"]) == "18.5%"


def test_runs_of_similar_length_keep_one_axis() -> None:
    data = views.two_memories("alpaca", 40, 20.0, 0, 256, 768, "max", 16)
    assert data["shared"] and data["axes"] == ""
    assert data["left"]["domain"] == data["right"]["domain"] == (5, 814)
    # Each still spaced by its own run: the paged one (310 iterations) is the finer.
    assert data["right"]["stride"] <= data["left"]["stride"]


# ---- block size: a result says which inputs it ran --------------------------------------


def test_block_run_caption_names_the_run_and_what_changed() -> None:
    ran = ("sharegpt", 1000, 0)
    assert tables.block_run_caption(ran, ran, rate=4.0, capacity=15360) == (
        "Last run: sharegpt, 1,000 requests, seed 0, at 4 requests/s in 15,360 token slots.")
    moved = tables.block_run_caption(ran, ("alpaca", 1, 0), rate=4.0, capacity=15360)
    assert moved.endswith("The fields have changed since (workload alpaca, requests 1): the "
                          "numbers below are from before; press Simulate every block size to "
                          "run the fields.")


def test_block_size_result_is_marked_once_the_fields_change() -> None:
    at = start(BLOCK_SIZE)
    at.number_input(key="cmp_blk_requests").set_value(200)
    at.button(key="cmp_blk_sim").click().run()
    assert not at.exception and not at.error
    assert "Last run: sharegpt, 200 requests, seed 0" in text(at)
    assert "The fields have changed since" not in text(at)
    at.selectbox(key="cmp_blk_workload").set_value("alpaca")
    at.number_input(key="cmp_blk_requests").set_value(1).run()
    assert not at.exception
    page = text(at)
    assert "Last run: sharegpt, 200 requests, seed 0" in page
    assert "The fields have changed since (workload alpaca, requests 1)" in page


def test_block_size_requests_stop_at_the_simulators_cap() -> None:
    # *Simulate every block size* replays the trace at nine block sizes: the page's cap
    # keeps it within a minute, as the Trace simulator's does.
    at = start(BLOCK_SIZE)
    at.number_input(key="cmp_blk_requests").set_value(20_001).run()
    assert not at.exception
    assert [e.value for e in at.error if "Requests" in e.value] == [
        "Requests must be 1 to 20,000; got 20,001"]
