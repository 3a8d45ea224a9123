"""Altair charts for the "Contiguous vs paged" page, from backend.views.compare.frames.

Every chart colours the five memory states the same way, and every chart
that uses colour also names the states (legend, tooltip or axis), so they
stay distinguishable without it. The palette keeps the kinds apart in
lightness too (relative luminance at least 1.3 times the next darker's, so
they read apart in grey and for colour-blind eyes), except the two darkest,
which differ in hue: dark blue token states, dark red external fragmentation,
mid orange internal fragmentation, light blue reservation, pale free space.

Every chart's top-level `description` (its aria-label) says what it draws and its
main figures, from the frame it draws (backend.views.describe).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable

import altair as alt
import pandas as pd

from backend.core.words import counted, percent, tenths
from backend.views.compare.frames import KIND_LABELS, POLICY_ORDER, SHARING_KINDS, sharing_kinds
from backend.views.describe import MAX_LISTED, number, span, trend
from backend.views.legend import swatch_html

KIND_DOMAIN: list[str] = list(KIND_LABELS.values())
# Internal fragmentation's orange, darker than reservation's light blue: the two had the
# same lightness (1.07:1), alike in grey.
INTERNAL_COLOR = "#d98a2b"
KIND_COLORS: list[str] = ["#1f4e8c", "#8fbce6", INTERNAL_COLOR, "#b2182b", "#e6e6e6"]


# A banded (nominal) axis gets 34 px per band. Not as a Vega-Lite step: Streamlit's theme
# asks every chart to fit its column ("fit"), which a step height cannot, and Vega-Lite
# says so in the browser's console on every redraw. Nor as a fixed height under "fit",
# which counts the legend and axes in it and squeezes the bands to nothing. So: the bands'
# height in pixels, fitting the width only (its axes and legend are drawn outside it).
BAND_PX = 34
FIT_WIDTH = alt.AutoSizeParams(type="fit-x", contains="padding")

# Below this container width (a phone) a stage label is wrapped onto lines of at most
# WRAP_CHARS characters (on one line it took half the chart from the slots), and a
# legend takes one column (the second ran off the screen).
NARROW_PX = 480
WRAP_CHARS = 22
# The Vega test for such a container. Vega evaluates an expression again only when a
# signal it reads changes, and containerSize() is not one: read alone, it was the width
# when the chart was first drawn. Streamlit resizes a drawn chart by setting its `width`
# signal, so the test reads `width` (times 0) and is made again at every resize.
_NARROW = f"containerSize()[0] + 0 * width < {NARROW_PX}"


def _kind_color(legend: bool = True) -> alt.Color:
    return alt.Color("kind:N", title="state",
                     scale=alt.Scale(domain=KIND_DOMAIN, range=KIND_COLORS),
                     legend=alt.Legend(orient="bottom", labelLimit=240,
                                       columns=alt.ExprRef(f"{_NARROW} ? 1 : 2"))
                     if legend else None)


def _balanced(label: str) -> list[str]:
    """`label` on as few lines as WRAP_CHARS allows, of even lengths: "3. D arrives (4
    tokens," / "final length 5)", not a third line holding "5)"."""
    count = max(1, math.ceil(len(label) / WRAP_CHARS))
    for width in range(max(1, math.ceil(len(label) / count)), len(label) + 1):
        lines = textwrap.wrap(label, width)
        if len(lines) <= count:
            return lines
    return [label]


def _wrapped_labels(labels: list[str]) -> str:
    """A Vega expression for a banded axis' labels: each on one line, or wrapped (an array
    of lines, which Vega draws one under another) when the chart's container is narrow."""
    lines = {label: _balanced(label) for label in labels}
    return f"{_NARROW} ? {json.dumps(lines)}[datum.label] : datum.label"


