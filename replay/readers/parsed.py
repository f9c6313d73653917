"""One log file parsed on its own, with no database: what ingest writes for it,
as Arrow tables (``--engine ray``: each file parsed by a worker).

:func:`parse_file` runs the same loader as the single process
(``loader.FileIngest``) into a :class:`CollectingWriter`, with request ids
counted from 0 and source id 0; the ingest stage's driver (``ingest._Run.parsed``)
then gives the file its place — its source id and first request id, the
blobs no earlier file stored — and writes it in one transaction, as it would have
written the file itself. Nothing here depends on earlier files: a file's rows,
rejects, counts and the blobs it introduces (with the first request of the file
that uses each) are its content's alone, so files parse in any order, anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from replay.readers.blobs import Blobs
from replay.readers.files import ReadError, describe_error, file_keys
from replay.readers.formats import Options
from replay.readers.loader import FileIngest, FileStats
from replay.readers.timeorder import TimeOrder
from replay.readers.units import Digest, Known, Range
from replay.readers.writer import SCHEMAS, Writer


class CollectingWriter(Writer):
    """A :class:`Writer` whose batches are kept (``tables``: table name → Arrow
    tables, in order) instead of being inserted."""

    def __init__(self, blobs: Blobs | None):
        super().__init__(None, None, blobs=blobs)
        self.tables: dict[str, list[pa.Table]] = {"requests": [], "rejects": [], "blobs": []}

    def _insert(self, table: str, cols, schema: pa.Schema) -> None:
        self.tables[table].append(cols if isinstance(cols, pa.Table) else pa.Table.from_pydict(cols, schema=schema))

    def table(self, name: str) -> pa.Table:
        got = self.tables[name]
        return pa.concat_tables(got) if got else SCHEMAS[name].empty_table()


@dataclass
class ParsedFile:
    """A file as :func:`parse_file` read it. ``status``: ``ok``; ``known`` (already ingested: not parsed);
    ``digest`` (a :class:`Digest`: only its ``keys``); ``unreadable``
    (its bytes could not be read or decompressed: one reject for the file, like
    the single process's); ``unopenable`` (it could not even be hashed: no
    sources row, retried next time). ``keys``: its content keys
    (``files.file_keys``), None when unopenable. ``ids``: request ids used
    (0 … ids-1 in ``requests`` and the blobs' ``first_request``)."""
    status: str
    keys: tuple | None = None
    stats: FileStats = field(default_factory=FileStats)
    requests: pa.Table | None = None
    rejects: pa.Table | None = None
    blobs: pa.Table | None = None
    ids: int = 0
    error: str = ""
    time_unit: str | None = None  # the unit its numeric timestamps were read in (``sources.time_unit``)
    # its body parts rendered and encoded where it was parsed (``replay.distributed.files``), or None
    prepared: tuple | None = None
    # a byte range's (:func:`parse_range`): its lines, its loaded units' time order
    lines_read: int = 0
    order: TimeOrder | None = None


def parse_file(path: str, forced: str | None, opts: Options, known: frozenset = frozenset()) -> ParsedFile:
    """Parse ``path`` as ingest would load it (module docstring); status ``known``
    and nothing parsed when one of its keys is in ``known`` (already ingested)."""
    try:
        keys = tuple(file_keys(path))
    except OSError as e:
        return ParsedFile("unopenable", error=describe_error(e))
    if any(k in known for k in keys):
        return ParsedFile("known", keys)
    writer = CollectingWriter(Blobs(set()) if opts.split_body else None)
    job = FileIngest(writer, path, 0, 0, forced, opts, None)
    try:
        stats = job.run()
    except ReadError as e:
        return ParsedFile("unreadable", keys, FileStats(format=job.stats.format), error=str(e),
                          time_unit=job.opts.time_unit or job.opts.file_unit)
    writer.flush()
    return ParsedFile("ok", keys, stats, writer.table("requests"), writer.table("rejects"), writer.table("blobs"),
                      ids=job.next_id, time_unit=job.opts.time_unit or job.opts.file_unit)


def parse_range(r: Range, forced: str | None, opts: Options, known: frozenset = frozenset(),
                start_unit: str | None = None) -> ParsedFile:
    """One byte range of a file (``replay.readers.units``), its lines numbered from
    1 and its request ids from 0, read as the file's format from the time unit
    ``start_unit`` (None: the file's first number decides, as at its start).
    ``time_unit`` is the unit the range ended with (None if it read no number),
    for the driver to check against the ranges before it; ``keys`` is None (the
    whole file is hashed apart: ``units.Digest``)."""
    writer = CollectingWriter(Blobs(set()) if opts.split_body else None)
    job = FileIngest(writer, r.path, 0, 0, forced, opts, None)
    job.opts.file_unit = start_unit
    try:
        stats = job.run_range(r.start, r.end, r.fmt)
    except (ReadError, OSError) as e:
        return ParsedFile("unreadable", None, FileStats(format=r.fmt),
                          error=str(e) if isinstance(e, ReadError) else describe_error(e))
    writer.flush()
    return ParsedFile("ok", None, stats, writer.table("requests"), writer.table("rejects"), writer.table("blobs"),
                      ids=job.next_id, time_unit=job.opts.file_unit, lines_read=job.lines_read, order=job.order)


def digest(path: str) -> ParsedFile:
    """A file's keys alone (``digest``), or ``unopenable`` with the error the
    driver's own hashing would report."""
    try:
        return ParsedFile("digest", tuple(file_keys(path)))
    except OSError as e:
        return ParsedFile("unopenable", error=describe_error(e))


def parse_unit(unit, forced: str | None, opts: Options, known: frozenset = frozenset()) -> ParsedFile:
    """A unit of ``replay.readers.units`` parsed: a whole file (its path), a byte
    range, a file's hash, or a file already known (nothing to parse)."""
    if isinstance(unit, Range):
        return parse_range(unit, forced, opts, known)
    if isinstance(unit, Digest):
        return digest(unit.path)
    if isinstance(unit, Known):
        return ParsedFile("known", unit.keys)
    return parse_file(unit, forced, opts, known)
