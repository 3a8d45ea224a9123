"""View models for PagedLab's pages: frames, charts and text built from a snapshot.

No Streamlit here: pages render what these functions return, tests check it
directly, and an export can turn the same chart into PNG or SVG.

    model    a snapshot as typed rows and DataFrames; grid, vector: the block grid
    metrics  the metrics panel's figures and the kernel panel's last step
    tokens   a snapshot's tokens as their model's pieces (bytes, or BPE tokens)
    legend   the grid's legend (page and exports) and grid_chart, the grid with it
    glossary what the pages' terms mean (tooltips); settings: a config as rows
    html     metrics, event log and layout cards; tour: the Scenarios page's views
    text     user text as Markdown that Streamlit shows as written (plain_md, md_code)
    describe the words of a chart's text alternative (its description, the aria-label)
    compare/ the "Contiguous vs paged" page's frames, charts and tables

May import: engine, lab, models (a tokenizer, never weights), paging and core
(read-only use); never io or sessions.
"""

from __future__ import annotations

from backend.views.beams import BeamGroup, beam_groups, beams_frame
from backend.views.grid import (
    PAGE_SIZE,
    PALETTE,
    SELECTION,
    grid_frame,
    grid_spec,
    grid_title,
    num_pages,
    overview_spec,
)
from backend.views.html import event_log_html, layouts_html, legend_html, metrics_html
from backend.views.legend import grid_chart, legend_entries
from backend.views.metrics import KernelInfo, MetricItem, kernel_info, metric_items
from backend.views.model import (
    REQUEST_COLUMN_HELP,
    Chunk,
    Snapshot,
    blocks_frame,
    events_frame,
    finished_frame,
    format_bytes,
    holders_by_block,
    request_of,
    requests_frame,
    requests_layout,
    table_text,
    text_by_block,
)
from backend.views.tokens import TOOLTIP_TOKENS, block_cache_salt, block_tokens, token_pieces
from backend.views.vector import vector_spec

__all__ = [
    "PAGE_SIZE",
    "PALETTE",
    "REQUEST_COLUMN_HELP",
    "SELECTION",
    "TOOLTIP_TOKENS",
    "BeamGroup",
    "Chunk",
    "KernelInfo",
    "MetricItem",
    "Snapshot",
    "beam_groups",
    "beams_frame",
    "block_cache_salt",
    "block_tokens",
    "blocks_frame",
    "event_log_html",
    "events_frame",
    "finished_frame",
    "format_bytes",
    "grid_chart",
    "grid_frame",
    "grid_spec",
    "grid_title",
    "holders_by_block",
    "kernel_info",
    "layouts_html",
    "legend_entries",
    "legend_html",
    "metric_items",
    "metrics_html",
    "num_pages",
    "overview_spec",
    "request_of",
    "requests_frame",
    "requests_layout",
    "table_text",
    "text_by_block",
    "token_pieces",
    "vector_spec",
]
