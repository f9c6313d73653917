"""The sweep over stored walks, and the hit kernel, against the brute-force definition."""

import math

import numpy as np
import polars as pl
import pytest

from replay.core import hits as hits_module
from support import oracle
from replay.core.grid import Grid
from replay.core.streams import stream_key
from replay.core.sweep import sweep
from replay.times import INF_US, format_ttl, parse_ttl, ttl_us
from replay.store import db
from replay.store.walksets import StaleWalks

from support.gen import random_requests
from support import kernels
from support.walks import rounded as _rounded
from support.walks import store as _store

GRID = Grid(ttls=(0, 2, 5, 30, math.inf), blocks=(1, 2, 3, 16), min_prefixes=(0, 4),
            streams=("tenant", "key", "session", "global"))


def _random_walks(rng, n):
    """Walks as the replay stores them: per request, gaps strictly increasing
    (sometimes inf-free, sometimes 0 first) with depths strictly increasing; some
    requests have no step at all."""
    gaps, depths, offsets = [], [], [0]
    for _ in range(n):
        k = int(rng.integers(0, 5))
        g = np.sort(rng.choice([0, 1, 2, 5, 30, 59_999_999, 60_000_000, 60_000_001, 600_000_000, 7200_000_000],
                               size=k, replace=False))
        d = np.sort(rng.choice(np.arange(1, 3000), size=k, replace=False))
        gaps += g.tolist()
        depths += d.tolist()
        offsets.append(offsets[-1] + k)

    class W:
        pass
    w = W()
    w.offsets, w.gaps, w.depths = (np.asarray(offsets, dtype=np.int64), np.asarray(gaps, dtype=np.int64),
                                   np.asarray(depths, dtype=np.int64))
    return w


@pytest.mark.parametrize("seed", range(8))
def test_hit_counts_equal_the_definition_request_by_request(seed):
    """The kernel against the definition, on walks with TTL boundaries (a gap equal
    to a TTL is within it), partial blocks, depths equal to the minimum prefix,
    requests without steps and groups without requests."""
    rng = np.random.default_rng(seed)
    w = _random_walks(rng, int(rng.integers(0, 60)))
    n_groups = int(rng.integers(1, 7))
    group = rng.integers(0, n_groups, size=len(w.offsets) - 1)
    grid = Grid(ttls=(0.0, 0.000001, 60.0, 600.0, math.inf), blocks=(1, 7, 16, 512, 5000),
                min_prefixes=(0, 1, 16, 1024, 2999), streams=("global",))
    want = kernels.hit_counts(w.offsets, w.gaps, w.depths, group, n_groups, *grid.arrays())
    got = hits_module.hit_counts(w.offsets, w.gaps, w.depths, group, n_groups, *grid.arrays())
    assert got[0].shape == want[0].shape and got[0].dtype == np.int64 and got[1].dtype == np.int64
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_the_counts_equal_the_definition_on_a_large_random_grid():
    rng = np.random.default_rng(99)
    w = _random_walks(rng, 5000)
    group = rng.integers(0, 40, size=5000)
    grid = Grid(ttls=tuple(sorted(rng.choice([0.0, 1.0, 2.0, 5.0, 30.0, 60.0, 600.0, 7200.0, math.inf], 6,
                                             replace=False))[::-1]),
                blocks=(512, 1, 3, 64), min_prefixes=(2048, 0, 100), streams=("global",))
    args = (w.offsets, w.gaps, w.depths, np.asarray(group, dtype=np.int64), 40, *grid.arrays())
    a, b = hits_module.hit_counts(*args), kernels.hit_counts(*args)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[0].sum() > 0
    ttls = grid.arrays()[0]
    want = [[kernels.depth_under(w.gaps[w.offsets[r]:w.offsets[r + 1]], w.depths[w.offsets[r]:w.offsets[r + 1]], t)
             for t in ttls] for r in range(len(w.offsets) - 1)]
    assert hits_module.depths_under(w.offsets, w.gaps, w.depths, ttls).tolist() == want


