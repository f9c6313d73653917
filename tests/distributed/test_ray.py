"""``--engine ray``: the partitioned replay on a local Ray cluster gives the local rows.

One Ray cluster (2 CPUs) serves the whole module; an engine finding a session
open uses it and leaves it open. Skipped where Ray is not installed.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray")

from replay import api  # noqa: E402
from replay.cli.main import main  # noqa: E402
from replay.core.grid import Grid  # noqa: E402
from replay.core.streams import MODES  # noqa: E402
from replay.times import INF_US  # noqa: E402
from replay.distributed import DistributedReplayFailed  # noqa: E402
from replay.distributed.ray_engine import FAULT_ENV, RayEngine  # noqa: E402
from replay.store import walksets  # noqa: E402
from support.logs import generated_db  # noqa: E402
from support.walks import engine_rows as _rows  # noqa: E402

SAMPLE = "data/sample"


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _db(path, logs):
    con = api.open_db(path)
    api.ingest(con, logs)
    api.prepare(con, modes=())  # tokenized
    return con


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    con = _db(tmp_path_factory.mktemp("ray") / "s.duckdb", [SAMPLE])
    yield con
    con.close()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    con = generated_db(tmp_path_factory.mktemp("raygen"), seed=5, scale=0.1)
    yield con
    con.close()


@pytest.mark.parametrize("horizon_us", [INF_US, 300_000_000])
@pytest.mark.parametrize("data", ["sample", "generated"])
def test_ray_rows_equal_local_rows(request, data, horizon_us):
    con = request.getfixturevalue(data)
    want = _rows(con, "local", horizon_us)
    assert want
    got = _rows(con, RayEngine(partitions=3, depth=8), horizon_us)
    assert got == want
    got = _rows(con, RayEngine(depth=1), horizon_us)  # (default partitions: 2 per CPU)
    assert got == want


def test_cli_sweep_and_capacity_on_ray_equal_local(tmp_path):
    """Every TTL × block × minimum prefix × mode of the sweep, and capacity's rows."""
    def cli(*args):
        res = CliRunner().invoke(main, list(args))
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    grid = ["--stream", "tenant,key,session,global", "--ttl", "0,1m,5m,1h,inf", "--block", "1,16,64",
            "--min-prefix", "0,1024", "--json"]
    local = cli("sweep", SAMPLE, "--db", str(tmp_path / "l.duckdb"), *grid)
    on_ray = cli("sweep", SAMPLE, "--db", str(tmp_path / "r.duckdb"), *grid, "--engine", "ray")
    assert on_ray == local and len(local) == 4 * 5 * 3 * 2
    cap = ["capacity", "--stream", "global,tenant", "--block", "16", "--capacity", "64,1024", "--json"]
    assert cli(*cap, "--db", str(tmp_path / "r.duckdb"), "--engine", "ray") == \
        cli(*cap, "--db", str(tmp_path / "l.duckdb"))
    con = api.open_db(tmp_path / "l.duckdb")
    with pytest.raises(ValueError, match="unknown engine"):
        api.sweep(con, Grid(streams=("global",), ttls=(5.0,)), engine="nope")
    con.close()
    res = CliRunner().invoke(main, ["sweep", "--db", str(tmp_path / "l.duckdb"), "--address", "auto"])
    assert res.exit_code == 2 and "--address is for --engine ray" in res.output


def test_a_killed_worker_is_retried_and_the_rows_are_whole(sample, tmp_path, monkeypatch):
    want = _rows(sample, "local", variants=("prompt",))
    marker = tmp_path / "killed-once"
    monkeypatch.setenv(FAULT_ENV, f"exit-once:global/shallow:{marker}")
    got = _rows(sample, RayEngine(partitions=3, depth=8), variants=("prompt",))
    assert marker.exists()  # (the first attempt died)
    assert got == want


@pytest.mark.parametrize("fault", ["exit:global/shallow", "raise:global/shallow"])
def test_a_partition_that_keeps_failing_is_an_error_and_nothing_is_current(sample, monkeypatch, fault):
    keys = [("prompt", m) for m in MODES]
    _rows(sample, "local", variants=("prompt",))
    walksets.forget(sample, keys)
    monkeypatch.setenv(FAULT_ENV, fault)
    with pytest.raises(DistributedReplayFailed, match="global/shallow"):
        api.prepare(sample, modes=MODES, engine=RayEngine(partitions=2, depth=8, max_retries=1))
    assert walksets.stale(sample, keys, INF_US) == keys
    assert ray.is_initialized()  # (the module's session: not the engine's to close)


def test_an_engine_leaves_a_session_it_did_not_start_open(sample):
    eng = RayEngine(partitions=2)
    _rows(sample, eng, variants=("prompt",), modes=("tenant",))
    eng.close()
    assert ray.is_initialized()


def _raylets() -> int:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return sum("/raylet" in line for line in out.splitlines())


def _settle(before: int) -> int:
    deadline = time.time() + 20
    while _raylets() > before and time.time() < deadline:
        time.sleep(0.5)
    return _raylets()


_CLI = [str(Path(sys.executable).with_name("replay")), "sweep", SAMPLE, "--stream", "global", "--ttl", "inf",
        "--json", "--engine", "ray"]


