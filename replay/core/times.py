"""Kept only so code written against the old path still imports: time lives in
:mod:`replay.times` (the package's lowest layer, which readers and core both
use). New code imports ``replay.times``."""

from replay.times import INF_US, UNIT_US, US_PER_S, format_ttl, parse_ttl, seconds, to_us, ttl_us  # noqa: F401