def slot_strip(df: pd.DataFrame, title: str, *, width: int = 520) -> alt.LayerChart:
    """One row of slots per stage (y), slot number on x, owner letters written in."""
    stages = list(dict.fromkeys(df["stage"]))
    base = alt.Chart(df).encode(
        x=alt.X("slot:O", title="slot", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("stage:N", sort=stages, title=None,
                axis=alt.Axis(labelLimit=260, labelExpr=_wrapped_labels(stages))),
    )
    tooltip = ["stage:N", "slot:O", "kind:N", "owner:N"]
    if "block" in df.columns:
        tooltip.insert(2, "block:O")
    cells = base.mark_rect(stroke="white", strokeWidth=2).encode(
        color=_kind_color(), tooltip=tooltip)
    text = base.mark_text(fontWeight="bold").encode(
        text="owner:N",
        color=alt.condition(
            "datum.kind == 'token states' || datum.kind == 'external fragmentation'",
            alt.value("white"), alt.value("black")))
    return (cells + text).properties(title=title, width=width,
                                     height=len(stages) * BAND_PX, autosize=FIT_WIDTH,
                                     description=_strip_description(df, title, stages))


def _kind_counts(kinds: pd.Series) -> str:
    """'token states 5, reservation 9, free 2': the slots of each state present, in the
    legend's order."""
    counts = kinds.value_counts()
    return ", ".join(f"{kind} {int(counts[kind]):,}" for kind in KIND_DOMAIN if kind in counts)


def _strip_description(df: pd.DataFrame, title: str, stages: list[str]) -> str:
    """'16 slots, one region per request, slots by state at 3 stages: 1. A, B and C
    arrive: token states 5, reservation 9, free 2; ...' (the first MAX_LISTED stages)."""
    told = [f"{stage}: {_kind_counts(df.loc[df['stage'] == stage, 'kind'])}"
            for stage in stages[:MAX_LISTED]]
    more = (f"; and {counted(len(stages) - MAX_LISTED, 'more stage')}"
            if len(stages) > MAX_LISTED else "")
    return (f"{title}, slots by state at {counted(len(stages), 'stage')}: "
            + "; ".join(told) + more + ".")


def kind_legend_html() -> str:
    """The five states as labelled swatches, the shared legend of the maps below it.

    HTML rather than a chart: its entries wrap to the page's width (a grid of three
    200 px columns was cut, and ran one label into the next swatch, on a phone), and a
    screen reader reads its words.
    """
    parts = [f"<span role='listitem' style='display:inline-block;margin-right:16px'>"
             f"{swatch_html(color, '#555', width=14, height=14, margin='0 6px -2px 0')}"
             f"{kind}</span>"
             for kind, color in zip(KIND_DOMAIN, KIND_COLORS, strict=True)]
    return ("<div class='pl-kind-legend' role='list' aria-label='Legend of the memory maps "
            "below: the state of each slot' style='font-size:13px;line-height:1.9'>"
            + "".join(parts) + "</div>")


def memory_map(df: pd.DataFrame, title: str, capacity: int, x_domain: tuple[int, int],
               *, height: int = 360) -> alt.Chart:
    """x = iteration, y = slot, colour = state: the memory over time (legend:
    kind_legend_html)."""
    return alt.Chart(df).mark_rect().encode(
        x=alt.X("iteration:Q", title="iteration", scale=alt.Scale(domain=list(x_domain))),
        x2="iteration_end:Q",
        y=alt.Y("start:Q", title="slot", scale=alt.Scale(domain=[0, capacity], nice=False)),
        y2="end:Q",
        color=_kind_color(legend=False),
        tooltip=[alt.Tooltip("iteration:Q", format=",d"), "kind:N", "owner:N",
                 alt.Tooltip("start:Q", format=",d"), alt.Tooltip("slots:Q", format=",d")],
    ).properties(title=title, height=height, description=_map_description(df, title, capacity))


def _shares(weights: pd.Series) -> str:
    """'token states 41.2%, reservation 20.0%, ...': each state's share of `weights` (a
    total per kind), in the legend's order, those present only."""
    total = float(weights.sum())
    return ", ".join(f"{kind} {percent(float(weights[kind]) / total)}"
                     for kind in KIND_DOMAIN if kind in weights and weights[kind] > 0)


def _map_description(df: pd.DataFrame, title: str, capacity: int) -> str:
    """The map's slots and iterations, the requests its columns show (a long run's columns
    sample it, so a short-lived request may fall between them) and each state's share of
    the area drawn (slots times iterations)."""
    if df.empty:
        return f"{title}: the state of each of {capacity:,} slots, with nothing to draw."
    area = ((df["end"] - df["start"]) * (df["iteration_end"] - df["iteration"])).groupby(
        df["kind"]).sum()
    owners = df.loc[df["owner"] != "", "owner"].nunique()
    its = span(int(df["iteration"].min()), int(df["iteration_end"].max()) - 1)
    return (f"{title}: the state of each of {capacity:,} slots (vertical) at iterations "
            f"{its} (horizontal), {counted(owners, 'request')} shown. Of the area drawn: "
            f"{_shares(area)}.")


def fractions_area(df: pd.DataFrame, x_domain: tuple[int, int], *, height: int = 210
                   ) -> alt.Chart:
    """The five shares stacked over time, in a fixed order (token states at the bottom).

    The height holds the x axis and its title too: below about 200 px the plot is
    shorter than its y title, which the chart then cuts off.
    """
    return alt.Chart(df).mark_area().encode(
        x=alt.X("iteration:Q", title="iteration", scale=alt.Scale(domain=list(x_domain))),
        y=alt.Y("fraction:Q", stack="normalize", title="share of memory",
                axis=alt.Axis(format="%")),
        color=_kind_color(legend=False),
        order=alt.Order("order:Q", sort="ascending"),
        tooltip=[alt.Tooltip("iteration:Q", format=",d"), "kind:N",
                 alt.Tooltip("fraction:Q", format=".1%")],
    ).properties(height=height, description=_fractions_description(df))


def _fractions_description(df: pd.DataFrame) -> str:
    """Each state's mean share over the points drawn, and the token states' peak."""
    if df.empty:
        return "Share of memory in each state over time: nothing to draw."
    points = df["iteration"].nunique()
    its = span(int(df["iteration"].min()), int(df["iteration"].max()))
    tokens = df[df["kind"] == KIND_LABELS["token_states"]]
    peak = (f" Token states peak at {percent(float(tokens['fraction'].max()))} (iteration "
            f"{int(tokens.loc[tokens['fraction'].idxmax(), 'iteration']):,})."
            if not tokens.empty else "")
    return (f"Share of memory in each state over iterations {its}, stacked to 100%. Mean over "
            f"the {counted(points, 'point')} drawn: "
            f"{_shares(df.groupby('kind')['fraction'].sum())}.{peak}")


def breakdown_bars(df: pd.DataFrame, *, title: str = "Where the KV memory goes") -> alt.Chart:
    """Stacked horizontal bars, one per policy: the five time-averaged shares."""
    policies = [p for p in POLICY_ORDER if p in set(df["policy"])]
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("policy:N", sort=policies, title=None),
        x=alt.X("fraction:Q", stack="normalize", title="share of KV capacity (time average)",
                axis=alt.Axis(format="%")),
        color=_kind_color(),
        order=alt.Order("order:Q", sort="ascending"),
        tooltip=["policy:N", "kind:N", alt.Tooltip("fraction:Q", format=".1%")],
    ).properties(title=title, height=len(policies) * BAND_PX, autosize=FIT_WIDTH,
                 description=_breakdown_description(df, title, policies))


