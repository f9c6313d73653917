"""`--profile auto`: each request judged by its own model's profile, priced at its own model's prices."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from replay.cli.main import main
from replay.core.grid import Grid
from support.oracle import OracleRequest as R
from replay.providers.auto import model_choices, parses_json, price_entry
from replay.providers.catalog import model_family, profile_for_model
from replay.providers.model_savings import model_savings, savings_section
from replay.providers.profiles import profile_sweep

from support.logs import make_db
from support.paths import ROOT

SAMPLE = ROOT / "data" / "sample"
S = 1_000_000  # µs
WEEK1 = 1_767_225_600 * S  # 2026-01-01 00:00 UTC, ISO week 2026-W01
SONNET, MINI, OTHER = "claude-sonnet-4-5-20250929", "gpt-4.1-mini", "llama-3.1-70b-instruct"


# ----------------------------------------------------------------------------- the mapping

@pytest.mark.parametrize("model, family, profile", [
    ("claude-sonnet-4-5-20250929", "anthropic", "anthropic-sonnet-4-5"),
    ("claude-haiku-4-5-20251001", "anthropic", "anthropic-haiku-4-5"),
    ("anthropic/claude-3-5-haiku-20241022", "anthropic", "anthropic-haiku-3-5"),
    ("us.anthropic.claude-opus-4-1-20250805-v1:0", "anthropic", "anthropic-opus-4-1"),
    ("claude-sonnet-4.5", "anthropic", "anthropic-sonnet-4-5"),
    ("gpt-4.1-mini", "openai", "openai-gpt-4.1-mini"),
    ("gpt-4o-2024-08-06", "openai", "openai-gpt-4o"),
    ("gpt-5.1-codex", "openai", "openai-gpt-5.1-codex"),
    ("o4-mini", "openai", "openai-o4-mini"),
    ("deepseek-chat", "deepseek", "deepseek"),
])
def test_known_families_map_to_their_own_profile(model, family, profile):
    f = model_family(model)
    assert (f.family, f.profile, f.known) == (family, profile, True)
    assert profile_for_model(model) == profile


@pytest.mark.parametrize("model, family", [
    ("llama-3.1-70b-instruct", "unknown"), ("deepseek-ai/DeepSeek-V3", "unknown"), (None, "unknown"),
    ("claude-2.1", "anthropic"), ("gpt-3.5-turbo", "openai"), ("gpt-4-turbo", "openai")])
def test_unknown_models_are_said_so_and_judged_by_the_ideal_contract(model, family):
    f = model_family(model)
    assert (f.family, f.profile, f.known) == (family, "ideal", False)
    assert "ideal contract" in f.note
    assert profile_for_model(model) is None


def test_price_entries_are_exact_never_the_nearest_name():
    keys = ["gpt-4.1", "claude-sonnet-4-5", "gpt-4o-2024-05-13", "gpt-4o"]
    assert price_entry("gpt-4.1-mini", keys) is None  # not priced as gpt-4.1
    assert price_entry("gpt-4.1-2025-04-14", keys) == "gpt-4.1"
    assert price_entry("claude-sonnet-4-5-20250929", keys) == "claude-sonnet-4-5"
    assert price_entry("gpt-4o-2024-05-13", keys) == "gpt-4o-2024-05-13"  # a dated entry of its own wins
    assert price_entry("gpt-4o-2024-08-06", keys) == "gpt-4o"
    assert price_entry(None, keys) is None


# ----------------------------------------------------------------------------- a mixed log, by hand

PRICES = """
[models."claude-sonnet-4-5"]
input = 10.0
cache_read = 1.0
cache_write_5m = 12.5
cache_write_1h = 20.0
output = 50.0

