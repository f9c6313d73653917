"""Body blobs (ingest) and the per-blob tokenize path give exactly the old answers.

The old path stores each whole body in `requests.body` and renders it whole;
the fast path stores content-addressed blobs and renders each blob once. Bodies
(through the `request_bodies` view) and prompts (segments, parts, token counts)
must be identical.
"""

import glob
import json

import pytest

from replay.store import db
from replay.readers.ingest import ingest
from replay.synth.generator import generate
from replay.text.tok import load_tokenizer
from replay.text.tokenize import load_prompt_tokens, tokenize_stage

from support.paths import ROOT, SAMPLE, SHARED

TRAJ = sorted(glob.glob(str(SHARED / "mini-swe-agent-deepseek/*/*.traj.json*")))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _load(paths, blobs: bool, tok):
    con = db.connect(None)
    s = ingest(con, paths, body_blobs=blobs)
    tokenize_stage(con, tok)
    bodies = dict(con.execute("SELECT request_id, body FROM request_bodies").fetchall())
    prompts = {r[0]: r[1:] for r in con.execute(
        "SELECT request_id, n_tokens, seg_ids, seg_parts, output_seg_ids, output_n_tokens FROM prompts"
    ).fetchall()}
    return con, s, bodies, prompts


def _same(paths, tok):
    con_a, sa, bodies_a, prompts_a = _load(paths, False, tok)
    con_b, sb, bodies_b, prompts_b = _load(paths, True, tok)
    assert (sa.loaded, sa.rejected) == (sb.loaded, sb.rejected)
    assert bodies_a == bodies_b
    assert prompts_a == prompts_b
    return con_a, con_b


def test_sample_blobs_equal_inline(tok):
    con_a, con_b = _same([str(ROOT / "data/sample")], tok)
    # blobs really are shared: far less body text stored than the inline bodies
    inline = con_a.execute("SELECT sum(length(body)) FROM requests").fetchone()[0]
    stored = con_b.execute("SELECT sum(length(text)) FROM blobs").fetchone()[0]
    assert con_b.execute("SELECT count(*) FROM requests WHERE body IS NOT NULL").fetchone()[0] == 0
    assert stored < inline / 3
    ids = [r[0] for r in con_a.execute("SELECT request_id FROM requests ORDER BY 1 LIMIT 20").fetchall()]
    a = load_prompt_tokens(con_a, ids, with_output=True)
    b = load_prompt_tokens(con_b, ids, with_output=True)
    assert all((a[i] == b[i]).all() for i in ids)


@pytest.mark.parametrize("memo_entries,value_hash", [(None, True), (7, True), (None, False)])
def test_long_agent_sessions_blobs_equal_inline(tmp_path, tok, monkeypatch, memo_entries, value_hash):
    """Also with a tiny key memo, so its generations turn over all the time, and
    with the key memo keyed by serializing (no compiled value hash)."""
    import replay.readers.blobs

    if memo_entries is not None:
        monkeypatch.setattr(replay.readers.blobs, "KEY_MEMO_ENTRIES", memo_entries)
    if not value_hash:
        monkeypatch.setattr(replay.readers.blobs, "item_hashes", None)
    elif replay.readers.blobs.item_hashes is None:
        pytest.skip("replay.readers._jsonhash is not built here")
    generate(tmp_path, seed=3, scale=0.5, days=1, turns=20, chat_share=0.3)
    _, con_b = _same([str(tmp_path)], tok)
    assert con_b.execute("SELECT count(*) - count(DISTINCT blob_id) FROM blobs").fetchone()[0] == 0


@pytest.mark.skipif(not TRAJ, reason="shared trajectories not present")
def test_trajectories_blobs_equal_inline(tok):
    _same(TRAJ[:3], tok)


