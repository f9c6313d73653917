"""Ray as the engine (``--engine ray``): log files parsed by tasks, the replay
walked by actors.

**Files** (``map_ordered``): each unit of ingest (``replay.readers.units``: a
file, or a byte range of a large JSON Lines file) is parsed by a task
(``replay.readers.parsed``), at most CPUs + 1 in flight, and written here in
their order (a file's ranges merged into its one transaction).

**The replay** (``replay``): the driver reads the prompts from DuckDB once, in
processing order (``iter_prompts``), and streams them to one walker actor per
CPU (``replay.core.streamed``: each actor keeps the tries of the partitions of
``replay.core.partition`` it was given, each partition exact on its own). Text
prompts travel as segment ids, and each actor is sent each segment it needs
once, so an actor holds its partitions' unique tokens and tries, and the driver
holds the batches in flight rather than the log's prompts (the plan of a whole
log, the earlier design, held 4–4.6 GB on the driver for a week), and only the
segments alive around them (``replay.core.segment_window``). The rows come
back to the driver, are finished (a global row spliced with its shallow row)
and handed to ``sink`` — ``replay_stage`` stores them with ``insert_walks`` and
records the walk sets current only after the last one, so a failed run leaves
them stale, never half-current.
Why not request ids + Parquet on shared storage: the DuckDB file is locked by
the driver's connection, and a local or single-node cluster has no shared
storage to speak of.

Failures: an actor that dies (killed, out of memory) has lost its tries, so the
whole pass starts again on new actors, after ``reset`` drops the rows stored so
far, up to ``max_retries`` times; an actor whose call raises, or one that keeps
dying, stops the replay with :class:`DistributedReplayFailed` naming the
partitions of that call. A file task that dies is retried by Ray; one that
still fails stops the ingest with :class:`DistributedIngestFailed`. The engine
started for a command (no ``address``, and no Ray session open already) is
shut down when the command ends, error and Ctrl-C included, so no worker
outlives it; with ``address`` it connects to that cluster and disconnects at
the end (the cluster keeps running; this job's actors are killed).

Test hook: ``REPLAY_RAY_FAULT`` = ``exit-once:PARTITION:MARKER`` (the actor
walking PARTITION dies at its first batch: ``os._exit`` unless MARKER exists,
which it creates first), ``exit:PARTITION`` (dies every time), ``raise:PARTITION``
(raises) or ``sleep:PARTITION:SECONDS[:MARKER]`` (time to interrupt the command;
MARKER, when given, is created as the sleep starts), read in the driver and
handed to the actors.
"""

from __future__ import annotations

import collections
import os

from replay.core import partition, streamed
from replay.distributed import DistributedIngestFailed, DistributedReplayFailed, EngineUnavailable
from replay.distributed.faults import inject as _inject
from replay.core.prompts import iter_prompts
from replay.core.segment_window import SegmentWindow

FAULT_ENV = "REPLAY_RAY_FAULT"
_END = object()
DEFAULT_RETRIES = 3


def _apply(fn, item, *args):
    return fn(item, *args)


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

    def _failed(self, ray, e: BaseException, retries: int | None = None) -> str:
        """How a task failed, for the error that stops the command."""
        how = ("raised" if isinstance(e, ray.exceptions.RayTaskError) else
               f"failed ({type(e).__name__}) after {self.max_retries if retries is None else retries} retries")
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
    def replay(self, con, modes, variants, horizon_us: int, sink, progress=None, reset=None) -> dict:
        """Replay ``modes`` × ``variants`` on Ray: the prompts streamed, in
        processing order, to one walker actor per CPU (``replay.core.streamed``);
        every final row goes to ``sink`` (a dict (variant, mode) → rows); returns
        ``{"_nodes": ...}`` like ``replay_prompts`` with a sink. A walker that
        dies loses its tries, so the whole pass starts again (after ``reset()``,
        which must drop the rows sunk so far), at most ``max_retries`` times."""
        ray = self.start()
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        parts = self.partitions or 2 * cpus
        size = min(cpus, parts * len(modes) + ("global" in modes))
        fault = os.environ.get(FAULT_ENV) or None
        variants = tuple(variants)
        with_output = "prompt+output" in variants
        for attempt in range(self.max_retries + 1):
            pool = _RayPool(ray, size, variants, int(horizon_us), fault)
            try:
                segments = SegmentWindow(con, with_output)  # (the driver holds the live segments only)
                prompts = iter_prompts(con, with_output=with_output, segs=segments)
                return streamed.replay_streamed(prompts, pool, sink, modes, variants, parts, self.depth,
                                                segments, progress)
            except streamed.WalkerFailed as e:
                died = not isinstance(e.cause, ray.exceptions.RayTaskError)
                if died and reset is not None and attempt < self.max_retries:
                    reset()
                    if progress is not None:
                        progress.reset()
                    continue
                raise DistributedReplayFailed(
                    f"replay partitions {', '.join(e.names)} {self._failed(ray, e.cause, attempt)}. "
                    "No walk set was recorded current; run the command again, or with --engine local") from None
            finally:
                pool.close()


class _Walker(streamed.Walker):
    """A walker actor: ``streamed.Walker`` and the test hook (``REPLAY_RAY_FAULT``)."""

    def __init__(self, variants, horizon_us: int, fault: str | None):
        super().__init__(variants, horizon_us)
        self.fault = fault

    def feed(self, batch, segments=None):
        if self.fault:
            for name in sorted({name for name, _ in batch}):
                _inject(self.fault, name)
        return super().feed(batch, segments)


class _RayPool:
    """``replay.core.streamed``'s pool as Ray actors, one CPU each; killed when
    the pass ends, however it ends (they hold the cluster's CPUs)."""

    def __init__(self, ray, size: int, variants, horizon_us: int, fault: str | None):
        self.ray, self.size = ray, size
        actor = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Walker)
        self.actors = [actor.options(name=None).remote(variants, horizon_us, fault) for _ in range(size)]

    def submit(self, walker: int, batch, segments):
        return self.actors[walker].feed.remote(batch, segments)

    def wait(self, handles):
        done, _ = self.ray.wait(handles, num_returns=1)
        return done[0]

    def get(self, handle):
        return self.ray.get(handle)

    def nodes(self, walker: int) -> dict[str, int]:
        return self.ray.get(self.actors[walker].nodes.remote())

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead
                pass


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

