"""The sweep's grid: TTL × block size × minimum prefix × stream mode."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replay.core.streams import check_modes
from replay.times import INF_US, ttl_us
from replay.core.warmup import parse_warmup

DEFAULT_TTLS = (300.0, 1800.0, 3600.0, math.inf)
DEFAULT_BLOCKS = (1, 16, 512)
DEFAULT_MIN_PREFIXES = (0, 1024)
DEFAULT_STREAMS = ("tenant", "key", "global")


@dataclass
class Grid:
    """TTLs in seconds (``math.inf`` for none), block sizes and minimum prefixes in
    tokens, stream modes by name."""
    ttls: tuple[float, ...] = DEFAULT_TTLS
    blocks: tuple[int, ...] = DEFAULT_BLOCKS
    min_prefixes: tuple[int, ...] = DEFAULT_MIN_PREFIXES
    streams: tuple[str, ...] = DEFAULT_STREAMS
    warmup: float = 0.0  # share of the log (by time) replayed but not measured (replay.core.warmup)

    def __post_init__(self):
        self.ttls = tuple(float(t) for t in self.ttls)
        self.blocks = tuple(int(b) for b in self.blocks)
        self.min_prefixes = tuple(int(m) for m in self.min_prefixes)
        self.streams = check_modes(self.streams)
        if any(b < 1 for b in self.blocks):
            raise ValueError("block sizes must be ≥ 1")
        if any(m < 0 for m in self.min_prefixes):
            raise ValueError("minimum prefixes must be ≥ 0")
        for t in self.ttls:
            ttl_us(t)  # raises on a negative or NaN TTL
        self.warmup = parse_warmup(self.warmup)

    @property
    def size(self) -> int:
        return len(self.ttls) * len(self.blocks) * len(self.min_prefixes) * len(self.streams)

    @property
    def horizon_us(self) -> int:
        """The replay horizon the grid needs: its largest TTL (∞ when it has none)."""
        return max((ttl_us(t) for t in self.ttls), default=INF_US)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(TTLs in µs, block sizes, minimum prefixes) as int64 arrays."""
        return (np.array([ttl_us(t) for t in self.ttls], dtype=np.int64),
                np.asarray(self.blocks, dtype=np.int64), np.asarray(self.min_prefixes, dtype=np.int64))
