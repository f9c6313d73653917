"""A logged body in the message shape Hugging Face chat templates read.

Chat templates (``--chat-template``) read OpenAI-style messages: ``role``,
``content`` (a string, or a list of ``{"type": "text", "text"}`` /
``{"type": "image"}`` blocks), ``tool_calls`` (``{"id", "type": "function",
"function": {"name", "arguments"}}``), ``tool_call_id``, ``reasoning_content``,
and a ``tools`` list of ``{"type": "function", "function": {...}}``. The
mapping, per format (pure functions, no I/O):

* **openai** (chat completions; trajectories): each message as logged, keys
  whose value is null dropped (as ``apply_chat_template`` does); a tool call's
  ``function.arguments``, logged as a JSON string, is parsed into an object
  when it is one (as vLLM does before rendering, so templates can ``tojson``
  it; key order kept), else left a string. Tools as logged.
* **anthropic**: a top-level ``system`` becomes a first ``system`` message;
  ``tool_result`` blocks of a user message become ``tool`` messages (in
  order, before the rest of that message; their ``tool_use_id`` as
  ``tool_call_id``); an assistant's ``thinking`` blocks become its
  ``reasoning_content`` (joined with ``"\\n"``; ``redacted_thinking`` is opaque
  and dropped), its ``tool_use`` blocks its ``tool_calls`` (``input`` as the
  arguments object). Tools ``{name, description, input_schema}`` become
  ``{"type": "function", "function": {name, description, parameters}}``.
* **responses** items (``input`` lists): ``function_call`` items become an
  assistant message's tool calls, ``function_call_output`` items ``tool``
  messages, ``instructions`` a first ``system`` message.

Content, in every format: when the template iterates over a message's content
(``blocks=True``, see ``replay.text.render_template``) text blocks become
``{"type": "text", "text"}``, images ``{"type": "image"}`` (the template prints
what it prints for an image), other blocks are passed as logged without
``cache_control``; otherwise (a template that prints ``content`` as a string,
vLLM's "string" content format) the text blocks are joined with ``"\\n"`` and
images are left out (a text-only template has no way to print them).
``cache_control`` is never rendered.
"""

from __future__ import annotations

import json
from typing import Any

from replay.text.render import compact_json
from replay.text.template_bodies import Part

_TEXT = ("text", "input_text", "output_text")
_IMAGE = ("image", "image_url", "input_image")


def _block(block: Any, blocks: bool) -> Any:
    """One content block in template shape (None: left out)."""
    if isinstance(block, str):
        return {"type": "text", "text": block} if blocks else block
    if not isinstance(block, dict):
        return None
    typ = block.get("type")
    if typ in _TEXT or (typ is None and "text" in block):
        text = block.get("text", "")
        return {"type": "text", "text": text if isinstance(text, str) else compact_json(text)} if blocks else text
    if typ in _IMAGE:
        return {"type": "image"} if blocks else None
    clean = {k: v for k, v in block.items() if k != "cache_control"}
    return clean if blocks else compact_json(clean)


def content(value: Any, blocks: bool) -> Any:
    """A message's ``content`` in template shape."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return compact_json(value)
    got = [b for b in (_block(x, blocks) for x in value) if b is not None]
    return got if blocks else "\n".join(got)


class Written(dict):
    """What templates write as JSON (a call's arguments, a tool's parameters):
    mapped from a body part parsed once (:func:`_once`), it is the same object
    in every request that repeats the part and is never changed, so its JSON
    is written once (``_json``: ``render_template``'s ``tojson``)."""
    __slots__ = ("_json",)

    def __init__(self, value: dict):
        super().__init__(value)
        self._json: str | None = None


def _written(value: Any) -> Any:
    return Written(value) if type(value) is dict else value


def _arguments(args: Any) -> Any:
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return args
        return parsed if isinstance(parsed, dict) else args
    return args


def _openai_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    call = {k: v for k, v in call.items() if v is not None}
    fn = call.get("function")
    if isinstance(fn, dict):
        call["function"] = ({**fn, "arguments": _written(_arguments(fn.get("arguments")))} if "arguments" in fn
                            else dict(fn))
    return call


def _openai_message(msg: dict, blocks: bool) -> dict:
    out = {k: v for k, v in msg.items() if v is not None and k != "cache_control"}
    if "content" in out:
        out["content"] = content(out["content"], blocks)
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_openai_call(c) for c in out["tool_calls"]]
    return out


def _openai_messages(msg: dict, blocks: bool) -> list[dict]:
    return [_openai_message(msg, blocks)]


