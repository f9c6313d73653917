"""The CLI as a user meets it: help, the batch job, exit codes."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.cli.main import main
from support.paths import ROOT, SAMPLE



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
    assert "A section could not be computed: RuntimeError in test_cli.py" in path.read_text()
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
    assert set(out) == {"files", "lines", "loaded", "context", "rejected", "skipped_files", "by_reason",
                        "unordered_files"}
    assert out["unordered_files"] == []  # (one loaded line: in order)
    assert (out["files"], out["lines"], out["loaded"], out["rejected"], out["skipped_files"]) == (1, 3, 1, 2, 0)
    assert out["context"] == 0  # (only the lines of agents' session files are context)
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
    from support.procs import database_held

    db = tmp_path / "held.duckdb"
    with database_held(db):
        res = CliRunner().invoke(main, ["sweep", str(SAMPLE), "--db", str(db)])
        assert res.exit_code == 1, res.output
        assert "in use by another process" in res.output and isinstance(res.exception, SystemExit)


# Every command on a database, the notebook and batch flow: a fresh or an
# already-filled one, with or without logs. Helpers write to the real stderr
# (fd 2), so it is read through capfd, not only the runner's output.
def _commands(tmp_path, with_logs: bool) -> list[list[str]]:
    logs = [str(SAMPLE)] if with_logs else []
    return [
        *([["ingest", *logs]] if with_logs else []),
        ["tokenize"],
        ["sweep", *logs, "--json"],
        ["sweep", *logs, "--by-stream"],
        ["report", "--out", str(tmp_path / "rep")],
        ["diagnose", *logs, "--json"],
        ["whatif", *logs, "--fix", "sort-tools"],
        ["whatif", *logs, "--fix", "all"],
        ["diff", "tenant-0"],
        ["capacity", *logs, "--json"],
        ["duplicates", *logs],
        ["profiles"],
        ["run", *logs, "--out", str(tmp_path / "rep"), "--name", "r"],
    ]


@pytest.fixture(scope="module")
def filled_db(tmp_path_factory) -> Path:
    """A database after `replay run` on the sample (each test works on a copy)."""
    db = tmp_path_factory.mktemp("filled") / "replay.duckdb"
    res = CliRunner().invoke(main, ["run", str(SAMPLE), "--db", str(db), "--out", str(db.parent / "rep")])
    assert res.exit_code == 0, res.output
    return db


def _label_commands(tmp_path, with_logs: bool) -> list[list[str]]:
    """The labelling commands (their embeddings need the ``semantic`` extra)."""
    logs = [str(SAMPLE)] if with_logs else []
    return [["duplicates", "label-export", *logs, "--out", str(tmp_path / "labels"), "--pairs", "20"],
            ["duplicates", "audit", "--out", str(tmp_path / "audit")]]


@pytest.mark.parametrize("filled", [False, True], ids=["fresh", "filled"])
@pytest.mark.parametrize("with_logs", [False, True], ids=["no-logs", "logs"])
def test_every_command_on_a_fresh_or_filled_database_with_or_without_logs(tmp_path, filled_db, capfd,
                                                                          filled, with_logs):
    _run_all(_commands(tmp_path, with_logs), tmp_path, filled_db, capfd, filled, with_logs)


@pytest.mark.parametrize("filled", [False, True], ids=["fresh", "filled"])
@pytest.mark.parametrize("with_logs", [False, True], ids=["no-logs", "logs"])
def test_the_labelling_commands_on_a_fresh_or_filled_database_with_or_without_logs(tmp_path, filled_db, capfd,
                                                                                   filled, with_logs):
    pytest.importorskip("wordllama", reason="the labelling commands need the semantic extra")
    _run_all(_label_commands(tmp_path, with_logs), tmp_path, filled_db, capfd, filled, with_logs)


def _run_all(commands, tmp_path, filled_db, capfd, filled: bool, with_logs: bool) -> None:
    import shutil

    db = tmp_path / "replay.duckdb"
    if filled:
        shutil.copy(filled_db, db)
    for args in commands:
        res = CliRunner().invoke(main, args + ([] if args == ["profiles"] else ["--db", str(db)]))
        err = capfd.readouterr().err
        assert "Traceback" not in res.output + err, (args, res.output + err)
        if res.exit_code != 0:
            # only a database with no requests, and no logs to load, may end the job (exit 1, saying so);
            # `run` without logs takes the shipped sample
            assert not filled and not with_logs and args[0] != "run", (args, res.output)
            assert res.exit_code == 1 and "holds no requests" in res.output, (args, res.output)
        if args[:2] == ["duplicates", "label-export"] and res.exit_code == 0:
            imp = CliRunner().invoke(main, ["duplicates", "label-import", str(tmp_path / "labels.csv"),
                                            "--db", str(db)])
            assert "Traceback" not in imp.output + capfd.readouterr().err, imp.output


def test_an_unreadable_file_is_a_clear_error(request):
    import shutil
    import subprocess
    import sys

    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to read as another user (root reads every file)")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    probe = subprocess.run([*as_nobody, "-c", "import replay.cli.main"], capture_output=True, cwd=ROOT)
    if probe.returncode != 0:  # (a clone in a folder only its owner may read, as `mktemp -d` makes)
        pytest.skip("user nobody cannot import the package from this checkout")
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="replay-unreadable-"))  # (pytest's folders are the owner's alone)
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    base.chmod(0o777)
    log = base / "private.jsonl"
    shutil.copy(SAMPLE / "chat-openai.jsonl", log)
    log.chmod(0o000)
    db = base / "x.duckdb"

    def sweep_as_nobody():
        return subprocess.run([*as_nobody, "-c", "from replay.cli.main import main; main()", "sweep", str(log),
                               "--db", str(db)], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "REPLAY_CACHE_DIR": str(base / "cache")})

    for _ in range(2):
        p = sweep_as_nobody()
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert "unreadable_file" in p.stderr and "nothing could be loaded" in p.stderr
    import duckdb

    def rejects():
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute("SELECT count(*) FROM rejects WHERE path = ?", [str(log)]).fetchone()[0]
        finally:
            con.close()

    assert rejects() == 1  # one file, one reject: a second try does not count it again
    log.chmod(0o644)
    p = sweep_as_nobody()
    assert p.returncode == 0, p.stderr
    assert rejects() == 0  # readable now: loaded, and no longer counted as set aside


def test_a_directory_without_logs_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a log")
    res = CliRunner().invoke(main, ["sweep", str(tmp_path / "empty"), "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 2 and "no log files in" in res.output, res.output


def test_output_cut_short_by_its_reader_is_no_traceback(tmp_path):
    import subprocess
    import sys

    cmd = (f"{sys.executable} -c 'from replay.cli.main import main; main()' sweep {SAMPLE} "
           f"--db {tmp_path / 'x.duckdb'} --json --ttl 1s,2s,3s,5m,1h,inf | head -c 10")
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=ROOT)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
