# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The capacity pass of :mod:`replay.core.capacity`, compiled: the same segments
and distances, and the same counts, without a Python object per tree step.

:class:`Recorder` is one replica's pool at one block size (the package's only
implementation: the tests hold it to the contract's brute force in
``tests/support/oracle.py``); :func:`capacity_counts` turns every request's
segments into hit counts for a grid of TTLs and capacities, and
:func:`hit_depths` gives one (TTL, capacity)'s hit request by request.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, realloc
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


cdef inline int64_t _ttl_blocks(const int64_t[::1] offsets, const int64_t[::1] gap, const int64_t[::1] last,
                                Py_ssize_t r, int64_t ttl) noexcept nogil:
    """Blocks request ``r`` finds under TTL ``ttl``: the end of its last step idle at most ``ttl``."""
    cdef int64_t k = 0
    cdef Py_ssize_t i = offsets[r]
    while i < offsets[r + 1] and gap[i] <= ttl:
        k = last[i]
        i += 1
    return k


cdef inline int64_t _cap_blocks(const int64_t[::1] offsets, const int64_t[::1] dist, const int64_t[::1] first,
                                const int64_t[::1] last, Py_ssize_t r, int64_t cap) noexcept nogil:
    """Blocks request ``r`` finds in a pool of ``cap`` blocks: up to the first block at stack distance ≥ ``cap``."""
    cdef int64_t k = 0
    cdef Py_ssize_t i = offsets[r]
    while i < offsets[r + 1]:
        if dist[i] >= cap:
            break
        if dist[i] + (last[i] - first[i]) >= cap:
            return first[i] + (cap - 1 - dist[i])
        k = last[i]
        i += 1
    return k


def capacity_counts(const int64_t[::1] offsets, const int64_t[::1] gap, const int64_t[::1] dist,
                    const int64_t[::1] first, const int64_t[::1] last, const uint8_t[::1] warm,
                    int64_t block, const int64_t[::1] ttls, const int64_t[::1] caps):
    """Hit tokens, requests hit and hit tokens among the ``warm`` requests, as int64
    [TTL, capacity]: each request's hit is min(blocks under τ, blocks under C)
    blocks (:func:`hit_depths` says it request by request)."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, n_t = ttls.shape[0], n_c = caps.shape[0]
    hits_arr = np.zeros((n_t, n_c), dtype=np.int64)
    nhit_arr = np.zeros((n_t, n_c), dtype=np.int64)
    warm_arr = np.zeros((n_t, n_c), dtype=np.int64)
    cdef int64_t[:, ::1] hits = hits_arr
    cdef int64_t[:, ::1] nhit = nhit_arr
    cdef int64_t[:, ::1] whit = warm_arr
    cdef Py_ssize_t r, ti, ci
    cdef int64_t k_t, k_c, h
    with nogil:
        for r in range(n):
            for ti in range(n_t):
                k_t = _ttl_blocks(offsets, gap, last, r, ttls[ti])
                if k_t == 0:
                    continue
                for ci in range(n_c):
                    k_c = _cap_blocks(offsets, dist, first, last, r, caps[ci])
                    h = (k_t if k_t < k_c else k_c) * block
                    if h > 0:
                        hits[ti, ci] += h
                        nhit[ti, ci] += 1
                        if warm[r]:
                            whit[ti, ci] += h
    return hits_arr, nhit_arr, warm_arr


def hit_depths(const int64_t[::1] offsets, const int64_t[::1] gap, const int64_t[::1] dist,
               const int64_t[::1] first, const int64_t[::1] last, int64_t ttl, int64_t cap):
    """Each request's hit in blocks under TTL ``ttl`` (µs) and a pool of ``cap``
    blocks: min(blocks under τ, blocks under C). Per request, where
    :func:`capacity_counts` sums: tiers compare one request's depths on
    different stacks (``replay.core.tiers``)."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, r
    out_arr = np.zeros(n, dtype=np.int64)
    cdef int64_t[::1] out = out_arr
    cdef int64_t k_t, k_c
    with nogil:
        for r in range(n):
            k_t = _ttl_blocks(offsets, gap, last, r, ttl)
            k_c = _cap_blocks(offsets, dist, first, last, r, cap) if k_t > 0 else 0
            out[r] = k_t if k_t < k_c else k_c
    return out_arr


