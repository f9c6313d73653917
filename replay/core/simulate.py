"""The capacity contract simulated block by block, one capacity at a time.

For the rules the one-pass engine (``replay.core.capacity``) cannot serve:
routing by cache state (``prefix``: each request to the replica where its hit
would be longest, ties to the replica that has served the fewest requests so
far, then the lowest index — the cache-aware routers of SGLang, Dynamo and
llm-d) and clairvoyant eviction (``belady``: evict the resident block whose
next touch on that replica is farthest away, never again counting as
farthest; ties to the deepest block, then the least recently used — a bound on
what a smarter eviction could add). Also the straightforward per-capacity LRU
the benchmark compares the one pass with. Eviction policies are small objects
behind one interface (:data:`POLICIES`: told of each touch, asked for a victim),
as SGLang's ``evict_policy.py`` has one class per policy. Tiers need no policy
here: an LRU hierarchy is LRU order cut into tiers, which the one-pass engine
reads off its stack distances (``replay.core.tiers``).

A block's identity is its cache (stream and model) and its whole token prefix,
interned to an integer as the log is read (exact: no hash to collide); only
whole blocks count. With the routing decided in advance eviction does not
depend on the TTL, so one simulation answers every TTL: a resident run's gaps
never fall going deeper (a parent is touched whenever its child is), and the
hit under τ is the leading run of gaps ≤ τ.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from replay.core.prompt import Prompt, trace_blocks
from replay.core.streams import stream_key
from replay.times import INF_US

NEVER = np.iinfo(np.int64).max  # the next touch of a block no later request touches


@dataclass
class BlockLog:
    """Every request (processing order) as its whole blocks' ids, for one mode and block size."""
    block: int
    ids: list = field(default_factory=list)   # np.ndarray of int64 per request
    ts: list = field(default_factory=list)    # int µs
    prompt_tokens: list = field(default_factory=list)
    keys: list = field(default_factory=list)  # stream key per request (sticky routing)
    distinct: int = 0                         # blocks ever seen: one pool's working set

    def __len__(self) -> int:
        return len(self.ids)


class BlockLogBuilder:
    """Builds a :class:`BlockLog` a prompt at a time (in processing order)."""

    def __init__(self, mode: str, block: int):
        self.mode, self.log = mode, BlockLog(block)
        self._intern: dict = {}  # (parent id or cache, the block's symbols) -> id

    def add(self, p: Prompt) -> None:
        key = stream_key(self.mode, p.tenant, p.key, p.session)
        b, intern = self.log.block, self._intern
        if p.cum is not None:  # a block trace: its symbols are blocks already
            (per, n_blocks), syms = trace_blocks(p, b), p.symbols
        else:
            per, n_blocks, syms = b, len(p.symbols) // b, p.symbols
        data = np.ascontiguousarray(syms, dtype=np.int64).tobytes()
        ids = np.empty(n_blocks, dtype=np.int64)
        parent: object = (key, p.model)
        for k in range(n_blocks):
            parent = intern.setdefault((parent, data[8 * k * per:8 * (k + 1) * per]), len(intern))
            ids[k] = parent
        self.log.ids.append(ids)
        self.log.ts.append(p.ts)
        self.log.prompt_tokens.append(p.n_tokens)
        self.log.keys.append(key)
        self.log.distinct = len(intern)


def block_log(prompts, mode: str, block: int) -> BlockLog:
    """Each prompt's whole blocks as ids (``prompts`` in processing order)."""
    builder = BlockLogBuilder(mode, block)
    for p in prompts:
        builder.add(p)
    return builder.log


def simulate(log: BlockLog, capacity: int, ttls_us=(INF_US,), replicas: int = 1,
             replica_of: np.ndarray | None = None, routing: str = "fixed",
             policy: str = "lru") -> tuple[np.ndarray, np.ndarray]:
    """Each request's hit in tokens and its replica, int64 [TTL, request], under
    one capacity (blocks per replica): ``routing="prefix"`` routes by cache state
    (one simulation per TTL, since the hits it routes by depend on it), else
    ``replica_of`` (processing order) does; ``policy`` ``lru`` or ``belady``
    (not with prefix routing: the future would depend on the routing being
    simulated)."""
    ttls = np.atleast_1d(np.asarray(ttls_us, dtype=np.int64))
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if routing == "prefix":
        if POLICIES[policy].needs_future:
            raise ValueError("belady needs the routing decided in advance, not by cache state")
        runs = [_run(log, capacity, ttls[i:i + 1], replicas, None, policy) for i in range(len(ttls))]
        return np.vstack([h for h, _ in runs]), np.vstack([w for _, w in runs])
    if replica_of is None:
        replica_of = np.zeros(len(log), dtype=np.int64)
    hit, where = _run(log, capacity, ttls, replicas, replica_of, policy)
    return hit, np.broadcast_to(where, hit.shape)


