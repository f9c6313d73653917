"""Input files of ingest: which paths are read, and their content as units.

`expand_paths` names the files; `open_binary` gives their decompressed bytes
(gzip/zstd recognised by magic bytes); JSONL lines and parquet rows come out
as (unit number, parsed record or `Reject`). An error while *reading* (not
while converting) becomes `ReadError`: ingest then rejects the whole file.

A path with a URI scheme (``s3://bucket/logs/``, ``gs://…``, ``file:///…``) is
read through its pyarrow filesystem (``FileSystem.from_uri``), listed, globbed
and filtered as a local path is; a plain path is read with the builtin `open`
(the hot path, unchanged). See docs/remote-inputs.md.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import hashlib
import io
import json
import os
import re
import zlib
from typing import Any, Iterable, Iterator
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from pyarrow import fs as pafs

from replay.readers.fields import Reject
from replay.store.jsontext import JSONDecodeError, loads_fast, strip_nulls

INPUT_SUFFIXES = (".jsonl", ".json", ".parquet")
COMPRESSION_SUFFIXES = (".gz", ".zst")
READ_BUFFER = 1 << 20
# A JSONL line longer than this is rejected (`too_large`) without being held whole:
# parsed, a line takes several times its size in memory, and DuckDB (its memory
# capped, db.connect) cannot take one value near its cap. LLM APIs refuse requests
# past a few tens of MB, so no real log line comes near it.
MAX_LINE_BYTES = 32 << 20
LINE_PIECE = 1 << 20  # a longer line is read in pieces of this size
# A whole-document .json (an array, one trajectory) is parsed whole: past this size
# it is rejected (`too_large`) rather than held — unless it turns out to be JSON
# Lines, which is read line by line. Parsed, a document takes several times its
# size; this bounds that at a few GB.
MAX_DOCUMENT_BYTES = 512 << 20


# ----------------------------------------------------------------- paths

def _strip_compression(name: str) -> str:
    for suf in COMPRESSION_SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def _is_input_name(name: str) -> bool:
    return _strip_compression(name.lower()).endswith(INPUT_SUFFIXES)


def _set_apart(name: str) -> bool:
    """A hidden or side file or folder (``.x``, ``_truth.jsonl``), skipped inside directories."""
    return name.startswith((".", "_"))


def expand_paths(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Files named by `paths` (files, globs, directories searched recursively), sorted, unique.

    Files inside directories (or matched directories) are taken when they end in
    .jsonl/.json/.parquet, optionally + .gz/.zst, and their names do not start
    with '_' or '.' (side files such as a generator's `_truth.jsonl`, hidden
    files — the Hadoop/Spark convention); files named explicitly or
    matched by a glob are taken whatever their name. A path that does not exist,
    a glob that matches nothing or a directory holding no log file raises
    FileNotFoundError. A URI (``s3://bucket/logs/``, ``file:///…``) is expanded
    the same way through its pyarrow filesystem, into URIs (:func:`_expand_uri`).
    """
    out: dict[str, None] = {}

    def add_dir(d: str) -> None:
        for root, dirs, files in os.walk(d):
            dirs[:] = sorted(x for x in dirs if not _set_apart(x))
            for f in files:
                if _is_input_name(f) and not _set_apart(f):
                    out[os.path.normpath(os.path.join(root, f))] = None

    for p in paths:
        p = os.fspath(p)
        if is_uri(p):
            _expand_uri(p, out)
        elif os.path.isdir(p):
            before = len(out)
            add_dir(p)
            if len(out) == before:
                raise FileNotFoundError(f"no log files in '{printable_path(p)}' (looked for *.jsonl, *.json, *.parquet, "
                                        "optionally .gz/.zst, not starting with '.' or '_')")
        elif os.path.exists(p):
            out[os.path.normpath(p)] = None
        elif glob.has_magic(p):
            matches = glob.glob(p, recursive=True)
            if not matches:
                raise FileNotFoundError(f"no file matches '{printable_path(p)}'")
            for m in matches:
                if os.path.isdir(m):
                    add_dir(m)
                else:
                    out[os.path.normpath(m)] = None
        else:
            raise FileNotFoundError(f"no such file or directory: '{printable_path(p)}'")
    return sorted(out)


