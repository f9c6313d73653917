"""One prepare: whatever ran before on a database, a sweep gives a fresh database's rows.

The walks of each (variant, mode) are current only for the data and horizon
they were replayed for (``replay.store.walksets``); these tests run the
sequences that used to leave stale walks behind, and random orders of every
consumer, against a fresh database holding the same logs.
"""

import json
import math
import random

import pytest
from click.testing import CliRunner

from replay import api
from replay.cli.main import main
from replay.core.grid import Grid
from replay.core.sweep import sweep
from replay.store import walksets
from replay.store.walksets import StaleWalks
from support.paths import ROOT

SAMPLE = "data/sample"
V31 = ROOT / "bench" / "templates" / "tool_chat_template_deepseekv31.jinja"


def _cli(*args):
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


def test_diagnose_between_two_sweeps_leaves_no_stale_walks(tmp_path):
    """Issue 18's first sequence: sweep at 5m,30m over four modes (walks pruned at
    30 min), diagnose (which needs tenant and global at an infinite horizon), then
    sweep key and session at inf: the rows of a fresh database (the old code
    took the 30-min key/session walks as current)."""
    db = str(tmp_path / "x.duckdb")
    _cli("ingest", SAMPLE, "--db", db)
    _cli("sweep", "--db", db, "--ttl", "5m,30m", "--stream", "tenant,key,session,global", "--json")
    _cli("diagnose", "--db", db, "--json")
    got = json.loads(_cli("sweep", "--db", db, "--ttl", "inf", "--stream", "key,session", "--json"))
    fresh = json.loads(_cli("sweep", SAMPLE, "--db", str(tmp_path / "fresh.duckdb"), "--ttl", "inf",
                            "--stream", "key,session", "--json"))
    assert got == fresh and len(got) == 12


