"""Files in reverse or shuffled time order: classified at ingest (replay/readers/timeorder.py),
stored in `sources.time_order`, said in the ingest summary, `ingest --json` and the report —
and sorted all the same: the sweep of a reversed or shuffled copy equals the original's."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.overview import overview, unordered_note
from replay.cli.main import main
from replay.core.grid import Grid
from replay.readers.ingest import summary_text
from replay.readers.timeorder import MAX_STEP_US, classify
from replay.store import db
from support.paths import ROOT

SAMPLE = ROOT / "data" / "sample"
S = 1_000_000  # µs


# ----------------------------------------------------------------- the rule

@pytest.mark.parametrize("ts, want", [
    ([], "sorted"),                                  # an empty file
    ([5 * S], "sorted"),                             # one line
    ([3 * S, 3 * S, 3 * S], "sorted"),               # all ties: non-decreasing
    ([1, 2, 2, 3, 3, 3, 9], "sorted"),               # ties within an ascending file
    ([9, 3, 3, 2, 2, 1], "reversed"),                # ties within a descending one
    ([2, 1], "reversed"),                            # two distinct times, descending
    ([1, 5, 2, 8, 3, 9, 0], "shuffled"),
])
def test_the_order_of_a_sequence(ts, want):
    assert classify(ts) == want


def test_a_few_small_descents_are_jitter_not_shuffling():
    ts = [i * S for i in range(1000)]
    for i in (100, 400, 700):  # three neighbours swapped: 3 of 999 pairs descend, by 1 s
        ts[i], ts[i + 1] = ts[i + 1], ts[i]
    assert classify(ts) == "jittered"
    # one descent is allowed however short the file
    assert classify([0, 2 * S, 1 * S, 3 * S]) == "jittered"
    # a descent of exactly the limit is jitter; a µs more is not
    assert classify([0, MAX_STEP_US, 0, MAX_STEP_US + 1]) == "jittered"
    assert classify([0, MAX_STEP_US + 1, 0, MAX_STEP_US + 2]) == "shuffled"


def test_more_than_one_percent_of_descents_or_one_long_one_is_shuffled():
    ts = [i * S for i in range(1000)]
    for i in range(0, 1000, 80):  # 13 swaps: 13 of 999 pairs (> 1 %) descend, each by 1 s
        ts[i], ts[i + 1] = ts[i + 1], ts[i]
    assert classify(ts) == "shuffled"
    ts = [i * S for i in range(1000)]
    ts[500] = ts[499] - 61 * S  # one line, but more than a minute back
    assert classify(ts) == "shuffled"


def test_a_nearly_reversed_file_is_reversed():
    ts = [(1000 - i) * S for i in range(1000)]
    ts[10], ts[11] = ts[11], ts[10]  # one ascent of 1 s in a newest-first file
    assert classify(ts) == "reversed"


# ----------------------------------------------------------------- at ingest

def _mooncake(n: int, seed: int = 0) -> list[dict]:
    """A block trace of `n` requests 1.5 s apart (distinct times), with shared prefixes."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        root = rnd.randrange(5)
        ids = [root * 1000 + k for k in range(rnd.randrange(1, 6))] + [100_000 + i]
        out.append({"timestamp": 1500 * i, "input_length": 512 * len(ids), "output_length": 10, "hash_ids": ids})
    return out


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("orders")
    recs = _mooncake(400)
    shuffled = recs[:]
    random.Random(1).shuffle(shuffled)
    jittered = recs[:]
    for i in (50, 250):  # two swaps of neighbours 1.5 s apart: under the tolerance
        jittered[i], jittered[i + 1] = jittered[i + 1], jittered[i]
    ties = [dict(r, timestamp=1500 * (i // 4)) for i, r in enumerate(recs)]
    return {"sorted": _write(d / "a-sorted.jsonl", recs),
            "reversed": _write(d / "b-reversed.jsonl", recs[::-1]),
            "shuffled": _write(d / "c-shuffled.jsonl", shuffled),
            "jittered": _write(d / "d-jittered.jsonl", jittered),
            "ties": _write(d / "e-ties.jsonl", ties),
            "single": _write(d / "f-single.jsonl", recs[:1]),
            "empty": _write(d / "g-empty.jsonl", [])}


def test_each_file_is_classified_and_the_unordered_ones_are_named(files):
    con = db.connect(None)
    s = api.ingest(con, [str(p) for p in files.values()])
    got = dict(con.execute("SELECT path, time_order FROM sources").fetchall())
    assert got == {str(p): ("sorted" if k in ("ties", "single", "empty") else k) for k, p in files.items()}
    assert s.unordered_files == [(str(files["reversed"]), "reversed"), (str(files["shuffled"]), "shuffled")]
    text = summary_text(s)
    line = [x for x in text.splitlines() if x.startswith("time order:")]
    assert line == ["time order: 2 file(s) not in time order (1 reversed, 1 shuffled; sorted by time all the "
                    f"same): {files['reversed']} (reversed), {files['shuffled']} (shuffled)"]
    assert "jittered" not in text and "ties" not in text
    # the report's overview says the same, by file name
    ov = overview(con)
    assert ov["unordered_files"] == s.unordered_files
    note = unordered_note(ov["unordered_files"])
    assert note.startswith("2 input file(s) were not in time order (1 reversed, 1 shuffled): "
                           "`b-reversed.jsonl` (reversed), `c-shuffled.jsonl` (shuffled). ")
    # re-ingesting skips the files, and names none
    again = api.ingest(con, [str(p) for p in files.values()])
    assert again.skipped_files == len(files) and again.unordered_files == []
    con.close()


def test_a_file_in_order_says_nothing(files):
    con = db.connect(None)
    s = api.ingest(con, [str(files["sorted"]), str(files["jittered"])])
    assert s.unordered_files == [] and "time order" not in summary_text(s)
    assert overview(con)["unordered_files"] == [] and unordered_note([]) is None
    con.close()


def test_ingest_json_lists_the_unordered_files(files, tmp_path):
    res = CliRunner().invoke(main, ["ingest", str(files["sorted"]), str(files["reversed"]), str(files["jittered"]),
                                    "--db", str(tmp_path / "x.duckdb"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"files", "lines", "loaded", "context", "rejected", "skipped_files", "by_reason",
                        "unordered_files"}
    assert out["unordered_files"] == [{"path": str(files["reversed"]), "order": "reversed"}]
    # without --json, the summary on stderr names it
    res = CliRunner().invoke(main, ["ingest", str(files["shuffled"]), "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 0, res.output
    assert f"{files['shuffled']} (shuffled)" in res.stderr


def test_a_database_from_before_the_column_gains_it(tmp_path, files):
    path = tmp_path / "old.duckdb"
    con = db.connect(path)
    api.ingest(con, [str(files["reversed"])])
    con.execute("ALTER TABLE sources DROP COLUMN time_order")  # as written before the migration
    con.close()
    con = db.connect(path)
    assert con.execute("SELECT time_order FROM sources").fetchall() == [(None,)]  # unknown, not flagged
    assert overview(con)["unordered_files"] == []
    api.ingest(con, [str(files["shuffled"])])
    assert overview(con)["unordered_files"] == [(str(files["shuffled"]), "shuffled")]
    con.close()


# ----------------------------------------------------------------- sorted all the same

def _sweep(paths, grid: Grid, tokenizer=None):
    con = db.connect(None)
    api.ingest(con, [str(p) for p in paths])
    df = api.sweep(con, grid, tokenizer=tokenizer)
    by = api.sweep(con, grid, by_stream=True, tokenizer=tokenizer)
    con.close()
    return df, by


def test_a_block_trace_reversed_or_shuffled_sweeps_as_the_original(files):
    grid = Grid(ttls=(1.0, 60.0, float("inf")), blocks=(512,), min_prefixes=(0,), streams=("global",))
    want = _sweep([files["sorted"]], grid)
    for k in ("reversed", "shuffled", "jittered"):
        got = _sweep([files[k]], grid)
        assert got[0].equals(want[0]) and got[1].equals(want[1]), k
    assert want[0]["hit_tokens"].sum() > 0


def test_a_chat_log_reversed_or_shuffled_sweeps_as_the_original(tmp_path):
    lines = (SAMPLE / "agent-anthropic.jsonl").read_text().splitlines()[:30]
    orig = tmp_path / "orig.jsonl"
    orig.write_text("\n".join(lines) + "\n")
    shuffled = lines[:]
    random.Random(2).shuffle(shuffled)
    rev = tmp_path / "rev.jsonl"
    rev.write_text("\n".join(lines[::-1]) + "\n")
    shuf = tmp_path / "shuf.jsonl"
    shuf.write_text("\n".join(shuffled) + "\n")
    grid = Grid(ttls=(300.0, float("inf")), blocks=(16,), min_prefixes=(0,), streams=("tenant", "key"))
    tok = api.load_tokenizer()  # (one for the three databases)
    want = _sweep([orig], grid, tok)
    assert want[0]["hit_tokens"].sum() > 0
    for p in (rev, shuf):
        got = _sweep([p], grid, tok)
        assert got[0].equals(want[0]) and got[1].equals(want[1]), p.name
