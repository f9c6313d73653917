# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The hit kernel of :mod:`replay.core.hits`, compiled: one pass over the walks
(with :func:`hit_counts_by_origin`, the hit tokens by origin in the same pass).

A request's steps are stored gap non-decreasing with depth ascending, so ``L_τ`` is
the depth of its last step with gap ≤ τ (:func:`_depth_under`); everything here
reads it that way, and :mod:`replay.core.hits` holds the same in numpy (both
are tested against the definition written out request by request).
"""

import numpy as np

from libc.stdint cimport int64_t


cdef inline int64_t _depth_under(const int64_t[::1] gaps, const int64_t[::1] depths,
                                 Py_ssize_t start, Py_ssize_t end, int64_t ttl) noexcept nogil:
    """L_τ of the request whose steps are ``[start, end)``."""
    cdef int64_t L = 0
    cdef Py_ssize_t j = start
    while j < end and gaps[j] <= ttl:
        L = depths[j]
        j += 1
    return L


def depths_under(const int64_t[::1] offsets, const int64_t[::1] gaps, const int64_t[::1] depths,
                 const int64_t[::1] ttls):
    """``L_τ`` for every request and TTL: int64 [request, TTL]."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, n_t = ttls.shape[0], r, ti
    out_arr = np.zeros((n, n_t), dtype=np.int64)
    cdef int64_t[:, ::1] out = out_arr
    with nogil:
        for r in range(n):
            for ti in range(n_t):
                out[r, ti] = _depth_under(gaps, depths, offsets[r], offsets[r + 1], ttls[ti])
    return out_arr


def hit_counts(const int64_t[::1] offsets, const int64_t[::1] gaps, const int64_t[::1] depths,
               const int64_t[::1] group, Py_ssize_t n_groups,
               const int64_t[::1] ttls, const int64_t[::1] blocks, const int64_t[::1] mins):
    """Hit tokens and requests hit as two int64 arrays [group, TTL, minimum prefix, block]:
    ``L_τ`` floored to whole blocks, counted for each minimum prefix it reaches."""
    cdef Py_ssize_t n = offsets.shape[0] - 1
    cdef Py_ssize_t n_t = ttls.shape[0], n_m = mins.shape[0], n_b = blocks.shape[0]
    if group.shape[0] != n:
        raise ValueError("one group per request")
    for b in blocks:
        if b <= 0:
            raise ValueError("block sizes must be positive")
    hits_arr = np.zeros((n_groups, n_t, n_m, n_b), dtype=np.int64)
    nhit_arr = np.zeros((n_groups, n_t, n_m, n_b), dtype=np.int64)
    cdef int64_t[:, :, :, ::1] hits = hits_arr
    cdef int64_t[:, :, :, ::1] nhit = nhit_arr
    cdef Py_ssize_t r, ti, mi, bi, g
    cdef int64_t L, f, blk
    with nogil:
        for r in range(n):
            g = group[r]
            if g < 0 or g >= n_groups:
                with gil:
                    raise ValueError(f"group {g} out of range")
            for ti in range(n_t):
                L = _depth_under(gaps, depths, offsets[r], offsets[r + 1], ttls[ti])
                if L <= 0:
                    continue
                for bi in range(n_b):
                    blk = blocks[bi]
                    f = (L // blk) * blk
                    if f <= 0:
                        continue
                    for mi in range(n_m):
                        if f >= mins[mi]:
                            hits[g, ti, mi, bi] += f
                            nhit[g, ti, mi, bi] += 1
    return hits_arr, nhit_arr


def hit_counts_by_origin(const int64_t[::1] offsets, const int64_t[::1] gaps, const int64_t[::1] depths,
                         const signed char[::1] origins, const int64_t[::1] group, Py_ssize_t n_groups,
                         const int64_t[::1] ttls, const int64_t[::1] blocks, const int64_t[::1] mins):
    """:func:`hit_counts` and, in the same pass, the hit tokens by origin, int64
    [group, TTL, minimum prefix, block, origin]: step ``k`` of a request covers
    the depths ``(depth[k−1], depth[k]]`` and carries ``origins[k]``; a hit of
    ``h`` tokens counts each step's part at or below ``h`` to its origin."""
    cdef Py_ssize_t n = offsets.shape[0] - 1
    cdef Py_ssize_t n_t = ttls.shape[0], n_m = mins.shape[0], n_b = blocks.shape[0]
    if group.shape[0] != n:
        raise ValueError("one group per request")
    if origins.shape[0] != gaps.shape[0]:
        raise ValueError("one origin per step")
    for b in blocks:
        if b <= 0:
            raise ValueError("block sizes must be positive")
    hits_arr = np.zeros((n_groups, n_t, n_m, n_b), dtype=np.int64)
    nhit_arr = np.zeros((n_groups, n_t, n_m, n_b), dtype=np.int64)
    orig_arr = np.zeros((n_groups, n_t, n_m, n_b, 3), dtype=np.int64)
    cdef int64_t[:, :, :, ::1] hits = hits_arr
    cdef int64_t[:, :, :, ::1] nhit = nhit_arr
    cdef int64_t[:, :, :, :, ::1] orig = orig_arr
    cdef Py_ssize_t r, ti, mi, bi, g, j, start, end, last
    cdef int64_t L, f, blk, prev, d, a0, a1, a2, part
    cdef signed char o
    with nogil:
        for r in range(n):
            g = group[r]
            if g < 0 or g >= n_groups:
                with gil:
                    raise ValueError(f"group {g} out of range")
            start = offsets[r]
            end = offsets[r + 1]
            for j in range(start, end):
                if origins[j] < 0 or origins[j] > 2:
                    with gil:
                        raise ValueError(f"origin code {origins[j]} out of range")
            for ti in range(n_t):
                # L_τ and the last step within τ
                L = 0
                last = start
                while last < end and gaps[last] <= ttls[ti]:
                    L = depths[last]
                    last += 1
                if L <= 0:
                    continue
                for bi in range(n_b):
                    blk = blocks[bi]
                    f = (L // blk) * blk
                    if f <= 0:
                        continue
                    # f's tokens by the origin of the steps they lie in
                    a0 = 0
                    a1 = 0
                    a2 = 0
                    prev = 0
                    j = start
                    while j < last and prev < f:
                        d = depths[j]
                        part = (d if d < f else f) - prev
                        o = origins[j]
                        if o == 0:
                            a0 += part
                        elif o == 1:
                            a1 += part
                        else:
                            a2 += part
                        prev = d
                        j += 1
                    for mi in range(n_m):
                        if f >= mins[mi]:
                            hits[g, ti, mi, bi] += f
                            nhit[g, ti, mi, bi] += 1
                            orig[g, ti, mi, bi, 0] += a0
                            orig[g, ti, mi, bi, 1] += a1
                            orig[g, ti, mi, bi, 2] += a2
    return hits_arr, nhit_arr, orig_arr