def test_hit_counts_refuse_a_group_out_of_range():
    w = _random_walks(np.random.default_rng(1), 3)
    with pytest.raises(ValueError, match="group"):
        hits_module.hit_counts(w.offsets, w.gaps, w.depths, np.array([0, 1, 2]), 2, np.array([1]), np.array([1]),
                               np.array([0]))


@pytest.mark.parametrize("seed", range(12))
def test_sweep_equals_oracle(seed):
    """Gaps on, under and over the TTLs by a µs; two models in half the logs."""
    reqs = random_requests(seed, n=5 + 3 * seed, jitter_us=(0, 0, -1, 1),
                           models=(None, "m1", "m2") if seed % 2 else (None,))
    con = db.connect(None)
    _store(con, reqs)
    got = sweep(con, GRID).to_dicts()
    want = oracle.sweep(reqs, GRID.streams, GRID.ttls, GRID.blocks, GRID.min_prefixes)
    key = lambda r: (r["stream"], r["ttl_s"] if r["ttl_s"] is not None else math.inf, r["block"], r["min_prefix"])
    assert _rounded(sorted(got, key=key)) == _rounded(sorted(want, key=key))
    assert len(got) == GRID.size
    stored = con.execute("SELECT count(*) FROM results WHERE profile = 'ideal'").fetchone()[0]
    assert stored == GRID.size


def test_by_stream_rows_add_up_to_the_aggregate():
    reqs = random_requests(3, n=30)
    con = db.connect(None)
    _store(con, reqs)
    agg = sweep(con, GRID)
    per = sweep(con, GRID, by_stream=True)
    summed = per.group_by(["stream", "ttl_s", "block", "min_prefix"]).agg(
        [pl.col(c).sum() for c in ("requests", "prompt_tokens", "hit_tokens", "requests_hit")])
    a = {(r["stream"], r["ttl_s"], r["block"], r["min_prefix"]): r for r in agg.to_dicts()}
    for r in summed.to_dicts():
        k = (r["stream"], r["ttl_s"], r["block"], r["min_prefix"])
        assert all(r[c] == a[k][c] for c in ("requests", "prompt_tokens", "hit_tokens", "requests_hit"))


@pytest.mark.parametrize("seed", range(4))
def test_by_stream_rows_equal_the_oracle_on_each_stream_alone(seed):
    """A cache's hits depend on its own requests only: each by-stream row is the
    brute-force sweep of that cache's requests (its stream key and model)."""
    reqs = random_requests(40 + seed, n=25 + 5 * seed, models=(None, "m1") if seed % 2 else (None,))
    con = db.connect(None)
    _store(con, reqs)
    got = {(r["stream"], r["stream_key"], r["model"], r["ttl_s"], r["block"], r["min_prefix"]): r
           for r in _rounded(sweep(con, GRID, by_stream=True).to_dicts())}
    want = {}
    for mode in GRID.streams:
        keys = {(stream_key(mode, r.tenant, r.key, r.session), r.model) for r in reqs}
        assert len(keys) > 1 or mode == "global"
        for k, model in keys:
            alone = [r for r in reqs if (stream_key(mode, r.tenant, r.key, r.session), r.model) == (k, model)]
            for row in _rounded(oracle.sweep(alone, (mode,), GRID.ttls, GRID.blocks, GRID.min_prefixes)):
                want[(mode, k, model, row["ttl_s"], row["block"], row["min_prefix"])] = {
                    **row, "stream_key": k, "model": model}
    assert got.keys() == want.keys()
    assert all(got[k] == want[k] for k in want)