def _breakdown_description(df: pd.DataFrame, title: str, policies: list[str]) -> str:
    """Per policy, its token-state share and the largest of its other shares."""
    told = []
    for policy in policies:
        rows = df[df["policy"] == policy].set_index("kind")["fraction"]
        total = float(rows.sum())
        share = float(rows.get(KIND_LABELS["token_states"], 0.0)) / total if total else 0.0
        rest = rows.drop(KIND_LABELS["token_states"], errors="ignore")
        other = (f" (the largest other: {rest.idxmax()} {percent(float(rest.max()) / total)})"
                 if total and not rest.empty and rest.max() > 0 else "")
        told.append(f"{policy} {percent(share)}{other}")
    return (f"{title}: one bar per policy, split into the time-averaged share of KV capacity "
            f"in each state. Token states: {'; '.join(told)}.")


def policy_bars(df: pd.DataFrame, field: str, title: str, *, percent: bool = False,
                integer: bool = False, paper_field: str | None = None
                ) -> alt.LayerChart | alt.Chart:
    """One bar per policy for `field`, labelled with its value; optional paper ticks."""
    policies = [p for p in POLICY_ORDER if p in set(df["policy"])]
    fmt = ".1%" if percent else ",.0f" if integer else ".1f"
    # The labels and tooltips are written here, as the page's sentences write the same
    # values: the browser's own formatting rounds an exact half up (1.25 reads 1.3) where
    # Python's rounds it to even, and its binary reading of 1.15 gives 1.1.
    df = df.assign(**{f"{c} label": [_formatted(float(v), fmt) for v in df[c]]
                      for c in (field, paper_field) if c is not None})
    label = f"{field} label:N"
    # Whole counts get whole ticks (all zeros would otherwise read 0.000000), and all
    # zeros a scale from 0 to 1, which keeps the zero line at the foot of the plot (a
    # one-value scale puts it in the middle).
    zeros = integer and not df[field].max() > 0
    axis = (alt.Axis(format="%") if percent else
            alt.Axis(format=",d", values=[0, 1]) if zeros else
            alt.Axis(format=",d", tickMinStep=1) if integer else alt.Axis())
    scale = alt.Scale(domain=[0, 1]) if zeros else alt.Undefined
    base = alt.Chart(df).encode(x=alt.X("policy:N", sort=policies, title=None,
                                        axis=alt.Axis(labelAngle=0)))
    bars = base.mark_bar(color="#1f4e8c").encode(
        y=alt.Y(f"{field}:Q", title=title, axis=axis, scale=scale),
        tooltip=["policy:N", alt.Tooltip(label, title=field)])
    if paper_field is None:
        labels = base.mark_text(baseline="bottom", dy=-3).encode(
            y=f"{field}:Q", text=alt.Text(label))
        return (bars + labels).properties(
            title=title, height=240,
            description=_policy_description(df, policies, field, title, fmt, paper_field))
    # At the bar's foot, in white: the paper's tick can fall anywhere near the bar's top
    # (just above it, inside it), where a label would sit under it. A bar too short to
    # hold its label has it above its top instead.
    # The threshold as the filters write it, so that each bar is in exactly one of them.
    low = float(f"{0.12 * float(max(df[field].max(), df[paper_field].max())):.6g}")
    tall = df[field] >= low
    text = alt.Text(label)
    layers = [bars]
    # Each label layer only where it labels a bar: a layer whose filter leaves no row has
    # an empty scale domain, which Vega-Lite reports in the browser's console.
    if tall.any():
        layers.append(base.transform_filter(f"datum[{field!r}] >= {low:.6g}").mark_text(
            baseline="bottom", dy=-4, color="white", fontWeight="bold").encode(
            y=alt.datum(0), text=text))
    if not tall.all():
        layers.append(base.transform_filter(f"datum[{field!r}] < {low:.6g}").mark_text(
            baseline="bottom", dy=-3).encode(y=f"{field}:Q", text=text))
    layers.append(base.mark_tick(color="#b2182b", thickness=3, size=36).encode(
        y=f"{paper_field}:Q",
        tooltip=["policy:N", alt.Tooltip(f"{paper_field} label:N",
                                         title="paper (Figure 2)")]))
    return alt.LayerChart(layer=layers).properties(
        title=title, height=240,
        description=_policy_description(df, policies, field, title, fmt, paper_field))


