"""``make("local", workers=N)``: the replay in worker processes gives the single pass's rows.

The single pass (no engine) is the oracle: every (variant, mode) row of
`walks`, compared whole, on the shipped sample, generated logs at several
horizons (∞, 5 min, and exactly a gap the log holds, and one µs under it), and
the Mooncake trace (skipped when the shared data is absent); whole sets and,
with more workers than sets, partitions. Failures: a worker that dies or
raises stops the replay and records nothing; no worker and no temporary file
outlives the call, Ctrl-C included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from replay import api, distributed
from replay.core.streams import MODES, VARIANTS
from replay.distributed import DistributedReplayFailed
from replay.distributed.local_engine import FAULT_ENV, LocalEngine, components, plan
from replay.store import walksets
from replay.times import INF_US
from support import procs
from support.logs import generated_db
from support.walks import engine_rows as _rows
from support.paths import ROOT



@pytest.fixture(scope="module")
def engine():
    eng = LocalEngine(workers=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    con = generated_db(tmp_path_factory.mktemp("localgen"), seed=7, scale=1.0)
    yield con
    con.close()


def _leftover_folders(con) -> list[str]:
    path = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]
    folder = os.path.dirname(os.path.abspath(path))
    return [f for f in os.listdir(folder) if f.startswith(".replay-walkers-")]


def test_make_gives_a_local_engine_only_for_several_workers():
    assert distributed.make("local") is None and distributed.make("local", workers=1) is None
    eng = distributed.make("local", workers=3)
    try:
        assert isinstance(eng, LocalEngine) and eng.workers == 3
    finally:
        eng.close()
    with pytest.raises(ValueError):
        distributed.make("local", workers=2, partitions=4)


def test_the_plan_gives_whole_global_sets_and_groups_of_whole_streams():
    # two tenants; a key shared by two sessions of one tenant; a session under two keys
    streams = [("a", "k1", "s1", 100), ("a", "k1", "s2", 100), ("a", "k2", "s2", 50),
               ("b", None, "s3", 300), ("b", None, None, 20)]
    group, weight = components(("tenant", "key", "session"), streams)
    assert len(weight) == 2 and sorted(weight) == [250, 320]
    assert group[("a", "k1", "s1")] == group[("a", "k2", "s2")] != group[("b", None, None)]
    by_session = components(("session",), streams)[1]  # (session mode alone: finer groups)
    assert sorted(by_session) == [20, 100, 150, 300]
    shares = plan(MODES, ("prompt",), 2, streams=streams)
    assert [s["sets"] for s in shares] == [[("prompt", "global")], []]
    assert shares[1]["scoped"] == [("prompt", m) for m in ("tenant", "key", "session")]
    everything = {t[:3] for t in streams}
    assert set().union(*(s["streams"] for s in shares)) == everything  # (each group walked once)
    assert not shares[0]["streams"] & shares[1]["streams"]
    # fewer workers with work than asked: one group, no global set
    assert len(plan(("tenant",), ("prompt",), 3, streams=[("a", None, None, 5)])) == 1
    tasks = plan(("global",), ("prompt", "prompt+output"), 3)  # 2 global sets, 3 workers: partitions
    assert [len(s["tasks"]) for s in tasks] == [1, 1, 2]
    assert sorted(t for s in tasks for t in s["tasks"]) == ["global/0", "global/1", "global/2", "global/shallow"]


@pytest.mark.parametrize("horizon_us", [INF_US, 300_000_000])
def test_rows_equal_the_single_pass_on_the_sample(sample_con, engine, horizon_us):
    want = _rows(sample_con, None, horizon_us)
    assert want
    assert _rows(sample_con, engine, horizon_us) == want
    assert not _leftover_folders(sample_con)


def test_rows_equal_the_single_pass_on_generated_logs_at_several_horizons(generated, engine):
    want_inf = _rows(generated, None, INF_US)
    assert len(want_inf) > 8 * 200
    assert _rows(generated, engine, INF_US) == want_inf
    # exact TTL boundaries: a gap the log holds, as the horizon and one µs under it
    gap = sorted({g for row in want_inf for g in row[7] if 0 < g < 3_600_000_000})[len(want_inf) % 7]
    for horizon in (300_000_000, gap, gap - 1):
        assert _rows(generated, engine, horizon) == _rows(generated, None, horizon), horizon


@pytest.mark.parametrize("workers, modes, variants", [
    (3, ("global",), ("prompt", "prompt+output")),   # 2 sets, 3 workers: partitions, global halves merged
    (4, ("global", "session"), ("prompt",)),         # a whole global set, sessions in groups
    (3, ("tenant", "key"), ("prompt+output",)),      # groups of tenants (with their keys) only
])
def test_more_workers_than_sets_split_the_sets_into_partitions(generated, workers, modes, variants):
    want = _rows(generated, None, 600_000_000, modes, variants)
    eng = LocalEngine(workers=workers, depth=8)  # (a shallow K: most global rows are spliced)
    try:
        assert _rows(generated, eng, 600_000_000, modes, variants) == want
        assert 1 < eng.most_workers <= workers
    finally:
        eng.close()


def test_block_traces_give_the_single_pass_rows(shared_data, tmp_path, engine):
    con = api.open_db(tmp_path / "m.duckdb")
    try:
        api.ingest(con, [str(shared_data / "mooncake" / "conversation_trace.jsonl")])
        for horizon in (INF_US, 60_000_000):
            want = _rows(con, None, horizon, ("global", "tenant"), ("prompt",))
            assert len(want) == 2 * 12_031
            assert _rows(con, engine, horizon, ("global", "tenant"), ("prompt",)) == want
        eng = LocalEngine(workers=2, depth=4)
        try:  # (one set, two workers: the global mode's partitions)
            want = _rows(con, None, INF_US, ("global",), ("prompt",))
            assert _rows(con, eng, INF_US, ("global",), ("prompt",)) == want
        finally:
            eng.close()
    finally:
        con.close()


def _gone(pids, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        alive.append(pid)
            except OSError:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("fault", ["exit:prompt/global", "raise:prompt/global"])
def test_a_worker_that_fails_stops_the_replay_and_nothing_is_current(sample_con, engine, monkeypatch, fault):
    keys = [("prompt", m) for m in MODES]
    _rows(sample_con, None, variants=("prompt",))
    walksets.forget(sample_con, keys)
    monkeypatch.setenv(FAULT_ENV, fault)
    how = "died" if fault.startswith("exit") else "raised: RuntimeError: injected failure"
    with pytest.raises(DistributedReplayFailed, match=f"prompt/global.*{how}"):
        api.prepare(sample_con, modes=MODES, engine=engine)
    assert walksets.stale(sample_con, keys, INF_US) == keys
    assert not _leftover_folders(sample_con)
    assert engine.last_pids and _gone(engine.last_pids)


def test_no_worker_outlives_a_replay(sample_con, engine):
    _rows(sample_con, engine, modes=("tenant", "global"), variants=("prompt",))
    assert len(engine.last_pids) == 2 and _gone(engine.last_pids)
    assert not _leftover_folders(sample_con)


def test_an_engine_closed_leaves_no_helper_process(sample_con):
    from multiprocessing import forkserver

    eng = LocalEngine(workers=2)
    try:
        _rows(sample_con, eng, modes=("session",), variants=("prompt",))
        # (the fork server is this engine's to stop when it started it: not when another engine had)
        helpers = [forkserver._forkserver._forkserver_pid] if eng._started_server else []
    finally:
        eng.close()
    assert eng.last_pids and _gone([*eng.last_pids, *helpers])


_SCRIPT = """
import sys
from replay import api
from replay.distributed.local_engine import LocalEngine
con = api.open_db(sys.argv[1])
api.ingest(con, ["data/sample"])
api.prepare(con, modes=("global", "tenant"), engine=LocalEngine(workers=2))
"""


@pytest.mark.slow
def test_ctrl_c_during_the_replay_ends_the_workers_and_records_nothing(tmp_path):
    db = tmp_path / "x.duckdb"
    sleeping = tmp_path / "sleeping"  # created by the global set's worker as it starts to sleep
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "REPLAY_FAILPOINT"}
    env.update({procs.TAG: tag, FAULT_ENV: f"sleep:prompt/global:120:{sleeping}"})
    err = open(tmp_path / "err", "w+")
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(db)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.time() + 120
        while not sleeping.exists():  # (until the workers run: the global one sleeps)
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "err").read_text()[-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in (tmp_path / "err").read_text()  # (the interruption happened, in the replay)
    procs.assert_no_leftovers(tag)
    con = api.open_db(db)
    try:
        assert walksets.stale(con, [("prompt", "global")], INF_US) == [("prompt", "global")]
        assert not _leftover_folders(con)
    finally:
        con.close()


def test_the_progress_bar_counts_every_request_once(sample_con, engine, monkeypatch):
    import tqdm.auto

    counted = []

    class Bar:
        def __init__(self, total=None, **_):
            self.total, self.n = total, 0

        def update(self, n=1):
            self.n += n

        def close(self):
            counted.append((self.n, self.total))

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    walksets.forget(sample_con, [(v, m) for v in VARIANTS for m in MODES])
    api.prepare(sample_con, modes=MODES, variants=VARIANTS, progress=True, engine=engine)
    total = sample_con.execute("SELECT count(*) FROM walks WHERE variant = 'prompt' AND mode = 'tenant'").fetchone()[0]
    assert counted == [(total, total)]


@pytest.mark.parametrize("when_worth", [True, False])
def test_a_lazy_engine_is_made_on_first_use_and_only_where_it_pays(sample_con, when_worth):
    """``make("local", workers=2, warm=False)`` (a command's engine): nothing is
    started until a replay needs it; with ``when_worth`` a log under the
    threshold (the sample) replays in this process. The rows are the single pass's."""
    single = _rows(sample_con, None)
    eng = distributed.make("local", workers=2, warm=False, when_worth=when_worth)
    try:
        assert eng.workers == 2 and eng._engine is None
        assert _rows(sample_con, eng) == single
        assert (eng._engine is None) == when_worth
    finally:
        eng.close()
