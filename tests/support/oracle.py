"""The brute-force reference: semantics.md read as literally as possible.

Quadratic and slow on purpose — every fast engine (trie, sweep, profiles) is
tested against this on generated logs. Times are integer microseconds, TTLs
too (``replay.times.ttl_us``); a request's cache is its stream under the
mode *and* its model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from replay.times import INF_US, ttl_us


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


def measured(requests: Sequence[OracleRequest], warmup: float = 0) -> list[int]:
    """Indices of the measured requests with a warm-up share ``warmup``: all but the
    first floor(warmup · n) in processing order (the replay still sees them all)."""
    from fractions import Fraction

    order = time_order(requests)
    return sorted(order[math.floor(Fraction(str(warmup)) * len(order)):])


ORIGINS = ("same_session", "other_session", "other_tenant")  # replay.core.streams.ORIGINS


def origin_of(r: OracleRequest, writer: OracleRequest) -> str:
    """docs/origin.md: the same non-missing session id, else the same tenant, else another tenant."""
    if r.session is not None and writer.session == r.session:
        return "same_session"
    return "other_session" if writer.tenant == r.tenant else "other_tenant"


def writers(requests: Sequence[OracleRequest], mode: str, with_output: bool = False) -> list[list[tuple[int, int]]]:
    """Per request (input order), who last wrote each depth of its prefix: runs
    (end depth, writer's index), ascending, up to its longest common prefix with
    any earlier request of its cache. Depth d (1 ≤ d) is written by the most
    recent earlier request (processing order) of the same cache whose common
    prefix with it is ≥ d (docs/origin.md; no TTL: the writer of a hit token is
    necessarily within the TTL)."""
    order = time_order(requests)
    out: list[list[tuple[int, int]]] = [[] for _ in requests]
    for pos, i in enumerate(order):
        r = requests[i]
        c = cache_of(r, mode)
        covered = 0  # depths up to here have their writer (a more recent request)
        for j in reversed(order[:pos]):
            e = requests[j]
            if cache_of(e, mode) != c:
                continue
            k = lcp(r.tokens, list(e.tokens) + list(e.output) if with_output else e.tokens)
            if k > covered:
                out[i].append((k, j))
                covered = k
    return out


def hit_origins(requests: Sequence[OracleRequest], runs: list[list[tuple[int, int]]], i: int,
                hit: int) -> dict[str, int]:
    """The ``hit`` tokens of request ``i`` by origin, from :func:`writers`' runs."""
    got = dict.fromkeys(ORIGINS, 0)
    start = 0
    for end, j in runs[i]:
        if start >= hit:
            break
        got[origin_of(requests[i], requests[j])] += min(end, hit) - start
        start = end
    return got


def sweep(requests: Sequence[OracleRequest], modes=("tenant", "key", "global"),
          ttls=(300, 1800, 3600, math.inf), blocks=(1, 16, 512),
          min_prefixes=(0, 1024), warmup: float = 0) -> list[dict]:
    """The sweep's aggregate rows (``ttls`` in seconds, as the grid takes them), with
    the hit tokens by origin (:func:`writers`); with ``warmup``, over the measured
    requests only (:func:`measured`)."""
    rows = []
    keep = measured(requests, warmup)
    prompt_tokens = sum(len(requests[i].tokens) for i in keep)
    for mode in modes:
        runs = writers(requests, mode)
        for ttl in ttls:
            L_all = ceiling(requests, mode, ttl_us(ttl))
            L = [L_all[i] for i in keep]
            for b in blocks:
                for m in min_prefixes:
                    hits = [block_hit(x, b, m) for x in L]
                    hit_tokens = sum(hits)
                    by_origin = dict.fromkeys(ORIGINS, 0)
                    for i, h in zip(keep, hits):
                        for o, n in hit_origins(requests, runs, i, h).items():
                            by_origin[o] += n
                    rows.append({
                        "stream": mode,
                        "ttl_s": None if ttl == math.inf else float(ttl),
                        "block": b, "min_prefix": m,
                        "requests": len(keep),
                        "prompt_tokens": prompt_tokens,
                        "hit_tokens": hit_tokens,
                        "hit_ratio": hit_tokens / prompt_tokens if prompt_tokens else 0.0,
                        "requests_hit": sum(1 for h in hits if h > 0),
                        **{f"hit_{o}": n for o, n in by_origin.items()},
                    })
    return rows


def capacity_hits(requests: Sequence[OracleRequest], mode: str, block: int, capacity: int,
                  ttl: int = INF_US, replica_of: Sequence[int] | None = None) -> list[int]:
    """The capacity contract simulated as written (semantics.md, "Capacity"):
    each replica's pool an LRU of at most ``capacity`` whole blocks, a block's
    identity its cache (stream and model) and its whole token prefix. For each
    request in processing order: the hit is the run of its leading blocks that
    are resident and last used within ``ttl`` (µs); then its blocks are touched
    deepest first; then least recently used blocks are evicted down to the
    capacity. ``replica_of[i]``: the replica of request i (input order; default
    one replica). Returns each request's hit in tokens, input order."""
    from collections import OrderedDict

    order = time_order(requests)
    pools: dict[int, OrderedDict] = {}
    last_used: dict[int, dict] = {}
    out = [0] * len(requests)
    for i in order:
        r = requests[i]
        rep = 0 if replica_of is None else replica_of[i]
        pool = pools.setdefault(rep, OrderedDict())
        used = last_used.setdefault(rep, {})
        ids = [(cache_of(r, mode), tuple(r.tokens[:(k + 1) * block])) for k in range(len(r.tokens) // block)]
        hit = 0
        for b in ids:
            if b in pool and r.ts - used[b] <= ttl:
                hit += 1
            else:
                break
        out[i] = hit * block
        for b in reversed(ids):  # deepest first: a parent is never less recent than its child
            pool[b] = True
            pool.move_to_end(b)
            used[b] = r.ts
        while len(pool) > capacity:
            pool.popitem(last=False)
    return out


def capacity_hits_by_rule(requests: Sequence[OracleRequest], mode: str, block: int, capacity: int,
                          ttl: int = INF_US, replicas: int = 1, replica_of: Sequence[int] | None = None,
                          routing: str = "fixed", policy: str = "lru") -> tuple[list[int], list[int]]:
    """The capacity contract with the two rules that are simulated per capacity,
    read literally. ``routing="prefix"``: each request goes to the replica where
    its hit (leading resident blocks last used within ``ttl``) would be longest,
    ties to the replica that has served the fewest requests so far, then the
    lowest index; otherwise ``replica_of`` (input order) says. ``policy="belady"``
    (with ``replica_of`` only: the future must be known): after a request's
    touches, while more than ``capacity`` blocks are resident, evict the one
    whose next touch (by a later request on the same replica) is farthest away
    — never again counts as farthest — ties to the deepest block, then the least
    recently used; ``"lru"``: the least recently used.
    Returns (each request's hit in tokens, its replica), input order."""
    order = time_order(requests)
    ids = {i: [(cache_of(requests[i], mode), tuple(requests[i].tokens[:(k + 1) * block]))
               for k in range(len(requests[i].tokens) // block)] for i in order}
    pools: list[dict] = [dict() for _ in range(replicas)]  # block -> (last touch (position, -depth), time, depth)
    served = [0] * replicas
    where = [0] * len(requests)
    out = [0] * len(requests)

    def hit(pool, i) -> int:
        k = 0
        for b in ids[i]:
            if b not in pool or requests[i].ts - pool[b][1] > ttl:
                break
            k += 1
        return k

    def next_touch(b, pos, rep):
        for p in range(pos + 1, len(order)):
            j = order[p]
            if replica_of[j] == rep and b in ids[j]:
                return p
        return math.inf

    for pos, i in enumerate(order):
        if routing == "prefix":
            rep = max(range(replicas), key=lambda q: (hit(pools[q], i), -served[q], -q))
        else:
            rep = 0 if replica_of is None else replica_of[i]
        where[i] = rep
        served[rep] += 1
        pool = pools[rep]
        out[i] = hit(pool, i) * block
        for d, b in reversed(list(enumerate(ids[i]))):  # deepest first
            pool[b] = ((pos, -d), requests[i].ts, d)
        while len(pool) > capacity:
            if policy == "belady":
                victim = max(pool, key=lambda b: (next_touch(b, pos, rep), pool[b][2],
                                                  -pool[b][0][0], -pool[b][0][1]))
            else:
                victim = min(pool, key=lambda b: pool[b][0])
            del pool[victim]
    return out, where
