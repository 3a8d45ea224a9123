"""A K or V vector read from the cache, as a small bar chart (one row of bars per KV head)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from backend.views.grid import INK, PALETTE


def vector_spec(vector: np.ndarray, name: str = "K") -> tuple[pd.DataFrame, dict[str, Any]]:
    """`vector` [num_kv_heads, head_dim] -> (data, Vega-Lite spec): one bar per component."""
    heads, dim = vector.shape
    df = pd.DataFrame({
        "head": np.repeat([f"{name} head {h}" for h in range(heads)], dim),
        "component": np.tile(np.arange(dim), heads),
        "value": vector.reshape(-1).astype(float),
    })
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "height": 46,
        "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": "component", "type": "ordinal", "title": "component",
                  "axis": {"labels": dim <= 32, "ticks": False}},
            "y": {"field": "value", "type": "quantitative", "title": None,
                  "axis": {"tickCount": 3}},
            "row": {"field": "head", "type": "nominal", "title": None,
                    "header": {"labelAngle": 0, "labelAlign": "left"}},
            "color": {"condition": {"test": "datum.value < 0", "value": INK},
                      "value": PALETTE[0]},
            "tooltip": [{"field": "head", "type": "nominal"},
                        {"field": "component", "type": "ordinal"},
                        {"field": "value", "type": "quantitative", "format": ".4f"}],
        },
    }
    return df, spec
