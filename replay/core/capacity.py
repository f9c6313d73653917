"""A finite cache: every capacity at once, from one pass (semantics.md, "Capacity").

The contract: blocks of B tokens (whole blocks only), a block's identity the
chain of its cache (stream and model) and its whole token prefix; per replica
a pool of C blocks; for each request in processing order, the lookup (the run
of leading blocks that are resident and, with a TTL, last used within τ), then
its blocks touched deepest first, then the least recently used evicted down to
C. Residency is prefix-closed, so a block is resident in a pool of C exactly
when its LRU stack distance d (distinct blocks touched since its last touch)
is below C, and hit(τ, C) = min(blocks under τ, blocks under C).

How the distances come out of one pass. The trie (``replay.core.trie``)
records for every node the last request that walked through it (its *owner*).
A block's last touch is its owner's; within that request, blocks were touched
deepest first. So for a block at depth k owned by request j,

    d = (k − 1 − m_j) + Σ_{j' > j} F[j']

where F[j'] counts the blocks request j' still owns (not touched again since)
and m_j is the deepest of j's blocks a later request touched again: j still
owns exactly its blocks deeper than m_j, and those above the block were
touched after it. Along a request's path the owners change only where the
trie's walk changes step, so a request's distances are a few *segments*
(owner, blocks k1..k2) over which d rises by one per block; F is a Fenwick
tree over the replica's requests (compiled: ``_capacity.pyx`` is the one
implementation; its reference is the brute force ``tests/support/oracle.py``). The work is a trie walk per request plus a
few tree updates per segment — never a pass per capacity, and never a step
per block.

A replica's pool is shared by every cache routed to it: distances count the
blocks of all of them. Routing that is a function of the request alone
(round-robin, seeded random, sticky by stream key) is decided before the
pass (:class:`Router`); routing by cache state is simulated per capacity
elsewhere.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

import numpy as np

from replay.core.prompt import Prompt
from replay.core.streams import stream_key
from replay.times import INF_US
from replay.core.trie import Trie

try:  # the kernel: the recorder and the counts, compiled (replay/core/_capacity.pyx)
    from replay.core import _capacity as _compiled
except ImportError:  # pragma: no cover - an install without a compiler
    _compiled = None  # (the module still imports: Router and the rest; a pass says what is missing)

_NOT_BUILT = ("the capacity kernel (replay/core/_capacity.pyx) is not compiled: run "
              "`python setup.py build_ext --inplace` (or reinstall with a C compiler)")

ROUTINGS = ("round-robin", "random", "sticky")  # decided from the request alone


class Router:
    """The replica of each request as it comes, in processing order (routing that
    is a function of the request alone): ``round-robin`` — the i-th request goes
    to replica i mod R; ``random`` — seeded, reproducible (``n``: how many
    requests will come); ``sticky`` — by a hash of the request's stream key."""

    def __init__(self, replicas: int, routing: str, seed: int = 0, n: int = 0):
        if replicas < 1:
            raise ValueError("replicas must be ≥ 1")
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")
        self.replicas, self.routing = replicas, routing
        self.draws = np.random.default_rng(seed).integers(0, replicas, n) if routing == "random" else None
        self.memo: dict[str, int] = {}

    def __call__(self, i: int, key: str) -> int:
        """The replica of the ``i``-th request (0-based), of stream key ``key``."""
        if self.replicas == 1:
            return 0
        if self.routing == "round-robin":
            return i % self.replicas
        if self.routing == "random":
            return int(self.draws[i])
        r = self.memo.get(key)
        if r is None:
            digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
            r = self.memo[key] = int.from_bytes(digest, "big") % self.replicas
        return r


@dataclass
class Segments:
    """Every request's distance segments at one block size, flat: request r's
    segments are ``[offsets[r], offsets[r + 1])``, each with the gap (µs) since
    its owner's touch, the stack distance of its first block and its blocks
    k1..k2 (1-based, ascending; distances rise by one per block within a
    segment and never fall from one segment to the next)."""
    block: int
    prompt_tokens: np.ndarray   # int64, per request
    replica: np.ndarray         # int64, per request
    offsets: np.ndarray         # int64, n + 1
    gap: np.ndarray             # int64 µs, per segment
    distance: np.ndarray        # int64 blocks, per segment
    first: np.ndarray           # int64 k1
    last: np.ndarray            # int64 k2
    working_set: np.ndarray     # int64, per replica: distinct blocks ever touched
    ts: np.ndarray | None = None  # int64 µs, per request (what the cost model's busiest hour reads)

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def _recorder(block: int):
    if _compiled is None:
        raise RuntimeError(_NOT_BUILT)
    return _compiled.Recorder(block)


