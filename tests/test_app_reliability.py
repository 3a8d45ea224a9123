"""The app under AppTest where a browser would differ from AppTest's defaults.

AppTest sends each selectbox's value formatted with the newest labels, so it
never sees a label go stale. A browser holds the label it was last sent and
sends that back; `HeldLabel` replays exactly that for one selectbox.
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any, cast

from streamlit.proto.WidgetStates_pb2 import WidgetState
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Selectbox

from backend.core.config import EngineConfig
from backend.io.export import snapshot_bytes
from backend.io.snapshot import export_snapshot
from backend.sessions.playground import Settings
from backend.views.text import md_escape, plain_md
from tests.test_app import add, engine, shown, start, status


class _SendsHeldLabel(Selectbox[Any]):
    """A selectbox that sends `held` as its value, the way a browser's does."""

    held: str

    @property
    def _widget_state(self) -> WidgetState:
        ws = WidgetState()
        ws.id = self.id
        ws.string_value = self.held
        return ws


class HeldLabel:
    """The label a browser holds for the selectbox `key` between runs.

    A browser takes a new label only when a run sends one (`set_value`, when Python
    set the key); otherwise it keeps the one it has, even when the options' labels
    changed, and shows it.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.label: str | None = None

    def observe(self, at: AppTest) -> None:
        found = [s for s in at.selectbox if s.key == self.key]
        if not found:
            self.label = None
            return
        proto = found[0].proto
        if proto.set_value:
            self.label = proto.raw_value
        elif self.label is None:
            self.label = proto.options[proto.default]

    def choose(self, label: str) -> None:
        """The person picks the option shown as `label`."""
        self.label = label

    def run(self, at: AppTest, button: str) -> AppTest:
        """Click `button`, with this selectbox sending the label the browser holds."""
        picker = at.selectbox(key=self.key)
        assert self.label is not None
        picker.__class__ = _SendsHeldLabel
        cast("_SendsHeldLabel", picker).held = self.label
        at.button(key=button).click().run()
        assert not at.exception
        self.observe(at)
        return at


def test_the_request_picker_counts_one_token_in_the_singular() -> None:
    at = start()
    add(at, "x")
    assert at.selectbox(key="req_pick").options == ["A · running · 1 token"]


def test_the_request_picker_acts_on_the_picked_request_after_the_counts_change() -> None:
    at = start()
    held = HeldLabel("req_pick")
    add(at)
    held.observe(at)
    add(at)
    held.observe(at)
    assert held.label == "B · running · 23 tokens"       # the new request is picked
    held.run(at, "btn_step")
    # The browser shows the count of this run, not of the run that picked B.
    assert held.label == "B · running · 24 tokens"
    assert at.selectbox(key="req_pick").options == ["A · running · 24 tokens",
                                                    "B · running · 24 tokens"]
    held.choose("A · running · 24 tokens")
    held.run(at, "btn_step")
    assert held.label == "A · running · 25 tokens"

    held.run(at, "btn_grow")
    assert status(at)[1].startswith("Step 5: grow A +1 · generated 1 token")
    assert (engine(at).requests["A"].num_tokens, engine(at).requests["B"].num_tokens) == (26, 25)
    assert held.label == "A · running · 26 tokens"

    held.run(at, "btn_fork")
    assert status(at)[1].startswith("Step 6: fork A -> A.1")
    assert held.label == "A.1 · running · 26 tokens"      # the child is picked next
    held.run(at, "btn_step")
    held.run(at, "btn_finish")
    assert status(at)[1].startswith("Step 8: finish A.1")
    assert [r.id for r in engine(at).requests.values() if r.status == "finished"] == ["A.1"]
    assert held.label is not None and held.label.startswith("B · running")


# ---- user text is plain text --------------------------------------------------------

IMAGE = "![x](http://example.invalid/a.png)"
CHILD = ":red[c]![y](http://example.invalid/b.png)"   # a colour and an image, 42 characters
SCENARIO: dict[str, Any] = {
    "name": f"Story {IMAGE}",
    "description": f"$x$ :material/home: {IMAGE}",
    "config": {"num_blocks": 8, "block_size": 4},
    "steps": [
        {"op": "add", "request": IMAGE, "prompt": "abcdef", "narration": f"**{IMAGE}** arrives.",
         "expect": {f"requests.{IMAGE}.num_tokens": 6}},
        {"op": "fork", "request": IMAGE, "child": CHILD, "narration": "It forks."},
        {"op": "grow", "request": "![z](http://example.invalid/z.png)"},
    ],
}
# Streamlit's elements whose text it renders as Markdown.
MARKDOWN_ELEMENTS = ("markdown", "caption", "error", "success", "info", "warning", "title",
                     "header", "subheader")


def _code_span_end(source: str, i: int) -> int:
    """Past the code span opening at `i` (a run of backticks), or past the run alone."""
    run = len(source) - i - len(source[i:].lstrip("`"))
    close = re.compile(rf"(?<!`)`{{{run}}}(?!`)").search(source, i + run)
    return close.end() if close else i + run


def unescaped_images(source: str) -> list[int]:
    """Where Markdown `source` opens an image: a "![" with neither character escaped.

    Backslash escapes and code spans are skipped, as a Markdown parser skips them.
    """
    hits, i = [], 0
    while i < len(source):
        c = source[i]
        if c == "\\":
            i += 2
            continue
        if c == "`":
            i = _code_span_end(source, i)
            continue
        if c == "!" and source.startswith("[", i + 1):
            hits.append(i)
        i += 1
    return hits


def markdown_sources(at: AppTest) -> list[str]:
    return [e.value for kind in MARKDOWN_ELEMENTS for e in getattr(at, kind)]


def assert_plain(at: AppTest, *texts: str) -> None:
    """No Markdown element renders an image, and each of `texts` is shown as written."""
    sources = markdown_sources(at)
    bad = [s for s in sources if unescaped_images(s)]
    assert not bad, bad
    assert not [h.value for h in at.html if "<img" in h.value]
    every = "\n".join(shown(s) for s in sources) + "\n".join(h.value for h in at.html)
    for text in texts:
        assert text in every or escape(text) in every, text


def test_the_image_check_finds_what_markdown_would_render() -> None:
    assert unescaped_images(IMAGE) == [0]
    assert unescaped_images(f"a **{IMAGE}**") == [4]
    assert unescaped_images(md_escape(IMAGE)) == []
    assert unescaped_images(f"`{IMAGE}`") == []
    assert unescaped_images(plain_md(f"Refused: request {IMAGE!r}")) == []


def test_request_ids_and_uploaded_text_with_markdown_are_shown_as_plain_text() -> None:
    at = start()
    add(at, f"{IMAGE[:22]}", rid=IMAGE)
    assert status(at)[1].startswith(f"Step 1: add {IMAGE}")
    at.selectbox(key="focus_req").select(IMAGE).run()
    at.text_input(key="req_child").input(CHILD)
    at.button(key="btn_fork").click().run()
    assert status(at)[1].startswith(f"Step 2: fork {IMAGE} -> {CHILD}")
    add(at, rid=IMAGE)                               # refused: quotes the id
    assert status(at) == ("error", f"Refused: request {IMAGE!r} already exists; pick "
                                   "another id")
    assert_plain(at, IMAGE, CHILD, f"Request **{IMAGE}** holds blocks")

    # A snapshot is someone's file too: its kernel names are shown as written.
    snap = export_snapshot(engine(at))
    snap["kernel"]["backend"] = IMAGE
    snap["kernel"]["device"] = CHILD
    # (A Markdown file name is left out: ui/exports.py repeats it in a caption as it is.)
    at.file_uploader(key="import_snapshot").set_value(
        ("snap.json", snapshot_bytes(snap), "application/json")).run()
    assert not at.exception
    assert status(at)[1].startswith("Restored the snapshot in 'snap.json'")
    assert_plain(at, f"Last model step ran on **{IMAGE}** ({CHILD})")

    # An uploaded scenario: name, description, narration, ids, and the refused step.
    at.switch_page("pages/scenarios.py").run()
    at.file_uploader(key="tour_file").set_value(
        ("story.json", json.dumps(SCENARIO).encode(), "application/json")).run()
    assert not at.exception
    assert_plain(at, SCENARIO["name"], SCENARIO["description"])
    for _ in range(3):
        at.button(key="tour_next").click().run()
        assert not at.exception
        assert_plain(at)
    at.slider(key="tour_slider").set_value(1).run()
    assert_plain(at, f"requests.{IMAGE}.num_tokens", f"**{IMAGE}** arrives.", f"add {IMAGE}")
    errors = [shown(e.value) for e in at.error]
    assert errors == ["The engine refused step 3 (grow): request "
                      "'![z](http://example.invalid/z.png)' does not exist. The run stops "
                      "there: step 2 is the state before it."]


# ---- a module imported afresh ---------------------------------------------------------------

def test_settings_made_by_a_module_imported_afresh_are_still_the_same_settings() -> None:
    # Streamlit imports a changed source file's module again on the next run; the
    # session's EngineConfig was made by the old class. A subclass stands in for it:
    # equal fields, another class.
    class Reloaded(EngineConfig):
        __slots__ = ()

    at = add(start())
    settings = at.session_state["settings"]
    old = Reloaded(**settings.config.to_json())
    at.session_state["settings"] = Settings(old, settings.device, settings.kernel)
    at.run()
    assert not at.exception
    assert not at.warning, [w.value for w in at.warning]
    assert engine(at).requests.keys() == {"A"}


def test_the_prompt_box_carries_its_default_for_a_browser_that_rebuilds_the_form() -> None:
    # Under load a superseded rerun can make the browser rebuild the Add form; a widget
    # rebuilt there starts from its own default, which used to be empty, so the next Add
    # was refused with "type a prompt" (bench/app_latency.py, 4 of 5 loaded runs).
    from ui.session import DEFAULT_PROMPT

    at = start()
    box = at.text_area(key="add_prompt")
    assert box.value == DEFAULT_PROMPT and box.proto.default == DEFAULT_PROMPT


def test_sidebar_fields_carry_the_applied_settings_as_their_defaults() -> None:
    # The same rebuild in the sidebar: a field rebuilt at its minimum or first option
    # read as an edit and asked to reset the engine ("These settings need a new engine").
    at = start(num_blocks=12, block_size=8)
    at.sidebar.radio(key="cfg_preemption").set_value("swap").run()
    e = engine(at)
    assert (e.config.num_blocks, e.config.block_size, e.config.preemption) == (12, 8, "swap")
    # The run that applies a change draws its fields first: the next one has them.
    at.run()
    assert at.sidebar.number_input(key="cfg_num_blocks").proto.default == 12
    assert at.sidebar.number_input(key="cfg_block_size").proto.default == 8
    assert at.sidebar.number_input(key="cfg_num_cpu_blocks").proto.default == 12
    preemption = at.sidebar.radio(key="cfg_preemption")
    assert preemption.proto.options[preemption.proto.default] == "swap"
