"""The app through Streamlit's AppTest: every control path, on the real engine.

Most tests switch to the torch kernel (one click in the sidebar) to stay fast
on a CPU; `test_default_kernel_is_triton` runs the default Triton kernel.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from backend.engine.engine import Engine
from backend.io.snapshot import export_snapshot
from backend.views import block_tokens
from backend.views.text import WORD_JOINER

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PROMPT = "The cat sat on the mat."   # 23 bytes: with block size 4, five full blocks + 3


def start(kernel: str = "torch", **config: int) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception
    if kernel != "auto":
        at.segmented_control(key="dev_kernel").set_value(kernel).run()
    for name, value in config.items():
        at.sidebar.number_input(key=f"cfg_{name}").set_value(value).run()
    assert not at.exception
    return at


def engine(at: AppTest) -> Engine:
    e: Engine = at.session_state["engine"]
    return e


def html(at: AppTest, css_class: str) -> str:
    bodies = [h.value for h in at.html if f"class='{css_class}'" in h.value]
    assert len(bodies) == 1, f"expected one {css_class} block, found {len(bodies)}"
    return bodies[0]


def metrics(at: AppTest) -> dict[str, str]:
    return dict(re.findall(r"data-label='([^']+)'>([^<]+)<", html(at, "pl-metrics")))


def markdown(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def add(at: AppTest, prompt: str | None = PROMPT, *, length: int | None = None,
        rid: str = "", max_new: int | None = None, pins: str = "") -> AppTest:
    at.text_area(key="add_prompt").input(prompt or "")
    at.number_input(key="add_len").set_value(length)
    at.number_input(key="add_max_new").set_value(max_new)
    at.text_input(key="add_id").input(rid)
    at.text_input(key="add_pins").input(pins)
    at.button(key="btn_add").click().run()
    assert not at.exception
    return at


def pick(at: AppTest, rid: str) -> None:
    at.selectbox(key="req_pick").select(rid)


def click(at: AppTest, key: str) -> AppTest:
    at.button(key=key).click().run()
    assert not at.exception
    return at


def shown(source: str) -> str:
    """The text Streamlit shows for Markdown that backend.views.text escaped."""
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", source).replace("  \n", "\n")
    return text.replace(WORD_JOINER, "")


def status(at: AppTest) -> tuple[str, str]:
    """The status line's kind and the text it shows."""
    kinds = [(k, shown(e.value)) for k in ("error", "success", "info") for e in getattr(at, k)]
    assert kinds, "no status line"
    return kinds[0]


def test_opens_on_the_playground_with_an_empty_pool() -> None:
    at = AppTest.from_file(APP, default_timeout=180).run()
    assert not at.exception
    assert at.title[0].value == "Playground"
    m = metrics(at)
    assert (m["Used blocks"], m["Free blocks"], m["Running requests"]) == ("0 / 32", "32", "0")
    assert m["Bytes per block"] == "2.0 KiB"          # 2 x 2 layers x 2 x 16 x 4 x 4 bytes
    assert "No model step yet" in markdown(at)
    assert at.sidebar.number_input(key="cfg_num_blocks").value == 32
    assert at.segmented_control(key="dev_kernel").value == "auto"
    assert "No events yet" in html(at, "pl-events")
    # Drawn before the first request, empty or disabled, so that the first Add only
    # updates them (mounting them then made it the slowest click of a session).
    table = at.dataframe[0].value
    assert table.empty and list(table.columns)[:2] == ["request", "status"]
    assert all(at.button(key=k).disabled for k in ("btn_grow", "btn_fork", "btn_finish"))
    assert at.selectbox(key="req_pick").disabled


def test_default_kernel_is_triton() -> None:
    at = start(kernel="auto")
    add(at)
    assert engine(at).kernel_report.backend == "triton-interpreter"
    text = markdown(at)
    assert "Last model step ran on **triton-interpreter** (cpu)" in text
    found = re.search(r"reference\\\|: \*\*([0-9.e+-]+)\*\*", text)
    assert found is not None, text
    assert float(found.group(1)) < 1e-4
    assert metrics(at)["Used blocks"] == "6 / 32"


