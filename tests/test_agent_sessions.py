"""Coding agents' session files (Claude Code transcripts, Codex rollouts) and the
provider rules ``replay realised`` judges them by: readers that count every line,
and hand-computed hits for breakpoints and lookback, TTL boundaries, minimums, a
backend switch and a hidden prefix shared across sessions or not."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from replay import api
from replay.providers import client_rules
from replay.providers.realised import realised
from replay.providers.client_rules import (RequestRow, _gemini, _openai, anthropic_predictions, hidden_lengths,
                                           judge)  # (the per-family rules, called directly on hand-made rows)
from replay.providers.hidden import hidden_tokens
from replay.providers.simulators import ANTHROPIC_5M_US

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "agents"
S = 1_000_000


# ----------------------------------------------------------------------------- hand-made files

def _cc(uuid, parent, typ, ts, content=None, mid=None, model="claude-opus-4-6", usage=None, **extra):
    rec = {"parentUuid": parent, "isSidechain": False, "cwd": "/p", "sessionId": "s1", "version": "2.1.0",
           "type": typ, "uuid": uuid, "timestamp": f"2026-01-01T00:00:{ts:02d}.000Z"}
    if typ in ("user", "assistant"):
        msg = {"role": typ, "content": content}
        if typ == "assistant":
            msg.update(id=mid, model=model, usage=usage or {"input_tokens": 3, "cache_creation_input_tokens": 100,
                                                             "cache_read_input_tokens": 900, "output_tokens": 5,
                                                             "cache_creation": {"ephemeral_5m_input_tokens": 0,
                                                                                "ephemeral_1h_input_tokens": 100}})
        rec["message"] = msg
    rec.update(extra)
    return rec


def claude_transcript() -> list:
    tool_use = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
    return [
        {"type": "file-history-snapshot", "messageId": "x", "snapshot": {}, "sessionId": "s1"},
        _cc("u1", None, "user", 1, "fix the bug"),
        _cc("a1", "u1", "assistant", 2, [{"type": "text", "text": "looking"}], mid="m1"),
        _cc("a2", "a1", "assistant", 3, [tool_use], mid="m1"),            # the same call: context
        _cc("p1", "a2", "progress", 4, data={}),
        _cc("u2", "p1", "user", 5, [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]),
        _cc("a3", "u2", "assistant", 6, [{"type": "text", "text": "done"}], mid="m2"),
        _cc("sy", "a3", "system", 7, subtype="stop_hook_summary"),
        _cc("a4", "u2", "assistant", 8, [{"type": "text", "text": "x"}], mid="m3", model="<synthetic>"),
        _cc("sc1", None, "user", 9, "subtask", isSidechain=True, agentId="ag1"),
        _cc("sc2", "sc1", "assistant", 10, [{"type": "text", "text": "ok"}], mid="m4", isSidechain=True,
            agentId="ag1"),
    ]


def _write_jsonl(path: Path, recs: list, tail: bytes = b"") -> None:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in recs) + tail)


def test_claude_code_transcript_lines_reconcile(tmp_path):
    f = tmp_path / "s1.jsonl"
    _write_jsonl(f, claude_transcript(), b'[1, 2]\n{"type": "assistant", "sessi')  # a non-object, a cut line
    con = api.open_db(str(tmp_path / "db.duckdb"))
    s = api.ingest(con, [str(f)])
    assert (s.lines, s.loaded, s.rejected) == (13, 3, 2)
    assert s.context == 8 and s.reconciles()
    src = con.execute("SELECT format, lines, loaded, context, rejected FROM sources").fetchall()
    assert src == [("claude-code", 13, 3, 8, 2)]
    rows = con.execute("""SELECT line_no, session, prompt_cache_key, model, client, usage_prompt_tokens,
                                 usage_cached_tokens, usage_write_1h_tokens, hidden_key
                          FROM requests ORDER BY line_no""").fetchall()
    assert [r[0] for r in rows] == [3, 7, 11]
    assert [r[1] for r in rows] == ["s1", "s1", "s1/ag1"]
    assert rows[0][2:8] == ("/p", "claude-opus-4-6", "claude-code", 1003, 900, 100)
    assert rows[2][8].endswith(" agent") and rows[0][8] == "claude-code 2.1.0 claude-opus-4-6 /p"
    bodies = [json.loads(b) for (b,) in con.execute(
        "SELECT b.body FROM request_bodies b JOIN requests USING (request_id) ORDER BY line_no").fetchall()]
    assert bodies[0] == {"messages": [{"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}]}
    # the call after the tool result: user, the first call's two blocks as one message, the tool result
    msgs = bodies[1]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert [b["type"] for b in msgs[1]["content"]] == ["text", "tool_use"]
    assert msgs[2]["content"][0]["type"] == "tool_result"
    assert api.ingest(con, [str(f)]).loaded == 0  # re-ingest adds nothing
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 3


def codex_rollout() -> list:
    def line(typ, payload, t):
        return {"timestamp": f"2026-01-01T00:00:{t:02d}.000Z", "type": typ, "payload": payload}

    def tc(inp, cached, reasoning, total):
        return line("event_msg", {"type": "token_count", "info": {
            "last_token_usage": {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": 9,
                                 "reasoning_output_tokens": reasoning},
            "total_token_usage": {"input_tokens": total}}}, 0)
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    return [
        line("session_meta", {"id": "c1", "cwd": "/p", "cli_version": "0.1", "base_instructions": {"text": "be"}}, 1),
        line("turn_context", {"model": "gpt-5.5", "cwd": "/p"}, 1),
        line("response_item", user, 2),
        line("response_item", {"type": "reasoning", "summary": [], "encrypted_content": "X"}, 3),
        line("response_item", {"type": "function_call", "name": "sh", "arguments": "{}", "call_id": "k"}, 3),
        tc(2000, 0, 40, 2000),
        line("response_item", {"type": "function_call_output", "call_id": "k", "output": "ok"}, 4),
        line("response_item", {"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                                      "text": "done"}]}, 5),
        tc(2100, 1920, 0, 4100),
        tc(2100, 1920, 0, 4100),                                              # written twice: context
        line("event_msg", {"type": "token_count", "info": None}, 6),          # rate limits only
        line("response_item", user, 7),
        tc(2200, 1920, 0, 6300),
    ]


def test_codex_rollout_calls_and_reasoning(tmp_path):
    f = tmp_path / "rollout-1.jsonl"
    _write_jsonl(f, codex_rollout())
    con = api.open_db(str(tmp_path / "db.duckdb"))
    s = api.ingest(con, [str(f)])
    assert (s.lines, s.loaded, s.context, s.rejected) == (13, 3, 10, 0)
    rows = con.execute("SELECT line_no, session, prompt_cache_key, model, usage_prompt_tokens, usage_cached_tokens "
                       "FROM requests ORDER BY line_no").fetchall()
    assert rows == [(6, "c1", "c1", "gpt-5.5", 2000, 0), (9, "c1", "c1", "gpt-5.5", 2100, 1920),
                    (13, "c1", "c1", "gpt-5.5", 2200, 1920)]
    bodies = [json.loads(b) for (b,) in con.execute(
        "SELECT b.body FROM request_bodies b JOIN requests USING (request_id) ORDER BY line_no").fetchall()]
    assert bodies[0]["system"] == "be" and len(bodies[0]["messages"]) == 1  # the call's own output excluded
    second = bodies[1]["messages"]
    opaque = [b for m in second for b in (m.get("content") or []) if isinstance(b, dict) and b.get("type") == "opaque"]
    assert [b["tokens"] for b in opaque] == [40]  # the reasoning, as long as its call's reasoning tokens
    # a new turn: the reasoning of the earlier turn is no longer sent
    third = bodies[2]["messages"]
    assert not any(isinstance(b, dict) and b.get("type") == "opaque" for m in third for b in (m.get("content") or []))
    assert len(third) == len(second) + 1  # + the assistant message, + the new user message, − the reasoning


@pytest.mark.parametrize("cut", [1, 37, 200, 555])
def test_truncated_session_files_do_not_crash(tmp_path, cut):
    for name, recs in (("s.jsonl", claude_transcript()), ("rollout.jsonl", codex_rollout())):
        data = b"".join(json.dumps(r).encode() + b"\n" for r in recs)
        f = tmp_path / f"{cut}-{name}"
        f.write_bytes(data[:len(data) - cut])
        con = api.open_db(str(tmp_path / f"{cut}-{name}.duckdb"))
        s = api.ingest(con, [str(f)])
        assert s.reconciles() and s.lines >= s.loaded


def test_subagent_files_and_compaction(tmp_path):
    """A subagent's own file is a stream of its session; a compaction boundary starts the
    conversation again from its summary."""
    project = tmp_path / "projects" / "-home-me-p"
    (project / "s1" / "subagents").mkdir(parents=True)
    main = claude_transcript()[:7]
    main += [_cc("cb", None, "system", 11, subtype="compact_boundary", logicalParentUuid="a3"),
             _cc("cs", "cb", "user", 12, "summary of the conversation", isCompactSummary=True),
             _cc("a9", "cs", "assistant", 13, [{"type": "text", "text": "go on"}], mid="m9")]
    _write_jsonl(project / "s1.jsonl", main)
    _write_jsonl(project / "s1" / "subagents" / "agent-ag7.jsonl",
                 [_cc("x1", None, "user", 20, "explore", isSidechain=True, agentId="ag7"),
                  _cc("x2", "x1", "assistant", 21, [{"type": "text", "text": "found"}], mid="m20",
                      isSidechain=True, agentId="ag7")])
    con = api.open_db(str(tmp_path / "db.duckdb"))
    s = api.ingest(con, [str(tmp_path / "projects")])
    assert (s.files, s.loaded, s.rejected) == (2, 4, 0) and s.reconciles()
    sessions = [r[0] for r in con.execute("SELECT session FROM requests ORDER BY ts_us").fetchall()]
    assert sessions == ["s1", "s1", "s1", "s1/ag7"]
    (after,) = con.execute("SELECT b.body FROM request_bodies b JOIN requests USING (request_id) "
                           "WHERE line_no = 10 AND session = 's1'").fetchone()
    assert json.loads(after)["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "summary of the conversation"}]}]


def test_gzipped_transcript_is_detected(tmp_path):
    f = tmp_path / "s1.jsonl.gz"
    f.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in claude_transcript())))
    con = api.open_db(str(tmp_path / "db.duckdb"))
    assert api.ingest(con, [str(f)]).loaded == 3


# ----------------------------------------------------------------------------- provider rules, by hand

def _row(rid, ts, tokens, session="s", model="claude-opus-4-6", up=None, uc=0, w1h=None, write=None,
         hidden_key=None, backend=None, key=None):
    toks = np.asarray(tokens, dtype=np.int64)
    return RequestRow(rid, ts, "t", key, session, model, "claude-code", "claude-code", hidden_key, backend,
                      up if up is not None else len(toks), uc, write, w1h, toks, len(toks))


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
    _write_jsonl(f, claude_transcript())
    con = api.open_db(str(tmp_path / "db.duckdb"))
    api.ingest(con, [str(f)])
    rows = realised(con)
    [auto] = api.profile_sweep(con, ["auto"]).to_dicts()
    assert auto["profile"] == "auto/anthropic-claude-code"
    overall = [r for r in rows if r["model"] == "*"][0]
    assert auto["hit_tokens"] / auto["prompt_tokens"] == pytest.approx(overall["predicted_hit_ratio"])
    assert auto["prompt_tokens"] == overall["prompt_tokens"]


# ----------------------------------------------------------------------------- the shared real sessions

@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/agents is not here")
@pytest.mark.parametrize("client,provider,limit", [("claude-code", "anthropic", 2.0), ("codex", "openai", 2.0),
                                                   ("gemini", "google", 5.0)])
def test_realised_on_shared_sessions(tmp_path, client, provider, limit):
    out = subprocess.run([sys.executable, "-m", "replay.cli.main", "realised", str(SHARED / client), "--db",
                          str(tmp_path / "db.duckdb"), "--json"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
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
    for f in sorted((SHARED / client).glob("*.gz")):
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


# ----------------------------------------------------------------------------- fuzzed session files

CANARY = "CANARY-prompt-text-7f3a"


def _mutate_value(rng, v):
    return rng.choice([None, 7, "x", [], {}, True, CANARY, [CANARY], {"text": CANARY}, -1.5, v])


def _mutate(rng, rec):
    """A random change to one parsed line: a key dropped, a value of another type, a
    nested value replaced (parentUuid, message, usage, payload ...)."""
    rec = json.loads(json.dumps(rec))
    paths = []

    def walk(obj, path):
        if isinstance(obj, dict):
            for k, v in obj.items():
                paths.append(path + (k,))
                if len(path) < 4:
                    walk(v, path + (k,))
        elif isinstance(obj, list) and obj and len(path) < 4:
            paths.append(path + (0,))
            walk(obj[0], path + (0,))
    walk(rec, ())
    if not paths:
        return rec
    path = rng.choice(paths)
    parent = rec
    for k in path[:-1]:
        parent = parent[k]
    if rng.random() < 0.3 and isinstance(parent, dict):
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = _mutate_value(rng, parent[path[-1]])
    return rec


@pytest.mark.parametrize("seed", range(int(os.environ.get("REPLAY_FUZZ_SEEDS", "12"))))
def test_fuzzed_session_files_account_for_every_line(tmp_path, seed):
    import random
    rng = random.Random(seed)
    for name, recs in (("s.jsonl", claude_transcript()), ("rollout.jsonl", codex_rollout())):
        recs = [dict(r, canary=CANARY) if rng.random() < 0.2 else r for r in recs]
        lines = []
        for r in recs * 2:
            roll = rng.random()
            if roll < 0.35:
                lines.append(json.dumps(_mutate(rng, r)).encode())
            elif roll < 0.45:
                raw = json.dumps(r).encode()
                lines.append(raw[:rng.randrange(1, len(raw))])  # a cut line
            elif roll < 0.5:
                lines.append(b'{"type": "assistant", "message": ' + CANARY.encode())
            elif roll < 0.55:
                continue  # a lost line: its children's parent is missing
            else:
                lines.append(json.dumps(r).encode())
        rng.shuffle(lines) if seed % 3 == 0 else None
        f = tmp_path / f"{seed}-{name}"
        f.write_bytes(b"\n".join(lines) + (b"\n" if seed % 2 else b""))
        con = api.open_db(str(tmp_path / f"{seed}-{name}.duckdb"))
        s = api.ingest(con, [str(f)])
        assert s.reconciles() and s.lines == len(lines)
        (lines_n, loaded, context, rejected), = con.execute(
            "SELECT lines, loaded, context, rejected FROM sources").fetchall()
        assert lines_n == loaded + context + rejected == len(lines)
        rej = con.execute("SELECT reason, detail, line_no FROM rejects").fetchall()
        assert len(rej) == rejected
        assert all(re_code(reason) and CANARY not in (detail or "") for reason, detail, _ in rej)
        loaded_lines = [ln for (ln,) in con.execute("SELECT line_no FROM requests").fetchall()]
        assert len(set(loaded_lines)) == len(loaded_lines) == loaded
        assert not set(loaded_lines) & {ln for *_, ln in rej}
        api.tokenize(con)  # every loaded request rendered and tokenized, or set aside with its reason
        tokenized, aside = con.execute("SELECT (SELECT count(*) FROM prompts), (SELECT count(*) FROM set_aside)"
                                       ).fetchone()
        assert tokenized + aside == loaded


def re_code(reason: str) -> bool:
    import re
    return re.fullmatch("[a-z_]+", reason) is not None
