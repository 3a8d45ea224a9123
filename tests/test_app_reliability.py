"""The app under AppTest where a browser would differ from AppTest's defaults.

AppTest sends each selectbox's value formatted with the newest labels, so it
never sees a label go stale. A browser holds the label it was last sent and
sends that back; `HeldLabel` replays exactly that for one selectbox.
"""

from __future__ import annotations

from typing import Any, cast

from streamlit.proto.WidgetStates_pb2 import WidgetState
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Selectbox

from tests.test_app import add, engine, start, status


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
        cast(_SendsHeldLabel, picker).held = self.label
        at.button(key=button).click().run()
        assert not at.exception
        self.observe(at)
        return at


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
    assert status(at)[1].startswith("Step 5: grow A +1 · generated 1 token(s)")
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
