# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The capacity pass of :mod:`replay.core.capacity`, compiled: the same segments
and distances, and the same counts, without a Python object per tree step.

:class:`Recorder` is one replica's pool at one block size (the module's
``PythonRecorder`` says the same in Python, and the tests hold them equal);
:func:`capacity_counts` turns every request's segments into hit counts for a
grid of TTLs and capacities (``replay.core.capacity.hit_blocks`` says it
request by request).
"""

import numpy as np

from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, realloc
from libc.string cimport memset


cdef int _grow(int64_t** buf, Py_ssize_t* cap, Py_ssize_t need, Py_ssize_t width) except -1:
    """Make ``*buf`` hold at least ``need`` rows of ``width`` int64s (new room zeroed)."""
    cdef Py_ssize_t new_cap
    cdef int64_t* p
    if need <= cap[0]:
        return 0
    new_cap = max(need, 2 * cap[0], 1024)
    p = <int64_t*> realloc(buf[0], new_cap * width * sizeof(int64_t))
    if p == NULL:
        raise MemoryError()
    memset(p + cap[0] * width, 0, (new_cap - cap[0]) * width * sizeof(int64_t))
    buf[0] = p
    cap[0] = new_cap
    return 0


cdef class Recorder:
    """One replica's pool at one block size: what each of its requests still owns
    (a Fenwick tree over them), the deepest of each one's blocks touched again
    since, and the segments recorded so far."""
    cdef readonly int64_t block
    cdef public int64_t total        # distinct blocks ever touched (the working set)
    cdef int64_t* tree               # Fenwick tree, 1-based, size = tree_cap (a power of two)
    cdef Py_ssize_t tree_cap
    cdef int64_t* deep               # m_j per request
    cdef Py_ssize_t deep_cap
    cdef Py_ssize_t n                # requests so far
    cdef int64_t* rows               # per segment: gap, distance, first, last
    cdef Py_ssize_t rows_cap, n_rows
    cdef int64_t* counts             # segments per request
    cdef Py_ssize_t counts_cap

    def __cinit__(self, int64_t block):
        self.block = block
        self.tree = self.deep = self.rows = self.counts = NULL
        self.tree_cap = self.deep_cap = self.rows_cap = self.counts_cap = 0
        self.n = self.n_rows = 0
        self.total = 0
        self._tree_room(1024)

    def __dealloc__(self):
        free(self.tree)
        free(self.deep)
        free(self.rows)
        free(self.counts)

    cdef int _tree_room(self, Py_ssize_t need) except -1:
        """Grow the tree to a power of two ≥ need. Of the new entries, those at
        twice, four times… the old size cover everything before them; the rest
        cover only new, zero counts."""
        cdef Py_ssize_t old = self.tree_cap, size = max(old, 1), j
        cdef int64_t everything = self._prefix(old) if old else 0
        cdef int64_t* p
        if need <= old:
            return 0
        while size < need:
            size *= 2
        p = <int64_t*> realloc(self.tree, (size + 1) * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        memset(p + old + 1, 0, (size - old) * sizeof(int64_t))
        if old == 0:
            p[0] = 0
        self.tree = p
        self.tree_cap = size
        j = 2 * old
        while 0 < j <= size:
            self.tree[j] = everything
            j *= 2
        return 0

    cdef inline void _add(self, Py_ssize_t i, int64_t delta) noexcept:
        i += 1
        while i <= self.tree_cap:
            self.tree[i] += delta
            i += i & -i

    cdef inline int64_t _prefix(self, Py_ssize_t i) noexcept:
        """Sum of counts [0, i)."""
        cdef int64_t s = 0
        while i > 0:
            s += self.tree[i]
            i -= i & -i
        return s

    def add(self, list steps, int64_t n_tokens):
        """Record one request (its trie steps (gap, depth, owner), depth in tokens),
        then touch its blocks: it owns them now."""
        cdef int64_t b = self.block, gap, depth, prev = 0, k1, k2, before, retouched = 0
        cdef Py_ssize_t owner, me = self.n, segs = 0
        cdef tuple st
        before = self._prefix(me)
        for st in steps:
            gap, depth, owner = st[0], st[1], st[2]
            k1, k2 = prev // b + 1, depth // b
            prev = depth
            if k2 >= k1:
                _grow(&self.rows, &self.rows_cap, self.n_rows + 1, 4)
                self.rows[4 * self.n_rows] = gap
                self.rows[4 * self.n_rows + 1] = (k1 - 1 - self.deep[owner]) + before - self._prefix(owner + 1)
                self.rows[4 * self.n_rows + 2] = k1
                self.rows[4 * self.n_rows + 3] = k2
                self.n_rows += 1
                segs += 1
        prev = 0
        for st in steps:  # the touches, once every distance is read
            depth, owner = st[1], st[2]
            k1, k2 = prev // b + 1, depth // b
            prev = depth
            if k2 >= k1:
                self._add(owner, -(k2 - k1 + 1))
                if k2 > self.deep[owner]:
                    self.deep[owner] = k2
                retouched += k2 - k1 + 1
        self._tree_room(me + 1)
        _grow(&self.deep, &self.deep_cap, me + 1, 1)
        _grow(&self.counts, &self.counts_cap, me + 1, 1)
        self._add(me, n_tokens // b)
        self.deep[me] = 0
        self.counts[me] = segs
        self.total += n_tokens // b - retouched
        self.n += 1

    def columns(self):
        """(segments per request, gap, distance, first, last) as int64 arrays."""
        rows = np.asarray(<int64_t[:4 * self.n_rows]> self.rows).reshape(-1, 4) if self.n_rows else \
            np.zeros((0, 4), dtype=np.int64)
        count = np.asarray(<int64_t[:self.n]> self.counts).copy() if self.n else np.zeros(0, dtype=np.int64)
        return count, rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy(), rows[:, 3].copy()


def capacity_counts(const int64_t[::1] offsets, const int64_t[::1] gap, const int64_t[::1] dist,
                    const int64_t[::1] first, const int64_t[::1] last, const uint8_t[::1] warm,
                    int64_t block, const int64_t[::1] ttls, const int64_t[::1] caps):
    """Hit tokens, requests hit and hit tokens among the ``warm`` requests, as int64
    [TTL, capacity]: each request's hit is min(blocks under τ, blocks under C)
    blocks (``replay.core.capacity.hit_blocks`` says it request by request)."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, n_t = ttls.shape[0], n_c = caps.shape[0]
    hits_arr = np.zeros((n_t, n_c), dtype=np.int64)
    nhit_arr = np.zeros((n_t, n_c), dtype=np.int64)
    warm_arr = np.zeros((n_t, n_c), dtype=np.int64)
    cdef int64_t[:, ::1] hits = hits_arr
    cdef int64_t[:, ::1] nhit = nhit_arr
    cdef int64_t[:, ::1] whit = warm_arr
    cdef Py_ssize_t r, ti, ci, i
    cdef int64_t k_t, k_c, c, h
    with nogil:
        for r in range(n):
            for ti in range(n_t):
                k_t = 0
                i = offsets[r]
                while i < offsets[r + 1] and gap[i] <= ttls[ti]:
                    k_t = last[i]
                    i += 1
                if k_t == 0:
                    continue
                for ci in range(n_c):
                    c = caps[ci]
                    k_c = 0
                    i = offsets[r]
                    while i < offsets[r + 1]:
                        if dist[i] >= c:
                            break
                        if dist[i] + (last[i] - first[i]) >= c:
                            k_c = first[i] + (c - 1 - dist[i])
                            break
                        k_c = last[i]
                        i += 1
                    h = (k_t if k_t < k_c else k_c) * block
                    if h > 0:
                        hits[ti, ci] += h
                        nhit[ti, ci] += 1
                        if warm[r]:
                            whit[ti, ci] += h
    return hits_arr, nhit_arr, warm_arr
