"""Ingest on local worker processes (``replay.distributed.file_pool``): the same
rows as the single process (every table, row by row) on the sample, generated
logs cut into ranges, a mix of formats and the Mooncake trace; a worker that
dies stops the ingest after the files before it; Ctrl-C and SIGKILL leave no
process behind, and a killed run run again gives the uninterrupted tables."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from replay import api
from replay.distributed import DistributedIngestFailed
from replay.distributed.file_pool import FilePool
from support.logs import mixed_logs
from support.paths import ROOT
from support.procs import TAG, assert_no_leftovers
from support.ranges import full_dump, ingest_runs, messy_lines, write_lines

SAMPLE = ROOT / "data"
MOONCAKE = Path("/work/shared/data/mooncake/conversation_trace.jsonl")


@pytest.fixture
def pool():
    p = FilePool(2)
    yield p
    procs = list(p._procs)
    p.close()
    assert all(w.proc.poll() is not None for w in procs) and p._procs == []


def test_results_come_in_order_and_workers_start_only_when_needed(pool):
    assert list(pool.map_ordered(divmod, [], 3)) == [] and pool.started == 0
    got = list(pool.map_ordered(divmod, list(range(20)), 3))
    assert got == [(i, divmod(i, 3)) for i in range(20)]
    assert pool.started == 2 and pool.mapped == 20
    assert list(pool.map_ordered(pow, [2, 3], 2)) == [(2, 4), (3, 9)]  # (another function, the same workers)
    assert pool.started == 2


def test_at_most_one_item_more_than_the_workers_is_in_flight(pool):
    drawn = []

    def items():
        for i in range(30):
            drawn.append(i)
            yield i

    ahead = [len(drawn) - k for k, _ in enumerate(pool.map_ordered(divmod, items(), 7), 1)]
    # (when an item is yielded, at most ``workers`` more were drawn: workers + 1 in flight)
    assert max(ahead) == pool.workers and len(drawn) == 30


def test_results_with_large_buffers_cross_whole_and_an_unpicklable_one_stops_the_map(pool):
    """A result's buffers (Arrow columns, bytes) travel out of band: what arrives is
    what the worker computed; one that cannot be pickled is an error naming its item."""
    from support.ranges import arrow_result, unpicklable_result

    sizes = [0, 1, 5000, 300_000]
    for n, got in pool.map_ordered(arrow_result, sizes):
        want = arrow_result(n)
        assert got[0].equals(want[0]) and got[1].equals(want[1]) and got[2] == want[2] and got[3].equals(want[3])
    with pytest.raises(DistributedIngestFailed, match=r"unpicklable_result of 7 raised in a worker process.*pickle"):
        list(pool.map_ordered(unpicklable_result, [7]))


def test_the_sample_on_two_workers_is_the_single_process(tmp_path, pool):
    want = ingest_runs(tmp_path / "one.duckdb", [[str(SAMPLE)], [str(SAMPLE)]])
    got = ingest_runs(tmp_path / "two.duckdb", [[str(SAMPLE)], [str(SAMPLE)]], engine=pool, range_bytes=64 << 10)
    assert got == want
    assert got[0][0].loaded > 200 and got[0][1].loaded == 0 and pool.mapped > 10


def test_generated_logs_and_every_kind_of_file_on_two_workers(tmp_path, pool):
    d = mixed_logs(tmp_path / "logs")
    for seed in range(4):
        write_lines(d / f"messy{seed}.jsonl", messy_lines(seed, tmp_path), random.Random(seed))
    for rb in (1, 999, 20_000):
        want = ingest_runs(tmp_path / f"one{rb}.duckdb", [[str(d)], [str(d)]])
        got = ingest_runs(tmp_path / f"two{rb}.duckdb", [[str(d)], [str(d)]], engine=pool, range_bytes=rb)
        assert got == want, rb
    assert want[0][0].rejected > 5 and want[0][1].loaded == 0


@pytest.mark.skipif(not MOONCAKE.exists(), reason="the Mooncake trace is not here")
def test_the_mooncake_trace_cut_into_ranges(tmp_path, pool):
    want = ingest_runs(tmp_path / "one.duckdb", [[str(MOONCAKE)]])
    got = ingest_runs(tmp_path / "two.duckdb", [[str(MOONCAKE)]], engine=pool, range_bytes=256 << 10)
    assert got == want and want[0][0].loaded > 10_000 and pool.mapped >= 10


def test_a_small_log_is_parsed_here_without_starting_a_worker(tmp_path, monkeypatch):
    from replay.distributed import file_pool

    started = []
    monkeypatch.setattr(file_pool._Worker, "__init__", lambda self, pool: started.append(1) or 1 / 0)
    con = api.open_db(str(tmp_path / "db.duckdb"))
    s = api.ingest(con, [str(SAMPLE)], workers=2)
    con.close()
    assert s.loaded > 200 and started == []


def test_api_ingest_with_workers_is_the_single_process(tmp_path, monkeypatch):
    from replay.distributed import file_pool
    from replay.readers import ingest as ingest_module

    pools = []
    made = file_pool.FilePool.__init__
    monkeypatch.setattr(file_pool.FilePool, "__init__", lambda self, n: pools.append(self) or made(self, n))
    monkeypatch.setattr(ingest_module, "MIN_PARALLEL_BYTES", 0)  # (the sample: three files, worth two workers now)
    want = ingest_runs(tmp_path / "one.duckdb", [[str(SAMPLE)]])
    con = api.open_db(str(tmp_path / "two.duckdb"))
    s = api.ingest(con, [str(SAMPLE)], workers=2)
    got = full_dump(con)
    con.close()
    assert (s, got) == (want[0][0], want[1])
    assert len(pools) == 1 and pools[0].started == 2 and pools[0]._procs == []  # (closed after)


def test_a_worker_that_dies_stops_the_ingest_after_the_files_before_it(tmp_path, pool):
    from support.ranges import dying_parse
    from replay.readers.ingest import ingest

    d = tmp_path / "logs"
    d.mkdir()
    for k, name in enumerate(("a", "b", "die", "z")):
        write_lines(d / f"{name}.jsonl", messy_lines(7 + k, tmp_path), random.Random(1), final_newline=True)
    con = api.open_db(str(tmp_path / "db.duckdb"))
    with pytest.raises(DistributedIngestFailed, match=r"die\.jsonl.*worker process died \(killed by SIGKILL\)"):
        ingest(con, [str(d)], engine=pool, parse=dying_parse, range_bytes=200)
    paths = [r[0] for r in con.execute("SELECT path FROM sources ORDER BY path").fetchall()]
    assert paths == [str(d / "a.jsonl"), str(d / "b.jsonl")]
    assert con.execute("SELECT count(DISTINCT source_id) FROM requests").fetchone()[0] == 2
    con.close()
    assert pool._procs == []  # (closed: a run again starts afresh)


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from replay.store import db
from replay.readers.ingest import ingest
from replay.distributed.file_pool import FilePool
from support.ranges import slow_parse
from replay.readers.parsed import parse_unit
con = db.connect({db!r})
with FilePool(2) as pool:
    s = ingest(con, [{logs!r}], engine=pool, range_bytes={rb}, parse=slow_parse if {slow} else parse_unit)
print(s.loaded, flush=True)
"""