[models."gpt-4.1-mini"]
input = 2.0
cache_read = 0.5
cache_write_5m = 2.0
cache_write_1h = 2.0
output = 8.0
"""


def _mixed():
    """One tenant, three models — three caches, though the prompts share their first tokens."""
    a = list(range(2000))
    b = list(range(1500))
    reqs = [R(WEEK1, a, tenant="t", model=SONNET),                   # 0: writes 2000 (auto breakpoint)
            R(WEEK1 + 60 * S, a, tenant="t", model=SONNET),          # 1: reads 2000
            R(WEEK1 + 1 * S, b, tenant="t", model=MINI),             # 2: nothing (not sonnet's cache)
            R(WEEK1 + 61 * S, b + [9] * 10, tenant="t", model=MINI),  # 3: L=1500 → 1024 + 3×128 = 1408
            R(WEEK1 + 2 * S, a[:100], tenant="t", model=OTHER),      # 4: nothing
            R(WEEK1 + 62 * S, a[:100], tenant="t", model=OTHER)]     # 5: 100 (ideal: token level, TTL ∞)
    usage = {0: (2100, 0, 2100), 1: (2100, 2100, 0), 2: (1600, 0, None), 3: (1610, 1536, None)}
    return make_db(reqs, usage=usage)


def _row(t, stream, model, week="2026-W01"):
    return t.filter((pl.col("stream") == stream) & pl.col("model").eq_missing(model)
                    & (pl.col("week") == week)).to_dicts()[0]


def test_a_mixed_log_is_priced_per_model(tmp_path):
    prices = tmp_path / "p.toml"
    prices.write_text(PRICES)
    con = _mixed()
    t = model_savings(con, prices_path=prices)
    son, mini, other = _row(t, "tenant:t", SONNET), _row(t, "org:t", MINI), _row(t, "tenant:t", OTHER)
    assert (son["profile"], mini["profile"], other["profile"]) == ("anthropic-sonnet-4-5", "openai-gpt-4.1-mini",
                                                                    "ideal")
    assert (son["hit_tokens"], son["write_5m"], mini["hit_tokens"], other["hit_tokens"]) == (2000, 2000, 1408, 100)
    # Sonnet at 10 / 1 / 12.5: full 4000 × 10; spend 2000 written × 12.5 + 2000 read × 1
    assert son["full_price_cost"] == pytest.approx(40_000 / 1e6)
    assert son["projected_cost"] == pytest.approx((2000 * 12.5 + 2000 * 1.0) / 1e6)
    assert son["projected_savings"] == pytest.approx((2000 * 9.0 - 2000 * 2.5) / 1e6)
    # gpt-4.1-mini at 2 / 0.5 (no write premium): full 3010 × 2; spend (3010 − 1408) × 2 + 1408 × 0.5
    assert mini["full_price_cost"] == pytest.approx(6020 / 1e6)
    assert mini["projected_cost"] == pytest.approx(((3010 - 1408) * 2.0 + 1408 * 0.5) / 1e6)
    assert mini["projected_savings"] == pytest.approx(1408 * 1.5 / 1e6)
    # actual, from the usage fields at each model's own prices
    assert son["actual_cost"] == pytest.approx((2100 * 12.5 + 2100 * 1.0) / 1e6)
    assert son["actual_savings"] == pytest.approx((4200 * 10.0 - 2100 * 12.5 - 2100 * 1.0) / 1e6)
    assert mini["actual_cost"] == pytest.approx((1600 * 2.0 + (1610 - 1536) * 2.0 + 1536 * 0.5) / 1e6)
    assert mini["actual_savings"] == pytest.approx(1536 * 1.5 / 1e6)
    # the unknown model: a ceiling, no dollars
    assert other["hit_ratio"] == pytest.approx(0.5) and other["price_model"] is None
    assert other["full_price_cost"] is None and other["projected_savings"] is None
    # totals add the models' dollars
    tot = _row(t, "ALL", "ALL", "ALL")
    assert (tot["requests"], tot["priced_requests"]) == (6, 4)
    assert tot["full_price_cost"] == pytest.approx((40_000 + 6020) / 1e6)
    assert tot["projected_savings"] == pytest.approx((13_000 + 1408 * 1.5) / 1e6)
    assert tot["actual_savings"] == pytest.approx((13_650 + 1536 * 1.5) / 1e6)
    # realised at or under the ceiling: left on the table; above it: a reason, never a negative figure
    assert son["left_on_table"] == pytest.approx(0.0) and son["exception"] is None
    assert mini["realized_hit_ratio"] == pytest.approx(1536 / 3210)
    assert mini["hit_ratio"] == pytest.approx(1408 / 3010) and 1408 / 3010 < 1536 / 3210
    assert mini["left_on_table"] is None and mini["exception"] == "minimum"
    assert "128-token increments" in mini["reason"]
    assert (t["left_on_table"].drop_nulls() >= 0).all()


def test_realised_beyond_even_the_loosest_ceiling_is_a_definition_difference():
    con = make_db([R(WEEK1, list(range(100)), model=OTHER)], usage={0: (120, 110, None)})
    r = _row(model_savings(con), "tenant:default", OTHER)
    assert r["hit_ratio"] == 0 and r["left_on_table"] is None and r["exception"] == "definition"
    assert "120 prompt tokens where the replay renders 100 (+20%)" in r["reason"]


def test_a_subset_keeps_the_hits_of_the_whole_log(tmp_path):
    prices = tmp_path / "p.toml"
    prices.write_text(PRICES)
    con = _mixed()
    only = model_savings(con, prices_path=prices, request_ids=[1], by_week=False, total=False)
    assert only.to_dicts()[0]["hit_tokens"] == 2000  # request 0 wrote the prefix, though outside the set
    early = model_savings(con, prices_path=prices, until_us=WEEK1 + 30 * S, total=False)
    assert early["requests"].sum() == 3 and early["hit_tokens"].sum() == 0
    late = model_savings(con, prices_path=prices, since_us=WEEK1 + 30 * S, total=False)
    assert dict(zip(late["model"], late["hit_tokens"])) == {SONNET: 2000, MINI: 1408, OTHER: 100}


def test_profile_sweep_auto_gives_rows_per_profile_used():
    con = _mixed()
    df = profile_sweep(con, ["auto"], Grid(ttls=(300.0,), blocks=(16,), min_prefixes=(0,), streams=("tenant",)),
                       store=False)
    rows = {r["profile"]: r for r in df.to_dicts()}
    assert set(rows) == {"auto/anthropic-sonnet-4-5", "auto/openai-gpt-4.1-mini", "auto/ideal"}
    assert rows["auto/anthropic-sonnet-4-5"]["hit_tokens"] == 2000
    assert rows["auto/openai-gpt-4.1-mini"]["hit_tokens"] == 1408
    assert rows["auto/openai-gpt-4.1-mini"]["realized_hit_tokens"] == 1536  # its own requests' usage only
    assert rows["auto/ideal"]["block"] == 16 and rows["auto/ideal"]["hit_tokens"] == 96
    assert rows["auto/ideal"]["realized_requests"] == 0


def test_auto_reads_json_as_a_hosted_api_only_when_every_model_is_one():
    con = _mixed()
    assert not parses_json(con, "auto")  # llama is no hosted API
    con.execute(f"UPDATE requests SET model = '{MINI}' WHERE model = '{OTHER}'")
    assert parses_json(con, "auto")
    assert {c.profile for c in model_choices(con).values()} == {"anthropic-sonnet-4-5", "openai-gpt-4.1-mini"}


# ----------------------------------------------------------------------------- the shipped sample

@pytest.fixture(scope="module")
def sample_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("auto") / "s.duckdb"
    for args in (["ingest", str(SAMPLE)], ["tokenize"]):
        res = CliRunner().invoke(main, args + ["--db", str(db)])
        assert res.exit_code == 0, res.output
    return db


def test_on_the_sample_every_ceiling_covers_realised_or_the_reason_is_named(sample_db, tmp_path):
    from replay.store import db

    con = db.connect(str(sample_db))
    md = savings_section(con, tmp_path)
    con.close()
    t = pl.read_csv(tmp_path / "savings.csv", infer_schema_length=None)
    cache_rows = t.filter(pl.col("stream") != "ALL")
    assert len(cache_rows) >= 10
    for r in t.to_dicts():
        if r["realized_hit_ratio"] is None:
            continue
        if r["realized_hit_ratio"] > r["hit_ratio"] + 1e-12:
            assert r["left_on_table"] is None and r["exception"] and r["reason"], r
        else:
            assert r["left_on_table"] >= 0 and r["exception"] is None, r
    # the Anthropic streams are judged by Anthropic's rules, and priced at Anthropic's prices
    claude = cache_rows.filter(pl.col("model").str.starts_with("claude"))
    assert set(claude["profile"]) == {"anthropic-sonnet-4-5", "anthropic-haiku-4-5"}
    assert set(claude["price_model"]) == {"claude-sonnet-4-5", "claude-haiku-4-5"}
    assert cache_rows["price_model"].null_count() == 0  # every sample model has its own price entry
    table = md.split("### Realised against ceiling")[1].split("### Hit ratio")[0]
    assert not re.search(r"\|\s*[-−]\d+(\.\d+)? pts", table)  # no negative "left on the table"
    named = re.findall(r"none \((\w+), note (\d+)\)", table)
    assert named and all(f"\n{n}. " in table for _, n in named)  # every exception has its reason line
    assert "judged by its own profile" in md


def test_sweep_accepts_profile_auto(sample_db, tmp_path):
    import shutil

    db = tmp_path / "c.duckdb"
    shutil.copy(sample_db, db)
    res = CliRunner().invoke(main, ["sweep", "--db", str(db), "--profile", "auto", "--stream", "tenant",
                                    "--ttl", "5m", "--block", "1", "--min-prefix", "0", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["profile"] for r in rows} == {"auto/anthropic-sonnet-4-5", "auto/anthropic-haiku-4-5",
                                            "auto/openai-gpt-5.1-codex", "auto/openai-gpt-5.1-codex-mini",
                                            "auto/openai-gpt-4.1-mini"}
    assert sum(r["requests"] for r in rows) == 268
