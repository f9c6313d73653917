"""The capacity curve estimated from a sample of blocks (SHARDS, Waldspurger et al.,
FAST '15), for logs whose trie would not fit in memory.

Why sampling blocks one by one is sound here: residency is prefix-closed and a
block's gap never falls going deeper, so a request's hit under (τ, C) is
simply how many of its blocks are, each on its own, resident (stack distance
d < C) and fresh (gap ≤ τ) — a sum over block references, which is what
SHARDS estimates. A block is sampled when a hash of its identity falls under
``rate`` (spatial sampling: a block is always or never in the sample), the
sampled references' stack distances are counted among sampled blocks only
(≈ rate × the true distance), so a sampled reference counts as resident when
its distance is below ``rate × C``, and each counts for 1 / rate references.
Prompt tokens and requests are exact; hit tokens are the estimate.

A sample alone is poor at both ends: it cannot resolve a cache holding only a
few sampled blocks, and catching or missing one of the few blocks nearly every
request shares (a system prompt's) moves every capacity's estimate. Both are
near references, and near references need little memory to count exactly: one
LRU of ``EXACT_SAMPLED_BLOCKS / rate`` blocks over every block
(:class:`ExactSmall`) counts every reference whose distance is below its size,
so capacities up to it are exact, and a larger one adds only the sampled
references that LRU did not hold (``far``), each for 1 / rate.

A block's identity is a 64-bit hash of its cache (stream and model) and its
whole token prefix (a polynomial prefix hash, mixed), computed for every block
size at once from one cumulative sum per prompt. Memory is the sampled
references, not the prompts.
"""

from __future__ import annotations

import hashlib
import math
import os
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from replay.core.prompt import RECENT_CONVERSATIONS, Prompt, trace_blocks
from replay.core.streams import stream_key
from replay.times import INF_US

try:  # the distances compiled (replay/core/_capacity.pyx), where built
    from replay.core import _capacity as _compiled
except ImportError:  # pragma: no cover - an install without a compiler
    _compiled = None
if os.environ.get("REPLAY_PURE_SWEEP"):
    _compiled = None

_X = np.uint64(0x9E3779B97F4A7C15)   # the polynomial's base (odd)
_SCALE = 1 << 24                      # sampling resolution: rate = threshold / 2^24
_NO_PREVIOUS = -1
EXACT_SAMPLED_BLOCKS = 1000           # capacities below this many sampled blocks are counted exactly


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit reaches every output bit."""
    with np.errstate(over="ignore"):
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


class _Powers:
    """x^0, x^1, … (mod 2^64), grown on demand."""

    def __init__(self):
        self.values = np.ones(1, dtype=np.uint64)

    def __call__(self, n: int) -> np.ndarray:
        if n > len(self.values):
            size = max(n, 2 * len(self.values))
            out = np.empty(size, dtype=np.uint64)
            out[0] = 1
            with np.errstate(over="ignore"):
                for i in range(1, size):  # (once per doubling)
                    out[i] = out[i - 1] * _X
            self.values = out
        return self.values[:n]


@dataclass
class SampledRefs:
    """One block size's sampled references, per replica, in touch order (each
    request's blocks deepest first), with what the estimate needs."""
    block: int
    rate: float
    prompt_tokens: np.ndarray     # int64, per request (all requests)
    replica: np.ndarray           # int64, per request
    distance: list                # per replica: int64 stack distance among sampled blocks (-1: never seen)
    gap: list                     # per replica: int64 µs since the block's last touch
    request: list                 # per replica: int64 request index (processing order)
    far: list                     # per replica: bool, not resident in the exact small LRU
    working_set: np.ndarray       # int64 per replica: distinct blocks, estimated
    ttls_us: tuple                # the TTLs the exact small-capacity counts are for
    exact: np.ndarray             # int64 [all/last half, TTL, d]: all replicas' references at distance d

    def __len__(self) -> int:
        return len(self.prompt_tokens)


