# cython: language_level=3, boundscheck=False, wraparound=False
"""A 64-bit hash of a decoded JSON value, without serializing it (ingest's key memo).

Ingest finds the blob id of a message it has seen before by a hash of the
message; it used to hash orjson's serialization of it, which meant writing out
every message of every turn again (an agent resends its whole conversation). This
walks the decoded value instead: each string by Python's own string hash
(SipHash, the hash ``hash(bytes)`` used there), everything else by its exact type
and value, mixed in order with the structure (type tags, lengths, dict key order).

Two values get the same hash only when orjson writes them the same (or by a 64-bit
collision, as before): ``1``, ``1.0``, ``true`` and ``"1"`` differ, so do
``0.0`` and ``-0.0`` (compared by their bits) and dicts whose keys come in another
order. A value holding anything else — an int outside 64 bits, a non-string key,
a type the JSON parser does not make — gets no hash (``item_hashes`` returns None
and the caller serializes, as before).
"""

from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject, PyObject_Hash
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

cdef enum:
    T_STR = 1
    T_DICT = 2
    T_LIST = 3
    T_BOOL = 4
    T_NONE = 5
    T_INT = 6
    T_FLOAT = 7
    T_KEY = 8


cdef inline uint64_t _fmix(uint64_t k) noexcept nogil:
    # MurmurHash3's finalizer: a bijection that spreads every input bit
    k ^= k >> 33
    k *= 0xff51afd7ed558ccdULL
    k ^= k >> 33
    k *= 0xc4ceb9fe1a85ec53ULL
    k ^= k >> 33
    return k


cdef inline uint64_t _step(uint64_t h, uint64_t tag, uint64_t x) noexcept nogil:
    return _fmix(h ^ _fmix(x ^ (tag * 0x9E3779B97F4A7C15ULL)))


cdef bint _walk(object o, uint64_t *h) except -1:
    """Mix ``o`` into ``h[0]``; False when ``o`` holds something without a hash here."""
    cdef type t = type(o)
    cdef Py_ssize_t pos = 0, i, n
    cdef PyObject *k
    cdef PyObject *v
    cdef int overflow = 0
    cdef long long iv
    cdef double d
    cdef uint64_t bits
    if t is str:
        h[0] = _step(h[0], T_STR, <uint64_t>PyObject_Hash(o))
    elif t is dict:
        h[0] = _step(h[0], T_DICT, <uint64_t>len(<dict>o))
        while PyDict_Next(o, &pos, &k, &v):
            if type(<object>k) is not str:
                return False
            h[0] = _step(h[0], T_KEY, <uint64_t>PyObject_Hash(<object>k))
            if not _walk(<object>v, h):
                return False
    elif t is list:
        n = len(<list>o)
        h[0] = _step(h[0], T_LIST, <uint64_t>n)
        for i in range(n):
            if not _walk((<list>o)[i], h):
                return False
    elif t is bool:
        h[0] = _step(h[0], T_BOOL, 1 if o is True else 0)
    elif o is None:
        h[0] = _step(h[0], T_NONE, 0)
    elif t is int:
        iv = PyLong_AsLongLongAndOverflow(o, &overflow)
        if overflow:
            return False
        h[0] = _step(h[0], T_INT, <uint64_t>iv)
    elif t is float:
        d = o
        memcpy(&bits, &d, 8)
        h[0] = _step(h[0], T_FLOAT, bits)
    else:
        return False
    return True


def item_hashes(list items):
    """The hash of each item (ints, as Python's ``hash`` gives them), or None when
    one of them has none (module docstring)."""
    cdef list out = []
    cdef uint64_t h
    for o in items:
        h = 0x243F6A8885A308D3ULL
        if not _walk(o, &h):
            return None
        out.append(<int64_t>h)
    return out
