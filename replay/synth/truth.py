"""Ground truth and usage: order the requests per file, compare each with the previous
request of its stream, and serialize the log lines (semantics in ``generator``'s docstring)."""

from __future__ import annotations

import json
import random

from replay.synth.plans import Req
from replay.synth.text import base62, compact, iso_ms

# order of causes by position in the rendered prompt (tools → system → messages)
_CAUSE_RANK = {
    "tool_order": 0,
    "json_key_order": 1,
    "tool_schema_change": 2,
    "rotating_header": 3,
    "per_user_data": 4,
    "timestamp": 5,
    "volatile_id": 6,
    "history_rewrite": 7,
}


def _pieces(req: Req) -> list[tuple[int, str]]:
    """(part, text) pieces in rendering order: 0 tools, 1 system, 2 messages."""
    b = req.body
    out: list[tuple[int, str]] = [(0, compact(t)) for t in b.get("tools") or ()]
    if req.fmt == "anthropic":
        for blk in b.get("system") or ():
            out.append((1, blk["text"]))
        msgs = b["messages"]
    else:
        msgs = b["messages"]
        if msgs and msgs[0]["role"] == "system":
            out.append((1, msgs[0]["content"]))
            msgs = msgs[1:]
    for m in msgs:
        out.append((2, "\x00" + m["role"]))
        c = m.get("content")
        if isinstance(c, str):
            out.append((2, c))
        elif isinstance(c, list):
            for blk in c:
                blk = {k: v for k, v in blk.items() if k != "cache_control"}
                out.append((2, blk["text"] if blk.get("type") == "text" else compact(blk)))
        for tc in m.get("tool_calls") or ():
            out.append((2, compact(tc["function"])))
    return out


def _shared(prev: list[tuple[int, str]], cur: list[tuple[int, str]]) -> tuple[int, str]:
    """(shared characters, where the shared prefix ends)."""
    n = 0
    for i, (a, b) in enumerate(zip(prev, cur)):
        if a == b:
            n += len(a[1])
            continue
        sa, sb = a[1], b[1]
        k = 0
        m = min(len(sa), len(sb))
        while k < m and sa[k] == sb[k]:
            k += 1
        return n + k, ("tools", "system", "messages")[min(a[0], b[0])]
    if len(prev) <= len(cur):
        return n, "end"
    return n, ("tools", "system", "messages")[prev[len(cur)][0]]


def _usage(req: Req, prompt_chars: int, shared: int, gap: float | None, rng: random.Random) -> dict:
    total = max(1, prompt_chars // 4)
    out_tok = max(1, req.out_chars // 4)
    read = shared // 4 if gap is not None else 0
    if req.fmt == "anthropic":
        if gap is None or gap > 300 or read < 1024:
            read = 0
        tail = min(total - read, max(1, len(compact(req.body["messages"][-1])) // 4))
        create = max(0, total - read - tail) if total >= 1024 else 0
        inp = total - read - create
        return {"input_tokens": inp, "cache_creation_input_tokens": create,
                "cache_read_input_tokens": read, "output_tokens": out_tok}
    if gap is None or gap > 600 or total < 1024:
        read = 0
    read = min(read, total - 1) // 128 * 128
    return {"prompt_tokens": total, "completion_tokens": out_tok, "total_tokens": total + out_tok,
            "prompt_tokens_details": {"cached_tokens": read}}


def finish_truth(reqs: list[Req], seed: int) -> None:
    """Order lines per file, assign line numbers, compute truth and usage."""
    rng = random.Random(seed * 13 + 3)
    by_file: dict[str, list[Req]] = {}
    for q in sorted(reqs, key=lambda q: (round(q.ts, 3), q.seq)):
        by_file.setdefault(q.file, []).append(q)
    for f in sorted(by_file):
        last: dict[str, tuple[Req, list]] = {}
        for i, q in enumerate(by_file[f], 1):
            q.line = i
            stream = q.session if q.session is not None else f"tenant:{q.tenant}"
            pcs = _pieces(q)
            chars = sum(len(p[1]) for p in pcs)
            prev = last.get(stream)
            if prev is None:
                causes, shared, cut, gap, prev_line = [], 0, None, None, None
            else:
                pq, ppcs = prev
                causes = [c for c in q.sig if c in pq.sig and q.sig[c] != pq.sig[c]]
                causes.sort(key=_CAUSE_RANK.__getitem__)
                shared, cut = _shared(ppcs, pcs)
                gap = round(q.ts, 3) - round(pq.ts, 3)
                prev_line = pq.line
            q.truth = {"file": f + ".jsonl", "line": i, "session": q.session, "tenant": q.tenant,
                       "causes": causes, "first_in_session": prev is None, "stream": stream,
                       "prev_line": prev_line, "kind": q.kind, "prompt_chars": chars,
                       "shared_chars": shared, "cut": cut}
            usage = _usage(q, chars, shared, gap, rng)
            if q.fmt == "anthropic":
                q.response = {"id": "msg_01" + base62(rng, 22), "type": "message", "role": "assistant",
                              "model": q.model, "content": q.output,
                              "stop_reason": "tool_use" if any(b.get("type") == "tool_use" for b in q.output) else "end_turn",
                              "usage": usage}
            else:
                q.response = {"id": "chatcmpl-" + base62(rng, 29), "object": "chat.completion", "model": q.model,
                              "choices": [{"index": 0, "message": q.output,
                                           "finish_reason": "tool_calls" if q.output.get("tool_calls") else "stop"}],
                              "usage": usage}
            last[stream] = (q, pcs)
        by_file[f] = by_file[f]
    reqs[:] = [q for f in sorted(by_file) for q in by_file[f]]


def log_line(q: Req) -> str:
    if q.fmt == "anthropic":
        rec = {"timestamp": iso_ms(q.ts), "tenant": q.tenant, "session": q.session,
               "request": q.body, "response": q.response}
    else:
        rec = {"timestamp": round(q.ts, 3), "tenant": q.tenant, "session": q.session,
               "request": q.body, "response": q.response}
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
