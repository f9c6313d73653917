"""The real Mooncake trace: the pipeline's global ceiling at block 512 against an
independent count over hash ids, with an infinite TTL and with TTLs compared in
integer milliseconds (the trace's own unit)."""

import json
import math


from replay.store import db
from replay import api as pipeline
from replay.core.grid import Grid


def independent_block_ceiling(path, ttl_ms: int | None = None) -> tuple[int, int, int]:
    """Prefix-contiguous block hits with a global cache: a request's first k blocks
    hit when each id was last used at most ``ttl_ms`` before (ids are
    prefix-chained, so a block's last use is never older than its parent's), and
    only whole 512-token blocks count. Times are the trace's integer milliseconds.
    Also returns how many leading blocks were last used exactly ``ttl_ms`` before."""
    last: dict[int, int] = {}
    prompt = hit = on_the_boundary = 0
    records = [json.loads(line) for line in open(path) if line.strip()]
    for r in sorted(records, key=lambda r: r["timestamp"]):  # (a stable sort: ties in file order)
        ids, n_in, t = r["hash_ids"], r["input_length"], int(r["timestamp"])
        k = 0
        while k < len(ids) and ids[k] in last and (ttl_ms is None or t - last[ids[k]] <= ttl_ms):
            on_the_boundary += ttl_ms is not None and t - last[ids[k]] == ttl_ms
            k += 1
        hit += min(k, n_in // 512) * 512
        prompt += n_in
        for b in ids:
            last[b] = t
    return prompt, hit, on_the_boundary


def test_mooncake_global_ceiling_matches_independent_count(shared_data):
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    con = db.connect(None)
    summary = pipeline.ingest(con, [str(path)])
    assert summary.loaded == 12_031 and summary.rejected == 0
    res = pipeline.sweep(con, Grid(ttls=(math.inf,), blocks=(512,), min_prefixes=(0,), streams=("global",)))
    row = res.to_dicts()[0]
    prompt, hit, _ = independent_block_ceiling(path)
    assert row["prompt_tokens"] == prompt
    assert row["hit_tokens"] == hit
    assert 0.35 < row["hit_ratio"] < 0.40  # the README's "about 37 %"


def test_mooncake_finite_ttls_equal_an_integer_millisecond_count(shared_data):
    """At 60 s and 300 s the ceiling equals the count in integer ms, blocks last
    used exactly a TTL before included (the trace has such blocks at 60 s: with
    times in float seconds one of them came out 60.00000000000023 s old)."""
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    con = db.connect(None)
    pipeline.ingest(con, [str(path)])
    res = pipeline.sweep(con, Grid(ttls=(60.0, 300.0), blocks=(512,), min_prefixes=(0,), streams=("global",)))
    boundary = 0
    for row in res.to_dicts():
        prompt, hit, on_it = independent_block_ceiling(path, int(row["ttl_s"] * 1000))
        assert (row["prompt_tokens"], row["hit_tokens"]) == (prompt, hit), row["ttl_s"]
        boundary += on_it
    assert boundary > 0
