"""Hit origin (docs/origin.md) against a brute-force attribution written from the contract.

Every hit token at depth d of request r is attributed to the most recent earlier
request (processing order) of the same cache whose common prefix with r is ≥ d;
its origin is the same session (same non-missing session id), else another
session of the same tenant, else another tenant."""

import json
import math

import duckdb
import numpy as np
import pytest

from replay import api
from replay.core import hits as hits_module
from support import oracle
from replay.core import replay as replay_module
from replay.core.grid import Grid
from replay.core.replay import replay_prompts
from replay.core.streams import MODES, ORIGINS, stream_key
from replay.core.sweep import ORIGIN_COLUMNS, sweep
from replay.times import ttl_us
from replay.store import db, schema, walksets

from support.gen import US, random_requests
from support import kernels
from support.walks import prompts as _prompts
from support.walks import store as _store

R = oracle.OracleRequest
GRID = Grid(ttls=(0, 1, 2, 5, 10, 30, math.inf), blocks=(1, 2, 3, 16), min_prefixes=(0, 4, 16), streams=MODES)


# ----------------------------------------------------------------------------- the brute force

def _stored(r, with_output):
    return list(r.tokens) + list(r.output) if with_output else list(r.tokens)


def _origin(r, w) -> str:
    if r.session is not None and w.session == r.session:
        return "same_session"
    return "other_session" if w.tenant == r.tenant else "other_tenant"


def brute_force(reqs, mode, ttls, blocks, mins, with_output=False) -> dict:
    """{(request, ttl, block, min): {origin: tokens}} read literally: the hit as
    semantics.md defines it, then for every hit token at depth d its writer, found
    by scanning the earlier requests of its cache from the most recent back for
    the first whose common prefix is ≥ d (O(n²) common prefixes, computed once)."""
    order = oracle.time_order(reqs)
    cache = [oracle.cache_of(r, mode) for r in reqs]
    earlier = {i: [j for j in order[:pos] if cache[j] == cache[i]] for pos, i in enumerate(order)}
    lcp = {(i, j): oracle.lcp(reqs[i].tokens, _stored(reqs[j], with_output)) for i in earlier for j in earlier[i]}
    writer = {}  # writer[i][d - 1]: who last wrote depth d of request i
    for i in earlier:
        deepest = max((lcp[(i, j)] for j in earlier[i]), default=0)
        writer[i] = [next(j for j in reversed(earlier[i]) if lcp[(i, j)] >= d) for d in range(1, deepest + 1)]
    out = {}
    for ttl in ttls:
        for i, r in enumerate(reqs):
            L = max((lcp[(i, j)] for j in earlier[i] if r.ts - reqs[j].ts <= ttl_us(ttl)), default=0)
            # the writer of a hit token is within the TTL (docs/origin.md)
            assert all(r.ts - reqs[w].ts <= ttl_us(ttl) for w in writer[i][:L])
            for b in blocks:
                for m in mins:
                    got = dict.fromkeys(ORIGINS, 0)
                    for d in range(1, oracle.block_hit(L, b, m) + 1):
                        got[_origin(r, reqs[writer[i][d - 1]])] += 1
                    out[(i, ttl, b, m)] = got
    return out


def _key(r):
    return (r["stream"], math.inf if r["ttl_s"] is None else r["ttl_s"], r["block"], r["min_prefix"])


# ----------------------------------------------------------------------------- generated logs