def _run(tmp_path, db, logs, rb, slow=False, **env):
    tag = uuid.uuid4().hex
    code = SCRIPT.format(tests=str(ROOT / "tests"), db=str(db), logs=str(logs), rb=rb, slow=slow)
    full = {**{k: v for k, v in os.environ.items() if k != "REPLAY_FAILPOINT"}, TAG: tag, **env}
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=full, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    return p, tag


def test_ctrl_c_leaves_no_worker_behind(tmp_path):
    d = mixed_logs(tmp_path / "logs")
    marker = tmp_path / "parsing"
    p, tag = _run(tmp_path, tmp_path / "db.duckdb", d, 500, slow=True, REPLAY_TEST_MARKER=str(marker))
    deadline = time.monotonic() + 60
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), p.communicate()
    os.killpg(p.pid, signal.SIGINT)  # (the terminal's Ctrl-C: the whole foreground group)
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "KeyboardInterrupt" in err and out == ""
    assert_no_leftovers(tag)


@pytest.mark.parametrize("point", ["ingest.file_loaded:3", "ingest.file_committed:2"])
def test_a_killed_run_run_again_gives_the_uninterrupted_tables(tmp_path, point):
    d = mixed_logs(tmp_path / "logs")
    want = ingest_runs(tmp_path / "one.duckdb", [[str(d)]])[1]
    db = tmp_path / "killed.duckdb"
    p, tag = _run(tmp_path, db, d, 700, REPLAY_FAILPOINT=point)
    p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL
    assert_no_leftovers(tag)
    p, tag = _run(tmp_path, db, d, 700)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert_no_leftovers(tag)
    con = api.open_db(str(db))
    got = full_dump(con)
    con.close()
    assert got == want


def test_ray_parses_the_same_ranges(tmp_path):
    ray = pytest.importorskip("ray")
    from replay.distributed.ray_engine import RayEngine

    d = mixed_logs(tmp_path / "logs")
    want = ingest_runs(tmp_path / "one.duckdb", [[str(d)]])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        engine = RayEngine()
        got = ingest_runs(tmp_path / "ray.duckdb", [[str(d)]], engine=engine, range_bytes=700)
        assert got == want and engine.mapped > len(want[1]["sources"])
    finally:
        ray.shutdown()
