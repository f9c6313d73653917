"""`replay sweep --json` on generated logs against the brute-force oracle (issue 2's Done-when)."""

import json
import math
import random

import pytest
from click.testing import CliRunner

from replay.cli.main import main
from support import oracle

from support.gen import US, random_requests
from support.logs import write_tokens_log as _write_tokens_log


def _key(r):
    return (r["stream"], math.inf if r["ttl_s"] is None else r["ttl_s"], r["block"], r["min_prefix"])


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(sorted(got, key=_key), sorted(want, key=_key)):
        assert {k: g[k] for k in w if k != "hit_ratio"} == {k: w[k] for k in w if k != "hit_ratio"}
        assert g["hit_ratio"] == pytest.approx(w["hit_ratio"], abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_sweep_json_equals_oracle_on_tokens_logs(tmp_path, seed):
    """Long-ish prompts over a small alphabet, so blocks of 16 and 64 and the minimum
    prefix matter; gaps land exactly on, a µs under and a µs over the 10 s / 60 s
    TTLs; ties included (gap 0); timestamps in µs, ms or s (read exactly); two
    models in half the logs."""
    reqs = random_requests(seed, n=40, alphabet=3, max_len=200, gaps=(0, 0, 3, 7, 10, 50, 60, 200),
                           jitter_us=(0, 0, -1, 1), models=("a", "b") if seed % 2 else (None,))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs, ("us", "ms", "s")[seed % 3])
    args = ["sweep", str(log), "--db", str(tmp_path / "r.duckdb"), "--ttl", "10,60,inf",
            "--block", "1,16,64", "--min-prefix", "0,32", "--stream", "tenant,key,session,global", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    want = oracle.sweep(reqs, ("tenant", "key", "session", "global"), (10, 60, math.inf), (1, 16, 64), (0, 32))
    _same(got, want)
    assert set(got[0]) == {"stream", "ttl_s", "block", "min_prefix", "requests", "prompt_tokens",
                           "hit_tokens", "hit_ratio", "requests_hit", "hit_same_session", "hit_other_session",
                           "hit_other_tenant"}
    # a second run on the same database (logs given again) neither re-ingests nor changes a figure
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0
    _same(json.loads(again.stdout), want)


def test_sweep_with_empty_prompts_and_boundary_ties(tmp_path):
    reqs = [oracle.OracleRequest(ts=0, tokens=[], tenant="a"),
            oracle.OracleRequest(ts=0, tokens=[1] * 40, tenant="a"),
            oracle.OracleRequest(ts=0, tokens=[1] * 40 + [2], tenant="a"),           # tie: hits the one above
            oracle.OracleRequest(ts=300 * US, tokens=[1] * 40 + [3], tenant="a"),    # exactly at a 5m TTL
            oracle.OracleRequest(ts=600 * US + 1, tokens=[1] * 17, tenant="a"),      # one µs past it
            oracle.OracleRequest(ts=601 * US, tokens=[], tenant="b")]
    log = tmp_path / "edge.jsonl"
    _write_tokens_log(log, reqs)
    res = CliRunner().invoke(main, ["sweep", str(log), "--db", str(tmp_path / "e.duckdb"), "--ttl", "5m,inf",
                                    "--block", "1,16", "--min-prefix", "0,20", "--stream", "tenant,global",
                                    "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    _same(got, oracle.sweep(reqs, ("tenant", "global"), (300, math.inf), (1, 16), (0, 20)))
    row = next(r for r in got if r["stream"] == "tenant" and r["ttl_s"] == 300 and r["block"] == 1
               and r["min_prefix"] == 0)
    assert row["hit_tokens"] == 40 + 40 + 0  # tie hit, boundary hit, the 17-token one expired



def test_sweep_on_chat_logs_equals_oracle_over_their_tokens(tmp_path):
    """Anthropic and OpenAI logs: after rendering and tokenizing, the sweep equals the
    brute-force definition applied to the very token sequences the pipeline built."""
    from replay import api as pipeline
    from replay.core.grid import Grid
    from replay.store import db
    from replay.synth import generator as synth
    from replay.text.tokenize import load_prompt_tokens

    synth.generate(tmp_path / "logs", seed=11, scale=0.5)
    con = db.connect(tmp_path / "c.duckdb")
    pipeline.ingest(con, [str(tmp_path / "logs")])
    grid = Grid(ttls=(60, 300, 3600, math.inf), blocks=(1, 16, 64), min_prefixes=(0, 1024),
                streams=("tenant", "key", "session", "global"))
    got = pipeline.sweep(con, grid).to_dicts()
    meta = con.execute("SELECT request_id, ts_us, tenant, prompt_cache_key, session, model FROM requests "
                       "ORDER BY request_id").fetchall()
    toks = load_prompt_tokens(con, [m[0] for m in meta])
    reqs = [oracle.OracleRequest(ts=ts, tokens=toks[rid].tolist(), tenant=tenant, key=key, session=session,
                                 model=model)
            for rid, ts, tenant, key, session, model in meta]
    assert len({r.model for r in reqs}) > 1  # the sample's tenants mix models
    assert {f for (f,) in con.execute("SELECT DISTINCT format FROM requests").fetchall()} == {"anthropic", "openai"}
    assert len(reqs) > 50 and sum(len(r.tokens) for r in reqs) > 100_000
    _same(got, oracle.sweep(reqs, grid.streams, grid.ttls, grid.blocks, grid.min_prefixes))


def test_replay_prompts_equal_the_tokenized_prompts(tmp_path):
    """The replay builds an agent's next prompt from its previous one (replay.SegmentStore.extend);
    every prompt must still be exactly its segments' tokens."""
    import numpy as np

    from replay.store import db
    from replay import api as pipeline
    from replay.core.prompts import iter_prompts
    from replay.synth.generator import generate
    from replay.text.tokenize import load_prompt_tokens

    generate(tmp_path / "logs", seed=11, scale=0.5)
    con = db.connect(tmp_path / "x.duckdb")
    pipeline.ingest(con, [tmp_path / "logs"])
    pipeline.tokenize(con)
    want = load_prompt_tokens(con, [r[0] for r in con.execute("SELECT request_id FROM requests").fetchall()])
    got = {p.request_id: p.symbols for p in iter_prompts(con)}
    assert set(got) == set(want) and len(got) > 100
    assert all(np.array_equal(got[r], want[r]) for r in want)


@pytest.mark.parametrize("seed", [3, 8])
def test_walks_are_the_same_without_the_shared_prefix_shortcut(tmp_path, monkeypatch, seed):
    """The replay lets a prompt built from its conversation's previous one skip
    comparing the shared part (replay.replay_prompts, ``known``). Within a finite
    horizon, with turns further apart than it (pruned in between) and requests
    whose key or session changes within a conversation (another stream in some
    modes), the walks must be those of the plain walk."""
    import random

    from replay import api as pipeline
    from replay.core.prompts import SegmentStore
    from replay.core.replay import replay_stage
    from replay.store import db
    from replay.synth.generator import generate

    generate(tmp_path / "logs", seed=seed, scale=0.5, hours=6)
    con = db.connect(tmp_path / "x.duckdb")
    pipeline.ingest(con, [tmp_path / "logs"])
    pipeline.tokenize(con)
    rng = random.Random(seed)
    rows = con.execute("SELECT request_id, ts_us, prompt_cache_key, session FROM requests").fetchall()
    for rid, ts, key, session in rows:
        r = rng.random()
        if r < 0.15:
            con.execute("UPDATE requests SET prompt_cache_key = ? WHERE request_id = ?", [f"k{rng.randrange(3)}", rid])
        elif r < 0.25:
            con.execute("UPDATE requests SET session = NULL, prompt_cache_key = ? WHERE request_id = ?",
                        [session, rid])
        elif r < 0.35:
            con.execute("UPDATE requests SET ts_us = ts_us + ? WHERE request_id = ?",
                        [rng.choice([300, 600, 900, 4000]) * US, rid])
        elif r < 0.40 and session is not None:  # the rest of this session comes back after a pause
            con.execute("UPDATE requests SET ts_us = ts_us + ? WHERE session = ? AND ts_us > ?",
                        [rng.choice([400, 600, 900, 4000]) * US + rng.choice([0, 1, -1]), session, ts])
        elif r < 0.45:
            con.execute("UPDATE requests SET model = 'other' WHERE request_id = ?", [rid])
    walks = []
    for shortcut in (True, False):
        if not shortcut:
            plain = SegmentStore.extend
            monkeypatch.setattr(SegmentStore, "extend", lambda self, ids, prev: (plain(self, ids, prev)[0], 0))
        replay_stage(con, modes=("tenant", "key", "session", "global"), horizon_us=600 * US)
        walks.append(con.execute("SELECT mode, request_id, stream, gaps, depths FROM walks "
                                 "ORDER BY mode, request_id").fetchall())
    assert len(walks[0]) > 400
    assert walks[0] == walks[1]


@pytest.mark.parametrize("chunk", [1, 7, 500])
def test_time_ordered_chunks_give_every_request_once_in_processing_order(tmp_path, chunk):
    """Chunks are fetched by their ids (a semi-join inside their id range); files
    that interleave in time, ties in time and ids far apart all come back in
    (ts, request_id) order, each once, with the row's own columns."""
    import numpy as np

    from replay import api as pipeline
    from replay.core.prompts import iter_prompts, time_ordered_chunks
    from replay.store import db
    from replay.synth.generator import generate

    generate(tmp_path / "logs", seed=5, scale=0.5)
    con = db.connect(tmp_path / "x.duckdb")
    pipeline.ingest(con, [tmp_path / "logs"])
    pipeline.tokenize(con)
    rng = random.Random(chunk)
    for (rid,) in con.execute("SELECT request_id FROM requests").fetchall():
        if rng.random() < 0.2:  # ties across files
            con.execute("UPDATE requests SET ts_us = (ts_us // 600_000_000) * 600_000_000 WHERE request_id = ?",
                        [rid])
    want = con.execute("SELECT request_id, tenant, ts_us FROM requests ORDER BY ts_us, request_id").fetchall()
    got = [row for tbl in time_ordered_chunks(con, "r.request_id, r.tenant, r.ts_us", chunk)
           for row in zip(*(tbl.column(c).to_pylist() for c in ("request_id", "tenant", "ts_us")))]
    assert got == want and len(want) > 100
    spans = np.diff([r[0] for r in want])
    assert (spans < 0).any()  # the files interleave: ids are not in time order
    # two generators on one connection, interleaved
    a, b = time_ordered_chunks(con, "r.request_id", chunk), time_ordered_chunks(con, "r.request_id", chunk)
    first = [next(a).column("request_id").to_pylist(), next(b).column("request_id").to_pylist()]
    assert first[0] == first[1] == [r[0] for r in want[:chunk]]
    assert [p.request_id for p in iter_prompts(con, chunk=chunk)] == [r[0] for r in want]


def test_the_replay_checkpoints_the_tokenized_rows_beside_its_walks(tmp_path, monkeypatch):
    """replay_stage starts a CHECKPOINT in a thread (what the tokenize stage wrote
    is still in the write-ahead log). Inside a caller's transaction that has
    written already, the stage neither waits for it nor changes its walks."""
    from replay.store import db
    from replay import api as pipeline
    from replay.core.replay import replay_stage
    from replay.synth.generator import generate

    monkeypatch.setenv("REPLAY_DUCKDB_CHECKPOINT", "1GB")  # no checkpoint of DuckDB's own in between
    generate(tmp_path / "logs", seed=4, scale=0.3)
    walks = []
    for name, in_transaction in (("a.duckdb", False), ("b.duckdb", True)):
        path = tmp_path / name
        con = db.connect(path)
        pipeline.ingest(con, [tmp_path / "logs"])
        pipeline.tokenize(con)
        wal = path.with_name(name + ".wal")
        before = wal.stat().st_size
        assert before > 100_000  # the tokenized rows, not checkpointed yet
        if in_transaction:
            con.begin()
            db.set_meta(con, "note", "written inside the caller's transaction")
        replay_stage(con, modes=("tenant", "global"), horizon_us=3600 * US)
        if in_transaction:
            con.commit()
        else:
            assert (wal.stat().st_size if wal.exists() else 0) < before / 4  # only the walks are in it now
        walks.append(con.execute("SELECT mode, request_id, stream, gaps, depths FROM walks ORDER BY ALL").fetchall())
        con.close()
    assert walks[0] == walks[1] and len(walks[0]) > 100


def test_the_replay_stores_its_walks_a_part_at_a_time_with_the_same_rows(tmp_path, monkeypatch):
    """The stage hands the walks to DuckDB every WALKS_PER_INSERT requests (memory holds
    a part's rows, not the log's): the same rows as one insert at the end, and no
    part larger than asked for."""
    from replay import api as pipeline
    from replay.core import replay as replay_module
    from replay.store import db, walksets
    from replay.synth.generator import generate

    generate(tmp_path / "logs", seed=6, scale=0.3)
    con = db.connect(tmp_path / "x.duckdb")
    pipeline.ingest(con, [tmp_path / "logs"])
    pipeline.tokenize(con)
    query = "SELECT variant, mode, request_id, stream, model, ts_us, prompt_tokens, gaps, depths FROM walks ORDER BY ALL"
    modes = ("tenant", "key", "global")
    keys = [("prompt", m) for m in modes]
    monkeypatch.setattr(replay_module, "WALKS_PER_INSERT", 10 ** 9)
    replay_module.replay_stage(con, modes=modes, horizon_us=3600 * US)
    whole = con.execute(query).fetchall()
    n = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    assert len(whole) == len(modes) * n and n > 50

    sizes = []
    insert = replay_module.insert_walks
    monkeypatch.setattr(replay_module, "insert_walks",
                        lambda c, rows: (sizes.append([len(r) for r in rows.values()]), insert(c, rows)))
    monkeypatch.setattr(replay_module, "WALKS_PER_INSERT", 7)
    replay_module.replay_stage(con, modes=modes, horizon_us=3600 * US)
    assert con.execute(query).fetchall() == whole
    assert len(sizes) == -(-n // 7) and all(s == [7] * len(modes) for s in sizes[:-1])
    assert not walksets.stale(con, keys, 3600 * US)


def test_a_replay_stopped_part_way_is_not_current_and_is_redone(tmp_path, monkeypatch):
    """Walks stored part by part: when the stage stops after some parts, the walks
    are not current (the next prepare replays again) and a new run gives a clean
    run's rows, none twice."""
    from replay import api as pipeline
    from replay.core import replay as replay_module
    from replay.store import db, walksets
    from replay.synth.generator import generate

    generate(tmp_path / "logs", seed=7, scale=0.3)
    con = db.connect(tmp_path / "x.duckdb")
    pipeline.ingest(con, [tmp_path / "logs"])
    pipeline.tokenize(con)
    modes = ("tenant", "global")
    keys = [("prompt", m) for m in modes]
    replay_module.replay_stage(con, modes=modes, horizon_us=3600 * US)
    query = "SELECT variant, mode, request_id, stream, model, ts_us, prompt_tokens, gaps, depths FROM walks ORDER BY ALL"
    clean = con.execute(query).fetchall()
    assert not walksets.stale(con, keys, 3600 * US)

    calls = []
    insert = replay_module.insert_walks

    def failing(c, rows):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # stopped by the user, part way
        insert(c, rows)

    monkeypatch.setattr(replay_module, "insert_walks", failing)
    monkeypatch.setattr(replay_module, "WALKS_PER_INSERT", 11)
    with pytest.raises(KeyboardInterrupt):
        replay_module.replay_stage(con, modes=modes, horizon_us=3600 * US)
    assert 0 < con.execute("SELECT count(*) FROM walks").fetchone()[0] < len(clean)
    assert walksets.stale(con, keys, 3600 * US) == keys

    monkeypatch.setattr(replay_module, "insert_walks", insert)
    replay_module.replay_stage(con, modes=modes, horizon_us=3600 * US)
    assert con.execute(query).fetchall() == clean


def test_what_is_still_to_tokenize_and_the_replay_refusing_it(tmp_path):
    """One definition (db.untokenized, tokenize.tokenize_needed) for prepare, whatif
    and the replay: requests without prompt rows, or rows waiting for late checks."""
    from replay.store import db
    from replay import api as pipeline
    from replay.core.replay import replay_stage
    from replay.synth.generator import generate
    from replay.text.tokenize import tokenize_needed

    generate(tmp_path / "logs", seed=8, scale=0.2)
    con = db.connect(tmp_path / "x.duckdb")
    pipeline.ingest(con, [tmp_path / "logs"])
    n = con.execute("SELECT count(*) FROM requests WHERE format <> 'mooncake'").fetchone()[0]
    assert db.untokenized(con) == n > 0 and tokenize_needed(con)
    with pytest.raises(RuntimeError, match=f"{n} requests are not tokenized yet"):  # (NotTokenized)
        replay_stage(con, modes=("global",))
    pipeline.tokenize(con)
    assert db.untokenized(con) == 0 and not tokenize_needed(con)
    db.set_meta(con, "tokens_checked", "pending")
    assert tokenize_needed(con)


@pytest.mark.parametrize("fmt", ["tokens", "anthropic"])
def test_a_tenant_alternating_two_models_gets_no_hit_across_them(tmp_path, fmt):
    """Identical prompts, one tenant, key and session, the model alternating: in
    every stream mode each request hits only the previous one of its own model
    (the first of each model misses), and the per-stream rows carry the model."""
    prompt = [7] * 300
    body = {"model": None, "system": "a long, stable system prompt " * 40,
            "messages": [{"role": "user", "content": "the same question"}]}
    with open(tmp_path / "log.jsonl", "w") as f:
        for i in range(6):
            model = ("model-a", "model-b")[i % 2]
            rec = {"ts": 1_700_000_000 + i, "tenant": "acme", "session": "s", "prompt_cache_key": "k"}
            if fmt == "tokens":
                rec.update(tokens=prompt, model=model)
            else:
                rec["request"] = {**body, "model": model}
            f.write(json.dumps(rec) + "\n")
    args = ["sweep", str(tmp_path / "log.jsonl"), "--db", str(tmp_path / "r.duckdb"), "--ttl", "inf",
            "--block", "1", "--min-prefix", "0", "--stream", "tenant,key,session,global", "--json"]
    rows = json.loads(_ok(CliRunner().invoke(main, args)).stdout)
    assert len(rows) == 4
    for r in rows:
        assert r["requests"] == 6 and r["requests_hit"] == 4, r  # two first requests, one per model
        assert r["hit_tokens"] * 6 == r["prompt_tokens"] * 4, r  # each hit is its whole prompt
    per = json.loads(_ok(CliRunner().invoke(main, args + ["--by-stream"])).stdout)
    assert sorted({(r["stream"], r["model"]) for r in per}) == [
        (m, model) for m in ("global", "key", "session", "tenant") for model in ("model-a", "model-b")]
    assert all(r["requests"] == 3 and r["requests_hit"] == 2 for r in per)


def _ok(res):
    assert res.exit_code == 0, res.output
    return res
