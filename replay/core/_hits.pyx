# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The hit kernel of :mod:`replay.core.hits` (its contract is written there): one
pass over the walks, the hit tokens by origin in the same pass when asked.

A request's steps are stored gap non-decreasing with depth ascending, so ``L_τ`` is
the depth of its last step with gap ≤ τ (:func:`_within`); everything here reads
it that way, and the tests check it against the definition written out request
by request.
"""

import numpy as np

from libc.stdint cimport int64_t


cdef inline Py_ssize_t _within(const int64_t[::1] gaps, Py_ssize_t start, Py_ssize_t end,
                               int64_t ttl) noexcept nogil:
    """The end of the request's steps ``[start, end)`` with gap ≤ τ: ``L_τ`` is the
    depth of the step before it (0 when it is ``start``)."""
    cdef Py_ssize_t j = start
    while j < end and gaps[j] <= ttl:
        j += 1
    return j


def depths_under(const int64_t[::1] offsets, const int64_t[::1] gaps, const int64_t[::1] depths,
                 const int64_t[::1] ttls):
    """``L_τ`` for every request and TTL: int64 [request, TTL]."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, n_t = ttls.shape[0], r, ti, last
    out_arr = np.zeros((n, n_t), dtype=np.int64)
    cdef int64_t[:, ::1] out = out_arr
    with nogil:
        for r in range(n):
            for ti in range(n_t):
                last = _within(gaps, offsets[r], offsets[r + 1], ttls[ti])
                if last > offsets[r]:
                    out[r, ti] = depths[last - 1]
    return out_arr


def hit_counts(const int64_t[::1] offsets, const int64_t[::1] gaps, const int64_t[::1] depths,
               const signed char[::1] origins, const int64_t[::1] group, Py_ssize_t n_groups,
               const int64_t[::1] ttls, const int64_t[::1] blocks, const int64_t[::1] mins):
    """Hit tokens and requests hit as two int64 arrays [group, TTL, minimum prefix, block]:
    ``L_τ`` floored to whole blocks, counted for each minimum prefix it reaches.

    Given ``origins`` (one code per step; None: not counted), a third array in the
    same pass, the hit tokens by origin, int64 [group, TTL, minimum prefix, block,
    origin]: step ``k`` of a request covers the depths ``(depth[k−1], depth[k]]``
    and carries ``origins[k]``; a hit of ``h`` tokens counts each step's part at
    or below ``h`` to its origin."""
    cdef Py_ssize_t n = offsets.shape[0] - 1
    cdef Py_ssize_t n_t = ttls.shape[0], n_m = mins.shape[0], n_b = blocks.shape[0]
    cdef bint by_origin = origins is not None
    if group.shape[0] != n:
        raise ValueError("one group per request")
    if by_origin and origins.shape[0] != gaps.shape[0]:
        raise ValueError("one origin per step")
    for b in blocks:
        if b <= 0:
            raise ValueError("block sizes must be positive")
    hits_arr = np.zeros((n_groups, n_t, n_m, n_b), dtype=np.int64)
    nhit_arr = np.zeros((n_groups, n_t, n_m, n_b), dtype=np.int64)
    orig_arr = np.zeros((n_groups if by_origin else 0, n_t, n_m, n_b, 3), dtype=np.int64)
    cdef int64_t[:, :, :, ::1] hits = hits_arr
    cdef int64_t[:, :, :, ::1] nhit = nhit_arr
    cdef int64_t[:, :, :, :, ::1] orig = orig_arr
    cdef Py_ssize_t r, ti, mi, bi, g, j, start, end, last
    cdef int64_t L, f, blk, prev, d, a0 = 0, a1 = 0, a2 = 0, part
    cdef signed char o
    with nogil:
        for r in range(n):
            g = group[r]
            if g < 0 or g >= n_groups:
                with gil:
                    raise ValueError(f"group {g} out of range")
            start = offsets[r]
            end = offsets[r + 1]
            if by_origin:
                for j in range(start, end):
                    if origins[j] < 0 or origins[j] > 2:
                        with gil:
                            raise ValueError(f"origin code {origins[j]} out of range")
            for ti in range(n_t):
                last = _within(gaps, start, end, ttls[ti])
                if last == start or depths[last - 1] <= 0:
                    continue
                L = depths[last - 1]
                for bi in range(n_b):
                    blk = blocks[bi]
                    f = (L // blk) * blk
                    if f <= 0:
                        continue
                    if by_origin:  # f's tokens by the origin of the steps they lie in
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
                            if by_origin:
                                orig[g, ti, mi, bi, 0] += a0
                                orig[g, ti, mi, bi, 1] += a1
                                orig[g, ti, mi, bi, 2] += a2
    if by_origin:
        return hits_arr, nhit_arr, orig_arr
    return hits_arr, nhit_arr
