"""Ingest: request logs → `requests`, `rejects`, `sources` (see docs/architecture.md).

Every input unit (a JSONL line, a JSON-array element, a parquet row, a
trajectory's assistant turn) is either loaded into `requests` or recorded in
`rejects`, or is context (a line of a coding agent's session file that is
not an API call), so `lines == loaded + context + rejected` for every new file. A file whose
content (sha256, decompressed: a log and its compressed copy are one file) is
already in `sources` is skipped, so re-ingesting never duplicates. Each file is loaded in one transaction (all or nothing); rows are
inserted in Arrow batches.

This module is the entry point (`ingest`): sources, hashes and transactions.
Beside it: `files` (paths, reading), `loader` (one file's units → rows),
`writer` (batched inserts), `blobs` (bodies as content-addressed blobs) and
`formats` (log formats).
"""

from __future__ import annotations

import itertools
import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.readers.blobs import Blobs
from replay.readers.files import ReadError, describe_error, expand_paths, file_keys, is_uri, printable_path
from replay.readers.formats import FORMATS, TIME_UNITS, Options, normalize_fields
from replay.readers.loader import FileIngest, FileStats
from replay.readers.parsed import ParsedFile, parse_range, parse_unit
from replay.readers.summary import IngestSummary, add, add_counts, summary_text, unordered_text  # noqa: F401
from replay.readers.timeorder import FLAGGED, TimeOrder
from replay.readers.units import RANGE_BYTES, Digest, Known, Range, ranges
from replay.readers.writer import Writer
from replay.store import db
from replay.store.failpoints import failpoint

__all__ = ["IngestSummary", "ingest", "summary_text", "unordered_text", "expand_paths"]

# Store chat bodies as content-addressed blobs (requests.body_blobs) rather than
# whole (requests.body). Off by default only until every reader of bodies reads
# the `request_bodies` view (see docs/architecture.md); bench/ turns it on.
DEFAULT_BODY_BLOBS = True


# ----------------------------------------------------------------- entry point

