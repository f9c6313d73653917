"""The brute-force reference: semantics.md read as literally as possible.

Quadratic and slow on purpose — every fast engine (trie, sweep, profiles) is
tested against this on generated logs. Times are integer microseconds, TTLs
too (``replay.core.times.ttl_us``); a request's cache is its stream under the
mode *and* its model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from replay.core.times import INF_US, ttl_us


@dataclass
class OracleRequest:
    ts: int                      # microseconds
    tokens: Sequence[int]
    tenant: str = "default"
    key: str | None = None
    session: str | None = None
    output: Sequence[int] = field(default_factory=list)
    model: str | None = None


def stream_of(r: OracleRequest, mode: str) -> str:
    """The stream key of a request (semantics.md, "Streams")."""
    if mode == "tenant":
        return f"tenant:{r.tenant}"
    if mode == "key":
        return f"key:{r.key}" if r.key is not None else f"tenant:{r.tenant}"
    if mode == "session":
        return f"session:{r.session}" if r.session is not None else f"tenant:{r.tenant}"
    if mode == "global":
        return "global"
    raise ValueError(f"unknown stream mode {mode!r}")


def cache_of(r: OracleRequest, mode: str) -> tuple[str, str | None]:
    """The cache a request can hit: its stream, split by model."""
    return stream_of(r, mode), r.model


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def time_order(requests: Sequence[OracleRequest]) -> list[int]:
    """Indices in processing order: by time, ties in input order (stable)."""
    return sorted(range(len(requests)), key=lambda i: requests[i].ts)


def ceiling(requests: Sequence[OracleRequest], mode: str, ttl: int = INF_US,
            with_output: bool = False) -> list[int]:
    """L_τ(r) for every request, in input order (``ttl`` in µs)."""
    order = time_order(requests)
    out = [0] * len(requests)
    for pos, i in enumerate(order):
        r = requests[i]
        c = cache_of(r, mode)
        best = 0
        for j in order[:pos]:
            e = requests[j]
            if cache_of(e, mode) != c or r.ts - e.ts > ttl:
                continue
            cached = list(e.tokens) + list(e.output) if with_output else e.tokens
            best = max(best, lcp(r.tokens, cached))
        out[i] = best
    return out


def block_hit(L: int, block: int, min_prefix: int) -> int:
    h = (L // block) * block
    return 0 if h < min_prefix else h


def sweep(requests: Sequence[OracleRequest], modes=("tenant", "key", "global"),
          ttls=(300, 1800, 3600, math.inf), blocks=(1, 16, 512),
          min_prefixes=(0, 1024)) -> list[dict]:
    """The sweep's aggregate rows (``ttls`` in seconds, as the grid takes them)."""
    rows = []
    prompt_tokens = sum(len(r.tokens) for r in requests)
    for mode in modes:
        for ttl in ttls:
            L = ceiling(requests, mode, ttl_us(ttl))
            for b in blocks:
                for m in min_prefixes:
                    hits = [block_hit(x, b, m) for x in L]
                    hit_tokens = sum(hits)
                    rows.append({
                        "stream": mode,
                        "ttl_s": None if ttl == math.inf else float(ttl),
                        "block": b, "min_prefix": m,
                        "requests": len(requests),
                        "prompt_tokens": prompt_tokens,
                        "hit_tokens": hit_tokens,
                        "hit_ratio": hit_tokens / prompt_tokens if prompt_tokens else 0.0,
                        "requests_hit": sum(1 for h in hits if h > 0),
                    })
    return rows
