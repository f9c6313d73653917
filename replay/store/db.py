"""Opening the DuckDB file every stage shares, small key/value helpers, and reading Arrow results."""

from __future__ import annotations

import errno
import fcntl
import os
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pyarrow as pa

from replay.store import schema

DEFAULT_DB = "data/replay.duckdb"


class DatabaseUnusable(RuntimeError):
    """The database file cannot be opened or written: a message saying what to do."""


class DatabaseInUse(DatabaseUnusable):
    """Another process holds the database file."""


def connect(path: str | Path | None = DEFAULT_DB) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the database and make sure every table exists.

    ``path=None`` or ``":memory:"`` gives an in-memory database (tests, notebooks).
    """
    if path is None or str(path) == ":memory:":
        con = duckdb.connect(":memory:")
    else:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            con = duckdb.connect(str(path))
        except duckdb.IOException as e:
            if "lock" in str(e).lower():  # DuckDB allows one writing process per file
                holder = re.search(r"\(PID (\d+)\)", str(e))
                raise DatabaseInUse(f"the database {path} is in use by another process"
                                    + (f" (PID {holder.group(1)})" if holder else "")
                                    + ": wait for it to finish, or give another --db") from None
            raise DatabaseUnusable(f"cannot open the database {path} ({_first_line(e)}): give --db a "
                                   "DuckDB file in a folder you can write") from None
        except OSError as e:
            raise DatabaseUnusable(f"cannot reach or create the folder of the database {path} ({e.strerror}): "
                                   "give --db a file in a folder you can write") from None
    # DuckDB keeps up to 80 % of RAM as buffer cache by default; the stages stream,
    # so a modest cap keeps the process's memory about the work, not the file size.
    con.execute(f"SET memory_limit = '{os.environ.get('REPLAY_DUCKDB_MEMORY', '128MB')}'")
    # Checkpoints: DuckDB's default unless REPLAY_DUCKDB_CHECKPOINT says otherwise
    # (a large threshold keeps uncheckpointed rows inside the memory cap: slower).
    if os.environ.get("REPLAY_DUCKDB_CHECKPOINT"):
        con.execute(f"SET checkpoint_threshold = '{os.environ['REPLAY_DUCKDB_CHECKPOINT']}'")
    # Strings (body parts: JSON text) are stored with zstd rather than DuckDB's
    # default dictionary/FSST: fewer instructions at checkpoints (most of a
    # checkpoint is compressing them) and a file half the size (bench/README.md).
    # Other types keep their own methods. REPLAY_DUCKDB_COMPRESSION=auto gives
    # DuckDB's choice back.
    con.execute(f"SET force_compression = '{os.environ.get('REPLAY_DUCKDB_COMPRESSION', 'zstd')}'")
    # Never an index scan: below 2,048 matching rows DuckDB fetches a range
    # filtered on a primary key (a stage's chunk of requests) through the index,
    # row by row, and each fetched string decompresses its whole zstd block
    # (~600 µs a row); the scan's zone maps find those rows in milliseconds.
    con.execute("SET index_scan_max_count = 0")
    con.execute("SET index_scan_percentage = 0")
    schema.create_all(con)
    return con


_SIZE_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def setting(con: duckdb.DuckDBPyConnection, name: str, value) -> str:
    """Sets DuckDB's ``name`` (for the whole database) to ``value``: the value it had,
    as DuckDB shows it (to set back once the work is done)."""
    was = con.execute(f"SELECT current_setting('{name}')").fetchone()[0]
    con.execute(f"SET {name} = '{value}'")
    return str(was)


def raise_memory(con: duckdb.DuckDBPyConnection, at_least: int) -> str | None:
    """Raises DuckDB's memory cap to ``at_least`` bytes when it is lower: the cap
    it had (for :func:`setting` once the work is done), or None when it was
    left as it is."""
    was = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    number, _, unit = str(was).partition(" ")
    try:
        if float(number) * _SIZE_UNITS[unit] >= at_least:
            return None
    except (ValueError, KeyError):
        return None
    return setting(con, "memory_limit", f"{at_least >> 10}KiB")


_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO, errno.EACCES, errno.EPERM}
_DISK_WORDS = ("No space left on device", "Read-only file system", "Disk quota exceeded", "Input/output error",
               "Permission denied")


def disk_trouble(e: BaseException) -> str | None:
    """What to tell the user when ``e`` is the disk refusing a write (full,
    read-only, no permission), else None. DuckDB and polars report these as
    their own errors, with the system's words in the text."""
    if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
        what = f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    elif any(w in str(e) for w in _DISK_WORDS):
        what = next(w for w in _DISK_WORDS if w in str(e))
    else:
        return None
    return (f"cannot write ({what}): free some space or give --db / --out on a writable disk, then run "
            "again; what was committed before is kept and the rest is redone")


def remove(path: str | Path) -> None:
    """Delete the database file and its write-ahead log (a log left beside a new
    file would be replayed into it); refused while another process holds it."""
    path = Path(path)
    if path.exists():
        with open(path, "rb+") as fh:
            try:  # DuckDB holds a POSIX lock on the file while it is open for writing
                fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.lockf(fh, fcntl.LOCK_UN)
            except OSError:
                raise DatabaseInUse(f"the database {path} is in use by another process: wait for it to "
                                    "finish, or give another --db") from None
    for p in (path, Path(f"{path}.wal")):
        p.unlink(missing_ok=True)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def get_meta(con, key: str, default: str | None = None) -> str | None:
    rows = con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchall()
    return default if not rows else rows[0][0]