def ingest(
    con: duckdb.DuckDBPyConnection,
    paths: list[str],
    format: str | None = None,
    fields: dict[str, str] | None = None,
    time_unit: str | None = None,
    progress: bool = False,
    body_blobs: bool | None = None,
    warm=None,
    engine=None,
    parse=parse_unit,
    prepared=None,
    warm_requests=None,
    workers: int | None = None,
    range_bytes: int = RANGE_BYTES,
) -> IngestSummary:
    """Load request logs into `requests` / `rejects` / `sources`.

    `format` forces one of FORMATS for every file (else detected per file);
    `fields` maps timestamp/tenant/prompt_cache_key/session/user_id/model to a
    dotted path in the record; `time_unit` ('s', 'ms', 'us') fixes the unit of
    numeric timestamps (else automatic; mooncake defaults to ms).
    `body_blobs` True stores chat bodies as content-addressed `blobs`
    (`requests.body_blobs`); False stores each whole body in `requests.body`;
    None (default) follows DEFAULT_BODY_BLOBS.
    Either way the `request_bodies` view gives the same body text.
    `warm`: a callable given lists of (blob id, kind, JSON text) of the new body
    parts as they are found (``Tok.warm``: the encoder process prepares them for
    the tokenize stage) — a hint that changes no result.
    `engine`: None parses the files here, one after the other; else an object
    whose ``map_ordered(fn, items, *args)`` yields ``(item, fn(item, *args))``
    in the items' order, computed anywhere (``replay.distributed``: local worker
    processes, Ray tasks) — each unit (``replay.readers.units``: a file, or a
    byte range of about ``range_bytes`` of a large JSON Lines file) is parsed
    there by ``parse`` (``parsed.parse_unit``, or one that also prepares its
    body parts: ``replay.distributed.files``) and written here, with the same
    rows, ids and counts; ``prepared`` (instead of ``warm``) is handed the
    prepared parts of the blobs stored (``Tok.add_prepared``).
    `workers`: how many processes ``engine`` parses on, when it is this
    machine's pool (``replay.distributed.file_pool``, made by ``replay.api``):
    a log too small to pay their start (:func:`worth_workers`) is parsed here,
    and the pool never starts. None (or 1): ``engine`` is used as given.
    `warm_requests`: a callable given each request stored as parts (id, ts_us,
    format, part ids) with the new parts (``Tok.warm_requests``: a chat
    template's encoder process renders them ahead) — a hint, like `warm`.
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ValueError(f"unknown time unit {time_unit!r}; expected one of {', '.join(TIME_UNITS)}")
    if body_blobs is None:
        body_blobs = DEFAULT_BODY_BLOBS
    opts = Options(fields=normalize_fields(fields), time_unit=time_unit, split_body=body_blobs)
    files = expand_paths([paths] if isinstance(paths, (str, os.PathLike)) else paths)
    if engine is not None and workers is not None and not worth_workers(files, workers, range_bytes):
        engine = None
    # A cursor is a second connection to the same database with its own
    # transaction state, so each file can commit alone even if the caller's
    # connection is inside a transaction.
    run = _Run(con.cursor(), files, format, opts, warm, progress, hash_here=engine is None,
               warm_requests=warm_requests)
    run.prepared = prepared
    try:
        if engine is None:
            for path in files:
                run.file(path)
        else:
            known = frozenset(run.known)
            try:
                for unit, got in engine.map_ordered(parse, run.units(files, range_bytes), format, opts, known):
                    run.parsed(unit, got)
            except BaseException:
                run.abandon()  # (a file cut into ranges that was still open)
                raise
        run.wait_last_commit()
    finally:
        run.close()
    return run.summary


#: DuckDB's memory cap while ingest runs, when the database's is lower (``_Run``; bench/README.md)
INGEST_MEMORY = 256 << 20
#: below this much input, local worker processes cost more to start than they save
MIN_PARALLEL_BYTES = 32 << 20


def worth_workers(files: list[str], workers: int, range_bytes: int = RANGE_BYTES) -> bool:
    """Are ``workers`` local processes worth starting for ``files``: more than one,
    with at least two units of work (files, or ranges of a large file) among at
    least MIN_PARALLEL_BYTES of local files (a remote file counts as large)."""
    if workers <= 1:
        return False
    total = units = 0
    for path in files:
        try:
            size = range_bytes if is_uri(path) else os.path.getsize(path)
        except OSError:
            size = 0
        total += size
        units += max(1, -(-size // range_bytes))
    return units >= 2 and total >= MIN_PARALLEL_BYTES


class _Run:
    """One call of `ingest`: its cursor, writer, counts and the files' hashes."""

    def __init__(self, con: duckdb.DuckDBPyConnection, files: list[str], forced: str | None, opts: Options,
                 warm, progress: bool, hash_here: bool = True, warm_requests=None):
        self.con = con
        self.forced = forced
        self.opts = opts
        # DuckDB's settings while ingest runs, set back after (``close``): a file's rows
        # wait in its open transaction until it commits, and past the memory cap DuckDB
        # writes them to a temporary file and reads them back; each large file's commit
        # checkpoints, and the checkpoint's vacuum would merge its new row groups with
        # the earlier files' — rewriting (recompressing) them at every file: half of
        # DuckDB's CPU on the week, for tables only ingest writes (bench/README.md); with
        # an engine, the cores are its workers', and DuckDB's threads only add CPU here
        self.settings: dict[str, str] = {}
        try:
            self.settings["max_vacuum_tasks"] = db.setting(con, "max_vacuum_tasks", 0)
        except duckdb.Error:
            pass  # (a DuckDB without the setting vacuums, as before)
        if (was := db.raise_memory(con, INGEST_MEMORY)) is not None:
            self.settings["memory_limit"] = was
        if not hash_here:
            self.settings["threads"] = db.setting(con, "threads", 1)
        self.known = {r[0] for r in con.execute("SELECT sha256 FROM sources").fetchall()}
        self.next_sid = con.execute("SELECT coalesce(max(source_id), 0) + 1 FROM sources").fetchone()[0]
        self.next_id = con.execute("SELECT coalesce(max(request_id), 0) + 1 FROM requests").fetchone()[0]

        self.summary = IngestSummary()
        self.blobs: Blobs | None = None
        if opts.split_body:
            known_blobs = con.execute("SELECT blob_id FROM blobs").fetchnumpy()["blob_id"]
            self.blobs = Blobs(set(known_blobs.tolist()), warm)
        self.deferred = db.Deferred()
        self.writer = Writer(con, self.deferred, blobs=self.blobs, ahead=warm_requests)
        self.fbar = self.lbar = None
        if progress:
            from tqdm import tqdm

            self.fbar = tqdm(total=len(files), unit="file", desc="ingest", file=sys.stderr)
            self.lbar = tqdm(unit="line", desc="records", file=sys.stderr)
        # Hashing runs in a thread beside the parsing (hashlib releases the GIL): a
        # path already in `sources` (a re-run) waits for its hash before anything is
        # read; any other file is loaded straight away inside its transaction, and
        # rolled back if its hash turns out to be known (the same content under a
        # new path).
        self.known_paths = {r[0] for r in con.execute("SELECT path FROM sources").fetchall()}
        self.hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-sha256")
        self.hashes = {path: self.hasher.submit(file_keys, path) for path in dict.fromkeys(files)} if hash_here else {}
        self.prepared = None  # (``ingest``'s: where parts prepared with a parsed file go)
        self.split: _Split | None = None  # the file cut into ranges being written (its transaction open)
        self.split_keys: dict[str, Future | ParsedFile] = {}  # such files' keys (a range has none)

    def file(self, path: str) -> None:
        """One file: skipped when its hash is known, else loaded in a transaction of its own."""
        self.summary.files += 1
        sha: str | None = None
        fut = self.hashes[path]
        if printable_path(path) in self.known_paths or fut.done():
            sha = self._new_sha(path, fut, begun=False)
            if sha is None:
                return
        sid = self.next_sid
        if self.blobs is not None:
            self.blobs.file_flushed = []
        self.deferred.submit(self.con.begin)
        try:
            loaded = self._load(path, sid, sha, fut)
        except BaseException:
            self.writer.discard(whole_file=True)
            self.deferred.wait(raise_errors=False)
            db.rollback_quietly(self.con)
            raise
        if loaded is None:
            return
        sha, stats, next_id = loaded
        if next_id is not None:
            self.next_id = next_id
        self._loaded(path, sha, stats)

    def _loaded(self, path: str, sha: str, stats: FileStats) -> None:
        """A file's load is queued for commit: count it."""
        self.known.add(sha)
        self.next_sid += 1
        add(self.summary, stats)
        if stats.time_order in FLAGGED:
            self.summary.unordered_files.append((printable_path(path), stats.time_order))
        _tick(self.fbar)

    def _load(self, path: str, sid: int, sha: str | None,
              fut: Future) -> tuple[str, FileStats, int | None] | None:
        """Loads a new file inside its transaction and queues the commit: (sha256, counts,
        the next free request id or None when the file gave its ids back), or None when
        its hash turned out unreadable or known (the transaction then rolled back)."""
        job = FileIngest(self.writer, path, sid, self.next_id, self.forced, self.opts, self.lbar)
        open_error: OSError | None = None
        used_ids = True
        try:
            stats = job.run()
        except ReadError as e:
            used_ids = False
            stats = self._unreadable_content(job, path, sid, e)
        except OSError as e:  # could not even open it: its hash decides below
            open_error = e
        if sha is None:
            sha = self._new_sha(path, fut, begun=True)
            if sha is None:
                return None
        if open_error is not None:
            raise open_error
        self._commit(path, sid, sha, stats, job.opts.time_unit or job.opts.file_unit)
        return sha, stats, job.next_id if used_ids else None

    def _new_sha(self, path: str, fut: Future | ParsedFile, begun: bool) -> str | None:
        """The file's key (its content's sha256: :func:`file_keys`, hashed here or
        by the engine: a :class:`Digest`'s result); None when it cannot be hashed
        or is already in `sources` under any of its keys (counted, and the file's
        transaction rolled back when ``begun``)."""
        try:
            keys = fut.result() if isinstance(fut, Future) else fut.keys
            if keys is None:
                raise _Unhashable(fut.error)
        except (OSError, _Unhashable) as e:
            if begun:
                self._roll_back()
            self._unreadable(path, e.args[0] if isinstance(e, _Unhashable) else e)
            return None
        sha = keys[0]
        if any(k in self.known for k in keys):
            if begun:
                self._roll_back()
            self.summary.skipped_files += 1
            _tick(self.fbar)
            return None
        return sha

    def _roll_back(self) -> None:
        self.writer.discard(whole_file=True)
        self.deferred.wait()
        self.con.rollback()

    def _unreadable_content(self, job: FileIngest, path: str, sid: int, e: ReadError) -> FileStats:
        """A file whose bytes could not be read or decompressed: one reject for the whole file."""
        # all or nothing: drop what this file already wrote
        self.writer.discard()
        self.deferred.wait()
        self.con.execute("DELETE FROM requests WHERE source_id = ?", [sid])
        self.con.execute("DELETE FROM rejects WHERE source_id = ?", [sid])
        return self._unreadable_file(sid, path, job.stats.format, str(e))

    def _unreadable_file(self, sid: int, path: str, fmt: str | None, why: str) -> FileStats:
        """The one reject of a file whose bytes could not be read or decompressed, and its counts."""
        self.writer.reject(sid, path, None, "unreadable_file", f"cannot read or decompress the file: {why}")
        return FileStats(format=fmt, lines=1, rejected=1, by_reason={"unreadable_file": 1})

    def _unreadable(self, path: str, e: OSError | str) -> None:
        """A file that cannot even be hashed: one reject, no sources row (retried next time)."""
        self.deferred.wait()
        self.con.execute(_FORGET_UNREADABLE, [printable_path(path)])  # the reject of an earlier try: one per file, not per run
        self.writer.reject(None, path, None, "unreadable_file", e if isinstance(e, str) else describe_error(e))
        self.writer.flush()
        add(self.summary, FileStats(lines=1, rejected=1, by_reason={"unreadable_file": 1}))
        _tick(self.fbar)

    def _commit(self, path: str, sid: int, sha: str, stats: FileStats, time_unit: str | None) -> None:
        failpoint("ingest.file_loaded")  # (the file's rows are in its open transaction)
        self.writer.flush()
        self.deferred.submit(self.con.execute, _FORGET_UNREADABLE, [printable_path(path)])  # readable now
        self.deferred.submit(self.con.execute,
                             "INSERT INTO sources (source_id, path, sha256, format, lines, loaded, rejected, "
                             "time_unit, time_order, context) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             [sid, printable_path(path), sha, stats.format, stats.lines, stats.loaded, stats.rejected,
                              time_unit, stats.time_order, stats.context])
        # committed on the deferred thread while the next file is read; an error
        # there is raised at the next file's first insert, or at the end
        self.deferred.submit(self.con.commit)
        self.deferred.submit(failpoint, "ingest.file_committed")

    def parsed(self, unit, got: ParsedFile) -> None:
        """A unit parsed elsewhere (``replay.readers.parsed``): the decisions and
        rows of :meth:`file`, its request ids, source id and new blobs placed here."""
        if isinstance(unit, Range):
            self.ranged(unit, got)
            return
        if isinstance(unit, Digest):  # (a cut file's keys, hashed in a worker: awaited at its last range)
            self.split_keys[unit.path] = got
            return
        path = unit if isinstance(unit, str) else unit.path
        self.summary.files += 1
        if got.status == "unopenable":
            self._unreadable(path, got.error)
            return
        sha = got.keys[0]
        if got.status == "known" or any(k in self.known for k in got.keys):
            self.summary.skipped_files += 1
            _tick(self.fbar)
            return
        sid, first = self.next_sid, self.next_id
        if self.blobs is not None:
            self.blobs.file_flushed = []
        self.deferred.submit(self.con.begin)
        try:
            if got.status == "unreadable":
                stats = self._unreadable_file(sid, path, got.stats.format, got.error)
            else:
                stats = got.stats
                self._place(got, sid, first)
            self._commit(path, sid, sha, stats, got.time_unit)
        except BaseException:
            self.writer.discard()
            self.deferred.wait(raise_errors=False)
            db.rollback_quietly(self.con)
            raise
        if got.status == "ok":
            self.next_id = first + got.ids
        if self.lbar is not None:
            self.lbar.update(stats.lines)
        self._loaded(path, sha, stats)

    def units(self, files: list[str], range_bytes: int):
        """The units an engine parses (``replay.readers.units``), planned a file at a
        time as the engine asks for more. A file cut into ranges is hashed by the
        engine too (a :class:`Digest` before its ranges), except when its path is
        already in `sources`: then it is hashed here and its hash awaited first,
        as the single process does, and a known one is not parsed at all."""
        for path in files:
            cut = ranges(path, self.forced, range_bytes) if range_bytes > 0 else None
            if cut is None:
                yield path
                continue
            if printable_path(path) not in self.known_paths:
                yield Digest(path)
                yield from cut
                continue
            fut = self.hasher.submit(file_keys, path)
            try:
                keys = fut.result()
            except OSError:
                yield path  # (parsed whole: its parse reports it)
                continue
            if any(k in self.known for k in keys):
                yield Known(path, tuple(keys))
                continue
            self.split_keys[path] = fut
            yield from cut

    def ranged(self, r: Range, got: ParsedFile) -> None:
        """One byte range of a file, in order: the file's transaction opens with its
        first range and commits with its last, its rows numbered on from the ranges
        before (lines, request ids), its counts and time order merged."""
        if r.index == 0:
            self.summary.files += 1
            if self.blobs is not None:
                self.blobs.file_flushed = []
            self.split = _Split(self.next_sid, self.next_id, got.stats.format)
            self.deferred.submit(self.con.begin)
        sp = self.split
        assert sp is not None, "a file's ranges come in order"
        try:
            if sp.error is None and got.status != "ok":
                sp.error = got.error  # (all or nothing: what its earlier ranges wrote goes)
                self.writer.discard()
                self.deferred.wait()
                self.con.execute("DELETE FROM requests WHERE source_id = ?", [sp.sid])
                self.con.execute("DELETE FROM rejects WHERE source_id = ?", [sp.sid])
            elif sp.error is None:
                if got.time_unit not in (None, sp.unit) and sp.unit is not None:
                    # it guessed its numbers' unit apart from the file's: read again from the file's
                    got = parse_range(r, self.forced, self.opts, start_unit=sp.unit)
                self._place(got, sp.sid, sp.next, sp.lines)
                sp.add(got)
                if self.lbar is not None:
                    self.lbar.update(got.stats.lines)
            if r.last:
                self.split = None
                self._close_split(r.path, sp)
        except BaseException:
            self.split = None
            self.writer.discard(whole_file=True)
            self.deferred.wait(raise_errors=False)
            db.rollback_quietly(self.con)
            raise

    def _close_split(self, path: str, sp: "_Split") -> None:
        sha = self._new_sha(path, self.split_keys.pop(path), begun=True)
        if sha is None:  # (its content is known, or it cannot be read: rolled back)
            return
        if sp.error is not None:
            stats = self._unreadable_file(sp.sid, path, sp.stats.format, sp.error)
        else:
            stats = sp.stats
            stats.time_order = sp.order.order()
            self.next_id = sp.next
        self._commit(path, sp.sid, sha, stats, self.opts.time_unit or sp.unit)
        self._loaded(path, sha, stats)

    def abandon(self) -> None:
        """The engine stopped (an error, Ctrl-C) inside a file cut into ranges: roll it back."""
        if self.split is not None:
            self.split = None
            self.writer.discard(whole_file=True)
            self.deferred.wait(raise_errors=False)
            db.rollback_quietly(self.con)

    def _place(self, got: ParsedFile, sid: int, first: int, line0: int = 0) -> None:
        """A parsed file's tables with its source id, its request ids from ``first``,
        its line numbers after ``line0`` (a byte range's: after the ranges before it),
        and only the blobs no earlier file stored, handed to the writer."""
        if got.blobs is not None and got.blobs.num_rows and self.blobs is not None:
            blobs = got.blobs
            keep, new_ids = self._new_blobs(blobs)
            blobs = blobs.set_column(3, "first_request", pc.add(blobs.column("first_request"), first))
            self.writer.insert("blobs", blobs, keep)
            if got.prepared is not None and self.prepared is not None:
                stored = set(new_ids)
                parts = {b: v for b, v in got.prepared[0].items() if b in stored}
                need = {int(s) for _, sids, _ in parts.values() for s in sids}
                self.prepared(parts, {s: t for s, t in got.prepared[1].items() if s in need})
            elif self.blobs.warm is not None and new_ids:
                # (the texts handed over as the UTF-8 bytes Arrow holds: never decoded to str here)
                parts = zip(blobs.column("blob_id").to_pylist(), blobs.column("kind").to_pylist(),
                            blobs.column("text").cast(pa.binary()).to_pylist())
                if keep is not None:
                    parts = itertools.compress(parts, keep.to_pylist())
                self.blobs.warm([p for p in parts if p[1] != "glue"])
        for name, tbl in (("requests", got.requests), ("rejects", got.rejects)):
            if tbl is None or not tbl.num_rows:
                continue
            if name == "requests":
                i = tbl.schema.get_field_index("request_id")
                tbl = tbl.set_column(i, "request_id", pc.add(tbl.column(i), first))
            i = tbl.schema.get_field_index("source_id")
            tbl = tbl.set_column(i, "source_id", pa.array(np.full(tbl.num_rows, sid, dtype=np.int64)))
            if line0:
                i = tbl.schema.get_field_index("line_no")
                tbl = tbl.set_column(i, "line_no", pc.add(tbl.column(i), line0))
            self.writer.insert(name, tbl)

    def _new_blobs(self, blobs: pa.Table) -> tuple[pa.Array | None, list[int]]:
        """Which rows of ``blobs`` (a unit's: each id once) no earlier unit stored
        (None: all of them), and their ids, now known (forgotten again if the file
        is rolled back)."""
        known = self.blobs.known
        col = blobs.column("blob_id")
        ids = col.to_pylist()
        keep = None
        old = known.intersection(ids)
        if old:
            new = ~np.isin(col.to_numpy(), np.fromiter(old, dtype=np.uint64, count=len(old)))
            keep, ids = pa.array(new), list(itertools.compress(ids, new.tolist()))
        known.update(ids)
        self.blobs.file_flushed.extend(ids)
        return keep, ids

    def wait_last_commit(self) -> None:
        try:
            self.deferred.wait()  # the last file's commit
        except BaseException:
            db.rollback_quietly(self.con)
            raise

    def close(self) -> None:
        self.deferred.close()
        self.hasher.shutdown(wait=False, cancel_futures=True)
        if self.blobs is not None and self.blobs.warm is not None:
            self.blobs.send_warm()
        for name, was in self.settings.items():
            try:
                db.setting(self.con, name, was)
            except duckdb.Error:
                pass  # (a database that failed: the error being raised is the one to see)
        self.con.close()
        for bar in (self.lbar, self.fbar):
            if bar is not None:
                bar.close()


class _Unhashable(Exception):
    """A :class:`Digest` that could not be hashed (its argument: the error, described)."""


class _Split:
    """A file cut into ranges, while its ranges are written: its source id, its next
    request id and line, its counts, time order and time unit so far."""

    def __init__(self, sid: int, first: int, fmt: str | None):
        self.sid, self.next, self.lines = sid, first, 0
        self.stats = FileStats(format=fmt)
        self.order = TimeOrder()
        self.unit: str | None = None
        self.error: str | None = None

    def add(self, got: ParsedFile) -> None:
        add_counts(self.stats, got.stats, self.stats.by_reason)
        self.next += got.ids
        self.lines += got.lines_read
        if got.order is not None:
            self.order.extend(got.order)
        self.unit = self.unit or got.time_unit


_FORGET_UNREADABLE = "DELETE FROM rejects WHERE source_id IS NULL AND reason = 'unreadable_file' AND path = ?"


def _tick(bar: Any) -> None:
    if bar is not None:
        bar.update(1)
