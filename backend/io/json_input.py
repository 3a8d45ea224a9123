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


class FieldReader:
    """Typed field access to a decoded JSON object; every malformed value is a PagedLabError.

    `where` names the object in messages (\"snapshot.config\").
    """

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def get(self, key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise PagedLabError(f"{self.where}: missing field {key!r}")
        v = self.data[key]
        if v is None and optional:
            return None
        if isinstance(v, bool) and kind is int:
            raise PagedLabError(f"{self.where}.{key} must be an integer, got {v!r}")
        if not isinstance(v, kind):
            name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise PagedLabError(f"{self.where}.{key} must be {name}, got {v!r}")
        return v

    def int_list(self, key: str, lo: int, hi: int) -> list[int]:
        v = self.get(key, list)
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
                raise PagedLabError(f"{self.where}.{key}[{i}] must be an integer in "
                                    f"{lo}..{hi}, got {x!r}")
        return v


def non_negative(r: FieldReader, key: str, *, optional: bool = False) -> int:
    """An optional or required integer field that must be >= 0 (missing optional: 0)."""
    v = r.get(key, int, optional=optional)
    if v is None:
        return 0
    if v < 0:
        raise PagedLabError(f"{r.where}.{key} must be >= 0, got {v}")
    return int(v)
