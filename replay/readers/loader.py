"""Loading one new file: its units → `requests` rows or `rejects`, counted.

Every input unit (a JSONL line, a JSON-array element, a parquet row, a
trajectory's assistant turn) is either loaded or rejected. The format of a
line-based file is detected from its first records unless forced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from replay.readers import files
from replay.readers.fields import Options, Reject, too_deep
from replay.readers.files import (decode_text, doc_error, file_kind, guard_units, iter_jsonl, iter_parquet, open_binary,
                                  parquet_source, parse_line, read_all, trajectory_stem)
from replay.readers.fields import CONTEXT
from replay.readers.formats import (DOCUMENT_CONVERTERS, DOCUMENT_FORMATS, SESSION_CONVERTERS, SESSION_FORMATS,
                                    convert_record, detect_record)
from replay.readers.formats import expand_units
from replay.readers.hashtraces import LENGTHS_FORMAT, is_lengths_record
from replay.readers.timeorder import TimeOrder
from replay.readers.writer import Writer

DETECT_LOOKAHEAD = 100  # parseable records examined when the first ones are ambiguous


@dataclass
class FileStats:
    format: str | None = None
    lines: int = 0
    loaded: int = 0
    rejected: int = 0
    context: int = 0  # lines of session files that are context, not requests (readers.claude_code, codex)
    by_reason: dict[str, int] = field(default_factory=dict)
    time_order: str | None = None  # of the loaded units, in file order (replay.readers.timeorder)


def _looks_like_json_lines(data: bytes, lines: int = 20) -> bool:
    """A .json file that does not parse whole, but with a JSON object of its own on one
    of its first lines: JSON Lines, some of them damaged (a byte that is not UTF-8, a
    cut line, junk) — read line by line rather than refused whole for them. (A
    pretty-printed document has no such line: its objects open at the end of one.)"""
    pos = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    for _ in range(lines):
        end = data.find(b"\n", pos)
        if end < 0:
            return False
        if data[pos:pos + 1] == b"{" and isinstance(parse_line(data[pos:end]), dict):
            return True
        pos = end + 1
    return False


def detect(units: Iterator[tuple[int, Any]], forced: str | None) -> tuple[str | None, list]:
    """The format of a line-based file from its first units (``forced`` when given),
    and the units read to decide it (``head``: they come before the rest of
    ``units``). A forced ``ragpulse`` also reads its first record, to tell a side
    file of chunk lengths."""
    fmt = forced
    head: list[tuple[int, Any]] = []
    if fmt is None:
        fallback = None
        seen = 0
        for ln, item in units:
            head.append((ln, item))
            if isinstance(item, Reject):
                continue
            seen += 1
            f, confident = detect_record(item)
            if f is not None and confident:
                fmt = f
                break
            if f is not None and fallback is None:
                fallback = f
            if seen >= DETECT_LOOKAHEAD:
                break
        if fmt is None:
            fmt = fallback
    if fmt == "ragpulse" and not head:  # forced: is this a side file of the trace?
        for ln, item in units:
            head.append((ln, item))
            if not isinstance(item, Reject):
                break
    return fmt, head


class FileIngest:
    """Loads one new file: units → rows/rejects, counting as it goes."""

    def __init__(self, writer: Writer, path: str, source_id: int, first_id: int,
                 forced: str | None, opts: Options, pbar: Any):
        self.w = writer
        self.path = path
        self.sid = source_id
        self.next_id = first_id
        self.forced = forced
        # the file decides its own time unit; its converters keep their state per file
        self.opts = dataclasses.replace(opts, file_unit=None, file_state={"path": path})
        self.pbar = pbar
        self.stats = FileStats(format=forced)
        self.slow: set[int] = set()  # JSONL lines the standard parser had to read
        self.kind = ""
        self.memo: dict | None = None  # identity memo of body parts (trajectories)
        self.order = TimeOrder()  # the loaded units' times, in file order
        self.detected: str | None = None  # the format of the file a byte range belongs to (``run_range``)
        self.lines_read = 0  # JSONL lines read (``run_range``: its lines)

    # -- counting
    def _reject(self, line_no: int | None, r: Reject) -> None:
        self.stats.lines += 1
        self.stats.rejected += 1
        self.stats.by_reason[r.reason] = self.stats.by_reason.get(r.reason, 0) + 1
        self.w.reject(self.sid, self.path, line_no, r.reason, r.detail)
        self._tick()

    def _context(self) -> None:
        self.stats.lines += 1
        self.stats.context += 1
        self._tick()

    def _load(self, line_no: int, fmt: str, row: dict) -> None:
        ids = {"request_id": self.next_id, "source_id": self.sid, "line_no": line_no, "format": fmt}
        fast = self.kind == "jsonl" and line_no not in self.slow
        try:
            self.w.request(ids, row, fast, self.memo)  # (leaves nothing behind when it raises)
        except RecursionError:  # the body nests too deeply to be serialized
            self._reject(line_no, too_deep())
            return
        self.next_id += 1
        self.order.add(row["ts_us"])
        self.stats.lines += 1
        self.stats.loaded += 1
        self._tick()

    def _tick(self) -> None:
        if self.pbar is not None:
            self.pbar.update(1)

    # -- driving
    def run(self) -> FileStats:
        kind = self.kind = file_kind(self.path, self.forced)
        with open_binary(self.path) as fh:
            if kind in ("document", "json"):
                data = read_all(fh, files.MAX_DOCUMENT_BYTES)
                if len(data) > files.MAX_DOCUMENT_BYTES:
                    self._too_large_document(data)
                elif kind == "document":
                    self._document(data)
                else:
                    self._json(data)
            elif kind == "parquet":
                # parquet needs random access: a .gz/.zst one is decompressed into memory
                src, filesystem = parquet_source(self.path, fh)
                self._records(guard_units(iter_parquet(src, filesystem)))
            else:
                self._records(guard_units(iter_jsonl(fh, self.slow)))
        self.stats.time_order = self.order.order()
        return self.stats

    def run_range(self, start: int, end: int, fmt: str | None) -> FileStats:
        """Bytes ``start`` … ``end`` of a local, uncompressed JSONL file (cut at line
        ends: ``replay.readers.units``) as this file's lines, numbered from 1,
        converted as ``fmt`` — the format the whole file's head decided."""
        self.kind, self.detected = "jsonl", fmt
        self.stats.format = fmt
        with open(self.path, "rb", buffering=0) as raw:
            raw.seek(start)
            fh = io.BufferedReader(_Slice(raw, end - start), buffer_size=files.READ_BUFFER)
            self._records(guard_units(self._counted(iter_jsonl(fh, self.slow))))
        self.stats.time_order = self.order.order()
        return self.stats

    def _counted(self, units: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        for ln, item in units:
            self.lines_read = ln
            yield ln, item

    def _too_large_document(self, head: bytes) -> None:
        """A .json past MAX_DOCUMENT_BYTES: JSON Lines are streamed; a whole document is one reject."""
        if self.kind == "json" and _looks_like_json_lines(head):
            with open_binary(self.path) as fh:
                self._records(guard_units(iter_jsonl(fh, self.slow)))
            return
        self.stats.format = "trajectory" if self.kind == "document" else self.forced
        self._reject(None, Reject("too_large", f"a whole JSON document over the {files.MAX_DOCUMENT_BYTES:,} bytes "
                                               "one may have; write it as JSON Lines (one record per line)"))

    def _records(self, units: Iterator[tuple[int, Any]]) -> None:
        if self.detected is not None:  # (a byte range of a file whose format its head decided)
            fmt, head = self.detected, []
        else:
            fmt, head = detect(units, self.forced)
            if self.forced is None:
                self.stats.format = fmt
        if fmt == LENGTHS_FORMAT or (fmt == "ragpulse" and head and is_lengths_record(head[-1][1])):
            # RAGPulse's chunk lengths: side data the trace's converter reads, no request in it
            self.stats.format = LENGTHS_FORMAT
            return
        if fmt in SESSION_FORMATS:
            self._session(itertools.chain(head, units), fmt)
            return
        # (an OTLP export's line holds many spans: expand_units makes each a unit)
        for ln, item in expand_units(itertools.chain(head, units), fmt):
            if isinstance(item, Reject):
                self._reject(ln, item)
                continue
            try:
                row = convert_record(item, fmt, self.opts)
            except Reject as r:
                self._reject(ln, r)
                continue
            except RecursionError:
                self._reject(ln, too_deep())
                continue
            self._load(ln, fmt, row)  # type: ignore[arg-type]

    def _session(self, units: Iterator[tuple[int, Any]], fmt: str) -> None:
        """A coding agent's session file: its lines read in order by the format's
        converter, each one a request, context or a reject."""
        self.memo = {}  # its requests share their message objects: key each once
        for ln, item in SESSION_CONVERTERS[fmt](units, self.opts):
            if item is CONTEXT:
                self._context()
            elif isinstance(item, Reject):
                self._reject(ln, item)
            else:
                self._load(ln, fmt, item)

    def _json(self, data: bytes) -> None:
        """A .json file: an array of records, one object (record or trajectory), or JSONL."""
        head = data.removeprefix(b"\xef\xbb\xbf").lstrip()[:1]
        try:
            doc = json.loads(decode_text(data))
        except (ValueError, RecursionError) as e:
            if (head == b"{" and isinstance(e, json.JSONDecodeError) and e.msg == "Extra data") \
                    or _looks_like_json_lines(data):
                self._records(iter_jsonl(io.BytesIO(data)))  # JSON Lines named .json
                return
            self._reject(None, doc_error(e))
            return
        if isinstance(doc, list):
            self._records(iter([(i, x) for i, x in enumerate(doc, 1)]))
        elif (fmt := self.forced or detect_record(doc, whole_document=True)[0]) in DOCUMENT_FORMATS:
            if fmt == "kv-cache-tester":  # its ids are local to the file: salted with its bytes
                self.opts.file_state["salt"] = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(),
                                                              "little")
            self._trajectory(doc, fmt)
        else:
            self._records(iter([(1, doc)]))

    def _document(self, data: bytes) -> None:
        """A trajectory file: one JSON document."""
        self.stats.format = "trajectory"
        try:
            doc = json.loads(decode_text(data))
        except (ValueError, RecursionError) as e:
            self._reject(None, doc_error(e))
            return
        self._trajectory(doc)

    def _trajectory(self, doc: Any, fmt: str = "trajectory") -> None:
        """One document of many requests (a trajectory, a kv-cache-tester conversation)."""
        self.stats.format = fmt
        self.memo = {}  # the turns share their message objects: key each once
        try:
            units = list(DOCUMENT_CONVERTERS[fmt](doc, trajectory_stem(self.path), self.opts))
        except Reject as r:
            self._reject(None, r)
            return
        except RecursionError:  # (a converter serializing a value nested too deeply)
            self._reject(None, too_deep("the document"))
            return
        for ln, item in units:
            if isinstance(item, Reject):
                self._reject(ln, item)
            else:
                self._load(ln, fmt, item)


class _Slice(io.RawIOBase):
    """The next ``size`` bytes of an open file, as a stream of their own."""

    def __init__(self, fh, size: int):
        self.fh, self.left = fh, size

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        if n <= 0:
            return 0
        got = self.fh.readinto(memoryview(b)[:n])
        self.left -= got
        return got
