"""The simulator's per-iteration timeline as a table and an Altair chart.

`timeline_frame` has one row per busy iteration (backend.lab.sim.timeline says
what each column counts); the chart draws at most `max_points` points per series,
each the mean of a run of consecutive iterations (preemptions: their sum), so
that a 100k-iteration run stays light in a browser while the CSV keeps every
iteration.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from backend.core.words import counted
from backend.lab.sim.timeline import Timeline
from backend.views.describe import span

# Panels: title, the series in it (column, label), and whether they are summed per bin.
_REQUESTS = (("running", "running"), ("waiting", "waiting"))
# The live engine's timeline also counts requests swapped out to the host pool.
_SWAPPED = ("swapped", "swapped out")
_BLOCKS = (("used_blocks", "used"), ("cached_blocks", "cached"), ("free_blocks", "free"))
_SLOTS = (("token_slots", "holding tokens"), ("allocated_slots", "held by the policy"),
          ("free_slots", "free"))
_TOKENS = (("prefill_tokens", "prefill"), ("decode_tokens", "decode"))


def timeline_frame(tl: Timeline) -> pd.DataFrame:
    """One row per busy iteration: time, requests, tokens, preemptions, slots and blocks
    (the block columns are empty for the contiguous policies)."""
    c = tl.columns
    df = pd.DataFrame({
        "iteration": c["iteration"], "time_s": c["iteration"] * tl.iteration_s,
        "running": c["running"], "prefilling": c["prefilling"], "waiting": c["waiting"],
        "admitted": c["admitted"],
        "prefill_tokens": c["prefill_tokens"], "decode_tokens": c["decode_tokens"],
        "preemptions": c["preemptions"], "finished": c["finished"],
        "token_slots": c["token_slots"], "allocated_slots": c["allocated_slots"],
        "free_slots": tl.capacity_tokens - c["allocated_slots"].astype(np.int64),
    })
    for col in ("used_blocks", "cached_blocks", "free_blocks"):
        values = pd.array(c[col], dtype="Int64")
        df[col] = values if tl.block_size is not None else pd.array([pd.NA] * len(df),
                                                                    dtype="Int64")
    return df


# Counted per point rather than averaged.
_SUMMED = ("preemptions", "finished", "admitted")
# In an idle iteration every count is 0 but these, which then hold the whole pool: the
# columns that add up to it.
_WHOLE_POOL = {"free_blocks": ("used_blocks", "cached_blocks", "free_blocks"),
               "free_slots": ("allocated_slots", "free_slots")}


def binned(df: pd.DataFrame, max_points: int = 600) -> tuple[pd.DataFrame, int]:
    """At most `max_points` points, each `per` consecutive iterations: the mean over every
    iteration of its span (preemptions, admissions and finishes: their sum); returns the
    frame and `per`.

    The simulator records busy iterations only. An idle one between them (nothing runs
    or waits) counts as what it was: no requests, no tokens, the whole pool free. So a
    quiet stretch of a trace reads as quiet, not as the last busy iteration held on.
    """
    if df.empty:
        return df, 1
    it = df["iteration"].to_numpy(dtype=np.int64)
    lo, span = int(it[0]), int(it[-1] - it[0]) + 1
    per = max(1, -(-span // max_points))
    if per == 1 and len(df) == span:
        return df, 1
    n = -(-span // per)
    bins = (it - lo) // per
    size = np.full(n, float(per))
    size[-1] = span - per * (n - 1)
    idle = size - np.bincount(bins, minlength=n).astype(np.float64)
    starts = lo + np.arange(n) * per
    out: dict[str, object] = {"iteration": starts}
    for col in df.columns:
        if col == "iteration":
            continue
        values = df[col].to_numpy(dtype=np.float64, na_value=np.nan)
        if col == "time_s":
            # Each point at the time of its span's middle (the clock runs through idle
            # iterations too).
            out[col] = np.interp(starts + (size - 1) / 2, it, values)
            continue
        if np.isnan(values).all():        # no blocks: a contiguous policy
            out[col] = pd.array([pd.NA] * n, dtype="Float64")
            continue
        total = np.bincount(bins, weights=values, minlength=n).astype(np.float64)
        if col in _SUMMED:
            out[col] = total
            continue
        if col in _WHOLE_POOL:
            pool = sum(float(df[c].iloc[0]) for c in _WHOLE_POOL[col])
            total += idle * pool
        out[col] = total / size
    return pd.DataFrame(out), per


def _requests(df: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    """The Requests panel's series: running and waiting, and swapped when any was."""
    if _SWAPPED[0] in df and bool((df[_SWAPPED[0]] > 0).any()):
        return (*_REQUESTS, _SWAPPED)
    return _REQUESTS