# ----------------------------------------------------------------- URIs

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")  # two letters at least: never a Windows drive


def is_uri(path: Any) -> bool:
    """`path` names a file through a pyarrow filesystem (``s3://``, ``gs://``, ``file://`` …)."""
    return isinstance(path, str) and _URI.match(path) is not None


class InputUnreachable(FileNotFoundError):
    """A URI whose filesystem cannot be created or asked (unknown scheme, no
    credentials, no network). A FileNotFoundError: callers (the CLI) report it as an
    input that cannot be read, by its message, never as a traceback."""


# (filesystem, path in it) by URI. Creating a filesystem may cost a round trip (S3
# looks up the bucket's region), so a listing records the files it names here.
_FILESYSTEMS: dict[str, tuple[pafs.FileSystem, str]] = {}


def _unreachable(uri: str, e: BaseException) -> InputUnreachable:
    return InputUnreachable(
        f"cannot read '{printable_path(uri)}': {describe_error(e)}; check the URI (pyarrow reads file://, s3://, "
        "gs://, hdfs://) and that the bucket's credentials are set (AWS_PROFILE or AWS_ACCESS_KEY_ID/"
        "AWS_SECRET_ACCESS_KEY for s3://, GOOGLE_APPLICATION_CREDENTIALS for gs://; a region or endpoint goes "
        "in the query: s3://bucket/logs/?region=eu-west-1)")


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    got = _FILESYSTEMS.get(uri)
    if got is None:
        try:
            got = _FILESYSTEMS[uri] = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowException, ValueError, OSError) as e:
            raise _unreachable(uri, e) from e
    return got


def _split_query(uri: str) -> tuple[str, str]:
    """``s3://b/x?region=r`` → (``s3://b/x``, ``?region=r``): the query (a bucket's
    options) stays on every URI made from it. (So '?' is no glob character in a URI.)"""
    base, mark, query = uri.partition("?")
    return base, mark + query


def _info(uri: str) -> pafs.FileInfo:
    fs, path = _filesystem(uri)
    try:
        return fs.get_file_info(path)
    except (pa.ArrowException, OSError) as e:
        raise _unreachable(uri, e) from e


def _expand_uri(uri: str, out: dict[str, None]) -> None:
    """`expand_paths` for one URI: an object, a prefix (a directory) or a glob after the bucket."""
    base, query = _split_query(uri)
    scheme, _, rest = base.partition("://")
    parts = rest.split("/")
    magic = next((i for i, x in enumerate(parts) if glob.has_magic(x)), None)
    if magic is None:
        kind = _info(uri).type
        if kind == pafs.FileType.File:
            out[uri] = None
        elif kind != pafs.FileType.Directory:
            raise FileNotFoundError(f"no such file or directory: '{printable_path(uri)}'")
        elif not _add_listing(uri, None, out):
            raise FileNotFoundError(f"no log files in '{printable_path(uri)}' (looked for *.jsonl, *.json, *.parquet, "
                                    "optionally .gz/.zst, not starting with '.' or '_')")
    elif magic == 0:
        raise FileNotFoundError(f"no file matches '{printable_path(uri)}' (a glob cannot name the bucket)")
    elif not _add_listing(f"{scheme}://{'/'.join(parts[:magic])}/{query}", [unquote(x) for x in parts[magic:]], out):
        raise FileNotFoundError(f"no file matches '{printable_path(uri)}'")


