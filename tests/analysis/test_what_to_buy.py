"""The report's "What to buy" section: its options are `replay capacity --tier` rows
priced by the cost model, its recommendation follows its stated rule, and without
a GPU it says which flags to pass."""

import polars as pl
from click.testing import CliRunner

from replay import api
from replay.analysis.buy import COST_KEYS
from replay.analysis.what_to_buy import buy_figures, buy_section, recommend, replica_shape
from replay.cli.main import main

from support.gen import random_requests
from support.logs import write_tokens_log as _write_tokens_log


def _con(tmp_path):
    reqs = random_requests(5, n=60, alphabet=2, max_len=3000, gaps=(0, 30, 120, 900))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    con = api.open_db(tmp_path / "b.duckdb")
    api.ingest(con, [str(log)])
    return con


def test_the_section_prices_each_option_as_capacity_does(tmp_path):
    cost = api.cost_model("llama-3.1-8b", gpu="h100", price=3.0)
    con = _con(tmp_path)
    f = buy_figures(con, cost, "tenant", 16)
    df = f["rows"]
    assert sorted(set(df["option"])) == sorted(f["options"]) and set(df["routing"]) == {"round-robin", "sticky"}
    # a replica of the 8B model: one H100 (16 GB of weights ≤ 60 % of 80 GB), 90 % of 80 GB less the weights
    assert f["tp"] == 1 and f["kv_bytes"] == int(0.9 * 80e9 - (cost.model.weight_bytes + cost.model.embedding_bytes))
    assert replica_shape(api.cost_model("llama-3.1-70b", gpu="h100"))[0] == 4  # 141 GB of weights: 4 × 80 GB
    for r in df.iter_rows(named=True):  # each row is the CLI's row for the same tiers
        args = ["capacity", "--db", str(tmp_path / "b.duckdb"), "--stream", "tenant", "--block", "16",
                "--replicas", str(f["replicas"]), "--routing", r["routing"], "--tier", r["tiers"],
                "--model", "llama-3.1-8b", "--gpu", "h100", "--gpu-price", "3", "--json"]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        (cli,) = [x for x in __import__("json").loads(res.stdout) if x["routing"] == r["routing"]]
        assert {k: cli[k] for k in COST_KEYS + ["hit_tokens"]} == {k: r[k] for k in COST_KEYS + ["hit_tokens"]}
    text = buy_section(con, tmp_path, api.Grid(streams=("tenant",), blocks=(16,)), cost)
    assert text.startswith("## What to buy") and "**Buy: " in text and (tmp_path / "what_to_buy.png").exists()
    assert text.count("\n| ") == 1 + 1 + len(df)  # header, no cache, the options


def test_the_recommendation_follows_its_rule():
    options = ["GPU memory only", "+ DRAM per replica", "+ pooled DRAM"]

    def frame(rows):
        return pl.DataFrame([dict(zip(["option", "routing", "gpus_peak_hour", "prefill_gpu_hours_week"], r))
                             for r in rows])
    # fewest GPUs wins
    assert recommend(frame([("GPU memory only", "sticky", 5, 100.0), ("+ pooled DRAM", "sticky", 4, 99.0)]),
                     options)["option"] == "+ pooled DRAM"
    # same GPUs: the simpler option within 2 % of the fewest GPU-hours
    assert recommend(frame([("+ DRAM per replica", "sticky", 4, 101.5), ("+ pooled DRAM", "sticky", 4, 100.0)]),
                     options)["option"] == "+ DRAM per replica"
    assert recommend(frame([("+ DRAM per replica", "sticky", 4, 103.0), ("+ pooled DRAM", "sticky", 4, 100.0)]),
                     options)["option"] == "+ pooled DRAM"


def test_without_a_gpu_the_section_names_the_flags(tmp_path):
    text = buy_section(None, tmp_path, None, None)
    assert "--model NAME --gpu NAME" in text and "--gpu-price" in text
    assert not (tmp_path / "what_to_buy.png").exists()


def test_replay_run_writes_the_section_with_a_model_and_a_gpu(tmp_path):
    reqs = random_requests(9, n=30, alphabet=2, max_len=600, gaps=(0, 30, 120))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    base = ["run", str(log), "--db", str(tmp_path / "r.duckdb"), "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(main, base + ["--name", "with", "--model", "llama-3.1-8b", "--gpu", "h100"])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "out" / "with" / "report.md").read_text()
    assert "## What to buy" in text and "**Buy: " in text and "--gpu-price" in text  # (no price: says how)
    assert (tmp_path / "out" / "with" / "what_to_buy.png").exists()
    res = CliRunner().invoke(main, base + ["--name", "without"])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "out" / "without" / "report.md").read_text()
    assert "## What to buy" in text and "--model NAME --gpu NAME" in text and "**Buy: " not in text
    res = CliRunner().invoke(main, base + ["--name", "bad", "--gpu", "h100"])
    assert res.exit_code != 0 and "--model" in res.output
