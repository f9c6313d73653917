"""A worker process of ``replay.distributed.local_engine``: it walks its share
of the replay over the files the driver exports, and writes its rows.

Its share (``local_engine.plan``): whole walk sets over every prompt, stream
mode sets over the prompts of some groups of streams (only those prompts are
assembled), or partitions of ``replay.core.partition.Router``. It reads the
segments and each announced chunk of requests memory-mapped, assembles the
prompts with the single pass's code (``replay.core.prompts.prompts_of``),
walks them with its ``Replayer``s, and every ``PART`` prompts writes the rows
as an Arrow file (global halves of partitions: a pickle the driver merges)
and announces it; at the end it says ``done`` with its trie nodes, CPU
seconds and peak memory, or ``error`` with its traceback.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import traceback

import pyarrow as pa

from replay.core import partition
from replay.core.prompts import SegmentStore, prompts_of
from replay.core.replay import Replayer, _collector_paused
from replay.core.streams import MODES
from replay.core.walks import walks_table
from replay.distributed.faults import inject

PART = 2_000  # prompts a worker walks between writing its rows


def share_names(share: dict) -> list[str]:
    """What a share walks, by name (errors; the test hook's NAME)."""
    if "tasks" in share:
        return list(share["tasks"])
    return [f"{v}/{m}" for v, m in share["sets"]] + [f"{v}/{m} (part)" for v, m in share["scoped"]]


def write_table(path: str, tbl: pa.Table, batch: int | None = None) -> str:
    """``tbl`` as an Arrow IPC file at ``path``, appearing whole (written beside, then renamed)."""
    with pa.OSFile(path + ".tmp", "wb") as sink, pa.ipc.new_file(sink, tbl.schema) as out:
        for b in tbl.to_batches(max_chunksize=batch):
            out.write_batch(b)
    os.replace(path + ".tmp", path)
    return path


def read_table(path: str) -> pa.Table:
    """A file of :func:`write_table`, memory-mapped (its buffers are views of the page cache)."""
    return pa.ipc.open_file(pa.memory_map(path)).read_all()


def _die_with_parent() -> None:
    """Be killed when the fork server (our parent) ends; it ends with the driver."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the driver still ends its workers
        pass


class _Sets:
    """Whole walk sets (``sets``: every prompt) and, over the prompts of
    ``streams`` only, the stream-mode sets ``scoped``: a ``Replayer`` per
    variant of each."""

    def __init__(self, sets, scoped, streams, horizon: int):
        self.every = self._replayers(sets, horizon)
        self.scoped = self._replayers(scoped, horizon)
        self.streams = streams

    @staticmethod
    def _replayers(sets, horizon: int) -> list[Replayer]:
        by_variant: dict[str, list] = {}
        for v, m in sets:
            by_variant.setdefault(v, []).append(m)
        return [Replayer(tuple(m for m in MODES if m in ms), (v,), horizon) for v, ms in by_variant.items()]

    def wants(self, tenant, key, session) -> bool:
        return (tenant, key, session) in self.streams

    def walk(self, p) -> None:
        for r in self.every:
            r.walk(p)
        if self.scoped and (p.tenant, p.key, p.session) in self.streams:
            for r in self.scoped:
                r.walk(p)

    def take(self):
        out: dict = {}
        for r in self.every + self.scoped:
            out.update(r.take())
        return out, None

    def nodes(self) -> dict[str, int]:
        return {k: n for r in self.every + self.scoped for k, n in r.nodes().items()}


class _Tasks:
    """Partitions of ``partition.Router`` (every prompt routed, those of this
    worker's partitions walked); global rows are halves the driver merges."""

    def __init__(self, share: dict, variants, horizon: int):
        self.router = partition.Router(share["modes"], share["parts"], share["depth"])
        self.parts = {name: Replayer((name.split("/")[0],), variants, horizon) for name in share["tasks"]}
        self.boundary: dict[int, int] = {}

    def walk(self, p) -> None:
        routed, b = self.router.route(p)
        for name, q in routed:
            part = self.parts.get(name)
            if part is not None:
                part.walk(q)
                if b is not None and name.startswith("global/") and not name.endswith(partition.SHALLOW):
                    self.boundary[p.request_id] = b

    def take(self):
        final: dict = {}
        shallow: dict = {}
        deep: dict = {}
        for name, part in self.parts.items():
            for (v, m), rows in part.take().items():
                if m != "global":
                    final.setdefault((v, m), []).extend(rows)
                else:
                    (shallow if name.endswith(partition.SHALLOW) else deep).setdefault(v, []).extend(rows)
        halves = None
        if shallow or deep or self.boundary:
            halves, self.boundary = (shallow, deep, self.boundary), {}
        return final, halves

    def nodes(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for part in self.parts.values():
            for k, n in part.nodes().items():
                total[k] = total.get(k, 0) + n
        return total


def work(conn, share: dict, variants, horizon: int, fault) -> None:
    """A worker: walk its share over the prompts the driver announces, write its
    rows a part at a time, say when it is done (or what it raised)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the driver's: it ends us)
    _die_with_parent()
    try:
        with _collector_paused():
            nodes = _walk_share(conn, share, variants, horizon, fault)
        use = resource.getrusage(resource.RUSAGE_SELF)
        conn.send(("done", (nodes, (use.ru_utime + use.ru_stime, use.ru_maxrss / 1024.0))))
    except BaseException:  # noqa: BLE001 - told to the driver, which stops the replay
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)


def _walk_share(conn, share, variants, horizon, fault) -> dict:
    seg_path = conn.recv()  # (the driver's first message: the segments, then each chunk of requests)
    folder = os.path.dirname(seg_path)
    me = f"{os.getpid()}"
    reader = pa.ipc.open_file(pa.memory_map(seg_path))
    segs = SegmentStore(table=reader.schema.empty_table())
    for b in range(reader.num_record_batches):  # (batch by batch: views of the mapping, no copy)
        segs.add(pa.Table.from_batches([reader.get_batch(b)]))
    want = None
    if "tasks" in share:
        walker = _Tasks(share, variants, horizon)
    else:
        walker = _Sets(share["sets"], share["scoped"], share["streams"], horizon)
        if not share["sets"]:  # (no global set: only its streams' prompts are assembled)
            want = walker.wants

    def tables():
        while (path := conn.recv()) is not None:
            yield read_table(path)

    parts = 0

    def flush() -> None:
        nonlocal parts
        final, halves = walker.take()
        tbl = walks_table(final)
        if tbl is not None:
            parts += 1
            conn.send(("rows", write_table(os.path.join(folder, f"rows-{me}-{parts:06d}.arrow"), tbl)))
        if halves is not None:
            parts += 1
            path = os.path.join(folder, f"halves-{me}-{parts:06d}.pickle")
            with open(path + ".tmp", "wb") as f:
                pickle.dump(halves, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(path + ".tmp", path)
            conn.send(("halves", path))

    for k, p in enumerate(prompts_of(tables(), segs, want), 1):
        if k == 1 and fault:
            for name in share_names(share):
                inject(fault, name)
        walker.walk(p)
        if k % PART == 0:
            flush()
    flush()
    return walker.nodes()