def _run(log: BlockLog, capacity: int, ttls: np.ndarray, replicas: int, replica_of, policy: str):
    n = len(log)
    kind = POLICIES[policy]
    nexts = _next_touches(log, replica_of) if kind.needs_future else None
    pools = [_Pool(capacity, kind()) for _ in range(replicas)]
    served = [0] * replicas
    hit = np.zeros((len(ttls), n), dtype=np.int64)
    where = np.zeros(n, dtype=np.int64)
    for i in range(n):
        ids, t = log.ids[i], log.ts[i]
        if replica_of is None:  # prefix: the longest hit, then the fewest served, then the lowest index
            runs = [pools[q].run(ids, t) for q in range(replicas)]
            rep = max(range(replicas), key=lambda q: (_under(runs[q], ttls[0]), -served[q], -q))
        else:
            rep = int(replica_of[i])
        where[i] = rep
        served[rep] += 1
        gaps = pools[rep].run(ids, t)
        for ti, ttl in enumerate(ttls):
            hit[ti, i] = _under(gaps, ttl) * log.block
        pools[rep].touch(ids, t, None if nexts is None else nexts[i])
    return hit, where


def _under(gaps: list, ttl: int) -> int:
    """How many leading blocks of a resident run were last used within ``ttl``."""
    return bisect.bisect_right(gaps, ttl)


class LRU:
    """Evict the least recently used block: the pool's own order (its
    ``used`` mapping, least recent first) says which, so nothing to keep."""
    needs_future = False

    def touched(self, block: int, depth: int, next_touch: int) -> None:
        pass

    def victim(self, used: OrderedDict) -> int:
        return next(iter(used))

    def compact(self, used: OrderedDict) -> None:
        pass


class Belady:
    """Evict the block whose next touch on this replica is farthest away (never
    again: farthest of all), ties to the deepest block, then the least
    recently used: a heap of (−next touch, −depth, touch order), entries of
    blocks touched again since (or evicted) skipped and now and then dropped."""
    needs_future = True

    def __init__(self):
        self.heap: list = []
        self.version: dict = {}  # block -> touch order of its live heap entry
        self.order = 0

    def touched(self, block: int, depth: int, next_touch: int) -> None:
        self.order += 1
        self.version[block] = self.order
        heapq.heappush(self.heap, (-int(next_touch), -depth, self.order, block))

    def victim(self, used: OrderedDict) -> int:
        while True:
            _, _, order, block = heapq.heappop(self.heap)
            if self.version.get(block) == order:
                del self.version[block]
                return block

    def compact(self, used: OrderedDict) -> None:
        if len(self.heap) > 4 * len(used) + 1024:
            self.heap = [e for e in self.heap if self.version.get(e[3]) == e[2]]
            heapq.heapify(self.heap)


#: eviction policies by name: each told of every touch, asked for a victim
POLICIES = {"lru": LRU, "belady": Belady}


class _Pool:
    """One replica's resident blocks (last-touch time, least recent first) and the
    eviction policy that picks what leaves when they are more than ``capacity``."""

    def __init__(self, capacity: int, policy):
        self.capacity, self.policy = capacity, policy
        self.used: OrderedDict = OrderedDict()  # id -> last touch time, least recent first

    def run(self, ids, t: int) -> list[int]:
        """The gaps since last use of the request's leading resident blocks."""
        gaps, used = [], self.used
        for b in ids.tolist():
            last = used.get(b)
            if last is None:
                break
            gaps.append(t - last)
        return gaps

    def touch(self, ids, t: int, nexts) -> None:
        used, ids, policy = self.used, ids.tolist(), self.policy
        for d in range(len(ids) - 1, -1, -1):  # deepest first: a parent is never less recent than its child
            b = ids[d]
            used[b] = t
            used.move_to_end(b)
            policy.touched(b, d, NEVER if nexts is None else nexts[d])
        while len(used) > self.capacity:
            del used[policy.victim(used)]
        policy.compact(used)


def _next_touches(log: BlockLog, replica_of) -> list[np.ndarray]:
    """For each request's blocks, the position of the next request on the same
    replica that touches the same block (NEVER when none does)."""
    nxt: dict = {}
    out: list = [None] * len(log.ids)
    for i in range(len(log.ids) - 1, -1, -1):
        rep = int(replica_of[i])
        arr = np.empty(len(log.ids[i]), dtype=np.int64)
        for d, b in enumerate(log.ids[i].tolist()):
            arr[d] = nxt.get((rep, b), NEVER)
            nxt[(rep, b)] = i
        out[i] = arr
    return out
