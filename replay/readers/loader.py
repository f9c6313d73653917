"""Loading one new file: its units → `requests` rows or `rejects`, counted.

Every input unit (a JSONL line, a JSON-array element, a parquet row, a
trajectory's assistant turn) is either loaded or rejected. The format of a
line-based file is detected from its first records unless forced.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

from replay.readers.fields import Options, Reject
from replay.readers.files import (decode_text, doc_error, file_kind, guard_units, is_plain_file, iter_jsonl, iter_parquet,
                                  open_binary, read_all, trajectory_stem)
from replay.readers.formats import convert_record, convert_trajectory, detect_record
from replay.readers.writer import Writer

DETECT_LOOKAHEAD = 100  # parseable records examined when the first ones are ambiguous


@dataclass
class FileStats:
    format: str | None = None
    lines: int = 0
    loaded: int = 0
    rejected: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


class FileIngest:
    """Loads one new file: units → rows/rejects, counting as it goes."""

    def __init__(self, writer: Writer, path: str, source_id: int, first_id: int,
                 forced: str | None, opts: Options, pbar: Any):
        self.w = writer
        self.path = path
        self.sid = source_id
        self.next_id = first_id
        self.forced = forced
        self.opts = dataclasses.replace(opts, file_unit=None)  # the file decides its own time unit
        self.pbar = pbar
        self.stats = FileStats(format=forced)
        self.slow: set[int] = set()  # JSONL lines the standard parser had to read
        self.kind = ""
        self.memo: dict | None = None  # identity memo of body parts (trajectories)

    # -- counting
    def _reject(self, line_no: int | None, r: Reject) -> None:
        self.stats.lines += 1
        self.stats.rejected += 1
        self.stats.by_reason[r.reason] = self.stats.by_reason.get(r.reason, 0) + 1
        self.w.reject(self.sid, self.path, line_no, r.reason, r.detail)
        self._tick()

    def _load(self, line_no: int, fmt: str, row: dict) -> None:
        self.stats.lines += 1
        self.stats.loaded += 1
        ids = {"request_id": self.next_id, "source_id": self.sid, "line_no": line_no, "format": fmt}
        self.next_id += 1
        fast = self.kind == "jsonl" and line_no not in self.slow
        self.w.request(ids, row, fast, self.memo)
        self._tick()

    def _tick(self) -> None:
        if self.pbar is not None:
            self.pbar.update(1)

    # -- driving
    def run(self) -> FileStats:
        kind = self.kind = file_kind(self.path, self.forced)
        with open_binary(self.path) as fh:
            if kind == "document":
                self._document(read_all(fh))
            elif kind == "json":
                self._json(read_all(fh))
            elif kind == "parquet":
                # parquet needs random access: decompress a .gz/.zst one into memory
                src: Any = self.path if is_plain_file(fh) else pa.BufferReader(read_all(fh))
                self._records(guard_units(iter_parquet(src)))
            else:
                self._records(guard_units(iter_jsonl(fh, self.slow)))
        return self.stats

    def _records(self, units: Iterator[tuple[int, Any]]) -> None:
        fmt = self.forced
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
            self.stats.format = fmt
        for ln, item in itertools.chain(head, units):
            if isinstance(item, Reject):
                self._reject(ln, item)
                continue
            try:
                row = convert_record(item, fmt, self.opts)
            except Reject as r:
                self._reject(ln, r)
                continue
            self._load(ln, fmt, row)  # type: ignore[arg-type]

    def _json(self, data: bytes) -> None:
        """A .json file: an array of records, one object (record or trajectory), or JSONL."""
        head = data.removeprefix(b"\xef\xbb\xbf").lstrip()[:1]
        try:
            doc = json.loads(decode_text(data))
        except (ValueError, RecursionError) as e:
            if head == b"{" and isinstance(e, json.JSONDecodeError) and e.msg == "Extra data":
                self._records(iter_jsonl(io.BytesIO(data)))  # JSON Lines named .json
                return
            self._reject(None, doc_error(e))
            return
        if isinstance(doc, list):
            self._records(iter([(i, x) for i, x in enumerate(doc, 1)]))
        elif self.forced is None and detect_record(doc, whole_document=True)[0] == "trajectory":
            self._trajectory(doc)
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

    def _trajectory(self, doc: Any) -> None:
        self.stats.format = "trajectory"
        self.memo = {}  # the turns share their message objects: key each once
        try:
            units = list(convert_trajectory(doc, trajectory_stem(self.path), self.opts))
        except Reject as r:
            self._reject(None, r)
            return
        for ln, item in units:
            if isinstance(item, Reject):
                self._reject(ln, item)
            else:
                self._load(ln, "trajectory", item)