def _anthropic_message(msg: dict, blocks: bool) -> list[dict]:
    role = msg.get("role", "user")
    value = msg.get("content")
    if not isinstance(value, list):
        return [{"role": role, "content": content(value, blocks)}]
    out: list[dict] = []
    rest: list = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for b in value:
        typ = b.get("type") if isinstance(b, dict) else None
        if typ == "tool_result" or (isinstance(typ, str) and typ.endswith("_tool_result")):
            tool = {"role": "tool", "content": content(b.get("content", ""), blocks)}
            if b.get("tool_use_id") is not None:
                tool["tool_call_id"] = b["tool_use_id"]
            out.append(tool)
        elif typ == "thinking":
            reasoning.append(b.get("thinking", "") or "")
        elif typ == "redacted_thinking":
            continue
        elif typ in ("tool_use", "server_tool_use"):
            call = {"type": "function", "function": {"name": b.get("name"), "arguments": _written(b.get("input", {}))}}
            if b.get("id") is not None:
                call = {"id": b["id"], **call}
            calls.append(call)
        else:
            rest.append(b)
    if rest or (not out and not calls and not reasoning):
        main: dict = {"role": role, "content": content(rest, blocks)}
    elif calls or reasoning:
        main = {"role": role, "content": [] if blocks else ""}
    else:
        return out
    if reasoning:
        main["reasoning_content"] = "\n".join(reasoning)
    if calls:
        main["tool_calls"] = calls
    return out + [main]


def _anthropic_tool(tool: Any) -> Any:
    if not isinstance(tool, dict) or "input_schema" not in tool:
        return {k: v for k, v in tool.items() if k != "cache_control"} if isinstance(tool, dict) else tool
    fn = {"name": tool.get("name")}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    fn["parameters"] = _written(tool["input_schema"])
    return {"type": "function", "function": fn}


def _openai_tool(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    out = {k: v for k, v in tool.items() if k != "cache_control"}
    fn = out.get("function")
    if isinstance(fn, dict) and "parameters" in fn:
        out["function"] = {**fn, "parameters": _written(fn["parameters"])}
    return out


def _responses_items(items: list, blocks: bool) -> list[dict]:
    out: list[dict] = []
    for it in items:
        if not isinstance(it, dict):
            out.append({"role": "user", "content": content(it, blocks)})
            continue
        typ = it.get("type")
        if it.get("role") is None and typ == "function_call":
            call = {"type": "function", "function": {"name": it.get("name"),
                                                     "arguments": _arguments(it.get("arguments"))}}
            if it.get("call_id") is not None:
                call = {"id": it["call_id"], **call}
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif it.get("role") is None and typ == "function_call_output":
            tool = {"role": "tool", "content": content(it.get("output", ""), blocks)}
            if it.get("call_id") is not None:
                tool["tool_call_id"] = it["call_id"]
            out.append(tool)
        else:
            out.append(_openai_message(it, blocks))
    return out


def _once(fn, obj: Any, *args) -> Any:
    """``fn(obj, *args)``, kept on ``obj`` when it is a body part parsed once
    (``template_bodies.Part``: never changed, so neither is what it maps to)."""
    if type(obj) is not Part:
        return fn(obj, *args)
    key = (fn, *args)
    got = obj.derived.get(key)
    if got is None:
        got = obj.derived[key] = fn(obj, *args)
    return got


def template_messages(body: dict, fmt: str | None, blocks: bool) -> tuple[list[dict], list | None, list[int]]:
    """``(messages, tools, origin)`` of ``body`` in template shape; ``origin[j]``
    is the part (``replay.text.render``: ``1`` a top-level system, ``2 + k``
    logged message ``k``) template message ``j`` comes from."""
    messages: list[dict] = []
    origin: list[int] = []
    system = body.get("system")
    if system is None:
        system = body.get("instructions")
    if system is not None and system != "" and system != []:
        messages.append({"role": "system", "content": _once(content, system, blocks)})
        origin.append(1)
    logged = body.get("messages")
    if logged is None:
        inp = body.get("input", body.get("prompt"))
        logged = [{"role": "user", "content": inp}] if isinstance(inp, str) else (inp if isinstance(inp, list) else [])
    if isinstance(logged, dict):
        logged = [logged]
    anthropic = fmt == "anthropic"
    responses = body.get("messages") is None and isinstance(body.get("input"), list)
    for k, msg in enumerate(logged):
        if responses:
            got = _responses_items([msg], blocks)
        elif not isinstance(msg, dict):
            got = [{"role": "user", "content": content(msg, blocks)}]
        elif anthropic:
            got = _once(_anthropic_message, msg, blocks)
        else:
            got = _once(_openai_messages, msg, blocks)
        messages.extend(got)
        origin.extend([2 + k] * len(got))
    if responses:  # adjacent function calls of one turn are one assistant message
        messages, origin = _merge_calls(messages, origin)
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        tools = [_once(_anthropic_tool if anthropic else _openai_tool, t) for t in tools]
    else:
        tools = None
    return messages, tools, origin


def _merge_calls(messages: list[dict], origin: list[int]) -> tuple[list[dict], list[int]]:
    out: list[dict] = []
    src: list[int] = []
    for m, o in zip(messages, origin):
        prev = out[-1] if out else None
        if (prev is not None and prev.get("role") == "assistant" and m.get("role") == "assistant"
                and set(m) == {"role", "content", "tool_calls"} and m.get("content") == ""
                and "tool_calls" in prev and prev.get("content") == ""):
            prev["tool_calls"] = list(prev["tool_calls"]) + list(m["tool_calls"])
            continue
        out.append(m)
        src.append(o)
    return out, src