def test_add_shows_blocks_table_layout_and_events() -> None:
    at = add(start())
    kind, text = status(at)
    assert kind == "success" and text.startswith("Step 1: add A")
    m = metrics(at)
    assert (m["Running requests"], m["Used blocks"], m["Internal waste"]) == \
        ("1", "6 / 32", "1 slot")
    table = at.dataframe[0].value.set_index("request")
    assert table.loc["A", "block table (logical→physical)"] == \
        "0→0 · 1→1 · 2→2 · 3→3 · 4→4 · 5→5 (3/4)"
    layout = html(at, "pl-layouts")
    assert "L5 → P5 (3/4, partial)" in layout and ">at.<" in layout
    events = html(at, "pl-events")
    assert events.count("took free block") == 6 and "step 1" in events
    assert "Last model step ran on **torch**" in markdown(at)
    # The kernel panel says which route the torch backend's decodes take here: on a CPU
    # the compiled operator (make test builds it), on a GPU gathers for SDPA.
    route = "decodes gather each sequence's blocks" if torch.cuda.is_available() else \
        "decodes run PagedLab's compiled CPU operator"
    notes = [c.value for c in at.caption]
    assert any(route in n for n in notes), notes


def test_second_request_with_the_same_prompt_shares_its_prefix() -> None:
    at = add(add(start()))
    m = metrics(at)
    assert (m["Used blocks"], m["Shared blocks"], m["Prefix-cache hits"]) == \
        ("7 / 32", "5", "5 blocks (20 tokens)")
    assert m["Blocks saved by sharing"] == "5" and m["Bytes saved by sharing"] == "10.0 KiB"
    assert html(at, "pl-layouts").count("×2") == 10
    hit = "request B found its prompt prefix in block 4 (prefix-cache hit)"
    assert hit in html(at, "pl-events")


def test_a_random_length_wins_over_the_kept_prompt_text_once() -> None:
    # The prompt box keeps its text after an add; typing a length is enough for a
    # random prompt, and the next add uses the kept text again (prefix sharing).
    at = add(start())
    assert at.text_area(key="add_prompt").value == PROMPT
    at.number_input(key="add_len").set_value(10)
    click(at, "btn_add")
    assert status(at) == ("success", "Step 2: add B (10 random tokens) · admitted B · "
                                     "events: 3 alloc")
    assert engine(at).requests["B"].prompt_len == 10
    assert list(engine(at).requests["B"].tokens) != list(PROMPT.encode()[:10])
    # The length is a one-off, like the id and the pins; the text stays.
    assert at.number_input(key="add_len").value is None
    assert at.text_area(key="add_prompt").value == PROMPT
    click(at, "btn_add")
    kind, text = status(at)
    assert kind == "success" and text.startswith(f"Step 3: add C ('{PROMPT}')"), text
    assert metrics(at)["Prefix-cache hits"] == "5 blocks (20 tokens)"    # C shares A's prompt


def test_add_with_length_limit_and_pinned_blocks_reproduces_the_worked_example() -> None:
    at = add(start(), None, length=9, rid="A", max_new=5, pins="9, 2, 14")
    table = at.dataframe[0].value.set_index("request")
    assert table.loc["A", "block table (logical→physical)"] == "0→9 · 1→2 · 2→14 (1/4)"
    # The address translator: position 6 -> logical 1, offset 2 -> physical 2, slot 10.
    at.number_input(key="tr_pos").set_value(6).run()
    text = markdown(at)
    assert "logical block **1**, offset **2**" in text
    assert "entry 1 is physical block **2**" in text and "= **10**" in text
    # The key vector shown is the one stored in the live tensor at that slot.
    _, key, _ = engine(at).read_kv("A", 6, 0)
    stored = at.dataframe[1].value.to_numpy()
    assert stored == pytest.approx(key.numpy())
    assert engine(at).requests["A"].max_new_tokens == 5
    # The chosen position survives a step (the table grows, the address does not move).
    click(at, "btn_step")
    assert at.number_input(key="tr_pos").value == 6 and "= **10**" in markdown(at)
    # A position or layer past the request's or model's is refused by name, as every
    # number field's (no bounds in the browser); nothing is read.
    at.number_input(key="tr_pos").set_value(10).run()
    at.number_input(key="tr_layer").set_value(2).run()
    assert [shown(e.value) for e in at.error] == [
        "Token position must be 0 to 9; got 10\nLayer must be 0 to 1; got 2"]
    assert "= **10**" not in markdown(at)


