"""The replay's partitions as Ray tasks (``--engine ray``).

The driver reads the prompts from DuckDB (``iter_prompts``: the same prompts,
in the same order, as the single pass) and splits them into the tasks of
``replay.core.partition.plan`` — *light*: a text prompt keeps its segment ids,
not its tokens — and ships each task, as an Arrow table, the part of the
segments table its prompts use (each unique token once); the task assembles
its prompts again as it walks them, as the driver would. So the driver holds
the log's segment ids rather than its tokens, a task ships a few bytes a
segment plus its partition's unique tokens instead of each prompt's whole
conversation (the day's tasks: ~500 MB of tokens before), and a worker holds
its partition's unique tokens, not the log's.
Why not request ids + Parquet on shared storage: the DuckDB file is locked by
the driver's connection, and a local or single-node cluster has no shared
storage to speak of. (A cluster reading logs from object storage would export
each partition's prompts to Parquet instead; the tasks would not change.)

Every task runs ``partition.run_task``; the driver turns each result into final
rows (``partition.finish``: the global partitions spliced with the shallow
task's rows) and hands them to ``sink`` as they come — ``replay_stage`` stores
them with ``insert_walks`` and records the walk sets current only after the
last one, so a failed run leaves them stale, never half-current.

Failures: a worker that dies (killed, out of memory) is retried by Ray up to
``max_retries`` times with the same argument; a task that still fails, or raises,
stops the replay with :class:`DistributedReplayFailed` naming the partition,
after cancelling the rest. The engine started for a command (no ``address``, and
no Ray session open already) is shut down when the command ends, error and
Ctrl-C included, so no worker outlives it; with ``address`` it connects to that
cluster and disconnects at the end (the cluster keeps running; this job's
workers go with the driver).

Test hook: ``REPLAY_RAY_FAULT`` = ``exit-once:TASK:MARKER`` (the task's worker
dies on its first attempt: ``os._exit`` unless MARKER exists, which it creates
first), ``exit:TASK`` (dies on every attempt), ``raise:TASK`` (raises) or
``sleep:TASK:SECONDS`` (time to interrupt the command), read in the driver
and handed to the tasks.
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np
import polars as pl

from replay.core import partition
from replay.distributed import DistributedIngestFailed, DistributedReplayFailed, EngineUnavailable
from replay.core.prompts import SegmentStore, iter_prompts

FAULT_ENV = "REPLAY_RAY_FAULT"
_END = object()
DEFAULT_RETRIES = 3


def _run(task: partition.Task, variants, horizon_us: int, segments, fault: str | None):
    if fault:
        _inject(fault, task.name)
    return partition.run_task(task, variants, horizon_us, SegmentStore(table=segments))


def _apply(fn, item, *args):
    return fn(item, *args)


class _Segments:
    """The segments table, and the part of it each task needs (its prompts' and
    outputs' segments): a worker holds its partition's unique tokens, not the log's."""

    def __init__(self, con):
        self.table = SegmentStore.read_table(con)
        ids = self.table.column("seg_id").to_numpy()
        self._order = np.argsort(ids, kind="stable")
        self._sorted = ids[self._order]

    def of(self, task: partition.Task):
        parts = [x for p in task.prompts for x in (p.seg_ids, p.output_seg_ids)
                 if p.symbols is None and x is not None and len(x)]
        if not parts:
            return self.table.slice(0, 0)
        need = pl.Series(np.concatenate(parts)).unique().to_numpy()
        return self.table.take(self._order[np.searchsorted(self._sorted, need)])


def _inject(fault: str, name: str) -> None:
    kind, _, rest = fault.partition(":")
    target, _, marker = rest.partition(":")
    if target != name:
        return
    if kind == "exit-once":
        if os.path.exists(marker):
            return
        with open(marker, "w") as f:
            f.write(name)
        os._exit(1)
    if kind == "exit":
        os._exit(1)
    if kind == "raise":
        raise RuntimeError(f"injected failure in task {name}")
    if kind == "sleep":  # (time to interrupt the command)
        time.sleep(float(marker))


class RayEngine:
    """Partitioned replay on a Ray cluster (see the module docstring)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, partitions: int | None = None,
                 depth: int = partition.DEFAULT_DEPTH, max_retries: int = DEFAULT_RETRIES,
                 prepare_parts: bool | None = None):
        self.address = address
        self.num_cpus = num_cpus
        self.partitions = partitions
        self.depth = int(depth)
        self.max_retries = int(max_retries)
        self._owned = False
        self._started = False
        self.mapped = 0  # items handed to ``map_ordered``'s tasks (what ran there, not here)
        self.prepare_parts = prepare_parts

    # ---- the session ------------------------------------------------------
    def start(self):
        import ray

        if not self._started:
            if ray.is_initialized():  # a session the caller opened (a notebook, the tests): theirs to close
                self._owned = False
            else:
                opts = {"include_dashboard": False, "log_to_driver": False}
                if self.address:
                    try:
                        ray.init(address=self.address, **opts)
                    except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, an auth error
                        raise EngineUnavailable(_unreachable(self.address, e)) from None
                else:
                    ray.init(num_cpus=self.num_cpus, **opts)
                self._owned = True
            self._started = True
        return ray

    def close(self) -> None:
        if self._started and self._owned:
            import ray

            ray.shutdown()
        self._started = self._owned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _failed(self, ray, e: BaseException) -> str:
        """How a task failed, for the error that stops the command."""
        how = ("raised" if isinstance(e, ray.exceptions.RayTaskError) else
               f"failed ({type(e).__name__}) after {self.max_retries} retries")
        return f"{how} on Ray: {_first_line(e).rstrip('.')}"

    # ---- whole files -------------------------------------------------------
    def prepares_parts(self) -> bool:
        """Should the tasks parsing files also render and encode their body parts
        (``replay.distributed.files``)? ``prepare_parts`` when given; else only
        on a cluster with more CPUs than this machine: here the encoder process
        already does it on a core of its own, while ingest runs, faster than
        tasks that each load the reference tokenizer (bench/README.md)."""
        if self.prepare_parts is not None:
            return bool(self.prepare_parts)
        ray = self.start()
        return int(ray.cluster_resources().get("CPU", 1)) > (os.cpu_count() or 1)

    def map_ordered(self, fn, items, *args):
        """``(item, fn(item, *args))`` for each of ``items``, in their order, each
        computed by a Ray task (at most CPUs + 1 in flight, so results wait for
        the caller only a few at a time). A task that fails after its retries
        stops the whole with :class:`DistributedIngestFailed` naming its item;
        the tasks still running are cancelled (also when the caller stops early)."""
        ray = self.start()
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries)(_apply)  # (fn may be a partial)
        name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "task")
        todo = iter(items)
        flight: collections.deque = collections.deque()

        def submit() -> None:
            while len(flight) <= cpus:
                item = next(todo, _END)
                if item is _END:
                    return
                flight.append((item, remote.options(name=f"replay:{name}").remote(fn, item, *args)))
                self.mapped += 1

        try:
            submit()
            while flight:
                item, ref = flight.popleft()
                try:
                    got = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise DistributedIngestFailed(
                        f"{name} of {item} {self._failed(ray, e)}. The files before "
                        "it are loaded (each in its own transaction); run the command again to load the rest, "
                        "or with --engine local") from None
                submit()
                yield item, got
        finally:
            _cancel(ray, [ref for _, ref in flight])  # (a failure, Ctrl-C, or a caller that stopped early)

    # ---- the replay -------------------------------------------------------
    def replay(self, con, modes, variants, horizon_us: int, sink, progress=None) -> dict:
        """Replay ``modes`` × ``variants`` partition by partition on Ray; every
        final row goes to ``sink`` (a dict (variant, mode) → rows); returns
        ``{"_nodes": ...}`` like ``replay_prompts`` with a sink."""
        ray = self.start()
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        parts = self.partitions or 2 * cpus
        plan = partition.plan(iter_prompts(con, with_output="prompt+output" in variants), modes, parts,
                              self.depth, travel_light=True)
        segments = _Segments(con)
        fault = os.environ.get(FAULT_ENV) or None
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries)(_run)
        variants = tuple(variants)
        shallow_name = f"global/{partition.SHALLOW}"
        # the shallow task first (the global partitions wait for its rows); a few
        # tasks in flight at a time, so the object store holds those tasks'
        # prompts and segments, not the whole log's
        queue = sorted(plan.tasks, key=lambda t: t.name == shallow_name)  # (popped from the end)
        pending = {}

        def submit() -> None:
            while queue and len(pending) <= cpus:
                t = queue.pop()
                ref = remote.options(name=f"replay:{t.name}").remote(t, variants, int(horizon_us), segments.of(t),
                                                                     fault)
                pending[ref] = t
                t.prompts = []  # (shipped: the driver need not hold them any more)

        shallow = None
        waiting: list = []  # global partitions done before the shallow task
        nodes: dict[str, int] = {}
        first = (variants[0], modes[0])
        try:
            submit()
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                ref = done[0]
                task = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise DistributedReplayFailed(
                        f"replay partition {task.name} {self._failed(ray, e)}. "
                        "No walk set was recorded current; run the command again, or with --engine local") from None
                submit()
                for k, n in result.pop("_nodes").items():
                    nodes[k] = nodes.get(k, 0) + n
                if task.name == shallow_name:
                    shallow = partition.shallow_rows(result)
                    ready, waiting = waiting, []
                elif task.mode == "global" and shallow is None:
                    waiting.append((task, result))
                    continue
                else:
                    ready = [(task, result)]
                for t, res in ready:
                    rows = partition.finish(plan, t, res, shallow)
                    if rows:
                        sink(rows)
                        if progress is not None and first in rows:
                            progress.update(len(rows[first]))
        except BaseException:
            _cancel(ray, list(pending))  # (Ctrl-C or a failed partition: stop the rest now)
            raise
        return {"_nodes": nodes}


def _cancel(ray, refs) -> None:
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - already finished or gone
            pass


def _unreachable(address: str, e: BaseException) -> str:
    """What to say when the cluster at ``address`` cannot be joined."""
    chain, seen = [], e
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    auth = any("authentication" in f"{type(x).__name__} {x}".lower() for x in chain)
    hint = ("the cluster uses token authentication (the default of `ray start` in recent Ray): give this "
            "command its token (RAY_AUTH_MODE=token with RAY_AUTH_TOKEN or ~/.ray/auth_token)" if auth else
            "check the address (`ray status --address ADDRESS`) and that this machine can reach it")
    return (f"cannot join the Ray cluster at {address}: {_first_line(e).rstrip('.')}; {hint}; "
            "or run with --engine local")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    tail = [line for line in text if line.strip()]
    return (tail[-1] if tail else type(e).__name__)[:300]

