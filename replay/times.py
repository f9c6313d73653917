"""Time as integer microseconds, and TTLs (semantics.md: "times are compared exactly").

Every timestamp from ingest to sweep is an ``int`` of microseconds (epoch or
relative), so a gap of exactly τ is exactly τ: two requests 60,000 ms apart are
60,000,000 µs apart, never 60.00000000000023 s. Seconds appear only at the
edges: TTLs as the user writes them (``5m``, ``0.5``) and figures printed or
returned as seconds (``ttl_s``, ``idle_gap_s``).

``INF_US`` stands for an infinite TTL or horizon: larger than any gap a log can
hold, and still an int64 (the walks, the compiled kernels and DuckDB store it).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

US_PER_S = 1_000_000
INF_US = 2**63 - 1
UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1}  # timestamp units a log may use

_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str | float) -> float:
    """'5m' → 300, '1h' → 3600, '90' → 90 (seconds), 'inf' → ∞."""
    if isinstance(text, (int, float)):
        if text < 0 or math.isnan(text):
            raise ValueError(f"bad TTL {text!r}: must be ≥ 0")
        return float(text)
    s = text.strip().lower()
    if s in ("inf", "infinity", "none", "∞"):
        return math.inf
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", s)
    if not m:
        raise ValueError(f"bad TTL {text!r}: use a number of seconds or a unit s/m/h/d, or 'inf'")
    return float(Decimal(m.group(1)) * _TTL_UNITS[m.group(2)])


def format_ttl(ttl: float | None) -> str:
    if ttl is None or ttl == math.inf:
        return "inf"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if ttl >= size and ttl % size == 0:
            return f"{int(ttl // size)}{unit}"
    return f"{ttl:g}s"


def ttl_us(ttl_s: float) -> int:
    """A TTL in seconds as whole microseconds, for comparing with integer gaps.

    A gap ``g`` (an int) is within τ when ``g ≤ τ``, which for integers is
    ``g ≤ floor(τ)``; the floor is taken on the decimal the user wrote
    (``repr`` of the float), so 0.3 s is 300,000 µs and not 299,999."""
    if ttl_s == math.inf:
        return INF_US
    if ttl_s < 0 or math.isnan(ttl_s):
        raise ValueError(f"bad TTL {ttl_s!r}: must be ≥ 0")
    us = int(Decimal(repr(float(ttl_s))) * US_PER_S)  # int() truncates: the floor of a non-negative
    return min(us, INF_US)


def seconds(us: int | None) -> float | None:
    """Microseconds as seconds (None and ∞ pass through as None and inf)."""
    if us is None:
        return None
    return math.inf if us >= INF_US else us / US_PER_S


def to_us(value: int | float | str | Decimal, unit: str) -> int:
    """A numeric timestamp in ``unit`` (s, ms, us) as whole microseconds.

    Integers and decimal strings are converted exactly; a float is converted
    through its shortest decimal form (what the log printed), then rounded to
    the nearest microsecond."""
    scale = UNIT_US[unit]
    if isinstance(value, int) and not isinstance(value, bool):
        return value * scale
    try:
        d = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else value)
    except InvalidOperation:
        raise ValueError(f"not a number: {value!r}") from None
    if not d.is_finite():
        raise ValueError(f"not a finite number: {value!r}")
    return int((d * scale).to_integral_value())
