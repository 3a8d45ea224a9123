"""The Playground's controls: add a request, act on one, step the batch, move blocks.

Every control is a callback that builds one CONTRACT.md operation and hands
it to `operations.apply`, so the page drawn after it already shows its effect,
and a refusal shows as the page's error line with the state unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import streamlit as st

from backend.core.config import MAX_NEW_TOKENS
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.engine.ops import (
    MAX_GROW_TOKENS,
    MAX_ID_CHARS,
    MAX_PROMPT_TOKENS,
    MAX_SAMPLES,
    Add,
    Fork,
    Op,
    check_request_id,
)
from backend.engine.results import OpResult
from backend.paging.hashing import MAX_CACHE_SALT_CHARS
from backend.sessions.forms import add_op, next_child_id, op_from
from backend.views.text import plain_md
from ui import clicks, engine_actions, layout, operations, session
from ui.numbers import out_of_range, whole, whole_input
from ui.operations import AfterOp, MakeOp
from ui.state_writes import Expected, Queued


def _apply(prepare: Callable[[], MakeOp], after: AfterOp | None = None) -> None:
    """`operations.apply`, on the engine the sidebar's fields describe where applying
    them first loses nothing (engine_actions.waiting_config)."""
    config = engine_actions.waiting_config()
    operations.apply(prepare, after,
                     None if config is None else engine_actions.applying_first(config))


def status_line() -> None:
    """The outcome of the last action (session.flash), as plain text.

    Refusals and summaries quote request ids, prompts and uploaded file names;
    Markdown in those must not be rendered (an image in an id would be fetched
    by the browser), so the message is escaped.
    """
    msg = st.session_state.get(session.FLASH)
    if not msg:
        return
    kind, text, number, earlier = msg
    # Keyed for ui/a11y.py, which reads a new outcome out to a screen reader: by its
    # number, the same words said again are new.
    with st.container(key=f"status_line--{number}"):
        for was_kind, was_text in (*earlier, (kind, text)):
            {"error": st.error, "success": st.success, "info": st.info}[was_kind](
                plain_md(was_text))


# One click of Step N runs at most this many iterations (the engine takes up to
# MAX_STEP_COUNT in one operation; a click past ten thousand is almost always a typo).
MAX_STEP_N = 10_000


def whole_number(key: str, label: str, lo: int, hi: int) -> int | None:
    """Field `key`'s number (None when blank); outside lo..hi, or a fraction, it is
    refused by `label`.

    The number fields carry no bounds of their own, for the reason ui/numbers.py
    gives; a refusal here is the operation's, on the page's status line.
    """
    value = st.session_state.get(key)
    if value is None:
        return None
    if not lo <= value <= hi:
        raise PagedLabError(out_of_range(label, lo, hi, value))
    return whole(label, value)


def request_id(key: str, label: str) -> str:
    """Field `key`'s id, stripped ("" when blank: the engine picks one), checked as the
    engine checks ids but refused by `label`.

    The id fields carry no browser-side length limit: a browser given one ignores a
    paste that would pass it, leaving the field as it was without a word.
    """
    value = (st.session_state.get(key) or "").strip()
    return check_request_id(value, label) if value else ""


def _required(key: str, label: str, lo: int, hi: int) -> int:
    value = whole_number(key, label, lo, hi)
    if value is None:
        raise PagedLabError(f"{label}: enter a number from {lo:,} to {hi:,}")
    return value


def render() -> None:
    engine = session.get_engine()
    # Three panels where the page is wide; where it is not, the batch's goes under.
    layout.wrap_below("controls", [250, 250, 160])
    with st.container(key="controls"):
        c_add, c_req, c_batch = st.columns([5, 5, 3], gap="medium")
    with c_add, st.container(border=True):
        _add_form()
    with c_req, st.container(border=True):
        _request_controls(engine)
    with c_batch, st.container(border=True):
        _batch_controls()


# ---- add ----------------------------------------------------------------------

def _on_add() -> None:
    picked: list[Expected] = []     # the request picked when Add was clicked

    def prepare() -> MakeOp:
        ss = st.session_state
        fields = {
            "request": request_id("add_id", "Request id"), "prompt": ss["add_prompt"],
            "prompt_len": whole_number("add_len", "N random tokens", 1, MAX_PROMPT_TOKENS),
            "max_new_tokens": whole_number("add_max_new", "Max new tokens", 1,
                                           MAX_NEW_TOKENS),
            "blocks": ss["add_pins"],
            "n": whole_number("add_n", "Parallel samples (n)", 1, MAX_SAMPLES),
            "beam_width": whole_number("add_beam", "Beam width", 1, MAX_SAMPLES),
            "chat": bool(ss.get("add_chat")), "cache_salt": ss.get("add_salt")}
        picked.append(session.queued().expect("req_pick", ss.get("req_pick")))
        return lambda engine: add_op(
            **fields, existing=engine.requests, vocab_size=engine.config.vocab_size,
            default_max_new=engine.config.max_new_tokens)

    def after(result: OpResult, q: Queued) -> None:
        if not isinstance(result.op, Add):
            return
        # Keep the prompt (adding it again shows prefix sharing); clear the one-offs,
        # the random length among them: it wins over the text while it is set, so
        # left in place it would turn the next add of the kept text into random tokens.
        # Then put the new request in the per-request controls.
        q.put("add_id", "")
        q.put("add_pins", "")
        q.put("add_len", None)
        q.put("add_salt", "")
        # Left set, the next add (a chat typed much later, after new settings) would
        # silently become n samples or a beam search too.
        q.put("add_n", None)
        q.put("add_beam", None)
        # With n samples or beams the requests are ID.0, ID.1, ...; pick the first.
        grouped = result.op.n is not None or result.op.beam_width is not None
        # Unless the person picked another request while the add waited for the engine.
        q.put("req_pick", result.op.request + (".0" if grouped else ""), if_still=picked[-1])

    _apply(prepare, after)


# The Add form's number fields sit two to a row in the narrowest panel: Streamlit shows a
# field's -/+ steppers once its box passes a width, and just past it they leave the
# number 43 px of a 1024 px window ("the t"). Typed counts need no steppers there.
_ADD_NUMBERS = ("add_len", "add_max_new", "add_n", "add_beam")


def _add_form() -> None:
    st.markdown("**Add a request**")
    st.html("<style>" + "".join(
        f'.st-key-{k} [data-testid="stNumberInputStep{d}"] {{ display: none; }}'
        for k in _ADD_NUMBERS for d in ("Up", "Down")) + "</style>")
    with st.form("add_form", border=False, enter_to_submit=False):
        # The default as the widget's own, not only seeded in session state: a browser
        # that rebuilds the form after a superseded rerun takes a widget's default, and
        # with none it would submit an empty prompt.
        st.text_area("Prompt text", value=session.DEFAULT_PROMPT, key="add_prompt",
                     persist_state="session", height=68)
        st.checkbox("As a chat message", key="add_chat", persist_state="session",
                    help="Send the text as a user's message through the model's chat "
                         "template (SmolLM2's own; ChatML for tiny-byte), so the request "
                         "ends with the assistant's turn open and the model answers. Two "
                         "chats share the template's opening blocks. A random prompt length, "
                         "when given, wins over the text, chat or not.")
        c1, c2 = st.columns(2)
        # Short: in a 1024 px window the longer "…or a random prompt of N tokens" took
        # five lines of its half of the form.
        whole_input(c1, "…or N random tokens", value=None, step=1, key="add_len",
                    placeholder="the text",
                    help=f"1 to {MAX_PROMPT_TOKENS:,}. Given, this wins over the text "
                         "above (which stays for the next add); it is cleared after "
                         "the add.")
        whole_input(c2, "Max new tokens", value=None, step=1, key="add_max_new",
                    placeholder="default",
                    help=f"1 to {MAX_NEW_TOKENS:,}. Blank: the sidebar's default.")
        c1, c2 = st.columns(2)
        c1.text_input("Request id", key="add_id", placeholder="auto (e.g. A)",
                      persist_state="session",
                      help=f"At most {MAX_ID_CHARS} characters. Blank: the first free letter "
                           "A to Z, then R27, R28, …. With parallel samples or a beam "
                           "width, it names the group: its requests are ID.0, ID.1, ….")
        c2.text_input("Pin to blocks", key="add_pins", placeholder="e.g. 9, 2, 14",
                      persist_state="session",
                      help="Physical blocks to hold the prompt, in order; each must be free. "
                           "A pinned request is admitted at once on them, so its prompt is "
                           "not looked up in the prefix cache (its full blocks still enter "
                           "it for later prompts).")
        c1, c2 = st.columns(2)
        whole_input(c1, "Parallel samples (n)", value=None, step=1, key="add_n", placeholder="1",
                    help=f"1 to {MAX_SAMPLES}; cleared after the add. n > 1: the engine "
                         "prefills the prompt once as ID.0 and forks ID.1 .. ID.{n-1} from "
                         "it, every block shared; each sample then draws its own tokens, "
                         "and copy-on-write gives it its own last block at its first token. "
                         "At a low temperature (SmolLM2's default is 0.2) the samples often "
                         "draw the same tokens: raise Temperature (sidebar, More settings) "
                         "to watch them diverge.")
        whole_input(c2, "Beam width", value=None, step=1, key="add_beam", placeholder="none",
                    help=f"1 to {MAX_SAMPLES}; blank: no beam search; cleared after the "
                         "add. Beam search run "
                         "by the engine: each step keeps the W best one-token "
                         "extensions of the live beams by cumulative log-probability. "
                         "A beam extended twice forks (blocks shared, copy-on-write at "
                         "the next write); one with no survivor is dropped and frees "
                         "its blocks. Needs Max new tokens (or the sidebar's default).")
        st.text_input("Cache salt", key="add_salt", placeholder="none",
                      persist_state="session",
                      help=f"At most {MAX_CACHE_SALT_CHARS} printable characters (spaces at "
                           "either end are dropped); cleared after the add. "
                           "As vLLM's cache_salt: the request's prefix-cache keys are "
                           "salted with it, so it shares cached blocks only with requests "
                           "of the same salt, whatever the tokens. Engines key a block by "
                           "what its K/V depend on beyond the tokens (the model, an adapter) "
                           "and by what must not share a cache (another tenant); the salt "
                           "stands in for these here. The model computes the same K/V with "
                           "or without it: only the keys differ, and with prefix caching off "
                           "it changes nothing. Add the same prompt with and without one to "
                           "watch the prefix hits stop.")
        clicks.button(st, "Add request", key="btn_add", type="primary", on_click=_on_add,
                      submit=True)


# ---- one request --------------------------------------------------------------

def _picked() -> str:
    """The picked request; refused when there is none (a click that raced the last
    request's Finish, while its buttons were still enabled in the browser)."""
    rid: str | None = st.session_state.get("req_pick")
    if rid is None:
        raise PagedLabError("no running or waiting request is picked: add one first")
    return rid


def _on_grow() -> None:
    def prepare() -> MakeOp:
        op = op_from({"op": "grow", "request": _picked(),
                      "tokens": _required("req_grow_n", "Grow by (tokens)", 1, MAX_GROW_TOKENS)})
        return lambda _: op

    _apply(prepare)


def _on_fork() -> None:
    picked: list[Expected] = []     # the parent, picked when Fork was clicked

    def prepare() -> MakeOp:
        parent, child = _picked(), request_id("req_child", "Child id")
        picked.append(session.queued().expect("req_pick", parent))
        return lambda engine: op_from({
            "op": "fork", "request": parent,
            "child": child or next_child_id(parent, engine.requests)})

    def after(result: OpResult, q: Queued) -> None:
        if isinstance(result.op, Fork):
            # The child is what a person usually acts on next (grow it to diverge).
            q.put("req_child", "")
            # Unless the person picked another request while the fork waited.
            q.put("req_pick", result.op.child, if_still=picked[-1])

    _apply(prepare, after)


def _on_finish() -> None:
    def prepare() -> MakeOp:
        op = op_from({"op": "finish", "request": _picked()})
        return lambda _: op

    _apply(prepare)


def _request_label(engine: Engine, rid: str) -> str:
    """What the picker shows for a request; its value stays the id."""
    req = engine.requests[rid]
    return f"{rid} · {req.status} · {counted(req.num_tokens, 'token')}"


def _request_controls(engine: Engine) -> None:
    st.markdown("**One request**")
    ids = [r.id for r in engine.requests.values() if r.status != "finished"]
    ss = st.session_state
    if ids:
        picked = ss.get("req_pick")
        # Set on every run, not only when the pick is gone: the browser holds a
        # selectbox's value as its label, and this label has the token count in it.
        # Unless this run sends the new label, the browser keeps showing the old one and
        # sends it back on the next click, where it names no option ("request 'A ·
        # running · 23 tokens' does not exist"). Setting the key makes Streamlit send the
        # current label.
        # Through the queue, so an Add or Fork waiting to pick its request treats a pick
        # corrected here (the picked request finished) as the app's, not the person's.
        session.queued().write(ss, "req_pick", picked if picked in ids else ids[-1])
    else:
        session.queued().write(ss, "req_pick", None)
        st.caption("No running or waiting requests: add one.")
    # With no request the same widgets are drawn, disabled, rather than left out: the
    # browser then builds them with the page, not during the first Add (where mounting
    # them for the first time made that click the slowest of a session).
    none = not ids
    st.selectbox("Request", ids, key="req_pick", format_func=partial(_request_label, engine),
                 disabled=none, placeholder="no request yet", persist_state="session")
    c1, c2 = st.columns([3, 2], vertical_alignment="bottom")
    whole_input(c1, "Grow by (tokens)", value=session.DEFAULT_GROW, step=1,
                key="req_grow_n", disabled=none,
                help=f"1 to {MAX_GROW_TOKENS:,}.")
    clicks.button(c2, "Grow", key="btn_grow", on_click=_on_grow, width="stretch",
                  disabled=none, help="Decode tokens for this request alone, one model step "
                                      "each.")
    c1, c2 = st.columns([3, 2], vertical_alignment="bottom")
    c1.text_input("Child id", key="req_child", placeholder="auto (e.g. A.1)", disabled=none,
                  persist_state="session", help=f"At most {MAX_ID_CHARS} characters.")
    clicks.button(c2, "Fork", key="btn_fork", on_click=_on_fork, width="stretch",
                  disabled=none, help="The child shares every block of the parent; nothing "
                                      "is copied.")
    clicks.button(st, "Finish", key="btn_finish", on_click=_on_finish, width="stretch",
                  disabled=none, help="Release its blocks: each reference count falls by one.")


# ---- the batch ----------------------------------------------------------------

def _on_step(count: int | None = None) -> None:
    def prepare() -> MakeOp:
        steps = count if count is not None else _required("batch_n", "Steps", 1, MAX_STEP_N)

        def make(engine: Engine) -> Op:
            if engine.idle:
                # An iteration with nothing to run would still take a step number and a
                # timeline row (the engine allows it, for scenarios that say so).
                name = "Step" if count is not None else "Step N"
                raise PagedLabError(f"{name} has nothing to run: no request is running, "
                                    "waiting or swapped out")
            return op_from({"op": "step", "count": steps})
        return make

    _apply(prepare)


def _on_shuffle() -> None:
    op = op_from({"op": "shuffle"})
    _apply(lambda: lambda _: op)


def _batch_controls() -> None:
    st.markdown("**The whole batch**")
    clicks.button(st, "Step", key="btn_step", type="primary", on_click=_on_step, args=(1,),
                  width="stretch",
                  help="One continuous-batching iteration: admit waiting requests that fit, "
                       "then decode one token for every running request.")
    # One above the other: this column is the narrowest, and side by side the two
    # were cut to a letter each beside an open sidebar on a 1024 px window.
    whole_input(st, "Steps", value=session.DEFAULT_STEP_N, step=1, key="batch_n",
                help=f"1 to {MAX_STEP_N:,}.")
    clicks.button(st, "Step N", key="btn_step_n", on_click=_on_step, width="stretch")
    clicks.button(st, "Shuffle blocks", key="btn_shuffle", on_click=_on_shuffle,
                  width="stretch",
                  help="Move every used block to another physical place (copying its K/V) "
                       "and rewrite the tables. Outputs must not change.")