@pytest.mark.parametrize("seed", range(6))
def test_sweep_origins_equal_the_brute_force_per_configuration_and_stream(seed):
    """Every configuration of a grid of TTLs (gaps exactly on, a µs under and over
    them), blocks {1, 2, 3, 16}, minimum prefixes and all four modes; ties in time;
    two models in half the logs; session ids shared across tenants."""
    reqs = random_requests(seed, n=20 + 12 * seed, jitter_us=(0, 0, -1, 1),
                           models=(None, "m1") if seed % 2 else (None,))
    con = db.connect(None)
    _store(con, reqs)
    agg = {_key(r): r for r in sweep(con, GRID).to_dicts()}
    per = sweep(con, GRID, by_stream=True).to_dicts()
    assert len(agg) == GRID.size
    seen_tenant = False
    for mode in GRID.streams:
        want = brute_force(reqs, mode, GRID.ttls, GRID.blocks, GRID.min_prefixes)
        cache = {i: (stream_key(mode, r.tenant, r.key, r.session), r.model) for i, r in enumerate(reqs)}
        for ttl in GRID.ttls:
            for b in GRID.blocks:
                for m in GRID.min_prefixes:
                    row = agg[(mode, ttl, b, m)]
                    total = {o: sum(want[(i, ttl, b, m)][o] for i in range(len(reqs))) for o in ORIGINS}
                    assert {o: row[f"hit_{o}"] for o in ORIGINS} == total, (mode, ttl, b, m)
                    assert sum(total.values()) == row["hit_tokens"]
                    seen_tenant |= total["other_tenant"] > 0
        for row in (r for r in per if r["stream"] == mode):
            k = _key(row)[1:]
            mine = [i for i in range(len(reqs)) if cache[i] == (row["stream_key"], row["model"])]
            total = {o: sum(want[(i, *k)][o] for i in mine) for o in ORIGINS}
            assert {o: row[f"hit_{o}"] for o in ORIGINS} == total, (mode, row["stream_key"], k)
            assert sum(total.values()) == row["hit_tokens"]
    assert seen_tenant  # (global mode mixes tenants: some hits are another tenant's writes)


@pytest.mark.parametrize("variant", ["prompt", "prompt+output"])
@pytest.mark.parametrize("seed", range(4))
def test_each_requests_origins_equal_the_brute_force(seed, variant):
    """Request by request (a group per request), from the walks themselves; with
    the output inserted after the prompt, its writer is the request whose prompt
    and output the prefix matched."""
    reqs = random_requests(100 + seed, n=30 + 10 * seed, alphabet=3, jitter_us=(0, 0, -1, 1),
                           models=(None, "m1") if seed % 2 else (None,))
    res = replay_prompts(_prompts(reqs), MODES, (variant,))
    ttls, blocks, mins = (0, 2, 5, 10, math.inf), (1, 3, 16), (0, 4)
    grid = Grid(ttls=ttls, blocks=blocks, min_prefixes=mins, streams=("global",))
    for mode in MODES:
        rows = sorted(res[(variant, mode)], key=lambda r: r[0])  # request_id = input index here
        offsets = np.cumsum([0] + [len(r[5]) for r in rows])
        flat = [np.array([x for r in rows for x in r[c]], dtype=np.int64) for c in (5, 6, 7)]
        assert all(len(r[5]) == len(r[6]) == len(r[7]) for r in rows)
        hit, _, by_origin = hits_module.hit_counts(offsets, flat[0], flat[1], np.arange(len(rows)), len(rows),
                                                   *grid.arrays(), origins=flat[2])
        assert np.array_equal(by_origin.sum(axis=4), hit)
        want = brute_force(reqs, mode, ttls, blocks, mins, with_output=variant != "prompt")
        for (i, ttl, b, m), got in want.items():
            k = (i, ttls.index(ttl), mins.index(m), blocks.index(b))
            assert {o: int(by_origin[(*k, n)]) for n, o in enumerate(ORIGINS)} == got, (mode, i, ttl, b, m)


def test_the_oracle_sweeps_origins_equal_the_literal_brute_force():
    """``oracle.sweep``'s origin columns (which other tests compare with) are the contract too."""
    reqs = random_requests(7, n=45, jitter_us=(0, 0, -1, 1), models=(None, "m1"))
    for mode in MODES:
        want = brute_force(reqs, mode, (2, math.inf), (1, 3), (0, 4))
        for row in oracle.sweep(reqs, (mode,), (2, math.inf), (1, 3), (0, 4)):
            k = (math.inf if row["ttl_s"] is None else row["ttl_s"], row["block"], row["min_prefix"])
            assert {o: row[f"hit_{o}"] for o in ORIGINS} == {
                o: sum(want[(i, *k)][o] for i in range(len(reqs))) for o in ORIGINS}


