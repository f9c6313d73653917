"""The provider simulators' pure cores: OpenAI's rounding and overflow routing,
Anthropic's breakpoints, lookback and TTLs (mlx-lm's cache is
``replay.providers.mlx_cache``). Requests come in processing order; times are
integer microseconds (``replay.times``). ``replay.providers.profiles``
feeds them from the database; the tests hold each against a brute-force
reading of the same rules.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from replay.times import US_PER_S
from replay.text.render import render_layout

OPENAI_WINDOW_US = 60 * US_PER_S  # the overflow rule counts requests per minute
ANTHROPIC_5M_US, ANTHROPIC_1H_US = 300 * US_PER_S, 3600 * US_PER_S


# ----------------------------------------------------------------------------- OpenAI

def openai_round(L: int, min_tokens: int = 1024, step: int = 128) -> int:
    """OpenAI's cached tokens for a common prefix of ``L`` tokens."""
    return 0 if L < min_tokens else min_tokens + ((L - min_tokens) // step) * step


def openai_machines(reqs: Sequence[tuple[int, str, tuple]], rpm: int, replicas: int) -> list[int]:
    """Machine index per request (processing order) under the overflow rule.

    ``reqs[i] = (ts_us, partition, route)`` with ``route`` the first ``route_tokens``
    tokens. Requests of the same partition + route are counted over a trailing
    60-second window (``t − 60 s < t' ≤ t``, earlier requests only): the ``k``-th
    one (0-based) in the window goes to machine ``(k // rpm) % replicas`` —
    the first ``rpm`` a minute stay on the home machine, the next ``rpm`` spill
    to the next one, and so on.
    """
    windows: dict[tuple, deque] = {}
    out = []
    for ts, part, route in reqs:
        q = windows.setdefault((part, route), deque())
        while q and q[0] <= ts - OPENAI_WINDOW_US:
            q.popleft()
        out.append((len(q) // rpm) % replicas)
        q.append(ts)
    return out



# ----------------------------------------------------------------------------- Anthropic

@dataclass
class AnthropicRequest:
    """What the Anthropic simulator needs of one request.

    ``breakpoints``: ``(token position, ttl µs)`` — the prefix ``tokens[:pos]``
    is what the breakpoint caches; ``boundaries``: token positions where content
    blocks end (sorted), for the lookback. ``stream`` is the cache: the stream
    key and the model together.
    """
    ts: int
    stream: str
    tokens: np.ndarray
    breakpoints: list[tuple[int, int]]
    boundaries: Sequence[int]


def anthropic_candidates(bp_pos: int, boundaries: Sequence[int], lookback: int) -> list[int]:
    """Positions checked for a hit for the breakpoint at ``bp_pos``: itself and the
    ``lookback`` block boundaries before it."""
    before = [b for b in boundaries if b < bp_pos]
    return [bp_pos] + before[-lookback:] if lookback > 0 else [bp_pos]


def simulate_anthropic(reqs: Sequence[AnthropicRequest], min_tokens: int, lookback: int = 20,
                       max_breakpoints: int = 4) -> list[tuple[int, int, int]]:
    """(read, write_5m, write_1h) tokens per request, requests in processing order.

    Rules (our reading of Anthropic's docs; the brute force in the tests reads
    them literally):

    1. Only the first ``max_breakpoints`` breakpoints count; a breakpoint whose
       prefix is shorter than ``min_tokens`` caches nothing.
    2. Lookup: for each breakpoint, its own position and the ``lookback`` block
       boundaries before it are candidate prefixes; the read is the longest
       candidate (≥ ``min_tokens``) whose prefix is in the stream's cache and
       alive (``t − last_refresh ≤ its ttl``). It is refreshed (ttl from now).
    3. After the request, every eligible breakpoint's prefix is in the cache with
       its own ttl from now (created or refreshed).
    4. Writes: the tokens between the read and each eligible breakpoint beyond
       it, in ascending order, each span billed at the ttl of the breakpoint
       that ends it (Anthropic's ``cache_creation_input_tokens``, split by ttl).
    """
    caches: dict[str, dict[tuple[int, bytes], list[int]]] = {}
    out = []
    for r in reqs:
        cache = caches.setdefault(r.stream, {})
        toks = np.asarray(r.tokens)
        n = len(toks)
        bps = [(int(p), int(ttl)) for p, ttl in r.breakpoints[:max_breakpoints] if 0 < int(p) <= n]
        by_pos: dict[int, int] = {}
        for p, ttl in bps:
            if p >= min_tokens:
                by_pos[p] = max(ttl, by_pos.get(p, 0))  # two breakpoints on one prefix: the longer ttl
        elig = sorted(by_pos.items())
        cand = set()
        for p, _ in bps:
            cand.update(c for c in anthropic_candidates(p, r.boundaries, lookback) if c >= min_tokens and c <= n)
        positions = sorted(cand | {p for p, _ in elig})
        keys = _prefix_keys(toks, positions)
        read = 0
        for c in sorted(cand, reverse=True):
            e = cache.get(keys[c])
            if e is not None and r.ts - e[0] <= e[1]:
                read = c
                e[0] = r.ts
                break
        w5 = w1 = 0
        prev = read
        for p, ttl in elig:
            if p > prev:
                span = p - prev
                if ttl > ANTHROPIC_5M_US:
                    w1 += span
                else:
                    w5 += span
                prev = p
            e = cache.get(keys[p])
            if e is None or r.ts - e[0] > e[1]:
                cache[keys[p]] = [r.ts, ttl]
            else:
                e[0] = r.ts
                e[1] = max(e[1], ttl)
        out.append((read, w5, w1))
    return out


def _prefix_keys(toks: np.ndarray, positions: Sequence[int]) -> dict[int, tuple[int, bytes]]:
    """(position, blake2b of tokens[:position]) for each position, in one pass."""
    h = hashlib.blake2b(digest_size=16)
    buf = np.ascontiguousarray(toks, dtype=np.int64)
    keys, done = {}, 0
    for p in sorted(positions):
        h.update(buf[done:p].tobytes())
        done = p
        keys[p] = (p, h.copy().digest())
    return keys


def _ttl_of(cc, default: int) -> int:
    """The TTL (µs) a ``cache_control`` object asks for."""
    if isinstance(cc, dict) and str(cc.get("ttl", "")).lower() in ("1h", "3600", "3600s", "60m"):
        return ANTHROPIC_1H_US
    if isinstance(cc, dict) and str(cc.get("ttl", "")).lower() in ("5m", "300", "300s"):
        return ANTHROPIC_5M_US
    return default


def anthropic_layout(body: dict | None, seg_tokens: Sequence[int], fmt: str, default_ttl: int,
                     auto: bool) -> tuple[list[tuple[int, int]], list[int]]:
    """Breakpoints ``(pos, ttl)`` and content-block boundaries (token positions) of
    a request whose rendered pieces have ``seg_tokens`` tokens each.

    Block boundaries are the ends of the non-marker pieces (a tool definition, a
    system block, a content block, a tool call). The automatic breakpoint
    (top-level ``cache_control``, or ``auto`` for requests with no breakpoint at
    all) sits at the end of the last content block.
    """
    cum = np.cumsum(np.asarray(seg_tokens, dtype=np.int64)) if len(seg_tokens) else np.zeros(0, np.int64)
    n = int(cum[-1]) if len(cum) else 0
    if body is None:  # tokens format: the whole prompt is one block
        return ([(n, default_ttl)] if auto and n else []), ([n] if n else [])
    pieces, breaks = render_layout(body, fmt)
    if len(pieces) != len(cum):  # rendering drifted from the tokenized one: treat as one block
        return ([(n, default_ttl)] if auto and n else []), ([n] if n else [])
    bounds = [int(cum[i]) for i, pc in enumerate(pieces) if pc[0] != "marker"]
    # the ttl of each explicit breakpoint: re-walk the body for cache_control objects in render order
    ccs = _cache_controls(body)
    bps = []
    for k, i in enumerate(breaks):
        ttl = _ttl_of(ccs[k], default_ttl) if k < len(ccs) else default_ttl
        bps.append((int(cum[i]), ttl))
    top = body.get("cache_control") if isinstance(body, dict) else None
    if (top is not None or (auto and not bps)) and bounds:
        bps.append((bounds[-1], _ttl_of(top, default_ttl)))
    return bps, bounds


def _cache_controls(body: dict) -> list:
    """The ``cache_control`` objects of a body in rendering order (tools, system, messages)."""
    found: list = []

    def visit(obj):
        if isinstance(obj, list):
            for x in obj:
                visit(x)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if k != "cache_control" and isinstance(v, (list, dict)):
                    visit(v)
            if obj.get("cache_control") is not None:
                found.append(obj["cache_control"])

    for part in ("tools", "system", "instructions", "messages", "input"):
        if part in body:
            visit(body[part])
    return found
