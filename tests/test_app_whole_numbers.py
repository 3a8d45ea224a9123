"""Whole-number fields sent a fraction, in AppTest, and `ui.numbers.whole` itself.

A browser's integer field would turn "2.5" into 2 and "1e5" into 1 before the page saw
it (tests/test_browser_reliability.py types them in Chromium); the fields are float
fields read through `whole`, so a fraction arrives and is refused by the field's name,
with the state it was aimed at left as it was.
"""

from __future__ import annotations

import json
import math

import pytest

from backend.core.config import SMOLLM2, TINY_BYTE, EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.io.snapshot import export_snapshot
from tests.test_app import add, click, engine, markdown, shown, start, status
from tests.test_app_timeline import open_details, step_n
from tests.test_exports_app import upload
from ui.numbers import MAX_EXACT, not_whole, out_of_range, whole


def test_whole_takes_whole_floats_and_refuses_fractions_by_name() -> None:
    assert whole("Steps", None) is None
    assert whole("Steps", 7) == 7
    got = whole("Steps", 7.0)
    assert got == 7 and type(got) is int
    assert whole("Steps", -0.0) == 0
    assert whole("Seed", float(MAX_EXACT)) == MAX_EXACT
    for bad, said in [(2.5, "2.5"), (0.1, "0.1"), (-1e-9, "-1e-09"), (12345.75, "12,345.75")]:
        with pytest.raises(PagedLabError) as err:
            whole("Steps", bad)
        assert str(err.value) == f"Steps must be a whole number; got {said}"
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(PagedLabError, match=r"^Steps must be a whole number"):
            whole("Steps", bad)
    # A fraction is quoted in full, never rounded to look whole; a huge number as a
    # browser writes it.
    assert not_whole("Steps", 2.0000000001) == (
        "Steps must be a whole number; got 2.0000000001")
    assert not_whole("Steps", 1234567890.5).endswith("got 1,234,567,890.5")
    assert out_of_range("Steps", 1, 10_000, 10_000.0000001).endswith("got 10,000.0000001")
    assert out_of_range("Steps", 1, 10_000, 1e300) == "Steps must be 1 to 10,000; got 1e+300"
    assert out_of_range("Steps", 1, 10_000, int(1e300)).endswith("got 1e+300")
    assert out_of_range("Steps", 1, 10_000, 20_000.0).endswith("got 20,000")


def test_a_fraction_in_a_controls_field_is_refused_by_name_and_changes_nothing() -> None:
    at = add(start())
    before = export_snapshot(engine(at))
    for key, label in [("batch_n", "Steps"), ("req_grow_n", "Grow by (tokens)"),
                       ("add_len", "N random tokens"), ("add_max_new", "Max new tokens"),
                       ("add_n", "Parallel samples (n)"), ("add_beam", "Beam width")]:
        at.number_input(key=key).set_value(2.5)
        button = {"batch_n": "btn_step_n", "req_grow_n": "btn_grow"}.get(key, "btn_add")
        click(at, button)
        assert status(at) == ("error", f"Refused: {label} must be a whole number; got 2.5"), key
        assert export_snapshot(engine(at)) == before, key
        at.number_input(key=key).set_value(None if key.startswith("add_") else 1)
    # A whole number arrives as the float the browser sends, and acts as that number.
    at.number_input(key="add_len").set_value(3.0)
    click(at, "btn_add")
    assert status(at)[0] == "success"
    assert engine(at).requests["B"].prompt_len == 3


