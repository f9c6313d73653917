"""Batched writing of ingest's rows: `requests`, `rejects` and new `blobs` go
into DuckDB as Arrow batches, inserted on the `db.Deferred` thread."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from replay.readers.blobs import BLOB_SCHEMA, Blobs
from replay.readers.files import printable_path
from replay.store import db
from replay.store.jsontext import dumps

BATCH_ROWS = 5000
BATCH_BYTES = 64 << 20  # also flush when the buffered bodies/outputs reach this size
AHEAD_REQUESTS = 64  # requests handed to ``ahead`` at a time

_TYPES = {"int64": pa.int64(), "string": pa.string(), "int32[]": pa.list_(pa.int32()),
          "int64[]": pa.list_(pa.int64()), "uint64[]": pa.list_(pa.uint64())}


def _schema(columns: str) -> pa.Schema:
    """An Arrow schema from ``name:type`` words, in column order (types: ``_TYPES``)."""
    return pa.schema([(name, _TYPES[kind]) for name, kind in (word.split(":") for word in columns.split())])


# diag_*: the provider's cache diagnostics (replay.readers.diagnostics); client, hidden_key:
# coding agents' session files (readers.claude_code, codex); backend: the serving backend a
# gateway names (OpenRouter's provider)
REQUEST_SCHEMA = _schema("""
    request_id:int64 source_id:int64 line_no:int64 format:string ts_us:int64
    tenant:string prompt_cache_key:string session:string user_id:string model:string
    body:string output:string tokens:int32[] output_tokens:int32[] block_ids:int64[] block_lengths:int32[]
    input_length:int64 output_length:int64 usage_prompt_tokens:int64 usage_cached_tokens:int64
    usage_cache_write_tokens:int64 usage_output_tokens:int64 body_blobs:uint64[]
    diag_reason:string diag_missed_tokens:int64 client:string hidden_key:string backend:string
    usage_write_1h_tokens:int64
""")
REJECT_SCHEMA = _schema("source_id:int64 path:string line_no:int64 reason:string detail:string")


SCHEMAS = {"requests": REQUEST_SCHEMA, "rejects": REJECT_SCHEMA, "blobs": BLOB_SCHEMA}
_KEEP = "__replay_keep"  # (``Writer.insert``'s rows to insert)


class Writer:
    """Buffers request/reject rows and inserts them into DuckDB as Arrow batches,
    on ``deferred``'s thread (the caller waits for it before using the
    connection itself)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, deferred: db.Deferred, batch_rows: int = BATCH_ROWS,
                 blobs: Blobs | None = None, ahead=None):
        self.con = con
        # ``ahead(blobs, requests)``: handed each request stored as parts (id, ts_us,
        # format, part ids) with the parts no earlier one brought (``Tok.warm_requests``)
        self.ahead = ahead if blobs is not None else None
        self._ahead_rows: list[tuple] = []
        self._ahead_from = 0  # the pending blobs not yet handed to ``ahead`` start here
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
                if self.ahead is not None:
                    self._ahead_rows.append((ids["request_id"], ids.get("ts_us", row.get("ts_us")),
                                             ids.get("format", row.get("format")), bids))
                    if len(self._ahead_rows) >= AHEAD_REQUESTS:
                        self._hand_ahead()
        for n, col in self.req.items():
            col.append(ids[n] if n in ids else row.get(n))
        self.n_req += 1
        self.req_bytes += len(row.get("body") or "") + len(row.get("output") or "")
        # list columns count too: a batch of long token or blob lists must not
        # outgrow DuckDB's capped memory (8 bytes an item is what Python holds)
        for n in ("body_blobs", "tokens", "output_tokens", "block_ids", "block_lengths"):
            self.req_bytes += 8 * len(row.get(n) or ())
        blob_bytes = self.blobs.bytes if self.blobs is not None else 0
        if self.n_req >= self.batch_rows or self.req_bytes + blob_bytes >= BATCH_BYTES:
            self._flush_requests()

    def reject(self, source_id: int | None, path: str, line_no: int | None, reason: str, detail: str) -> None:
        r = self.rej
        r["source_id"].append(source_id)
        r["path"].append(printable_path(path))
        r["line_no"].append(line_no)
        r["reason"].append(reason)
        r["detail"].append(printable_path(detail))  # (an OS error quotes the file name)
        self.n_rej += 1
        if self.n_rej >= self.batch_rows:
            self._flush_rejects()

    def insert(self, table: str, tbl: pa.Table, keep: pa.Array | None = None) -> None:
        """Insert a whole Arrow table (``requests``, ``rejects`` or ``blobs``) as one batch;
        with ``keep`` (booleans, one a row), only its rows marked true: DuckDB skips
        the others as it reads the batch, where filtering the table would copy it."""
        schema = SCHEMAS[table]
        if tbl.num_rows:
            tbl = tbl.select(schema.names).cast(schema)
            if keep is None:
                self._insert(table, tbl, schema)
            else:
                self.deferred.submit(self._insert_now, table, tbl.append_column(_KEEP, keep), schema, True)

    def _insert(self, table: str, cols, schema: pa.Schema) -> None:
        # (the Arrow table is built here: from Python lists, that needs the interpreter lock)
        tbl = cols if isinstance(cols, pa.Table) else pa.Table.from_pydict(cols, schema=schema)
        self.deferred.submit(self._insert_now, table, tbl, schema)

    def _insert_now(self, table: str, tbl: pa.Table, schema: pa.Schema, kept: bool = False) -> None:
        names = ", ".join(schema.names)
        self.con.register("__replay_ingest_batch", tbl)
        try:
            self.con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM __replay_ingest_batch"
                             + (f" WHERE {_KEEP}" if kept else ""))
        finally:
            self.con.unregister("__replay_ingest_batch")

    def _hand_ahead(self) -> None:
        b, start = self.blobs, self._ahead_from
        self.ahead(list(zip(b.ids[start:], b.kinds[start:], b.texts[start:])), self._ahead_rows)
        self._ahead_rows, self._ahead_from = [], len(b.ids)

    def _flush_requests(self) -> None:
        if self.ahead is not None and self._ahead_rows:
            self._hand_ahead()
        self._ahead_from = 0
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
        self._ahead_rows, self._ahead_from = [], 0  # (what was handed over is checked where it is taken)
        self.req = {n: [] for n in REQUEST_SCHEMA.names}
        self.rej = {n: [] for n in REJECT_SCHEMA.names}
        self.n_req = self.n_rej = self.req_bytes = 0
