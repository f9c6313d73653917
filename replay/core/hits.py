"""The hit rules, in one place: ``L_τ`` from a request's walk, then blocks and minimum prefix.

A walk's steps (``replay.core.trie``) are (gap, depth) pairs, gap non-decreasing
with depth ascending (two steps share a gap where the prefix's origin changes
between them, ``replay.core.replay``); for a TTL τ

    L_τ = depth of the last step with gap ≤ τ    (0 when there is none)
    hit = floor(L_τ / B) · B,  then 0 if that is < m     (semantics.md)

Gaps and TTLs are integer microseconds (``replay.core.times``), so a gap of
exactly τ is a hit. Every consumer of walks — the sweep, the walk profiles, the
diagnosis, the simulators that replay through a trie — reads ``L_τ`` through
this module: :func:`depths_under` and :func:`hit_counts`, compiled
(``_hits.pyx``) where built, else the numpy versions here (also with
``REPLAY_PURE_SWEEP=1``). Steps are passed flat: request ``r``'s steps are
``gaps[offsets[r]:offsets[r + 1]]`` and the depths beside them.

Hit origin (docs/origin.md): step ``k`` of a request covers the depths
``(depth[k−1], depth[k]]`` (from 0 for the first) and carries the origin code of
who last wrote them (``replay.core.streams.ORIGINS``). A hit of ``h`` tokens
counts, for each step, the part of that span at or below ``h`` to the step's
origin, so the origins of a request add up to its hit exactly.
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


N_ORIGINS = 3  # len(replay.core.streams.ORIGINS)


def hit_counts(offsets, gaps, depths, group: np.ndarray, n_groups: int, ttls_us, blocks,
               mins, origins=None) -> tuple[np.ndarray, ...]:
    """Hit tokens and requests hit per group of requests and configuration, as two
    int64 arrays indexed [group, TTL, minimum prefix, block]; given the steps'
    ``origins`` also, in the same pass, a third: the hit tokens by origin,
    [group, TTL, minimum prefix, block, origin] (summed over origins: the first)."""
    offsets, gaps, depths = _flat(offsets, gaps, depths)
    group = np.ascontiguousarray(group, dtype=np.int64)
    ttls = np.asarray(ttls_us, dtype=np.int64)
    blocks = np.asarray(blocks, dtype=np.int64)
    mins = np.asarray(mins, dtype=np.int64)
    if origins is not None:
        origins = np.ascontiguousarray(origins, dtype=np.int8)
        if len(origins) != len(gaps):
            raise ValueError("one origin per step")
        if len(origins) and (origins.min() < 0 or origins.max() >= N_ORIGINS):
            raise ValueError("origin codes out of range")
    if _compiled is not None:
        if origins is None:
            return _compiled.hit_counts(offsets, gaps, depths, group, n_groups, ttls, blocks, mins)
        return _compiled.hit_counts_by_origin(offsets, gaps, depths, origins, group, n_groups, ttls, blocks, mins)
    out = hit_counts_numpy(offsets, gaps, depths, group, n_groups, ttls, blocks, mins)
    if origins is None:
        return out
    return (*out, origin_counts_numpy(offsets, gaps, depths, origins, group, n_groups, ttls, blocks, mins))


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


def origin_counts_numpy(offsets, gaps, depths, origins, group, n_groups: int, ttls, blocks,
                        mins) -> np.ndarray:
    """The hit tokens by origin of :func:`hit_counts`, with array operations: each
    step's share of a hit ``h`` is ``max(0, min(depth, h) − previous depth)``."""
    n_o = N_ORIGINS
    out = np.zeros((n_groups, len(ttls), len(mins), len(blocks), n_o), dtype=np.int64)
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(n), lengths)
    prev = np.zeros(len(depths), dtype=np.int64)  # the depth where each step's span starts
    inner = np.ones(len(depths), dtype=bool)
    inner[offsets[:-1][lengths > 0]] = False
    prev[inner] = depths[np.flatnonzero(inner) - 1]
    # steps ordered by (group, origin), so that each one's sum is one np.add.reduceat
    # over a contiguous run (exact in int64)
    slot = group[row] * n_o + origins.astype(np.int64)
    order = np.argsort(slot, kind="stable")
    sizes = np.bincount(slot, minlength=n_groups * n_o)
    present = np.flatnonzero(sizes)
    bounds = (np.cumsum(sizes) - sizes)[present]
    depths_o, prev_o, row_o = depths[order], prev[order], row[order]
    L_all = depths_under_numpy(offsets, gaps, depths, ttls)
    for ti in range(len(ttls)):
        for bi, b in enumerate(blocks):
            floored = (L_all[:, ti] // b) * b
            for mi, m in enumerate(mins):
                h = np.where(floored < m, 0, floored) if m > 0 else floored
                share = np.maximum(np.minimum(depths_o, h[row_o]) - prev_o, 0)
                if len(present):
                    sums = np.zeros(n_groups * n_o, dtype=np.int64)
                    sums[present] = np.add.reduceat(share, bounds)
                    out[:, ti, mi, bi, :] = sums.reshape(n_groups, n_o)
    return out


def _flat(offsets, gaps, depths):
    return (np.ascontiguousarray(offsets, dtype=np.int64), np.ascontiguousarray(gaps, dtype=np.int64),
            np.ascontiguousarray(depths, dtype=np.int64))