def _add_listing(root: str, pattern: list[str] | None, out: dict[str, None]) -> bool:
    """Adds the files under the URI `root`: the log files (as in a local directory)
    when `pattern` is None, else those matching `pattern` (glob segments), and the
    log files inside the directories it matches. False when none was found."""
    fs, top = _filesystem(root)
    base, query = _split_query(root)
    try:
        infos = fs.get_file_info(pafs.FileSelector(top, recursive=True))
    except FileNotFoundError:
        return False
    except (pa.ArrowException, OSError) as e:
        raise _unreachable(root, e) from e

    def log_file(parts: list[str]) -> bool:  # below a listed directory: as add_dir takes them
        return _is_input_name(parts[-1]) and not any(map(_set_apart, parts))

    dir_only = pattern is not None and pattern[-1] == ""  # `logs/2025-*/`: directories only
    pat = pattern[:-1] if dir_only else pattern
    before = len(out)
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        parts = info.path[len(top):].strip("/").split("/")
        if pattern is None:
            take = log_file(parts)
        else:  # matched itself (any name), or inside a matched directory
            take = any(_glob_match(parts[:k], pat) and (log_file(parts[k:]) if k < len(parts) else not dir_only)
                       for k in range(1, len(parts) + 1))
        if take:
            uri = f"{base.rstrip('/')}/{quote('/'.join(parts), errors='surrogateescape')}{query}"
            _FILESYSTEMS[uri] = (fs, info.path)
            out[uri] = None
    return len(out) > before


def _glob_match(parts: list[str], pattern: list[str]) -> bool:
    """Path segments matched as `glob.glob(recursive=True)` matches them: ``**`` any
    number of segments, ``*`` inside one, a name starting with '.' only by a pattern that does."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1)
                   if not any(x.startswith(".") for x in parts[:i]))
    return (bool(parts) and (not parts[0].startswith(".") or pattern[0].startswith("."))
            and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_match(parts[1:], pattern[1:]))


def _name(path: str) -> str:
    """The file name of a path or a URI (its query left out, its escapes undone)."""
    return unquote(_split_query(path)[0].rsplit("/", 1)[-1]) if is_uri(path) else os.path.basename(path)


def beside(path: str, name: str) -> str:
    """The file `name` in the folder of the file `path` (a URI stays one)."""
    if not is_uri(path):
        return os.path.join(os.path.dirname(os.path.abspath(path)), name)
    base, query = _split_query(path)
    return f"{base.rsplit('/', 1)[0]}/{quote(name)}{query}"


def is_file(path: str) -> bool:
    if not is_uri(path):
        return os.path.isfile(path)
    try:
        return _info(path).type == pafs.FileType.File
    except OSError:
        return False


def _open_raw(path: str, buffering: int = -1) -> io.BufferedReader:
    """The file's bytes as stored."""
    if not is_uri(path):
        return open(path, "rb", buffering=buffering)
    fs, p = _filesystem(path)
    # compression=None: pyarrow would decompress by the file's extension; we go by magic bytes
    return io.BufferedReader(fs.open_input_stream(p, compression=None), buffer_size=READ_BUFFER)


# ----------------------------------------------------------------- reading

class ReadError(Exception):
    """The file's bytes could not be read or decompressed."""


def _sha256(fh) -> tuple[str, bytes]:
    """The stream's sha256 (hex), and its first 4 bytes (magic)."""
    h = hashlib.sha256()
    head = b""
    with fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            head = head or chunk[:4]
            h.update(chunk)
    return h.hexdigest(), head


def file_keys(path: str) -> tuple[str, ...]:
    """The keys a file is known by in ``sources``: the sha256 of its content once
    decompressed, then, for a compressed file, of its raw bytes (what databases
    keyed on before) — so a log and its compressed copy, as log rotation leaves
    them side by side, are one file. A compressed file that cannot be
    decompressed is known by its raw bytes (loading it reports the damage)."""
    raw, magic = _sha256(_open_raw(path))
    if magic[:2] != b"\x1f\x8b" and magic != b"\x28\xb5\x2f\xfd":
        return (raw,)
    try:
        return (_sha256(open_binary(path))[0], raw)
    except (OSError, EOFError, zlib.error, zstandard.ZstdError):
        return (raw,)


def open_binary(path: str) -> io.BufferedIOBase:
    """Binary stream of the decompressed content (gzip/zstd recognised by magic bytes)."""
    # A 1 MB buffer: agent log lines are tens of KB, and iterating lines through
    # the default 8 KB buffer costs ten times more (measured in bench/README.md).
    fh = _open_raw(path, READ_BUFFER)
    magic = fh.peek(4)[:4]  # (peek: a remote stream cannot seek back)
    if magic[:2] == b"\x1f\x8b":
        return io.BufferedReader(gzip.GzipFile(fileobj=fh, mode="rb"), buffer_size=READ_BUFFER)  # type: ignore
    if magic == b"\x28\xb5\x2f\xfd":
        return io.BufferedReader(_ZstdReader(path, fh), buffer_size=READ_BUFFER)
    return fh


