"""Agent requests in wire form: the neutral conversation rendered as Anthropic Messages
or OpenAI chat-completions request bodies and response outputs."""

from __future__ import annotations

from typing import Any

from replay.synth.text import compact


def render_agent(fmt, tool_json, blocks, conv, amsg, model, tenant, session, user_hash, key):
    """(request body, response output) of one agent call in ``fmt`` (anthropic | openai).

    ``blocks`` are the system prompt's (text, cache breakpoint) pieces; ``conv`` the
    conversation so far and ``amsg`` this call's answer, in the neutral form the
    sessions keep (``role`` user / assistant / tool).
    """
    if fmt == "anthropic":
        system = []
        for text, cc in blocks:
            b: dict[str, Any] = {"type": "text", "text": text}
            if cc:
                b["cache_control"] = {"type": "ephemeral"}
            system.append(b)
        msgs = [_anth_msg(m) for m in conv]
        # moving breakpoint on the last message (metadata only: not rendered)
        last = msgs[-1]
        if isinstance(last["content"], list) and last["content"]:
            last["content"][-1] = dict(last["content"][-1], cache_control={"type": "ephemeral"})
        body = {"model": model, "max_tokens": 32000, "system": system, "tools": tool_json,
                "messages": msgs,
                "metadata": {"user_id": f"user_{user_hash}_account__session_{session}"}}
        output = _anth_msg(amsg)["content"]
        return body, output
    system_text = "\n\n".join(text for text, _cc in blocks)
    msgs = [{"role": "system", "content": system_text}]
    for m in conv:
        msgs.extend(_oai_msgs(m))
    body: dict[str, Any] = {"model": model, "messages": msgs, "tools": tool_json}
    if key is not None:
        body["prompt_cache_key"] = key
    body["user"] = tenant
    output = _oai_msgs(amsg)[0]
    return body, output


def _anth_msg(m: dict) -> dict:
    if m["role"] == "user":
        return {"role": "user", "content": [{"type": "text", "text": m["text"]}]}
    if m["role"] == "assistant":
        content: list[dict] = [{"type": "text", "text": m["text"]}]
        for c in m["calls"]:
            content.append({"type": "tool_use", "id": c["id"], "name": c["tool"].name, "input": c["input"]})
        return {"role": "assistant", "content": content}
    content = []
    for x in m["results"]:
        b = {"type": "tool_result", "tool_use_id": x["id"], "content": x["content"]}
        if x["is_error"]:
            b["is_error"] = True
        content.append(b)
    return {"role": "user", "content": content}


def _oai_msgs(m: dict) -> list[dict]:
    if m["role"] == "user":
        return [{"role": "user", "content": m["text"]}]
    if m["role"] == "assistant":
        d: dict[str, Any] = {"role": "assistant", "content": m["text"]}
        if m["calls"]:
            d["tool_calls"] = [{"id": c["id"], "type": "function",
                                "function": {"name": c["tool"].name, "arguments": compact(c["input"])}}
                               for c in m["calls"]]
        return [d]
    return [{"role": "tool", "tool_call_id": x["id"], "content": x["content"]} for x in m["results"]]