def set_meta(con, key: str, value: str) -> None:
    con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])


def untokenized(con) -> int:
    """Requests still waiting for the tokenize stage: without a prompts row, not set
    aside (unrenderable), and not a block trace (their ``block_ids`` need none)."""
    return con.execute("""
        SELECT count(*) FROM requests r LEFT JOIN prompts p USING (request_id)
        WHERE p.request_id IS NULL AND r.block_ids IS NULL
          AND NOT EXISTS (SELECT 1 FROM set_aside s WHERE s.request_id = r.request_id)""").fetchone()[0]


def arrow(con, sql: str, params=None):
    """Run a query and return a pyarrow Table (through a relation: a DB-API result
    would copy the rows once more). A result ``execute`` left unread is run to
    its end first, as ``execute`` itself would."""
    if hasattr(con, "complete"):
        con.complete()
    rel = con.sql(sql, params=params) if params else con.sql(sql)
    if hasattr(rel, "to_arrow_table"):
        return rel.to_arrow_table()
    return rel.arrow()  # duckdb < 1.4


def fetch_bodies(con, ids, blob_texts: dict | None = None) -> dict[int, str | None]:
    """request_id → its body's JSON text, for ``ids``, assembled here from the stored
    blobs (the ``request_bodies`` view does the same in DuckDB, whose capped memory a
    few long agent conversations fill). ``blob_texts``: the caller's cache of blob
    texts across calls (a conversation's calls share most of their blobs)."""
    cache = {} if blob_texts is None else blob_texts
    wanted = pa.table({"request_id": pa.array([int(i) for i in ids], pa.int64())})
    con.register("_bodies_wanted", wanted)
    try:
        rows = con.execute("SELECT request_id, body, body_blobs FROM requests JOIN _bodies_wanted "
                           "USING (request_id)").fetchall()
        need = sorted({b for _, body, blobs in rows if body is None and blobs for b in blobs} - cache.keys())
        if need:
            con.register("_blobs_wanted", pa.table({"blob_id": pa.array(need, pa.uint64())}))
            try:
                cache.update(con.execute("SELECT blob_id, text FROM blobs JOIN _blobs_wanted USING (blob_id)")
                             .fetchall())
            finally:
                con.unregister("_blobs_wanted")
    finally:
        con.unregister("_bodies_wanted")
    return {rid: body if body is not None or blobs is None else "".join(cache[b] for b in blobs)
            for rid, body, blobs in rows}


def body_sizes(con) -> list[tuple[int, int]]:
    """(request_id, characters of its body's JSON text) for every request, by id,
    without building the bodies: an agent's log resends its conversation on every
    call, so its bodies together are many times the text stored."""
    return con.execute("""
        SELECT r.request_id, coalesce(length(any_value(r.body)), 0) + coalesce(sum(length(b.text)), 0)
        FROM requests r
        LEFT JOIN (SELECT request_id, unnest(body_blobs) AS blob_id FROM requests) u USING (request_id)
        LEFT JOIN blobs b USING (blob_id)
        GROUP BY r.request_id ORDER BY r.request_id""").fetchall()


def chunks_by_size(sizes, budget: int) -> list[list[int]]:
    """Request ids grouped in order so each group's body text stays near ``budget``
    characters (a body larger than it is a group of its own)."""
    out: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for rid, size in sizes:
        if cur and total + size > budget:
            out.append(cur)
            cur, total = [], 0
        cur.append(rid)
        total += size
    if cur:
        out.append(cur)
    return out


def list_rows(col) -> list:
    """Each row of an Arrow list column as a numpy view of its values (None for a
    null row), through the offsets: no per-row Arrow calls. A column of NULLs
    (``NULL AS x`` in SQL) gives all None."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_null(col.type):
        return [None] * len(col)
    offsets = col.offsets.to_numpy()
    values = col.values.to_numpy(zero_copy_only=False)
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(col))]


class Deferred:
    """A stage's DuckDB work, run in order on one thread of its own.

    DuckDB inserts and commits (with the checkpoint it makes at a commit) run
    without the interpreter lock, so on that thread they overlap the stage's
    next piece of Python work: ingest parsing the next batch or file, the
    tokenize stage preparing its next chunk. The caller uses the connection itself only
    after :meth:`wait`. At most ``depth`` pieces of work wait (their batches are
    memory). Once one fails, the rest are skipped (DuckDB would refuse them
    anyway: the transaction is aborted), and the error is raised to the caller
    at its next :meth:`submit` or :meth:`wait`."""

    def __init__(self, depth: int = 2):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-db")
        self._pending: deque = deque()
        self._depth = depth
        self._failed = False

    def _run(self, fn, args) -> None:
        if self._failed:
            return
        try:
            fn(*args)
        except BaseException:
            self._failed = True
            raise

    def submit(self, fn, *args) -> None:
        while len(self._pending) >= self._depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._run, fn, args))

    def wait(self, raise_errors: bool = True) -> None:
        """Until all submitted work is done (the connection is the caller's
        again); then the first error, if any, is raised."""
        error = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except BaseException as e:  # noqa: BLE001 - the first one is raised below
                error = error or e
        if error is not None and raise_errors:
            raise error

    def close(self) -> None:
        self.wait(raise_errors=False)
        self._pool.shutdown()


def rollback_quietly(con) -> None:
    """Roll back, if a transaction is still open (a failed commit ends it)."""
    try:
        con.rollback()
    except duckdb.Error:
        pass
