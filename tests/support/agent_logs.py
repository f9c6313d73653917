"""Hand-made coding-agent session files: a Claude Code transcript and a Codex
rollout with every kind of line the readers meet (the reader and realised tests)."""

from __future__ import annotations

import json
from pathlib import Path


def cc_line(uuid, parent, typ, ts, content=None, mid=None, model="claude-opus-4-6", usage=None, **extra):
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
        cc_line("u1", None, "user", 1, "fix the bug"),
        cc_line("a1", "u1", "assistant", 2, [{"type": "text", "text": "looking"}], mid="m1"),
        cc_line("a2", "a1", "assistant", 3, [tool_use], mid="m1"),            # the same call: context
        cc_line("p1", "a2", "progress", 4, data={}),
        cc_line("u2", "p1", "user", 5, [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]),
        cc_line("a3", "u2", "assistant", 6, [{"type": "text", "text": "done"}], mid="m2"),
        cc_line("sy", "a3", "system", 7, subtype="stop_hook_summary"),
        cc_line("a4", "u2", "assistant", 8, [{"type": "text", "text": "x"}], mid="m3", model="<synthetic>"),
        cc_line("sc1", None, "user", 9, "subtask", isSidechain=True, agentId="ag1"),
        cc_line("sc2", "sc1", "assistant", 10, [{"type": "text", "text": "ok"}], mid="m4", isSidechain=True,
            agentId="ag1"),
    ]


def write_jsonl(path: Path, recs: list, tail: bytes = b"") -> None:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in recs) + tail)



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
