"""Week over week (``replay trend``): per-week ceilings against the brute force, and
a generated three-week log where one tenant's system prompt gains a per-request
timestamp in week 3 — the trend flags exactly that stream in that week and names
``timestamp``."""

from __future__ import annotations

import datetime as dt
import json
import math
import random

import polars as pl
import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.trend import request_ceilings, week_keys, week_label, week_labels, weekly_ceilings
from replay.cli.main import main
from support import oracle
from replay.times import ttl_us
from replay.providers.economics import get_price, savings_table
from replay.providers.model_savings import model_savings, savings_section
from replay.store import db

from support.gen import US, random_requests
from support.walks import store as _store

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
MONDAY = dt.datetime(2026, 11, 9, tzinfo=UTC)  # ISO 2026-W46 starts here
MONDAY_US = (MONDAY - EPOCH) // dt.timedelta(microseconds=1)


def _iso_week(ts_us: int) -> str:
    """The ISO week of a time in µs, by the standard library (the reference)."""
    year, week, _ = (EPOCH + dt.timedelta(microseconds=ts_us)).isocalendar()
    return f"{year}-W{week:02d}"


# ------------------------------------------------------------------ weeks

def test_week_labels_are_iso_weeks_of_utc_times():
    day = 86400 * US
    times = [MONDAY_US - 1, MONDAY_US, MONDAY_US + 1, MONDAY_US + 7 * day - 1, MONDAY_US + 7 * day,
             (dt.datetime(2021, 1, 3, 23, 59, 59, tzinfo=UTC) - EPOCH) // dt.timedelta(microseconds=1),  # 2020-W53
             (dt.datetime(2024, 12, 30, tzinfo=UTC) - EPOCH) // dt.timedelta(microseconds=1)]  # 2025-W01
    labels, weeks = week_labels(times)
    assert labels == [_iso_week(t) for t in times]
    assert labels[:5] == ["2026-W45", "2026-W46", "2026-W46", "2026-W46", "2026-W47"]
    assert labels[5:] == ["2020-W53", "2025-W01"]
    assert weeks == ["2020-W53", "2025-W01", "2026-W45", "2026-W46", "2026-W47"]  # time order
    # relative times (below 10^8 s, the savings table's rule): whole weeks from 0, in numeric order
    labels, weeks = week_labels([0, 7 * day - 1, 7 * day, 11 * 7 * day])
    assert labels == ["w0", "w0", "w1", "w11"] and weeks == ["w0", "w1", "w11"]
    assert week_label(week_keys([MONDAY_US])[0]) == "2026-W46"


# ------------------------------------------------------------------ the oracle

def _oracle_weekly(reqs, L, mode, block, min_prefix) -> dict:
    """(stream, model, week) → (requests, prompt tokens, hit tokens) from ``L``, the
    brute force's L_τ over the whole log, each request counted in its own ISO week."""
    out: dict = {}
    for r, l in zip(reqs, L):
        s, m = oracle.cache_of(r, mode)
        k = (s, m, _iso_week(r.ts))
        n, p, h = out.get(k, (0, 0, 0))
        out[k] = (n + 1, p + len(r.tokens), h + oracle.block_hit(l, block, min_prefix))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_weekly_ceilings_equal_the_oracle_restricted_to_each_week(seed):
    """Gaps of seconds and of days, so that the log spans several weeks and caches
    stay warm across a boundary; one request exactly at Monday 00:00 UTC, one a µs before."""
    reqs = random_requests(seed, n=30 + 4 * seed, gaps=(0, 0, 1, 2, 5, 30, 86400, 2 * 86400),
                           jitter_us=(0, 0, -1, 1), models=(None, "m1") if seed % 2 else (None,))
    order = oracle.time_order(reqs)
    pin = reqs[order[len(order) // 2]].ts  # that request lands exactly on the boundary
    for r in reqs:
        r.ts += MONDAY_US - pin
    reqs[order[0]].ts = MONDAY_US - 1  # and one just before it
    assert any(r.ts == MONDAY_US for r in reqs)
    con = db.connect(None)
    _store(con, reqs)
    weeks_seen = set()
    for mode in ("tenant", "key", "session", "global"):
        for ttl in (0, 30, 86400, math.inf):
            L = oracle.ceiling(reqs, mode, ttl_us(ttl))
            for block, mn in ((1, 0), (3, 4), (16, 0)):
                got = weekly_ceilings(con, mode, ttl, block, mn)
                want = _oracle_weekly(reqs, L, mode, block, mn)
                have = {(r["stream"], r["model"], r["week"]): (r["requests"], r["prompt_tokens"], r["hit_tokens"])
                        for r in got.to_dicts()}
                assert have == want, (mode, ttl, block, mn)
                for r in got.to_dicts():
                    assert r["ceiling"] == (r["hit_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0)
                weeks_seen |= {k[2] for k in want}
    assert len(weeks_seen) >= 2
    # the boundary request opens the new week
    per, _ = request_ceilings(con, "global", math.inf, 1, 0)
    ts = dict(con.execute("SELECT request_id, ts_us FROM walks WHERE mode = 'global'").fetchall())
    assert {ts[r["request_id"]]: r["week"] for r in per.to_dicts()}[MONDAY_US] == "2026-W46"


# ------------------------------------------------------------------ three weeks, a timestamp in week 3

WORDS = ("the cache prefix token request stream tenant session model agent tool result file "
         "function value error build test deploy query table index branch commit review plan "
         "memory budget latency window header schema order json key user system message turn "
         "history summary edit patch config option server client proxy route block batch").split()
TENANTS = ("acme", "globex", "initech", "umbrella")
STAMPED = "initech"  # gains a per-request timestamp in its system prompt in week 3
WEEK_STARTS = [MONDAY - dt.timedelta(days=7), MONDAY, MONDAY + dt.timedelta(days=7)]  # W45, W46, W47


def _text(r: random.Random, n: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(n)).capitalize() + "."


def three_week_log(path, seed: int = 0, sessions: int = 3, turns: int = 5) -> dict:
    """Anthropic request logs of three ISO weeks, four tenants (one application each:
    their own tools and system prompt), with provider usage. Returns the logged usage
    per (tenant, week): (prompt tokens, cached tokens)."""
    r = random.Random(seed)
    apps = {}
    for tenant in TENANTS:
        tools = [{"name": name, "description": _text(r, 50),
                  "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
                 for name in ("read_file", "write_file", "run_shell")]
        apps[tenant] = (tools, "\n\n".join(_text(r, 60) for _ in range(4)))
    lines, usage = [], {}
    for wi, start in enumerate(WEEK_STARTS):
        for ti, tenant in enumerate(TENANTS):
            tools, system = apps[tenant]
            # umbrella's week-2 traffic starts exactly at Monday 00:00 UTC
            t = start.timestamp() + (0 if (tenant == "umbrella" and wi == 1) else 86400 * (1 + ti) + 36000)
            for s in range(sessions):
                hist = [{"role": "user", "content": _text(r, 40)}]
                for turn in range(turns):
                    text = system
                    if tenant == STAMPED and wi == 2:
                        stamp = dt.datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                        text = f"Current time: {stamp}\n" + system
                    body = {"model": "claude-sonnet-4-5", "system": [{"type": "text", "text": text}],
                            "tools": tools, "messages": list(hist), "metadata": {"user_id": f"{tenant}-u{s}"}}
                    prompt = len(json.dumps(body)) // 4
                    cached = 0 if turn == 0 else prompt // 2
                    lines.append({"timestamp": t, "tenant": tenant, "session": f"{tenant}-w{wi}-s{s}",
                                  "request": body,
                                  "response": {"usage": {"input_tokens": prompt - cached,
                                                         "cache_read_input_tokens": cached,
                                                         "cache_creation_input_tokens": 0, "output_tokens": 30}}})
                    p, c = usage.get((tenant, wi), (0, 0))
                    usage[(tenant, wi)] = (p + prompt, c + cached)
                    hist = hist + [{"role": "assistant", "content": _text(r, 30)},
                                   {"role": "user", "content": _text(r, 15)}]
                    t += r.uniform(20, 50)
                t += r.uniform(30, 60)
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return usage


@pytest.fixture(scope="module")
def weeks3(tmp_path_factory):
    d = tmp_path_factory.mktemp("trend")
    usage = three_week_log(d / "weeks.jsonl")
    path = d / "weeks.duckdb"
    con = db.connect(path)
    api.ingest(con, [d / "weeks.jsonl"])
    res = api.trend(con)
    con.close()
    return path, res, usage


def test_the_stream_that_gained_a_timestamp_is_flagged_in_week_3_with_its_cause(weeks3):
    _, res, _ = weeks3
    assert res["weeks"] == ["2026-W45", "2026-W46", "2026-W47"] and not res["single_week"]
    assert res["config"] == {"stream": "tenant", "ttl_s": 300.0, "block": 16, "min_prefix": 0,
                             "threshold_points": 5.0}
    assert [(g["stream"], g["week"], g["previous_week"]) for g in res["regressions"]] == [
        (f"tenant:{STAMPED}", "2026-W47", "2026-W46")]
    reg = res["regressions"][0]
    assert reg["cause"] == "timestamp" and reg["drop_points"] > 5
    assert reg["drop_points"] == pytest.approx(100 * (reg["previous_ceiling"] - reg["ceiling"]))
    assert reg["cause_growth_points"] > 0 and next(iter(reg["causes"])) == "timestamp"
    # every stream in every week; no other drop beyond the threshold
    rows = res["rows"]
    assert {(r["stream"], r["week"]) for r in rows} == {(f"tenant:{t}", w) for t in TENANTS for w in res["weeks"]}
    for r in rows:
        if r["change_points"] is not None and (r["stream"], r["week"]) != (f"tenant:{STAMPED}", "2026-W47"):
            assert r["change_points"] > -5, r


def test_rows_carry_realised_ratio_and_savings_as_the_savings_table_does(weeks3):
    """The ceiling and realised ratio are the savings table's at the trend's configuration. The
    savings are so only under ``price_model`` (one price, judged at the trend's configuration):
    by default they are per model, judged by the model's own profile (the next tests)."""
    path, res, usage = weeks3
    weeks = res["weeks"]
    for r in res["rows"]:
        p, c = usage[(r["stream"].split(":", 1)[1], weeks.index(r["week"]))]
        assert (r["usage_prompt_tokens"], r["usage_cached_tokens"]) == (p, c)
        assert r["realised"] == pytest.approx(c / p)
    assert (res["pricing"], res["price_model"], res["unpriced_models"]) == ("per model", None, [])
    assert {(r["profile"], r["price_model"]) for r in res["rows"]} == {("anthropic-sonnet-4-5", "claude-sonnet-4-5")}
    con = db.connect(path)
    try:
        one = api.trend(con, price_model="claude-sonnet-4-5")
        assert (one["pricing"], one["price_model"]) == ("one price", "claude-sonnet-4-5")
        assert [r["ceiling"] for r in one["rows"]] == [r["ceiling"] for r in res["rows"]]
        # one model per tenant here: the savings table's rows (per stream and week) are ours
        tbl = savings_table(con, "ideal", get_price("claude-sonnet-4-5"), stream="tenant", ttl=300.0, block=16,
                            min_prefix=0, total=False)
        want = {(t["stream"], t["week"]): t for t in tbl.to_dicts()}
        for r in one["rows"]:
            t = want[(r["stream"], r["week"])]
            assert (r["requests"], r["prompt_tokens"], r["hit_tokens"]) == (t["requests"], t["prompt_tokens"],
                                                                             t["hit_tokens"])
            assert r["realised"] == pytest.approx(t["realized_hit_ratio"])
            assert r["projected_savings"] == pytest.approx(t["projected_savings"])
            assert r["actual_savings"] == pytest.approx(t["actual_savings"])
            assert (r["profile"], r["price_model"]) == (None, "claude-sonnet-4-5")
        # the default: each (stream, model, week) is model_savings' row
        ms = {(t["stream"], t["model"], t["week"]): t for t in model_savings(con, total=False).to_dicts()}
        for r in res["rows"]:
            t = ms[(r["stream"], r["model"], r["week"])]
            assert r["projected_savings"] == pytest.approx(t["projected_savings"])
            assert r["actual_savings"] == pytest.approx(t["actual_savings"])
        # the boundary request: umbrella's first of week 2, at Monday 00:00 UTC, counts in week 2
        rid = con.execute("SELECT request_id FROM requests WHERE ts_us = ?", [MONDAY_US]).fetchone()[0]
        per, _ = request_ceilings(con, "tenant", 300.0, 16, 0)
        assert per.filter(pl.col("request_id") == rid)["week"].to_list() == ["2026-W46"]
        # the diagnosis's hit part is the ceiling: the causes explain the same figures
        parts = api.miss_parts(con, ttl=300, block=16, min_prefix=0, stream="tenant")
        joined = parts.join(per, on="request_id")
        assert (joined["hit"] == joined["hit_right"]).all()
    finally:
        con.close()


def test_a_higher_threshold_flags_nothing_and_causes_can_be_left_out(weeks3):
    path, res, _ = weeks3
    con = db.connect(path)
    try:
        drop = res["regressions"][0]["drop_points"]
        assert api.trend(con, threshold=drop + 1)["regressions"] == []
        quick = api.trend(con, causes=False)
        assert [g["stream"] for g in quick["regressions"]] == [f"tenant:{STAMPED}"]
        assert quick["regressions"][0]["cause"] is None and not quick["causes_computed"]
        assert quick["rows"] == res["rows"]
    finally:
        con.close()


def test_cli_json_is_one_object_and_the_text_names_the_regression(weeks3):
    path, res, _ = weeks3
    out = CliRunner().invoke(main, ["trend", "--db", str(path), "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)  # exactly one JSON document
    assert isinstance(got, dict) and got["regressions"] == json.loads(json.dumps(res["regressions"]))
    assert {"weeks", "rows", "regressions", "config"} <= set(got)
    for r in got["rows"]:
        assert {"stream", "week", "ceiling", "realised", "projected_savings", "actual_savings"} <= set(r)
    text = CliRunner().invoke(main, ["trend", "--db", str(path), "--threshold", "5", "--ttl", "5m"])
    assert text.exit_code == 0, text.output
    assert f"tenant:{STAMPED} (claude-sonnet-4-5) in 2026-W47" in text.stdout and "cause: timestamp" in text.stdout
    bad = CliRunner().invoke(main, ["trend", "--db", str(path), "--threshold", "-1"])
    assert bad.exit_code == 2


def test_report_section_lists_the_weeks_and_the_regression(weeks3, tmp_path):
    path, _, _ = weeks3
    con = db.connect(path)
    try:
        md = api.trend_section(con, tmp_path, api.Grid())
    finally:
        con.close()
    assert md.startswith("## Week over week")
    assert f"tenant:{STAMPED} (claude-sonnet-4-5) in 2026-W47" in md and "cause: timestamp" in md
    assert (tmp_path / "trend_ceiling.png").stat().st_size > 1000
    assert md.count("| tenant:") == len(TENANTS) * 3


def test_a_single_week_says_so(tmp_path):
    d = tmp_path / "one"
    d.mkdir()
    three_week_log(d / "all.jsonl")
    lines = [json.loads(x) for x in (d / "all.jsonl").read_text().splitlines()]
    week2 = [x for x in lines if _iso_week(int(x["timestamp"] * 1_000_000)) == "2026-W46"]
    (d / "w2.jsonl").write_text("\n".join(json.dumps(x) for x in week2) + "\n")
    dbp = tmp_path / "one.duckdb"
    out = CliRunner().invoke(main, ["trend", str(d / "w2.jsonl"), "--db", str(dbp), "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert got["single_week"] and got["weeks"] == ["2026-W46"] and got["regressions"] == []
    assert "one ISO week in the log" in got["note"]
    assert all(r["change_points"] is None for r in got["rows"])
    text = CliRunner().invoke(main, ["trend", "--db", str(dbp)])
    assert "one ISO week in the log" in text.stdout
    con = db.connect(dbp)
    try:
        md = api.trend_section(con, tmp_path, api.Grid())
    finally:
        con.close()
    assert "one ISO week in the log (2026-W46)" in md and not (tmp_path / "trend_ceiling.png").exists()


# ------------------------------------------------------------------ two providers: savings per model

#: tenant → (model, API format); llama has no price entry
PROVIDERS = {"acme": ("claude-sonnet-4-5", "anthropic"), "globex": ("gpt-4.1", "openai"),
             "hooli": ("llama-3.1-70b-instruct", "openai")}


def two_provider_log(path, seed: int = 1, sessions: int = 3, turns: int = 4) -> dict:
    """Three ISO weeks of an Anthropic tenant (claude-sonnet-4-5), an OpenAI tenant (gpt-4.1,
    two prompt_cache_keys) and an unpriced one (llama, OpenAI format), each in its own API's
    format with its usage; prompts of a few thousand tokens (above both providers' minimum).
    Returns the logged usage per (tenant, week index): (prompt, cached, written) tokens."""
    r = random.Random(seed)
    apps = {t: "\n\n".join(_text(r, 80) for _ in range(16)) for t in PROVIDERS}
    lines, usage = [], {}
    for wi, start in enumerate(WEEK_STARTS):
        for ti, (tenant, (model, api_format)) in enumerate(PROVIDERS.items()):
            t = start.timestamp() + 86400 * (1 + ti) + 36000
            for s in range(sessions):
                hist = [{"role": "user", "content": _text(r, 40)}]
                for turn in range(turns):
                    if api_format == "anthropic":
                        body = {"model": model, "system": [{"type": "text", "text": apps[tenant]}],
                                "messages": list(hist), "metadata": {"user_id": f"{tenant}-u{s}"}}
                    else:
                        body = {"model": model, "messages": [{"role": "system", "content": apps[tenant]}] + hist,
                                "user": f"{tenant}-u{s}"}
                        if tenant == "globex":
                            body["prompt_cache_key"] = f"app-{s % 2}"
                    prompt = len(json.dumps(body)) // 4
                    cached = 0 if turn == 0 else prompt * 3 // 5
                    written = (prompt - cached) // 2 if api_format == "anthropic" else 0
                    if api_format == "anthropic":
                        u = {"input_tokens": prompt - cached - written, "cache_read_input_tokens": cached,
                             "cache_creation_input_tokens": written, "output_tokens": 30}
                        response = {"type": "message", "content": [{"type": "text", "text": "ok"}], "usage": u}
                    else:
                        u = {"prompt_tokens": prompt, "completion_tokens": 30,
                             "prompt_tokens_details": {"cached_tokens": cached}}
                        response = {"choices": [{"message": {"role": "assistant", "content": "ok"}}], "usage": u}
                    lines.append({"timestamp": t, "tenant": tenant, "session": f"{tenant}-w{wi}-s{s}",
                                  "request": body, "response": response})
                    p, c, w = usage.get((tenant, wi), (0, 0, 0))
                    usage[(tenant, wi)] = (p + prompt, c + cached, w + written)
                    hist = hist + [{"role": "assistant", "content": _text(r, 30)},
                                   {"role": "user", "content": _text(r, 15)}]
                    t += r.uniform(20, 50)
                t += r.uniform(30, 60)
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return usage


@pytest.fixture(scope="module")
def providers2(tmp_path_factory):
    d = tmp_path_factory.mktemp("trend2")
    usage = two_provider_log(d / "two.jsonl")
    path = d / "two.duckdb"
    con = db.connect(path)
    api.ingest(con, [d / "two.jsonl"])
    res = api.trend(con)
    md = savings_section(con, d / "report")
    con.close()
    section = pl.read_csv(d / "report" / "savings.csv", infer_schema_length=None)
    return path, res, usage, section, md


def _section_streams(trend_stream: str) -> pl.Expr:
    """The savings section's streams of a tenant: its own (Anthropic, the ideal contract) or
    its OpenAI organisation, with or without a prompt_cache_key."""
    tenant = trend_stream.split(":", 1)[1]
    return pl.col("stream").is_in([trend_stream, f"org:{tenant}"]) | pl.col("stream").str.starts_with(
        f"org:{tenant}|key:")


def test_savings_per_model_equal_the_savings_sections_for_each_stream_model_and_week(providers2):
    _, res, _, section, md = providers2
    assert res["pricing"] == "per model" and res["price_model"] is None
    assert res["unpriced_models"] == ["llama-3.1-70b-instruct"]
    assert "**none: unpriced**" in md  # the section says so too
    rows = res["rows"]
    assert {(r["stream"], r["week"]) for r in rows} == {(f"tenant:{t}", w) for t in PROVIDERS for w in WEEK_LABELS}
    assert len(rows) == len(PROVIDERS) * 3
    for r in rows:
        model = PROVIDERS[r["stream"].split(":", 1)[1]][0]
        assert r["model"] == model
        sec = section.filter(_section_streams(r["stream"]) & (pl.col("model") == model)
                             & (pl.col("week") == r["week"]))
        assert sec["requests"].sum() == r["requests"]  # the same requests
        if model == "gpt-4.1":
            assert sec.height == 2 and all("|key:app-" in s for s in sec["stream"])  # summed over its keys
        else:
            assert sec.height == 1
        assert (r["profile"], r["price_model"]) == (sec["profile"][0], sec["price_model"][0])
        if r["price_model"] is None:  # unpriced: null savings, as in the section
            assert r["projected_savings"] is None and r["actual_savings"] is None
            assert sec["projected_savings"].null_count() == sec.height
            assert sec["actual_savings"].null_count() == sec.height
        else:
            assert r["projected_savings"] == pytest.approx(sec["projected_savings"].sum(), rel=1e-12, abs=1e-12)
            assert r["actual_savings"] == pytest.approx(sec["actual_savings"].sum(), rel=1e-12, abs=1e-12)
    profiles = {r["model"]: (r["profile"], r["price_model"]) for r in rows}
    assert profiles == {"claude-sonnet-4-5": ("anthropic-sonnet-4-5", "claude-sonnet-4-5"),
                        "gpt-4.1": ("openai-gpt-4.1", "gpt-4.1"), "llama-3.1-70b-instruct": ("ideal", None)}
    # the priced models' savings are not trivially zero
    assert all(r["projected_savings"] > 0 and r["actual_savings"] > 0 for r in rows if r["price_model"])


WEEK_LABELS = ["2026-W45", "2026-W46", "2026-W47"]


def test_one_row_by_hand(providers2):
    """globex (gpt-4.1) in 2026-W46 and acme (claude-sonnet-4-5) in 2026-W47, from the logged usage
    and the price table's entries: savings = cached × (input − read) − written × (write 5m − input)."""
    _, res, usage, section, _ = providers2
    row = {(r["stream"], r["week"]): r for r in res["rows"]}
    g, a = row[("tenant:globex", "2026-W46")], row[("tenant:acme", "2026-W47")]
    gpt, son = get_price("gpt-4.1"), get_price("claude-sonnet-4-5")
    p, c, w = usage[("globex", 1)]
    assert w == 0 and (g["usage_prompt_tokens"], g["usage_cached_tokens"]) == (p, c)
    assert g["actual_savings"] == pytest.approx(c * (gpt.input - gpt.cache_read) / 1e6)
    # projected: the OpenAI profile's hits (no write premium at gpt-4.1's prices), its two keys' caches
    assert gpt.cache_write_5m == gpt.input
    hit = section.filter(pl.col("stream").str.starts_with("org:globex|key:") & (pl.col("week") == "2026-W46")
                         & (pl.col("model") == "gpt-4.1"))["hit_tokens"].sum()
    assert hit > 0 and g["projected_savings"] == pytest.approx(hit * (gpt.input - gpt.cache_read) / 1e6)
    p, c, w = usage[("acme", 2)]
    assert w > 0 and a["usage_cached_tokens"] == c
    assert a["actual_savings"] == pytest.approx((c * (son.input - son.cache_read)
                                                 - w * (son.cache_write_5m - son.input)) / 1e6)


def test_price_model_overrides_per_model_pricing_and_the_text_says_which(providers2):
    path, res, _, _, _ = providers2
    con = db.connect(path)
    try:
        one = api.trend(con, price_model="gpt-4.1")
    finally:
        con.close()
    assert (one["pricing"], one["price_model"], one["unpriced_models"]) == ("one price", "gpt-4.1", [])
    assert all(r["price_model"] == "gpt-4.1" and r["profile"] is None for r in one["rows"])
    llama = [r for r in one["rows"] if r["model"] == "llama-3.1-70b-instruct"]
    assert llama and all(r["projected_savings"] is not None for r in llama)  # priced as gpt-4.1 now
    # the ceilings and regressions do not depend on the pricing
    assert [r["ceiling"] for r in one["rows"]] == [r["ceiling"] for r in res["rows"]]
    assert one["regressions"] == res["regressions"]
    text = api.format_trend(res)
    assert "per model" in text and "unpriced (no price entry: savings null): llama-3.1-70b-instruct" in text
    assert "tenant:hooli (llama-3.1-70b-instruct)" in text and "unpriced" in text.split("tenant:hooli")[1]
    assert "at `gpt-4.1` prices for every model" in api.format_trend(one)
    out = CliRunner().invoke(main, ["trend", "--db", str(path), "--json", "--price-model", "gpt-4.1"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["pricing"] == "one price"
