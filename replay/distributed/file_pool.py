"""Local worker processes for ingest's units (``ingest(workers=N)``): an engine
whose ``map_ordered(fn, items, *args)`` yields ``(item, fn(item, *args))`` in
the items' order, each computed by one of ``workers`` processes of this machine.

Why processes of our own rather than ``multiprocessing``: the driver holds
DuckDB's and the tokenizer's threads, so forking it is unsafe; a fresh
interpreter (``python -c``, the driver's ``sys.path``) imports only this module
and, through the pickled function, what parsing needs — not ``__main__``, and
no resource-tracker process beside it. Items and results travel as pickles
over the worker's stdin and stdout; a result's large buffers (a parsed unit's
Arrow columns) out of band, each read off the pipe into a buffer of its own
that the unpickled result uses as it is (no copy of its columns here).

* **Lazy**: no process starts before the first item, and only as many as the
  items in flight need (at most ``workers``); ``ingest`` does not even call the
  pool for a log too small to pay their start (``ingest.worth_workers``).
* **Bounded**: at most ``workers + 1`` items in flight (each result is read off
  its pipe by a thread as soon as it is sent, so a worker never waits on the
  driver; at most that many results are held).
* **Nothing outlives the command**: :meth:`close` ends them (the caller closes
  the pool in a ``finally``: errors and Ctrl-C); a worker ignores SIGINT (the
  terminal's Ctrl-C goes to the whole process group: the driver decides) and
  leaves as soon as its input closes or its parent is gone (SIGKILL included).
* **A worker that dies** (killed, out of memory) or whose call raises stops the
  map with :class:`DistributedIngestFailed` naming its item: the items before
  it were yielded (ingest has loaded those files), none after.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import traceback

from replay.distributed import DistributedIngestFailed

#: what a failed ingest map leaves (``FilePool``'s default ``then``)
INGEST_THEN = ("The files before it are loaded (each in its own transaction); run the command again to load "
               "the rest, or without --workers")

_LEN = struct.Struct("<Q")
_WORKER = ("import sys; sys.path[:0] = {paths!r}; "
           "from replay.distributed.file_pool import _worker_main; _worker_main()")
_EOF = object()


@contextlib.contextmanager
def local_pool(workers: int | None, **options):
    """A :class:`FilePool` of ``workers`` processes (``options``: its failure
    wording), or None for fewer than two; closed after, however left."""
    if workers is None or int(workers) < 2:
        yield None
        return
    pool = FilePool(int(workers), **options)
    try:
        yield pool
    finally:
        pool.close()


class FilePool:
    """``workers`` local processes, started on first need (module docstring)."""

    name = "local"

    def __init__(self, workers: int = 2, failed: type = DistributedIngestFailed, then: str = INGEST_THEN):
        self.workers = max(1, int(workers))
        self.failed, self.then = failed, then  # (the error a failed item raises, and what it says was kept)
        self._procs: list[_Worker] = []
        self._lock = threading.Lock()  # (the main thread and the result readers hand out tasks)
        self._pending: collections.deque = collections.deque()  # tasks no worker took yet, in order
        self._call: tuple[int, bytes] = (0, b"")
        self.mapped = 0  # items handed to the workers (what ran there, not here)
        self.started = 0  # processes started, over the pool's life

    def map_ordered(self, fn, items, *args, label=str):
        """``(item, fn(item, *args))`` for each of ``items``, in their order
        (``label(item)`` names a failed one)."""
        self._call = (self._call[0] + 1, b"C" + pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL))
        name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "task")
        todo = iter(items)
        flight: collections.deque = collections.deque()  # tasks, in the items' order
        done = False
        try:
            while True:
                # (one more than the workers: a worker that finishes takes the next at once)
                while len(flight) <= self.workers:
                    item = next(todo, _EOF)
                    if item is _EOF:
                        break
                    task = _Task(item)
                    flight.append(task)
                    with self._lock:
                        self._pending.append(task)
                        self._dispatch(start=True)
                if not flight:
                    done = True
                    return
                task = flight.popleft()
                task.done.wait()
                if task.result is _EOF:
                    raise self.failed(f"{name} of {label(task.item)} failed: its worker process died "
                                      f"({task.worker.how_it_ended()}). {self.then}")
                ok, payload = pickle.loads(task.result[0], buffers=task.result[1])
                if not ok:
                    raise self.failed(f"{name} of {label(task.item)} raised in a worker process: "
                                      f"{payload.strip().splitlines()[-1][:300]}. {self.then}\n" + payload)
                yield task.item, payload
        finally:
            with self._lock:
                self._pending.clear()
            if not done and flight:  # (an error, Ctrl-C, a caller that stopped early: their results are stale)
                self.close()

    def _dispatch(self, start: bool = False) -> None:
        """Hands the pending tasks to idle workers (``start``: starting workers up to
        ``workers`` for them). Called with the lock held."""
        while self._pending:
            w = next((w for w in self._procs if w.task is None and not w.dead), None)
            if w is None:
                if not start or sum(not w.dead for w in self._procs) >= self.workers:
                    return
                w = _Worker(self)
                self._procs.append(w)
                self.started += 1
            task = self._pending.popleft()
            w.take(task, self._call)
            self.mapped += 1

    def close(self) -> None:
        """Ends every worker (their input closed; still running after a moment: killed)."""
        with self._lock:
            self._pending.clear()
            procs, self._procs = self._procs, []
        for w in procs:
            w.close_input()
        for w in procs:
            w.end()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Task:
    """An item in flight: its result (pickled, and its out-of-band buffers; ``_EOF``
    if its worker died) once ``done``."""

    __slots__ = ("item", "result", "done", "worker")

    def __init__(self, item):
        self.item = item
        self.result = None
        self.done = threading.Event()
        self.worker: _Worker | None = None


class _Worker:
    """One worker process, and the thread reading its results (which hands the
    worker its next task as soon as a result arrives)."""

    def __init__(self, pool: FilePool):
        self.pool = pool
        code = _WORKER.format(paths=[p for p in sys.path if p])
        # (a session of its own: the terminal's Ctrl-C reaches the driver alone, which closes the pool)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     close_fds=True, start_new_session=True)
        self.task: _Task | None = None
        self.dead = False
        self.call_id = 0
        self.reader = threading.Thread(target=self._read, name="replay-pool-reader", daemon=True)
        self.reader.start()

    def take(self, task: _Task, call: tuple[int, bytes]) -> None:
        self.task, task.worker = task, self
        if self.call_id != call[0]:
            self._send(call[1])
            self.call_id = call[0]
        self._send(b"I" + pickle.dumps(task.item, protocol=pickle.HIGHEST_PROTOCOL))

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            try:
                body = _read_result(out)
            except (OSError, ValueError, struct.error):
                body = None
            with self.pool._lock:
                task, self.task = self.task, None
                if body is None:
                    self.dead = True
                elif task is not None:
                    self.pool._dispatch()  # (this worker is idle: the next task, if any)
            if task is not None:
                task.result = _EOF if body is None else body
                task.done.set()
            if body is None:
                return

    def _send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(_LEN.pack(len(data)))
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # (it died: its reader says so where the result is awaited)

    def how_it_ended(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "its output closed"
        if rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exit code {rc}"

    def close_input(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def end(self) -> None:
        p = self.proc
        try:
            p.wait(timeout=0 if self.task is not None else 1)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        try:
            p.stdout.close()
        except OSError:
            pass


def _read_result(fh) -> tuple[bytes, list] | None:
    """A result as :func:`_pickled` made it: (pickle, buffers), None at the end."""
    head = _read_exactly(fh, _LEN.size)
    if head is None:
        return None
    n = _LEN.unpack(head)[0]
    sizes = _read_exactly(fh, _LEN.size * (n + 1))
    if sizes is None:
        return None
    parts = [_read_exactly(fh, k, whole=True) for k in struct.unpack(f"<{n + 1}Q", sizes)]
    return None if any(p is None for p in parts) else (parts[0], parts[1:])


def _pickled(obj) -> list:
    """What :func:`_read_result` reads: ``obj`` pickled with its buffers out of band —
    their count, the pickle's and their sizes, the pickle, then each buffer as it is."""
    bufs: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    return [struct.pack(f"<{len(raws) + 2}Q", len(raws), len(data), *(r.nbytes for r in raws)), data, *raws]


