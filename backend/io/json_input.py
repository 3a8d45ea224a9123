"""Decoding user-supplied JSON (scenario files, snapshots, uploads) as data only."""

from __future__ import annotations

import json
from typing import Any

from backend.core.errors import PagedLabError


def decode_json(data: str | bytes, what: str) -> Any:
    """`json.loads`, with every way a file can fail to be JSON as one PagedLabError.

    ValueError covers JSONDecodeError and integers too long to convert;
    RecursionError, arrays nested deeper than the parser goes. `what` names the
    input in the message ("snapshot", "scenario 'x.json'").
    """
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PagedLabError(f"{what} is not valid JSON: {exc}") from None
