# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The trie of :mod:`replay.core.trie` (its contract is written there): the one
implementation, tested against the brute-force definition of a walk
(``tests/support/kernels.py``). A node holds a pointer into the array its
edge is a view of (and a reference to that array), and edges are compared
element by element in C (a numpy comparison per edge cost more in call
overhead than in comparing). Symbols may be int32 (token ids) or int64 (block
traces), even within one trie.

Also here, for the same reason: the replay's prompt assembly
(:func:`extend`, behind ``replay.core.prompts.SegmentStore.extend``) and its
hit origin per step (:class:`Writers`, used by ``replay.core.replay``).

Times are integer microseconds (int64), so gaps compare exactly with TTLs.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject


cdef inline int64_t _at(const char* p, bint wide, Py_ssize_t i) noexcept nogil:
    return (<const int64_t*> p)[i] if wide else (<const int32_t*> p)[i]


cdef Py_ssize_t _common(const char* a, bint wa, const char* b, bint wb, Py_ssize_t k) noexcept nogil:
    """Length of the common prefix of a[:k] and b[:k]."""
    cdef Py_ssize_t i = 0, step, size
    if wa == wb:  # whole chunks by memcmp first (long edges mostly match)
        size = 8 if wa else 4
        step = 64
        while i + step <= k and memcmp(a + i * size, b + i * size, step * size) == 0:
            i += step
    while i < k and _at(a, wa, i) == _at(b, wb, i):
        i += 1
    return i


cdef const char* _data(object arr) except NULL:
    """The address of a C-contiguous array's first element (a buffer released at
    once: the array's memory stays where it is for as long as it lives, and every
    node holding the address holds the array)."""
    cdef Py_buffer view
    cdef const char* p
    PyObject_GetBuffer(arr, &view, PyBUF_SIMPLE)
    p = <const char*> view.buf
    PyBuffer_Release(&view)
    if p == NULL:  # an empty array may give none: any valid address, never read
        p = <const char*> &_EMPTY_SYMBOL
    return p


cdef int64_t _EMPTY_SYMBOL = 0


cdef void* _resized(void* p, size_t nbytes) except NULL:
    """``p`` reallocated to ``nbytes`` (MemoryError where it cannot be: ``p`` is
    then left as it was, still the caller's to free)."""
    cdef void* q = realloc(p, nbytes)
    if q == NULL:
        raise MemoryError()
    return q
cdef int64_t INF_US = 9223372036854775807  # replay.times.INF_US


cdef class Tails:
    """The part of each walked sequence the tries hold, copied once and shared by
    every trie that walks it (kept in the request's ``held``: ``Trie.walk(..., held=)``).

    A new leaf or a merged edge is a part of the walked sequence, most of which
    (the conversation so far) the trie holds already: holding the whole sequence
    for it would keep all of that twice, so the part from the edge's start to
    the end is copied — once per request, however many tries (stream modes,
    variants, replicas) walk it; their edges are views of that copy. A split
    edge's two parts stay views of the array it was part of."""
    cdef dict _held       # id(seq) -> [seq, lo, copy of seq[lo:] (seq itself when lo == 0)]

    def __cinit__(self):
        self._held = {}

    cdef tuple take(self, object seq, Py_ssize_t start):
        cdef list got = self._held.get(id(seq))
        if got is None or got[0] is not seq or start < <Py_ssize_t> got[1]:
            got = [seq, start, seq if start == 0 else seq[start:].copy()]
            self._held[id(seq)] = got
        return got[2], got[1]


cdef class Node:
    """A node: its edge (``length`` symbols of ``base`` from ``start``), children
    by first symbol, last-used time."""
    cdef public object base      # the array the edge's symbols live in (kept alive)
    cdef const char* data        # base's first element
    cdef bint wide               # int64 symbols (else int32)
    cdef Py_ssize_t start
    cdef Py_ssize_t length
    cdef public dict children
    cdef public int64_t last_used
    cdef public int64_t owner         # the last request that walked through it (walks with an owner)

    def __cinit__(self):
        self.children = {}

    cdef int _set(self, object base, const char* data, bint wide, Py_ssize_t start, Py_ssize_t length) except -1:
        """The edge: ``length`` symbols of ``base`` (an array the trie owns) from ``start``."""
        self.base = base
        self.data = data
        self.wide = wide
        self.start = start
        self.length = length
        return 0

    cdef int _own(self, Tails tails, object seq, Py_ssize_t start, Py_ssize_t length) except -1:
        """The edge: ``seq[start:start + length]`` of the walked sequence, held as
        part of ``tails``' copy of it (shared by every trie that walks ``seq``)."""
        cdef object arr
        cdef Py_ssize_t lo
        arr, lo = tails.take(seq, start)
        return self._set(arr, _data(arr), arr.dtype.itemsize == 8, start - lo, length)

    cdef inline const char* ptr(self, Py_ssize_t offset):
        return self.data + (self.start + offset) * (8 if self.wide else 4)


