"""Faults: a run killed anywhere and run again gives exactly an uninterrupted
run's results; Ctrl-C, a full or read-only disk and a damaged or foreign
database end in a clear message and an intact file; no helper process outlives
its command.

Each run is a real process (`python -c "...main()"`), tagged with an
environment variable its helpers inherit, so leftovers are found in /proc
whoever their parent is now. Kills land at failpoints (replay/store/failpoints.py):
the same place every time.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import pytest
from support.procs import assert_no_leftovers, database_held, replay, start, tagged
from support.paths import ROOT

SAMPLE = ROOT / "data" / "sample"
TABLES = ("sources", "requests", "blobs", "rejects", "segments", "prompts", "meta", "walks", "walk_sets",
          "set_aside", "results")
def state(db: Path) -> dict:
    """Every table's row count and an order-free hash of its rows (the time a
    file was ingested aside)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for t in TABLES:
            cols = [r[0] for r in con.execute(f"DESCRIBE {t}").fetchall() if r[0] != "ingested_at"]
            out[t] = con.execute(f"SELECT count(*), sum(hash(struct_pack({', '.join(cols)})))::VARCHAR "
                                 f"FROM {t}").fetchone()
        return out
    finally:
        con.close()


def files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


SWEEP = ["sweep", SAMPLE, "--json"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted `sweep` on the sample: its output and tables."""
    db = tmp_path_factory.mktemp("reference") / "replay.duckdb"
    code, out, err, tag = replay(SWEEP + ["--db", db])
    assert code == 0, err
    assert_no_leftovers(tag)
    return out, state(db)


# the places a stage can stop: inside a file's or a chunk's open transaction,
# between files, between a stage and the next, between the walks and their record
STAGE_POINTS = ["ingest.file_loaded:2", "ingest.file_committed:1", "ingest.file_committed:3",
                "tokenize.chunk_written", "tokenize.chunk_committed", "prepare.tokenized",
                "replay.walks_inserted", "prepare.replayed", "sweep.results_deleted"]


@pytest.mark.parametrize("point", STAGE_POINTS)
def test_a_run_killed_at_a_stage_boundary_or_mid_stage_then_rerun_equals_an_uninterrupted_one(
        tmp_path, reference, point):
    db = tmp_path / "replay.duckdb"
    code, out, _, tag = replay(SWEEP + ["--db", db], failpoint=point)
    assert code == -signal.SIGKILL, f"the failpoint {point} was not reached"
    assert out == ""  # nothing presented
    assert_no_leftovers(tag)  # the encoder helper goes with its parent
    code, out, err, tag = replay(SWEEP + ["--db", db])
    assert code == 0, err
    assert (out, state(db)) == reference
    assert_no_leftovers(tag)


@pytest.mark.parametrize("point", ["ingest.file_loaded:2:INT", "tokenize.chunk_written:1:INT",
                                   "replay.walks_inserted:1:INT"])
def test_ctrl_c_leaves_the_database_consistent_and_no_helper_behind(tmp_path, reference, point):
    db = tmp_path / "replay.duckdb"
    code, out, err, tag = replay(SWEEP + ["--db", db], failpoint=point)
    assert code == 1 and "Aborted" in err and "Traceback" not in err and out == ""
    assert_no_leftovers(tag)
    code, out, err, _ = replay(SWEEP + ["--db", db])
    assert code == 0, err
    assert (out, state(db)) == reference


def _interrupted_at(db: Path, tag: str, delay: float, sig: int) -> tuple[subprocess.Popen, str]:
    """A sweep into a new ``db`` sent ``sig`` ``delay`` seconds after its start;
    where it ended first (a machine running at another pace), again from a new
    database with half the delay. The process the signal interrupted, and its stderr."""
    while True:
        p = start(SWEEP + ["--db", db], tag)
        time.sleep(delay)  # (the random time is the point: there is no condition to wait for)
        p.send_signal(sig)
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            return p, err
        assert delay > 0.01, "the command always ended before the signal"
        delay /= 2
        for f in (db, db.with_name(db.name + ".wal")):
            f.unlink(missing_ok=True)


def test_kills_at_random_times_then_rerun_equal_an_uninterrupted_run(tmp_path, reference):
    rng = random.Random(25)
    for i in range(3):
        db = tmp_path / f"r{i}.duckdb"
        tag = uuid.uuid4().hex
        sig = signal.SIGKILL if i % 2 == 0 else signal.SIGINT
        p, err = _interrupted_at(db, tag, rng.uniform(0.2, 2.0), sig)
        # the signal stopped it: killed, or Ctrl-C's exit (1; the signal itself before the
        # interpreter has its handler)
        assert p.returncode in ((-signal.SIGKILL,) if sig == signal.SIGKILL else (1, -signal.SIGINT)), err
        assert_no_leftovers(tag)
        code, out, err, _ = replay(SWEEP + ["--db", db])
        assert code == 0, err
        assert (out, state(db)) == reference


def test_tokenize_killed_between_two_chunks_resumes_exactly(tmp_path, reference):
    """The sample is one chunk for the CLI; here it is tokenized in chunks of 40
    requests and killed after the second commit."""
    db = tmp_path / "replay.duckdb"
    script = ("import sys; from replay import api; from replay.text.tokenize import tokenize_stage; "
              f"con = api.open_db({str(db)!r}); api.ingest(con, [{str(SAMPLE)!r}]); "
              "tokenize_stage(con, chunk_requests=40)")
    env = {**os.environ, "REPLAY_FAILPOINT": "tokenize.chunk_committed:2"}
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert 0 < con.execute("SELECT count(*) FROM prompts").fetchone()[0] < 268  # stopped halfway
    con.close()
    code, out, err, _ = replay(SWEEP + ["--db", db])
    assert code == 0, err
    assert (out, state(db)) == reference


def test_a_report_killed_midway_leaves_no_report_and_a_rerun_writes_the_same_files(tmp_path_factory):
    same_time = {"SOURCE_DATE_EPOCH": "1764633600"}  # the report's "generated at"
    ref = tmp_path_factory.mktemp("ref")
    code, _, err, _ = replay(["run", SAMPLE, "--db", ref / "db.duckdb", "--out", ref, "--name", "r"], **same_time)
    assert code == 0, err
    work = tmp_path_factory.mktemp("work")
    args = ["run", SAMPLE, "--db", work / "db.duckdb", "--out", work, "--name", "r"]
    assert replay(args)[0] == 0  # a whole report first: the killed run must not leave it standing
    code, _, _, tag = replay(args, failpoint="report.section:2", **same_time)
    assert code == -signal.SIGKILL
    assert not (work / "r" / "report.md").exists()
    assert_no_leftovers(tag)
    code, _, err, _ = replay(args, **same_time)
    assert code == 0, err
    assert files(work / "r") == files(ref / "r")


# --------------------------------------------------------------- disks and files

def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small file system here (needs root): " + r.stderr.decode()[:100])


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "3m")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_full_disk_gives_a_clear_error_and_an_intact_database(small_disk, reference):
    db = small_disk / "replay.duckdb"
    code, out, err, tag = replay(SWEEP + ["--db", db])
    assert code == 1 and out == "", err
    assert "No space left on device" in err and "free some space" in err and "Traceback" not in err
    assert_no_leftovers(tag)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    code, out, err, _ = replay(SWEEP + ["--db", db])
    assert code == 0, err
    assert (out, state(db)) == reference


def test_a_full_disk_under_the_report_is_a_clear_error(tmp_path, small_disk):
    with open(small_disk / "filler", "wb") as f:  # leave the report no room
        try:
            f.write(b"\0" * (3 << 20))
        except OSError:
            pass
    code, _, err, _ = replay(["run", SAMPLE, "--db", tmp_path / "db.duckdb", "--out", small_disk])
    assert code == 1 and "No space left on device" in err and "Traceback" not in err, err


def test_a_read_only_folder_or_disk_is_a_clear_error(tmp_path):
    disk = tmp_path / "ro"
    _mount_tmpfs(disk, "8m")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        for db in (disk / "replay.duckdb", disk / "sub" / "replay.duckdb"):
            code, out, err, _ = replay(SWEEP + ["--db", db])
            assert code == 1 and out == "" and "Traceback" not in err, err
            assert "give --db" in err and "folder you can write" in err
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_file_that_is_not_a_database_is_refused_and_left_as_it_was(tmp_path):
    db = tmp_path / "notes.duckdb"
    shutil.copy(SAMPLE / "chat-openai.jsonl", db)
    before = db.read_bytes()
    code, out, err, _ = replay(SWEEP + ["--db", db])
    assert code == 1 and "cannot open the database" in err and "Traceback" not in err, err
    assert db.read_bytes() == before


@pytest.mark.parametrize("layout", ["float-seconds", "newer"])
def test_a_database_of_another_layout_is_refused_and_left_as_it_was(tmp_path, layout):
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    if layout == "float-seconds":
        con.execute("CREATE TABLE requests (request_id BIGINT, ts DOUBLE)")
    else:
        con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        con.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    con.close()
    before = state_of_any(db)
    code, _, err, _ = replay(SWEEP + ["--db", db])
    assert code == 1 and "start a new one" in err and "Traceback" not in err, err
    assert state_of_any(db) == before
    code, _, err, _ = replay(["run", SAMPLE, "--db", db, "--fresh", "--out", tmp_path / "rep"])
    assert code == 0, err  # the advice works


def state_of_any(db: Path) -> list:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [(t, con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall())
                for (t,) in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()]
    finally:
        con.close()


def test_fresh_refuses_to_delete_a_database_in_use_and_removes_its_log(tmp_path):
    db = tmp_path / "held.duckdb"
    with database_held(db, "CREATE TABLE t (x INT)"):
        code, _, err, _ = replay(["run", SAMPLE, "--db", db, "--fresh", "--out", tmp_path / "rep"])
        assert code == 1 and "in use by another process" in err and "Traceback" not in err, err
        assert db.exists()
    (tmp_path / "held.duckdb.wal").write_bytes(b"stale log of a killed run")
    code, _, err, _ = replay(["run", SAMPLE, "--db", db, "--fresh", "--out", tmp_path / "rep"])
    assert code == 0, err


# --------------------------------------------------------------- helper processes

def test_no_helper_outlives_a_command_that_succeeds_or_fails(tmp_path):
    code, _, err, tag = replay(SWEEP + ["--db", tmp_path / "a.duckdb"])
    assert code == 0, err
    assert_no_leftovers(tag)
    bad = tmp_path / "tok"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    for command in (SWEEP, ["diagnose", SAMPLE]):
        code, _, err, tag = replay(command + ["--db", tmp_path / f"{command[0]}.duckdb", "--tokenizer", bad])
        assert code == 2 and "cannot load the tokenizer" in err and "Traceback" not in err, err
        assert_no_leftovers(tag)
    from tokenizers import Tokenizer, models, pre_tokenizers

    no_unknown = tmp_path / "wordlevel"  # loads, then cannot encode a word it does not know
    no_unknown.mkdir()
    tk = Tokenizer(models.WordLevel({"a": 0, "b": 1}))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(no_unknown / "tokenizer.json"))
    code, _, err, tag = replay(SWEEP + ["--db", tmp_path / "c.duckdb", "--tokenizer", no_unknown])
    assert code == 2 and "cannot encode" in err and "Traceback" not in err, err
    assert_no_leftovers(tag)


def test_ctrl_c_from_outside_while_the_encoder_works(tmp_path, reference):
    tag = uuid.uuid4().hex
    db = tmp_path / "a.duckdb"
    p = start(SWEEP + ["--db", db], tag)
    deadline = time.monotonic() + 60
    while len(tagged(tag)) < 2 and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until the encoder helper is up
    assert p.poll() is None, "the command ended before its helper was seen"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "Aborted" in err, (p.returncode, err)  # Ctrl-C stopped it
    assert "Traceback" not in err, err
    assert_no_leftovers(tag)
    code, out, err, _ = replay(SWEEP + ["--db", db])
    assert code == 0, err
    assert (out, state(db)) == reference


def test_a_command_with_nothing_to_tokenize_leaves_no_helper_traceback(tmp_path):
    """The helper starts loading at once; a command that ends before asking it
    anything must not leave it to print a broken pipe."""
    code, _, err, tag = replay(["sweep", "--db", tmp_path / "empty.duckdb"])
    assert code == 1 and "holds no requests" in err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert_no_leftovers(tag)


def test_a_sweep_killed_while_replacing_its_results_keeps_the_previous_ones(tmp_path):
    db = tmp_path / "replay.duckdb"
    assert replay(SWEEP + ["--db", db, "--ttl", "5m"])[0] == 0
    before = state(db)["results"]
    code, *_ = replay(SWEEP + ["--db", db, "--ttl", "1h,inf"], failpoint="sweep.results_deleted")
    assert code == -signal.SIGKILL
    assert state(db)["results"] == before  # the delete was rolled back with the kill


def test_remove_db_takes_the_write_ahead_log_with_the_file(tmp_path):
    from replay import api

    db = tmp_path / "replay.duckdb"
    api.open_db(db).close()
    Path(f"{db}.wal").write_bytes(b"a log left by a killed run")
    api.remove_db(db)
    assert not db.exists() and not Path(f"{db}.wal").exists()
