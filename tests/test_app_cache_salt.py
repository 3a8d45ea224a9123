"""The Add form's cache salt, through AppTest: the same prompt under another salt
shares no block, the request table says each request's salt, and a bad salt is
refused by the field's name with the playground unchanged."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.test_app import PROMPT, add, click, engine, markdown, start, status
from tests.test_app_timeline import requests_table


def salted_add(at: AppTest, salt: str, prompt: str = PROMPT) -> AppTest:
    at.text_input(key="add_salt").input(salt)
    return add(at, prompt)


def test_a_salted_prompt_shares_only_with_its_own_salt() -> None:
    at = start()
    add(at)                                     # A, unsalted
    salted_add(at, "tenant-b")                  # B
    kind, text = status(at)
    assert kind == "success" and "add B ('The cat sat on the mat.') salt 'tenant-b'" in text
    # The salt is a one-off, like the pins: cleared after the add.
    assert at.text_input(key="add_salt").value == ""
    e = engine(at)
    assert e.requests["B"].cache_salt == "tenant-b"
    assert not set(e.manager.block_table("A")) & set(e.manager.block_table("B"))
    salted_add(at, "tenant-b")                  # C: B's five full blocks
    assert e.manager.block_table("C")[:5] == e.manager.block_table("B")[:5]
    add(at)                                     # D: A's
    assert e.manager.block_table("D")[:5] == e.manager.block_table("A")[:5]
    assert e.manager.prefix_hit_blocks == 10
    table = requests_table(at)
    assert [table.loc[r, "cache salt"] for r in "ABCD"] == ["", "tenant-b", "tenant-b", ""]
    # Inspecting a block says the salt its key is made under, cached or used.
    click_finish(at, "B")
    click_finish(at, "C")
    salted_block = next(b for b in e.manager.pool.blocks
                        if b.state == "cached" and b.hash is not None)
    at.number_input(key="focus_block").set_value(salted_block.id).run()
    text = markdown(at)
    assert (f"Block **{salted_block.id}**: cached, ref count 0, 4/4 slots filled, hash "
            f"{salted_block.hash.digest[:8]} (keyed under cache salt 'tenant-b'), held by no "
            "request. It holds “") in text
    at.number_input(key="focus_block").set_value(0).run()
    assert "cache salt" not in markdown(at)


def click_finish(at: AppTest, rid: str) -> None:
    at.selectbox(key="req_pick").set_value(rid).run()
    click(at, "btn_finish")


def test_a_bad_salt_is_refused_by_its_label_and_changes_nothing() -> None:
    at = start()
    add(at)
    before = engine(at).manager.block_table("A"), dict(engine(at).requests)
    salted_add(at, "x" * 65)
    kind, text = status(at)
    assert (kind, text) == ("error", "Refused: Cache salt must be at most 64 characters; got 65")
    e = engine(at)
    assert (e.manager.block_table("A"), dict(e.requests)) == before
    # The refused salt stays in the field to be corrected.
    assert at.text_input(key="add_salt").value == "x" * 65
    assert "cache salt" not in requests_table(at).columns
