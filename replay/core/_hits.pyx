# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The sweep's counts in one compiled pass over the stored walks (``sweep.hit_counts``).

For each request and TTL, ``L_τ`` is the depth of its last step with gap ≤ τ
(steps are stored gap-ascending, depth ascending); for each block size the hit
is ``L_τ`` floored to whole blocks, and it counts for each minimum prefix it
reaches (semantics.md, "Blocks and minimum prefix"). One pass over the steps
and the grid, no temporaries: the array version (``sweep.hit_counts_numpy``)
makes a (block × request) array per TTL and minimum prefix, and at a day of
traffic the calls alone cost more than this whole loop.
"""

import numpy as np

from libc.stdint cimport int64_t


def hit_counts(const int64_t[::1] offsets, const double[::1] gaps, const int64_t[::1] depths,
               const int64_t[::1] group, Py_ssize_t n_groups,
               const double[::1] ttls, const int64_t[::1] blocks, const int64_t[::1] mins):
    """Hit tokens and requests hit as two int64 arrays [group, TTL, minimum prefix, block]."""
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
    cdef Py_ssize_t r, j, start, end, ti, mi, bi, g
    cdef int64_t L, f, blk
    cdef double ttl
    with nogil:
        for r in range(n):
            g = group[r]
            if g < 0 or g >= n_groups:
                with gil:
                    raise ValueError(f"group {g} out of range")
            start, end = offsets[r], offsets[r + 1]
            for ti in range(n_t):
                ttl = ttls[ti]
                L = 0
                j = start
                while j < end and gaps[j] <= ttl:
                    L = depths[j]
                    j += 1
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
