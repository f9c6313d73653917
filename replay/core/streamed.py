"""The partitioned replay streamed to walkers that keep their partitions' tries.

``replay.core.partition`` proves each partition exact on its own; here the
driver reads the prompts once, in processing order, routes each as it comes
(``partition.Router``) and hands
them, a batch at a time, to a fixed set of *walkers* — each holding some
partitions' tries (``Replayer``), the segments it was sent and the
conversations it assembles — so neither the driver nor a walker ever holds the
log's prompts: the driver holds the batches in flight, which segments each
walker already has, and the global rows waiting for their other half.

Why it is the single pass's answer: a walker feeds each of its partitions that
partition's prompts in processing order (a batch is walked in order, and a
walker takes its batches in the order they were sent) — what the partition
argument of ``replay.core.partition`` needs; the rows are then merged as it
says (a global row spliced with its shallow row, whichever comes back first
waiting for the other). Tested against the single pass with walkers in this
process (:class:`LocalPool`); ``replay.distributed`` runs the same walkers as
Ray actors.

A pool is ``size`` walkers with ``submit(walker, batch, segments) -> handle``
(calls to one walker run in the order submitted), ``wait(handles) -> handle``
(one that is done), ``get(handle) -> rows by task name`` and
``nodes(walker) -> trie nodes by set``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from replay.core import partition
from replay.core.prompts import Conversations, SegmentStore
from replay.core.replay import Replayer, _collector_paused
from replay.core.streams import MODES
from replay.times import INF_US

BATCH = 2_048           # prompts (routed to a walker's partitions) per call
EVERY = 16_384          # prompts read between sending every walker what it has (bounds the waiting global rows)
CALLS_PER_WALKER = 2    # calls in flight per walker: one walked while the next travels
ROWS_PER_SINK = 8_192   # final rows held before they go to the sink


class WalkerFailed(RuntimeError):
    """A walker's call failed (``cause``: the pool's exception); ``names``: the
    partitions that call was walking."""

    def __init__(self, walker: int, names: list[str], cause: BaseException):
        super().__init__(f"walker {walker} ({', '.join(names)}): {cause}")
        self.walker, self.names, self.cause = walker, names, cause


class Walker:
    """One walker: its partitions' tries, the segments it was sent, and the
    conversations it assembled last (to build their next prompt from)."""

    def __init__(self, variants=("prompt",), horizon_us: int = INF_US):
        self.variants, self.horizon = tuple(variants), int(horizon_us)
        self.segments = SegmentStore(table=pa.table({"seg_id": pa.array([], pa.uint64()),
                                                     "tokens": pa.array([], pa.list_(pa.int32()))}))
        self.conversations = Conversations(self.segments)
        self.parts: dict[str, Replayer] = {}

    def feed(self, batch: list, segments: pa.Table | None = None) -> dict[str, dict]:
        """Walk ``batch`` (``(task name, prompt)`` in processing order), light
        prompts assembled from the segments sent so far plus ``segments``;
        returns each partition's rows of this batch by (variant, mode)."""
        if segments is not None:
            self.segments.add(segments)
        touched = {}
        last = None  # (a prompt routed to several partitions here is assembled once)
        with _collector_paused():
            for name, p in batch:
                part = touched.get(name)
                if part is None:
                    part = self.parts.get(name)
                    if part is None:
                        part = self.parts[name] = Replayer((name.split("/")[0],), self.variants, self.horizon)
                    touched[name] = part
                if p.symbols is not None:
                    part.walk(p)
                    continue
                if last is None or last[0] is not p.seg_ids or last[1] is not p.output_seg_ids:
                    symbols, _, _ = self.conversations.assemble((p.tenant, p.session or p.key), p.seg_ids.tolist())
                    out = p.output_seg_ids
                    last = (p.seg_ids, out, symbols,
                            self.segments.concat(out.tolist()) if out is not None and len(out) else None)
                p.symbols, p.output = last[2], last[3]
                part.walk(p)
                p.symbols = p.output = None
        return {name: part.take() for name, part in touched.items()}

    def nodes(self) -> dict[str, int]:
        return _summed(part.nodes() for part in self.parts.values())


class LocalPool:
    """Walkers in this process, each call walked when its result is asked for
    (:meth:`wait` answers the oldest call): the Ray pool's oracle in the tests."""

    def __init__(self, size: int, variants=("prompt",), horizon_us: int = INF_US):
        self.size = size
        self.walkers = [Walker(variants, horizon_us) for _ in range(size)]
        self._calls: dict[int, tuple] = {}
        self._next = 0
        self.busy = [0] * size
        self.most_busy = 0  # calls in flight to one walker, at most
        self.shipped: list[list[int]] = [[] for _ in range(size)]  # segment ids sent to each walker, in order

    def submit(self, walker: int, batch, segments):
        self._next += 1
        self._calls[self._next] = (walker, batch, segments)
        self.busy[walker] += 1
        self.most_busy = max(self.most_busy, self.busy[walker])
        if segments is not None:
            self.shipped[walker].extend(segments.column("seg_id").to_pylist())
        return self._next

    def wait(self, handles):
        return min(handles)

    def get(self, handle):
        walker, batch, segments = self._calls.pop(handle)
        self.busy[walker] -= 1
        return self.walkers[walker].feed(batch, segments)

    def nodes(self, walker: int) -> dict[str, int]:
        return self.walkers[walker].nodes()


