"""Tests of the sample generator (replay/synth/)."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from datetime import datetime

import pytest

from replay.synth import generator as synth
from replay.synth.generator import CAUSES, generate
from support.paths import ROOT

SAMPLE = ROOT / "data" / "sample"

# where (part of the rendered prompt) each planted cause sits
CAUSE_PART = {
    "tool_order": "tools", "json_key_order": "tools", "tool_schema_change": "tools",
    "rotating_header": "system", "timestamp": "system", "volatile_id": "system",
    "per_user_data": "system", "history_rewrite": "messages",
}


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth0")
    return generate(out, seed=0)


def _load(res):
    """(records by file name, truth rows)."""
    recs = {p.name: [json.loads(ln) for ln in p.read_text().splitlines()] for p in res.files.values()}
    truth = [json.loads(ln) for ln in res.truth.read_text().splitlines()]
    return recs, truth


def _ts(rec) -> float:
    t = rec["timestamp"]
    if isinstance(t, str):
        return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
    return float(t)


def _streams(recs, truth):
    """stream → [(ts, rec, truth row)] in file order."""
    out = defaultdict(list)
    for t in truth:
        rec = recs[t["file"]][t["line"] - 1]
        out[(t["file"], t["stream"])].append((_ts(rec), rec, t))
    return out


def _prefix_text(req) -> int:
    tools = sum(len(json.dumps(t, separators=(",", ":"), ensure_ascii=False)) for t in req.get("tools") or ())
    if "system" in req:
        sys_ = sum(len(b["text"]) for b in req["system"])
    else:
        sys_ = sum(len(m["content"]) for m in req["messages"] if m["role"] == "system")
    return tools + sys_


# ------------------------------------------------------------------ determinism

def test_same_seed_same_bytes(tmp_path, default):
    again = generate(tmp_path / "a", seed=0)
    for name, p in default.files.items():
        assert p.read_bytes() == again.files[name].read_bytes(), name
    assert default.truth.read_bytes() == again.truth.read_bytes()


def test_other_seed_differs(tmp_path, default):
    other = generate(tmp_path / "b", seed=1)
    assert set(other.files) == set(default.files)
    for name, p in default.files.items():
        assert p.read_bytes() != other.files[name].read_bytes(), name


# ------------------------------------------------------------------ envelope

def test_lines_valid_with_envelope(default):
    recs, truth = _load(default)
    assert set(recs) == {"agent-anthropic.jsonl", "agent-openai.jsonl", "chat-openai.jsonl"}
    for name, rows in recs.items():
        assert rows, name
        for rec in rows:
            for k in ("timestamp", "tenant", "session", "request", "response"):
                assert k in rec, (name, k)
            req, resp = rec["request"], rec["response"]
            assert req["model"] and req["messages"]
            if name.endswith("anthropic.jsonl"):
                assert isinstance(rec["timestamp"], str) and rec["timestamp"].endswith("Z")
                assert len(rec["timestamp"].split(".")[1]) == 4  # milliseconds + Z
                assert isinstance(req["system"], list) and req["tools"]
                assert any("cache_control" in b for b in req["system"])
                assert req["metadata"]["user_id"] and req["max_tokens"] > 0
                assert resp["id"].startswith("msg_") and resp["content"]
                u = resp["usage"]
                assert all(u[k] >= 0 for k in ("input_tokens", "cache_read_input_tokens",
                                               "cache_creation_input_tokens", "output_tokens"))
                # self-consistent: total ≈ 4 chars per token of the rendered prompt
                total = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
                assert total > _prefix_text(req) // 8
            else:
                assert isinstance(rec["timestamp"], float)
                assert req["messages"][0]["role"] == "system"
                msg = resp["choices"][0]["message"]
                assert msg["role"] == "assistant"
                u = resp["usage"]
                assert u["prompt_tokens"] >= u["prompt_tokens_details"]["cached_tokens"] >= 0
                assert u["completion_tokens"] > 0
                if "tools" in req:
                    assert all(t["type"] == "function" and "name" in t["function"] for t in req["tools"])


def test_truth_maps_lines(default):
    recs, truth = _load(default)
    assert len(truth) == sum(len(v) for v in recs.values()) == default.requests
    seen = set()
    for t in truth:
        rec = recs[t["file"]][t["line"] - 1]
        assert rec["session"] == t["session"] and rec["tenant"] == t["tenant"]
        assert set(t["causes"]) <= set(CAUSES)
        assert not (t["first_in_session"] and t["causes"])
        seen.add((t["file"], t["line"]))
    assert len(seen) == len(truth)


def test_counts_per_format(default, tmp_path):
    recs, _ = _load(default)
    for name, path in default.files.items():
        assert default.counts[name] == len(recs[path.name])
    assert default.counts["agent-anthropic"] >= 40
    assert default.counts["agent-openai"] >= 25
    assert default.counts["chat-openai"] >= 100
    only = generate(tmp_path / "anth", seed=0, scale=0.5, formats=("anthropic",))
    assert set(only.files) == {"agent-anthropic"}
    assert sorted(p.name for p in (tmp_path / "anth").iterdir()) == ["_truth.jsonl", "agent-anthropic.jsonl"]


def test_tenants_keys_users(default):
    recs, truth = _load(default)
    tenants = {t["tenant"] for t in truth}
    assert 3 <= len(tenants) <= 5
    oai = [r for name, rows in recs.items() if "openai" in name for r in rows]
    with_key = [r for r in oai if r["request"].get("prompt_cache_key")]
    assert with_key and len(with_key) < len(oai)
    assert len({r["request"]["prompt_cache_key"] for r in with_key}) >= 3
    chat_users = {r["request"]["user"] for r in recs["chat-openai.jsonl"]}
    assert len(chat_users) >= 5
    for r in recs["chat-openai.jsonl"]:
        sys_ = r["request"]["messages"][0]["content"].split("\n")
        assert sys_[0].startswith("You are talking to ") and "(user u-" in sys_[0]
        assert "The current date and time is" in sys_[1]


# ------------------------------------------------------------------ planted causes

def test_each_cause_planted_enough(default):
    _, truth = _load(default)
    counts = {c: 0 for c in CAUSES}
    for t in truth:
        for c in t["causes"]:
            counts[c] += 1
    assert counts == default.cause_counts
    for c in CAUSES:
        assert counts[c] >= 5, (c, counts)
    clean = [t for t in truth if not t["first_in_session"] and not t["causes"] and t["kind"] != "chat"]
    assert len(clean) >= 20  # clean sessions exist as well


def test_truth_consistent_with_prompts(default):
    """Clean requests extend the previous prompt; planted ones break it where the cause sits."""
    recs, truth = _load(default)
    for t in truth:
        if t["first_in_session"]:
            assert t["prev_line"] is None
            continue
        assert t["shared_chars"] <= t["prompt_chars"]
        if t["causes"]:
            assert t["cut"] == CAUSE_PART[t["causes"][0]], t
            assert t["cut"] != "end"
        elif t["kind"] != "chat":
            assert t["cut"] == "end", t
    # a planted change really is a change of the planted element
    for (f, _s), rows in _streams(recs, truth).items():
        for (_, prev, _pt), (_, cur, ct) in zip(rows, rows[1:]):
            p, c = prev["request"], cur["request"]
            if "tool_order" in ct["causes"]:
                names = lambda r: [x.get("name") or x["function"]["name"] for x in r["tools"]]
                assert names(p) != names(c) and sorted(names(p)) == sorted(names(c))
            if "json_key_order" in ct["causes"]:
                assert json.dumps(p["tools"]) != json.dumps(c["tools"])
                assert json.dumps(p["tools"], sort_keys=True) == json.dumps(c["tools"], sort_keys=True)
            if "tool_schema_change" in ct["causes"]:
                names = lambda r: [x.get("name") or x["function"]["name"] for x in r["tools"]]
                assert names(p) == names(c) and p["tools"] != c["tools"]
            if "history_rewrite" in ct["causes"]:
                assert "[output truncated]" in json.dumps(c["messages"])
            if "rotating_header" in ct["causes"]:
                first = (c["system"][0]["text"] if "system" in c else c["messages"][0]["content"]).split("\n")[0]
                assert first.startswith("x-anthropic-billing-header: cc_version=1.0.") and "; cch=" in first


def test_truth_agrees_with_renderer(default):
    render = pytest.importorskip("replay.text.render")
    recs, truth = _load(default)
    for t in truth:
        if t["first_in_session"]:
            continue
        fmt = "anthropic" if "anthropic" in t["file"] else "openai"
        cur = render.render_request(recs[t["file"]][t["line"] - 1]["request"], fmt)
        prev = render.render_request(recs[t["file"]][t["prev_line"] - 1]["request"], fmt)
        extends = cur[: len(prev) - 1] == prev[:-1]  # minus the generation marker
        if t["causes"]:
            assert not extends, t
        elif t["kind"] != "chat":
            assert extends, t


# ------------------------------------------------------------------ prefixes, time

def test_stable_prefix_size(default):
    recs, truth = _load(default)
    sizes = defaultdict(list)
    for t in truth:
        req = recs[t["file"]][t["line"] - 1]["request"]
        sizes[(t["file"], t["kind"])].append(_prefix_text(req))
    for fmt in ("agent-anthropic.jsonl", "agent-openai.jsonl"):
        assert min(sizes[(fmt, "agent")]) >= 40_000, fmt
        # sub-agents: a different, smaller tool set
        assert sizes[(fmt, "subagent")] and max(sizes[(fmt, "subagent")]) < min(sizes[(fmt, "agent")])
    main = [set(x["name"] for x in r["request"]["tools"]) for r, t in
            zip(recs["agent-anthropic.jsonl"], [t for t in truth if t["file"] == "agent-anthropic.jsonl"])]
    kinds = [t["kind"] for t in truth if t["file"] == "agent-anthropic.jsonl"]
    main_tools = set.union(*[s for s, k in zip(main, kinds) if k == "agent"])
    sub_tools = set.union(*[s for s, k in zip(main, kinds) if k == "subagent"])
    assert sub_tools & main_tools and sub_tools - main_tools  # subset + different tools


def test_timestamps_increase(default):
    recs, truth = _load(default)
    for name, rows in recs.items():
        ts = [_ts(r) for r in rows]
        assert ts == sorted(ts), name  # files are in time order
    for key, rows in _streams(recs, truth).items():
        ts = [x[0] for x in rows]
        assert all(b > a for a, b in zip(ts, ts[1:])), key
        assert rows[0][2]["first_in_session"] and not any(x[2]["first_in_session"] for x in rows[1:])
    start = datetime.fromisoformat("2026-11-16T00:00:00+00:00").timestamp()
    all_ts = [_ts(r) for rows in recs.values() for r in rows]
    assert min(all_ts) >= start and max(all_ts) < start + 8 * 86400


def test_gaps_cover_ttl_buckets(default):
    recs, truth = _load(default)
    gaps = []
    for (f, stream), rows in _streams(recs, truth).items():
        if stream.startswith("tenant:"):
            continue  # session streams only
        gaps += [b[0] - a[0] for a, b in zip(rows, rows[1:])]
    buckets = [0, 0, 0, 0]
    for g in gaps:
        buckets[0 if g < 300 else 1 if g < 1800 else 2 if g < 3600 else 3] += 1
    assert all(buckets), buckets
    assert sum(g < 60 for g in gaps) > len(gaps) / 2  # agent turns: mostly seconds


def test_hours_window(tmp_path):
    res = generate(tmp_path, seed=3, scale=0.3, start="2026-12-01T08:00:00Z", hours=6)
    recs, truth = _load(res)
    start = datetime.fromisoformat("2026-12-01T08:00:00+00:00").timestamp()
    firsts = [_ts(recs[t["file"]][t["line"] - 1]) for t in truth if t["first_in_session"]]
    assert min(firsts) >= start and max(firsts) <= start + 6 * 3600


# ------------------------------------------------------------------ scale, compression, sample

def test_scale_scales_counts(tmp_path, default):
    small = generate(tmp_path / "s", seed=0, scale=0.5)
    big = generate(tmp_path / "b", seed=0, scale=2.0)
    assert small.requests < default.requests < big.requests
    assert 0.3 < small.requests / default.requests < 0.75
    assert 1.5 < big.requests / default.requests < 2.8


def test_gzip(tmp_path, default):
    gz = generate(tmp_path, seed=0, compress="gzip")
    for name, p in gz.files.items():
        assert p.name.endswith(".jsonl.gz")
        assert gzip.decompress(p.read_bytes()) == default.files[name].read_bytes()
    assert gz.truth.read_bytes().replace(b".jsonl.gz", b".jsonl") == default.truth.read_bytes()


def test_default_size_small(default):
    assert 250 <= default.requests <= 800
    assert default.bytes < 5_000_000


def test_synth_main(tmp_path):
    lines = []
    res = synth.synth_main(tmp_path, seed=2, scale=0.2, echo=lines.append)
    assert res.requests > 0 and any("planted" in ln for ln in lines)


@pytest.mark.skipif(not (SAMPLE / "_truth.jsonl").exists(), reason="no shipped sample")
def test_shipped_sample_is_seed0(default):
    for name, p in default.files.items():
        assert (SAMPLE / p.name).read_bytes() == p.read_bytes(), f"regenerate data/sample ({p.name})"
    assert (SAMPLE / "_truth.jsonl").read_bytes() == default.truth.read_bytes()
    assert sum(f.stat().st_size for f in SAMPLE.iterdir()) < 5_000_000