def _long(df: pd.DataFrame, series: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    parts = [pd.DataFrame({"iteration": df["iteration"], "time_s": df["time_s"],
                           "series": label, "value": df[col].astype("Float64")})
             for col, label in series]
    return pd.concat(parts, ignore_index=True).dropna(subset=["value"])


# Told apart in lightness as well as hue, and by dash (the legend names them too).
_SERIES_COLORS = ["#1f4e8c", "#e08214", "#b2182b"]


# Up to this many points per series, each is marked as well: a line needs two points to
# draw anything, and a step line ends at its last point, so a short run's first and
# last values would otherwise not show.
MARKED_POINTS = 60


def _panel(data: pd.DataFrame, title: str | alt.TitleParams, y_title: str, x: alt.X, *,
           width: int) -> alt.Chart:
    labels = list(dict.fromkeys(data["series"]))
    marked = data["iteration"].nunique() <= MARKED_POINTS
    # Every panel counts whole things (requests, blocks, tokens): no 0.5 ticks. Means
    # below one (a light trace's points average mostly idle iterations) would leave a
    # scale with room for only the tick 0: such a panel runs from 0 to 1.
    small = data.empty or not float(data["value"].max()) >= 1
    legend = alt.Legend(orient="right", labelLimit=200, symbolType="stroke")
    return alt.Chart(data).mark_line(interpolate="step-after", point=marked).encode(
        x=x, y=alt.Y("value:Q", title=y_title,
                     scale=alt.Scale(domain=[0, 1]) if small else alt.Undefined,
                     axis=alt.Axis(format=",d", tickMinStep=1)),
        # One legend for both channels (the same field, the same legend): its strokes
        # are coloured and dashed as the lines are told apart, even with points. A
        # legend left out for one of them would conflict with the other's.
        color=alt.Color("series:N", title=None, sort=labels,
                        scale=alt.Scale(domain=labels, range=_SERIES_COLORS[:len(labels)]),
                        legend=legend),
        strokeDash=alt.StrokeDash("series:N", title=None, sort=labels, legend=legend),
        tooltip=[alt.Tooltip("iteration:Q", format=",d"),
                 alt.Tooltip("time_s:Q", format=",.2f", title="time (s)"),
                 alt.Tooltip("series:N"), alt.Tooltip("value:Q", format=",.1f")],
    ).properties(title=title, width=width, height=130)


def timeline_chart(df: pd.DataFrame, *, paged: bool, width: int = 640,
                   max_points: int = 600) -> alt.VConcatChart:
    """Four panels over the same iterations: requests, memory, tokens, preemptions.

    Each series is named in its panel's legend and told apart by its dash as well
    as its colour."""
    shown, per = binned(df, max_points)
    lo, hi = int(df["iteration"].iloc[0]), int(df["iteration"].iloc[-1])
    # Iterations are whole numbers: no 0.5 ticks on a short run. One row still gets an
    # axis one iteration wide, not a zero-width domain.
    x = alt.X("iteration:Q", title="iteration",
              scale=alt.Scale(domain=[lo, max(hi, lo + 1)], nice=False),
              axis=alt.Axis(format=",d", tickMinStep=1))
    note = f"(mean of {per:,} iterations per point, idle ones included)" if per > 1 else ""

    def titled(name: str) -> str | alt.TitleParams:
        # The note on a line of its own: a title as long as the panel is wide took its
        # width from the plot (a 390 px phone drew each plot some 40 px wide).
        return alt.TitleParams(name, subtitle=note) if note else name

    memory = (_panel(_long(shown, _BLOCKS), titled("Blocks"), "blocks", x, width=width)
              if paged else
              _panel(_long(shown, _SLOTS), titled("Token slots"), "slots", x, width=width))
    top = max(1, int(shown["preemptions"].max()))
    pre = alt.Chart(shown).mark_bar(color="#b2182b").encode(
        x=x, y=alt.Y("preemptions:Q", title="preemptions",
                     scale=alt.Scale(domain=[0, top]),
                     axis=alt.Axis(format=",d", tickMinStep=1)),
        tooltip=[alt.Tooltip("iteration:Q", format=",d"),
                 alt.Tooltip("preemptions:Q", format=",.0f")],
    ).properties(title="Preemptions" + (f" (per {per:,} iterations)" if per > 1 else "")
                 # Bars of height zero draw nothing: the title says why the panel is empty.
                 + ("" if shown["preemptions"].any() else ": none in this run"),
                 width=width, height=90)
    return alt.vconcat(
        _panel(_long(shown, _requests(df)), titled("Requests"), "requests", x, width=width),
        memory,
        _panel(_long(shown, _TOKENS), titled("Tokens per iteration"), "tokens", x,
               width=width),
        pre,
    ).resolve_scale(color="independent", strokeDash="independent").properties(
        description=timeline_description(df, paged=paged, per=per))


def _most(df: pd.DataFrame, col: str) -> int:
    return int(df[col].max())


def timeline_description(df: pd.DataFrame, *, paged: bool, per: int = 1) -> str:
    """The four panels in one sentence, from every iteration (not the points' means): the
    most requests running and waiting, the most memory in use of the pool, the tokens
    processed and the preemptions in all."""
    lo, hi = int(df["iteration"].iloc[0]), int(df["iteration"].iloc[-1])
    busy = f"{len(df):,} busy" if len(df) < hi - lo + 1 else ""
    mean = f"each point the mean of {per:,} iterations" if per > 1 else ""
    notes = "; ".join(n for n in (busy, mean) if n)
    requests = (f"at most {counted(_most(df, 'running'), 'request')} running and "
                f"{_most(df, 'waiting'):,} waiting")
    if _requests(df) != _REQUESTS:
        requests += f" and {_most(df, _SWAPPED[0]):,} swapped out"
    first = df.iloc[0]
    if paged:
        pool = sum(int(first[col]) for col, _ in _BLOCKS)
        memory = f"at most {_most(df, 'used_blocks'):,} of {counted(pool, 'block')} used"
    else:
        pool = sum(int(first[col]) for col in _WHOLE_POOL["free_slots"])
        memory = (f"at most {_most(df, 'token_slots'):,} of {counted(pool, 'slot')} holding "
                  f"tokens and {_most(df, 'allocated_slots'):,} held by the policy")
    tokens = (f"{int(df['prefill_tokens'].sum()):,} prefill and "
              f"{counted(int(df['decode_tokens'].sum()), 'decode token')} in all")
    return (f"Timeline of iteration{'s' if hi > lo else ''} {span(lo, hi)}"
            + (f" ({notes})" if notes else "")
            + f" in four panels: {requests}; {memory}; {tokens}; "
            f"{counted(int(df['preemptions'].sum()), 'preemption')}.")
