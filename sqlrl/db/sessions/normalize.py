"""Normalising driver values into JSON-serialisable, hashable Python values.

Every dialect's rows pass through ``normalize_value`` so that a result means the same thing
whatever engine produced it:

| driver value                      | becomes                                            |
|-----------------------------------|----------------------------------------------------|
| None, bool, int, str              | unchanged                                          |
| float                             | unchanged (NaN/inf stay floats)                    |
| decimal.Decimal                   | int when integral, else float                      |
| datetime.datetime / date / time   | ISO 8601 string (``2020-01-31``, ``2020-01-31 12:00:00``) |
| datetime.timedelta                | float seconds                                      |
| bytes / bytearray / memoryview    | ``"0x"`` + lower-case hex                          |
| uuid.UUID                         | its string                                         |
| list / tuple / dict (arrays, JSON) | compact JSON text with sorted keys                |
| anything else                     | ``str(value)``                                     |

Datetimes use a space separator (as SQLite stores them), so SQLite text dates and server-side
DATE/TIMESTAMP values compare equal after normalisation.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import uuid
from itertools import chain
from typing import Any

_PASSTHROUGH = (type(None), bool, int, float, str)
_PLAIN_TYPES = frozenset(_PASSTHROUGH)


def normalize_value(value: Any) -> Any:
    if isinstance(value, _PASSTHROUGH):
        return value
    if isinstance(value, decimal.Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return float(value)
    if isinstance(value, _dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (_dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return str(value)


def normalize_row(row: Any) -> tuple[Any, ...]:
    return tuple(normalize_value(v) for v in row)


def normalize_rows(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Normalise a fetched chunk; when every value is already plain (the common case) this is one
    C-level scan of the value types and no per-value Python work."""
    if set(map(type, chain.from_iterable(rows))) <= _PLAIN_TYPES:
        return [r if type(r) is tuple else tuple(r) for r in rows]
    return [normalize_row(r) for r in rows]
