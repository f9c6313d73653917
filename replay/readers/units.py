"""Ingest's units of work for an engine (``ingest(engine=)``): whole files, and
byte ranges of the large ones.

Every engine (local worker processes, Ray) maps over the same units, each
parsed on its own (``replay.readers.parsed.parse_unit``) and written by the
driver in order (``ingest._Run``). A file is cut into :class:`Range` s only
when its lines are read one by one, independently of each other, and it can
be read from anywhere: a local, uncompressed JSON Lines file of more than
``range_bytes``, whose format (decided from its head, as the single process
decides it) is one of :data:`SPLIT_FORMATS`. Not the coding agents' session
files (a file's lines are read together), not Bailian (a chat's session is
found through its parent's, anywhere earlier in the file), not a whole JSON
document, not parquet, not compressed (no random access).

Cuts fall just after a newline, so every line is in exactly one range; the
driver numbers a range's lines after those of the ranges before it, its
request ids after theirs, and keeps only the blobs no earlier range stored
(see ``ingest._Run.ranged``): the file's rows, counts, time order and one
``sources`` row are exactly the single process's. The whole file's hash (its
``sources`` key) is a unit of its own, a :class:`Digest` handed out before
its ranges.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from replay.readers.files import ReadError, file_kind, guard_units, is_uri, iter_jsonl, open_binary
from replay.readers.hashtraces import is_lengths_record
from replay.readers.loader import detect

RANGE_BYTES = 64 << 20
#: formats whose lines convert independently of each other (the one state a file
#: carries from line to line, its time unit, is checked by the driver)
SPLIT_FORMATS = ("anthropic", "openai", "tokens", "mooncake", "ragpulse", "otel", "litellm", "langfuse")
_GZIP, _ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_SCAN = 1 << 16  # bytes read at a time looking for a line's end


@dataclass(frozen=True)
class Range:
    """Bytes ``start`` … ``end`` (exclusive) of the file ``path``: whole lines,
    range ``index`` of ``count``, all read as ``fmt`` (the file's format)."""
    path: str
    start: int
    end: int
    index: int
    count: int
    fmt: str | None

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def __str__(self) -> str:
        return f"{self.path} (bytes {self.start:,}–{self.end:,})"


@dataclass(frozen=True)
class Digest:
    """A file cut into ranges, to be hashed (its ``sources`` keys: ``files.file_keys``)
    where the ranges are parsed, not by the driver: the driver only plans and merges."""
    path: str

    def __str__(self) -> str:
        return f"{self.path} (its content's hash)"


@dataclass(frozen=True)
class Known:
    """A file whose content is already ingested (its ``keys`` are in ``sources``): nothing to parse."""
    path: str
    keys: tuple

    def __str__(self) -> str:
        return self.path


def ranges(path: str, forced: str | None, range_bytes: int = RANGE_BYTES) -> list[Range] | None:
    """``path`` cut into ranges of about ``range_bytes`` at line ends, or None
    when it is read whole (module docstring; also when it cannot be read here:
    the whole file's parse reports that)."""
    if is_uri(path) or file_kind(path, forced) != "jsonl":
        return None
    try:
        size = os.path.getsize(path)
        if size <= range_bytes:
            return None
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic[:2] == _GZIP or magic == _ZSTD:
            return None
        fmt = head_format(path, forced)
        if fmt is False:
            return None
        cuts = line_cuts(path, size, range_bytes)
    except (OSError, ReadError):
        return None
    bounds = [0, *cuts, size]
    n = len(bounds) - 1
    return [Range(path, bounds[i], bounds[i + 1], i, n, fmt) for i in range(n)] if n > 1 else None


def head_format(path: str, forced: str | None):
    """The format the file's first lines decide (``loader.detect``), or False when
    that format is not one whose lines may be read apart."""
    with open_binary(path) as fh:
        fmt, head = detect(guard_units(iter_jsonl(fh)), forced)
    if fmt not in SPLIT_FORMATS:
        return False
    if fmt == "ragpulse" and head and is_lengths_record(head[-1][1]):  # (a side file: no request in it)
        return False
    return fmt


def line_cuts(path: str, size: int, range_bytes: int) -> list[int]:
    """Offsets just after the first newline at or past each multiple of
    ``range_bytes`` (strictly increasing, inside the file: a last line without
    newline stays in the last range)."""
    cuts: list[int] = []
    with open(path, "rb", buffering=0) as fh:
        at = range_bytes
        while at < size:
            pos = max(at - 1, cuts[-1] if cuts else 0)  # (a newline just before ``at`` cuts at ``at``)
            fh.seek(pos)
            cut = None
            while cut is None:
                chunk = fh.read(_SCAN)
                if not chunk:
                    break
                i = chunk.find(b"\n")
                if i >= 0:
                    cut = pos + i + 1
                pos += len(chunk)
            if cut is None or cut >= size:
                break
            cuts.append(cut)
            at = max(at + range_bytes, cut + 1)
    return cuts