def stack_distances(const int64_t[::1] prev, const int64_t[::1] first):
    """:func:`replay.core.sampled.distances`, compiled: a Fenwick tree over the
    references marking each block's latest touch so far."""
    cdef Py_ssize_t n = prev.shape[0], i = 0, j, k, q
    out_arr = np.full(n, -1, dtype=np.int64)
    tree_arr = np.zeros(n + 1, dtype=np.int64)
    cdef int64_t[::1] out = out_arr
    cdef int64_t[::1] tree = tree_arr
    cdef int64_t s
    with nogil:
        while i < n:
            j = i
            while j < n and first[j] == first[i]:
                j += 1
            for k in range(i, j):  # every lookup of the request first
                if prev[k] >= 0:
                    s = 0
                    q = first[k]
                    while q > 0:
                        s += tree[q]
                        q -= q & -q
                    q = prev[k] + 1
                    while q > 0:
                        s -= tree[q]
                        q -= q & -q
                    out[k] = s
            for k in range(i, j):  # then its touches
                if prev[k] >= 0:
                    q = prev[k] + 1
                    while q <= n:
                        tree[q] -= 1
                        q += q & -q
                q = k + 1
                while q <= n:
                    tree[q] += 1
                    q += q & -q
            i = j
    return out_arr


# ---------------------------------------------------------------- sampling (replay.core.sampled)

cdef uint64_t _X = 0x9E3779B97F4A7C15ULL


cdef inline uint64_t _mix(uint64_t h) noexcept nogil:
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL
    return h ^ (h >> 31)


def prefix_hashes(syms, before, Py_ssize_t k):
    """:meth:`replay.core.sampled.SampledPass._prefix_hashes`' sums, compiled:
    h[j] = Σ_{i ≤ j} (s_i + 1)·x^i (mod 2^64), h[:k] taken from ``before``."""
    arr = np.ascontiguousarray(syms)
    cdef Py_ssize_t n = arr.shape[0], j
    out = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef const uint64_t[::1] b
    cdef const int32_t[::1] s32
    cdef const int64_t[::1] s64
    cdef uint64_t h = 0, pw = 1, base = _X, e = <uint64_t> k
    if k:
        b = before
        o[:k] = b[:k]
        h = o[k - 1]
        while e:  # x^k by squaring
            if e & 1:
                pw *= base
            base *= base
            e >>= 1
    if arr.dtype == np.int32:
        s32 = arr
        with nogil:
            for j in range(k, n):
                h += (<uint64_t> (<int64_t> s32[j] + 1)) * pw
                pw *= _X
                o[j] = h
    else:
        s64 = arr.astype(np.int64, copy=False)
        with nogil:
            for j in range(k, n):
                h += (<uint64_t> (s64[j] + 1)) * pw
                pw *= _X
                o[j] = h
    return out