def _policy_description(df: pd.DataFrame, policies: list[str], field: str, title: str,
                        fmt: str, paper_field: str | None) -> str:
    """'Mean batch size, one bar per policy: max 7.3, ..., paged 30.2.' and the paper's
    ticks, each value written as its bar's label (`fmt`)."""
    by = df.set_index("policy")

    def values(column: str) -> str:
        return ", ".join(f"{p} {_formatted(float(by.loc[p, column]), fmt)}" for p in policies)

    paper = (f" Red ticks mark the paper's Figure 2 values: {values(paper_field)}."
             if paper_field is not None else "")
    return f"{title}, one bar per policy: {values(field)}.{paper}"


def _formatted(x: float, fmt: str) -> str:
    """`x` as a bar's label writes it ('.1%', ',.0f' or '.1f'), halves rounded up."""
    return percent(x) if fmt.endswith("%") else tenths(x) if fmt == ".1f" else format(x, fmt)


def block_sweep_lines(df: pd.DataFrame) -> alt.HConcatChart:
    """Tail waste and table entries against block size (log 2 axis), side by side."""
    x = alt.X("block size:Q", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=[int(v) for v in df["block size"]]))
    waste = alt.Chart(df).mark_line(point=alt.OverlayMarkDef(color=INTERNAL_COLOR),
                                    color=INTERNAL_COLOR).encode(
        x=x, y=alt.Y("tail waste:Q", axis=alt.Axis(format="%"),
                     title="tail waste (share of allocated slots)"),
        tooltip=["block size:Q", alt.Tooltip("tail waste:Q", format=".1%")],
    ).properties(title="Tail waste grows with the block size", width=260, height=240,
                 description=_sweep_description(df, "tail waste", "Tail waste (the share of "
                                                "allocated slots left empty)", percent))
    # Ticks at 1, 2, 5, 10, 20, ...: Vega-Lite's own on a log scale read 1, 3, 20, 100, 300.
    lo, hi = float(df["table entries at finish"].min()), float(df["table entries at finish"].max())
    ticks = [m * 10**e for e in range(-1, 8) for m in (1, 2, 5) if lo / 2 <= m * 10**e <= hi * 2]
    entries = alt.Chart(df).mark_line(point=True, color="#1f4e8c").encode(
        x=x, y=alt.Y("table entries at finish:Q", scale=alt.Scale(type="log"),
                     axis=alt.Axis(values=ticks, format=",~g"),
                     title="block-table entries at a request's end"),
        tooltip=["block size:Q", alt.Tooltip("table entries at finish:Q", format=".2f")],
    ).properties(title="Table entries shrink with it", width=260, height=240,
                 description=_sweep_description(
                     df, "table entries at finish", "Block-table entries at a request's end",
                     lambda x: number(x, 2)))
    # The page draws the two apart, each with its own description; drawn together (an
    # export), the pair says both.
    both = f"{waste.description} {entries.description}"
    return alt.hconcat(waste, entries).properties(description=both)


