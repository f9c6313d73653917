"""Ingest: request logs → `requests`, `rejects`, `sources` (see docs/architecture.md).

Every input unit (a JSONL line, a JSON-array element, a parquet row, a
trajectory's assistant turn) is either loaded into `requests` or recorded in
`rejects`, so `lines == loaded + rejected` for every new file. A file whose
raw bytes (sha256) are already in `sources` is skipped, so re-ingesting never
duplicates. Each file is loaded in one transaction (all or nothing); rows are
inserted in Arrow batches.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import dataclasses
import itertools
import json
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import orjson
import zstandard

try:  # compiled beside the trie (setup.py); without it, values are serialized to be hashed
    from replay.readers._jsonhash import item_hashes
except ImportError:  # pragma: no cover - an install without a compiler
    item_hashes = None
from replay.readers.formats import (FORMATS, TIME_UNITS, Options, Reject, convert_record, convert_trajectory,
                                    detect_record, normalize_fields)
from replay.store import db
from replay.store.jsontext import JSONDecodeError, dumps, loads_fast, orjson_agrees, strip_nulls

__all__ = ["IngestSummary", "ingest", "summary_text", "expand_paths"]

INPUT_SUFFIXES = (".jsonl", ".json", ".parquet")
COMPRESSION_SUFFIXES = (".gz", ".zst")
BATCH_ROWS = 5000
READ_BUFFER = 1 << 20
WARM_BATCH_CHARS = 256_000  # new body parts handed to the encoder process at a time
# Store chat bodies as content-addressed blobs (requests.body_blobs) rather than
# whole (requests.body). Off by default only until every reader of bodies reads
# the `request_bodies` view (see docs/architecture.md); bench/ turns it on.
DEFAULT_BODY_BLOBS = True
KEY_MEMO_ENTRIES = 500_000  # parts per generation of _Blobs' key memo
BATCH_BYTES = 64 << 20  # also flush when the buffered bodies/outputs reach this size
DETECT_LOOKAHEAD = 100  # parseable records examined when the first ones are ambiguous

REQUEST_SCHEMA = pa.schema([
    ("request_id", pa.int64()),
    ("source_id", pa.int64()),
    ("line_no", pa.int64()),
    ("format", pa.string()),
    ("ts_us", pa.int64()),
    ("tenant", pa.string()),
    ("prompt_cache_key", pa.string()),
    ("session", pa.string()),
    ("user_id", pa.string()),
    ("model", pa.string()),
    ("body", pa.string()),
    ("output", pa.string()),
    ("tokens", pa.list_(pa.int32())),
    ("output_tokens", pa.list_(pa.int32())),
    ("block_ids", pa.list_(pa.int64())),
    ("input_length", pa.int64()),
    ("output_length", pa.int64()),
    ("usage_prompt_tokens", pa.int64()),
    ("usage_cached_tokens", pa.int64()),
    ("usage_cache_write_tokens", pa.int64()),
    ("usage_output_tokens", pa.int64()),
    ("body_blobs", pa.list_(pa.uint64())),
])
BLOB_SCHEMA = pa.schema([("blob_id", pa.uint64()), ("kind", pa.string()), ("text", pa.string()),
                         ("first_request", pa.int64())])
REJECT_SCHEMA = pa.schema([
    ("source_id", pa.int64()),
    ("path", pa.string()),
    ("line_no", pa.int64()),
    ("reason", pa.string()),
    ("detail", pa.string()),
])


@dataclass
class IngestSummary:
    files: int = 0  # files looked at (new + skipped + unreadable)
    skipped_files: int = 0  # already ingested (same sha256)
    lines: int = 0  # input units of the new files
    loaded: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    def reconciles(self) -> bool:
        """Every input unit of the new files was either loaded or rejected."""
        return (self.lines == self.loaded + self.rejected
                and sum(self.rejected_by_reason.values()) == self.rejected)


def summary_text(summary: IngestSummary) -> str:
    s = summary
    new = s.files - s.skipped_files
    lines = [
        f"files: {new} ingested, {s.skipped_files} skipped (already ingested)",
        f"lines: {s.lines:,}  loaded: {s.loaded:,}  rejected: {s.rejected:,}"
        + ("" if s.reconciles() else "  (WARNING: counts do not reconcile)"),
    ]
    for reason, n in sorted(s.rejected_by_reason.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {reason:<20} {n:,}")
    return "\n".join(lines)


# ----------------------------------------------------------------- paths

def _strip_compression(name: str) -> str:
    for suf in COMPRESSION_SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def _is_input_name(name: str) -> bool:
    return _strip_compression(name.lower()).endswith(INPUT_SUFFIXES)


def expand_paths(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Files named by `paths` (files, globs, directories searched recursively), sorted, unique.

    Files inside directories (or matched directories) are taken when they end in
    .jsonl/.json/.parquet, optionally + .gz/.zst, and their names do not start
    with '_' or '.' (side files such as a generator's `_truth.jsonl`, hidden
    files — the Hadoop/Spark convention); files named explicitly or
    matched by a glob are taken whatever their name. A path that does not exist
    or a glob that matches nothing raises FileNotFoundError.
    """
    out: dict[str, None] = {}

    def add_dir(d: str) -> None:
        for root, dirs, files in os.walk(d):
            dirs[:] = sorted(x for x in dirs if not x.startswith((".", "_")))
            for f in files:
                if _is_input_name(f) and not f.startswith((".", "_")):
                    out[os.path.normpath(os.path.join(root, f))] = None

    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            add_dir(p)
        elif os.path.exists(p):
            out[os.path.normpath(p)] = None
        elif glob.has_magic(p):
            matches = glob.glob(p, recursive=True)
            if not matches:
                raise FileNotFoundError(f"no file matches {p!r}")
            for m in matches:
                if os.path.isdir(m):
                    add_dir(m)
                else:
                    out[os.path.normpath(m)] = None
        else:
            raise FileNotFoundError(f"no such file or directory: {p!r}")
    return sorted(out)