def test_the_kernel_counts_origins_as_their_definition_on_random_walks():
    """Steps sharing a gap (an origin changes at a tie), requests without steps,
    hits ending inside a step, between steps and on a step's end."""
    rng = np.random.default_rng(5)
    gaps, depths, origins, offsets = [], [], [], [0]
    for _ in range(3000):
        k = int(rng.integers(0, 6))
        gaps += sorted(rng.choice([0, 1, 5, 60_000_000, 60_000_001, 7_200_000_000], size=k).tolist())
        depths += np.sort(rng.choice(np.arange(1, 200), size=k, replace=False)).tolist()
        origins += rng.integers(0, 3, size=k).tolist()
        offsets.append(offsets[-1] + k)
    args = [np.asarray(x, dtype=np.int64) for x in (offsets, gaps, depths)]
    group = rng.integers(0, 7, size=3000)
    grid = Grid(ttls=(0, 1e-6, 60, 7200, math.inf), blocks=(1, 3, 16, 64), min_prefixes=(0, 16, 100),
                streams=("global",))
    a = hits_module.hit_counts(*args, group, 7, *grid.arrays(), origins=np.asarray(origins))
    b = kernels.hit_counts(*args, group, 7, *grid.arrays(), origins=origins)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert np.array_equal(b[2].sum(axis=4), b[0]) and (b[2].sum(axis=(0, 1, 2, 3)) > 0).all()
    with pytest.raises(ValueError, match="origin"):
        hits_module.hit_counts(*args, group, 7, *grid.arrays(), origins=np.full(len(gaps), 3))


def test_the_writers_split_steps_as_their_definition():
    rng = np.random.default_rng(3)
    a = replay_module.Writers()
    pairs = [(t, s) for t in "abc" for s in (None, "s1", "s2")]
    assert [a.code(t, s) for t, s in pairs] == list(range(len(pairs)))
    assert a.code(*pairs[4]) == 4  # (the same pair, the same code)
    for _ in range(500):
        k = int(rng.integers(0, 6))
        gaps = np.sort(rng.choice([0, 0, 1, 5, 9], size=k)).tolist()
        steps = [(g, d, int(rng.integers(0, len(pairs)))) for g, d in zip(gaps, range(1, k + 1))]
        me = int(rng.integers(0, len(pairs)))
        assert a.split(steps, me) == kernels.split(steps, me, pairs)
    with pytest.raises(ValueError):
        a.split([(0, 1, len(pairs))], 0)


# ----------------------------------------------------------------------------- hand-made cases

def _sweep_rows(reqs, grid, mode="tenant"):
    con = db.connect(None)
    _store(con, reqs)
    return {_key(r)[1:]: r for r in sweep(con, grid).to_dicts() if r["stream"] == mode}


def _origins(row):
    return tuple(row[c] for c in ORIGIN_COLUMNS)


def test_a_prefix_written_by_another_session_whose_deeper_part_is_its_own():
    """Session s1 writes 1..6; s2 (same tenant) rewrites 1..3 later; s1 again: its
    first three hit tokens were last written by s2, the next three by itself."""
    reqs = [R(ts=0, tokens=[1, 2, 3, 4, 5, 6], tenant="a", session="s1"),
            R(ts=1 * US, tokens=[1, 2, 3, 9], tenant="a", session="s2"),
            R(ts=2 * US, tokens=[1, 2, 3, 4, 5, 6, 7], tenant="a", session="s1")]
    rows = _sweep_rows(reqs, Grid(ttls=(1, 2, math.inf), blocks=(1, 2, 4), min_prefixes=(0,),
                                  streams=("tenant",)))
    # s2's 3 tokens: other session; then the third request: 3 other session + 3 its own
    assert _origins(rows[(math.inf, 1, 0)]) == (3, 6, 0)
    assert _origins(rows[(math.inf, 2, 0)]) == (3, 2 + 3, 0)   # blocks of 2: s2 hits 2, the third 6
    assert _origins(rows[(math.inf, 4, 0)]) == (1, 3, 0)       # s2's 3 floors to 0; the third: 4 = 3 + 1
    assert _origins(rows[(2, 1, 0)]) == (3, 6, 0)               # s1's own write exactly 2 s before
    assert _origins(rows[(1, 1, 0)]) == (0, 3 + 3, 0)           # beyond 1 s only s2's prefix is left
    # the same with s2 in another tenant, one global cache
    reqs[1].tenant = "b"
    rows = _sweep_rows(reqs, Grid(ttls=(math.inf,), blocks=(1,), min_prefixes=(0,), streams=("global",)),
                       mode="global")
    assert _origins(rows[(math.inf, 1, 0)]) == (3, 0, 3 + 3)