def test_new_requests_make_every_walk_set_stale(tmp_path):
    """Issue 18's second family: new requests arrive (`replay validate new.jsonl`
    ingests them) and only the global walks are replayed; a sweep of every mode
    afterwards must see the new requests in every mode."""
    from replay.synth.generator import generate

    generate(tmp_path / "a", seed=1, scale=0.15)
    generate(tmp_path / "b", seed=2, scale=0.15)
    grid = Grid(ttls=(300.0, math.inf), blocks=(1, 16), min_prefixes=(0,), streams=("tenant", "key", "global"))
    con = api.open_db(tmp_path / "x.duckdb")
    api.ingest(con, [str(tmp_path / "a")])
    api.sweep(con, grid)
    api.ingest(con, [str(tmp_path / "b")])
    api.prepare(con, modes=("global",))  # what validate's prepare did
    with pytest.raises(StaleWalks):
        sweep(con, grid)  # the reader refuses the tenant/key walks of the old data
    got = api.sweep(con, grid)
    fresh = api.open_db(tmp_path / "fresh.duckdb")
    api.ingest(fresh, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert got.to_dicts() == api.sweep(fresh, grid).to_dicts()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    from replay.synth.generator import generate

    base = tmp_path_factory.mktemp("prep")
    return [str(generate(base / f"part{i}", seed=10 + i, scale=0.12).files["agent-anthropic"].parent)
            for i in range(2)]


@pytest.fixture(scope="module")
def tok():
    t = api.load_tokenizer()
    yield t
    t.close()


_FRESH: dict = {}


def _fresh_rows(tmp_path, files, grid, tok):
    key = (tuple(files), repr(grid))
    if key not in _FRESH:
        con = api.open_db(tmp_path / f"fresh{len(_FRESH)}.duckdb")
        api.ingest(con, files)
        _FRESH[key] = api.sweep(con, grid, tokenizer=tok).to_dicts()
        con.close()
    return _FRESH[key]


GRIDS = [Grid(ttls=(300.0, 1800.0), blocks=(1, 16), min_prefixes=(0, 256), streams=("tenant", "key", "session")),
         Grid(ttls=(math.inf,), blocks=(16,), min_prefixes=(0,), streams=("key", "session", "global")),
         Grid(ttls=(60.0, 3600.0, math.inf), blocks=(64,), min_prefixes=(0,), streams=("global", "tenant"))]


@pytest.mark.parametrize("seed", range(4))
def test_any_order_of_consumers_leaves_a_fresh_sweep(tmp_path, logs, tok, seed):
    """Sweeps at several horizons, diagnose, whatif, profiles that need the output
    walks, the report's idle gaps, a validate-style prepare and new files, in a
    random order: after each step every grid sweeps as on a fresh database."""
    rng = random.Random(seed)
    con = api.open_db(tmp_path / "x.duckdb")
    files = [logs[0]]
    api.ingest(con, files)
    steps = ["sweep", "diagnose", "whatif", "profiles", "idle", "prepare_global", "ingest"]
    for _ in range(6):
        step = rng.choice(steps)
        if step == "sweep":
            api.sweep(con, rng.choice(GRIDS), tokenizer=tok)
        elif step == "diagnose":
            api.diagnose(con, ttl=rng.choice([300, 1800]), stream=rng.choice(["tenant", "key", "session"]),
                         tokenizer=tok)
        elif step == "whatif":
            api.whatif(con, ["sort-tools"], ttl=300, stream=rng.choice(["tenant", "global"]), tokenizer=tok)
        elif step == "profiles":
            api.profile_sweep(con, [rng.choice(["deepseek", "vllm"])], rng.choice(GRIDS), tokenizer=tok)
        elif step == "idle":
            api.idle_gaps(con, rng.choice(["tenant", "key"]), tokenizer=tok)
        elif step == "prepare_global":
            api.prepare(con, modes=("global",), horizon_us=rng.choice([60_000_000, 2**63 - 1]), tokenizer=tok)
        elif step == "ingest" and len(files) < len(logs):
            files.append(logs[len(files)])
            api.ingest(con, files)
        grid = rng.choice(GRIDS)
        assert api.sweep(con, grid, tokenizer=tok).to_dicts() == _fresh_rows(tmp_path, files, grid, tok), step


def test_prepare_replays_only_the_sets_that_are_not_current(tmp_path, logs, tok):
    con = api.open_db(tmp_path / "x.duckdb")
    api.ingest(con, [logs[0]])
    done = api.prepare(con, modes=("tenant", "key"), horizon_us=300_000_000, tokenizer=tok)
    assert done["replay"].modes == ("tenant", "key")
    assert api.prepare(con, modes=("tenant",), horizon_us=300_000_000, tokenizer=tok) == {}
    assert api.prepare(con, modes=("tenant",), horizon_us=60_000_000, tokenizer=tok) == {}  # shorter: current
    done = api.prepare(con, modes=("tenant", "global"), horizon_us=600_000_000, tokenizer=tok)
    assert done["replay"].modes == ("tenant", "global")  # tenant: too short a horizon; global: never walked
    status = walksets.status(con)
    assert status[("prompt", "key")][0] == 300_000_000 and status[("prompt", "tenant")][0] == 600_000_000


class _Local:
    """A stand-in for a local engine: what ``prepare`` asks of it, recorded."""

    name, workers, when_worth = "local", 2, False


@pytest.mark.parametrize("render", [None, "deepseek", "template"])
def test_a_local_engine_renders_in_workers_only_deepseek_and_frees_the_encoder(tmp_path, monkeypatch, render):
    """prepare on a local engine: the tokenize stage gets a pool of the engine's
    workers only for DeepSeek's encoding (the neutral rendering's parts and a
    template's requests are rendered by the encoder process during ingest), and
    the tokenizer's encoder process is closed before the replay's workers start."""
    import replay.prepare as prep

    seen = {}
    real_tokenize = prep.tokenize_stage

    def tokenize(con, tok, progress=False, pool=None):
        seen["workers"] = None if pool is None else pool.workers
        return real_tokenize(con, tok, progress=progress, pool=pool)

    def replay(con, keys, horizon_us, progress, engine=None):
        seen["engine"], seen["closed"] = engine, tok._proc is None
        return None

    monkeypatch.setattr(prep, "tokenize_stage", tokenize)
    monkeypatch.setattr(prep, "_replay", replay)
    con = api.open_db(tmp_path / "r.duckdb")
    api.ingest(con, ["data/sample"])
    tok = api.load_tokenizer(api.tokenizer_spec(None, None if render == "template" else render,
                                                 V31 if render == "template" else None))
    assert tok._proc is not None  # (its encoder process runs, for the close to be seen)
    try:
        eng = _Local()
        prep.prepare(con, modes=("tenant",), tokenizer=tok, engine=eng)
    finally:
        tok.close()
        con.close()
    assert seen["workers"] == (2 if render == "deepseek" else None)
    assert seen["engine"] is eng and seen["closed"]
