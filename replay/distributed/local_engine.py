"""The replay on this machine's cores: worker processes walk shares of it
(``make("local", workers=N)``, N > 1; ``docs/distributed.md``).

**What the workers read.** The DuckDB file is held open read-write by this
process (the driver), so no other process can open it. The driver exports
what the walk reads instead, as Arrow IPC files in a temporary folder beside
the database: every segment once (``segments.arrow``), then the requests'
columns of ``replay.core.prompts.prompt_columns`` in processing order, a file
per chunk of ``time_ordered_chunks`` (the single pass's own reads), each
announced to the workers as soon as it is written. A worker memory-maps them
(the segments' tokens are views of the page cache, shared by the workers, not
copies) and assembles the prompts with the single pass's own code
(``replay.core.prompts.prompts_of``), so its walks start with the first chunk.

**Shares.** Whole (variant, mode) walk sets, biggest first onto the least
loaded worker, when there are at least as many sets as workers (the
benchmark's four modes: two a worker); else the sets split into the
partitions of ``replay.core.partition.Router`` (a stream mode by stream, the
global mode by its first K symbols plus the shallow task), one of each mode a
worker, every worker routing every prompt the same way — rows exact on their
own, global ones merged here with ``partition.merged_row``.

**Rows.** A worker turns its rows into an Arrow table itself
(``replay.core.walks.walks_table``) a part of the log at a time and writes it
to a file; the driver inserts each part as it is announced, through ``sink``
(``replay_stage`` records the sets current only after the last one: a failed
run leaves them stale, never half-current).

**Processes.** Started from the fork server (``multiprocessing``'s
``forkserver``): the driver has DuckDB's threads, which a plain ``fork``
would copy in whatever state they are (a held lock stays held in the child);
the fork server is a fresh interpreter that imports this module once, started
when the engine is made (it warms while the caller ingests and tokenizes), so
each worker is a cheap fork of it rather than a new interpreter importing
numpy, pyarrow and DuckDB again. Workers ignore Ctrl-C (the driver ends
them), are ended by the driver when the call ends however it ends, and die
with the fork server (``PR_SET_PDEATHSIG``), which leaves when the driver
does: none outlives the call. A worker that dies or raises stops the replay
with :class:`DistributedReplayFailed` (no retry: what killed it — memory,
mostly — would kill it again). The temporary folder is removed in every case.

Test hook: ``REPLAY_LOCAL_FAULT`` (``replay.distributed.faults``), NAME a
share's set (``prompt/global``) or partition (``global/shallow``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import pickle
import shutil
import signal
import tempfile
import traceback
from multiprocessing import popen_forkserver, spawn
from multiprocessing.connection import wait as wait_for

import pyarrow as pa
import pyarrow.compute as pc

from replay.core import partition
from replay.core.prompts import SegmentStore, prompt_columns, prompts_of, time_ordered_chunks
from replay.core.replay import Replayer, _collector_paused
from replay.core.streams import MODES
from replay.core.walks import walks_table
from replay.distributed import DistributedReplayFailed
from replay.distributed.faults import inject
from replay.store import db

FAULT_ENV = "REPLAY_LOCAL_FAULT"
CHUNK = 2_000          # requests per exported file (the single pass reads chunks of this size too)
PART = 2_000           # prompts a worker walks between writing its rows
MERGED_PER_SINK = 8_192  # global rows merged here before they go to the sink

# A set's walk time relative to the others' (a 3-day log, one process: tenant
# 0.090 s, key 0.081, session 0.086, global 0.119; the output's variant +15 %):
# what "biggest first" sorts by. Every worker also reads and assembles every prompt.
WEIGHT = {"global": 1.4, "tenant": 1.1, "session": 1.0, "key": 1.0}
OUTPUT_WEIGHT = 1.15


def plan(modes, variants, workers: int, depth: int = partition.DEFAULT_DEPTH) -> list[dict]:
    """Each worker's share: ``{"sets": [(variant, mode), ...]}`` when there are
    at least as many sets as workers, else ``{"tasks": [partition names],
    "modes", "variants", "parts", "depth"}``."""
    sets = [(v, m) for v in variants for m in modes]
    if len(sets) >= workers:
        def weight(s):
            return WEIGHT.get(s[1], 1.0) * (OUTPUT_WEIGHT if s[0] == "prompt+output" else 1.0)

        shares: list[list] = [[] for _ in range(workers)]
        loads = [0.0] * workers
        for s in sorted(sets, key=weight, reverse=True):
            w = min(range(workers), key=loads.__getitem__)
            shares[w].append(s)
            loads[w] += weight(s)
        return [{"sets": sh} for sh in shares]
    names = partition.Router(modes, workers, depth).names
    tasks: list[list] = [[] for _ in range(workers)]
    for name in names:
        part = name.split("/")[1]
        tasks[workers - 1 if part == partition.SHALLOW else int(part)].append(name)
    return [{"tasks": t, "modes": tuple(modes), "variants": tuple(variants), "parts": workers, "depth": depth}
            for t in tasks]


def share_names(share: dict) -> list[str]:
    return [f"{v}/{m}" for v, m in share["sets"]] if "sets" in share else list(share["tasks"])


class LocalEngine:
    """The replay split over ``workers`` processes of this machine (see the module docstring)."""

    name = "local"

    def __init__(self, workers: int = 2, depth: int = partition.DEFAULT_DEPTH, chunk: int = CHUNK):
        if workers < 2:
            raise ValueError("a local engine has at least 2 workers (1: the single pass, no engine)")
        self.workers, self.depth, self.chunk = int(workers), int(depth), int(chunk)
        self.most_workers = 0  # workers of the last replay, and their process ids (tests)
        self.last_pids: list[int] = []
        self._ctx = multiprocessing.get_context("forkserver")
        self._started_server = False
        self._warm()

    def _warm(self) -> None:
        """Start the fork server now, this module preloaded in it (it imports
        while the caller goes on); it stays for the next replays of this engine."""
        from multiprocessing import forkserver

        server = forkserver._forkserver
        if getattr(server, "_forkserver_pid", None) is None:
            self._ctx.set_forkserver_preload([__name__])
            self._started_server = True
        forkserver.ensure_running()

    def close(self) -> None:
        """Stop the fork server this engine started (the workers are gone already)."""
        if self._started_server:
            from multiprocessing import forkserver

            try:
                forkserver._forkserver._stop()
            except Exception:  # noqa: BLE001 - already gone
                pass
            self._started_server = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def replay(self, con, modes, variants, horizon_us: int, sink, progress=None, reset=None) -> dict:
        """Replay ``modes`` × ``variants`` in worker processes: every final row goes
        to ``sink`` (an Arrow table of `walks` rows, or a dict (variant, mode) →
        rows); returns ``{"_nodes": ...}`` like ``replay_prompts`` with a sink.
        ``reset`` is not used: a failed worker is not retried."""
        modes = tuple(m for m in MODES if m in modes)
        variants = tuple(variants)
        shares = plan(modes, variants, self.workers, self.depth)
        self.most_workers = len(shares)
        run = _Run(self, con, shares, variants, int(horizon_us), sink, progress, (variants[0], modes[0]))
        self.last_pids = run.pids
        try:
            return run.go()
        finally:
            run.end()


def _tempdir(con) -> str:
    """A temporary folder beside the database file (the same disk; the system's
    for an in-memory database)."""
    path = None
    try:
        path = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                           ).fetchone()[0]
    except Exception:  # noqa: BLE001 - an older DuckDB: the system's temp folder
        pass
    where = os.path.dirname(os.path.abspath(path)) if path and path != ":memory:" else None
    return tempfile.mkdtemp(prefix=".replay-walkers-", dir=where)


def _write(path: str, tbl: pa.Table, batch: int | None = None) -> str:
    """``tbl`` as an Arrow IPC file at ``path``, appearing whole (written beside, then renamed)."""
    with pa.OSFile(path + ".tmp", "wb") as sink, pa.ipc.new_file(sink, tbl.schema) as out:
        for b in tbl.to_batches(max_chunksize=batch):
            out.write_batch(b)
    os.replace(path + ".tmp", path)
    return path


def _read(path: str) -> pa.Table:
    """A file of :func:`_write`, memory-mapped (its buffers are views of the page cache)."""
    return pa.ipc.open_file(pa.memory_map(path)).read_all()


class _Run:
    """The driver's side of one replay."""

    def __init__(self, engine: LocalEngine, con, shares, variants, horizon: int, sink, progress, first):
        self.engine, self.con, self.shares, self.variants = engine, con, shares, variants
        self.horizon, self.sink, self.progress, self.first = horizon, sink, progress, first
        self.with_output = "prompt+output" in variants
        self.tmp = _tempdir(con)
        self.procs: list = []
        self.pids: list[int] = []
        self.conns: list = []
        self.done: dict[int, dict] = {}
        self.shallow = {v: {} for v in variants}  # global rows waiting for their other half
        self.deep = {v: {} for v in variants}
        self.boundary: dict[int, list] = {}  # request -> [its boundary, variants still to merge]
        self.merged: list = []
        self.merged_key = None

    def go(self) -> dict:
        segs = db.arrow(self.con, "SELECT seg_id, tokens FROM segments")
        seg_path = _write(os.path.join(self.tmp, "segments.arrow"), segs, batch=1 << 20)
        del segs
        fault = os.environ.get(FAULT_ENV) or None
        ctx = self.engine._ctx
        for i, share in enumerate(self.shares):
            mine, theirs = ctx.Pipe()
            proc = _Process(target=_work, name=f"replay-walker-{i}", daemon=True,
                               args=(theirs, seg_path, share, self.variants, self.horizon, self.with_output, fault))
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.pids.append(proc.pid)
            self.conns.append(mine)
        for k, tbl in enumerate(time_ordered_chunks(self.con, prompt_columns(self.with_output), self.engine.chunk)):
            path = _write(os.path.join(self.tmp, f"prompts-{k:06d}.arrow"), tbl)
            for i, c in enumerate(self.conns):
                self._send(i, c, path)
            self._collect(0)
        for i, c in enumerate(self.conns):
            self._send(i, c, None)
        while len(self.done) < len(self.procs):
            self._collect(None)
        if any(self.shallow.values()) or any(self.deep.values()):
            raise AssertionError("global rows left without their other half")
        self._flush_merged()
        nodes: dict[str, int] = {}
        for counts in self.done.values():
            for k, n in counts.items():
                nodes[k] = nodes.get(k, 0) + n
        return {"_nodes": nodes}

    def _send(self, i: int, conn, msg) -> None:
        try:
            conn.send(msg)
        except OSError:  # (it died: its sentinel says so at the next collect)
            self._collect(0)
            self._failed(i, None)

    def _collect(self, timeout) -> None:
        """Take what the workers announced (rows to insert, their end), waiting up
        to ``timeout`` (None: until something comes)."""
        live = [i for i in range(len(self.procs)) if i not in self.done]
        ready = set(wait_for([self.conns[i] for i in live] + [self.procs[i].sentinel for i in live], timeout))
        for i in live:
            if self.conns[i] in ready:
                self._drain(i)
        for i in live:
            if i not in self.done and self.procs[i].sentinel in ready:
                self._drain(i)  # (what it said before it ended)
                if i not in self.done:
                    self._failed(i, None)

    def _drain(self, i: int) -> None:
        conn = self.conns[i]
        try:
            while i not in self.done and conn.poll():
                self._take(i, conn.recv())
        except (EOFError, OSError):
            self.procs[i].join(5)
            self._failed(i, None)

    def _take(self, i: int, msg) -> None:
        kind, what = msg
        if kind == "rows":
            tbl = _read(what)
            os.unlink(what)  # (the mapping stays valid until the table is dropped)
            if self.progress is not None:
                v, m = self.first
                self.progress.update(int(pc.sum(pc.and_(pc.equal(tbl["variant"], v),
                                                        pc.equal(tbl["mode"], m))).as_py() or 0))
            self.sink(tbl)
        elif kind == "halves":
            with open(what, "rb") as f:
                shallow, deep, boundary = pickle.load(f)
            os.unlink(what)
            self.boundary.update((rid, [b, len(self.variants)]) for rid, b in boundary.items())
            for v in self.variants:
                self._join(v, shallow.get(v, ()), self.shallow[v], self.deep[v], shallow_first=False)
                self._join(v, deep.get(v, ()), self.deep[v], self.shallow[v], shallow_first=True)
        elif kind == "done":
            self.done[i] = what
        else:  # "error": the worker's traceback
            self._failed(i, what)

    def _join(self, v, rows, mine: dict, other: dict, shallow_first: bool) -> None:
        if self.merged_key not in (None, v):
            self._flush_merged()
        self.merged_key = v
        for r in rows:
            half = other.pop(r[0], None)
            if half is None:
                mine[r[0]] = r
                continue
            sh, deep = (half, r) if shallow_first else (r, half)
            self.merged.append(partition.merged_row(sh, deep, self._boundary(r[0])))
        if len(self.merged) >= MERGED_PER_SINK:
            self._flush_merged()

    def _boundary(self, rid: int) -> int | None:
        """The depth of a global prompt's first K symbols (None: a prompt of at most
        K), forgotten once every variant's row of it is merged."""
        got = self.boundary.get(rid)
        if got is None:
            return None
        got[1] -= 1
        if not got[1]:
            del self.boundary[rid]
        return got[0]

    def _flush_merged(self) -> None:
        if self.merged:
            key = (self.merged_key, "global")
            if self.progress is not None and key == self.first:
                self.progress.update(len(self.merged))
            self.sink({key: self.merged})
            self.merged = []

    def _failed(self, i: int, text: str | None) -> None:
        names = ", ".join(share_names(self.shares[i]))
        if text is None:
            code = self.procs[i].exitcode
            how = f"died (exit code {code})" if code is not None else "stopped answering"
        else:
            lines = [x for x in text.strip().splitlines() if x.strip()]
            how = f"raised: {lines[-1][:300] if lines else 'an error'}"
        raise DistributedReplayFailed(
            f"replay of {names} in local worker {i} {how}. No walk set was recorded current; run the command "
            "again, or without --workers") from None

    def end(self) -> None:
        """End the workers (those still running: an error, Ctrl-C) and remove the files."""
        for c in self.conns:
            c.close()
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(self.tmp, ignore_errors=True)