def test_a_fraction_or_a_rounded_seed_in_the_sidebar_is_refused_and_the_engine_kept() -> None:
    at = start()
    kept = engine(at)
    at.sidebar.number_input(key="cfg_num_blocks").set_value(2.5).run()
    assert [e.value for e in at.sidebar.error] == ["Pool size must be a whole number; got 2.5"]
    assert engine(at) is kept and not at.exception
    at.sidebar.number_input(key="cfg_num_blocks").set_value(32.0)
    # Past 2^53 - 1 a browser rounds the number typed: the seed applied would not be it.
    at.sidebar.number_input(key="cfg_seed").set_value(float(1 << 53)).run()
    assert [e.value for e in at.sidebar.error] == [
        "Seed must be 0 to 9,007,199,254,740,991; got 9,007,199,254,740,992: a browser's "
        "field rounds a larger number, so it would not be the number typed (a scenario or "
        "snapshot file may give up to 9,223,372,036,854,775,807)"]
    assert engine(at) is kept and not at.exception
    # Below 0 too, the range said is the field's, not the file's larger one.
    at.sidebar.number_input(key="cfg_seed").set_value(-1.0).run()
    assert [e.value for e in at.sidebar.error] == [
        "Seed must be 0 to 9,007,199,254,740,991; got -1"]
    assert engine(at) is kept and not at.exception
    # Whole numbers as floats apply, as ints (an empty engine applies at once).
    at.sidebar.number_input(key="cfg_seed").set_value(float(MAX_EXACT))
    at.sidebar.number_input(key="cfg_num_blocks").set_value(48.0).run()
    assert not at.sidebar.error and not at.exception
    config = engine(at).config
    assert (config.num_blocks, config.seed) == (48, MAX_EXACT)
    assert type(config.num_blocks) is int and type(config.seed) is int


def test_a_fraction_in_a_views_field_is_refused_where_it_was_typed() -> None:
    at = add(start())
    at.number_input(key="focus_block").set_value(2.5).run()
    assert [shown(e.value) for e in at.error] == [
        "Inspect a block must be a whole number; got 2.5"]
    assert not at.exception and "Block **" not in markdown(at)
    at.number_input(key="focus_block").set_value(1e300).run()
    assert [shown(e.value) for e in at.error] == [
        "There is no block 1e+300: this pool's ids run 0..31."]
    at.number_input(key="focus_block").set_value(2.0).run()
    assert not at.error and "Block **2**: used, ref count 1" in markdown(at)
    at.number_input(key="tr_pos").set_value(6.5).run()
    assert [shown(e.value) for e in at.error] == [
        "Token position must be a whole number; got 6.5"]
    assert "physical block **" not in markdown(at)
    at.number_input(key="tr_pos").set_value(6.0).run()
    assert not at.error and "logical block **1**, offset **2**" in markdown(at)


def test_a_fraction_picked_on_the_timeline_shows_the_live_state_and_says_why() -> None:
    at = open_details(step_n(add(start()), 3))
    live = markdown(at)
    at.number_input(key="tl_iteration").set_value(1.5).run()
    assert not at.exception
    assert [shown(e.value) for e in at.error] == [
        "Show the state after iteration must be a whole number; got 1.5. Showing the live "
        "state."]
    assert at.number_input(key="tl_iteration").value is None and markdown(at) == live


def test_a_restored_seed_past_what_a_browser_holds_survives_its_rounded_echo() -> None:
    seed = (1 << 60) + 1
    snap = export_snapshot(Engine(EngineConfig(seed=seed), device="cpu", kernel="torch"))
    at = upload(start(), json.dumps(snap).encode())
    kept = engine(at)
    assert kept.config.seed == seed
    # The browser holds the seed as the nearest double and sends that back with the next
    # click: it is the applied seed, not a new one (and not a refusal nobody caused).
    at.sidebar.number_input(key="cfg_seed").set_value(float(seed)).run()
    assert not at.sidebar.error and not at.main.warning and engine(at) is kept
    assert ("The seed is 1,152,921,504,606,846,977; the field shows it rounded, and the seed "
            "stays exactly this until another is typed.") in [c.value for c in at.sidebar.caption]
    add(at)
    assert status(at)[0] == "success" and engine(at).config.seed == seed
    # Another number past 2^53 - 1 is one the person typed: refused, the engine kept.
    at.sidebar.number_input(key="cfg_seed").set_value(float(seed) * 2).run()
    assert [e.value for e in at.sidebar.error] == [
        "Seed must be 0 to 9,007,199,254,740,991; got 2,305,843,009,213,693,952: a browser's "
        "field rounds a larger number, so it would not be the number typed (a scenario or "
        "snapshot file may give up to 9,223,372,036,854,775,807)"]
    assert engine(at) is kept


def test_every_refused_sidebar_field_is_named_and_keep_current_puts_them_back() -> None:
    at = start()
    kept = engine(at)
    at.sidebar.number_input(key="cfg_block_size").set_value(2.5)
    at.sidebar.number_input(key="cfg_num_layers").set_value(1.5).run()
    assert [e.value for e in at.sidebar.error] == [
        "Block size must be a whole number; got 2.5  \nLayers must be a whole number; got 1.5"]
    assert [w.value for w in at.main.warning] == [
        "The sidebar's settings are not applied: Block size must be a whole number; got 2.5; "
        "Layers must be a whole number; got 1.5. The engine keeps its current ones."]
    assert engine(at) is kept
    click(at, "btn_keep_config")
    assert not at.sidebar.error and not at.main.warning and engine(at) is kept
    assert at.sidebar.number_input(key="cfg_block_size").value == 4
    assert at.sidebar.number_input(key="cfg_num_layers").value == 2