class _ZstdReader(io.RawIOBase):
    """python-zstandard's stream reader, raising EOFError (as gzip does) where the
    input ends inside a frame: the stream reader then just stops, and a truncated
    .zst would read as a shorter log, its lost lines nowhere counted."""

    def __init__(self, path: str, fh: io.BufferedReader):
        self._path = path
        self._reader = zstandard.ZstdDecompressor().stream_reader(fh, closefd=True)
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._reader.readinto(b)
        if n == 0 and len(b) and not self._checked:
            self._checked = True
            if not zstd_frames_complete(self._path):
                raise EOFError("zstd: compressed file ended before the end of its last frame")
        return n

    def close(self) -> None:
        self._reader.close()
        super().close()


def zstd_frames_complete(path: str) -> bool:
    """False when the zstd file ends inside a frame. Walks the frame and block
    headers only (RFC 8878), without decompressing; bytes that are no frame at
    all are left to the decompressor, which refuses them."""
    if is_uri(path):  # random access; most skips land inside the buffer
        fs, p = _filesystem(path)
        fh: Any = io.BufferedReader(fs.open_input_file(p), buffer_size=READ_BUFFER)
        size = fh.raw.size()
    else:
        fh = open(path, "rb")
        size = os.fstat(fh.fileno()).st_size
    with fh:

        def take(n: int) -> bytes | None:
            b = fh.read(n)
            return b if len(b) == n else None

        def skip(n: int) -> bool:  # (a remote file cannot seek past its end)
            if fh.tell() + n > size:
                return False
            fh.seek(n, 1)
            return True

        while fh.tell() < size:
            magic = take(4)
            if magic is None:
                return False
            m = int.from_bytes(magic, "little")
            if m & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: its size, then as many bytes
                n = take(4)
                if n is None or not skip(int.from_bytes(n, "little")):
                    return False
                continue
            if m != 0xFD2FB528:
                return True
            d = take(1)
            if d is None:
                return False
            single = d[0] >> 5 & 1  # then window descriptor, dictionary id, content size
            if not skip((1 - single) + (0, 1, 2, 4)[d[0] & 3] + (single, 2, 4, 8)[d[0] >> 6]):
                return False
            while True:  # blocks: a 3-byte header (last flag, type, size), then the block
                h = take(3)
                if h is None:
                    return False
                v = int.from_bytes(h, "little")
                if not skip(1 if v >> 1 & 3 == 1 else v >> 3):
                    return False
                if v & 1:
                    break
            if d[0] & 4 and not skip(4):  # the content checksum
                return False
    return True


def guard_units(it: Iterable) -> Iterator:
    """Re-raise errors raised while *reading* as ReadError (not while converting)."""
    it = iter(it)
    while True:
        try:
            x = next(it)
        except StopIteration:
            return
        except (OSError, EOFError, zlib.error, zstandard.ZstdError, pa.ArrowException, MemoryError) as e:
            raise ReadError(describe_error(e)) from e
        yield x


def describe_error(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg[:200]}" if msg else type(e).__name__


def parse_line(raw: bytes, slow: set | None = None, line_no: int = 0) -> Any:
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


def read_lines(fh: io.BufferedIOBase, limit: int | None = None) -> Iterator[bytes | int]:
    """The lines of ``fh`` (as iterating it gives them), except that a line longer
    than ``limit`` bytes (MAX_LINE_BYTES; its newline counted) is read past in
    pieces, never held whole: its length in bytes (an int) comes in its place."""
    limit = MAX_LINE_BYTES if limit is None else limit
    step = min(LINE_PIECE, limit + 1)
    readline = fh.readline
    while True:
        raw = readline(step)
        if len(raw) < step or raw[-1] == 10:  # the whole line (b"": end of file)
            if not raw:
                return
            yield raw if len(raw) <= limit else len(raw)
            continue
        parts: list[bytes] | None = [raw]
        size = len(raw)
        while True:
            piece = readline(step)
            size += len(piece)
            if parts is not None:
                if size > limit:
                    parts = None  # too long: drop what was read, count the rest
                else:
                    parts.append(piece)
            if len(piece) < step or piece[-1] == 10:
                break
        yield b"".join(parts) if parts is not None else size