def sampled_block_ids(const uint64_t[::1] h, Py_ssize_t per, Py_ssize_t n_blocks, uint64_t salt,
                      uint64_t threshold):
    """The ids of a prompt's sampled blocks, deepest first (see
    :meth:`replay.core.sampled.SampledPass._block_ids`)."""
    out = np.empty(n_blocks, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef Py_ssize_t kb, c = 0
    cdef uint64_t v, end
    with nogil:
        for kb in range(n_blocks - 1, -1, -1):
            end = <uint64_t> ((kb + 1) * per)
            v = _mix((h[(kb + 1) * per - 1] + salt) ^ (end * _X))
            if (v >> 40) < threshold:
                o[c] = v
                c += 1
    return out[:c]


cdef class TruncatedLRU:
    """:class:`replay.core.sampled.ExactSmall`, compiled: one LRU of ``cap``
    blocks (every block, not a sample) whose lookups count, per TTL, the
    references at each stack distance below ``cap``. An LRU of ``cap`` blocks
    holds exactly the blocks whose stack distance is below ``cap``, and a
    block's rank in it is that distance; ranks come from a Fenwick tree over
    touch stamps (renumbered when they run out), blocks from an
    open-addressing table."""
    cdef readonly Py_ssize_t cap
    cdef Py_ssize_t width, live, next_pos, mask, n_ttl
    cdef int64_t* tree          # Fenwick tree over stamps, 1-based
    cdef uint64_t* pos_id       # stamp -> block id
    cdef int64_t* pos_ts        # stamp -> the touch's time
    cdef uint8_t* pos_live
    cdef uint64_t* keys         # block id (0: empty slot)
    cdef int64_t* vals          # -> its stamp
    cdef int64_t[::1] ttls
    cdef int64_t[:, ::1] hist_all
    cdef int64_t[:, ::1] hist_warm
    cdef object hist_arr, warm_arr

    def __cinit__(self, Py_ssize_t cap, ttls_us):
        cdef Py_ssize_t slots = 1
        self.cap = max(cap, 1)
        self.width = 1
        while self.width < 4 * self.cap:
            self.width <<= 1
        while slots < 2 * self.cap + 2:
            slots <<= 1
        self.mask = slots - 1
        self.tree = <int64_t*> calloc(self.width + 1, sizeof(int64_t))
        self.pos_id = <uint64_t*> calloc(self.width, sizeof(uint64_t))
        self.pos_ts = <int64_t*> calloc(self.width, sizeof(int64_t))
        self.pos_live = <uint8_t*> calloc(self.width, sizeof(uint8_t))
        self.keys = <uint64_t*> calloc(slots, sizeof(uint64_t))
        self.vals = <int64_t*> calloc(slots, sizeof(int64_t))
        if not (self.tree and self.pos_id and self.pos_ts and self.pos_live and self.keys and self.vals):
            raise MemoryError()
        self.ttls = np.ascontiguousarray(ttls_us, dtype=np.int64)
        self.n_ttl = self.ttls.shape[0]
        self.hist_arr = np.zeros((self.n_ttl, self.cap), dtype=np.int64)
        self.warm_arr = np.zeros((self.n_ttl, self.cap), dtype=np.int64)
        self.hist_all = self.hist_arr
        self.hist_warm = self.warm_arr

    def __dealloc__(self):
        free(self.tree)
        free(self.pos_id)
        free(self.pos_ts)
        free(self.pos_live)
        free(self.keys)
        free(self.vals)

    @property
    def hist(self):
        """References per [TTL, stack distance] that were fresh under the TTL."""
        return self.hist_arr

    @property
    def warm(self):
        """The same, for the requests marked late."""
        return self.warm_arr

    cdef inline void _tree_add(self, Py_ssize_t pos, int64_t delta) noexcept nogil:
        cdef Py_ssize_t q = pos + 1
        while q <= self.width:
            self.tree[q] += delta
            q += q & -q

    cdef inline int64_t _after(self, Py_ssize_t pos) noexcept nogil:
        """Live stamps later than ``pos``."""
        cdef int64_t s = 0
        cdef Py_ssize_t q = pos + 1
        while q > 0:
            s += self.tree[q]
            q -= q & -q
        return self.live - s

    cdef inline Py_ssize_t _oldest(self) noexcept nogil:
        """The first live stamp (the tree's lower bound of 1)."""
        cdef Py_ssize_t pos = 0, step = self.width
        while step:
            if pos + step <= self.width and self.tree[pos + step] < 1:
                pos += step
            step >>= 1
        return pos  # 0-based: the (pos + 1)-th tree entry

    cdef inline Py_ssize_t _slot(self, uint64_t key) noexcept nogil:
        cdef Py_ssize_t i = <Py_ssize_t> (key & <uint64_t> self.mask)
        while self.keys[i] != 0 and self.keys[i] != key:
            i = (i + 1) & self.mask
        return i

    cdef void _delete(self, uint64_t key) noexcept nogil:
        """Removes ``key`` (linear probing's backward shift)."""
        cdef Py_ssize_t i = self._slot(key), j, k
        self.keys[i] = 0
        j = i
        while True:
            j = (j + 1) & self.mask
            if self.keys[j] == 0:
                return
            k = <Py_ssize_t> (self.keys[j] & <uint64_t> self.mask)
            if (i < j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                self.keys[i] = self.keys[j]
                self.vals[i] = self.vals[j]
                self.keys[j] = 0
                i = j

    cdef void _compact(self) noexcept nogil:
        """Renumbers the live stamps 0, 1, … in order."""
        cdef Py_ssize_t p, j = 0
        for p in range(self.width):
            if self.pos_live[p]:
                self.pos_id[j] = self.pos_id[p]
                self.pos_ts[j] = self.pos_ts[p]
                self.vals[self._slot(self.pos_id[j])] = j
                j += 1
        memset(self.pos_live, 0, self.width * sizeof(uint8_t))
        memset(self.tree, 0, (self.width + 1) * sizeof(int64_t))
        for p in range(j):
            self.pos_live[p] = 1
            self._tree_add(p, 1)
        self.next_pos = j

    def add(self, const uint64_t[::1] h, Py_ssize_t per, Py_ssize_t n_blocks, uint64_t salt, int64_t ts,
            bint late, uint64_t threshold):
        """One request: its blocks' ids (as ``sampled_block_ids`` makes them),
        all looked up, then touched deepest first, then the oldest evicted down
        to ``cap``. Returns, for the sampled blocks (deepest first), whether
        each was resident (its distance below ``cap``)."""
        cdef Py_ssize_t kb, t, slot, pos, c = 0
        cdef int64_t d, gap
        cdef uint64_t key, v
        near_arr = np.zeros(n_blocks, dtype=np.uint8)
        cdef uint8_t[::1] near = near_arr
        with nogil:
            for kb in range(n_blocks - 1, -1, -1):
                v = _mix((h[(kb + 1) * per - 1] + salt) ^ (<uint64_t> ((kb + 1) * per) * _X))
                key = v | 1
                slot = self._slot(key)
                if (v >> 40) < threshold:
                    near[c] = self.keys[slot] != 0
                    c += 1
                if self.keys[slot] == 0:
                    continue
                pos = self.vals[slot]
                d = self._after(pos)
                gap = ts - self.pos_ts[pos]
                for t in range(self.n_ttl):
                    if gap <= self.ttls[t]:
                        self.hist_all[t, d] += 1
                        if late:
                            self.hist_warm[t, d] += 1
            for kb in range(n_blocks - 1, -1, -1):
                key = _mix((h[(kb + 1) * per - 1] + salt) ^ (<uint64_t> ((kb + 1) * per) * _X)) | 1
                if self.next_pos == self.width:
                    self._compact()
                slot = self._slot(key)
                if self.keys[slot] != 0:
                    pos = self.vals[slot]
                    self.pos_live[pos] = 0
                    self._tree_add(pos, -1)
                    self.live -= 1
                else:
                    self.keys[slot] = key
                pos = self.next_pos
                self.next_pos += 1
                self.vals[slot] = pos
                self.pos_id[pos] = key
                self.pos_ts[pos] = ts
                self.pos_live[pos] = 1
                self._tree_add(pos, 1)
                self.live += 1
                while self.live > self.cap:
                    pos = self._oldest()
                    self._delete(self.pos_id[pos])
                    self.pos_live[pos] = 0
                    self._tree_add(pos, -1)
                    self.live -= 1
        return near_arr[:c]