class _Popen(popen_forkserver.Popen):
    """A fork server's child that does not run the caller's main module again
    (``multiprocessing`` does, for functions defined there): a worker runs this
    module's function only, and the caller's script may not be safe to import
    (no ``if __name__ == "__main__"`` guard). Launched from the driver's main thread."""

    def _launch(self, process_obj):
        real = spawn.get_preparation_data

        def without_main(name):
            data = real(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data = real


class _Process(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


# --------------------------------------------------------------------------- the worker process

def _die_with_parent() -> None:
    """Be killed when the fork server (our parent) ends; it ends with the driver."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the driver still ends its workers
        pass


class _Sets:
    """Whole walk sets: one ``Replayer`` per variant, over its modes."""

    def __init__(self, sets, horizon: int):
        by_variant: dict[str, list] = {}
        for v, m in sets:
            by_variant.setdefault(v, []).append(m)
        self.replayers = [Replayer(tuple(m for m in MODES if m in ms), (v,), horizon) for v, ms in by_variant.items()]

    def walk(self, p) -> None:
        for r in self.replayers:
            r.walk(p)

    def take(self):
        out: dict = {}
        for r in self.replayers:
            out.update(r.take())
        return out, None

    def nodes(self) -> dict[str, int]:
        return {k: n for r in self.replayers for k, n in r.nodes().items()}


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


def _work(conn, seg_path: str, share: dict, variants, horizon: int, with_output: bool, fault) -> None:
    """A worker: walk its share over the prompts the driver announces, write its
    rows a part at a time, say when it is done (or what it raised)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the driver's: it ends us)
    _die_with_parent()
    try:
        with _collector_paused():
            nodes = _walk_share(conn, seg_path, share, variants, horizon, with_output, fault)
        conn.send(("done", nodes))
    except BaseException:  # noqa: BLE001 - told to the driver, which stops the replay
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)


def _walk_share(conn, seg_path, share, variants, horizon, with_output, fault) -> dict:
    folder = os.path.dirname(seg_path)
    me = f"{os.getpid()}"
    reader = pa.ipc.open_file(pa.memory_map(seg_path))
    segs = SegmentStore(table=reader.schema.empty_table())
    for b in range(reader.num_record_batches):  # (batch by batch: views of the mapping, no copy)
        segs.add(pa.Table.from_batches([reader.get_batch(b)]))
    walker = _Sets(share["sets"], horizon) if "sets" in share else _Tasks(share, variants, horizon)

    def tables():
        while (path := conn.recv()) is not None:
            yield _read(path)

    parts = 0

    def flush() -> None:
        nonlocal parts
        final, halves = walker.take()
        tbl = walks_table(final)
        if tbl is not None:
            parts += 1
            conn.send(("rows", _write(os.path.join(folder, f"rows-{me}-{parts:06d}.arrow"), tbl)))
        if halves is not None:
            parts += 1
            path = os.path.join(folder, f"halves-{me}-{parts:06d}.pickle")
            with open(path + ".tmp", "wb") as f:
                pickle.dump(halves, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(path + ".tmp", path)
            conn.send(("halves", path))

    for k, p in enumerate(prompts_of(tables(), segs), 1):
        if k == 1 and fault:
            for name in share_names(share):
                inject(fault, name)
        walker.walk(p)
        if k % PART == 0:
            flush()
    flush()
    return walker.nodes()
