"""The Scenarios page's checks read as words, and terms across the pages explain themselves.

A check's value is shown as a reader would say it ("slots 0–5 reserved, 2 hold
tokens", not `{"start": 0, "reserved": 6, ...}`), and each metric, check, event
kind and table column carries a tooltip saying what it means.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from backend import views
from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Fork, Grow
from backend.io.snapshot import export_snapshot
from backend.views import tour as tour_views
from backend.views.glossary import EVENTS
from tests.test_app import add, html, start
from tests.test_scenarios_app import checks, open_tour
from ui import panels

SCENARIOS = Path(__file__).resolve().parents[1] / "assets" / "scenarios"
# JSON's marks: braces, and a quoted key before a colon.
RAW_JSON = re.compile(r"[{}]|\"\w+\":")


@pytest.mark.parametrize(("path", "value", "shown"), [
    ("contiguous.regions.A", {"start": 0, "reserved": 6, "tokens": 2, "final_len": 6},
     "slots 0–5 (6 reserved), 2 holding tokens, final length 6"),
    ("contiguous.regions.B", {"start": 6, "reserved": 3, "tokens": 1, "final_len": 3},
     "slots 6–8 (3 reserved), 1 holding a token, final length 3"),
    ("address.A.6", {"logical_block": 1, "offset": 2, "physical_block": 2, "slot": 10},
     "logical block 1, offset 2 → physical block 2, slot 10"),
    ("contiguous.holes", [[6, 3], [14, 2]], "slots 6–8 (3), slots 14–15 (2)"),
    ("contiguous.waiting", ["D"], "D"),
    ("contiguous.waiting", [], "none"),
    ("requests.D.block_table", [11, 12, 13, 14], "[11, 12, 13, 14]"),
    ("requests.C.status", "finished", "finished"),
    ("text.C", " mkvibs", "“ mkvibs”"),
    ("text.S1", "<|im_start|>system\nHi\x07", "“<|im_start|>system\\nHi\\x07”"),
    ("metrics.used_blocks", 7, "7"),
    ("blocks.3.hash", None, "none"),
    ("contiguous.next_fit.reason", "external_fragmentation", "external fragmentation"),
])
def test_a_checked_value_reads_as_words(path: str, value: object, shown: str) -> None:
    assert tour_views.value_text(path, value) == shown


def test_a_long_text_keeps_both_ends() -> None:
    # A chat's text opens with its template; what the model answered is at the end.
    shown = tour_views.value_text("text.S1", "<|im_start|>system\n" + "x" * 200 +
                                  "A flat white is")
    assert len(shown) == tour_views.MAX_VALUE_CHARS and shown.count("…") == 1
    assert shown.startswith("“<|im_start|>system\\nxx") and shown.endswith("xA flat white is”")


@pytest.mark.parametrize("stem", ["01-contiguous-problem", "02-block-table"])
def test_no_check_on_the_page_shows_raw_json(stem: str) -> None:
    at = open_tour(stem)
    steps = json.loads((SCENARIOS / f"{stem}.json").read_text())["steps"]
    for _ in steps:
        at.button(key="tour_next").click().run()
        assert not at.exception
        for path, (ok, body) in checks(at).items():
            value = unescape(re.sub(r"<[^>]+>", "", body.split("</span>", 1)[-1]))
            assert ok and not RAW_JSON.search(value), (path, value)


def test_metrics_carry_their_meaning_as_a_visible_tooltip() -> None:
    e = Engine(EngineConfig(num_blocks=16, block_size=4), kernel="torch")
    e.apply(Add("A", prompt="The cat sat on the mat."))
    page = views.metrics_html(views.metric_items(export_snapshot(e)))
    terms = dict(re.findall(r"<span class='pl-term' title='([^']+)'[^>]*>([^<]+)</span>", page))
    by_label = {label: unescape(tip) for tip, label in terms.items()}
    assert "block-granular cache" in by_label["Uncacheable prompt tail"]
    assert len(by_label) == len(views.metric_items(export_snapshot(e)))
    # The same meanings where a keyboard reaches them (a title shows only on hover):
    # a closed disclosure under the cards, one term and meaning per number.
    meanings = re.search(r"<details class='pl-meanings'.*?</details>", page)
    assert meanings is not None, page
    listed = dict(re.findall(r"<dt[^>]*>([^<]+)</dt><dd[^>]*>([^<]+)</dd>", meanings.group()))
    assert {unescape(k): unescape(v) for k, v in listed.items()} == by_label


def test_the_event_log_heading_help_says_every_kind() -> None:
    """The kinds' badges explain themselves on hover only; the heading's help, which
    opens on focus, lists each with the same sentence."""
    for kind, what in EVENTS.items():
        assert f"- **{kind}**: {what}" in panels.HELP["events"], kind


def test_checks_event_kinds_and_columns_say_what_they_mean() -> None:
    # A check's term: the glossary's sentence, with the raw path for readers of the file.
    at = open_tour("08-fork-copy-on-write")
    for _ in range(3):
        at.button(key="tour_next").click().run()
    body = checks(at)["step_events.cow"][1]
    tip = re.search(r"<span class='pl-term' title='([^']+)'", body)
    assert tip is not None and "Copy-on-write" in unescape(tip.group(1)), body
    assert "step_events.cow" in unescape(tip.group(1))
    # Event kinds in the log.
    e = Engine(EngineConfig(num_blocks=16, block_size=4), kernel="torch")
    for op in (Add("A", prompt="The cat sat"), Fork("A", "B"), Grow("B", 2)):
        e.apply(op)
    log = views.event_log_html(views.events_frame(export_snapshot(e)))
    assert re.search(r"title='Copy-on-write: [^']+'>cow<", log), log
    # The block tables' columns (st.dataframe column help).
    at = add(start())
    columns = json.loads(at.dataframe[0].proto.columns)
    assert "preempted" in columns["preempted"]["help"]
    assert "physical block" in columns["block table (logical→physical)"]["help"]
    assert "pl-term" in html(at, "pl-metrics")


def test_a_new_engine_s_line_says_prefix_caching_is_off() -> None:
    """Continue in the Playground keeps a scenario's settings, prefix caching off among
    them; New session then says so, or two same prompts sharing nothing surprise."""
    from ui.engine_actions import departures

    assert departures(EngineConfig()) == ""
    assert departures(EngineConfig(prefix_caching=False, max_num_seqs=2)) == (
        "; prefix caching off, at most 2 running")