def _sweep_description(df: pd.DataFrame, field: str, what: str,
                       shown: Callable[[float], str]) -> str:
    """'Tail waste ..., one point per block size (9 sizes, 1 to 256): from 0.0% at block
    size 1 to 71.0% at block size 256': each size's value, or past MAX_LISTED sizes the
    smallest and largest size's."""
    rows = df.sort_values("block size")
    points = [f"{shown(float(v))} at block size {int(b)}"
              for b, v in zip(rows["block size"], rows[field], strict=True)]
    return f"{what}, {_sizes(rows['block size'])}: {trend(points)}."


def _sizes(sizes: pd.Series) -> str:
    """'one point per block size (9 sizes, 1 to 256)', or 'at block size 16' alone."""
    lo, hi = int(sizes.min()), int(sizes.max())
    if len(sizes) == 1:
        return f"at block size {lo}"
    return f"one point per block size ({counted(len(sizes), 'size')}, {lo} to {hi})"


def block_batch_line(df: pd.DataFrame) -> alt.Chart:
    """Mean batch size the simulator reached per block size (log 2 axis)."""
    lo, hi = float(df["mean batch size"].min()), float(df["mean batch size"].max())
    # Batches within a request of each other (the same at every size, on a light trace)
    # would get a scale a hair wide whose one tick reads "9.319595": a scale at least one
    # request wide, on whole numbers, instead.
    scale = (alt.Scale(domain=[math.floor(lo), max(math.ceil(hi), math.floor(lo) + 1)])
             if hi - lo < 1 else alt.Scale(zero=False))
    return alt.Chart(df).mark_line(point=True, color="#1f4e8c").encode(
        x=alt.X("block size:Q", scale=alt.Scale(type="log", base=2),
                axis=alt.Axis(values=[int(v) for v in df["block size"]])),
        y=alt.Y("mean batch size:Q", scale=scale, axis=alt.Axis(format=",.2~f")),
        tooltip=["block size:Q", alt.Tooltip("mean batch size:Q", format=".2f"),
                 alt.Tooltip("internal fragmentation of capacity:Q", format=".2%"),
                 "preemptions:Q"],
    ).properties(title="Mean batch size in the simulator", height=240,
                 description=_batch_description(df))


