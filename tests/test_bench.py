"""The benchmark's naive baseline and the real pipeline agree on a small generated log.

No timing is asserted: this checks that `bench/pipeline.py` compares like with
like (same requests, same tokens, same sweep) — a second, independent oracle of
the fast path (blobs, segments, trie, SQL sweep) on agent-like traffic.
"""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import naive  # noqa: E402
import pipeline as bench  # noqa: E402


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "logs"
    res = bench.stage_generate(str(out), requests=40, days=1.5, seed=2, turns=8, chat_share=0.3)
    assert res["requests"] > 20
    return out


def test_naive_equals_pipeline(logs, tmp_path):
    ttls = (30.0, 300.0, 3600.0)
    pipe = bench.stage_pipeline(str(logs), str(tmp_path / "r.duckdb"), ttls=ttls)
    nv = naive.run([str(logs)], ttls, bench.BLOCKS, bench.MIN_PREFIXES, bench.STREAMS)
    assert nv["requests"] == pipe["requests"]
    assert nv["logical_prompt_tokens"] == pipe["logical_prompt_tokens"]
    assert len(pipe["rows"]) == len(ttls) * len(bench.BLOCKS) * len(bench.MIN_PREFIXES) * len(bench.STREAMS)
    assert bench.same_results(pipe["rows"], nv["rows"])
    assert any(r["hit_tokens"] > 0 for r in pipe["rows"])
    assert pipe["unique_content_tokens"] < pipe["logical_prompt_tokens"]
    # the stage times (the wait for the encoder's late checks among them) add up to the whole
    parts = ("ingest_s", "tokenize_s", "replay_s", "check_s", "sweep_s", "close_s")
    assert all(pipe[k] >= 0 for k in parts)
    assert sum(pipe[k] for k in parts) == pytest.approx(pipe["pipeline_s"], abs=1e-6)
    from replay.store import db

    con = db.connect(tmp_path / "r.duckdb")
    assert db.get_meta(con, "tokens_checked") == "yes"  # the rows were checked, not left pending
    con.close()


def test_same_results_notices_a_difference():
    row = {"stream": "tenant", "ttl_s": 60.0, "block": 16, "min_prefix": 0, "requests": 3,
           "prompt_tokens": 100, "hit_tokens": 32, "requests_hit": 1}
    assert bench.same_results([row], [dict(row)])
    assert not bench.same_results([row], [dict(row, hit_tokens=48)])
