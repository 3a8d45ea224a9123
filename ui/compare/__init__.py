"""The "Contiguous vs paged" page's sections, one module each (pages/compare.py lays them out).

Each section keeps its widget state under the `cmp_` prefix; the frames, charts and
tables they draw come from backend.views.compare. What two sections share lives here.
"""

from __future__ import annotations

from backend.views.compare import frames as views

SYNTHETIC_NOTE = ("Our numbers come from PagedLab's synthetic traces and simulator, not from "
                  "the paper's testbed (a real model serving real request datasets on a real "
                  "GPU): compare the ordering and the size of the gaps, not the digits.")


def label(policy: str) -> str:
    return views.POLICY_LABELS[policy]
