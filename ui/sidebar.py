"""The shared sidebar: pool, model and kernel settings, with a confirm step before a reset.

On the Scenarios page the pool and model fields would change nothing (a
scenario runs on its own engine with its file's config), so that page draws
its own sidebar: the scenario's config, read-only, and the kernel fields,
which do apply (`scenario`). Nor do any of them apply on Contiguous vs paged,
whose tabs replay traces or start engines of their own: its sidebar says what
they run on (`compare`). `render` leaves the sidebar to those pages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from backend.core.config import (
    DTYPE_BYTES,
    GREEDY_BELOW,
    MAX_BLOCK_SIZE,
    MAX_NUM_BLOCKS,
    REAL_MODELS,
    EngineConfig,
)
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.kernels import select_kernels
from backend.models.registry import default_sampling
from backend.sessions.playground import (
    ALLOCATION_LABELS,
    KERNEL_LABELS,
    MODEL_PRESETS,
    Settings,
    device_choices,
    kernel_choices,
    model_cards,
    model_choices,
    model_loaded,
    model_problem,
)
from backend.views.settings import (
    BUDGET_HELP,
    config_html,
    config_items,
    fixed_dims_text,
    model_cost_text,
)
from backend.views.text import plain_md
from ui import clicks, engine_actions, session, settings_fields, store
from ui.labels import labelled
from ui.numbers import MAX_EXACT, whole, whole_input

SCENARIOS_PAGE = "scenarios.py"    # pages/scenarios.py draws its own sidebar (`scenario`)
COMPARE_PAGE = "compare.py"        # and pages/compare.py its own (`compare`)


def current_page_file(page: str | None = None) -> str:
    """The file name of the page this run draws, e.g. "scenarios.py" ("" if unknown).

    app.py calls `render` before the page runs and without naming it, so this
    asks Streamlit which page st.navigation chose (its page registry, keyed by
    the running page's hash). `page`, when given, is that answer already.
    """
    if page is not None:
        return Path(page).name
    ctx = get_script_run_ctx()
    if ctx is None:
        return ""
    info = ctx.pages_manager.get_pages().get(ctx.page_script_hash)
    return Path(str(info.get("script_path") or "")).name if info else ""


ALLOCATIONS = ["fifo", "random"]
PREEMPTIONS = ["recompute", "swap"]
SIZES = [*MODEL_PRESETS, "custom"]


def _applied(key: str) -> Any:
    """Field `key`'s value for the applied settings: its widget's own default.

    What a field shows is session state (seeded, and written when settings are
    applied); the widget's default matters when a browser rebuilds the sidebar
    after a superseded rerun under load: a rebuilt field starts from it and
    sends it back as the field's value. With the widget's minimum or first
    option there, that read as an edit and asked to reset the engine.
    """
    settings = session.get_settings()
    fields = {**session.config_fields(EngineConfig()), **session.config_fields(settings.config)}
    return fields.get(key)


def _index(key: str, options: list[str]) -> int:
    value = _applied(key)
    return options.index(value) if value in options else 0


def render(page: str | None = None) -> None:
    """The Playground's sidebar; nothing on the pages that draw their own."""
    if current_page_file(page) in (SCENARIOS_PAGE, COMPARE_PAGE):
        return
    with st.sidebar:
        st.header("Pool and model", anchor=False)
        _config_fields()
        _confirm_or_apply()
        st.divider()
        st.header("Kernel", anchor=False)
        _kernel_fields()
        st.divider()
        _reset_button()


def _reset_button() -> None:
    """Reset engine, which asks first when it would discard requests (the saved session
    is overwritten too: New session is the way that keeps it)."""
    ss = st.session_state
    if not ss.get(session.CONFIRM_RESET):
        clicks.button(st, "Reset engine", key="btn_reset", on_click=_ask_reset,
                      help="Discard every request and start an empty engine with the "
                           "applied settings, under this session's address. New session "
                           "(under Sessions) keeps this one instead.", width="stretch")
        return
    engine = session.get_engine()
    saved_too = ", here and in the saved session" if store.get_tab().id is not None else ""
    st.warning(f"Reset discards the current {counted(len(engine.requests), 'request')} and "
               f"{counted(engine.step, 'step')}{saved_too}.")
    clicks.button(st, "Reset and discard", key="btn_reset_confirm", type="primary",
                  on_click=_confirmed_reset, width="stretch")
    clicks.button(st, "Cancel", key="btn_reset_cancel", on_click=_cancel_reset,
                  width="stretch")


def _ask_reset() -> None:
    if engine_actions.engine_has_state():
        st.session_state[session.CONFIRM_RESET] = True
    else:
        engine_actions.reset()


def _confirmed_reset() -> None:
    st.session_state[session.CONFIRM_RESET] = False
    engine_actions.reset()


def _cancel_reset() -> None:
    st.session_state[session.CONFIRM_RESET] = False


def _config_fields() -> None:
    c1, c2 = st.columns(2)
    whole_input(c1, "Pool size (blocks)", step=1,
                value=_applied("cfg_num_blocks"), key="cfg_num_blocks",
                help=f"Physical KV blocks in the pool: 1 to {MAX_NUM_BLOCKS:,}.")
    whole_input(c2, "Block size (slots)", step=1,
                value=_applied("cfg_block_size"), key="cfg_block_size",
                help=f"Token positions per block: 1 to {MAX_BLOCK_SIZE}.")
    st.radio("Allocation", ALLOCATIONS, index=_index("cfg_allocation", ALLOCATIONS),
             key="cfg_allocation", persist_state="session", horizontal=True,
             format_func=lambda v: ALLOCATION_LABELS[v],
             help="Queue order hands out free blocks 0, 1, 2, ... and reuses freed ones "
                  "last; scattered picks a seeded random free block.")
    st.toggle("Prefix caching", value=_applied("cfg_prefix_caching"), key="cfg_prefix_caching",
              persist_state="session",
              help="Full prompt blocks whose tokens are already cached are shared, not "
                   "recomputed.")
    model = _model_field()
    dims = REAL_MODELS.get(model)
    if dims is not None:
        # Its weights fix its shape (EngineConfig refuses other dimensions), so tiny-byte's
        # size fields are not drawn (nor read); a switch back draws them as they were left.
        st.caption(fixed_dims_text(model, dims))
    else:
        _tiny_dims_fields()
    dtypes = list(DTYPE_BYTES)
    st.selectbox("dtype", dtypes, index=_index("cfg_dtype", dtypes), key="cfg_dtype",
                 persist_state="session")
    # Keyed, as every expander: it stays as it was left when an element above it comes or
    # goes (the model's caption, a refusal).
    with st.expander("More settings", key="sb_more_open"):
        whole_input(st, "Seed", step=1, value=_applied("cfg_seed"), key="cfg_seed",
                    help="Seeds tiny-byte's weights, random prompts and sampling. 0 to "
                         f"{(1 << 53) - 1:,} here: past it a browser rounds the number "
                         "typed, so a larger one is refused; a scenario or snapshot may "
                         f"give up to {(1 << 63) - 1:,}.")
        seed = session.get_settings().config.seed
        shown = st.session_state.get("cfg_seed")
        if seed > MAX_EXACT and shown is not None and float(shown) == float(seed):
            # From a snapshot or scenario: the browser shows the nearest number it holds.
            st.caption(f"The seed is {seed:,}; the field shows it rounded, and the seed "
                       "stays exactly this until another is typed.")
        whole_input(st, "Default max new tokens", step=1,
                    value=_applied("cfg_max_new"), key="cfg_max_new", placeholder="no limit",
                    help="For requests added without their own limit; 0: none (a cleared field "
                         "takes its number back; blank shows none is set).")
        _sampling_fields(model)
    _scheduler_fields()


def _sampling_fields(model: str) -> None:
    """Temperature and top-p; blank is the model's own (SmolLM2's card suggests 0.2 and
    0.9). A snapshot or scenario may set them (a scenario's 0: greedy), so they show."""
    # None from the model: plain softmax (temperature 1) and no nucleus (top-p 1).
    temperature, top_p = (1.0 if v is None else v for v in default_sampling(model))
    c1, c2 = st.columns(2)
    c1.number_input("Temperature", step=0.1, format="%g",
                    value=_applied("cfg_temperature"), key="cfg_temperature",
                    persist_state="session",
                    # Short: "0.2 (model's)" was cut in a 1366 px window's sidebar.
                    placeholder=f"model: {temperature:g}",
                    help="Divides the logits before the seeded draw: 0 (or anything under "
                         f"{GREEDY_BELOW:g}) always takes the most likely token (greedy, so "
                         "parallel samples all agree), higher spreads the choice. Blank "
                         "(Use the model's own sampling): the model's own.")
    c2.number_input("Top-p", step=0.05, format="%g",
                    value=_applied("cfg_top_p"), key="cfg_top_p", persist_state="session",
                    placeholder=f"model: {top_p:g}",
                    help="The draw keeps the most likely tokens up to this total probability; "
                         "1 keeps them all. Blank (Use the model's own sampling): the model's own.")
    ss = st.session_state
    if ss.get("cfg_temperature") is not None or ss.get("cfg_top_p") is not None:
        # A browser's number field that held a number takes it back when cleared, and no
        # number means "the model's own" (a temperature of 0 is greedy), so blanking both
        # is a button; it applies as any field change does (asking first on a busy engine).
        clicks.button(st, "Use the model's own sampling", key="btn_model_sampling",
                      on_click=_blank_sampling, width="stretch",
                      help="Blank Temperature and Top-p: the model's own (temperature "
                           f"{temperature:g}, top-p {top_p:g}).")


def _blank_sampling() -> None:
    st.session_state["cfg_temperature"] = None
    st.session_state["cfg_top_p"] = None


def _scheduler_fields() -> None:
    """vLLM's scheduler budgets; blank is no limit. Part of the config: a change on an
    engine with state asks before resetting, like the pool's fields."""
    # A fixed label: one naming the budgets would make a new expander (collapsed) on
    # every change.
    with st.expander("Scheduler", key="sb_scheduler_open"):
        # A browser's number field that held a number takes it back when cleared (its
        # default is the applied value, see _applied), so 0 is the way to remove a limit.
        st.caption("vLLM's scheduler budgets, applied at every step. Max running requests "
                   "and token budget: 0 is no limit (a cleared field takes its number back; "
                   "blank shows none is set).")
        whole_input(st, "Max running requests", step=1,
                    value=_applied("cfg_max_num_seqs"), key="cfg_max_num_seqs",
                    placeholder="no limit",
                    help=BUDGET_HELP["max_num_seqs"])
        whole_input(st, "Token budget per step", step=1,
                    value=_applied("cfg_max_num_batched_tokens"),
                    key="cfg_max_num_batched_tokens", placeholder="no limit",
                    help=BUDGET_HELP["max_num_batched_tokens"])
        whole_input(st, "Watermark (blocks)", step=1,
                    value=_applied("cfg_watermark_blocks"), key="cfg_watermark_blocks",
                    placeholder="0",
                    help=BUDGET_HELP["watermark_blocks"])
        st.radio("Preemption", PREEMPTIONS, index=_index("cfg_preemption", PREEMPTIONS),
                 key="cfg_preemption", persist_state="session", horizontal=True,
                 help=BUDGET_HELP["preemption"], on_change=_preemption_changed)
        whole_input(st, "Host pool (blocks)", step=1,
                    value=_applied("cfg_num_cpu_blocks"), key="cfg_num_cpu_blocks",
                    help=BUDGET_HELP["num_cpu_blocks"],
                    disabled=st.session_state.get("cfg_preemption") != "swap")


def _preemption_changed() -> None:
    """Swap needs a host pool: picking it with none gives one as large as the device pool."""
    ss = st.session_state
    if ss.get("cfg_preemption") == "swap" and not ss.get("cfg_num_cpu_blocks"):
        # The pool's number only when it is one (a fraction typed there would be
        # copied into a field that cannot be edited while it is being refused).
        try:
            pool = whole("Pool size", ss.get("cfg_num_blocks"))
        except PagedLabError:
            pool = None
        ss["cfg_num_cpu_blocks"] = (pool if pool is not None and pool >= 1
                                    else session.get_settings().config.num_blocks)


def _model_field() -> str:
    """The model picker, with what the picked model costs here; returns the pick."""
    settings = session.get_settings()
    # The fields' config, when they describe one: tiny-byte's cost follows its size fields.
    config = settings_fields.fields_config()[0] or settings.config
    cards = model_cards(config)
    choices = model_choices()
    st.selectbox("Model", choices, index=_index("cfg_model_name", choices), key="cfg_model_name",
                 persist_state="session",
                 format_func=lambda m: cards[m].label,
                 help=" ".join(f"{cards[m].label}: {cards[m].description}"
                               for m in model_choices()))
    model: str = st.session_state["cfg_model_name"]
    problem = model_problem(model)
    if problem is not None:
        # One line naming the fix: the engine cannot start on this model here.
        st.error(plain_md(problem))
        return model
    pick = Settings(EngineConfig.for_model(model, dtype=config.dtype), settings.device,
                    settings.kernel)
    st.caption(model_cost_text(cards[model], loaded=model_loaded(pick)))
    return model


def _tiny_dims_fields() -> None:
    st.selectbox("Model size", SIZES, index=_index("cfg_model", SIZES), key="cfg_model",
                 persist_state="session",
                 on_change=settings_fields.model_preset_changed,
                 format_func=lambda v: v if v == "custom" else
                 f"{v} ({MODEL_PRESETS[v]['num_layers']} layers, "
                 f"{MODEL_PRESETS[v]['num_heads']} heads)")
    c1, c2 = st.columns(2)
    whole_input(c1, "Layers", step=1, help="1 to 8.",
                value=_applied("cfg_num_layers"), key="cfg_num_layers",
                on_change=settings_fields.model_dims_changed)
    whole_input(c2, "Head dim", step=2, help="16 to 256, even (RoPE rotates pairs).",
                value=_applied("cfg_head_dim"), key="cfg_head_dim",
                on_change=settings_fields.model_dims_changed)
    whole_input(c1, "Heads", step=1, help="1 to 32.",
                value=_applied("cfg_num_heads"), key="cfg_num_heads",
                on_change=settings_fields.model_dims_changed)
    whole_input(c2, "KV heads", step=1,
                value=_applied("cfg_num_kv_heads"), key="cfg_num_kv_heads",
                on_change=settings_fields.model_dims_changed,
                help="1 to 32, dividing Heads. Grouped-query attention: heads share "
                     "K/V in groups.")


def _keep_current_button() -> None:
    """The way back without retyping each field: the running engine's settings."""
    clicks.button(st, "Keep current", key="btn_keep_config",
                  on_click=settings_fields.keep_current, width="stretch",
                  help="Put the fields back to the running engine's settings.")


def _confirm_or_apply() -> None:
    """Apply changed fields at once if nothing would be lost; otherwise ask first."""
    config, error = settings_fields.fields_config()
    st.session_state[session.PENDING] = False
    st.session_state[session.FIELDS_PROBLEM] = None if error is None else labelled(error)
    if error is not None:
        # One line per refused field (a hard break between them).
        st.error("  \n".join(plain_md(line) for line in labelled(error).splitlines()))
        _keep_current_button()
        return
    assert config is not None
    if engine_actions.is_applied(config):
        return
    room = engine_actions.room_problem(config)
    if room is not None:
        # Refused here, before "Apply and reset" is offered, rather than after it has
        # been clicked: the fields keep what was typed and say why it waits.
        st.session_state[session.FIELDS_PROBLEM] = room
        st.error(plain_md(f"Not applied: {room}."))
        _keep_current_button()
        return
    if not engine_actions.engine_has_state():
        current = session.get_settings()
        wanted = Settings(config, current.device, current.kernel)
        loads = not model_loaded(wanted)
        engine_actions.apply_config(config)
        if loads and model_loaded(wanted):
            # The weights were loaded in this run, after the model's caption above said
            # they were not: run again, so every line drawn so far tells the new state.
            st.rerun()
        return
    st.session_state[session.PENDING] = True
    engine = session.get_engine()
    # Apply and reset keeps a saved session's state under Recent sessions
    # (engine_actions.apply_config); an unsaved one has nowhere to stay.
    kept = engine_actions.kept_row(store.get_tab(), engine)
    st.warning(f"These settings need a new engine: the current "
               f"{counted(len(engine.requests), 'request')} and "
               f"{counted(engine.step, 'step')} "
               + ("will be discarded." if kept is None else
                  "leave the page and stay saved, under Recent sessions." if kept.whole else
                  "leave the page; Recent sessions keeps them as last saved, before the "
                  "operations that could not be saved."))
    # One above the other: side by side in the sidebar, "Apply and reset" was cut to
    # "Apply and r…" at any window width.
    clicks.button(st, "Apply and reset", key="btn_apply_config", type="primary",
                  on_click=engine_actions.apply_pending, width="stretch")
    _keep_current_button()


def scenario(config: EngineConfig, engine: Engine) -> None:
    """The Scenarios page's sidebar: its run's config, read-only, then the kernel fields.

    Should `render` not have recognised the page (and drawn the whole sidebar),
    only the config is added: the kernel fields are there already.
    """
    with st.sidebar:
        st.header("This scenario's pool and model", anchor=False)
        st.caption("Set by the scenario file for its own engine. The Playground keeps its "
                   "own settings, on its page.")
        st.html(config_html(config_items(config)))
        if current_page_file() != SCENARIOS_PAGE:
            return
        st.divider()
        st.header("Kernel", anchor=False)
        _kernel_fields(engine)


def compare() -> None:
    """The Contiguous vs paged page's sidebar: what its tabs run on, and that the
    Playground's settings are not among them."""
    device = select_kernels("auto", "torch").device.type
    with st.sidebar:
        st.header("What this page runs", anchor=False)
        st.markdown(
            "- **Replays**: the seed's example, *One workload, two memories*, the trace "
            "simulator and *Real deployment* run PagedLab's block manager beside a "
            "contiguous arena; *Block size* counts blocks over a trace and replays it "
            "through the block manager alone, as *Sharing*'s estimate replays modelled "
            "samples and beams. Bookkeeping only: no K/V tensors.\n"
            "- **Engines**: *Swap or recompute* and *Sharing*'s *Run it here* start real "
            "engines of their own (tiny-byte, or the model picked in *Sharing*), sized in "
            f"their tab, with the torch kernel on {device}.\n"
            "- **Arithmetic**: the *Memory calculator* runs nothing.")
        st.caption("The Playground's pool, model and kernel are set on its page; nothing "
                   "here reads or changes them.")


def _kernel_fields(engine: Engine | None = None) -> None:
    """Device and kernel; the caption names what `engine` (the Playground's) runs on next.

    The applied settings are the widgets' own defaults, as for the pool's fields
    (`_applied`): drawn by the Scenarios page's script rather than app.py's, these are
    other widgets to Streamlit, which would start them empty and show no kernel picked.
    """
    settings = session.get_settings()
    devices = device_choices()
    st.selectbox("Device", devices, key="dev_device",
                 index=devices.index(settings.device) if settings.device in devices else 0,
                 on_change=engine_actions.change_kernel,
                 help="Only devices this machine has. auto: CUDA if torch sees a GPU.")
    st.segmented_control("Kernel", kernel_choices(), key="dev_kernel", required=True,
                         default=settings.kernel,
                         format_func=lambda v: KERNEL_LABELS[v],
                         on_change=engine_actions.change_kernel,
                         help="auto and Triton run the Triton kernels (compiled on a GPU, "
                              "interpreted on a CPU); torch is a vectorized path, fast on "
                              "a CPU. Switching keeps every request.")
    engine = engine or session.get_engine()
    slow = ""
    if engine.kernels.name == "triton-interpreter" and engine.config.model in REAL_MODELS:
        # The interpreter runs the kernels one program at a time in Python: with a real
        # model's 30 layers a click waits seconds, and nothing else on the page says why.
        slow = (" The interpreter runs the Triton kernels one program at a time: a "
                "SmolLM2 decode step of 8 requests took 1.4 s on a 2-core CPU, 0.2 s on "
                "the *torch* kernel (docs/BENCHMARKS.md).")
    st.caption(f"Next step runs on **{engine.kernels.name}** ({engine.device}).{slow}")