@pytest.mark.slow
def test_the_command_stops_the_cluster_it_started(tmp_path):
    """`replay sweep --engine ray` in its own process, without a session open:
    it starts a local cluster and no Ray process outlives the command."""
    before = _raylets()
    res = subprocess.run([*_CLI, "--db", str(tmp_path / "x.duckdb")], capture_output=True, text=True,
                         env={**os.environ, "RAY_ADDRESS": ""}, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Started a local Ray instance" in res.stderr  # (its own cluster, not the module's)
    assert json.loads(res.stdout)
    assert _settle(before) == before


@pytest.mark.slow
def test_ctrl_c_during_the_replay_stops_the_cluster_and_records_nothing(tmp_path):
    import signal

    before = _raylets()
    db = tmp_path / "x.duckdb"
    err = open(tmp_path / "err", "w+")
    sleeping = tmp_path / "sleeping"  # created by the shallow partition's actor as it starts to sleep
    proc = subprocess.Popen([*_CLI, "--db", str(db)], stdout=subprocess.DEVNULL, stderr=err,
                            env={**os.environ, "RAY_ADDRESS": "", FAULT_ENV: f"sleep:global/shallow:120:{sleeping}"})
    try:
        deadline = time.time() + 120
        while not sleeping.exists():  # (until the tasks are running: the shallow one sleeps)
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "err").read_text()[-2000:]
            time.sleep(0.25)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _settle(before) == before
    con = api.open_db(db)
    assert walksets.stale(con, [("prompt", "global")], INF_US) == [("prompt", "global")]
    con.close()



# --------------------------------------------------------------------------- files parsed on Ray

def test_files_parsed_on_ray_are_written_as_here(tmp_path):
    """Each file parsed by a task (``replay.readers.parsed``): the same rows, ids,
    blobs, rejects, sources and counts as the single process, and re-runs add nothing."""
    from support.logs import dump, mixed_logs

    d = mixed_logs(tmp_path / "logs")
    got = {}
    for name in ("local", "ray"):
        con = api.open_db(str(tmp_path / f"{name}.duckdb"))
        with api.replay_engine(name) as engine:
            got[name] = ([api.ingest(con, [str(d)]) for _ in range(2)], dump(con))
        con.close()
        if name == "ray":
            assert engine.mapped == 2 * len(list(d.iterdir()))  # (every file, each run, parsed by a task)
    assert got["ray"] == got["local"]
    first, again = got["ray"][0]
    assert first.loaded > 50 and first.reconciles() and again.loaded == 0
    assert ray.is_initialized()  # (the module's session: an engine that found it open leaves it open)
    res = CliRunner().invoke(main, ["ingest", str(d), "--db", str(tmp_path / "cli.duckdb"), "--json",
                                    "--engine", "ray"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["loaded"] == first.loaded


def test_a_file_that_cannot_be_parsed_on_ray_stops_with_its_name():
    from replay.distributed import DistributedIngestFailed

    def parse(item):
        if item == "b.jsonl":
            raise ValueError("cannot parse")
        return item.upper()

    seen = []
    with pytest.raises(DistributedIngestFailed, match="parse of b.jsonl raised on Ray.*cannot parse"):
        for item, got in RayEngine(max_retries=0).map_ordered(parse, ["a.jsonl", "b.jsonl", "c.jsonl"]):
            seen.append((item, got))
    assert seen == [("a.jsonl", "A.JSONL")]  # (in order: what came before it is whole)


def test_parts_prepared_on_ray_tokenize_as_here(tmp_path):
    """Each task also renders and encodes its file's new body parts (the
    reference tokenizer; asked for here: by default only on a cluster larger
    than this machine): the tokenize stage takes them, with the same rows."""
    from support.logs import mixed_logs

    d = mixed_logs(tmp_path / "logs")
    rows = {}
    for name in ("local", "ray"):
        con = api.open_db(str(tmp_path / f"t{name}.duckdb"))
        tok = api.load_tokenizer(None)
        try:
            api.ingest(con, [str(d)], tokenizer=tok, engine=RayEngine(prepare_parts=True) if name == "ray" else name)
            if name == "ray":
                assert len(tok._elsewhere[0]) > 20  # (parts prepared by the tasks, waiting)
            api.tokenize(con, tok)
        finally:
            tok.close()
        rows[name] = [con.execute(q).fetchall() for q in (
            "SELECT seg_id, n_tokens, tokens FROM segments ORDER BY seg_id",
            "SELECT request_id, n_tokens, seg_ids, seg_parts, output_seg_ids FROM prompts ORDER BY request_id")]
        con.close()
    assert rows["ray"] == rows["local"] and len(rows["local"][1]) > 50


# --------------------------------------------------------------------------- --address: a cluster already running

def test_a_command_on_an_existing_cluster_gives_the_local_rows_and_leaves_it_running(tmp_path, monkeypatch):
    """The cluster is started here (``ray.cluster_utils.Cluster``: only its own
    processes are stopped after), without token authentication. (In this module,
    not a file of its own: the tests above count the machine's Ray processes.)"""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        def sweep(db, *extra):
            res = subprocess.run([sys.executable, "-m", "replay.cli.main", "sweep", "data/sample", "--db",
                                  str(tmp_path / db), "--ttl", "0,5m,inf", "--block", "1,16", "--json", *extra],
                                 capture_output=True, text=True, env=dict(os.environ), timeout=600)
            assert res.returncode == 0, res.stderr[-2000:]
            if extra:  # (joined that cluster: it did not start one of its own)
                assert f"existing Ray cluster at address: {cluster.address}" in res.stderr, res.stderr[-2000:]
            return json.loads(res.stdout)

        on_cluster = sweep("r.duckdb", "--engine", "ray", "--address", cluster.address)
        local = sweep("l.duckdb")
        assert on_cluster == local and len(local) >= 3 * 2 and {r["block"] for r in local} == {1, 16}
        # (the command disconnected; the cluster is still there for the next job)
        status = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "status", "--address",
                                 cluster.address], capture_output=True, text=True, env=dict(os.environ), timeout=120)
        assert status.returncode == 0 and "CPU" in status.stdout, status.stderr[-2000:]
    finally:
        cluster.shutdown()