def test_grow_decodes_tokens_into_new_blocks() -> None:
    at = add(start())
    at.number_input(key="req_grow_n").set_value(6)
    click(at, "btn_grow")
    assert status(at)[1].startswith("Step 2: grow A +6 · generated 6 tokens")
    assert engine(at).requests["A"].num_tokens == 29
    assert at.dataframe[0].value.loc[0, "block table (logical→physical)"] == \
        "0→0 · 1→1 · 2→2 · 3→3 · 4→4 · 5→5 · 6→6 · 7→7 (1/4)"
    assert metrics(at)["Used blocks"] == "8 / 32"


def test_fork_then_grow_the_child_copies_on_write() -> None:
    at = add(add(start()))
    pick(at, "A")
    at.text_input(key="req_child").input("A2")
    click(at, "btn_fork")
    assert status(at)[1] == "Step 3: fork A -> A2 · events: 1 fork, 6 share"
    assert at.selectbox(key="req_pick").value == "A2"    # the child is picked next
    assert metrics(at)["Shared blocks"] == "6"
    click(at, "btn_grow")
    m = metrics(at)
    assert m["Copy-on-write copies"] == "1" and m["Used blocks"] == "8 / 32"
    events = html(at, "pl-events")
    assert "request A2 wrote into shared block 5: copied it to block 7 first " \
           "(copy-on-write)" in events
    layout = html(at, "pl-layouts")
    assert "L0 → P0 ×3" in layout and "L5 → P7</span>" in layout


def test_finish_releases_blocks_and_keeps_full_ones_cached() -> None:
    at = add(start())
    click(at, "btn_finish")
    m = metrics(at)
    assert (m["Running requests"], m["Finished requests"]) == ("0", "1")
    assert (m["Used blocks"], m["Cached blocks"], m["Free blocks"]) == ("0 / 32", "5", "27")
    assert "released block 0; no one holds it (ref count 0)" in html(at, "pl-events")
    # A finished request has nothing to act on: the per-request controls are disabled.
    assert all(at.button(key=k).disabled for k in ("btn_grow", "btn_fork", "btn_finish"))
    assert at.selectbox(key="req_pick").disabled
    assert at.selectbox(key="req_pick").value is None


def test_step_runs_the_batch_and_finishes_at_max_new_tokens() -> None:
    at = add(add(start(), "abcdefgh", max_new=3), "ijklm", max_new=2)
    click(at, "btn_step")
    assert engine(at).requests["A"].num_tokens == 9
    assert engine(at).requests["B"].num_tokens == 6
    at.number_input(key="batch_n").set_value(3)
    click(at, "btn_step_n")
    m = metrics(at)
    assert (m["Running requests"], m["Finished requests"], m["Used blocks"]) == \
        ("0", "2", "0 / 32")
    table = at.dataframe[0].value.set_index("request")
    assert table.loc["A", "status"] == "finished (max new tokens)"
    assert (table.loc["A", "generated"], table.loc["B", "generated"]) == (3, 2)
    # Finished requests hold no blocks, so no layout shows them: their text is listed.
    box = [x for x in at.expander if x.label == "Finished: what 2 requests generated"]
    assert len(box) == 1
    done = box[0].dataframe[0].value.set_index("request")
    e = engine(at)
    for rid, prompt in (("A", "abcdefgh"), ("B", "ijklm")):
        req = e.requests[rid]
        assert done.loc[rid, "prompt"] == prompt
        assert done.loc[rid, "generated text"] == e.model.codec.decode(
            req.tokens[req.prompt_len:])
        assert done.loc[rid, "status"] == "finished (max new tokens)"


