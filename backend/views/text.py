"""User text as Markdown source that Streamlit shows as exactly that text.

Streamlit renders st.markdown, st.caption, st.error and their kin as Markdown,
and adds its own syntax on top: `:red[...]` colours, `:material/icon:` and
`:smile:` shortcodes, `$...$` LaTeX. Request ids, scenario names, narration,
snapshot fields and error messages that quote them are typed or uploaded by
someone, so each goes through one of these before it reaches a Markdown
element: otherwise `![x](http://host/a.png)` in a scenario name makes every
viewer's browser fetch that image.

    md_escape(text)   a fragment to embed in Markdown of our own ("**{md_escape(rid)}**")
    plain_md(text)    a whole message: unchanged when nothing in it is syntax
    md_code(text)     a code span when that is safe, else the escaped text

One liberty remains: Streamlit typesets "->", "<-", "<=", ">=" and "--" as arrows,
signs and dashes even when escaped. That changes how text looks, never what the
page loads.

No Streamlit here: tests check the same strings the pages render.
"""

from __future__ import annotations

import re

# Every ASCII punctuation character may be backslash-escaped in CommonMark, and an
# escaped one is always literal. Streamlit's shortcodes are matched on the source as
# well, and a backslash inside `:material/x:` breaks that match too.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")

# Characters that are syntax (or start it) wherever they stand. A bracket alone is
# not: "requests[0]" is plain, and the patterns that make brackets a link or an
# image are in _INLINE.
_SYNTAX_CHARS = frozenset("\\`*~$<>&|#\n\r\t\f\v")
# Syntax at the start of a line: lists, quotes, headings, breaks, link definitions.
_LINE_START = re.compile(r"^(?:[-+=*_>#\[]|\d+[.)])")
# Links and images, and what GFM turns into a link without any brackets.
_INLINE = re.compile(r"!\[|\]\(|\]\[|==|www\.|://|@", re.IGNORECASE)
_WWW = re.compile(r"www(?=\\\.)", re.IGNORECASE)
WORD_JOINER = "\u2060"
# HTML shows a run of spaces as one; each space after the first of a run becomes a
# no-break space, which keeps its width ("The  cat" shows its two spaces).
NBSP = "\u00a0"
_SPACE_IN_RUN = re.compile(r"(?<= ) ")


def md_escape(text: str) -> str:
    """`text` with every Markdown character escaped, for use inside our own Markdown.

    Line breaks stay line breaks (hard ones); leading blanks of a line are dropped, as
    four of them would make a code block; a run of spaces inside a line keeps its
    width (NBSP). Bare addresses get an invisible word joiner (see _unlink).
    """
    lines = text.splitlines() or [""]
    escaped = (_unlink(_PUNCTUATION.sub(r"\\\1", line.lstrip(" \t"))) for line in lines)
    return "  \n".join(_SPACE_IN_RUN.sub(NBSP, line) for line in escaped)


def _unlink(escaped: str) -> str:
    # GFM links bare "http://...", "www...." and "name@host.tld" after escapes are
    # undone, so backslashes cannot stop it; a word joiner (U+2060, zero-width) right
    # after the colon, between "www" and its dot and after the "@" breaks the pattern
    # and leaves the text looking the same.
    return (_WWW.sub(r"\g<0>" + WORD_JOINER, escaped)
            .replace("\\:\\/\\/", "\\:" + WORD_JOINER + "\\/\\/")
            .replace("\\@", "\\@" + WORD_JOINER))


def _underscore_is_syntax(text: str, i: int) -> bool:
    # Between two letters or digits an underscore can neither open nor close
    # emphasis (CommonMark's flanking rules), so "ref_count" is plain text.
    before = text[i - 1] if i > 0 else " "
    after = text[i + 1] if i + 1 < len(text) else " "
    return not (before.isalnum() and after.isalnum())


def _colon_is_syntax(text: str, i: int) -> bool:
    # Shortcodes and directives (`:smile:`, `:red[`, `:material/x:`) and URL schemes
    # need a character right after the colon; "file.json: step 2" has a space there.
    return i + 1 < len(text) and not text[i + 1].isspace()


def is_plain(text: str) -> bool:
    """Whether Streamlit's Markdown would show `text` exactly as it is.

    Conservative: a False only costs backslashes in the source, never what the
    reader sees. A True is exact for one line of text without the characters and
    patterns that can start Markdown, LaTeX or Streamlit syntax.
    """
    if text == "":
        return True
    if (text != text.strip(" ") or "  " in text or _SYNTAX_CHARS.intersection(text)
            or _LINE_START.match(text) or _INLINE.search(text)):
        return False
    return not any((c == "_" and _underscore_is_syntax(text, i))
                   or (c == ":" and _colon_is_syntax(text, i))
                   for i, c in enumerate(text))


def plain_md(text: str) -> str:
    """A whole message as Markdown that shows exactly `text`.

    Returned unchanged when it holds no syntax (most messages), so the source
    reads as the message does; otherwise every Markdown character is escaped.
    """
    return text if is_plain(text) else md_escape(text)


def md_code(text: str) -> str:
    """`text` as inline code when that shows it exactly, else as escaped plain text.

    Streamlit rewrites `:material/...:` even inside code spans, and a backtick in
    the text would end the span early: such text is shown escaped, without code
    style.
    """
    if text and text == text.strip() and not any(c in text for c in "`:\n\r"):
        return f"`{text}`"
    return md_escape(text)


def notes_text(notes: list[str]) -> str:
    """Notes (sentences without their full stop) as they follow a message:
    " Note: A. Note: B.", or nothing."""
    return "".join(f" Note: {n}." for n in notes)
