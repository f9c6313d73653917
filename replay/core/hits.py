"""The hit rules, in one place: ``L_τ`` from a request's walk, then blocks and minimum prefix.

A walk's steps (``replay.core.trie``) are (gap, depth) pairs, gap non-decreasing
with depth ascending (two steps share a gap where the prefix's origin changes
between them, ``replay.core.replay``); for a TTL τ

    L_τ = depth of the last step with gap ≤ τ    (0 when there is none)
    hit = floor(L_τ / B) · B,  then 0 if that is < m     (semantics.md)

Gaps and TTLs are integer microseconds (``replay.times``), so a gap of
exactly τ is a hit. Every consumer of walks — the sweep, the walk profiles, the
diagnosis, the simulators that replay through a trie — reads ``L_τ`` through
this module: :func:`depths_under` and :func:`hit_counts`, compiled
(``_hits.pyx``: the one implementation, tested against the definition written
out request by request). Steps are passed flat: request ``r``'s steps are
``gaps[offsets[r]:offsets[r + 1]]`` and the depths beside them.

Hit origin (docs/origin.md): step ``k`` of a request covers the depths
``(depth[k−1], depth[k]]`` (from 0 for the first) and carries the origin code of
who last wrote them (``replay.core.streams.ORIGINS``). A hit of ``h`` tokens
counts, for each step, the part of that span at or below ``h`` to the step's
origin, so the origins of a request add up to its hit exactly.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from replay.core import _hits


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
    return _hits.depths_under(offsets, gaps, depths, ttls)


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
    return _hits.hit_counts(offsets, gaps, depths, origins, group, n_groups, ttls, blocks, mins)


def _flat(offsets, gaps, depths):
    return (np.ascontiguousarray(offsets, dtype=np.int64), np.ascontiguousarray(gaps, dtype=np.int64),
            np.ascontiguousarray(depths, dtype=np.int64))
