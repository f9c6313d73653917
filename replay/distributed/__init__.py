"""Where a walk set is computed: this process (the default, and the oracle), its
worker processes (``local_engine``: ``make("local", workers=N)``) or Ray.

An engine changes only *where* log files are parsed (``replay.readers.parsed``:
each file on its own, written by this process in the same order, ids and rows)
and *how* the walks of some (variant, mode) sets are
computed (``replay.core.partition``: partitions exact on their own, merged into
the single pass's rows; ``replay.core.streamed``: those partitions fed, a batch
at a time, to walkers that keep their tries); ``replay.prepare`` still decides which sets are stale,
and ``replay.core.replay.replay_stage`` stores the rows and records the sets
current only when every partition is in. Ray is an optional extra
(``pip install 'prefix-replay[ray]'``) and is imported only when asked for.

A command picks its engine once (:func:`engine_context`), so the several
``prepare`` calls of a report share one Ray session, started on first need and
shut down when the command ends — on error or Ctrl-C too.
"""

from __future__ import annotations

import contextvars
import importlib.util
from contextlib import contextmanager

ENGINES = ("local", "ray")

_current: contextvars.ContextVar = contextvars.ContextVar("replay_engine", default=None)


class EngineUnavailable(RuntimeError):
    """The engine asked for cannot run here (Ray not installed, or the cluster
    named by ``address`` cannot be joined)."""


class DistributedReplayFailed(RuntimeError):
    """A partition of the replay failed on the engine (after its retries): no walk
    set of that replay was recorded current."""


class WorkerFailed(RuntimeError):
    """A worker process of this machine failed (killed, out of memory, or its
    call raised): nothing of the work it held was stored."""


class DistributedIngestFailed(WorkerFailed):
    """A file could not be parsed on the engine (after its retries): the files
    before it are loaded, it and those after are not."""


def make(name: str, address: str | None = None, **options):
    """The engine called ``name``: for ``local``, None (this process, the single
    pass) or, with ``workers`` > 1, a :class:`LocalEngine` (the replay in that
    many worker processes of this machine; ``warm=False``: made on first use,
    and with ``when_worth=True`` used only for a log that pays for them);
    a :class:`RayEngine` for ``ray``. A local engine's ``workers`` also parse
    (``replay.api.ingest``) and render (``replay.prepare``) when the log is
    large enough to pay for them."""
    if name in (None, "local"):
        if address:
            raise ValueError("--address is for --engine ray")
        workers = options.pop("workers", None)
        warm, when_worth = options.pop("warm", True), options.pop("when_worth", False)
        if options:
            raise ValueError(f"the local engine takes only workers, not {', '.join(sorted(options))}")
        if workers is None or int(workers) <= 1:
            return None
        if not warm:
            return _LazyLocal(int(workers), when_worth)
        from replay.distributed.local_engine import LocalEngine

        return LocalEngine(workers=int(workers))
    if name != "ray":
        raise ValueError(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")
    if importlib.util.find_spec("ray") is None:
        raise EngineUnavailable("--engine ray needs Ray: pip install 'prefix-replay[ray]' (or 'ray>=2.9')")
    from replay.distributed.ray_engine import RayEngine

    return RayEngine(address=address, **options)


class _LazyLocal:
    """A local engine made on first use (``make("local", workers=N, warm=False)``):
    its module imports pyarrow and its fork server is a process, which a command
    that never gets to a stage worth the workers (a small log, ``--help``) must
    not pay. ``workers`` and ``name`` answer without making it."""

    name = "local"

    def __init__(self, workers: int, when_worth: bool = False):
        self.workers = workers
        self.when_worth = when_worth  # (replay.prepare: the workers only for a log large enough)
        self._engine = None

    def __getattr__(self, attr):
        if self._engine is None:
            from replay.distributed.local_engine import LocalEngine

            self._engine = LocalEngine(workers=self.workers)
        return getattr(self._engine, attr)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()


def current():
    """The engine of the enclosing :func:`engine_context` (None: this process)."""
    return _current.get()


@contextmanager
def engine_context(name: str | None = "local", address: str | None = None, **options):
    """Run the enclosed ``prepare`` calls on engine ``name``; its resources (a
    local Ray cluster started for them) are released on leaving, however left."""
    eng = make(name, address, **options)
    token = _current.set(eng)
    try:
        yield eng
    finally:
        _current.reset(token)
        if eng is not None:
            eng.close()


@contextmanager
def using(engine=None, address: str | None = None):
    """The engine a ``prepare`` call uses: ``engine`` None — the enclosing
    context's (not closed here); a name — made for this call and closed after
    it; an engine object — that one (its owner closes it)."""
    if engine is None:
        if address:
            raise ValueError("an address needs an engine (engine='ray')")
        yield current()
    elif isinstance(engine, str):
        with engine_context(engine, address) as eng:
            yield eng
    else:
        yield engine
