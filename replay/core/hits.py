"""The hit rules, in one place: ``L_τ`` from a request's walk, then blocks and minimum prefix.

A walk's steps (``replay.core.trie``) are (gap, depth) pairs, gap-ascending with
depth ascending; for a TTL τ

    L_τ = depth of the last step with gap ≤ τ    (0 when there is none)
    hit = floor(L_τ / B) · B,  then 0 if that is < m     (semantics.md)

Gaps and TTLs are integer microseconds (``replay.core.times``), so a gap of
exactly τ is a hit. Every consumer of walks — the sweep, the walk profiles, the
diagnosis, the simulators that replay through a trie — reads ``L_τ`` through
this module: :func:`depths_under` and :func:`hit_counts`, compiled
(``_hits.pyx``) where built, else the numpy versions here (also with
``REPLAY_PURE_SWEEP=1``). Steps are passed flat: request ``r``'s steps are
``gaps[offsets[r]:offsets[r + 1]]`` and the depths beside them.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

try:  # the same kernel compiled (replay/core/_hits.pyx), where it is built
    from replay.core import _hits as _compiled
except ImportError:  # pragma: no cover - an install without a compiler
    _compiled = None
if os.environ.get("REPLAY_PURE_SWEEP"):
    _compiled = None

COMPILED = _compiled is not None


def depth_under(gaps: Sequence[int], depths: Sequence[int], ttl_us: int) -> int:
    """``L_τ`` of one request from its steps (a scalar; the arrays below are the same rule)."""
    best = 0
    for g, d in zip(gaps, depths):
        if g > ttl_us:
            break
        best = d
    return int(best)


def block_hit(L, block: int, min_prefix: int):
    """The hit of a common prefix of ``L`` tokens (an int or an int64 array):
    whole blocks only, nothing below the minimum prefix."""
    floored = (L // block) * block
    return np.where(floored < min_prefix, 0, floored) if isinstance(floored, np.ndarray) else (
        0 if floored < min_prefix else floored)


def steps_within(offsets: np.ndarray, gaps: np.ndarray, ttl_us: int) -> np.ndarray:
    """How many of each request's steps have gap ≤ τ (its steps are gap-ascending)."""
    n = len(offsets) - 1
    row = np.repeat(np.arange(n), np.diff(offsets))
    return np.bincount(row[gaps <= ttl_us], minlength=n)


def first_gap_beyond(offsets: np.ndarray, gaps: np.ndarray, ttl_us: int) -> np.ndarray:
    """Each request's first gap beyond τ — the idle gap that made the rest of its
    prefix go cold — or -1 where every step is within τ."""
    offsets, gaps = np.asarray(offsets, dtype=np.int64), np.asarray(gaps, dtype=np.int64)
    within = steps_within(offsets, gaps, ttl_us)
    has = within < np.diff(offsets)
    out = np.full(len(offsets) - 1, -1, dtype=np.int64)
    out[has] = gaps[(offsets[:-1] + within)[has]]
    return out


def depths_under(offsets: np.ndarray, gaps: np.ndarray, depths: np.ndarray,
                 ttls_us: Sequence[int]) -> np.ndarray:
    """``L_τ`` of every request for every TTL, as int64 [request, TTL]."""
    offsets, gaps, depths = _flat(offsets, gaps, depths)
    ttls = np.asarray(ttls_us, dtype=np.int64)
    if _compiled is not None:
        return _compiled.depths_under(offsets, gaps, depths, ttls)
    return depths_under_numpy(offsets, gaps, depths, ttls)


def depths_under_numpy(offsets, gaps, depths, ttls) -> np.ndarray:
    n = len(offsets) - 1
    out = np.zeros((n, len(ttls)), dtype=np.int64)
    for ti, ttl in enumerate(ttls):
        cnt = steps_within(offsets, gaps, int(ttl))
        has = cnt > 0
        out[has, ti] = depths[(offsets[:-1] + cnt - 1)[has]]
    return out


def hit_counts(offsets, gaps, depths, group: np.ndarray, n_groups: int, ttls_us, blocks,
               mins) -> tuple[np.ndarray, np.ndarray]:
    """Hit tokens and requests hit per group of requests and configuration, as two
    int64 arrays indexed [group, TTL, minimum prefix, block]."""
    offsets, gaps, depths = _flat(offsets, gaps, depths)
    group = np.ascontiguousarray(group, dtype=np.int64)
    ttls = np.asarray(ttls_us, dtype=np.int64)
    blocks = np.asarray(blocks, dtype=np.int64)
    mins = np.asarray(mins, dtype=np.int64)
    if _compiled is not None:
        return _compiled.hit_counts(offsets, gaps, depths, group, n_groups, ttls, blocks, mins)
    return hit_counts_numpy(offsets, gaps, depths, group, n_groups, ttls, blocks, mins)


def hit_counts_numpy(offsets, gaps, depths, group, n_groups: int, ttls, blocks,
                     mins) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hit_counts` with array operations (where the compiled one is not built)."""
    shape = (n_groups, len(ttls), len(mins), len(blocks))
    hits, nhit = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    if np.any(blocks <= 0):
        raise ValueError("block sizes must be positive")
    # requests ordered by group, so that a group's sums are one np.add.reduceat
    # over a contiguous run (exact in int64)
    order = np.argsort(group, kind="stable")
    sizes = np.bincount(group, minlength=n_groups)
    present = np.flatnonzero(sizes)
    bounds = (np.cumsum(sizes) - sizes)[present]
    L_all = depths_under_numpy(offsets, gaps, depths, ttls)[order]
    for ti in range(len(ttls)):
        floored = (L_all[None, :, ti] // blocks[:, None]) * blocks[:, None]  # every block size at once
        for mi, m in enumerate(mins):
            hm = np.where(floored < m, 0, floored) if m > 0 else floored
            if len(present):
                hits[present, ti, mi] = np.add.reduceat(hm, bounds, axis=1).T
                nhit[present, ti, mi] = np.add.reduceat((hm > 0).astype(np.int64), bounds, axis=1).T
    return hits, nhit


def _flat(offsets, gaps, depths):
    return (np.ascontiguousarray(offsets, dtype=np.int64), np.ascontiguousarray(gaps, dtype=np.int64),
            np.ascontiguousarray(depths, dtype=np.int64))
