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

**Shares** (:func:`plan`). Each global walk set is walked whole by one
worker (it needs every prompt in one trie); the stream-mode sets are divided
by groups of streams that hold whole caches of every mode asked for (the
connected components of the requests' tenant, key and session streams:
:func:`components`), each group to the worker it loads least — a worker
walking a global set assembles every prompt anyway, the others only their
groups' (``local_worker``). Exact without merging: a cache's requests are all
in one group, in processing order. With no stream mode and fewer global sets
than workers, the sets are split into the partitions of
``replay.core.partition.Router`` (the first K symbols plus the shallow task),
one a worker, and the global halves merged here (``partition.merged_row``).

**Rows.** A worker turns its rows into an Arrow table itself
(``replay.core.walks.walks_table``) a part of the log at a time and writes it
to a file; the driver inserts each part as it is announced, through ``sink``
(``replay_stage`` records the sets current only after the last one: a failed
run leaves them stale, never half-current).

**Processes.** Started from the fork server (``multiprocessing``'s
``forkserver``): the driver has DuckDB's threads, which a plain ``fork``
would copy in whatever state they are (a held lock stays held in the child);
the fork server is a fresh interpreter that imports ``local_worker`` once, started
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
import tempfile
from multiprocessing import popen_forkserver, spawn
from multiprocessing.connection import wait as wait_for

import pyarrow.compute as pc

from replay.core import partition
from replay.core.prompts import REPLAYABLE, prompt_columns, time_ordered_chunks
from replay.core.streams import MODES, stream_key
from replay.distributed import DistributedReplayFailed
from replay.distributed.local_worker import read_table, work, write_table, share_names
from replay.store import db

FAULT_ENV = "REPLAY_LOCAL_FAULT"
CHUNK = 2_000          # requests per exported file (the single pass reads chunks of this size too)
MERGED_PER_SINK = 8_192  # global rows merged here before they go to the sink

# Costs per logical prompt token, relative to assembling it (a 3-day log, one
# process: assembling ~0.3-0.4 s, walking 0.08-0.09 s a stream mode, 0.12 s the
# global one): what the plan balances.
ASSEMBLE, WALK_STREAM, WALK_GLOBAL = 1.0, 0.22, 0.3

#: the per-stream work a plan divides: (tenant, key, session, logical tokens) of the replayable requests
STREAMS_SQL = f"""SELECT r.tenant, r.prompt_cache_key, r.session,
                         sum(coalesce(p.n_tokens, r.input_length, 0))::BIGINT AS w
                  FROM requests r LEFT JOIN prompts p USING (request_id) WHERE {REPLAYABLE} GROUP BY ALL"""