class SampledPass:
    """Samples every request's blocks (in processing order) at each block size,
    for one stream mode, on the replica it was routed to; ``seed`` picks the
    sample."""

    def __init__(self, mode: str, blocks, replicas: int, rate: float, seed: int = 0, ttls_us=(INF_US,),
                 n_requests: int = 0, exact_below: int | None = None):
        if not 0 < rate <= 1:
            raise ValueError("the sample rate must be in (0, 1]")
        self.mode, self.blocks, self.replicas, self.rate = mode, tuple(int(b) for b in blocks), replicas, rate
        self.seed = seed  # another seed, another sample of blocks
        self.ttls_us, self.n_requests = tuple(int(t) for t in ttls_us), n_requests  # (the warm half: i ≥ n // 2)
        small = math.ceil(EXACT_SAMPLED_BLOCKS / rate) if exact_below is None else exact_below
        make = _compiled.TruncatedLRU if _compiled is not None else ExactSmall
        self._small = {(b, r): make(small, self.ttls_us) for b in self.blocks for r in range(replicas)} \
            if small > 0 else {}
        self._threshold = np.uint64(max(1, round(rate * _SCALE)))
        self._powers = _Powers()
        self._salts: dict = {}
        self._refs = {(b, r): {c: array("q") for c in ("id", "ts", "request", "first", "near")}
                      for b in self.blocks for r in range(replicas)}
        self._tokens, self._replica = array("q"), array("q")
        self._recent: OrderedDict = OrderedDict()  # conversation -> its latest prompt's unsalted prefix hashes

    def add(self, p: Prompt, replica: int, held: dict | None = None) -> None:
        """(``held``: the exact pass's, unused here: a sampled pass holds no trie.)"""
        i = len(self._tokens)
        self._tokens.append(p.n_tokens)
        self._replica.append(replica)
        h, salt = self._prefix_hashes(p)
        for b in self.blocks:
            n_blocks, keep = self._sampled_blocks(p, h, salt, b)
            if self._small:
                near = self._small[(b, replica)].add(h, self._per(p, b), n_blocks, salt, p.ts,
                                                     i >= self.n_requests // 2, self._threshold)
            if len(keep):
                refs = self._refs[(b, replica)]
                refs["near"].extend(near.tolist() if self._small else [0] * len(keep))
                refs["first"].extend([len(refs["id"])] * len(keep))
                refs["id"].frombytes(keep.view(np.int64).tobytes())
                refs["ts"].extend([p.ts] * len(keep))
                refs["request"].extend([i] * len(keep))

    def _prefix_hashes(self, p: Prompt) -> tuple[np.ndarray, np.uint64]:
        """h[j] = Σ_{i ≤ j} (s_i + 1)·x^i (mod 2^64) over the prompt's symbols, and
        its cache's salt. The part a prompt shares with its conversation's
        previous one is that one's (the same symbols), so only the new symbols
        are summed."""
        key = (stream_key(self.mode, p.tenant, p.key, p.session), p.model)
        salt = self._salts.get(key)
        if salt is None:
            digest = hashlib.blake2b(repr((self.seed, key)).encode(), digest_size=8).digest()
            salt = self._salts[key] = np.uint64(int.from_bytes(digest, "little"))
        syms = p.symbols
        conv = (p.tenant, p.session or p.key)
        before = self._recent.get(conv)
        k = p.shared if before is not None and p.cum is None and 0 < p.shared <= len(before) else 0
        if _compiled is not None:
            h = _compiled.prefix_hashes(syms, before, k)
        else:
            h = np.empty(len(syms), dtype=np.uint64)
            with np.errstate(over="ignore"):
                terms = (np.asarray(syms[k:], dtype=np.int64).view(np.uint64) + np.uint64(1)) * \
                    self._powers(len(syms))[k:]
                np.cumsum(terms, dtype=np.uint64, out=h[k:])
                if k:
                    h[:k] = before[:k]
                    h[k:] += before[k - 1]
        if p.cum is None:
            self._recent[conv] = h
            self._recent.move_to_end(conv)
            if len(self._recent) > RECENT_CONVERSATIONS:
                self._recent.popitem(last=False)
        return h, salt

    def _sampled_blocks(self, p: Prompt, h: np.ndarray, salt: np.uint64, b: int) -> tuple[int, np.ndarray]:
        """How many whole blocks of ``b`` tokens the prompt has, and the ids of
        those sampled, deepest first. A block's id mixes the hash of its whole
        prefix, its cache's salt and its end."""
        per = self._per(p, b)
        n_blocks = trace_blocks(p, b)[1] if p.cum is not None else len(p.symbols) // b
        if _compiled is not None:
            return n_blocks, _compiled.sampled_block_ids(h, per, n_blocks, salt, self._threshold)
        ends = np.arange(1, n_blocks + 1, dtype=np.uint64) * np.uint64(per)
        with np.errstate(over="ignore"):
            ids = _mix((h[per - 1::per][:n_blocks] + salt) ^ (ends * _X))
        return n_blocks, ids[(ids >> np.uint64(40)) < self._threshold][::-1]

    @staticmethod
    def _per(p: Prompt, b: int) -> int:
        """Symbols per block of ``b`` tokens."""
        if p.cum is None:
            return b
        return trace_blocks(p, b)[0]  # a block trace: its symbols are blocks already

    def result(self) -> dict[int, SampledRefs]:
        tokens, replica = _int64(self._tokens), _int64(self._replica)
        out = {}
        for b in self.blocks:
            dist, gaps, reqs, far, ws = [], [], [], [], []
            for r in range(self.replicas):
                refs = self._refs[(b, r)]
                ids, ts, first = _int64(refs["id"]), _int64(refs["ts"]), _int64(refs["first"])
                prev = _previous(ids)
                dist.append(distances(prev, first))
                gaps.append(np.where(prev >= 0, ts - ts[np.maximum(prev, 0)], 0))
                reqs.append(_int64(refs["request"]))
                far.append(_int64(refs["near"]) == 0)
                ws.append(round(len(np.unique(ids)) / self.rate))
            small = [self._small[(b, r)] for r in range(self.replicas)] if self._small else []
            exact = np.zeros((2, len(self.ttls_us), small[0].cap if small else 0), dtype=np.int64)
            for s in small:
                exact += np.stack([np.asarray(s.hist), np.asarray(s.warm)])
            out[b] = SampledRefs(b, self.rate, tokens, replica, dist, gaps, reqs, far,
                                 np.array(ws, dtype=np.int64), self.ttls_us, exact)
        return out


class ExactSmall:
    """One LRU of ``cap`` blocks over every block of one replica, counting each
    lookup's stack distance (its rank in the LRU: an LRU of ``cap`` blocks
    holds exactly those below ``cap``) per TTL under which it is fresh. (The
    compiled ``TruncatedLRU`` does the same with a tree of touch stamps.)"""

    def __init__(self, cap: int, ttls_us):
        self.cap, self.ttls = max(int(cap), 1), np.asarray(ttls_us, dtype=np.int64)
        self.hist = np.zeros((len(self.ttls), self.cap), dtype=np.int64)
        self.warm = np.zeros_like(self.hist)
        self._lru: OrderedDict = OrderedDict()  # block id -> last touch, oldest first

    def add(self, h: np.ndarray, per: int, n_blocks: int, salt: np.uint64, ts: int, late: bool,
            threshold: np.uint64) -> np.ndarray:
        """One request (see the compiled ``TruncatedLRU.add``); returns whether
        each sampled block (deepest first) was resident."""
        ends = np.arange(1, n_blocks + 1, dtype=np.uint64) * np.uint64(per)
        with np.errstate(over="ignore"):
            v = _mix((h[per - 1::per][:n_blocks] + salt) ^ (ends * _X))
        ids = (v | np.uint64(1)).tolist()
        recency = {key: d for d, key in enumerate(reversed(self._lru))}
        sampled = (v >> np.uint64(40)) < threshold
        near = np.array([key in recency for key in ids], dtype=np.uint8)[sampled][::-1]
        for key in ids:
            if key in recency:
                fresh = ts - self._lru[key] <= self.ttls
                self.hist[fresh, recency[key]] += 1
                if late:
                    self.warm[fresh, recency[key]] += 1
        for key in reversed(ids):  # deepest first
            self._lru.pop(key, None)
            self._lru[key] = ts
        while len(self._lru) > self.cap:
            self._lru.popitem(last=False)
        return near


def _int64(a: array) -> np.ndarray:
    return np.frombuffer(a, dtype=np.int64).copy() if len(a) else np.zeros(0, dtype=np.int64)


def _previous(ids: np.ndarray) -> np.ndarray:
    """For each reference, the index of the previous reference to the same block (-1: none)."""
    order = np.argsort(ids, kind="stable")
    prev = np.full(len(ids), _NO_PREVIOUS, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev


class _Fenwick:
    """Prefix sums over a growing array of counts (a binary indexed tree). Its
    size stays a power of two: doubling it, the new last entry covers
    everything before it and the others only new, zero counts."""

    def __init__(self, n: int = 1024):
        self.size = 1 << max(0, n - 1).bit_length()
        self.tree = [0] * (self.size + 1)

    def add(self, i: int, delta: int) -> None:
        while i + 1 > self.size:
            everything = self.prefix(self.size)
            self.tree += [0] * self.size
            self.size *= 2
            self.tree[self.size] = everything
        i += 1
        tree = self.tree
        while i <= self.size:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of counts [0, i)."""
        s, tree = 0, self.tree
        i = min(i, self.size)
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s


def distances(prev: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each reference's stack distance: the distinct blocks touched after its
    previous reference and before its request began (a request looks up all
    its blocks, then touches them); -1 where there is no previous reference."""
    prev = np.ascontiguousarray(prev, dtype=np.int64)
    first = np.ascontiguousarray(first, dtype=np.int64)
    if _compiled is not None:
        return _compiled.stack_distances(prev, first)
    n = len(prev)
    out = np.full(n, _NO_PREVIOUS, dtype=np.int64)
    latest = _Fenwick(n)  # 1 at each position that is its block's latest touch so far
    i = 0
    while i < n:
        j = i
        while j < n and first[j] == first[i]:
            j += 1
        for k in range(i, j):
            if prev[k] >= 0:
                out[k] = latest.prefix(int(first[k])) - latest.prefix(int(prev[k]) + 1)
        for k in range(i, j):
            if prev[k] >= 0:
                latest.add(int(prev[k]), -1)
            latest.add(k, 1)
        i = j
    return out


def sampled_counts(refs: SampledRefs, ttls_us, capacities) -> tuple[np.ndarray, np.ndarray]:
    """Estimated hit tokens and the same over the last half of the requests,
    int64 [TTL, capacity]: up to the exact small LRU's size, its counts; above
    it, those plus 1 / rate for each sampled far reference resident (sampled
    distance below rate × C) and fresh."""
    n, rate, b = len(refs), refs.rate, refs.block
    d = np.concatenate(refs.distance) if refs.distance else np.zeros(0, dtype=np.int64)
    g = np.concatenate(refs.gap) if refs.gap else np.zeros(0, dtype=np.int64)
    req = np.concatenate(refs.request) if refs.request else np.zeros(0, dtype=np.int64)
    far = np.concatenate(refs.far) if refs.far else np.zeros(0, dtype=bool)
    small = refs.exact.shape[-1]
    below = np.concatenate([np.zeros(refs.exact.shape[:2] + (1,), dtype=np.int64),
                            np.cumsum(refs.exact, axis=-1)], axis=-1)  # [half, TTL, C]: references at d < C
    caps = np.asarray(capacities, dtype=np.int64)
    shape = (len(ttls_us), len(caps))
    hit, warm = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    for half, (out, part) in enumerate(((hit, np.ones(len(req), dtype=bool)), (warm, req >= n // 2))):
        for ti, t in enumerate(ttls_us):
            exact = below[half, refs.ttls_us.index(int(t))]
            sorted_d = np.sort(d[(d >= 0) & far & (g <= t) & part])
            # resident when d < rate × C: count the distances below it
            estimate = np.searchsorted(sorted_d, caps * rate, side="left") / rate
            out[ti] = np.where(caps <= small, exact[np.minimum(caps, small)] * b,
                               np.rint((exact[small] + estimate) * b)).astype(np.int64)
    return hit, warm
