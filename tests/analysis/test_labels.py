"""The labelling protocol (``replay.analysis.labels``): κ, Wilson intervals,
band precision, per-intent thresholds and the adjusted share against hand
computations; and the commands end to end on a log with planted paraphrases
and hard negatives, labelled synthetically."""

import csv
import json

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from replay.analysis import labels as L
from replay.cli.main import main


def _labels(rows):
    """rows: (band, similarity, intent, l1, l2, l3)."""
    return pl.DataFrame([{"pair_id": str(i), "mode": "tenant", "ttl_s": 3600.0, "band": b, "similarity": s,
                          "intent": it, "label_1": a, "label_2": c, "label_3": d}
                         for i, (b, s, it, a, c, d) in enumerate(rows)],
                        schema={"pair_id": pl.Utf8, "mode": pl.Utf8, "ttl_s": pl.Float64, "band": pl.Utf8,
                                "similarity": pl.Float64, "intent": pl.Utf8, "label_1": pl.Int64,
                                "label_2": pl.Int64, "label_3": pl.Int64})


def test_fleiss_kappa_wilson_and_the_majority_by_hand():
    lab = _labels([("0.90-0.95", 0.91, "faq", 1, 1, 1), ("0.90-0.95", 0.92, "faq", 1, 1, 0),
                   ("0.90-0.95", 0.93, "faq", 0, 0, 0), ("0.90-0.95", 0.94, "faq", 1, 0, 0),
                   ("0.95-0.99", 0.96, "faq", 1, None, None), ("0.95-0.99", 0.97, "faq", 1, 0, None)])
    # four complete items: P_i = 1, 1/3, 1, 1/3 -> P = 2/3; p_yes = p_no = 1/2 -> P_e = 1/2; kappa = 1/3
    assert L.fleiss_kappa(lab) == pytest.approx(1 / 3)
    lo, hi = L.wilson(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    bands = {r["band"]: r for r in L.band_precision(lab).iter_rows(named=True)}
    assert (bands["0.90-0.95"]["reusable"], bands["0.90-0.95"]["labelled"]) == (2, 4)
    # one yes of one answer is a majority; one yes of two is a tie, not reusable
    assert (bands["0.95-0.99"]["reusable"], bands["0.95-0.99"]["labelled"]) == (1, 2)


def test_intent_thresholds_by_hand():
    lab = _labels([("0.95-0.99", 0.99, "faq", 1, 1, 1), ("0.95-0.99", 0.97, "faq", 1, 1, 1),
                   ("0.95-0.99", 0.95, "faq", 0, 0, 0), ("0.90-0.95", 0.93, "faq", 1, 1, 1),
                   ("0.90-0.95", 0.92, "support", 0, 0, 0)])
    got = {r["intent"]: r["threshold"] for r in L.intent_thresholds(lab, 0.99)}
    assert got == {"faq": 0.97, "support": None}  # faq: 1.0 at >= 0.97, 2/3 at >= 0.95, 3/4 at >= 0.93
    got = {r["intent"]: r["threshold"] for r in L.intent_thresholds(lab, 0.7)}
    assert got == {"faq": 0.93, "support": None}


def test_the_adjusted_share_by_hand():
    sims = np.array([0.82, 0.86, 0.91, 0.96, 0.995, 0.5, -np.inf])
    lab = _labels([("0.80-0.85", 0.81, "", 1, 1, 1), ("0.80-0.85", 0.84, "", 0, 0, 0),
                   ("0.85-0.90", 0.87, "", 1, 1, 0), ("0.85-0.90", 0.88, "", 0, 0, 1),
                   ("0.90-0.95", 0.92, "", 1, 1, 1), ("0.95-0.99", 0.97, "", 1, 1, 1)])
    got = {r["threshold"]: r for r in L.adjusted(sims, 7, (0.80, 0.90, 0.99), lab)}
    assert got[0.80]["near_share"] == pytest.approx(5 / 7)
    assert got[0.80]["adjusted_share"] is None  # the 0.99-1.00 band has no labels
    lab = pl.concat([lab, _labels([("0.99-1.00", 0.995, "", 1, 1, 1)])]).with_columns(
        pl.Series("pair_id", [str(i) for i in range(7)]))
    got = {r["threshold"]: r for r in L.adjusted(sims, 7, (0.80, 0.90, 0.99), lab)}
    assert got[0.80]["adjusted_share"] == pytest.approx((0.5 + 0.5 + 1 + 1 + 1) / 7)
    assert got[0.80]["adjusted_share"] < got[0.80]["near_share"]
    assert got[0.90]["adjusted_share"] == pytest.approx(3 / 7)
    assert got[0.80]["labelled_precision"] == pytest.approx(5 / 7)
    assert L.band_of(0.85) == "0.85-0.90" and L.band_of(1.0) == "0.99-1.00" and L.band_of(0.79) is None


PARAPHRASES = [("How do I reset my password?", "How can I reset my password?"),
               ("What are your opening hours?", "When are you open?"),
               ("How do I cancel my subscription?", "How can I cancel my subscription?")]
HARD_NEGATIVES = [("How do I reset my password?", "How do I not reset my password?"),
                  ("Can I pay by credit card?", "Can I pay by debit card?")]


def _log(path):
    with open(path, "w") as f:
        t = 1_794_813_649
        for i, (a, b) in enumerate(PARAPHRASES + HARD_NEGATIVES):
            for j, q in enumerate((a, b)):
                f.write(json.dumps({"timestamp": t + 100 * i + j, "tenant": "t", "session": f"s{i}", "request": {
                    "model": "m", "messages": [{"role": "user", "content": q}]}}) + "\n")


def test_export_label_import_and_the_rates(tmp_path):
    pytest.importorskip("wordllama")
    log, db, out = tmp_path / "faq.jsonl", str(tmp_path / "l.duckdb"), tmp_path / "pairs"
    _log(log)
    run = CliRunner().invoke
    res = run(main, ["duplicates", "label-export", str(log), "--db", db, "--stream", "session", "--ttl", "1h",
                     "--out", str(out), "--show-text"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    # three pairs reach 0.80 in this model: two paraphrases and the negation (0.97); "opening hours" /
    # "when are you open" (0.60) and debit/credit (0.71) do not
    assert len(rows) == 3 and all(r["band"] == "0.95-0.99" for r in rows)
    negatives = {b for _, b in HARD_NEGATIVES}
    for r in rows:  # synthetic labels: a hard negative is never reusable
        yes = "0" if r["text"] in negatives else "1"
        r.update(label_1=yes, label_2=yes, label_3=yes if r["text"] not in negatives else "1",
                 intent="faq")
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for _ in range(2):  # importing again replaces, never doubles
        res = run(main, ["duplicates", "label-import", str(out.with_suffix(".csv")), "--db", db,
                         "--threshold", "0.8", "--precision", "0.99", "--json"])
        assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["labelled"] == len(rows) and got["pairs"] == len(rows)
    near = got["near"][0]
    # by hand: 3 of 10 requests near; the band's precision 2/3 -> adjusted 2/10; kappa over
    # (1,1,1), (1,1,1), (0,0,1): P = 7/9, P_e = 53/81 -> 10/28
    assert near["near_share"] == pytest.approx(0.3) and near["adjusted_share"] == pytest.approx(0.2)
    assert near["labelled_precision"] == pytest.approx(2 / 3)
    assert got["fleiss_kappa"] == pytest.approx(10 / 28)
    (faq,) = got["intent_thresholds"]  # the lower paraphrase's similarity: above it all are reusable
    assert faq["intent"] == "faq" and faq["threshold"] == pytest.approx(0.9838, abs=1e-3) and faq["precision"] == 1
    res = run(main, ["duplicates", "--db", db, "--stream", "session", "--ttl", "1h", "--threshold", "0.8",
                     "--no-normalized", "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["near"][0]
    assert row["labelled_precision"] == pytest.approx(near["labelled_precision"])
    assert row["adjusted_share"] == pytest.approx(near["adjusted_share"])
    # without --show-text the texts stay out of the files and the output
    res = run(main, ["duplicates", "audit", "--db", db, "--stream", "session", "--ttl", "1h", "--threshold", "0.8",
                     "--rate", "0.5", "--out", str(tmp_path / "audit")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "audit.jsonl").read_text() + res.output
    assert "password" not in text and len((tmp_path / "audit.csv").read_text().splitlines()) >= 2


def test_the_report_shows_the_labelled_share_once_labels_exist(tmp_path):
    pytest.importorskip("wordllama")
    from replay import api
    from replay.analysis.duplicates import duplicates_section

    _log(tmp_path / "faq.jsonl")
    con = api.open_db(tmp_path / "r.duckdb")
    api.ingest(con, [str(tmp_path / "faq.jsonl")])
    text = duplicates_section(con, ttls=(3600.0,), streams=("session",))
    assert "No labels yet" in text and "labelled:" not in text
    pairs = api.candidate_pairs(con, 3600.0, "session")
    sample = api.stratified_sample(pairs, 10).with_columns(
        *[pl.lit("1").alias(c) for c in L.LABELS])  # every pair judged reusable
    api.write_export(sample, tmp_path / "p")
    api.store_labels(con, api.read_labels([tmp_path / "p.jsonl"]))
    text = duplicates_section(con, ttls=(3600.0,), streams=("session",))
    assert "| session | 1h | 30.0 % (labelled: 30.0 %) | 30.0 % (labelled: 30.0 %) |" in text
