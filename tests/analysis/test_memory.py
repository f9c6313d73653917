"""The report's "How much memory" section: its sizes are read off the capacity
curve as stated, its ceilings are the sweep's, and ``replay run`` writes it in
GiB with a model and in blocks (saying which flag to pass) without one."""

import math

import polars as pl
from click.testing import CliRunner

from replay import api
from replay.analysis import memory
from replay.cli.main import main

from support.paths import SAMPLE


def _db(tmp_path):
    con = api.open_db(tmp_path / "m.duckdb")
    api.ingest(con, [str(SAMPLE)])
    return con


def test_sizes_are_the_smallest_capacities_reaching_each_share_and_ceilings_are_the_sweeps(tmp_path):
    con = _db(tmp_path)
    f = memory.memory_figures(con, streams=("tenant", "global"), ttls=(300.0, math.inf), block=16,
                              bytes_per_token=131072, model="llama-3.1-8b")
    sweep = api.sweep(con, api.Grid(ttls=(300.0, math.inf), blocks=(16,), min_prefixes=(0,),
                                    streams=("tenant", "global")))
    assert len(f.sizes) == 4
    for r in f.sizes.iter_rows(named=True):
        curve = f.curve.filter((pl.col("stream") == r["stream"]) & pl.col("ttl_s").eq_missing(r["ttl_s"]))
        pts = sorted(zip(curve["capacity_blocks"], curve["hit_ratio"]))
        ceiling = max(h for _, h in pts)
        assert r["ceiling"] == ceiling > 0
        want = sweep.filter((pl.col("stream") == r["stream"]) & pl.col("ttl_s").eq_missing(r["ttl_s"]))
        assert math.isclose(ceiling, want["hit_ratio"][0])
        for share in memory.SHARES:
            got = r[f"blocks_{round(share * 100)}"]
            assert got == min(c for c, h in pts if h >= share * ceiling - 1e-12)
        assert r["blocks_50"] <= r["blocks_90"] <= r["blocks_99"] <= r["working_set_blocks"]
    # the replicas table: every routing at every replica count, at the 90 % size of the headline curve
    head = f.sizes.filter((pl.col("stream") == "tenant") & (pl.col("ttl_s") == 300.0))
    assert set(f.replicas["capacity_blocks"]) == {head["blocks_90"][0]}
    assert {(r, ro) for r, ro in f.replicas.select(["replicas", "routing"]).iter_rows() if r > 1} == \
        {(r, ro) for r in memory.REPLICAS[1:] for ro in memory.ROUTINGS}
    one = f.replicas.filter(pl.col("replicas") == 1)["hit_ratio"]
    assert math.isclose(one[0], f.curve.filter((pl.col("stream") == "tenant") & (pl.col("ttl_s") == 300.0) &
                                               (pl.col("capacity_blocks") == head["blocks_90"][0]))["hit_ratio"][0])


def test_run_writes_the_section_in_gib_with_a_model_and_in_blocks_without(tmp_path):
    out = tmp_path / "reports"
    res = CliRunner().invoke(main, ["run", str(SAMPLE), "--db", str(tmp_path / "r.duckdb"), "--out", str(out),
                                    "--name", "m", "--model", "llama-3.1-8b"])
    assert res.exit_code == 0, res.output
    text = (out / "m" / "report.md").read_text()
    section = text.split("## How much memory")[1].split("\n## ")[0]
    assert "GiB" in section and "llama-3.1-8b" in section and "### Recommendation" in section
    assert "| 4 | prefix |" in section and "| 1 | (any) |" in section
    assert (out / "m" / "memory_vs_hits.png").stat().st_size > 1000
    res = CliRunner().invoke(main, ["report", "--db", str(tmp_path / "r.duckdb"), "--out", str(out), "--name", "b"])
    assert res.exit_code == 0, res.output
    section = (out / "b" / "report.md").read_text().split("## How much memory")[1].split("\n## ")[0]
    assert " GiB |" not in section and "blocks |" in section and "pass `--model NAME`" in section


def test_an_unknown_model_is_a_clear_error(tmp_path):
    res = CliRunner().invoke(main, ["run", str(SAMPLE), "--db", str(tmp_path / "r.duckdb"),
                                    "--out", str(tmp_path / "o"), "--model", "no-such-model"])
    assert res.exit_code != 0 and "no-such-model" in res.output
    assert not (tmp_path / "o").exists() and not (tmp_path / "r.duckdb").exists()  # before any work


def test_capacity_refuses_an_unknown_model_before_any_work(tmp_path):
    res = CliRunner().invoke(main, ["capacity", str(SAMPLE), "--db", str(tmp_path / "c.duckdb"),
                                    "--model", "no-such-model"])
    assert res.exit_code == 1 and "no-such-model" in res.output
    assert not (tmp_path / "c.duckdb").exists()
