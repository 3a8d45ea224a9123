"""The Kernel panel: which attention kernel ran the last model step, where, how long,
how far from the plain reference, and a check of the whole cache against a
recomputation without paging (the live engine only)."""

from __future__ import annotations

import streamlit as st

from backend import views
from backend.engine.engine import Engine
from backend.engine.results import logit_tolerance
from backend.kernels import TorchKernels
from backend.views import Snapshot, verify
from backend.views.text import plain_md
from ui.kept import keep_result, kept_result


def kernel(snap: Snapshot, engine: Engine | None = None, prefix: str = "",
           start: str | None = "add a request") -> None:
    """Which backend and device ran the last step, its time, and its distance from the reference.

    With the live engine, a button recomputes every running request from
    scratch without paging and compares it with what the cache holds. A live
    engine restored from a snapshot, before its first step, shows the figures
    the snapshot recorded, and says so: no step of this engine measured them. Before
    any step, `start` says how one comes ("add a request").
    """
    info = views.kernel_info(snap)
    if not info.ran:
        st.markdown("No model step yet." if start is None else f"No model step yet: {start}.")
    else:
        restored = engine is not None and engine.kernel_report.restored
        # Every restore (an upload, a saved session, a scenario's state, a kernel switch,
        # a rebuild after a failed operation) carries the last step's kernel figures.
        lead = ("Carried over with the state this engine was restored from, not measured "
                "by a step it ran (the next step replaces it):\n\n" if restored else
                # A past state (engine None): its figures, not the live engine's.
                f"As of step {snap['step']:,}, the state shown:\n\n" if engine is None
                else "")
        # An uploaded snapshot names the backend and device in its own words.
        st.markdown(
            f"{lead}- Last model step ran on **{plain_md(info.backend)}** "
            f"({plain_md(info.device)})\n"
            f"- It took **{info.time_ms}** for {info.batch}\n"
            f"- Max \\|paged − contiguous reference\\|: **{info.max_abs_err}**")
    notes = []
    if info.ran:
        # An operation may run several: a Step that admits a request prefills its
        # prompt, then decodes the batch; a Step N runs one or more per iteration.
        notes.append("An operation can run several model steps (a prefill, then a "
                     "decode); these figures are its last one's.")
    if engine is not None and engine.kernels.name != info.backend:
        notes.append(f"The next step runs on **{engine.kernels.name}** ({engine.device}).")
    if engine is not None and isinstance(engine.kernels, TorchKernels):
        notes.append(f"On {engine.device}, {engine.kernels.decode_path()}.")
    # The advice is for the kernel the next step runs on: after a switch to torch, the
    # last step's interpreter is no reason to pick torch again.
    if (engine.kernels.name if engine is not None else info.backend) == "triton-interpreter":
        notes.append("On this CPU the Triton kernel runs under Triton's interpreter: slow, but "
                     "the real kernel. Pick *torch* in the sidebar for speed.")
    elif info.backend == "triton-interpreter":
        notes.append("That step ran the Triton kernel under Triton's interpreter: slow on this "
                     "CPU, but the real kernel.")
    if notes:
        st.caption(" ".join(notes))
    if engine is None or not engine.running:
        return
    if st.button("Verify against a full recomputation", key=f"{prefix}verify",
                 help="Recompute every running request's K/V and logits with plain "
                      "attention and no cache, and compare them with the paged state."):
        # Seconds on a real model (one full forward per request, from its first token),
        # with the last verdict still drawn below: say that it is running.
        with st.spinner("Recomputing every running request from its first token, with no "
                        "cache…"):
            recomputed = engine.verify_recomputation()
        # The same tolerance as the control run's: float rounding of this dtype.
        verdict, said = verify.verdict(recomputed, logit_tolerance(engine.config.dtype),
                                       engine.config.dtype)
        keep_result(f"{prefix}verify_result", engine, (engine.step, verdict, said))
    # Kept until the engine's next operation: a click elsewhere (Run the control, a tab
    # of the grid) reruns the page, and the verdict vanished with the button's click.
    kept = kept_result(f"{prefix}verify_result", engine)
    if kept is not None and kept[0] == engine.step:
        _, verdict, said = kept
        {"agree": st.success, "overflow": st.warning, "disagree": st.error}[verdict](said)
