"""ui/a11y.py's script, read as the browser gets it; its behaviour is checked in
Chromium (tests/test_browser_a11y.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ui import a11y

ROOT = Path(__file__).resolve().parents[1]
UI = ROOT / "ui"
PAGES = ROOT / "pages"


def test_the_script_gets_the_read_out_keys_and_no_placeholder() -> None:
    text = a11y.script()
    assert "__" not in text.replace("window.__pagedlabA11y", "")
    assert f"const READ_OUT = {json.dumps(a11y.READ_OUT)};" in text
    assert f"const TAB_KEY = {json.dumps(a11y.TAB_KEY)};" in text
    assert f"const PLAYING = {json.dumps(a11y.PLAYING)};" in text
    # Installed once per tab, however many runs draw it.
    assert "if (window.__pagedlabA11y) return;" in text


def test_every_read_out_key_names_a_container_the_pages_draw() -> None:
    """A renamed container would silently stop being read out."""
    keys = set()
    for path in [*UI.rglob("*.py"), *PAGES.glob("*.py")]:
        # st.container(key="tour_narration"), key=f"{prefix}focus_said",
        # key=f"status_line--{number}": the literal name of a container's key.
        keys |= {m.group(1) for m in re.finditer(
            r'container\([^)]*key=f?"(?:\{\w+\})?(\w+)(?:--\{\w+(?:\(\w+\))?\})?"',
            path.read_text(encoding="utf-8"))}
        # a11y.said("cmp_seed", "result"): a container keyed by its ending; a11y.refused.
        text = path.read_text(encoding="utf-8")
        keys |= {m.group(1) for m in re.finditer(r'a11y\.said\([^,]+, "(\w+)"', text)}
        keys |= {"refused" for _ in re.finditer(r"a11y\.refused\(", text)}
    missing = [k for k in a11y.READ_OUT if not any(key.endswith(k) for key in keys)]
    assert not missing, (missing, sorted(keys))


def test_said_takes_only_a_read_out_ending() -> None:
    """A container keyed with an ending the script does not watch would be silent."""
    with pytest.raises(ValueError, match="READ_OUT"):
        a11y.said("cmp_seed", "outcome")


def test_the_tab_key_is_the_compare_page_s() -> None:
    """A tab change is told from the tab bar keyed TAB_KEY: a renamed key would read
    every newly opened tab out as news."""
    from ui.compare import TAB_KEY

    assert a11y.TAB_KEY == TAB_KEY