class CapacityPass:
    """Walks prompts (in processing order) for one stream mode and one routing,
    recording every request's distance segments at each block size."""

    def __init__(self, mode: str, blocks, replicas: int = 1, horizon_us: int = INF_US):
        self.mode = mode
        self.blocks = tuple(int(b) for b in blocks)
        if any(b < 1 for b in self.blocks):
            raise ValueError("block sizes must be ≥ 1")
        self.replicas = replicas
        self.horizon = horizon_us
        self._tries: list[dict] = [{} for _ in range(replicas)]
        self._count = [0] * replicas  # requests seen per replica: the owner number of the next one
        self._recorders = [[_recorder(b) for b in self.blocks] for _ in range(replicas)]
        self._tokens, self._replica, self._ts = array("q"), array("q"), array("q")

    def add(self, p: Prompt, replica: int, held: dict | None = None) -> None:
        """Walk one request on its replica (requests must come in processing order);
        ``held``: the request's, shared by every pass that walks it (``Trie.walk``)."""
        caches = self._tries[replica]
        key = (stream_key(self.mode, p.tenant, p.key, p.session), p.model)
        trie = caches.get(key)
        if trie is None:
            trie = caches[key] = Trie(self.horizon)
        me = self._count[replica]
        self._count[replica] += 1
        steps = trie.walk(p.symbols, p.ts, cum=p.cum, owner=me, held=held)
        for rec in self._recorders[replica]:
            rec.add(steps, p.n_tokens)
        self._tokens.append(p.n_tokens)
        self._replica.append(replica)
        self._ts.append(p.ts)

    def result(self) -> dict[int, Segments]:
        """The segments at each block size, requests in processing order."""
        replica = np.frombuffer(self._replica, dtype=np.int64).copy() if len(self._replica) else \
            np.zeros(0, dtype=np.int64)
        tokens = np.frombuffer(self._tokens, dtype=np.int64).copy() if len(self._tokens) else \
            np.zeros(0, dtype=np.int64)
        out = {}
        for bi, b in enumerate(self.blocks):
            per_replica = [self._recorders[r][bi].columns() for r in range(self.replicas)]
            out[b] = _interleave(b, replica, tokens, per_replica)
            out[b].ts = np.array(self._ts, dtype=np.int64)
            out[b].working_set = np.array([self._recorders[r][bi].total for r in range(self.replicas)],
                                          dtype=np.int64)
        return out


def _interleave(block: int, replica: np.ndarray, tokens: np.ndarray, per_replica: list) -> Segments:
    """Every replica's segments laid out in the requests' processing order."""
    n = len(replica)
    count = np.zeros(n, dtype=np.int64)
    starts = np.zeros(n, dtype=np.int64)  # where each request's rows start in the concatenation
    base = 0
    for r, (c, *_rest) in enumerate(per_replica):
        mine = np.flatnonzero(replica == r)
        count[mine] = c
        starts[mine] = base + np.cumsum(c) - c  # (each replica's own offsets)
        base += int(c.sum())
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    # row i of the output is row starts[r] + (i − offsets[r]) of the concatenation
    take = np.repeat(starts - offsets[:-1], count) + np.arange(offsets[-1], dtype=np.int64)
    cols = [np.concatenate([pr[k] for pr in per_replica]) if per_replica else np.zeros(0, dtype=np.int64)
            for k in range(1, 5)]
    gap, distance, first, last = (c[take] for c in cols)
    return Segments(block=block, prompt_tokens=tokens, replica=replica, offsets=offsets, gap=gap,
                    distance=distance, first=first, last=last, working_set=np.zeros(0, dtype=np.int64))


def hit_blocks(seg: Segments, ttl_us: int, capacity: int) -> np.ndarray:
    """Each request's hit in blocks under TTL τ and a pool of ``capacity`` blocks:
    min(blocks under τ, blocks under C)."""
    if _compiled is None:
        raise RuntimeError(_NOT_BUILT)
    return _compiled.hit_depths(seg.offsets, seg.gap, seg.distance, seg.first, seg.last, int(ttl_us),
                                int(capacity))


def counts(seg: Segments, ttls_us, capacities, warm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hit tokens, requests hit and the ``warm`` requests' hit tokens, each int64
    [TTL, capacity]."""
    if _compiled is None:
        raise RuntimeError(_NOT_BUILT)
    return _compiled.capacity_counts(seg.offsets, seg.gap, seg.distance, seg.first, seg.last,
                                     np.ascontiguousarray(warm, dtype=np.uint8), seg.block,
                                     np.ascontiguousarray(ttls_us, dtype=np.int64),
                                     np.ascontiguousarray(capacities, dtype=np.int64))