def _batch_description(df: pd.DataFrame) -> str:
    """The block sizes run and the highest and lowest mean batch among them."""
    high = df.loc[df["mean batch size"].idxmax()]
    low = df.loc[df["mean batch size"].idxmin()]

    def at(row: pd.Series) -> str:
        return f"{number(float(row['mean batch size']), 2)} at block size {int(row['block size'])}"

    said = f"Mean batch size the paged simulator reached, {_sizes(df['block size'])}: "
    if len(df) == 1:
        return said + f"{number(float(high['mean batch size']), 2)}."
    return said + f"highest {at(high)}, lowest {at(low)}."


def sharing_bars(df: pd.DataFrame) -> alt.FacetChart:
    """Saved share per n, one panel per kind in `df` (the Sharing tab draws one kind a
    chart, so that the two wrap on a phone), with the paper's range as a band."""
    # No data on the layers: a faceted layer takes its data from the top.
    base = alt.Chart().encode(x=alt.X("n:O", title="samples / beam width",
                                      axis=alt.Axis(labelAngle=0)))
    band = base.mark_bar(color="#b2182b", opacity=0.18).encode(
        y=alt.Y("paper low:Q"), y2="paper high:Q",
        tooltip=["kind:N", "n:O", "paper range:N"])
    bars = base.mark_bar(color="#1f4e8c", size=28).encode(
        y=alt.Y("saved:Q", title="block memory saved by sharing", axis=alt.Axis(format="%")),
        tooltip=["kind:N", "n:O", alt.Tooltip("saved:Q", format=".1%"), "paper range:N"])
    labels = base.mark_text(dy=-7).encode(y="saved:Q", text=alt.Text("saved:Q", format=".1%"))
    # A panel of 200 px and its axis: two such charts side by side fit the page beside
    # the sidebar of a 1024 px window.
    return alt.layer(band, bars, labels, data=df).properties(width=200, height=240).facet(
        column=alt.Column("kind:N", title=None, sort=list(SHARING_KINDS.values()))
    ).resolve_scale(y="independent").properties(description=_sharing_description(df))


def _sharing_description(df: pd.DataFrame) -> str:
    """Per kind, the share saved at each n and the paper's range."""
    told = []
    for kind in sharing_kinds(df):
        rows = df[df["kind"] == kind].sort_values("n")
        saved = ", ".join(f"{percent(float(v))} at n = {int(n)}"
                          for n, v in zip(rows["n"], rows["saved"], strict=True))
        paper = rows.iloc[0]
        told.append(f"{kind} {saved} (the paper: {percent(float(paper['paper low']))} to "
                    f"{percent(float(paper['paper high']))})")
    return ("Block memory saved by sharing, one bar per samples or beam width, beside the "
            f"paper's range (Figure 15) as a shaded band: {'; '.join(told)}.")