def test_step_preempts_when_the_pool_runs_out_and_readmits_later() -> None:
    at = start(num_blocks=6)
    add(add(at, "abcdefgh", max_new=12), "ijklmnop", max_new=8)   # 2 + 2 full blocks
    at.number_input(key="batch_n").set_value(4)
    click(at, "btn_step_n")
    assert metrics(at)["Used blocks"] == "6 / 6"                  # 12 tokens each: 3 + 3
    # A's 13th token needs a block and none is free: B, admitted last, is preempted.
    click(at, "btn_step")
    m = metrics(at)
    assert (m["Preemptions"], m["Waiting requests"], m["Running requests"]) == ("1", "1", "1")
    assert "request B was preempted" in html(at, "pl-events")
    assert at.dataframe[0].value.set_index("request").loc["B", "status"] == "waiting"
    at.number_input(key="batch_n").set_value(20)
    click(at, "btn_step_n")
    m = metrics(at)
    assert (m["Finished requests"], m["Waiting requests"], m["Preemptions"]) == ("2", "0", "1")
    assert engine(at).requests["B"].num_generated == 8
    assert engine(at).requests["B"].num_preemptions == 1


def test_shuffle_moves_every_used_block_and_keeps_the_tokens() -> None:
    at = add(add(start()))
    before = export_snapshot(engine(at))
    click(at, "btn_shuffle")
    after = export_snapshot(engine(at))
    assert [r["tokens"] for r in after["requests"]] == [r["tokens"] for r in before["requests"]]
    old = set(before["requests"][0]["block_table"])
    new = after["requests"][0]["block_table"]
    assert all(b_new != b_old for b_new, b_old in
               zip(new, before["requests"][0]["block_table"], strict=True))
    assert html(at, "pl-events").count("block data moved") == 7
    # One permutation, applied at once: the log says so on every move.
    assert html(at, "pl-events").count("(all moves of a shuffle at once)") == 7
    assert metrics(at)["Used blocks"] == "7 / 32" and old != set(new)
    # Decoding after the move gives what the model computes: the reference agrees.
    click(at, "btn_step")
    err = engine(at).kernel_report.max_abs_err
    assert err is not None and err < 1e-4


@pytest.mark.parametrize(("action", "message"), [
    ("fork-existing", "Refused: request 'B' already exists; pick another child id"),
    ("grow-too-far", "Refused: request 'B' would need 33 blocks for 130 tokens but the pool "
                     "has only 32"),
    ("pin-busy", "Refused: pinned block 3 is not free (ref count 2)"),
    ("duplicate-id", "Refused: request 'A' already exists; pick another id"),
    # The id fields carry no length limit in the browser, which would drop a long paste
    # without a word: the server refuses it by the field's name.
    ("long-id", "Refused: Request id must be at most 64 characters; got 80"),
    ("long-child", "Refused: Child id must be at most 64 characters; got 65"),
])
def test_a_refused_action_shows_its_message_and_changes_nothing(action: str,
                                                                message: str) -> None:
    at = add(add(start()))
    before = export_snapshot(engine(at))
    if action == "fork-existing":
        pick(at, "A")
        at.text_input(key="req_child").input("B")
        click(at, "btn_fork")
    elif action == "grow-too-far":
        pick(at, "B")
        at.number_input(key="req_grow_n").set_value(107)
        click(at, "btn_grow")
    elif action == "pin-busy":
        add(at, "abcdefgh", pins="3, 20")
    elif action == "long-id":
        add(at, rid="x" * 80)
    elif action == "long-child":
        pick(at, "A")
        at.text_input(key="req_child").input("c" * 65)
        click(at, "btn_fork")
    else:
        add(at, rid="A")
    assert [e.value for e in at.error] == [message]
    assert not at.exception
    assert export_snapshot(engine(at)) == before


def test_config_change_asks_before_discarding_state() -> None:
    at = add(start())
    kept = engine(at)
    at.sidebar.number_input(key="cfg_num_blocks").set_value(64).run()
    assert any("1 request and 1 step leave the page and stay saved, under Recent sessions"
               in w.value for w in at.warning)
    assert engine(at) is kept and len(kept.requests) == 1     # nothing lost yet
    # Keep current: the field goes back, the warning goes away.
    click(at, "btn_keep_config")
    assert at.sidebar.number_input(key="cfg_num_blocks").value == 32
    assert not at.warning and engine(at) is kept
    # Change again and confirm: a new engine with the new pool and no requests.
    at.sidebar.number_input(key="cfg_num_blocks").set_value(64).run()
    at.sidebar.radio(key="cfg_allocation").set_value("random").run()
    click(at, "btn_apply_config")
    new = engine(at)
    assert new is not kept and new.config.num_blocks == 64
    assert new.config.allocation == "random" and not new.requests
    assert new.kernels.name == "torch"                         # the kernel choice stays
    assert metrics(at)["Used blocks"] == "0 / 64"
    assert status(at)[1].startswith("New engine: 64 blocks of 4 slots")