cdef inline Node _node(object base, const char* data, bint wide, Py_ssize_t start, Py_ssize_t length,
                       int64_t last_used, int64_t owner=-1):
    cdef Node x = Node.__new__(Node)
    x._set(base, data, wide, start, length)
    x.last_used = last_used
    x.owner = owner
    return x


def _as_symbols(seq):
    """``seq`` as a C-contiguous int32 or int64 array (no copy when it is one)."""
    arr = np.asarray(seq)
    if arr.dtype != np.int64 and arr.dtype != np.int32:
        arr = arr.astype(np.int64)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


cdef class Trie:
    """A per-stream radix trie whose nodes carry last-used timestamps (µs); see
    :mod:`replay.core.trie` for the walk's contract."""
    cdef public Node root
    cdef public int64_t horizon
    cdef int64_t _last_prune
    cdef bint _pruned
    cdef public Py_ssize_t nodes
    # the path of a descent: nodes, and each one's start and end depth
    cdef list _path
    cdef Py_ssize_t* _starts
    cdef Py_ssize_t* _ends
    cdef Py_ssize_t _cap

    def __cinit__(self):
        self._starts = NULL
        self._ends = NULL
        self._cap = 0

    def __init__(self, int64_t horizon=INF_US):
        empty = np.empty(0, dtype=np.int64)
        self.root = _node(empty, _data(empty), True, 0, 0, 0)  # (the root's time is never read)
        self.horizon = horizon
        self._last_prune = 0
        self._pruned = False
        self.nodes = 1
        self._path = []

    def __dealloc__(self):
        free(self._starts)
        free(self._ends)

    cdef int _reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t cap
        if n <= self._cap:
            return 0
        cap = max(n, 2 * self._cap, 16)
        self._starts = <Py_ssize_t*> _resized(self._starts, cap * sizeof(Py_ssize_t))
        self._ends = <Py_ssize_t*> _resized(self._ends, cap * sizeof(Py_ssize_t))
        self._cap = cap
        return 0

    cdef int _push(self, Node node, Py_ssize_t start, Py_ssize_t end) except -1:
        cdef Py_ssize_t k = len(self._path)
        self._reserve(k + 1)
        self._path.append(node)
        self._starts[k] = start
        self._ends[k] = end
        return 0

    def walk(self, seq, int64_t t, insert=None, cum=None, Py_ssize_t known=0, owner=None, dict held=None):
        """Walk ``seq`` at time ``t``; return its steps and insert it (the
        arguments: :mod:`replay.core.trie`)."""
        cdef bint owned = owner is not None
        cdef int64_t own = owner if owned else -1
        cdef Tails tails
        if self.horizon < INF_US and (not self._pruned or t - self._last_prune > self.horizon // 2):
            self.prune(t)
        if held is None:
            tails = Tails()
        else:
            tails = held.get(Tails)
            if tails is None:
                tails = held[Tails] = Tails()
        seq = _as_symbols(seq)
        steps = self._descend(seq, t, True, known, owned, own, tails)
        if insert is not None and len(insert) > len(seq):
            self._descend(_as_symbols(insert), t, False, len(seq), owned, own, tails)
        if cum is not None:
            steps = [(st[0], int(cum[st[1]]), *st[2:]) for st in steps]
        return steps

    cdef list _descend(self, object seq, int64_t t, bint record, Py_ssize_t known, bint owned, int64_t own,
                       Tails tails):
        cdef list steps = []
        cdef Node node = self.root, child, mid, leaf
        cdef Py_ssize_t pos = 0, n = len(seq), matched, le, k, skip
        cdef bint wide = seq.dtype.itemsize == 8
        cdef const char* s = _data(seq)
        cdef Py_ssize_t size = 8 if wide else 4
        cdef int64_t gap, last_gap = 0, last_owner = -1
        cdef bint have_step = False
        cdef object first
        cdef dict children
        cdef PyObject* found
        self._path = []
        while pos < n:
            first = _at(s, wide, pos)
            children = node.children
            found = PyDict_GetItem(children, first)
            if found == NULL:
                break
            child = <Node> found
            le = child.length
            k = min(le, n - pos)
            if pos + le <= known:
                matched = le
            else:
                # the edge's part up to ``known`` matches: compare only the rest
                skip = known - pos if pos < known else 0
                matched = skip + _common(child.ptr(skip), child.wide, s + (pos + skip) * size, wide, k - skip)
            if record:
                gap = t - child.last_used
                if gap > self.horizon:
                    # idle past the horizon: as good as pruned (exact for τ <= horizon)
                    break
                if owned:
                    if have_step and last_gap == gap and last_owner == child.owner:
                        steps[len(steps) - 1] = (gap, pos + matched, child.owner)
                    else:
                        steps.append((gap, pos + matched, child.owner))
                        last_gap, last_owner, have_step = gap, child.owner, True
                elif have_step and last_gap == gap:
                    steps[len(steps) - 1] = (gap, pos + matched)
                else:
                    steps.append((gap, pos + matched))
                    last_gap, have_step = gap, True
            if matched < le:
                # the match ends inside the edge: split it (both parts stay views of
                # the array the trie holds already)
                mid = _node(child.base, child.data, child.wide, child.start, matched, child.last_used, child.owner)
                child._set(child.base, child.data, child.wide, child.start + matched, le - matched)
                mid.children[_at(child.ptr(0), child.wide, 0)] = child
                children[first] = mid
                self.nodes += 1
                self._push(mid, pos, pos + matched)
                pos += matched
                node = mid
                break
            self._push(child, pos, pos + le)
            node = child
            pos += le
        if pos < n:
            first = _at(s, wide, pos)
            found = PyDict_GetItem(node.children, first)
            if found != NULL:  # idle past the horizon, not yet pruned
                self.nodes -= _count(<Node> found)
            # a view of seq for now: owned once the merge below has decided its extent
            leaf = _node(seq, s, wide, pos, n - pos, t)
            node.children[first] = leaf
            self.nodes += 1
            self._push(leaf, pos, n)
        self._refresh_and_merge(seq, tails, t, own, leaf if pos < n else None)
        return steps

    cdef int _refresh_and_merge(self, object seq, Tails tails, int64_t t, int64_t own, Node leaf) except -1:
        """Set last-used = t (and the owner) along the path, merging single-child
        chains; a merged edge, or the new ``leaf`` left alone, takes its symbols
        from ``tails`` (one copy, made once)."""
        cdef list path = self._path
        cdef Py_ssize_t i = 0, j, m = len(path), start, end
        cdef Node head, nxt
        while i < m:
            head = <Node> path[i]
            start = self._starts[i]
            end = self._ends[i]
            head.last_used = t
            head.owner = own
            j = i
            # absorb following path nodes while head has exactly that one child
            while j + 1 < m and len(head.children) == 1:
                nxt = <Node> path[j + 1]
                head.children = nxt.children
                end = self._ends[j + 1]
                self.nodes -= 1
                j += 1
            if j > i or head is leaf:
                head._own(tails, seq, start, end - start)
            i = j + 1
        return 0

    def prune(self, int64_t now):
        """Drop subtrees idle for longer than the horizon (last-used shrinks with depth)."""
        cdef int64_t cutoff = now - self.horizon
        cdef Node node, c
        self._last_prune = now
        self._pruned = True
        stack = [self.root]
        while stack:
            node = stack.pop()
            dead = [k for k, c in node.children.items() if (<Node> c).last_used < cutoff]
            for k in dead:
                self.nodes -= _count(node.children.pop(k))
            stack.extend(node.children.values())


cdef Py_ssize_t _count(Node node):
    cdef Py_ssize_t n = 0
    cdef Node x
    stack = [node]
    while stack:
        x = stack.pop()
        n += 1
        stack.extend(x.children.values())
    return n


# ---------------------------------------------------------------- prompt assembly

cdef Py_ssize_t _n_tokens(dict tokens, object seg) except -1:
    cdef PyObject* arr = PyDict_GetItem(tokens, seg)
    if arr == NULL:
        raise KeyError(seg)
    return len(<object> arr)


cdef inline const char* _int32_data(object arr) except NULL:
    """:func:`_data` of an int32 array (anything else would be copied past its end)."""
    if arr.dtype.itemsize != 4:
        raise TypeError(f"expected int32 tokens, got {arr.dtype}")
    return _data(arr)


def extend(dict tokens, list seg_ids, prev):
    """:meth:`replay.core.prompts.SegmentStore.extend`: the tokens of ``seg_ids``
    (int32 arrays in ``tokens``) concatenated, and how many leading tokens are
    ``prev``'s (an earlier prompt's segment ids and tokens). When ``seg_ids``
    repeats all of prev's segments but its last (an agent's next turn: the same
    conversation, then the reply and new messages instead of the generation
    marker) those are copied from prev's tokens in one piece — joining hundreds
    of segments again is most of the cost; otherwise (an earlier message
    changed) the segments it shares with prev from the start are. The result is
    one allocation filled by memcpy, not a numpy concatenation of a list of arrays."""
    cdef Py_ssize_t m = len(seg_ids), n = 0, k, i, cut = 0, total, pos
    cdef list psegs, rest
    cdef object ptoks = None
    cdef object out, seg
    cdef char* dst
    cdef PyObject* found
    if prev is not None:
        psegs, ptoks = prev
        k = len(psegs) - 1
        if 0 < k < m and seg_ids[:k] == psegs[:k]:  # an agent's next turn: all of prev but its last
            n = k
            cut = len(ptoks) - _n_tokens(tokens, psegs[k])
        else:  # an earlier message changed: the segments shared from the start
            k = min(m, len(psegs))
            while n < k and seg_ids[n] == psegs[n]:
                n += 1
            for i in range(n):
                cut += _n_tokens(tokens, psegs[i])
    rest = []
    total = cut
    for i in range(n, m):
        found = PyDict_GetItem(tokens, seg_ids[i])
        if found == NULL:
            raise KeyError(seg_ids[i])
        seg = <object> found
        rest.append(seg)
        total += len(seg)
    out = np.empty(total, dtype=np.int32)
    if total == 0:
        return out, cut
    dst = <char*> _data(out)
    if cut:
        memcpy(dst, _int32_data(ptoks), cut * 4)
    pos = cut
    for seg in rest:
        k = len(seg)
        if k:
            memcpy(dst + pos * 4, _int32_data(seg), k * 4)
            pos += k
    return out, cut


# ---------------------------------------------------------------- hit origin

cdef class Writers:
    """Who last wrote each part of a trie, as small ints: a node's owner is the
    code of the (tenant, session) of the last request that walked through it,
    and a step's origin follows from that writer and the walking request — a
    walk's steps (gap, depth, owner) become (gaps, depths, origins) relative to
    the walking pair (origin codes: ``replay.core.streams.ORIGINS``)."""
    cdef dict _codes
    cdef dict _tenants
    cdef dict _sessions
    cdef int64_t* _tenant_of
    cdef int64_t* _session_of   # -1: no session
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap

    def __cinit__(self):
        self._codes = {}
        self._tenants = {}
        self._sessions = {}
        self._tenant_of = NULL
        self._session_of = NULL
        self._n = 0
        self._cap = 0

    def __dealloc__(self):
        free(self._tenant_of)
        free(self._session_of)

    def code(self, tenant, session):
        """The number of the pair (tenant, session) (``session`` may be None)."""
        cdef PyObject* found = PyDict_GetItem(self._codes, (tenant, session))
        cdef Py_ssize_t cap
        if found != NULL:
            return <object> found
        if self._n == self._cap:
            cap = max(16, 2 * self._cap)
            self._tenant_of = <int64_t*> _resized(self._tenant_of, cap * sizeof(int64_t))
            self._session_of = <int64_t*> _resized(self._session_of, cap * sizeof(int64_t))
            self._cap = cap
        self._tenant_of[self._n] = self._tenants.setdefault(tenant, len(self._tenants))
        self._session_of[self._n] = -1 if session is None else self._sessions.setdefault(session, len(self._sessions))
        self._codes[(tenant, session)] = self._n
        self._n += 1
        return self._n - 1

    def split(self, list steps, Py_ssize_t me):
        """(gaps, depths, origins) of a walk's steps, steps of the same gap and origin merged."""
        cdef list gaps = [], depths = [], origins = []
        cdef Py_ssize_t k, w, n = len(steps)
        cdef int64_t g, last_g = -1, my_s, my_t
        cdef int o, last_o = -1
        cdef tuple st
        if n == 0:
            return gaps, depths, origins
        if me < 0 or me >= self._n:
            raise ValueError("unknown writer")
        my_s = self._session_of[me]
        my_t = self._tenant_of[me]
        for k in range(n):
            st = <tuple> steps[k]
            g = st[0]
            w = st[2]
            if w < 0 or w >= self._n:
                raise ValueError("unknown writer")
            if w == me:
                o = 0 if my_s >= 0 else 1
            elif my_s >= 0 and self._session_of[w] == my_s:
                o = 0
            else:
                o = 1 if self._tenant_of[w] == my_t else 2
            if g == last_g and o == last_o:
                depths[len(depths) - 1] = st[1]
            else:
                gaps.append(st[0])
                depths.append(st[1])
                origins.append(o)
                last_g = g
                last_o = o
        return gaps, depths, origins