def test_ties_ttl_boundaries_empty_prompts_and_missing_sessions():
    reqs = [R(ts=0, tokens=[], tenant="a", session="s1"),                           # empty: nothing
            R(ts=0, tokens=[1, 2, 3, 4], tenant="a", session="s1"),
            R(ts=0, tokens=[1, 2, 3, 4, 5], tenant="a", session="s2"),              # tie: hits the one above
            R(ts=10 * US, tokens=[1, 2, 7], tenant="a"),                            # no session: other session
            R(ts=10 * US, tokens=[1, 2, 3, 4, 5, 6], tenant="a", session="s2"),     # exactly 10 s after
            R(ts=20 * US + 1, tokens=[1, 2, 8], tenant="a"),                        # 10 s + 1 µs after the last
            R(ts=20 * US + 1, tokens=[], tenant="a")]
    grid = Grid(ttls=(10, 10.000001, math.inf), blocks=(1,), min_prefixes=(0,), streams=("tenant",))
    rows = _sweep_rows(reqs, grid)
    # at 10 s: #2 ← #1 (4, other session); #3 ← #2 (2, other session); #4: 1..2 ← #3 (no session:
    # other), 3..5 ← #2 itself (s2, exactly 10 s); #5: 1..2 written at 10 s, 10 s + 1 µs ago: expired
    assert _origins(rows[(10, 1, 0)]) == (3, 4 + 2 + 2, 0)
    assert _origins(rows[(10.000001, 1, 0)]) == (3, 4 + 2 + 2 + 2, 0)  # #5 ← #4 (s2: another session)
    assert rows[(10, 1, 0)]["hit_tokens"] == 11 and rows[(10.000001, 1, 0)]["hit_tokens"] == 13
    # the session mode: sessionless requests share their tenant's stream
    rows = _sweep_rows(reqs, Grid(ttls=(math.inf,), blocks=(1,), min_prefixes=(0,), streams=("session",)),
                       mode="session")
    assert _origins(rows[(math.inf, 1, 0)]) == (5, 2, 0)  # #4 ← #2 (s2's own 5); #5 ← #3, both sessionless


def test_one_session_id_in_two_tenants_is_the_same_session():
    """The contract compares session ids as they are (a shared cache across
    tenants that reuse an id attributes it to the same session)."""
    reqs = [R(ts=0, tokens=[1, 2, 3], tenant="a", session="s"),
            R(ts=1, tokens=[1, 2, 3, 4], tenant="b", session="s"),
            R(ts=2, tokens=[1, 2, 3, 4, 5], tenant="b", session=None)]
    rows = _sweep_rows(reqs, Grid(ttls=(math.inf,), blocks=(1,), min_prefixes=(0,), streams=("global",)),
                       mode="global")
    assert _origins(rows[(math.inf, 1, 0)]) == (3, 4, 0)


# ----------------------------------------------------------------------------- stored walks, the report

def _write_log(path, reqs):
    with open(path, "w") as f:
        for r in reqs:
            rec = {"ts": 1_700_000_000 * US + r.ts, "tenant": r.tenant, "tokens": list(r.tokens)}
            for k, v in (("prompt_cache_key", r.key), ("session", r.session), ("model", r.model)):
                if v is not None:
                    rec[k] = v
            f.write(json.dumps(rec) + "\n")


