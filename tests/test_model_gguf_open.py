"""Opening the GGUF file tells the seconds as it goes: its metadata is about half a
weight load on a small CPU, with nothing inside it to report from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backend.core.errors import PagedLabError
from backend.models import gguf_loader
from backend.models.gguf_loader import find_gguf

pytestmark = pytest.mark.slow


def test_opening_the_model_file_says_how_long_so_far_and_gives_its_reader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_loader, "OPEN_TICK_S", 0.05)
    said: list[tuple[float, str]] = []
    path = find_gguf()
    reader = gguf_loader._open_telling(path, lambda f, text: said.append((f, text)))
    # The vocabulary, read whole in the other thread.
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 49_152
    assert len(said) >= 2, said
    line = re.compile(rf"^opening {re.escape(path.name)}: reading its vocabulary and tensor "
                      r"index, (\d+) s so far$")
    seconds = []
    for fraction, text in said:
        found = line.match(text)
        assert fraction == 0.0 and found is not None, text
        seconds.append(int(found.group(1)))
    assert seconds == sorted(seconds)


def test_a_file_that_is_no_gguf_is_refused_in_the_callers_thread(tmp_path: Path) -> None:
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"not a gguf file at all" * 8)
    said: list[str] = []
    with pytest.raises(PagedLabError, match=r"^cannot read .*model\.gguf: "):
        gguf_loader._open_telling(junk, lambda _, text: said.append(text))
    assert said and said[0].startswith("opening model.gguf: ")
