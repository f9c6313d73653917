"""Coding agents' session files (Claude Code transcripts, Codex rollouts): every
line loaded, counted as context or rejected with a reason; requests and their
prompts as the client sent them; fuzzed files that never crash."""

from __future__ import annotations

import gzip
import json
import os
import random
import re

import pytest

from replay import api

from support.agent_logs import cc_line, claude_transcript, codex_rollout, write_jsonl



def test_claude_code_transcript_lines_reconcile(tmp_path):
    f = tmp_path / "s1.jsonl"
    write_jsonl(f, claude_transcript(), b'[1, 2]\n{"type": "assistant", "sessi')  # a non-object, a cut line
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


def test_codex_rollout_calls_and_reasoning(tmp_path):
    f = tmp_path / "rollout-1.jsonl"
    write_jsonl(f, codex_rollout())
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
    main += [cc_line("cb", None, "system", 11, subtype="compact_boundary", logicalParentUuid="a3"),
             cc_line("cs", "cb", "user", 12, "summary of the conversation", isCompactSummary=True),
             cc_line("a9", "cs", "assistant", 13, [{"type": "text", "text": "go on"}], mid="m9")]
    write_jsonl(project / "s1.jsonl", main)
    write_jsonl(project / "s1" / "subagents" / "agent-ag7.jsonl",
                 [cc_line("x1", None, "user", 20, "explore", isSidechain=True, agentId="ag7"),
                  cc_line("x2", "x1", "assistant", 21, [{"type": "text", "text": "found"}], mid="m20",
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
    return re.fullmatch("[a-z_]+", reason) is not None