def test_edge_bodies_blobs_equal_inline(tmp_path, tok):
    recs = [
        # NaN: orjson refuses the line, the standard parser reads it
        '{"timestamp": 1, "request": {"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}}',
        # a lone surrogate: the whole body is ASCII-escaped, kept inline
        '{"timestamp": 2, "request": {"messages": [{"role": "user", "content": "x\\ud800y"}]}}',
        # responses-style instructions without system: kept inline
        '{"timestamp": 3, "request": {"instructions": "be brief", "messages": [{"role": "user", "content": "a"}]}}',
        # messages before tools, system as a list, non-ASCII, empty tools
        json.dumps({"timestamp": 4, "request": {"messages": [{"role": "user", "content": "ü €"}],
                    "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
                    "tools": [], "max_tokens": 5}}, ensure_ascii=False),
        json.dumps({"timestamp": 5, "request": {"system": None, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "text", "text": "r"}]},
            {"role": "assistant", "content": "s", "tool_calls": [{"id": "1", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]}], "tools": [{"name": "f", "input_schema": {}}],
            "big": 12345678901234567890123, "f": 1.5e300}}),
        # floats inside parts (orjson writes them differently: the standard text is kept),
        # look-alikes in strings, control characters, every escape
        json.dumps({"timestamp": 7, "request": {"system": "v1.5 e.g. 2e3 \u0000\u001f\u2028 \"q\" \\", "messages": [
            {"role": "user", "content": "1. first\n2. second\tend \u007f"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
             "input": {"a": 1e-05, "b": 0.1, "c": 2.5e-07, "d": 1e16, "e": -0.0, "n": 3}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}],
            "tools": [{"name": "f", "input_schema": {"type": "object", "minimum": 0.5}}], "temperature": 0.7}}),
        # the same conversation again: its messages are stored once
        json.dumps({"timestamp": 6, "request": {"messages": [{"role": "user", "content": "ü €"}],
                    "system": [{"type": "text", "text": "sys"}], "tools": [], "max_tokens": 5}},
                   ensure_ascii=False),
    ]
    p = tmp_path / "edge.jsonl"
    p.write_text("\n".join(recs) + "\n", encoding="utf-8")
    q = tmp_path / "arr.json"
    q.write_text(json.dumps([json.loads(recs[3]), json.loads(recs[4])]), encoding="utf-8")
    con_a, con_b = _same([str(p), str(q)], tok)
    n_inline = con_b.execute("SELECT count(*) FROM requests WHERE body IS NOT NULL").fetchone()[0]
    assert n_inline == 2  # the surrogate and the instructions bodies


def test_reingest_and_second_file_reuse_blobs(tmp_path, tok):
    generate(tmp_path / "a", seed=4, scale=0.3, days=1, turns=10, chat_share=0.0)
    con = db.connect(None)
    ingest(con, [str(tmp_path / "a")], body_blobs=True)
    n = con.execute("SELECT count(*) FROM blobs").fetchone()[0]
    ingest(con, [str(tmp_path / "a")], body_blobs=True)  # skipped: same files
    assert con.execute("SELECT count(*) FROM blobs").fetchone()[0] == n
    # the same content under another name: no new blobs, new requests
    for f in (tmp_path / "a").glob("agent-*.jsonl"):
        (tmp_path / "b").mkdir(exist_ok=True)
        (tmp_path / "b" / f.name).write_bytes(f.read_bytes() + b"\n")
    ingest(con, [str(tmp_path / "b")], body_blobs=True)
    assert con.execute("SELECT count(*) FROM blobs").fetchone()[0] == n
    assert con.execute("SELECT count(*) FROM request_bodies WHERE body IS NULL").fetchone()[0] == 0