def test_a_refusal_after_the_settings_prefix_reads_as_a_sentence() -> None:
    at = start()
    for key, value in (("cfg_num_layers", 8), ("cfg_num_heads", 32), ("cfg_num_kv_heads", 32),
                       ("cfg_head_dim", 256)):
        at.sidebar.number_input(key=key).set_value(value)
    at.run()
    [error] = [e.value for e in at.sidebar.error]
    assert error.startswith("The model's weights would take 20,497 MiB; the limit is 1,024 MiB")


def test_a_fraction_in_a_field_that_cannot_be_edited_does_not_hold_the_settings() -> None:
    at = start()
    kept = engine(at)
    # Swap's host pool takes the pool's size, never a fraction typed there.
    at.sidebar.number_input(key="cfg_num_blocks").set_value(2.5)
    at.sidebar.radio(key="cfg_preemption").set_value("swap").run()
    assert at.sidebar.number_input(key="cfg_num_cpu_blocks").value == 32
    assert [e.value for e in at.sidebar.error] == ["Pool size must be a whole number; got 2.5"]
    at.sidebar.number_input(key="cfg_num_blocks").set_value(32.0).run()
    assert not at.sidebar.error and engine(at).config.preemption == "swap"
    # Under swap the host pool's range starts at 1 (0 is no host pool), alone or beside
    # another field's refusal.
    swapped = engine(at)
    at.sidebar.number_input(key="cfg_num_cpu_blocks").set_value(10_000_000).run()
    assert [e.value for e in at.sidebar.error] == [
        "Host pool must be 1 to 65,536; got 10,000,000"]
    at.sidebar.number_input(key="cfg_num_blocks").set_value(2.5).run()
    assert [e.value for e in at.sidebar.error] == [
        "Pool size must be a whole number; got 2.5  \nHost pool must be 1 to 65,536; got "
        "10,000,000"]
    at.sidebar.number_input(key="cfg_num_blocks").set_value(32.0)
    at.sidebar.number_input(key="cfg_num_cpu_blocks").set_value(0).run()
    assert [shown(e.value) for e in at.sidebar.error] == [
        'Preemption "swap" needs a host pool: set Host pool to 1 or more']
    assert engine(at) is swapped
    at.sidebar.number_input(key="cfg_num_cpu_blocks").set_value(32).run()
    assert not at.sidebar.error and engine(at).config.num_cpu_blocks == 32
    # A fraction left in the host pool when Recompute is picked (the field disabled).
    at.sidebar.number_input(key="cfg_num_cpu_blocks").set_value(2.5).run()
    assert [e.value for e in at.sidebar.error] == ["Host pool must be a whole number; got 2.5"]
    at.sidebar.radio(key="cfg_preemption").set_value("recompute").run()
    assert not at.sidebar.error and engine(at).config.preemption == "recompute"
    assert engine(at).config.num_cpu_blocks == 32 and engine(at) is not kept


@pytest.mark.slow
def test_tiny_bytes_size_fields_are_not_read_for_a_real_model() -> None:
    at = add(start())
    at.sidebar.number_input(key="cfg_num_layers").set_value(1.5).run()
    assert [e.value for e in at.sidebar.error] == ["Layers must be a whole number; got 1.5"]
    # SmolLM2's dimensions come from its weights: the hidden Layers field is not read.
    at.sidebar.selectbox(key="cfg_model_name").select(SMOLLM2).run()
    assert not at.sidebar.error and not at.exception
    assert at.button(key="btn_apply_config")
    # Back to tiny-byte, its size fields are drawn again as they were left (fields keep
    # what was typed): the fraction is refused again, by name.
    at.sidebar.selectbox(key="cfg_model_name").select(TINY_BYTE).run()
    assert [e.value for e in at.sidebar.error] == ["Layers must be a whole number; got 1.5"]
    assert at.sidebar.number_input(key="cfg_num_layers").value == 1.5