def test_config_change_on_an_empty_engine_applies_at_once() -> None:
    at = start()
    at.sidebar.selectbox(key="cfg_model").select("small").run()
    e = engine(at)
    assert (e.config.num_layers, e.config.num_heads, e.config.num_kv_heads,
            e.config.head_dim) == (4, 8, 2, 32)
    assert at.sidebar.number_input(key="cfg_head_dim").value == 32
    assert metrics(at)["Bytes per block"] == "8.0 KiB"       # 2 x 4 x 2 x 32 x 4 x 4
    at.sidebar.number_input(key="cfg_head_dim").set_value(48).run()
    assert at.sidebar.selectbox(key="cfg_model").value == "custom"
    assert engine(at).config.head_dim == 48


def test_invalid_settings_are_explained_and_not_applied() -> None:
    at = start()
    kept = engine(at)
    at.sidebar.number_input(key="cfg_num_kv_heads").set_value(3).run()
    assert [e.value for e in at.sidebar.error] == [
        "Heads (4) must be a multiple of KV heads (3) for grouped-query attention"]
    assert engine(at) is kept and not at.exception
    # A number past a field's range arrives (the fields carry no bounds, so the browser
    # never keeps one to itself) and is refused by the field's name.
    at.sidebar.number_input(key="cfg_num_kv_heads").set_value(2).run()
    at.sidebar.number_input(key="cfg_num_blocks").set_value(10**9).run()
    assert [e.value for e in at.sidebar.error] == [
        "Pool size must be 1 to 65,536; got 1,000,000,000"]
    assert engine(at) is kept and not at.exception
    # The page says so too, at its top: the sidebar's line may be out of sight.
    assert [w.value for w in at.main.warning] == [
        "The sidebar's settings are not applied: Pool size must be 1 to 65,536; got "
        "1,000,000,000. The engine keeps its current ones."]
    # Two fields out of range: both named, one line each (only the first was).
    at.sidebar.number_input(key="cfg_block_size").set_value(0).run()
    assert [e.value for e in at.sidebar.error] == [
        "Pool size must be 1 to 65,536; got 1,000,000,000  \nBlock size must be 1 to 256; "
        "got 0"]
    assert [w.value for w in at.main.warning] == [
        "The sidebar's settings are not applied: Pool size must be 1 to 65,536; got "
        "1,000,000,000; Block size must be 1 to 256; got 0. The engine keeps its current ones."]
    assert engine(at) is kept and not at.exception
    # A fraction in one field and a number out of range in another: both, in the
    # sidebar's order (a fraction alone was named).
    at.sidebar.number_input(key="cfg_num_blocks").set_value(1.5).run()
    assert [e.value for e in at.sidebar.error] == [
        "Pool size must be a whole number; got 1.5  \nBlock size must be 1 to 256; got 0"]
    assert engine(at) is kept and not at.exception
    at.sidebar.number_input(key="cfg_block_size").set_value(4).run()
    at.sidebar.number_input(key="cfg_num_blocks").set_value(32).run()
    assert not at.sidebar.error and not at.main.warning and engine(at) is kept


def test_a_number_past_a_controls_range_is_refused_by_name_and_changes_nothing() -> None:
    at = add(start())
    before = export_snapshot(engine(at))
    for key, value, message in [
            ("batch_n", 20_000, "Steps must be 1 to 10,000; got 20,000"),
            ("batch_n", 0, "Steps must be 1 to 10,000; got 0"),
            ("req_grow_n", -3, "Grow by (tokens) must be 1 to 65,536; got -3"),
            ("add_len", -5, "N random tokens must be 1 to 65,536; got -5"),
            ("add_max_new", 2_000_000, "Max new tokens must be 1 to 1,000,000; got 2,000,000"),
            ("add_n", 1_000, "Parallel samples (n) must be 1 to 64; got 1,000"),
            ("add_beam", 0, "Beam width must be 1 to 64; got 0")]:
        at.number_input(key=key).set_value(value)
        button = {"batch_n": "btn_step_n", "req_grow_n": "btn_grow"}.get(key, "btn_add")
        click(at, button)
        assert status(at) == ("error", f"Refused: {message}"), key
        assert export_snapshot(engine(at)) == before, key
        at.number_input(key=key).set_value(None if key.startswith("add_") else 1)
    click(at, "btn_step_n")
    assert status(at)[0] == "success" and engine(at).step == before["step"] + 1