class _Driver:
    """The driver's side of one streamed replay (see the module docstring)."""

    def __init__(self, pool, router: partition.Router, segs: SegmentStore | None, variants, sink, progress,
                 batch: int):
        self.pool, self.router, self.segs, self.sink, self.progress = pool, router, segs, sink, progress
        self.batch = batch
        self.variants = tuple(variants)
        self.first = (self.variants[0], router.modes[0])
        self.home = {name: i % pool.size for i, name in enumerate(router.names)}
        self.batches: list[list] = [[] for _ in range(pool.size)]
        self.sent: list[set] = [set() for _ in range(pool.size)]  # segment ids each walker has
        self.calls: dict = {}  # handle -> (walker, names)
        self.busy = [0] * pool.size
        self.boundary: dict[int, int] = {}  # global prompts longer than K, until their row is final
        # global rows waiting for their other half, by variant then request id
        self.shallow: dict[str, dict] = {v: {} for v in self.variants}
        self.deep: dict[str, dict] = {v: {} for v in self.variants}
        self.out: dict = {(v, m): [] for v in self.variants for m in router.modes}
        self.held = 0
        self.read = 0  # prompts routed so far
        self.finished: list[int] = []  # global requests whose rows the current call made final
        self.most_waiting = 0

    def run(self, prompts) -> dict[str, int]:
        for i, p in enumerate(prompts, 1):
            self.read = i
            routed, b = self.router.route(p)
            if b is not None:
                self.boundary[p.request_id] = b
            for name, q in routed:
                w = self.home[name]
                self.batches[w].append((name, q))
                if len(self.batches[w]) >= self.batch:
                    self.send(w)
            if i % EVERY == 0:
                self.send_all()
        self.send_all()
        while self.calls:
            self.collect()
        self.flush()
        if any(self.shallow.values()) or any(self.deep.values()):
            raise AssertionError("global rows left without their other half")
        return _summed(self.pool.nodes(w) for w in range(self.pool.size))

    def send_all(self) -> None:
        for w in range(self.pool.size):
            if self.batches[w]:
                self.send(w)
        if self.segs is not None:  # (a window of the segments drops those no prompt still to come uses)
            gone = self.segs.forget_before(self.read)
            for have in self.sent:
                have.difference_update(gone)

    def send(self, w: int) -> None:
        while self.busy[w] >= CALLS_PER_WALKER:
            self.collect()
        batch, self.batches[w] = self.batches[w], []
        segments = None
        if self.segs is not None:
            rows = {id(ids): ids for _, q in batch if q.symbols is None
                    for ids in (q.seg_ids, q.output_seg_ids) if ids is not None and len(ids)}
            if rows:  # (the batch's segments, each once, then those this walker lacks)
                have = self.sent[w]
                new = [s for s in np.unique(np.concatenate(list(rows.values()))).tolist() if s not in have]
                have.update(new)
                segments = self.segs.table(new) if new else None
        names = sorted({name for name, _ in batch})
        self.calls[self.pool.submit(w, batch, segments)] = (w, names)
        self.busy[w] += 1

    def collect(self) -> None:
        handle = self.pool.wait(list(self.calls))
        w, names = self.calls.pop(handle)
        try:
            result = self.pool.get(handle)
        except Exception as e:  # noqa: BLE001 - whatever the pool raises, named by its partitions
            raise WalkerFailed(w, names, e) from e
        self.busy[w] -= 1
        self.finished = []
        for name, rows in result.items():
            mode = name.split("/")[0]
            for (v, m), rs in rows.items():
                if mode != "global":
                    self.emit((v, m), rs)
                elif name.endswith(partition.SHALLOW):
                    self.join(v, rs, self.shallow[v], self.deep[v], shallow_first=False)
                else:
                    self.join(v, rs, self.deep[v], self.shallow[v], shallow_first=True)
        for rid in self.finished:  # (a call walks every variant: each of their rows is final now)
            self.boundary.pop(rid, None)
        self.most_waiting = max(self.most_waiting, sum(map(len, self.shallow.values())) +
                                sum(map(len, self.deep.values())))
        if self.held >= ROWS_PER_SINK:
            self.flush()

    def join(self, v: str, rows, mine: dict, other: dict, shallow_first: bool) -> None:
        done = []
        for r in rows:
            rid = r[0]
            half = other.pop(rid, None)
            if half is None:
                mine[rid] = r
                continue
            sh, deep = (half, r) if shallow_first else (r, half)
            done.append(partition.merged_row(sh, deep, self.boundary.get(rid)))
        self.finished.extend(r[0] for r in done)
        self.emit((v, "global"), done)

    def emit(self, key, rows) -> None:
        if not rows:
            return
        self.out[key].extend(rows)
        self.held += len(rows)
        if self.progress is not None and key == self.first:
            self.progress.update(len(rows))

    def flush(self) -> None:
        if self.held:
            self.sink(self.out)
            self.out = {k: [] for k in self.out}
            self.held = 0


def _summed(counts) -> dict[str, int]:
    """Trie nodes by set, summed (a set with none kept, as ``replay_prompts`` keeps it)."""
    total: Counter = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def replay_streamed(prompts, pool, sink, modes=MODES, variants=("prompt",), parts: int = partition.DEFAULT_PARTITIONS,
                    depth: int = partition.DEFAULT_DEPTH, segments: SegmentStore | None = None, progress=None,
                    batch: int = BATCH) -> dict:
    """The walks of ``replay_prompts(prompts, modes, variants)`` (the pool's
    walkers were made with its horizon), computed by ``pool``'s walkers
    partition by partition: every final row goes to ``sink`` (a dict (variant,
    mode) → rows, in no particular order); returns ``{"_nodes": ...}`` summed
    over the partitions. ``segments``: text prompts travel as segment ids and
    each walker is sent each segment it needs once."""
    router = partition.Router(modes, parts, depth, travel_light=segments is not None)
    driver = _Driver(pool, router, segments, variants, sink, progress, batch)
    return {"_nodes": driver.run(prompts)}
