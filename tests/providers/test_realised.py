"""``replay realised``: each provider's rules as its client uses them, by hand
(breakpoints and lookback, TTL boundaries, minimums, a backend switch, a hidden
prefix shared or not), gap parts that add up, ``--profile auto`` agreeing with
it, and the shared real sessions within the issue's bounds of their provider's
own counts."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from replay import api
from replay.core.prompts import Prompt
from replay.providers import client_rules
from replay.providers.client_rules import (RequestRow, _gemini, _openai, anthropic_predictions, hidden_lengths,
                                           judge)  # (the per-family rules, called directly on hand-made rows)
from replay.providers.hidden import hidden_tokens
from replay.providers.realised import realised

from support.agent_logs import claude_transcript, write_jsonl
from support.paths import ROOT, SHARED

AGENTS = SHARED / "agents"
S = 1_000_000


def _row(rid, ts, tokens, session="s", model="claude-opus-4-6", up=None, uc=0, w1h=None, write=None,
         hidden_key=None, backend=None, key=None):
    toks = np.asarray(tokens, dtype=np.int64)
    prompt = Prompt(rid, ts, "t", key, session, toks, None, None, len(toks), model)
    return RequestRow(prompt, "claude-code", hidden_key, backend, up if up is not None else len(toks), uc, write, w1h)


def _ends(rows, block=100):
    return {r.request_id: list(range(block, r.n_tokens + 1, block)) or [r.n_tokens] for r in rows}



def test_anthropic_ttl_boundary_5m_and_1h():
    base = list(range(5000))
    rows = [_row(0, 0, base, write=5000), _row(1, 300 * S - 1, base + [7] * 100),  # 1 µs under 5 min: a hit
            _row(2, 600 * S - 1, base + [7] * 200),                                  # exactly 5 min: a hit
            _row(3, 900 * S, base + [7] * 300)]                                      # 1 µs past: a miss
    got = anthropic_predictions(rows, {}, _ends(rows))
    assert [g[2] for g in got] == [0, 5000, 5100, 0]
    assert got[3][3] == "TTL expiry"
    rows_1h = [_row(0, 0, base, w1h=5000, write=5000), _row(1, 3600 * S, base + [7] * 100),
               _row(2, 7200 * S + 1, base + [7] * 200)]
    assert [g[2] for g in anthropic_predictions(rows_1h, {}, _ends(rows_1h))] == [0, 5000, 0]


def test_anthropic_minimum_and_lookback():
    short = [_row(0, 0, list(range(3000))), _row(1, S, list(range(3100)))]  # opus-4-6: 4096 minimum
    got = anthropic_predictions(short, {}, _ends(short))
    assert [g[2] for g in got] == [0, 0] and got[1][3] == "minimum"
    a = list(range(5000))
    far = [_row(0, 0, a), _row(1, S, a + list(range(10**6, 10**6 + 2500)))]  # 25 blocks later: past the lookback
    near = [_row(0, 0, a), _row(1, S, a + list(range(10**6, 10**6 + 1500)))]  # 15 blocks later
    assert [g[2] for g in anthropic_predictions(far, {}, _ends(far))] == [0, 0]
    assert anthropic_predictions(far, {}, _ends(far))[1][3] == "breakpoints"
    assert [g[2] for g in anthropic_predictions(near, {}, _ends(near))] == [0, 5000]


def test_hidden_prefix_shared_across_sessions_of_one_key_only():
    vis_a, vis_b = list(range(100)), list(range(500, 600))
    rows = [_row(0, 0, vis_a, session="a", up=5100, hidden_key="k"),       # hidden 5,000
            _row(1, S, vis_b, session="b", up=5100, hidden_key="k"),       # the same 5,000: a's breakpoint
            _row(2, 2 * S, vis_b, session="c", up=5100, hidden_key="other"),
            _row(3, 3 * S, vis_b, session="d", up=6100, hidden_key="k")]   # 6,000: no breakpoint at 5,000 written
    hidden = hidden_lengths(rows)
    assert hidden == {"t|a": 5000, "t|b": 5000, "t|c": 5000, "t|d": 6000}
    assert np.array_equal(hidden_tokens("k", 6000)[:5000], hidden_tokens("k", 5000))
    got = anthropic_predictions(rows, hidden, _ends(rows, 50))
    assert [g[2] for g in got] == [0, 5000, 0, 0]  # Anthropic hits only where an earlier request put a breakpoint
    assert [g[1] for g in got] == [5000, 5000, 5000, 6000]
    assert [g[3] for g in got] == ["unexplained"] * 4  # (judge marks a stream's first request: test below)
    # a token-level cache (OpenAI's walk) shares the common part of two lengths
    oa = [_row(0, 0, vis_a, session="a", up=5100, hidden_key="k", model="gpt-5.5"),
          _row(1, S, vis_b, session="d", up=6100, hidden_key="k", model="gpt-5.5")]
    assert [g[2] for g in _openai(None, oa, hidden_lengths(oa))] == [0, 1024 + 31 * 128]  # 5,000 → 4,992


def test_openai_rounding_minimum_and_ttl():
    a = list(range(3000))
    rows = [_row(0, 0, a, model="gpt-5.5"), _row(1, 600 * S, a + [1] * 10, model="gpt-5.5"),
            _row(2, 1200 * S + 1, a + [1] * 20, model="gpt-5.5"),
            _row(3, 1201 * S, list(range(900)), model="gpt-5.5", session="x")]
    got = _openai(None, rows, {})
    assert [g[2] for g in got] == [0, 1024 + 15 * 128, 0, 0]   # 3,000 → 2,944; 10 min + 1 µs: expired
    assert [g[3] for g in got][2:] == ["TTL expiry", "minimum"]


def test_gemini_blocks_and_backend_switch():
    a = list(range(9000))
    rows = [_row(0, 0, a, model="gemini-3-pro-preview", backend="A"),
            _row(1, S, a + [1] * 50, model="gemini-3-pro-preview", backend="A"),
            _row(2, 2 * S, a + [1] * 60, model="gemini-3-pro-preview", backend="B"),
            _row(3, 3 * S, a + [1] * 70, model="gemini-3-pro-preview", backend="A")]
    got = _gemini(None, rows, {})
    assert [g[2] for g in got] == [0, 8192, 0, 8192]  # 2,048-token blocks; B is a cache of its own
    assert got[2][3] == "backend split"


def test_gap_parts_add_up(tmp_path, monkeypatch):
    rows = [_row(0, 0, list(range(5000)), up=5500, uc=0, hidden_key="k"),
            _row(1, S, list(range(5100)), up=5600, uc=5400, hidden_key="k"),
            _row(2, 900 * S, list(range(5200)), up=5700, uc=5500, hidden_key="k")]
    monkeypatch.setattr(client_rules, "block_ends", lambda con, ids: _ends(rows))  # (the rows are not stored)
    got = judge(None, rows, "anthropic")
    assert [g[3] for g in got] == ["hidden-part inference", "unexplained", "TTL expiry"]
    assert [g[2] for g in got] == [0, 5500, 0]  # 900 s after a 5-minute write: expired
    df = pl.DataFrame([(r.request_id, "anthropic", r.model, r.session, r.stream, n, h, pred, r.usage_prompt,
                        r.usage_cached, part) for r, (n, h, pred, part) in zip(rows, got)],
                      schema=["request_id", "provider", "model", "session", "stream", "prompt_tokens",
                              "hidden_tokens", "predicted", "provider_prompt_tokens", "realised", "part"],
                      orient="row")
    [model_row, overall] = realised(None, frame=df)
    for r in (model_row, overall):
        assert sum(r["gap_parts"].values()) == pytest.approx(r["gap_points"], abs=1e-9)
        assert r["inferred_share"] == pytest.approx(3 * 500 / (15300 + 1500))
        assert r["predicted_hit_ratio"] == pytest.approx(5500 / 16800)
        assert r["realised_hit_ratio"] == pytest.approx(10900 / 16800)
    # each part is its requests' share of the difference
    assert overall["gap_parts"]["TTL expiry"] == pytest.approx(100 * (0 / 16800 - 5500 / 16800))


def test_sweep_auto_agrees_with_realised(tmp_path):
    f = tmp_path / "s1.jsonl"
    write_jsonl(f, claude_transcript())
    con = api.open_db(str(tmp_path / "db.duckdb"))
    api.ingest(con, [str(f)])
    rows = realised(con)
    [auto] = api.profile_sweep(con, ["auto"]).to_dicts()
    assert auto["profile"] == "auto/anthropic-claude-code"
    overall = [r for r in rows if r["model"] == "*"][0]
    assert auto["hit_tokens"] / auto["prompt_tokens"] == pytest.approx(overall["predicted_hit_ratio"])
    assert auto["prompt_tokens"] == overall["prompt_tokens"]



# ----------------------------------------------------------------------------- the shared real sessions

@pytest.mark.skipif(not AGENTS.is_dir(), reason="../shared/data/agents is not here")
@pytest.mark.parametrize("client,provider,limit", [("claude-code", "anthropic", 2.0), ("codex", "openai", 2.0),
                                                   ("gemini", "google", 5.0)])
def test_realised_on_shared_sessions(tmp_path, client, provider, limit):
    out = subprocess.run([sys.executable, "-m", "replay.cli.main", "realised", str(AGENTS / client), "--db",
                          str(tmp_path / "db.duckdb"), "--json"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    overall = [r for r in rows if r["provider"] == provider and r["model"] == "*"]
    assert len(overall) == 1
    r = overall[0]
    assert set(r) == set(api.REALISED_KEYS)
    assert abs(r["gap_points"]) <= limit
    cached, prompt = _direct_count(client)  # the realised figure is a direct count of the files' usage
    assert r["realised_hit_ratio"] == pytest.approx(cached / prompt, abs=1e-12)
    assert r["provider_prompt_tokens"] == prompt
    assert sum(r["gap_parts"].values()) == pytest.approx(r["gap_points"], abs=1e-6)


def _direct_count(client: str) -> tuple[int, int]:
    """(cached, prompt) tokens summed straight from the files, one API call once."""
    cached = prompt = 0
    for f in sorted((AGENTS / client).glob("*.gz")):
        if client == "gemini":
            for m in json.load(gzip.open(f))["messages"]:
                u = ((m.get("extra") or {}).get("response") or {}).get("usage") if m.get("role") == "assistant" else None
                if u:
                    prompt += u["prompt_tokens"]
                    cached += (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            continue
        seen, last = set(), None
        for line in gzip.open(f, "rt"):
            d = json.loads(line)
            p, m = d.get("payload") or {}, d.get("message")
            if client == "claude-code" and d.get("type") == "assistant" and m["model"] != "<synthetic>" \
                    and m["id"] not in seen:
                seen.add(m["id"])
                u = m["usage"]
                prompt += u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
                cached += u["cache_read_input_tokens"]
            if client == "codex" and p.get("type") == "token_count" and p.get("info") \
                    and p["info"]["total_token_usage"] != last:
                last = p["info"]["total_token_usage"]
                prompt += p["info"]["last_token_usage"]["input_tokens"]
                cached += p["info"]["last_token_usage"]["cached_input_tokens"]
    return cached, prompt
