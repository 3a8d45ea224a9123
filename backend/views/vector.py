"""A K or V vector read from the cache, as a small bar chart (one row of bars per KV head)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from backend.core.words import counted
from backend.views.describe import MAX_LISTED
from backend.views.grid import INK, PALETTE


def vector_spec(vector: np.ndarray, name: str = "K") -> tuple[pd.DataFrame, dict[str, Any]]:
    """`vector` [num_kv_heads, head_dim] -> (data, Vega-Lite spec): one bar per component.

    One small bar chart per KV head, stacked (a vconcat, not a row facet: Streamlit
    sizes a facet to its content, 20 px a component, which overflows a narrow
    column and scrolls the page sideways; each chart of a vconcat it makes as wide
    as the column). Nothing sits beside the bars for the same reason: each head
    is titled above them with its range of values, there is no y axis, and the
    numbers themselves are in the table under the chart and in each bar's tooltip.
    """
    heads, dim = vector.shape
    labels = [f"{name} head {h}: {vector[h].min():.2f} to {vector[h].max():.2f}"
              for h in range(heads)]
    df = pd.DataFrame({
        "head": np.repeat(labels, dim),
        "component": np.tile(np.arange(dim), heads),
        "value": vector.reshape(-1).astype(float),
    })

    domains = []
    for h in range(heads):
        lo, hi = min(0.0, float(vector[h].min())), max(0.0, float(vector[h].max()))
        domains.append([lo, hi if hi > lo else 1.0])

    def head_chart(h: int) -> dict[str, Any]:
        last = h == heads - 1      # the component axis once, under the last head
        return {
            "transform": [{"filter": {"field": "head", "equal": labels[h]}}],
            "title": {"text": labels[h], "anchor": "start", "fontSize": 11,
                      "fontWeight": "normal", "offset": 2},
            "height": 46,
            "mark": {"type": "bar"},
            "encoding": {
                "x": {"field": "component", "type": "ordinal",
                      "title": "component" if last else None,
                      "axis": {"labels": last and dim <= 32, "ticks": False,
                               "labelFlush": True}},
                # One bar per component, from zero, on the head's own range given
                # here: nothing to stack, and no extent for Vega to find (it warns of
                # an infinite one while a chart is drawn before its data arrives).
                "y": {"field": "value", "type": "quantitative", "title": None,
                      "axis": None, "stack": None, "scale": {"domain": domains[h]}},
                "color": {"condition": {"test": "datum.value < 0", "value": INK},
                          "value": PALETTE[0]},
                "tooltip": [{"field": "head", "type": "nominal"},
                            {"field": "component", "type": "ordinal"},
                            {"field": "value", "type": "quantitative", "format": ".4f"}],
            },
        }

    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        # The chart's aria-label: the stacked heads as one picture.
        "description": _description(vector, labels, name),
        "spacing": 6,
        "vconcat": [head_chart(h) for h in range(heads)],
    }
    return df, spec


def _description(vector: np.ndarray, labels: list[str], name: str) -> str:
    """Each head's range (its title above its bars) and the component largest in size."""
    heads, dim = vector.shape
    h, c = np.unravel_index(int(np.abs(vector).argmax()), vector.shape)
    shown = labels[:MAX_LISTED]
    more = f"; and {counted(heads - MAX_LISTED, 'more head')}" if heads > MAX_LISTED else ""
    return (f"The {name} vector, one bar per component for each of its "
            f"{counted(heads, 'KV head')} ({counted(dim, 'component')} each): "
            + "; ".join(shown) + more + f". Largest in size: component {int(c)} of head "
            f"{int(h)}, {float(vector[h, c]):.2f}.")
