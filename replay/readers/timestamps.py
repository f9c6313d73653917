"""Timestamps of log records → integer microseconds since the epoch.

Numbers in s/ms/µs (the unit decided once per file, see `parse_ts`), numeric
strings, ISO-8601 strings and parquet timestamp columns.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

from replay.times import UNIT_US, to_us
from replay.readers.fields import MISSING, TS_NAMES, Options, Reject, lookup_field, type_name

TIME_UNITS = tuple(UNIT_US)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Timestamps are int64 microseconds (the walks, the compiled kernels and DuckDB
# store them) and so are the gaps between them: within ±2**62 µs (±146,000
# years), any gap is below INF_US and no difference overflows. A number beyond
# it (1e20 s, 10**30) is rejected, not loaded as an overflow or a crash.
TS_LIMIT_US = 2**62


def _iso_us(s: str) -> int | None:
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    return _datetime_us(dt)


def _datetime_us(dt: datetime) -> int:
    if dt.tzinfo is None:  # a naive time is taken as UTC
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - _EPOCH) // timedelta(microseconds=1)


def guess_unit(x: float) -> str:
    """The unit of a numeric timestamp by its magnitude: |x| > 1e14 → µs, > 1e11 → ms, else s."""
    ax = abs(x)
    return "us" if ax > 1e14 else "ms" if ax > 1e11 else "s"


def parse_ts(v: Any, fname: str, opts: "Options | str | None", default_unit: str | None = None) -> int:
    """Integer microseconds from a number, numeric string or ISO-8601 string.

    The unit of numbers is decided once per file (semantics.md): ``opts.time_unit``
    when given (``--time-unit``), else the unit this file already settled on
    (``opts.file_unit``), else ``default_unit`` (a format's own, e.g. Mooncake's
    ms), else the magnitude of this first number (:func:`guess_unit`); the
    choice is kept in ``opts.file_unit`` for the rest of the file. ISO strings
    are never scaled; a naive ISO time is taken as UTC. ``opts`` may also be a
    unit name (or None) for a one-off conversion.
    """
    if v is MISSING or v is None or v == "":
        raise Reject("missing_timestamp", f"no timestamp: field '{fname}' is absent or null")
    if isinstance(v, bool):
        raise Reject("bad_timestamp", f"field '{fname}' is a boolean, expected a number or an ISO-8601 string")
    if isinstance(v, datetime):  # parquet timestamp columns
        return _datetime_us(v)
    if isinstance(v, str):
        num: Any = v.strip()
        try:
            float(num)
        except ValueError:
            t = _iso_us(num)
            if t is None:
                raise Reject("bad_timestamp",
                             f"field '{fname}' is a string of length {len(num)} that is neither a number "
                             f"nor an ISO-8601 date-time") from None
            return t
    elif isinstance(v, (int, float)):
        num = v
    else:
        raise Reject("bad_timestamp", f"field '{fname}' is {type_name(v)}, expected a number or an ISO-8601 string")
    try:
        x = float(num)
    except OverflowError:  # an integer too large for a float: far out of range
        raise Reject("bad_timestamp", f"field '{fname}' is out of range (beyond ±2**62 microseconds)") from None
    if not math.isfinite(x):
        raise Reject("bad_timestamp", f"field '{fname}' is not a finite number")
    if isinstance(opts, Options):
        unit = opts.time_unit or opts.file_unit or default_unit or guess_unit(x)
        opts.file_unit = opts.file_unit or unit
    else:
        unit = opts or default_unit or guess_unit(x)
    us = to_us(num, unit)
    if not -TS_LIMIT_US < us < TS_LIMIT_US:
        raise Reject("bad_timestamp", f"field '{fname}' is out of range (beyond ±2**62 microseconds)")
    return us


def record_ts(rec: dict, opts: Options, default_unit: str | None = None) -> int:
    fname, v = lookup_field(rec, opts, "timestamp", TS_NAMES)
    if v is MISSING:
        names = opts.fields.get("timestamp") or "/".join(TS_NAMES)
        raise Reject("missing_timestamp", f"no timestamp field ({names}) in the record")
    return parse_ts(v, fname, opts, default_unit)