# ----------------------------------------------------------------- reading

class _ReadError(Exception):
    """The file's bytes could not be read or decompressed."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _open_binary(path: str) -> io.BufferedIOBase:
    """Binary stream of the decompressed content (gzip/zstd recognised by magic bytes)."""
    # A 1 MB buffer: agent log lines are tens of KB, and iterating lines through
    # the default 8 KB buffer costs ten times more (measured in bench/README.md).
    fh = open(path, "rb", buffering=READ_BUFFER)
    magic = fh.read(4)
    fh.seek(0)
    if magic[:2] == b"\x1f\x8b":
        return io.BufferedReader(gzip.GzipFile(fileobj=fh, mode="rb"), buffer_size=READ_BUFFER)  # type: ignore
    if magic == b"\x28\xb5\x2f\xfd":
        reader = zstandard.ZstdDecompressor().stream_reader(fh, closefd=True)
        return io.BufferedReader(reader, buffer_size=READ_BUFFER)
    return fh


def _guard(it: Iterable) -> Iterator:
    """Re-raise errors raised while *reading* as _ReadError (not while converting)."""
    it = iter(it)
    while True:
        try:
            x = next(it)
        except StopIteration:
            return
        except (OSError, EOFError, zstandard.ZstdError, pa.ArrowException, MemoryError) as e:
            raise _ReadError(_describe_error(e)) from e
        yield x


def _describe_error(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg[:200]}" if msg else type(e).__name__


def _parse_line(raw: bytes, slow: set | None = None, line_no: int = 0) -> Any:
    """Parsed JSON of one line, or a Reject. Lines the fast parser refuses are
    read by the standard one (and noted in ``slow``)."""
    try:
        return loads_fast(raw)  # the common case, without copying the line to strip it
    except (JSONDecodeError, RecursionError):
        pass  # blank, BOM, NaN, lone surrogates, invalid: decided below
    s = raw.strip()
    if not s:
        return Reject("blank_line", "empty line")
    if s.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
        s = s[3:]
        try:
            return loads_fast(s)
        except (JSONDecodeError, RecursionError):
            pass
    if slow is not None:
        slow.add(line_no)
    try:
        return json.loads(s.decode("utf-8"))
    except UnicodeDecodeError as e:
        return Reject("malformed_json", f"line is not valid UTF-8 (byte {e.start})")
    except json.JSONDecodeError as e:
        return Reject("malformed_json", f"invalid JSON: {e.msg} at column {e.colno}")
    except (ValueError, RecursionError) as e:
        return Reject("malformed_json", f"invalid JSON ({type(e).__name__})")


def _iter_jsonl(fh: Iterable[bytes], slow: set | None = None) -> Iterator[tuple[int, Any]]:
    for i, raw in enumerate(fh, 1):
        yield i, _parse_line(raw, slow, i)


def _iter_parquet(src: Any) -> Iterator[tuple[int, Any]]:
    pf = pq.ParquetFile(src)
    n = 0
    for batch in pf.iter_batches(batch_size=4096):
        for rec in batch.to_pylist():
            n += 1
            yield n, strip_nulls(rec)


def _file_kind(path: str, forced: str | None) -> str:
    name = _strip_compression(os.path.basename(path).lower())
    if forced == "trajectory" or name.endswith(".traj.json"):
        return "document"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".json"):
        return "json"
    return "jsonl"


def _traj_stem(path: str) -> str:
    name = _strip_compression(os.path.basename(path))
    for suf in (".traj.json", ".json", ".jsonl"):
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


# ----------------------------------------------------------------- body blobs

class _Unsplittable(Exception):
    pass


def _blob_id(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _text(obj: Any) -> str:
    """formats.dumps, refusing values whose JSON is not UTF-8 encodable (dumps would
    then escape the *whole* body as ASCII, which parts cannot reproduce)."""
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                   default=dumps.__globals__["_json_default"])
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise _Unsplittable from None
    return s


def _text_of(serialized: bytes, obj: Any) -> str:
    """``_text(obj)`` from orjson's serialization of it when the two are bound to be
    equal (``formats.orjson_agrees``), else serialized again by the standard library."""
    if orjson_agrees(serialized, obj):
        return serialized.decode("utf-8")
    return _text(obj)


class _Blobs:
    """Splits request bodies into content-addressed blobs (see docs/architecture.md).

    A body ``{"k1": v1, "tools": [t1, t2], "system": s, "messages": [m1, m2], ...}``
    becomes the blob list ``[glue '{"k1":v1,"tools":[', tool t1, glue ',', tool t2,
    glue '],"system":', system s, glue ',"messages":[', message m1, glue ',',
    message m2, glue ']...}']`` whose texts concatenate to exactly ``formats.dumps(body)``.
    Each tool definition, system value and message is stored once however many
    requests repeat it (an agent resends its whole conversation every turn).
    Blob ids: first 8 bytes of blake2b over kind + serialization (orjson's for
    records the fast parser read, prefixed ``o``; the standard one's, prefixed ``s``).
    """

    def __init__(self, known: set[int], warm=None):
        self.known = known
        self.request_id: int | None = None  # the request being split (blobs.first_request)
        # new tools/system values/messages are handed to ``warm`` (the encoder
        # process encodes them ahead, on the other core) in batches of WARM_BATCH_CHARS
        self.warm = warm
        self._warm_parts: list[tuple[int, str, str]] = []
        self._warm_chars = 0
        self._glue_ids: dict[str, int] = {}
        self._scalar_text: dict[tuple, str] = {}
        # A 64-bit hash of a part → its blob id, per kind: an agent resends every
        # earlier message each turn, so most parts are found here by one dict
        # lookup instead of being serialized and hashed again with blake2b. The
        # hash is ``_jsonhash.item_hashes`` of the decoded value (no serialization),
        # or, without that extension, Python's hash of orjson's serialization.
        # Two generations bound its memory: a full young one becomes the old one,
        # and what is found in the old one moves back. Every id in it is in
        # ``known``, so it is emptied whenever ids leave ``known``.
        self._young: dict[str, dict[int, int]] = {"tool": {}, "message": {}}
        self._old: dict[str, dict[int, int]] = {"tool": {}, "message": {}}
        self._young_size = 0
        self._reset()
        self.file_flushed: list[int] = []

    def _reset(self) -> None:
        self.ids: list[int] = []
        self.kinds: list[str] = []
        self.texts: list[str] = []
        self.firsts: list[int | None] = []
        self.bytes = 0

    def _add(self, bid: int, kind: str, text: str) -> None:
        if self.warm is not None and kind != "glue":
            self._warm_parts.append((bid, kind, text))
            self._warm_chars += len(text)
            if self._warm_chars >= WARM_BATCH_CHARS:
                self.send_warm()
        self.known.add(bid)
        self.ids.append(bid)
        self.kinds.append(kind)
        self.texts.append(text)
        self.firsts.append(self.request_id)
        self.bytes += len(text)

    def send_warm(self) -> None:
        if self._warm_parts:
            self.warm(self._warm_parts)
            self._warm_parts, self._warm_chars = [], 0

    def _glue(self, text: str) -> int:
        bid = self._glue_ids.get(text)  # the same few separators and key runs, over and over
        if bid is None:
            bid = _blob_id(b"glue\0" + text.encode("utf-8"))
            if len(self._glue_ids) < 100_000:
                self._glue_ids[text] = bid
        if bid not in self.known:
            self._add(bid, "glue", text)
        return bid

    def _part(self, kind: str, obj: Any, fast: bool, memo: dict | None) -> int:
        if memo is not None:
            hit = memo.get(id(obj))
            if hit is not None and hit[0] is obj:
                return hit[1]
        text = None
        if fast:
            try:
                key = b"o" + orjson.dumps(obj)
            except (TypeError, orjson.JSONEncodeError):
                fast = False
        if not fast:
            text = _text(obj)
            key = b"s" + text.encode("utf-8")
        bid = _blob_id(kind.encode("ascii") + b"\0" + key)
        if bid not in self.known:
            self._add(bid, kind, text if text is not None else _text_of(key[1:], obj))
        if memo is not None:
            memo[id(obj)] = (obj, bid)
        return bid

    def _forget_keys(self) -> None:
        for gen in (self._young, self._old):
            for d in gen.values():
                d.clear()
        self._young_size = 0

    def _list_parts(self, kind: str, items: list) -> list[int] | None:
        """Blob ids of a tools/messages list's items (the same ids ``_part`` gives:
        blake2b of orjson's serialization); None when orjson cannot serialize one.
        Only the items the key memo does not know are serialized: at a day's
        agent traffic, about 9,000 of 142,000."""
        hashes = item_hashes(items) if item_hashes is not None else None
        keys = None
        if hashes is None:  # no extension, or a value it has no hash for
            try:
                keys = list(map(orjson.dumps, items))
            except (TypeError, orjson.JSONEncodeError):
                return None
            hashes = list(map(hash, keys))
        young = self._young[kind]
        bids = list(map(young.get, hashes))
        if None in bids:
            old = self._old[kind]
            prefix = kind.encode("ascii") + b"\0o"
            for j, bid in enumerate(bids):
                if bid is None:
                    bid = old.get(hashes[j])
                    if bid is None:
                        if keys is None:
                            try:
                                key = orjson.dumps(items[j])
                            except (TypeError, orjson.JSONEncodeError):
                                return None
                        else:
                            key = keys[j]
                        bid = _blob_id(prefix + key)
                        if bid not in self.known:
                            self._add(bid, kind, _text_of(key, items[j]))
                    young[hashes[j]] = bids[j] = bid
                    self._young_size += 1
            if self._young_size > KEY_MEMO_ENTRIES:
                self._old, self._young = self._young, {"tool": {}, "message": {}}
                self._young_size = 0
        return bids

    def _value_text(self, v: Any) -> str:
        """``_text`` of a top-level value, remembered for plain scalars (model, max_tokens…)."""
        if v is None or type(v) in (str, int, bool):
            key = (type(v), v)
            t = self._scalar_text.get(key)
            if t is None:
                t = _text(v)
                if len(self._scalar_text) < 10_000:
                    self._scalar_text[key] = t
            return t
        if type(v) is float and math.isfinite(v):
            return float.__repr__(v)  # what the standard library writes
        if type(v) in (dict, list):
            try:
                return _text_of(orjson.dumps(v), v)
            except (TypeError, orjson.JSONEncodeError):
                pass  # an integer beyond 64 bits, a lone surrogate: the standard library decides
        return _text(v)

    def split(self, body: Any, fast: bool, memo: dict | None = None) -> list[int] | None:
        """Blob ids of ``body`` in order, or None when it keeps the inline form."""
        if not isinstance(body, dict):
            return None
        msgs, tools = body.get("messages"), body.get("tools")
        if not isinstance(msgs, list) or not (tools is None or isinstance(tools, list)):
            return None
        if body.get("system") is None and "instructions" in body:
            return None
        n_before = len(self.ids)
        ids: list[int] = []
        glue: list[str] = []
        try:
            for i, (k, v) in enumerate(body.items()):
                if not isinstance(k, str):
                    raise _Unsplittable
                glue.append(("{" if i == 0 else ",") + self._value_text(k) + ":")
                if k in ("tools", "messages") and isinstance(v, list):
                    kind = "tool" if k == "tools" else "message"
                    glue.append("[")
                    parts = self._list_parts(kind, v) if fast and memo is None and v else None
                    if parts is not None:
                        # [first, comma, second, comma, ...] interleaved with the parts
                        seps = [self._glue(",") if len(parts) > 1 else 0] * len(parts)
                        seps[0] = self._glue("".join(glue))
                        glue = []
                        run = [0] * (2 * len(parts))
                        run[0::2] = seps
                        run[1::2] = parts
                        ids.extend(run)
                    else:
                        for j, item in enumerate(v):
                            if j:
                                glue.append(",")
                            ids.append(self._glue("".join(glue)))
                            glue = []
                            ids.append(self._part(kind, item, fast, memo))
                    glue.append("]")
                elif k == "system":
                    ids.append(self._glue("".join(glue)))
                    glue = []
                    ids.append(self._part("system", v, fast, memo))
                else:
                    glue.append(self._value_text(v))
            if not body:
                glue.append("{")
            glue.append("}")
            ids.append(self._glue("".join(glue)))
        except _Unsplittable:
            self._forget_keys()  # it may list ids about to leave ``known``
            for bid in self.ids[n_before:]:  # drop what this body added
                self.known.discard(bid)
            del self.ids[n_before:], self.kinds[n_before:], self.texts[n_before:], self.firsts[n_before:]
            return None
        return ids

    def table(self) -> pa.Table:
        return pa.table({"blob_id": pa.array(np.array(self.ids, dtype=np.uint64), pa.uint64()),
                         "kind": pa.array(self.kinds, pa.string()),
                         "text": pa.array(self.texts, pa.string()),
                         "first_request": pa.array(self.firsts, pa.int64())}, schema=BLOB_SCHEMA)

    def flushed(self) -> None:
        self.file_flushed.extend(self.ids)
        self._reset()

    def discard(self, whole_file: bool) -> None:
        """Forget pending blobs (and, after a rollback, this file's flushed ones)."""
        self._forget_keys()
        for bid in self.ids:
            self.known.discard(bid)
        if whole_file:
            for bid in self.file_flushed:
                self.known.discard(bid)
        self._reset()


# ----------------------------------------------------------------- writing

class _Writer:
    """Buffers request/reject rows and inserts them into DuckDB as Arrow batches,
    on ``deferred``'s thread (the caller waits for it before using the
    connection itself)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, deferred: db.Deferred, batch_rows: int = BATCH_ROWS,
                 blobs: _Blobs | None = None):
        self.con = con
        self.deferred = deferred
        self.batch_rows = batch_rows
        self.blobs = blobs
        self.req: dict[str, list] = {n: [] for n in REQUEST_SCHEMA.names}
        self.rej: dict[str, list] = {n: [] for n in REJECT_SCHEMA.names}
        self.n_req = 0
        self.n_rej = 0
        self.req_bytes = 0

    def request(self, ids: dict, row: dict, fast: bool = False, memo: dict | None = None) -> None:
        if "body_obj" in row:
            body = row.pop("body_obj")
            if self.blobs is not None:
                self.blobs.request_id = ids["request_id"]
            bids = self.blobs.split(body, fast, memo) if self.blobs is not None else None
            if bids is None:
                row["body"] = dumps(body)
            else:
                row["body_blobs"] = bids
        for n, col in self.req.items():
            col.append(ids[n] if n in ids else row.get(n))
        self.n_req += 1
        self.req_bytes += len(row.get("body") or "") + len(row.get("output") or "")
        blob_bytes = self.blobs.bytes if self.blobs is not None else 0
        if self.n_req >= self.batch_rows or self.req_bytes + blob_bytes >= BATCH_BYTES:
            self._flush_requests()

    def reject(self, source_id: int | None, path: str, line_no: int | None, reason: str, detail: str) -> None:
        r = self.rej
        r["source_id"].append(source_id)
        r["path"].append(path)
        r["line_no"].append(line_no)
        r["reason"].append(reason)
        r["detail"].append(detail)
        self.n_rej += 1
        if self.n_rej >= self.batch_rows:
            self._flush_rejects()

    def _insert(self, table: str, cols, schema: pa.Schema) -> None:
        # (the Arrow table is built here: from Python lists, that needs the interpreter lock)
        tbl = cols if isinstance(cols, pa.Table) else pa.Table.from_pydict(cols, schema=schema)
        self.deferred.submit(self._insert_now, table, tbl, schema)

    def _insert_now(self, table: str, tbl: pa.Table, schema: pa.Schema) -> None:
        names = ", ".join(schema.names)
        self.con.register("__replay_ingest_batch", tbl)
        try:
            self.con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM __replay_ingest_batch")
        finally:
            self.con.unregister("__replay_ingest_batch")

    def _flush_requests(self) -> None:
        if self.blobs is not None and self.blobs.ids:
            self._insert("blobs", self.blobs.table(), BLOB_SCHEMA)
            self.blobs.flushed()
        if self.n_req:
            self._insert("requests", self.req, REQUEST_SCHEMA)
            self.req = {n: [] for n in REQUEST_SCHEMA.names}
            self.n_req = self.req_bytes = 0

    def _flush_rejects(self) -> None:
        if self.n_rej:
            self._insert("rejects", self.rej, REJECT_SCHEMA)
            self.rej = {n: [] for n in REJECT_SCHEMA.names}
            self.n_rej = 0

    def flush(self) -> None:
        self._flush_requests()
        self._flush_rejects()

    def discard(self, whole_file: bool = False) -> None:
        if self.blobs is not None:
            self.blobs.discard(whole_file)
        self.req = {n: [] for n in REQUEST_SCHEMA.names}
        self.rej = {n: [] for n in REJECT_SCHEMA.names}
        self.n_req = self.n_rej = self.req_bytes = 0


@dataclass
class _FileStats:
    format: str | None = None
    lines: int = 0
    loaded: int = 0
    rejected: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


class _FileIngest:
    """Loads one new file: units → rows/rejects, counting as it goes."""

    def __init__(self, writer: _Writer, path: str, source_id: int, first_id: int,
                 forced: str | None, opts: Options, pbar: Any):
        self.w = writer
        self.path = path
        self.sid = source_id
        self.next_id = first_id
        self.forced = forced
        self.opts = dataclasses.replace(opts, file_unit=None)  # the file decides its own time unit
        self.pbar = pbar
        self.stats = _FileStats(format=forced)
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
    def run(self) -> _FileStats:
        kind = self.kind = _file_kind(self.path, self.forced)
        with _open_binary(self.path) as fh:
            if kind == "document":
                self._document(_read_all(fh))
            elif kind == "json":
                self._json(_read_all(fh))
            elif kind == "parquet":
                # parquet needs random access: decompress a .gz/.zst one into memory
                src: Any = self.path if _is_plain(fh) else pa.BufferReader(_read_all(fh))
                self._records(_guard(_iter_parquet(src)))
            else:
                self._records(_guard(_iter_jsonl(fh, self.slow)))
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
            doc = json.loads(_decode(data))
        except (ValueError, RecursionError) as e:
            if head == b"{" and isinstance(e, json.JSONDecodeError) and e.msg == "Extra data":
                self._records(_iter_jsonl(io.BytesIO(data)))  # JSON Lines named .json
                return
            self._reject(None, _doc_error(e))
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
            doc = json.loads(_decode(data))
        except (ValueError, RecursionError) as e:
            self._reject(None, _doc_error(e))
            return
        self._trajectory(doc)

    def _trajectory(self, doc: Any) -> None:
        self.stats.format = "trajectory"
        self.memo = {}  # the turns share their message objects: key each once
        try:
            units = list(convert_trajectory(doc, _traj_stem(self.path), self.opts))
        except Reject as r:
            self._reject(None, r)
            return
        for ln, item in units:
            if isinstance(item, Reject):
                self._reject(ln, item)
            else:
                self._load(ln, "trajectory", item)


def _is_plain(fh: Any) -> bool:
    return isinstance(fh, io.BufferedReader) and isinstance(getattr(fh, "raw", None), io.FileIO)


def _read_all(fh: io.BufferedIOBase) -> bytes:
    try:
        return fh.read()
    except (OSError, EOFError, zstandard.ZstdError, MemoryError) as e:
        raise _ReadError(_describe_error(e)) from e


def _decode(data: bytes) -> str:
    return data.decode("utf-8-sig")


def _doc_error(e: BaseException) -> Reject:
    if isinstance(e, UnicodeDecodeError):
        return Reject("malformed_json", f"file is not valid UTF-8 (byte {e.start})")
    if isinstance(e, json.JSONDecodeError):
        return Reject("malformed_json", f"file is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    return Reject("malformed_json", f"file is not valid JSON ({type(e).__name__})")


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
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ValueError(f"unknown time unit {time_unit!r}; expected one of {', '.join(TIME_UNITS)}")
    if body_blobs is None:
        body_blobs = DEFAULT_BODY_BLOBS
    opts = Options(fields=normalize_fields(fields), time_unit=time_unit, split_body=body_blobs)
    files = expand_paths([paths] if isinstance(paths, (str, os.PathLike)) else paths)
    # A cursor is a second connection to the same database with its own
    # transaction state, so each file can commit alone even if the caller's
    # connection is inside a transaction.
    con = con.cursor()

    known = {r[0] for r in con.execute("SELECT sha256 FROM sources").fetchall()}
    next_sid = con.execute("SELECT coalesce(max(source_id), 0) + 1 FROM sources").fetchone()[0]
    next_id = con.execute("SELECT coalesce(max(request_id), 0) + 1 FROM requests").fetchone()[0]

    summary = IngestSummary()
    blobs = None
    if body_blobs:
        known_blobs = con.execute("SELECT blob_id FROM blobs").fetchnumpy()["blob_id"]
        blobs = _Blobs(set(known_blobs.tolist()), warm)
    deferred = db.Deferred()
    writer = _Writer(con, deferred, blobs=blobs)
    fbar = lbar = None
    if progress:
        from tqdm import tqdm

        fbar = tqdm(total=len(files), unit="file", desc="ingest", file=sys.stderr)
        lbar = tqdm(unit="line", desc="records", file=sys.stderr)
    # Hashing runs in a thread beside the parsing (hashlib releases the GIL): a
    # path already in `sources` (a re-run) waits for its hash before anything is
    # read; any other file is loaded straight away inside its transaction, and
    # rolled back if its hash turns out to be known (the same content under a
    # new path).
    known_paths = {r[0] for r in con.execute("SELECT path FROM sources").fetchall()}
    hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-sha256")
    hashes = {path: hasher.submit(_sha256, path) for path in dict.fromkeys(files)}
    try:
        for path in files:
            summary.files += 1
            sha: str | None = None
            fut = hashes[path]
            if path in known_paths or fut.done():
                try:
                    sha = fut.result()
                except OSError as e:
                    _unreadable(writer, summary, path, e)
                    _tick(fbar)
                    continue
                if sha in known:
                    summary.skipped_files += 1
                    _tick(fbar)
                    continue
            sid = next_sid
            if blobs is not None:
                blobs.file_flushed = []
            deferred.submit(con.begin)
            try:
                job = _FileIngest(writer, path, sid, next_id, format, opts, lbar)
                open_error: OSError | None = None
                used_ids = True
                try:
                    stats = job.run()
                except _ReadError as e:
                    used_ids = False
                    # all or nothing: drop what this file already wrote
                    writer.discard()
                    deferred.wait()
                    con.execute("DELETE FROM requests WHERE source_id = ?", [sid])
                    con.execute("DELETE FROM rejects WHERE source_id = ?", [sid])
                    writer.reject(sid, path, None, "unreadable_file", f"cannot read or decompress the file: {e}")
                    stats = _FileStats(format=job.stats.format, lines=1, rejected=1,
                                       by_reason={"unreadable_file": 1})
                except OSError as e:  # could not even open it: its hash decides below
                    open_error = e
                if sha is None:
                    try:
                        sha = fut.result()
                    except OSError as e:
                        writer.discard(whole_file=True)
                        deferred.wait()
                        con.rollback()
                        _unreadable(writer, summary, path, e)
                        _tick(fbar)
                        continue
                    if sha in known:
                        writer.discard(whole_file=True)
                        deferred.wait()
                        con.rollback()
                        summary.skipped_files += 1
                        _tick(fbar)
                        continue
                if open_error is not None:
                    raise open_error
                writer.flush()
                deferred.submit(con.execute,
                                "INSERT INTO sources (source_id, path, sha256, format, lines, loaded, rejected, "
                                "time_unit) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                [sid, path, sha, stats.format, stats.lines, stats.loaded, stats.rejected,
                                 job.opts.time_unit or job.opts.file_unit])
                # committed on the deferred thread while the next file is read; an error
                # there is raised at the next file's first insert, or at the end
                deferred.submit(con.commit)
            except BaseException:
                writer.discard(whole_file=True)
                deferred.wait(raise_errors=False)
                db.rollback_quietly(con)
                raise
            if used_ids:
                next_id = job.next_id
            known.add(sha)
            next_sid += 1
            _add(summary, stats)
            _tick(fbar)
        try:
            deferred.wait()  # the last file's commit
        except BaseException:
            db.rollback_quietly(con)
            raise
    finally:
        deferred.close()
        hasher.shutdown(wait=False, cancel_futures=True)
        if blobs is not None and blobs.warm is not None:
            blobs.send_warm()
        con.close()
        for bar in (lbar, fbar):
            if bar is not None:
                bar.close()
    return summary


def _unreadable(writer: _Writer, summary: IngestSummary, path: str, e: OSError) -> None:
    """A file that cannot even be hashed: one reject, no sources row (retried next time)."""
    writer.reject(None, path, None, "unreadable_file", _describe_error(e))
    writer.flush()
    _add(summary, _FileStats(lines=1, rejected=1, by_reason={"unreadable_file": 1}))


def _tick(bar: Any) -> None:
    if bar is not None:
        bar.update(1)


def _add(summary: IngestSummary, stats: _FileStats) -> None:
    summary.lines += stats.lines
    summary.loaded += stats.loaded
    summary.rejected += stats.rejected
    for k, v in stats.by_reason.items():
        summary.rejected_by_reason[k] = summary.rejected_by_reason.get(k, 0) + v
