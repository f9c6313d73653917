"""The benchmark's naive baseline and the real pipeline agree on a small generated log.

No timing is asserted: this checks that `bench/pipeline.py` compares like with
like (same requests, same tokens, same sweep) — a second, independent oracle of
the fast path (blobs, segments, trie, SQL sweep) on agent-like traffic.
"""

import sys

import pytest

from support.paths import ROOT

BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import naive  # noqa: E402
import pipeline as bench  # noqa: E402


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "logs"
    res = bench.stage_generate(str(out), requests=40, days=1.5, seed=2, turns=8, chat_share=0.3)
    assert res["requests"] > 20
    return out


def test_both_baselines_equal_the_pipeline(logs, tmp_path):
    """The naive baseline (whole prompts tokenized) and the unique-content one (the
    pipeline's tokenize stage, then a per-block dict instead of the trie) give the
    pipeline's sweep, on the same requests and tokens."""
    ttls = (30.0, 300.0, 3600.0)
    pipe = bench.stage_pipeline(str(logs), str(tmp_path / "r.duckdb"), ttls=ttls)
    assert len(pipe["rows"]) == len(ttls) * len(bench.BLOCKS) * len(bench.MIN_PREFIXES) * len(bench.STREAMS)
    assert any(r["hit_tokens"] > 0 for r in pipe["rows"])
    assert pipe["unique_content_tokens"] < pipe["logical_prompt_tokens"]
    for nv in (naive.run([str(logs)], ttls, bench.BLOCKS, bench.MIN_PREFIXES, bench.STREAMS),
               naive.run_unique([str(logs)], str(tmp_path / "u.duckdb"), ttls, bench.BLOCKS, bench.MIN_PREFIXES,
                                bench.STREAMS)):
        assert nv["requests"] == pipe["requests"]
        assert nv["logical_prompt_tokens"] == pipe["logical_prompt_tokens"]
        assert bench.same_results(pipe["rows"], nv["rows"])


def test_same_results_notices_a_difference():
    row = {"stream": "tenant", "ttl_s": 60.0, "block": 16, "min_prefix": 0, "requests": 3,
           "prompt_tokens": 100, "hit_tokens": 32, "requests_hit": 1}
    assert bench.same_results([row], [dict(row)])
    assert not bench.same_results([row], [dict(row, hit_tokens=48)])


def test_the_capacity_bench_compares_like_with_like(logs, tmp_path):
    """bench/capacity.py on a pipeline's database: the per-capacity simulations
    equal the one pass, the grid without ∞ equals the one with it where both
    have the capacity, and the sampled stage's error is measured against them."""
    import json
    import subprocess

    bench.stage_pipeline(str(logs), str(tmp_path / "r.duckdb"), ttls=(300.0,))
    out = subprocess.run([sys.executable, str(BENCH / "capacity.py"), "--db", str(tmp_path / "r.duckdb"),
                          "--naive-capacities", "3", "--seeds", "1", "--json"],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    assert res["naive_results_identical"] is True and res["naive"]["simulations"] == 2 * 2 * 3
    assert res["exact_preset_ttls_identical"] is True and res["exact_preset_ttls_rows_compared"] > 0
    assert 0 <= res["sampled"]["max_error_pts"] < 100 and len(res["sampled"]["runs"]) == 1


def test_the_near_bench_compares_like_with_like(tmp_path):
    """bench/near.py: the windowed search equals the naive every-pair one."""
    pytest.importorskip("wordllama")
    import json
    import subprocess

    from replay import api

    con = api.open_db(tmp_path / "s.duckdb")
    api.ingest(con, [str(BENCH.parent / "data" / "sample")])
    con.close()
    out = subprocess.run([sys.executable, str(BENCH / "near.py"), "--db", str(tmp_path / "s.duckdb"), "--json"],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    assert res["naive_results_identical"] is True and res["requests"] == 268 and res["unique_texts"] > 0


@pytest.mark.slow
def test_the_distributed_bench_compares_like_with_like(logs, tmp_path):
    """bench/distributed.py on a pipeline's database: the replay on a Ray cluster
    of one CPU writes the local pass's rows (digest of every walk), and the
    workers' memory is seen."""
    pytest.importorskip("ray")
    import json
    import subprocess

    bench.stage_pipeline(str(logs), str(tmp_path / "r.duckdb"), ttls=(300.0,))
    out = subprocess.run([sys.executable, str(BENCH / "distributed.py"), "--db", str(tmp_path / "r.duckdb"),
                          "--workers", "1", "--horizon", "inf", "--json"],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    assert res["local"]["rows_identical"] is True and res["ray-1"]["rows_identical"] is True
    assert res["ray-1"]["requests"] == res["local"]["requests"] > 0
    assert res["ray-1"]["peak_rss_workers_mb"] and res["local"]["peak_rss_workers_mb"] == []


def test_the_pipeline_at_two_workers_is_compared_with_one_in_the_same_run(tmp_path):
    """--workers 2: the same log also runs in one process; the rows must agree, and
    the cost model's figures come from the run's own CPU accounting."""
    out = bench.one_run(requests=200, days=0.05, seed=3, turns=6.0, chat_share=0.2, naive=False,
                        workdir=tmp_path / "w", keep=False, workers=2)
    assert out["rows_identical_to_one_worker"] is True
    assert out["speedup_vs_one_worker"] > 0
    cm = out["cost_model"]
    assert cm["driver_cpu_s"] > 0 and cm["worker_cpu_s"] > 0
    assert cm["driver_cpu_s_per_1k_requests"] == pytest.approx(cm["driver_cpu_s"] / (out["requests"] / 1000))
    est = cm["estimate_100x_by_nodes"]
    assert set(est) == {"8", "32", "128"}
    assert est["8"]["workers_s"] == pytest.approx(4 * est["32"]["workers_s"])
