"""The CLI as a user meets it: help, the batch job, exit codes."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"


def test_help_lists_the_commands():
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    for cmd in ("ingest", "tokenize", "sweep", "run", "report", "synth"):
        assert cmd in res.output


def test_run_writes_the_report_on_the_sample(tmp_path):
    res = CliRunner().invoke(main, ["run", str(SAMPLE), "--db", str(tmp_path / "r.duckdb"),
                                    "--out", str(tmp_path / "reports"), "--name", "s"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "reports" / "s"
    text = (out / "report.md").read_text()
    for heading in ("## Summary", "## Ceiling against TTL", "## Per stream", "## Idle gaps"):
        assert heading in text
    for png in ("ceiling_vs_ttl.png", "idle_gaps.png", "streams_tenant.png"):
        assert (out / png).stat().st_size > 1000
    rows = json.loads((out / "sweep.json").read_text())
    assert len(rows) == 4 * 3 * 2 * 3
    # re-running the same job on the same database does not double-count
    again = CliRunner().invoke(main, ["sweep", str(SAMPLE), "--db", str(tmp_path / "r.duckdb"), "--json"])
    assert again.exit_code == 0
    assert json.loads(again.stdout) == rows


def test_nothing_loadable_exits_1_and_prints_no_prompt_text(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1, "messages": [{"role": "user", "content": "SECRET-PROMPT"}]\n')
    res = CliRunner().invoke(main, ["sweep", str(bad), "--db", str(tmp_path / "x.duckdb"), "--json"])
    assert res.exit_code == 1
    assert "nothing could be loaded" in res.output
    assert "SECRET-PROMPT" not in res.output


def test_bad_options_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["sweep", "--db", str(tmp_path / "x.duckdb"), "--ttl", "soon"])
    assert res.exit_code == 2
    res = CliRunner().invoke(main, ["sweep", "--db", str(tmp_path / "x.duckdb"), "--stream", "planet"])
    assert res.exit_code == 2


def test_sweep_on_an_empty_database_says_what_to_do(tmp_path):
    res = CliRunner().invoke(main, ["sweep", "--db", str(tmp_path / "empty.duckdb")])
    assert res.exit_code == 1
    assert "holds no requests" in res.output


def test_profiles_are_listed_and_sweep_accepts_them(tmp_path):
    res = CliRunner().invoke(main, ["profiles"])
    assert res.exit_code == 0
    for name in ("ideal", "vllm", "sglang", "mooncake", "mlx-lm", "deepseek"):
        assert f"{name}:" in res.output
    db_ = str(tmp_path / "p.duckdb")
    res = CliRunner().invoke(main, ["sweep", str(SAMPLE), "--db", db_, "--profile", "ideal,vllm",
                                    "--stream", "tenant", "--ttl", "5m", "--block", "16", "--min-prefix", "0",
                                    "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["profile"] for r in rows} == {"ideal", "vllm"}
    assert all(r["realized_prompt_tokens"] is not None for r in rows)  # the sample logs carry usage
    vllm = next(r for r in rows if r["profile"] == "vllm")
    assert vllm["block"] == 16 and vllm["hit_tokens"] % 16 == 0  # the profile's own block size
    bad = CliRunner().invoke(main, ["sweep", "--db", db_, "--profile", "nosuch"])
    assert bad.exit_code == 2


def test_whatif_prices_fixes_with_the_shipped_price_table(tmp_path):
    res = CliRunner().invoke(main, ["whatif", str(SAMPLE), "--db", str(tmp_path / "w.duckdb"),
                                    "--fix", "sort-tools", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["before"]["money"]["full_price"] > 0          # the logged model's price, from prices.toml
    assert out["fixes"][0]["after"]["hit_tokens"] >= out["before"]["hit_tokens"]
    bad = CliRunner().invoke(main, ["whatif", "--db", str(tmp_path / "w.duckdb"), "--fix", "sort-tools",
                                    "--price-model", "no-such-model"])
    assert bad.exit_code == 1 and "no price for model" in bad.output


def test_report_survives_a_failing_section_and_bounds_the_why_miss_work(tmp_path, monkeypatch):
    from replay.store import db
    from replay.analysis.diagnose import summary as diagnose
    from replay import api as pipeline
    from replay.analysis import report

    con = db.connect(tmp_path / "r.duckdb")
    pipeline.ingest(con, [str(SAMPLE)])

    def broken(con, out):
        raise RuntimeError("boom")

    path = report.write_report(con, tmp_path / "rep", extra_sections=[broken])
    assert "A section could not be computed: RuntimeError: boom" in path.read_text()
    monkeypatch.setattr(diagnose, "REPORT_WHATIF_MAX", 10)
    text = diagnose.why_miss_section(con, tmp_path)
    assert "| timestamp |" in text and "not computed in the report above 10 requests" in text
    monkeypatch.setattr(diagnose, "REPORT_DIAGNOSE_MAX", 10)
    assert "Not computed in the report for a log of 268 requests" in diagnose.why_miss_section(con, tmp_path)


@pytest.mark.parametrize("command", [["ingest"], ["sweep"], ["run"], ["diagnose"], ["capacity"], ["duplicates"],
                                     ["duplicates", "label-export"]])
def test_a_missing_path_is_a_usage_error_not_a_traceback(tmp_path, command):
    for bad in (str(tmp_path / "nonexistent.jsonl"), str(tmp_path / "nomatch*.jsonl")):
        res = CliRunner().invoke(main, command + [bad, "--db", str(tmp_path / "x.duckdb")])
        assert res.exit_code == 2, res.output
        assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
        assert "give log files" in res.output


def test_ingest_json_accounts_for_every_line(tmp_path):
    log = tmp_path / "mixed.jsonl"
    good = json.loads((SAMPLE / "chat-openai.jsonl").read_text().splitlines()[0])
    log.write_text(json.dumps(good) + "\n{not json\n" + json.dumps({"timestamp": 1}) + "\n")
    res = CliRunner().invoke(main, ["ingest", str(log), "--db", str(tmp_path / "x.duckdb"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"files", "lines", "loaded", "rejected", "skipped_files", "by_reason"}
    assert (out["files"], out["lines"], out["loaded"], out["rejected"], out["skipped_files"]) == (1, 3, 1, 2, 0)
    assert sum(out["by_reason"].values()) == 2
    again = json.loads(CliRunner().invoke(main, ["ingest", str(log), "--db", str(tmp_path / "x.duckdb"),
                                                 "--json"]).stdout)
    assert (again["skipped_files"], again["loaded"], again["lines"]) == (1, 0, 0)


@pytest.mark.parametrize("command", [["sweep", str(SAMPLE)], ["tokenize"], ["run", str(SAMPLE)],
                                     ["capacity", str(SAMPLE)]])
def test_a_tokenizer_directory_without_a_tokenizer_is_a_usage_error(tmp_path, command):
    empty = tmp_path / "tok"
    empty.mkdir()
    res = CliRunner().invoke(main, command + ["--db", str(tmp_path / "x.duckdb"), "--tokenizer", str(empty)])
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit) and "no tokenizer.json" in res.output


def test_a_database_held_by_another_process_is_a_clear_error(tmp_path):
    import subprocess
    import sys
    import time

    db = tmp_path / "held.duckdb"
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, pathlib, time; c = duckdb.connect({str(db)!r}); "
                               f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"])
    try:
        for _ in range(200):
            if ready.exists():
                break
            time.sleep(0.05)
        res = CliRunner().invoke(main, ["sweep", str(SAMPLE), "--db", str(db)])
        assert res.exit_code == 1, res.output
        assert "in use by another process" in res.output and isinstance(res.exception, SystemExit)
    finally:
        holder.kill()
        holder.wait()
