"""Inputs named by URI (replay/readers/files.py): `file:///…`, and a fake `s3://`
bucket held in pyarrow's in-memory filesystem, ingest exactly as the same files
named by plain path. No network."""

from __future__ import annotations

import gzip
import shutil
import types
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import zstandard
from click.testing import CliRunner

from replay.cli.main import main
from replay.readers import files
from replay.readers.ingest import expand_paths, ingest
from replay.store import db
from support.paths import FIXTURES, ROOT

SAMPLE = ROOT / "data" / "sample"
RAGPULSE = FIXTURES / "hashtraces" / "ragpulse"


@pytest.fixture(autouse=True)
def _fresh_filesystems(monkeypatch):
    """Each test creates its filesystems anew (they are kept by URI)."""
    monkeypatch.setattr(files, "_FILESYSTEMS", {})


def make_logs(d: Path) -> Path:
    """A log directory with every kind of file: plain, .gz, .zst (one cut short),
    parquet (plain and .zst), rejects, a subdirectory and side files to skip."""
    (d / "sub").mkdir(parents=True)
    shutil.copy(SAMPLE / "agent-anthropic.jsonl", d / "a-anthropic.jsonl")
    (d / "_truth.jsonl").write_bytes((SAMPLE / "_truth.jsonl").read_bytes())  # side file: skipped
    with gzip.open(d / "b-openai.jsonl.gz", "wb") as fh:
        fh.write((SAMPLE / "agent-openai.jsonl").read_bytes())
    chat = (SAMPLE / "chat-openai.jsonl").read_bytes()
    (d / "sub" / "c-chat.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(chat))
    cut = zstandard.ZstdCompressor().compress(chat[:5000])
    (d / "d-cut.jsonl.zst").write_bytes(cut[:-7])  # ends inside its frame: unreadable
    table = pa.Table.from_pylist([{"ts": i, "tenant": f"t{i % 3}", "tokens": list(range(i, i + 5))} for i in range(50)])
    pq.write_table(table, d / "e-tokens.parquet")
    sink = pa.BufferOutputStream()
    pq.write_table(table.slice(10), sink)
    (d / "f-tokens.parquet.zst").write_bytes(zstandard.ZstdCompressor().compress(sink.getvalue().to_pybytes()))
    (d / "g-bad.jsonl").write_text('{"not": "a log"}\n\n{oops\n')
    (d / "notes.txt").write_text("not a log")
    return d


def dump(con) -> dict:
    """Everything ingest wrote, paths reduced to their file names (the rest must be equal)."""

    def name(p: str | None) -> str | None:
        return p and Path(unquote(p.partition("?")[0])).name

    return {
        "requests": con.execute("SELECT * FROM requests ORDER BY request_id").fetchall(),
        "rejects": [(sid, name(p), *rest) for sid, p, *rest in con.execute(
            "SELECT source_id, path, line_no, reason, detail FROM rejects ORDER BY ALL").fetchall()],
        "sources": [(sid, name(p), *rest) for sid, p, *rest in con.execute(
            "SELECT source_id, path, sha256, format, lines, loaded, rejected, time_unit, time_order "
            "FROM sources ORDER BY source_id").fetchall()],
    }


def ingested(paths: list[str], **kw) -> tuple[dict, object]:
    con = db.connect(None)
    try:
        s = ingest(con, paths, **kw)
        return dump(con), s
    finally:
        con.close()


def test_a_file_uri_ingests_exactly_as_the_plain_path(tmp_path):
    logs = make_logs(tmp_path / "logs")
    want, s_plain = ingested([str(logs)])
    assert s_plain.loaded > 250 and s_plain.rejected_by_reason.get("unreadable_file") == 1
    assert {r[1] for r in want["sources"]} >= {"b-openai.jsonl.gz", "c-chat.jsonl.zst", "e-tokens.parquet",
                                               "f-tokens.parquet.zst"}
    got, s_uri = ingested([logs.as_uri() + "/"])
    assert got == want
    assert vars(s_uri) == vars(s_plain)

    con = db.connect(None)
    try:
        first = ingest(con, [logs.as_uri()])
        assert first.reconciles() and first.loaded == s_plain.loaded
        again = ingest(con, [logs.as_uri()])  # keyed by content: nothing new
        assert (again.skipped_files, again.loaded, again.rejected) == (first.files, 0, 0)
        plain = ingest(con, [str(logs)])  # the same files by plain path: the same content
        assert (plain.skipped_files, plain.loaded) == (again.skipped_files, 0)
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == first.loaded
    finally:
        con.close()


@pytest.mark.parametrize("pattern", ["*.jsonl", "**/*.jsonl*", "*.parquet*", "su*/", "*/*.zst", "[ab]-*", ".*"])
def test_a_glob_uri_matches_as_a_local_glob(tmp_path, pattern):
    logs = make_logs(tmp_path / "logs")
    (logs / ".hidden.jsonl").write_text("{}\n")
    try:
        local = expand_paths([f"{logs}/{pattern}"])
    except FileNotFoundError:
        local = None
    if local is None:
        with pytest.raises(FileNotFoundError, match="no file matches"):
            expand_paths([f"{logs.as_uri()}/{pattern}"])
        return
    uris = expand_paths([f"{logs.as_uri()}/{pattern}"])
    assert uris == sorted(uris) and all(u.startswith("file:///") for u in uris)
    assert [unquote(u[len("file://"):]) for u in uris] == local


def test_a_uri_is_percent_encoded_glob_and_all(tmp_path):
    (tmp_path / "my logs").mkdir()
    (tmp_path / "my logs" / "a b.jsonl").write_text("{}\n")
    want = [(tmp_path / "my logs" / "a b.jsonl").as_uri()]  # 'my%20logs/a%20b.jsonl'
    assert expand_paths([(tmp_path / "my logs").as_uri()]) == want
    assert expand_paths([(tmp_path / "my logs").as_uri() + "/a%20*"]) == want
    assert files.file_kind(want[0], None) == "jsonl" and files.trajectory_stem(want[0]) == "a b"


def test_a_glob_uri_ingests_its_files(tmp_path):
    logs = make_logs(tmp_path / "logs")
    want, _ = ingested([str(logs / "*.jsonl*")])
    got, s = ingested([logs.as_uri() + "/*.jsonl*"])
    assert got == want and s.files == 5  # (with _truth.jsonl: a glob takes any name it matches)


def test_missing_uris_raise_file_not_found(tmp_path):
    logs = make_logs(tmp_path / "logs")
    (tmp_path / "empty").mkdir()
    cases = {logs.as_uri() + "/nope.jsonl": "no such file or directory: 'file:///",
             (tmp_path / "empty").as_uri(): "no log files in 'file:///",
             logs.as_uri() + "/nope-*.jsonl": "no file matches 'file:///",
             (tmp_path / "gone").as_uri() + "/*.jsonl": "no file matches 'file:///"}
    for uri, msg in cases.items():
        with pytest.raises(FileNotFoundError) as e:
            expand_paths([uri])
        assert str(e.value).startswith(msg) and uri in str(e.value)


def test_a_filesystem_that_cannot_be_made_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cannot read 'nosuch://bucket/x': .*check the URI"):
        expand_paths(["nosuch://bucket/x"])
    res = CliRunner().invoke(main, ["ingest", "nosuch://bucket/x", "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)  # an input it cannot read, no traceback
    assert "cannot read 'nosuch://bucket/x'" in res.output and "Traceback" not in res.output


# ----------------------------------------------------------------- a fake bucket

@pytest.fixture
def bucket(monkeypatch):
    """`s3://bucket/…` served from pyarrow's in-memory filesystem: `FileSystem.from_uri`
    (an attribute of an extension type, which cannot be patched) is replaced in the
    module's view of pyarrow.fs. Returns (upload, the URIs from_uri was asked for)."""
    mem = pafs._MockFileSystem()
    calls: list[str] = []

    def from_uri(uri: str):
        calls.append(uri)
        scheme, _, rest = uri.partition("?")[0].partition("://")
        if scheme != "s3":
            raise pa.ArrowInvalid(f"Unrecognized filesystem type in URI: {uri}")
        return mem, unquote(rest).rstrip("/")

    fake = types.SimpleNamespace(**{k: getattr(pafs, k) for k in dir(pafs) if not k.startswith("__")})
    fake.FileSystem = types.SimpleNamespace(from_uri=from_uri)
    monkeypatch.setattr(files, "pafs", fake)

    def upload(local: Path, prefix: str) -> None:
        for f in sorted(local.rglob("*")):
            if f.is_file():
                key = f"{prefix}/{f.relative_to(local).as_posix()}"
                mem.create_dir(key.rsplit("/", 1)[0])
                with mem.open_output_stream(key, compression=None) as out:  # (not compressed again by its name)
                    out.write(f.read_bytes())

    return upload, calls


def test_a_bucket_ingests_exactly_as_the_local_files(tmp_path, bucket):
    upload, calls = bucket
    logs = make_logs(tmp_path / "logs")
    upload(logs, "bucket/logs")
    want, s_plain = ingested([str(logs)])
    uri = "s3://bucket/logs/?region=eu-west-1"  # a bucket's options ride along on every file's URI
    listed = expand_paths([uri])
    assert all(u.startswith("s3://bucket/logs/") and u.endswith("?region=eu-west-1") for u in listed)
    assert len(listed) == len(want["sources"])
    calls.clear()
    files._FILESYSTEMS.clear()
    got, s = ingested([uri])
    assert got == want and vars(s) == vars(s_plain)
    assert calls == [uri]  # the listed files reuse the listing's filesystem

    con = db.connect(None)
    try:
        first = ingest(con, [uri])
        again = ingest(con, ["s3://bucket/logs/**/*.jsonl*"])  # the 5 JSONL files seen, and _truth.jsonl
        assert (first.files, again.files, again.skipped_files) == (7, 6, 5)
        assert con.execute("SELECT count(*) FROM sources WHERE path LIKE '%_truth.jsonl'").fetchone()[0] == 1
    finally:
        con.close()
    with pytest.raises(FileNotFoundError, match="no such file or directory: 's3://bucket/nope/'"):
        expand_paths(["s3://bucket/nope/"])
    with pytest.raises(FileNotFoundError, match="a glob cannot name the bucket"):
        expand_paths(["s3://buck*/logs/"])


def test_ragpulse_side_files_are_read_beside_the_trace_in_the_bucket(tmp_path, bucket):
    upload, _ = bucket
    upload(RAGPULSE, "bucket/rag")
    want, s_plain = ingested([str(RAGPULSE)])
    got, s = ingested(["s3://bucket/rag"])
    assert s_plain.loaded == 5 and got == want
    got, _ = ingested(["s3://bucket/rag/0_trace.jsonl"], format="ragpulse")  # alone: its side files still found
    want, _ = ingested([str(RAGPULSE / "0_trace.jsonl")], format="ragpulse")
    assert got == want and all(r[22] for r in got["requests"])  # block_lengths: from the side files