@pytest.fixture
def small_db(tmp_path):
    reqs = random_requests(3, n=40, alphabet=3, max_len=60, gaps=(0, 1, 5, 30, 300, 900))
    _write_log(tmp_path / "log.jsonl", reqs)
    con = api.open_db(tmp_path / "r.duckdb")
    api.ingest(con, [str(tmp_path / "log.jsonl")])
    return con, reqs


def test_walks_of_an_earlier_layout_are_stale_and_replayed(small_db):
    """Walks replayed before origins were kept (no origins, the old fingerprint) are
    never read: the sweep refuses them and prepare replays them."""
    con, reqs = small_db
    grid = Grid(ttls=(300, math.inf), blocks=(1, 16), min_prefixes=(0,), streams=("tenant", "global"))
    first = api.sweep(con, grid)
    assert walksets.data_fingerprint(con).endswith(":" + walksets.WALKS_LAYOUT)
    con.execute("UPDATE walks SET origins = NULL")
    with pytest.raises(walksets.StaleWalks):
        sweep(con, grid)
    con.execute(f"UPDATE walk_sets SET fingerprint = replace(fingerprint, ':{walksets.WALKS_LAYOUT}', '')")
    assert walksets.stale(con, [("prompt", "tenant"), ("prompt", "global")], grid.horizon_us)
    with pytest.raises(walksets.StaleWalks):
        sweep(con, grid)
    assert api.sweep(con, grid).equals(first)  # prepared again
    assert con.execute("SELECT count(*) FROM walks WHERE origins IS NULL").fetchone()[0] == 0


def test_a_database_without_the_origins_column_gains_it():
    con = duckdb.connect()
    con.execute("""CREATE TABLE walks (variant VARCHAR NOT NULL, mode VARCHAR NOT NULL, request_id BIGINT NOT NULL,
                   stream VARCHAR NOT NULL, model VARCHAR, ts_us BIGINT NOT NULL, prompt_tokens BIGINT NOT NULL,
                   gaps BIGINT[] NOT NULL, depths BIGINT[] NOT NULL)""")
    con.execute("INSERT INTO walks VALUES ('prompt', 'tenant', 0, 'tenant:a', NULL, 0, 3, [], [])")
    schema.create_all(con)
    cols = [c for (c,) in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'walks' ORDER BY ordinal_position").fetchall()]
    assert cols[-1] == "origins" and con.execute("SELECT origins FROM walks").fetchone() == (None,)


def test_the_report_section_renders_on_a_small_database(small_db, tmp_path):
    con, reqs = small_db
    grid = Grid(ttls=(60, 300, math.inf), blocks=(1, 16), min_prefixes=(0,), streams=("tenant", "key", "global"))
    md = api.origin_section(con, tmp_path, grid)
    assert md.startswith("## Where the hits come from") and "TTL 5m, block 16" in md
    lines = md.splitlines()
    for mode in grid.streams:
        assert sum(line.startswith(f"| {mode} | {len(reqs):,} |") for line in lines) == 1
    figures = api.origin_figures(con, grid).to_dicts()
    assert len(figures) == 3 and all(r["ttl_s"] == 300 and r["block"] == 16 for r in figures)
    assert all(sum(r[c] for c in ORIGIN_COLUMNS) == r["hit_tokens"] for r in figures)
    assert any(r["hit_tokens"] > 0 for r in figures)
    n = len(reqs)
    with_session = sum(r.session is not None for r in reqs)
    with_key = sum(r.key is not None for r in reqs)
    assert f"| a session id | {with_session:,} | {100 * with_session / n:.1f} % |" in lines
    assert f"| a prompt_cache_key | {with_key:,} | {100 * with_key / n:.1f} % |" in lines
    # the stored results are not touched by the section
    assert con.execute("SELECT count(*) FROM results WHERE ttl_s = 300 AND block = 16").fetchone()[0] == 0