def test_separate_runs_never_duplicate_blobs_or_segments(tmp_path):
    """blobs/segments carry no index (memory): uniqueness is the code's job — check it
    across separate connections and files that share almost all their content."""

    from replay.store import db
    from replay import api as pipeline

    src = SAMPLE / "agent-anthropic.jsonl"
    lines = src.read_text().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[: len(lines) // 2 + 5]))
    (tmp_path / "b.jsonl").write_text("".join(lines))          # overlaps a.jsonl, other bytes
    for name in ("a.jsonl", "b.jsonl"):
        con = db.connect(tmp_path / "u.duckdb")                  # a new run each time
        pipeline.ingest(con, [str(tmp_path / name)])
        pipeline.prepare(con, modes=("global",))
        con.close()
    con = db.connect(tmp_path / "u.duckdb")
    for table, key in (("blobs", "blob_id"), ("segments", "seg_id")):
        n, distinct = con.execute(f"SELECT count(*), count(DISTINCT {key}) FROM {table}").fetchall()[0]
        assert n == distinct > 0


def test_blobs_found_by_first_request_and_otherwise(tmp_path, tok):
    """Tokenize reads a chunk's new blobs by their first request (a range); blobs
    first held by requests outside it — an earlier file, a database from before
    that column — are found all the same, and the prompts do not change."""
    from replay.synth.generator import generate as gen

    gen(tmp_path / "logs", seed=4, scale=0.4)
    files = sorted(str(p) for p in (tmp_path / "logs").glob("*.jsonl"))
    whole = db.connect(None)
    ingest(whole, files)
    tokenize_stage(whole, tok, chunk_requests=37)
    want = whole.execute("SELECT request_id, n_tokens, seg_ids, seg_parts FROM prompts ORDER BY 1").fetchall()
    assert whole.execute("SELECT count(*) FROM blobs WHERE first_request IS NULL").fetchone()[0] == 0

    stepwise = db.connect(None)  # file by file, tokenizing in between: later files reuse earlier blobs
    for f in files:
        ingest(stepwise, [f])
        tokenize_stage(stepwise, tok, chunk_requests=37)
    assert stepwise.execute("SELECT request_id, n_tokens, seg_ids, seg_parts FROM prompts ORDER BY 1"
                            ).fetchall() == want

    legacy = db.connect(None)  # no first_request at all
    ingest(legacy, files)
    legacy.execute("UPDATE blobs SET first_request = NULL")
    tokenize_stage(legacy, tok, chunk_requests=37)
    assert legacy.execute("SELECT request_id, n_tokens, seg_ids, seg_parts FROM prompts ORDER BY 1"
                          ).fetchall() == want


def test_body_texts_are_stored_with_zstd_and_read_back_the_same(tmp_path, monkeypatch):
    """db.connect asks DuckDB for zstd on strings (smaller file, cheaper checkpoints);
    the bodies read back after a reopen are those of a database with DuckDB's own
    choice of compression."""
    from replay import api as pipeline

    src = SAMPLE
    bodies = {}
    for mode in ("zstd", "auto"):
        monkeypatch.setenv("REPLAY_DUCKDB_COMPRESSION", mode)
        path = tmp_path / f"{mode}.duckdb"
        con = db.connect(path)
        pipeline.ingest(con, [str(src)])
        con.close()  # checkpoint: the rows are compressed on disk now
        con = db.connect(path)
        methods = {r[0] for r in con.execute(
            "SELECT DISTINCT compression FROM pragma_storage_info('blobs') WHERE column_name = 'text'").fetchall()}
        assert ("ZSTD" in methods) == (mode == "zstd")
        bodies[mode] = con.execute("SELECT request_id, body FROM request_bodies ORDER BY 1").fetchall()
        con.close()
    assert bodies["zstd"] == bodies["auto"] and len(bodies["zstd"]) > 100


def test_a_chunk_of_requests_is_read_by_a_scan_not_through_the_index(tmp_path):
    """The tokenize stage reads its requests a range of ids at a time. Through the
    primary key's index DuckDB fetches such a range row by row, each fetched
    string decompressing its zstd block: db.connect turns index scans off."""
    from replay import api as pipeline

    path = tmp_path / "r.duckdb"
    con = db.connect(path)
    pipeline.ingest(con, [str(ROOT / "data" / "sample")])
    con.close()
    con = db.connect(path)
    plan = con.execute("EXPLAIN ANALYZE SELECT output FROM requests WHERE request_id BETWEEN 0 AND 100"
                       ).fetchall()[0][1]
    con.close()
    assert "Sequential Scan" in plan and "Index Scan" not in plan


def _json_values(rng, depth=0):
    """Random decoded-JSON values made of near misses: 1 / 1.0 / True / "1",
    0.0 / -0.0, the same keys in another order, a list inside a list."""
    leaves = [0, 1, -1, 2**63 - 1, -2**63, 1.0, 0.0, -0.0, 1.5, 1e300, True, False, None,
              "", "1", "a", "true", "null", "ü", "a\nb"]
    r = rng.random()
    if depth >= 3 or r < 0.4:
        return rng.choice(leaves)
    if r < 0.7:
        return [_json_values(rng, depth + 1) for _ in range(rng.randrange(3))]
    keys = rng.sample(["a", "b", "c", "1"], rng.randrange(4))
    return {k: _json_values(rng, depth + 1) for k in keys}


def test_value_hash_equal_exactly_when_orjson_writes_the_same():
    """The key memo's hash (replay/readers/_jsonhash.pyx) against its definition: two
    values share a hash when, and only when, orjson serializes them the same."""
    import random

    import orjson

    import replay.readers.blobs

    if replay.readers.blobs.item_hashes is None:
        pytest.skip("replay.readers._jsonhash is not built here")
    rng = random.Random(5)
    values = [_json_values(rng) for _ in range(3000)]
    values += [{"b": 1, "a": 2}, {"a": 2, "b": 1}, [[1], 2], [1, [2]], [1, 2], {"a": [1.0]}, {"a": [1]}]
    copies = [orjson.loads(orjson.dumps(v)) for v in values]  # the same content, new objects
    hashes = replay.readers.blobs.item_hashes(values)
    assert hashes == replay.readers.blobs.item_hashes(copies)
    by_hash: dict[int, set] = {}
    for h, v in zip(hashes, values):
        by_hash.setdefault(h, set()).add(orjson.dumps(v))
    assert all(len(texts) == 1 for texts in by_hash.values())  # one serialization per hash
    assert len(by_hash) == len({orjson.dumps(v) for v in values})  # and one hash per serialization
    assert len(by_hash) > 1000
    # what it has no hash for: the caller serializes instead
    for odd in (2**64, [1, 2**70], {1: "a"}, (1, 2), {"a": {"b": object()}}):
        assert replay.readers.blobs.item_hashes([{"x": 1}, odd]) is None


def test_the_value_hash_is_built_where_a_compiler_is():
    import shutil

    import replay.readers.blobs

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    assert replay.readers.blobs.item_hashes is not None


def test_prepared_parts_whose_segments_did_not_all_come_are_left_out():
    """The tokenize stage adds the encoder process's prepared parts to its pools
    as whole arrays (``BlobCache._take_prepared``); a part one of whose new
    segments was not handed over is left out (the stage renders it instead),
    and the others keep their own segments and parts."""
    import numpy as np

    from replay.text.encoder import PreparedBlobs
    from replay.text.blob_cache import BlobCache
    from replay.text.tokenize import NewSegments

    class FakeTok:  # hands over the tokens of every segment but 22
        def take_segments(self, seg_ids):
            return {s: np.array([s % 7, 1], dtype=np.int32) for s in seg_ids if s != 22}

    con = db.connect(None)
    store = NewSegments(con, FakeTok(), 1000)
    store.known[11] = 3  # already stored: not asked for
    cache = BlobCache(store)
    got = PreparedBlobs(ids=[100, 101, 102], kinds=["message", "tool", "system"],
                        seg_ids=np.array([11, 21, 22, 31, 32, 11], dtype=np.uint64),
                        lengths=np.array([1, 2, 3], dtype=np.int64),
                        parts=np.array([5, 0, 0, 1, 1, 1], dtype=np.int32))
    kept = cache._take_prepared(got)
    assert kept.ids == [100, 102]  # 101 holds segment 22, which did not come
    assert sorted(store.new_arrays) == [21, 31, 32]  # (21 came, although its part is left out)
    for bid, segs, parts in ((100, [11], [5]), (102, [31, 32, 11], [1, 1, 1])):
        i = cache.index[bid]
        a, b = cache.start.view[i], cache.end.view[i]
        assert cache.pool_seg.view[a:b].tolist() == segs
        assert cache.pool_part.view[a:b].tolist() == parts
    assert 101 not in cache.index
    assert cache.ntok.view.tolist() == [-1, -1]  # counted once their segments are stored