def test_switching_the_kernel_keeps_every_request() -> None:
    at = add(add(start()))
    before = export_snapshot(engine(at))
    at.segmented_control(key="dev_kernel").set_value("auto").run()
    assert export_snapshot(engine(at)) == before
    assert "next model step runs on triton-interpreter" in status(at)[1]
    click(at, "btn_step")
    assert "Last model step ran on **triton-interpreter**" in markdown(at)


def test_the_kernel_panel_advises_torch_only_while_the_next_step_runs_interpreted() -> None:
    at = add(start("auto"))
    captions = lambda: " ".join(c.value for c in at.caption)  # noqa: E731
    assert "Pick *torch* in the sidebar for speed." in captions()
    at.segmented_control(key="dev_kernel").set_value("torch").run()
    # The last step still ran interpreted; the next one runs on torch, as picked.
    assert "Last model step ran on **triton-interpreter**" in markdown(at)
    assert "Pick *torch*" not in captions()
    assert "That step ran the Triton kernel under Triton's interpreter" in captions()
    click(at, "btn_step")
    assert "interpreter" not in captions()


def test_highlighting_a_request_or_a_block() -> None:
    at = add(add(start()))
    at.selectbox(key="focus_req").select("B").run()
    assert "Request **B** holds blocks 0, 1, 2, 3, 4, 6." in markdown(at)
    assert "▶ <b>B</b>" in html(at, "pl-layouts")
    at.number_input(key="focus_block").set_value(4).run()
    assert at.selectbox(key="focus_req").value is None     # the newest choice wins
    text = markdown(at)
    assert "Block **4**: used, ref count 2, 4/4 slots filled" in text
    # What it holds, as its tooltip says it (tiny-byte's bytes, quoted whole).
    tokens = block_tokens(export_snapshot(engine(at)), [4])[4]
    assert len(tokens) == 4
    assert f"held by A, B. It holds “{tokens}”." in shown(text)
    # A block with no hash says why ("hash —" left it to guess): a partly filled one
    # gets its hash once full; a free one keeps no prefix.
    e = engine(at)
    tail = e.block_table("B")[-1]
    at.number_input(key="focus_block").set_value(tail).run()
    assert "no hash yet (a block is hashed once full, so later prompts can share it)" in (
        markdown(at))
    free = next(b.id for b in e.manager.pool.blocks if b.state == "free")
    at.number_input(key="focus_block").set_value(free).run()
    assert "no hash (it keeps no cached prefix), held by no request." in markdown(at)
    # The field has no bounds in the browser: a block the pool lacks is refused here.
    for missing in (32, -1):
        at.number_input(key="focus_block").set_value(missing).run()
        assert [e.value for e in at.error] == [
            f"There is no block {missing}: this pool's ids run 0..31."]
        assert not at.exception and "Block **" not in markdown(at)


def test_reset_asks_first_then_discards_everything() -> None:
    at = add(start())
    kept = engine(at)
    click(at, "btn_reset")
    assert engine(at) is kept and kept.requests
    assert [w.value for w in at.sidebar.warning] == [
        "Reset discards the current 1 request and 1 step, here and in the saved session."]
    click(at, "btn_reset_cancel")
    assert engine(at) is kept and not at.sidebar.warning
    click(at, "btn_reset")
    click(at, "btn_reset_confirm")
    assert not engine(at).requests and engine(at).step == 0
    assert not at.sidebar.warning and not at.session_state["confirm_reset"]
    assert metrics(at)["Used blocks"] == "0 / 32"
    assert engine(at).kernels.name == "torch"


