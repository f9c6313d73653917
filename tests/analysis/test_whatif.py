"""What-if normalizers: unit behaviour, and whatif == the ceiling of the normalized log from scratch."""

from __future__ import annotations

import json
import math

import pytest

from replay.store import db
from replay import api as pipeline
from replay.core.sweep import Grid
from replay.analysis.whatif import FIXES, normalize_body, normalized_copy, whatif

from support.logs import planted_logs


def test_strip_rotating_header():
    body = {"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12c;"},
                       {"type": "text", "text": "You are helpful.\nX-Request-Header: 5\nBe brief."}],
            "messages": [{"role": "user", "content": "hi"}]}
    out = normalize_body(body, ["strip-rotating-header"])
    assert out["system"] == [{"type": "text", "text": "You are helpful.\nBe brief."}]
    assert body["system"][0]["text"].startswith("x-anthropic")  # input untouched
    oai = {"messages": [{"role": "system", "content": "x-foo: 1\nHello"}, {"role": "user", "content": "x-foo: 2"}]}
    out = normalize_body(oai, ["strip-rotating-header"])
    assert out["messages"][0]["content"] == "Hello" and out["messages"][1]["content"] == "x-foo: 2"


def test_sort_tools_and_canonical_json():
    body = {"tools": [{"name": "b", "description": "x", "input_schema": {"type": "object"}},
                      {"type": "function", "function": {"parameters": {}, "name": "a"}}],
            "messages": [{"role": "assistant", "content": "",
                          "tool_calls": [{"function": {"name": "a", "arguments": '{"y": 1, "x": [2, {"b":1,"a":2}]}'}}]}]}
    s = normalize_body(body, ["sort-tools"])
    assert [t.get("name") or t["function"]["name"] for t in s["tools"]] == ["a", "b"]
    c = normalize_body(body, ["canonical-json"])
    assert list(c["tools"][0]) == ["description", "input_schema", "name"]
    assert c["messages"][0]["tool_calls"][0]["function"]["arguments"] == '{"x":[2,{"a":2,"b":1}],"y":1}'
    # the same JSON value in another key order normalizes to the same bytes
    other = json.loads(json.dumps(body))
    other["tools"][0] = {"input_schema": {"type": "object"}, "name": "b", "description": "x"}
    assert json.dumps(normalize_body(other, ["canonical-json"])) == json.dumps(c)


def test_bucket_timestamps_keeps_layout():
    body = {"system": "Current time: 2026-11-16T10:47:31Z\nDate 2026-11-16 10:04 UTC\nplain 2026-11-16",
            "messages": [{"role": "user", "content": "at 2026-11-16T10:47:31Z"}]}
    out = normalize_body(body, ["bucket-timestamps=5m"])
    assert out["system"] == "Current time: 2026-11-16T10:45:00Z\nDate 2026-11-16 10:00 UTC\nplain 2026-11-16"
    assert out["messages"][0]["content"] == "at 2026-11-16T10:47:31Z"  # messages are not the prefix
    out = normalize_body(body, ["bucket-timestamps=1h"])
    assert out["system"].startswith("Current time: 2026-11-16T10:00:00Z")


def test_move_volatile_after_breakpoint():
    body = {"system": [{"type": "text", "text": "Intro.\nRequest-Id: 0b8f3c9e-6a7d-4c1e-9f00-1234567890ab\nRules."}],
            "messages": [{"role": "user", "content": "question"}]}
    out = normalize_body(body, ["move-volatile-after-breakpoint"])
    assert out["system"][0]["text"] == "Intro.\nRules."
    assert out["messages"][-1]["content"] == [{"type": "text", "text": "question"},
                                              {"type": "text", "text": "Request-Id: 0b8f3c9e-6a7d-4c1e-9f00-1234567890ab"}]


def test_unknown_fix_is_refused():
    with pytest.raises(ValueError, match="unknown fix"):
        normalize_body({}, ["sort-everything"])


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif")
    planted_logs(d, seed=11, sessions=2, turns=4)
    con = db.connect(None)
    pipeline.ingest(con, [d / "planted.jsonl"])
    return con, d


def _from_scratch(src, fixes, tmp, grid: Grid) -> int:
    """Normalize the log file by hand, ingest it into an empty database, replay, sweep."""
    out = tmp / ("norm-" + "-".join(f.replace("=", "") for f in fixes) + ".jsonl")
    with open(src) as f, open(out, "w") as g:
        for line in f:
            rec = json.loads(line)
            rec["request"] = normalize_body(rec["request"], fixes)
            g.write(json.dumps(rec) + "\n")
    con = db.connect(None)
    pipeline.ingest(con, [out])
    return int(pipeline.sweep(con, grid)["hit_tokens"][0])


@pytest.mark.parametrize("ttl,block,m,stream", [(300, 16, 0, "tenant"), (math.inf, 1, 0, "global")])
def test_whatif_equals_the_normalized_log_from_scratch(logs, tmp_path, ttl, block, m, stream):
    con, d = logs
    res = whatif(con, list(FIXES), ttl=ttl, block=block, min_prefix=m, stream=stream)
    grid = Grid(ttls=(ttl,), blocks=(block,), min_prefixes=(m,), streams=(stream,))
    assert res["before"]["hit_tokens"] == _from_scratch(d / "planted.jsonl", [], tmp_path, grid)
    for f in res["fixes"]:
        assert f["after"]["hit_tokens"] == _from_scratch(d / "planted.jsonl", [f["fix"]], tmp_path, grid), f["fix"]
    assert res["all"]["after"]["hit_tokens"] == _from_scratch(d / "planted.jsonl", list(FIXES), tmp_path, grid)
    gains = {f["fix"]: f["gain_hit_tokens"] for f in res["fixes"]}
    assert gains["strip-rotating-header"] > 0 and gains["sort-tools"] > 0 and gains["canonical-json"] > 0
    assert gains["move-volatile-after-breakpoint"] > 0
    assert res["all"]["after"]["hit_ratio"] >= max(f["after"]["hit_ratio"] for f in res["fixes"]) - 1e-12


def test_normalized_copy_reuses_segments(logs):
    con, _ = logs
    c2 = normalized_copy(con, ["sort-tools"])
    known = con.execute("SELECT count(*) FROM segments").fetchone()[0]
    have = c2.execute("SELECT count(*) FROM segments").fetchone()[0]
    assert have >= known  # copied across, only new text added
    assert c2.execute("SELECT count(*) FROM prompts").fetchone()[0] == \
        con.execute("SELECT count(*) FROM requests").fetchone()[0]


def test_whatif_money(logs):
    con, _ = logs
    from replay.providers.economics import Price

    price = Price("test-model", input=3.0, cache_read=0.3, cache_write_5m=3.75, cache_write_1h=6.0, output=15.0)
    res = whatif(con, ["strip-rotating-header"], prices=price)
    f = res["fixes"][0]
    assert f["after"]["money"]["savings"] >= res["before"]["money"]["savings"]
    assert math.isclose(f["gain_savings"], f["gain_hit_tokens"] * (3.0 - 0.3) / 1e6)
