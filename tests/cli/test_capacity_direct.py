"""`replay capacity TRACE` without a database (replay/cli/direct.py) gives exactly
the database path's rows: on generated Mooncake traces (ties, gaps of exactly a
TTL, empty prompts, partial blocks, another block size) over a grid of stream
modes, routings, policies, TTLs, tiers, warm-up and sampling; on the shared
Mooncake trace; and it hands every file ingest would read otherwise to the
database path."""

import json
import os

import pytest
from click.testing import CliRunner

from replay.cli.main import main
from replay.readers.direct import read_mooncake
from replay.readers.formats import detect_record

from support.hashtraces import mooncake_records, write_jsonl

GRIDS = [
    ["--block", "512", "--capacity", "1,2,3,5,8,1000"],
    ["--block", "512,1024", "--capacity", "auto", "--ttl", "5,60,3600,inf", "--stream", "global,tenant,session"],
    ["--block", "512", "--capacity", "2,4,9", "--replicas", "1,2,3", "--routing", "round-robin,random,sticky",
     "--policy", "lru,belady", "--ttl", "5,inf"],
    ["--block", "512", "--capacity", "3,6", "--replicas", "2", "--routing", "prefix", "--ttl", "60"],
    ["--block", "512", "--tier", "hbm:2,dram:4,store:8:pooled", "--tier", "hbm:5", "--replicas", "2"],
    ["--block", "512", "--capacity", "2,50", "--warmup", "0.5", "--model", "llama-3.1-8b", "--tp", "2"],
    ["--block", "512", "--capacity", "4,40", "--sample-rate", "0.5"],
]


def _run(args, cwd):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(main, args)
    finally:
        os.chdir(old)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def both(tmp_path, trace: str, args: list[str]) -> tuple[list, list]:
    """(the direct path's rows, the database path's), each in a fresh folder; the
    direct path leaves no database behind, the database path its file."""
    direct_dir, db_dir = tmp_path / "direct", tmp_path / "db"
    direct_dir.mkdir(exist_ok=True)
    db_dir.mkdir(exist_ok=True)
    direct = _run(["capacity", trace, *args, "--json"], direct_dir)
    assert not (direct_dir / "data").exists()  # (the direct path was taken)
    db = _run(["capacity", trace, *args, "--json", "--db", str(db_dir / "c.duckdb")], db_dir)
    assert (db_dir / "c.duckdb").exists()
    return direct, db


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("grid", range(len(GRIDS)))
def test_the_direct_rows_equal_the_databases(tmp_path, seed, grid):
    records = mooncake_records(seed, block_size=1024 if seed == 4 else None)
    trace = write_jsonl(tmp_path / "t.jsonl", records)
    assert {detect_record(r)[0] for r in records} == {"mooncake"}  # (so --format may be left out)
    args = GRIDS[grid] + (["--format", "mooncake"] if seed % 3 else [])
    if seed == 4:
        args = [a.replace("512,1024", "1024,2048").replace("512", "1024") for a in args]
    direct, db = both(tmp_path, trace, args)
    assert direct == db
    assert direct and any(r["hit_tokens"] for r in direct)


def test_the_shared_mooncake_trace(shared_data, tmp_path):
    trace = str(shared_data / "mooncake" / "conversation_trace.jsonl")
    direct, db = both(tmp_path, trace, ["--format", "mooncake", "--block", "512", "--capacity",
                                        "1000,10000,50000", "--replicas", "1,2", "--ttl", "60,inf"])
    assert direct == db and len(direct) == 12


@pytest.mark.parametrize("damage", ["blank", "extra_field", "float_id", "bool_ts", "short_prompt", "big_id",
                                    "two_objects", "crlf", "model", "negative_length"])
def test_a_file_ingest_reads_otherwise_goes_through_the_database(tmp_path, monkeypatch, damage):
    records = mooncake_records(1)
    lines = [json.dumps(r) for r in records]
    bad = dict(records[3])
    if damage == "blank":
        lines.insert(3, "")
    elif damage == "extra_field":
        lines[3] = json.dumps(bad | {"session": "s1"})
    elif damage == "float_id":
        lines[3] = lines[3].replace('"hash_ids": [', '"hash_ids": [1.0, ')
    elif damage == "bool_ts":
        lines[3] = json.dumps(bad | {"timestamp": True})
    elif damage == "short_prompt":
        lines[3] = json.dumps(bad | {"hash_ids": [1, 2, 3], "input_length": 1024})
    elif damage == "big_id":
        lines[3] = json.dumps(bad | {"hash_ids": [2**63]})
    elif damage == "two_objects":
        lines[3] = lines[3] + ", " + lines[4]
    elif damage == "crlf":  # (ingest reads these as they are: the direct path too)
        lines = [x + "\r" for x in lines]
    elif damage == "model":
        lines[3] = json.dumps(bad | {"model": "m"})
    elif damage == "negative_length":
        lines[3] = json.dumps(bad | {"output_length": -1})
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert (read_mooncake(str(path)) is not None) == (damage == "crlf")
    monkeypatch.chdir(tmp_path)  # (no database at the default path: the direct path would be taken if it could)
    res = CliRunner().invoke(main, ["capacity", str(path), "--block", "512", "--capacity", "2,9", "--json"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "data" / "replay.duckdb").exists() == (damage != "crlf")
    db = _run(["capacity", str(path), "--block", "512", "--capacity", "2,9", "--json", "--db",
               str(tmp_path / "x.duckdb")], tmp_path)
    assert json.loads(res.stdout) == db


def test_a_database_named_or_present_is_used(tmp_path, monkeypatch):
    """--db, or a database at the default path, keeps the database contract: LOGS are
    added to it and the rows are over everything it holds."""
    a = write_jsonl(tmp_path / "a.jsonl", mooncake_records(2))
    b = write_jsonl(tmp_path / "b.jsonl", mooncake_records(3))
    monkeypatch.chdir(tmp_path)
    args = ["--block", "512", "--capacity", "3,30", "--json"]
    alone = _run(["capacity", b, *args], tmp_path)
    assert not (tmp_path / "data").exists()
    assert CliRunner().invoke(main, ["ingest", a]).exit_code == 0  # a database at the default path now
    both_files = _run(["capacity", b, *args], tmp_path)
    assert both_files[0]["requests"] == alone[0]["requests"] + len(mooncake_records(2))


def test_another_format_or_a_large_file_is_not_read_directly(tmp_path, monkeypatch):
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}) + "\n"
                    + "\n".join(json.dumps(r) for r in mooncake_records(0)) + "\n")
    assert read_mooncake(str(chat)) is None
    trace = write_jsonl(tmp_path / "t.jsonl", mooncake_records(0))
    assert len(read_mooncake(trace)) == 60
    monkeypatch.setattr("replay.readers.direct.MAX_BYTES", 100)
    assert read_mooncake(trace) is None