def components(modes, streams) -> tuple[dict, list[float]]:
    """The requests' (tenant, key, session) grouped so that every cache of every
    stream mode of ``modes`` lies in one group (the connected components of
    their stream keys): ``{(tenant, key, session): group}`` and each group's tokens."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = x = parent[parent[x]]
        return x

    keys = []
    for tenant, key, session, _ in streams:
        ks = [stream_key(m, tenant, key, session) for m in modes]
        keys.append(ks[0])
        for k in ks[1:]:
            a, b = find(ks[0]), find(k)
            if a != b:
                parent[a] = b
    ids: dict = {}
    group, weight = {}, []
    for (tenant, key, session, w), k in zip(streams, keys):
        g = ids.setdefault(find(k), len(ids))
        if g == len(weight):
            weight.append(0.0)
        weight[g] += float(w or 0)
        group[(tenant, key, session)] = g
    return group, weight


def plan(modes, variants, workers: int, depth: int = partition.DEFAULT_DEPTH, streams=()) -> list[dict]:
    """Each worker's share (workers without one are not started):

    * ``{"sets": [...], "scoped": [...], "streams": {(tenant, key, session), ...}}``:
      whole global walk sets over every prompt (biggest first onto the least
      loaded worker), and the stream-mode sets ``scoped`` over the prompts of
      ``streams`` only — groups of streams holding whole caches of every mode
      (:func:`components`), so a worker assembles only the prompts it walks;
    * with no stream mode and fewer global sets than workers, ``{"tasks":
      [partition names], "modes", "variants", "parts", "depth"}``: partitions
      of ``partition.Router``, the global halves merged by the driver.

    ``streams``: rows of :data:`STREAMS_SQL`."""
    sets = [(v, m) for v in variants for m in modes]
    glob = [s for s in sets if s[1] == "global"]
    scoped = [s for s in sets if s[1] != "global"]
    if not scoped and len(glob) < workers:
        names = partition.Router(modes, workers, depth).names
        tasks: list[list] = [[] for _ in range(workers)]
        for name in names:
            part = name.split("/")[1]
            tasks[workers - 1 if part == partition.SHALLOW else int(part)].append(name)
        return [{"tasks": t, "modes": tuple(modes), "variants": tuple(variants), "parts": workers, "depth": depth}
                for t in tasks]
    group, weight = components([m for m in MODES if m in modes and m != "global"], list(streams))
    total = sum(weight) or 1.0
    shares = [{"sets": [], "scoped": [], "streams": set()} for _ in range(workers)]
    loads = [0.0] * workers
    everything = [False] * workers  # (assembles every prompt: walks a global set)
    for s in glob:
        w = min(range(workers), key=loads.__getitem__)
        shares[w]["sets"].append(s)
        loads[w] += WALK_GLOBAL * total + (0.0 if everything[w] else ASSEMBLE * total)
        everything[w] = True
    mine: list[list[int]] = [[] for _ in range(workers)]
    walk = WALK_STREAM * len(scoped)
    for g in sorted(range(len(weight)), key=weight.__getitem__, reverse=True):
        cost = [weight[g] * (walk + (0.0 if everything[w] else ASSEMBLE)) for w in range(workers)]
        w = min(range(workers), key=lambda w: loads[w] + cost[w])
        mine[w].append(g)
        loads[w] += cost[w]
    for w, gs in enumerate(mine):
        if gs:
            chosen = set(gs)
            shares[w]["scoped"] = list(scoped)
            shares[w]["streams"] = {t for t, g in group.items() if g in chosen}
    return [sh for sh in shares if sh["sets"] or sh["scoped"]]


class LocalEngine:
    """The replay split over ``workers`` processes of this machine (see the module docstring)."""

    name = "local"

    def __init__(self, workers: int = 2, depth: int = partition.DEFAULT_DEPTH, chunk: int = CHUNK):
        if workers < 2:
            raise ValueError("a local engine has at least 2 workers (1: the single pass, no engine)")
        self.workers, self.depth, self.chunk = int(workers), int(depth), int(chunk)
        self.most_workers = 0  # workers of the last replay, and their process ids (tests)
        self.last_pids: list[int] = []
        self.worker_stats: dict[str, list] = {}  # each worker's CPU seconds and peak RSS (MB), last replay
        self._ctx = multiprocessing.get_context("forkserver")
        self._started_server = self._started_tracker = False
        self._warm()

    def _warm(self) -> None:
        """Start the fork server now, ``local_worker`` preloaded in it (it imports
        while the caller goes on); it stays for the next replays of this engine."""
        from multiprocessing import forkserver, resource_tracker

        server = forkserver._forkserver
        if getattr(server, "_forkserver_pid", None) is None:
            self._ctx.set_forkserver_preload(["replay.distributed.local_worker"])
            self._started_server = True
        self._started_tracker = getattr(resource_tracker._resource_tracker, "_pid", 0) is None
        forkserver.ensure_running()  # (and multiprocessing's resource tracker, which it needs)

    def close(self) -> None:
        """Stop the fork server (and resource tracker) this engine started: the
        workers are gone already, and no helper process outlives the engine."""
        from multiprocessing import forkserver, resource_tracker

        for started, helper in ((self._started_server, forkserver._forkserver),
                                (self._started_tracker, resource_tracker._resource_tracker)):
            if started:
                try:
                    helper._stop()
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self._started_server = self._started_tracker = False

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
        streams = db.arrow(con, STREAMS_SQL).to_pylist() if any(m != "global" for m in modes) else []
        shares = plan(modes, variants, self.workers, self.depth,
                      [(r["tenant"], r["prompt_cache_key"], r["session"], r["w"]) for r in streams])
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
    try:
        return tempfile.mkdtemp(prefix=".replay-walkers-", dir=where)
    except OSError:  # (a folder this process cannot write in)
        return tempfile.mkdtemp(prefix=".replay-walkers-")


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
        self.done: dict[int, tuple] = {}  # worker -> (trie nodes by set, (CPU seconds, peak RSS MB))
        self.shallow = {v: {} for v in variants}  # global rows waiting for their other half
        self.deep = {v: {} for v in variants}
        self.boundary: dict[int, list] = {}  # request -> [its boundary, variants still to merge]
        self.merged: list = []
        self.merged_key = None

    def go(self) -> dict:
        fault = os.environ.get(FAULT_ENV) or None
        for i, share in enumerate(self.shares):  # (first: they start while the segments are written)
            mine, theirs = self.engine._ctx.Pipe()
            proc = _Process(target=work, name=f"replay-walker-{i}", daemon=True,
                            args=(theirs, share, self.variants, self.horizon, fault))
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.pids.append(proc.pid)
            self.conns.append(mine)
        segs = db.arrow(self.con, "SELECT seg_id, tokens FROM segments")
        seg_path = write_table(os.path.join(self.tmp, "segments.arrow"), segs, batch=1 << 20)
        del segs
        for i, c in enumerate(self.conns):
            self._send(i, c, seg_path)
        for k, tbl in enumerate(time_ordered_chunks(self.con, prompt_columns(self.with_output), self.engine.chunk)):
            path = write_table(os.path.join(self.tmp, f"prompts-{k:06d}.arrow"), tbl)
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
        stats = [self.done[i][1] for i in sorted(self.done)]
        self.engine.worker_stats = {"cpu_s": [s[0] for s in stats], "peak_rss_mb": [s[1] for s in stats]}
        nodes: dict[str, int] = {}
        for counts, _ in self.done.values():
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
            tbl = read_table(what)
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
    (``multiprocessing`` does, for functions defined there): a worker runs
    ``local_worker.work`` only, and the caller's script may not be safe to import
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
