"""Economics against hand-computed figures."""

from __future__ import annotations


import pytest

from replay.providers import economics as ec
from support.oracle import OracleRequest as R

from support.logs import make_db

SONNET = ec.Price("sonnet", input=3.0, cache_read=0.3, cache_write_5m=3.75, cache_write_1h=6.0, output=15.0)
FLAT = ec.Price("flat", input=1.0, cache_read=0.1, cache_write_5m=1.0, cache_write_1h=1.0, output=2.0)
S = 1_000_000  # µs
WEEK1 = 1_767_225_600 * S  # 2026-01-01 00:00 UTC, ISO week 2026-W01


def _total(t):
    return t.filter((t["stream"] == "ALL") & (t["week"] == "ALL")).to_dicts()[0]


def test_prompt_under_the_minimum_saves_nothing():
    p = list(range(500))  # under Sonnet 4.5's 1024-token minimum
    con = make_db([R(WEEK1, p), R(WEEK1 + 10 * S, p), R(WEEK1 + 20 * S, p)])
    t = _total(ec.savings_table(con, "anthropic-sonnet-4-5", SONNET))
    assert (t["hit_tokens"], t["write_5m"], t["write_1h"]) == (0, 0, 0)
    assert t["projected_savings"] == 0 and t["projected_cost"] == pytest.approx(1500 * 3.0 / 1e6)


def test_a_1h_write_never_read_costs_more_than_it_saves():
    p = list(range(2000))
    con = make_db([R(WEEK1, p)])
    t = _total(ec.savings_table(con, "anthropic-sonnet-4-5", SONNET, ttl=3600))
    assert t["write_1h"] == 2000 and t["hit_tokens"] == 0
    assert t["projected_savings"] == pytest.approx(-2000 * (6.0 - 3.0) / 1e6)
    # read once 30 minutes later: 2000 × (3 − 0.3) − 2000 × (6 − 3) = −600 → still a loss
    con = make_db([R(WEEK1, p), R(WEEK1 + 1800 * S, p)])
    t = _total(ec.savings_table(con, "anthropic-sonnet-4-5", SONNET, ttl=3600))
    assert (t["hit_tokens"], t["write_1h"]) == (2000, 2000)
    assert t["projected_savings"] == pytest.approx(-600 / 1e6)
    # the 5-minute TTL, read once 1 minute later: 2000 × 2.7 − 2000 × 0.75 = 3900
    con = make_db([R(WEEK1, p), R(WEEK1 + 60 * S, p)])
    t = _total(ec.savings_table(con, "anthropic-sonnet-4-5", SONNET))
    assert (t["hit_tokens"], t["write_5m"]) == (2000, 2000)
    assert t["projected_savings"] == pytest.approx(3900 / 1e6)


def test_no_write_premium_provider_and_weeks_and_actual_spend():
    a = list(range(300))
    reqs = [R(WEEK1, a), R(WEEK1 + 5 * S, a + [1, 2]), R(WEEK1 + 8 * 86400 * S, a)]
    usage = {0: (320, 0, 0), 1: (322, 256, 0)}
    con = make_db(reqs, usage=usage)
    t = ec.savings_table(con, "deepseek", FLAT, stream="tenant")
    w = {(r["stream"], r["week"]): r for r in t.to_dicts()}
    assert set(w) == {("tenant:default", "2026-W01"), ("tenant:default", "2026-W02"), ("ALL", "2026-W01"),
                      ("ALL", "2026-W02"), ("ALL", "ALL")}
    w1 = w[("tenant:default", "2026-W01")]
    assert w1["hit_tokens"] == 256  # 300 → 64-token units
    assert w1["projected_savings"] == pytest.approx(256 * 0.9 / 1e6)
    assert w1["actual_cost"] == pytest.approx(((642 - 256) * 1.0 + 256 * 0.1) / 1e6)
    assert w1["actual_savings"] == pytest.approx(256 * 0.9 / 1e6)
    assert w1["realized_hit_ratio"] == pytest.approx(256 / 642)
    w2 = w[("tenant:default", "2026-W02")]
    assert w2["hit_tokens"] == 256 and w2["actual_cost"] is None  # no usage in week 2
    assert ec.savings_per_request(100, 10, 0, SONNET) == pytest.approx((100 * 2.7 - 10 * 0.75) / 1e6)


def test_session_length_buckets():
    a = list(range(100))
    reqs = [R(i, a + [i], session="long") for i in range(21)] + \
           [R(100 + i, a + [i], session="mid") for i in range(2)] + [R(200, a, session=None)]
    con = make_db(reqs)
    t = {r["session_length"]: r for r in ec.session_length_table(con, "ideal", "session").to_dicts()}
    assert (t["1 turn"]["requests"], t["2-19 turns"]["requests"], t["20+ turns"]["requests"]) == (1, 2, 21)
    assert t["20+ turns"]["hit_tokens"] == 20 * 100
    assert t["2-19 turns"]["hit_tokens"] == 100


def test_prices_file_has_dated_defaults_and_can_be_overridden(tmp_path):
    prices = ec.load_prices()
    for m in ("claude-sonnet-4-5", "claude-opus-4-5", "claude-haiku-4-5", "gpt-5", "gpt-4.1", "deepseek-chat"):
        p = prices[m]
        assert p.as_of and p.source and p.input > p.cache_read
    assert prices["claude-sonnet-4-5"].cache_write_5m == pytest.approx(1.25 * prices["claude-sonnet-4-5"].input)
    assert prices["claude-sonnet-4-5"].cache_write_1h == pytest.approx(2 * prices["claude-sonnet-4-5"].input)
    f = tmp_path / "p.toml"
    f.write_text('[models."deepseek-chat"]\ninput = 1.0\n\n[models."mine"]\ninput = 2\ncache_read = 1\n')
    over = ec.load_prices(f)
    assert over["deepseek-chat"].input == 1.0 and over["deepseek-chat"].cache_read == prices["deepseek-chat"].cache_read
    assert over["mine"].cache_write_5m == 2.0
    assert ec.get_price("claude-sonnet-4-5-20250929").model == "claude-sonnet-4-5"


def test_fidelity_and_the_section(tmp_path):
    a = list(range(300))
    con = make_db([R(WEEK1, a), R(WEEK1 + 5 * S, a + [1])], usage={0: (310, 0, 0), 1: (311, 256, 0)})
    con.execute("UPDATE requests SET model = 'deepseek-chat'")
    f = ec.fidelity(con)
    assert f["diff"].to_list() == [-10, -10]
    md = ec.savings_section(con, tmp_path)
    assert "Realised against ceiling" in md and "Rendering fidelity" in md and "2026-W01" in md
    assert (tmp_path / "savings.csv").exists()