def _read_exactly(fh, n: int, whole: bool = False) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = fh.readinto(view[got:])
        if not k:
            return None
        got += k
    # (pickle reads a bytearray as well; no copy of a large one, nor of a buffer a result uses)
    return bytes(buf) if n < (1 << 20) and not whole else buf


# ------------------------------------------------------------------ the worker

def _worker_main() -> None:
    """A worker: calls read from stdin, results written to stdout, until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the driver's to handle)
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # (anything printed goes to stderr, never into the results)
    parent = os.getppid()
    threading.Thread(target=_orphan_watch, args=(parent,), daemon=True).start()
    fn = args = None
    while True:
        head = _read_exactly(inp, _LEN.size)
        if head is None:
            return
        msg = _read_exactly(inp, _LEN.unpack(head)[0])
        if msg is None:
            return
        kind, body = msg[:1], memoryview(msg)[1:]
        if kind == b"C":
            fn, args = pickle.loads(body)
            continue
        try:
            parts = _pickled((True, fn(pickle.loads(body), *args)))
        except Exception:  # noqa: BLE001 - sent to the driver, which stops the map
            parts = _pickled((False, traceback.format_exc()))
        try:
            for part in parts:
                out.write(part)
            out.flush()
        except BrokenPipeError:
            return


def _orphan_watch(parent: int) -> None:
    """Leave as soon as the driver is gone, even in the middle of a call."""
    import time

    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.2)
