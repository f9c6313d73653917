"""Warm-up (``--warmup f``): the replay sees every request, the figures count only
the last 1 − f of them by time. Sweep and capacity against the brute force
restricted to the measured requests, on generated logs with ties at the cut."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.capacity import COLUMNS, CapacityGrid
from replay.analysis.capacity import capacity as run_capacity
from replay.cli.main import main
from replay.core import capacity as cap
from support import oracle
from replay.core.grid import Grid
from replay.core.streams import stream_key
from replay.core.sweep import sweep
from replay.times import INF_US
from replay.core.warmup import measured_mask, parse_warmup, warmup_count
from replay.store import db

from support.gen import US, random_requests, use_engine
from support.logs import write_tokens_log as _write_tokens_log
from support.walks import rounded as _rounded
from support.walks import store as _store

GRID_ARGS = dict(ttls=(0, 2, 5, 30, math.inf), blocks=(1, 2, 3, 16), min_prefixes=(0, 4),
                 streams=("tenant", "key", "session", "global"))


def _key(r):
    return (r["stream"], math.inf if r["ttl_s"] is None else r["ttl_s"], r["block"], r["min_prefix"])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("warmup", [0.5, 0.3, 0.9, 0.01])
def test_sweep_with_warmup_equals_the_oracle_on_the_measured_requests(seed, warmup):
    """Ties in time at the cut (gaps of 0 s): the earlier in input order is warm-up."""
    reqs = random_requests(seed, n=9 + 4 * seed, jitter_us=(0, 0, -1, 1),
                           models=(None, "m1") if seed % 2 else (None,))
    con = db.connect(None)
    _store(con, reqs)
    g = Grid(**GRID_ARGS, warmup=warmup)
    got = sweep(con, g).to_dicts()
    want = oracle.sweep(reqs, g.streams, g.ttls, g.blocks, g.min_prefixes, warmup=warmup)
    assert all(r.pop("warmup") == warmup for r in got)
    assert _rounded(sorted(got, key=_key)) == _rounded(sorted(want, key=_key))
    cut = {0.5: len(reqs) // 2, 0.3: 3 * len(reqs) // 10, 0.9: 9 * len(reqs) // 10, 0.01: len(reqs) // 100}[warmup]
    assert {r["requests"] for r in got} == {len(reqs) - cut}
    # the whole log's rows are kept beside the warm-up's, not replaced by them
    sweep(con, Grid(**GRID_ARGS))
    profiles = dict(con.execute("SELECT profile, count(*) FROM results GROUP BY profile").fetchall())
    assert profiles == {"ideal": g.size, f"ideal warmup={warmup:g}": g.size}


def test_a_warmup_of_zero_is_the_whole_log_and_keeps_the_columns():
    reqs = random_requests(3, n=30)
    con = db.connect(None)
    _store(con, reqs)
    a = sweep(con, Grid(**GRID_ARGS))
    b = sweep(con, Grid(**GRID_ARGS, warmup=0))
    assert "warmup" not in a.columns and a.equals(b)
    want = oracle.sweep(reqs, GRID_ARGS["streams"], GRID_ARGS["ttls"], GRID_ARGS["blocks"],
                        GRID_ARGS["min_prefixes"])
    assert _rounded(sorted(a.to_dicts(), key=_key)) == _rounded(sorted(want, key=_key))


def test_by_stream_rows_with_warmup_add_up_to_the_aggregate():
    reqs = random_requests(5, n=40, models=(None, "m"))
    con = db.connect(None)
    _store(con, reqs)
    g = Grid(**GRID_ARGS, warmup=0.5)
    agg = {_key(r): r for r in sweep(con, g).to_dicts()}
    sums: dict = {}
    for r in sweep(con, g, by_stream=True).to_dicts():
        s = sums.setdefault(_key(r), [0, 0, 0, 0])
        for i, c in enumerate(("requests", "prompt_tokens", "hit_tokens", "requests_hit")):
            s[i] += r[c]
    assert sums and all(tuple(v) == tuple(agg[k][c] for c in ("requests", "prompt_tokens", "hit_tokens",
                                                              "requests_hit")) for k, v in sums.items())


def test_parse_warmup_and_the_cut_are_exact():
    assert parse_warmup("0.5") == 0.5 and parse_warmup("50%") == 0.5 and parse_warmup(0) == 0.0
    for bad in ("1", "1.0", "-0.1", "abc", "nan", "2%x"):
        with pytest.raises(ValueError):
            parse_warmup(bad)
    # 0.29 · 100 is 28.999… in floats; the cut is read through the decimal digits
    assert warmup_count(100, 0.29) == 29 and warmup_count(10, 0.7) == 7 and warmup_count(7, 0.5) == 3
    assert warmup_count(0, 0.5) == 0 and warmup_count(1, 0.99) == 0
    # ties in time: the earlier request id is the warm-up
    keep = measured_mask([5, 5, 5, 1], [3, 1, 2, 9], 0.5)
    assert keep.tolist() == [True, False, True, False]


# ------------------------------------------------------------------ capacity

@pytest.fixture(params=["compiled"])  # (the capacity kernel is compiled only: replay/core/_capacity.pyx)
def counts_engine(request, monkeypatch):
    return use_engine(request, monkeypatch, cap, "capacity pass")


def _replicas(reqs, mode, replicas, routing):
    if replicas == 1:  # (one replica: every routing is the same)
        return [0] * len(reqs)
    order = oracle.time_order(reqs)
    router = cap.Router(replicas, routing, 0, len(reqs))
    replica_of = [0] * len(reqs)
    for pos, i in enumerate(order):
        replica_of[i] = router(pos, stream_key(mode, reqs[i].tenant, reqs[i].key, reqs[i].session))
    return replica_of


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("warmup", [0.5, 0.25])
def test_capacity_with_warmup_equals_the_contract_on_the_measured_requests(tmp_path, seed, warmup,
                                                                           counts_engine):
    """One pass (round-robin, sticky) and the simulated rules (prefix routing,
    belady): hits and prompt tokens of the measured requests only, every
    capacity and TTL; warm_hit_ratio stays the last half's."""
    reqs = random_requests(40 + seed, n=26, alphabet=2, max_len=90, gaps=(0, 1, 5, 20), models=(None, "m"))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    con = api.open_db(tmp_path / "w.duckdb")
    api.ingest(con, [str(log)])
    grid = CapacityGrid(blocks=(1, 8), capacities=("1", "3", "20", "400"), ttls=(5.0, math.inf),
                        streams=("global", "tenant"), replicas=(1, 2), routings=("round-robin", "sticky", "prefix"),
                        policies=("lru", "belady"), warmup=warmup)
    df = run_capacity(con, grid)
    assert list(df.columns) == COLUMNS + ["warmup"] and (df["warmup"] == warmup).all()
    keep = oracle.measured(reqs, warmup)
    order = oracle.time_order(reqs)
    half = order[len(order) // 2:]
    prompt = sum(len(reqs[i].tokens) for i in keep)
    checked = 0
    for r in df.to_dicts():
        mode, block, c, R = r["stream"], r["block"], r["capacity_blocks"], r["replicas"]
        ttl = INF_US if r["ttl_s"] is None else int(r["ttl_s"] * US)
        if r["routing"] == "prefix" and R > 1:
            want, _ = oracle.capacity_hits_by_rule(reqs, mode, block, c, ttl, R, routing="prefix",
                                                   policy=r["policy"])
        else:
            replica_of = _replicas(reqs, mode, R, r["routing"])
            if r["policy"] == "belady":
                want, _ = oracle.capacity_hits_by_rule(reqs, mode, block, c, ttl, R, replica_of=replica_of,
                                                       policy="belady")
            else:
                want = oracle.capacity_hits(reqs, mode, block, c, ttl, replica_of)
        assert (r["requests"], r["prompt_tokens"]) == (len(keep), prompt), r
        assert r["hit_tokens"] == sum(want[i] for i in keep), r
        assert r["hit_ratio"] == pytest.approx(sum(want[i] for i in keep) / prompt)
        warm_prompt = sum(len(reqs[i].tokens) for i in half)
        assert r["warm_hit_ratio"] == pytest.approx(sum(want[i] for i in half) / warm_prompt)
        checked += 1
    assert checked == len(df) > 0


def test_capacity_warmup_refuses_a_sampled_run():
    with pytest.raises(ValueError, match="warm-up"):
        CapacityGrid(sample_rate=0.5, warmup=0.5)
    with pytest.raises(ValueError):
        CapacityGrid(warmup=1.5)


# ------------------------------------------------------------------ command line and report

def test_the_commands_take_warmup_and_print_exactly_json(tmp_path):
    reqs = random_requests(11, n=30, alphabet=3, max_len=60)
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    dbp = str(tmp_path / "c.duckdb")
    run = CliRunner().invoke
    res = run(main, ["sweep", str(log), "--db", dbp, "--ttl", "5,inf", "--block", "1", "--min-prefix", "0",
                     "--stream", "global", "--warmup", "0.5", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows and all(r["warmup"] == 0.5 for r in rows)
    want = oracle.sweep(reqs, ("global",), (5, math.inf), (1,), (0,), warmup=0.5)
    assert sorted((r["ttl_s"] or math.inf, r["hit_tokens"], r["prompt_tokens"], r["requests"]) for r in rows) == \
        sorted((w["ttl_s"] or math.inf, w["hit_tokens"], w["prompt_tokens"], w["requests"]) for w in want)
    whole = json.loads(run(main, ["sweep", "--db", dbp, "--ttl", "5,inf", "--block", "1", "--min-prefix", "0",
                                  "--stream", "global", "--json"]).stdout)
    assert all("warmup" not in r for r in whole) and whole[0]["requests"] == len(reqs)
    res = run(main, ["capacity", "--db", dbp, "--capacity", "5,100", "--warmup", "50%", "--json"])
    assert res.exit_code == 0, res.output
    assert all(r["warmup"] == 0.5 and r["requests"] == len(reqs) - len(reqs) // 2 for r in json.loads(res.stdout))
    for bad in ("1", "x", "-1"):
        res = run(main, ["sweep", "--db", dbp, "--warmup", bad])
        assert res.exit_code == 2 and "warm" in res.output
    res = run(main, ["sweep", "--db", dbp, "--warmup", "0.5", "--profile", "deepseek"])
    assert res.exit_code == 2 and "--warmup" in res.output


def test_the_report_says_what_was_measured(tmp_path):
    reqs = random_requests(12, n=20, alphabet=3, max_len=60)
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    con = api.open_db(tmp_path / "r.duckdb")
    api.ingest(con, [str(log)])
    g = Grid(ttls=(5.0, math.inf), blocks=(1,), min_prefixes=(0,), streams=("tenant", "global"))
    whole = api.write_report(con, tmp_path / "whole", g).read_text()
    assert "Measured over the whole log (no warm-up" in whole
    g.warmup = 0.5
    warm = api.write_report(con, tmp_path / "warm", g).read_text()
    assert "Measured over the last 50 % of the requests by time (warm-up 0.5" in warm
    rows = json.loads((tmp_path / "warm" / "sweep.json").read_text())
    want = {(w["stream"], w["ttl_s"]): w["hit_tokens"]
            for w in oracle.sweep(reqs, g.streams, g.ttls, g.blocks, g.min_prefixes, warmup=0.5)}
    assert {(r["stream"], r["ttl_s"]): r["hit_tokens"] for r in rows} == want
    assert np.all([r["warmup"] == 0.5 for r in rows])