def iter_jsonl(fh: io.BufferedIOBase, slow: set | None = None) -> Iterator[tuple[int, Any]]:
    for i, raw in enumerate(read_lines(fh), 1):
        if isinstance(raw, int):
            yield i, Reject("too_large", f"line of {raw:,} bytes, longer than the {MAX_LINE_BYTES:,} bytes a line may have")
        else:
            yield i, parse_line(raw, slow, i)


def parquet_source(path: str, fh: io.BufferedIOBase) -> tuple[Any, pafs.FileSystem | None]:
    """What `iter_parquet` reads the file `path` (open as `fh`) from, and through which
    filesystem: the file itself when it is stored uncompressed (random access, read as
    needed), else its decompressed bytes in memory."""
    if is_plain_file(fh):
        return path, None
    if is_uri(path) and isinstance(getattr(fh, "raw", None), pa.NativeFile):  # a remote file, not compressed
        fs, p = _filesystem(path)
        return p, fs
    return pa.BufferReader(read_all(fh)), None


def iter_parquet(src: Any, filesystem: pafs.FileSystem | None = None) -> Iterator[tuple[int, Any]]:
    with pq.ParquetFile(src, filesystem=filesystem) as pf:
        n = 0
        for batch in pf.iter_batches(batch_size=4096):
            try:
                recs = batch.to_pylist()
            except (ValueError, OverflowError):  # a value Python cannot hold: find its rows
                recs = [_parquet_row(batch, i) for i in range(batch.num_rows)]
            for rec in recs:
                n += 1
                yield n, rec if isinstance(rec, Reject) else strip_nulls(rec)


def _parquet_row(batch: pa.RecordBatch, i: int) -> Any:
    """Row ``i`` of ``batch``, or a Reject naming the column whose value Python cannot
    hold (a timestamp past the year 9999, a date out of range)."""
    row = {}
    for name, col in zip(batch.schema.names, batch.columns):
        try:
            row[name] = col[i].as_py()
        except (ValueError, OverflowError) as e:
            return Reject("wrong_type", f"column '{name[:80]}' holds a value out of range ({type(e).__name__})")
    return row


def file_kind(path: str, forced: str | None) -> str:
    name = _strip_compression(_name(path).lower())
    if forced == "trajectory" or name.endswith(".traj.json"):
        return "document"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".json"):
        return "json"
    return "jsonl"


def printable_path(path: str) -> str:
    """`path` as text that can be stored and printed: a file name that is not valid
    UTF-8 reaches Python with its bad bytes as lone surrogates (PEP 383), which
    neither DuckDB nor a UTF-8 terminal accepts; they become ``\\xNN`` escapes."""
    try:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeError:
        return path.encode("utf-8", "backslashreplace").decode("utf-8")


def trajectory_stem(path: str) -> str:
    name = _strip_compression(_name(printable_path(path)))
    for suf in (".traj.json", ".json", ".jsonl"):
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def is_plain_file(fh: Any) -> bool:
    return isinstance(fh, io.BufferedReader) and isinstance(getattr(fh, "raw", None), io.FileIO)


def read_all(fh: io.BufferedIOBase, limit: int | None = None) -> bytes:
    """The whole stream; with `limit`, at most ``limit + 1`` bytes (more than `limit` means too large)."""
    try:
        return fh.read() if limit is None else fh.read(limit + 1)
    except (OSError, EOFError, zlib.error, zstandard.ZstdError, MemoryError) as e:
        raise ReadError(describe_error(e)) from e


def decode_text(data: bytes) -> str:
    return data.decode("utf-8-sig")


def doc_error(e: BaseException) -> Reject:
    if isinstance(e, UnicodeDecodeError):
        return Reject("malformed_json", f"file is not valid UTF-8 (byte {e.start})")
    if isinstance(e, json.JSONDecodeError):
        return Reject("malformed_json", f"file is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    return Reject("malformed_json", f"file is not valid JSON ({type(e).__name__})")