def test_a_large_pool_is_drawn_a_page_at_a_time() -> None:
    at = start(num_blocks=4096)
    add(at, None, length=1000)
    page = at.selectbox(key="grid_page")
    assert page.options == ["0–1,023", "1,024–2,047", "2,048–3,071", "3,072–4,095"]
    page.select(2).run()
    assert not at.exception
    assert metrics(at)["Used blocks"] == "250 / 4096"


def test_a_chat_message_goes_through_the_chat_template() -> None:
    from backend.models.tokenizer import chatml

    at = start()
    at.checkbox(key="add_chat").check()
    add(at, "What is paging?", max_new=2)
    e = engine(at)
    want = chatml([{"role": "user", "content": "What is paging?"}])
    assert e.requests["A"].tokens == list(want.encode())
    assert status(at)[1].startswith("Step 1: add A (chat 'What is paging?')")
    # Another chat shares the template's opening "<|im_start|>user\n": 4 full blocks.
    at.checkbox(key="add_chat").check()
    add(at, "Why blocks?", max_new=2)
    assert e.block_table("B")[:4] == e.block_table("A")[:4]
    assert e.block_table("B")[4] != e.block_table("A")[4]


def test_verify_against_a_full_recomputation() -> None:
    at = add(start())
    at.button(key="btn_fork").click().run()
    click(at, "verify")
    found = [s.value for s in at.success if "recomputed without paging" in s.value]
    assert len(found) == 1, [s.value for s in at.success]
    kv = re.search(r"max \|K/V in the blocks − recomputed\| = ([0-9.e+-]+)", found[0])
    assert kv is not None and float(kv.group(1)) < 1e-5
    assert found[0].startswith("2 requests, 46 tokens")
    assert found[0].endswith("They agree: each layer's keys and values, and the logits, "
                             "within 0.001 of their largest value (of 1 where values are "
                             "smaller): float rounding of float32.")
    # A click elsewhere keeps the verdict; the engine's next operation ends it.
    click(at, "btn_control")
    assert [s.value for s in at.success if "recomputed without paging" in s.value] == found
    click(at, "btn_step")
    assert not [s.value for s in at.success if "recomputed without paging" in s.value]
    click(at, "verify")
    # A block's keys changed behind the engine's back: the recomputation disagrees.
    e = engine(at)
    block = e.block_table("A")[0]
    e.cache.k[0][block] += 1.0
    click(at, "verify")
    bad = [x.value for x in at.error if "recomputed without paging" in x.value]
    assert len(bad) == 1 and "They disagree: the K/V differ by 1 in a layer" in bad[0]
    # NaN in a later layer once compared as agreement (max() passes over it).
    e.cache.k[0][block] -= 1.0
    e.cache.v[1][block] = float("nan")
    click(at, "verify")
    bad = [x.value for x in at.error if "recomputed without paging" in x.value]
    assert len(bad) == 1 and ("They disagree: the K/V differ from the recomputation by NaN "
                              "or infinity: one side holds a number where the other does "
                              "not") in bad[0]


def test_verify_says_it_is_recomputing_while_it_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seconds on a real model, with the last verdict still drawn: a spinner says so."""
    import streamlit as st
    said: list[str] = []
    real = st.spinner

    def recorded(text: str = "", **kwargs: object) -> object:
        said.append(text)
        return real(text, **kwargs)

    at = add(start())
    monkeypatch.setattr(st, "spinner", recorded)
    click(at, "verify")
    assert [s for s in said if s.startswith("Recomputing")] == [
        "Recomputing every running request from its first token, with no cache…"]
    assert any("recomputed without paging" in s.value for s in at.success)


def test_an_id_is_measured_without_the_blanks_around_it() -> None:
    rid = "r" * 64
    at = add(start(), rid=f"  {rid} ")
    assert list(engine(at).requests) == [rid]
    assert status(at)[1].startswith(f"Step 1: add {rid} ")


def test_app_runs_bare_as_a_process_spawned_from_the_server_runs_it() -> None:
    """multiprocessing's spawn start (the simulator's sweep) runs app.py as __mp_main__,
    with no server: a page then has no title, and reading one stopped the process."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", "import runpy; runpy.run_path('app.py', run_name='__mp_main__')"],
        cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
