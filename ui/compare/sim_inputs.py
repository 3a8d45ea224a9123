"""The trace simulator's workload choice: a synthetic trace, an Azure trace, or an upload.

An uploaded trace (CSV: TIMESTAMP,ContextTokens,GeneratedTokens) is read up to
MAX_UPLOAD_BYTES + 1 bytes and checked whole before it is used: a bad row is
reported with its number and nothing of the file is replayed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.sim.simulator import DEFAULT_RATE
from backend.lab.traces import (
    MAX_TIME_SCALE,
    RECORDED,
    parse_trace_csv,
    recorded_trace,
    replay_trace,
)
from backend.lab.workloads import WORKLOADS, Trace, make_trace
from backend.views.compare.deployment import as_typed, rate_text, synthetic_label
from backend.views.text import plain_md
from ui.compare import refuse
from ui.numbers import Fields
from ui.uploads import uploader_mib

PAGE_MAX_REQUESTS = 20_000   # the CLI handles 100k; the page stays interactive
MAX_UPLOAD_BYTES = 8 << 20   # some 220,000 rows of the Azure format
UPLOAD = "upload"
SOURCES: tuple[str, ...] = (*WORKLOADS, *RECORDED, UPLOAD)
SOURCE_LABELS = {
    "sharegpt": "sharegpt (synthetic)", "alpaca": "alpaca (synthetic)",
    # Short enough for a quarter of the page: the help names the traces in full.
    "azure-code": "azure-code (recorded)", "azure-conv": "azure-conv (recorded)",
    UPLOAD: "a CSV trace of my own",
}
_UPLOAD_STATE = "cmp_sim_upload_trace"   # (digest, Trace) of the last upload parsed
_UPLOAD_KEPT = "cmp_sim_upload_kept"     # replaying it after its uploader forgot the file


@dataclass(frozen=True, slots=True)
class TraceChoice:
    """A trace to replay: `key` names it in caches, `build` makes it, `label` describes it."""

    key: Hashable
    build: Callable[[], Trace]
    label: str
    longest: int | None = None   # a recorded trace's longest request (final length)


# The paper that describes the recorded traces, as assets/traces/README.md cites it.
SPLITWISE_CITATION = ("Pratyush Patel, Esha Choukse, Chaojie Zhang, Aashaka Shah, Íñigo Goiri, "
                      "Saeed Maleki, Ricardo Bianchini. \"Splitwise: Efficient generative LLM "
                      "inference using phase splitting\", ISCA 2024.")
# Where the recorded traces are shared, and under which license.
AZURE_DATASET = ("[AzurePublicDataset](https://github.com/Azure/AzurePublicDataset) under CC "
                 "BY 4.0")
# The credit the recorded traces' license asks for (assets/traces/README.md).
RECORDED_CREDIT = (f"Recorded by Microsoft Azure, shared in its {AZURE_DATASET}, and described "
                   "in Patel et al., \"Splitwise\", ISCA 2024.")


def _uploaded(prefix: str) -> tuple[str, Trace] | None:
    """The uploaded trace, parsed whole (once per file), or None after saying why.

    A file uploader forgets its file when a run does not draw it (another tab was
    open), so the trace parsed from it is kept and used again until the person
    removes it from a drawn uploader, uploads another, or picks another workload
    (`trace_inputs`); a refused file lets it go too."""
    ss = st.session_state
    # The uploader's key is in session state only if the run before drew it.
    drawn_before = f"{prefix}_upload" in ss
    # No type filter, as for snapshots (ui/exports.py): the content is checked.
    f = st.file_uploader(
        "Trace (CSV with columns TIMESTAMP, ContextTokens, GeneratedTokens)",
        key=f"{prefix}_upload", max_upload_size=uploader_mib(MAX_UPLOAD_BYTES),
        help=f"At most {MAX_UPLOAD_BYTES >> 20} MiB. TIMESTAMP is a date and time "
             "(2023-11-16 18:17:03.98) or seconds; rows in arrival order.")
    kept = ss.get(_UPLOAD_STATE)
    if f is None:
        if kept is not None and (not drawn_before or ss.get(_UPLOAD_KEPT)):
            ss[_UPLOAD_KEPT] = True
            st.caption(plain_md(f"Replaying {kept[1].workload}, uploaded before (the "
                                "uploader shows no file after another tab); upload "
                                "another to replace it."))
            return kept[0], kept[1]
        # Removed from the uploader, or none yet: nothing kept.
        _forget_upload()
        st.caption("Upload a trace to replay it, one row per request.")
        return None
    ss.pop(_UPLOAD_KEPT, None)
    data = f.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        _forget_upload()
        refuse(f"{f.name} is larger than {MAX_UPLOAD_BYTES >> 20} MiB; the page replays "
                 "smaller traces (the command line takes up to 64 MiB).")
        return None
    digest = hashlib.sha256(data).hexdigest()
    if kept is not None and kept[0] == digest and kept[1].workload == f.name:
        return digest, kept[1]
    try:
        trace = parse_trace_csv(data, f.name)
    except PagedLabError as e:
        _forget_upload()
        refuse(e)
        return None
    st.session_state[_UPLOAD_STATE] = (digest, trace)
    return digest, trace


def _forget_upload() -> None:
    st.session_state.pop(_UPLOAD_STATE, None)
    st.session_state.pop(_UPLOAD_KEPT, None)


def trace_inputs(prefix: str, f: Fields) -> TraceChoice | None:
    """Draw the workload inputs in `f`'s group; the chosen trace, or None (with a message)
    if there is none."""
    c = st.columns(4)
    source = c[0].selectbox("Workload", SOURCES, key=f"{prefix}_workload", persist_state="session",
                            format_func=SOURCE_LABELS.__getitem__,
                            help="Synthetic: Poisson arrivals, lengths shaped like the "
                                 "dataset. Recorded: the Azure LLM inference trace 2023, "
                                 "code or conversation, arrivals and lengths as logged.")
    if source != UPLOAD:
        # Another workload picked: an upload kept from before is let go (the uploader,
        # drawn again later, shows no file, and a line would name one nobody chose).
        _forget_upload()
    if source in WORKLOADS:
        requests = int(f.number(c[1], "Requests", 1, PAGE_MAX_REQUESTS, 1000, step=100,
                                key=f"{prefix}_requests"))
        rate = float(f.number(c[2], "Rate (requests/s)", 0.01, 10_000.0, DEFAULT_RATE,
                              key=f"{prefix}_rate"))
        seed = int(f.number(c[3], "Seed", 0, 1_000_000, 0, key=f"{prefix}_seed"))
        return TraceChoice(("synthetic", source, requests, rate, seed),
                           lambda: make_trace(source, requests, rate, seed),
                           synthetic_label(source, requests, rate, seed))
    if source == UPLOAD:
        with c[1]:
            got = _uploaded(prefix)
        if got is None:
            return None
        digest, full = got
        name = full.workload
    else:
        full = recorded_trace(source)
        digest, name = source, source
        # Credited where it is chosen (its license asks for the source and the paper), in
        # the row's place its two fields leave free.
        c[3].caption(RECORDED_CREDIT)
    # An upload's fields follow its uploader; a recorded trace's fill the row from the left.
    fields = (c[2], c[3]) if source == UPLOAD else (c[1], c[2])
    most = min(len(full), PAGE_MAX_REQUESTS)
    requests = int(f.number(
        fields[0], "Requests (the first N)", 1, most, most,
        key=f"{prefix}_trace_requests_{digest[:12]}",
        help=f"The trace holds {len(full):,} requests; the page replays up to "
             f"{PAGE_MAX_REQUESTS:,}."))
    scale = float(f.number(
        fields[1], "Time scale", 0.01, MAX_TIME_SCALE, 1.0, key=f"{prefix}_time_scale",
        help="The gaps between arrivals are divided by this: 10 replays the trace ten "
             "times faster."))
    built = replay_trace(full, requests=requests, time_scale=scale)
    scaled = f", time / {as_typed(scale)}" if scale != 1 else ""
    # The mean rate as the real-deployment tab says it, so one trace reads the same in both.
    # An upload's runs are shared by content, but keyed by its name too: a run carries the
    # trace's name (`SimResult.workload`), and another session's file name is not this
    # session's to see.
    key = ("recorded", digest, requests, scale) + ((name,) if source == UPLOAD else ())
    # One arrival, or all at one moment, has no rate: "mean 0/s" would say it had one, of
    # nothing.
    pace = (f"mean {rate_text(built.rate)}/s" if built.rate > 0 else
            "one arrival, no rate" if len(built) == 1 else
            f"all {len(built):,} arriving at once, no rate")
    which = ("its one request" if len(full) == 1 else
             f"the first of {len(full):,} requests" if requests == 1 else
             f"the first {requests:,} of {len(full):,} requests")
    return TraceChoice(key, lambda: built, f"{name}, {which} ({pace}{scaled})",
                       int(full.final_len.max()))