def test_sweep_refuses_ttls_beyond_the_replay_horizon():
    con = db.connect(None)
    _store(con, random_requests(1, n=10), horizon_us=10 * 1_000_000)
    assert len(sweep(con, Grid(ttls=(5, 10), streams=("global",)))) > 0
    with pytest.raises(StaleWalks, match="stale"):
        sweep(con, Grid(ttls=(5, 10.000001), streams=("global",)))
    with pytest.raises(StaleWalks):
        sweep(con, Grid(ttls=(5, math.inf), streams=("global",)))


def test_sweep_refuses_stream_modes_the_replay_did_not_walk():
    con = db.connect(None)
    _store(con, random_requests(2, n=10), modes=("tenant", "global"))
    con.execute("SELECT count(*) FROM walks").fetchone()  # a result left unfinished, as a notebook may
    assert len(sweep(con, Grid(streams=("global", "tenant")))) == Grid(streams=("global", "tenant")).size
    with pytest.raises(StaleWalks, match="session"):
        sweep(con, Grid(streams=("global", "session")))


@pytest.mark.parametrize("text,seconds", [("5m", 300), ("1h", 3600), ("90", 90), ("30s", 30),
                                          ("1.5h", 5400), ("2d", 172800), ("inf", math.inf)])
def test_parse_ttl(text, seconds):
    assert parse_ttl(text) == seconds


def test_parse_ttl_rejects_garbage_and_formats_back():
    with pytest.raises(ValueError):
        parse_ttl("5 minutes")
    assert format_ttl(300) == "5m" and format_ttl(None) == "inf" and format_ttl(45) == "45s"


def test_the_sweep_frame_has_its_column_types_and_equals_the_stored_rows():
    """The frame is built from the columns themselves (not converted from the stored
    Arrow table): its types are the API's, inf is a null TTL, and the stored
    results hold the same rows."""
    reqs = random_requests(4, n=20)
    con = db.connect(None)
    _store(con, reqs)
    df = sweep(con, GRID)
    want = {"stream": pl.String, "ttl_s": pl.Float64, "block": pl.Int64, "min_prefix": pl.Int64,
            "requests": pl.Int64, "prompt_tokens": pl.Int64, "hit_tokens": pl.Int64,
            "hit_ratio": pl.Float64, "requests_hit": pl.Int64}
    origins = {"hit_same_session": pl.Int64, "hit_other_session": pl.Int64, "hit_other_tenant": pl.Int64}
    assert dict(df.schema) == {**want, **origins} and list(df.columns) == list(want) + list(origins)
    assert df.filter(pl.col("ttl_s").is_null()).height == GRID.size // len(GRID.ttls)
    # the stored results keep the columns before the origins
    stored = con.execute(f"SELECT {', '.join(want)} FROM results WHERE profile = 'ideal'").fetchall()
    assert sorted(stored, key=repr) == sorted(df.select(list(want)).rows(), key=repr)
    want.update(origins)
    per = sweep(con, GRID, by_stream=True)
    assert dict(per.schema) == {"stream": pl.String, "stream_key": pl.String, "model": pl.String,
                                **{k: v for k, v in want.items() if k != "stream"}}


@pytest.mark.parametrize("text,us", [("0.3", 300_000), ("0.000001", 1), ("1.5h", 5_400_000_000), ("0", 0),
                                     ("inf", INF_US), ("60", 60_000_000)])
def test_a_ttl_in_seconds_is_whole_microseconds_exactly(text, us):
    """0.3 s is 300,000 µs, not 299,999 (the float 0.3 is a hair under it)."""
    assert ttl_us(parse_ttl(text)) == us


def test_walks_of_other_data_are_stale():
    """The sweep refuses walks replayed from other requests: a request added after."""
    con = db.connect(None)
    _store(con, random_requests(5, n=10))
    con.execute("INSERT INTO requests (request_id, source_id, line_no, format, ts_us, tenant) "
                "VALUES (999, 1, 1, 'mooncake', 0, 'x')")
    with pytest.raises(StaleWalks):
        sweep(con, Grid(streams=("global",)))
