"""Chat request logs (Anthropic Messages, OpenAI Chat Completions) → `requests` row.

A chat record is either wrapped in an envelope (``{"timestamp", "request",
"response", ...}``) or flat (the request body itself plus log metadata). Here:
splitting a record into body and response, the evidence for one API or the
other (`chat_scores`), the body checks, the usage columns of either API, and
the conversion itself.
"""

from __future__ import annotations

import json
from itertools import repeat
from typing import Any

from replay.readers.fields import (MAX_LIST_ITEMS, SESSION_NAMES, TENANT_NAMES, TS_NAMES, Options, Reject, as_str,
                                   common_attrs, int_or_none, get_path, type_name)
from replay.readers.diagnostics import diagnostics_row
from replay.readers.timestamps import record_ts
from replay.store.jsontext import dumps

# Keys of a *flat* chat record that are log metadata, not request body.
_ENVELOPE_KEYS = frozenset(TS_NAMES + TENANT_NAMES + SESSION_NAMES + ("response", "usage"))


# ----------------------------------------------------------------- detection

def _as_obj(v: Any) -> Any:
    """A JSON object logged as a string (some loggers do) → dict; otherwise unchanged."""
    if isinstance(v, str) and v[:1] == "{":
        try:
            return json.loads(v)
        except (ValueError, RecursionError):
            return v
    return v


def chat_parts(rec: dict, flat_skip: frozenset = frozenset()) -> tuple[Any, Any, bool]:
    """(body, response, wrapped) of a chat record."""
    if "request" in rec:
        return _as_obj(rec["request"]), _as_obj(rec.get("response")), True
    body = {k: v for k, v in rec.items() if k not in _ENVELOPE_KEYS or k in flat_skip}
    return body, _as_obj(rec.get("response")), False


def usage_of(rec: dict, response: Any) -> Any:
    if isinstance(response, dict) and isinstance(response.get("usage"), dict):
        return response["usage"]
    u = rec.get("usage")
    return u if isinstance(u, dict) else None


def chat_scores(body: dict, response: Any, usage: Any) -> tuple[int, int]:
    """Evidence (anthropic, openai) that a chat request body is one API or the other."""
    a = o = 0
    if "system" in body:
        a += 3
    if "prompt_cache_key" in body:
        o += 3
    for k in ("max_completion_tokens", "response_format", "n", "stream_options", "user", "logprobs",
              "frequency_penalty", "presence_penalty", "parallel_tool_calls", "reasoning_effort"):
        if k in body:
            o += 1
    for k in ("stop_sequences", "top_k", "thinking"):
        if k in body:
            a += 1
    md = body.get("metadata")
    if isinstance(md, dict) and "user_id" in md:
        a += 1
    msgs = body.get("messages")
    if isinstance(msgs, list):
        for i, m in enumerate(msgs[:50]):
            if not isinstance(m, dict):
                continue
            role = m.get("role")
            if role in ("system", "developer", "tool", "function"):
                o += 3
            if "tool_calls" in m or "tool_call_id" in m:
                o += 2
            c = m.get("content")
            if isinstance(c, list):
                for b in c[:20]:
                    if not isinstance(b, dict):
                        continue
                    t = b.get("type")
                    if t in ("tool_use", "tool_result", "thinking", "redacted_thinking", "document"):
                        a += 2
                    elif t == "image" and "source" in b:
                        a += 2
                    elif t in ("image_url", "input_audio", "file"):
                        o += 2
                    if "cache_control" in b:
                        a += 1
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        if "input_schema" in tools[0]:
            a += 2
        if tools[0].get("type") == "function" and "function" in tools[0]:
            o += 2
    if isinstance(usage, dict):
        if "input_tokens" in usage or "cache_read_input_tokens" in usage:
            a += 3
        if "prompt_tokens" in usage or "completion_tokens" in usage:
            o += 3
    if isinstance(response, dict):
        if "choices" in response:
            o += 3
        if response.get("type") == "message" or isinstance(response.get("content"), list):
            a += 2
    return a, o


# ----------------------------------------------------------------- conversion

def _usage_anthropic(u: dict) -> dict:
    inp = int_or_none(u.get("input_tokens"))
    cr = int_or_none(u.get("cache_read_input_tokens"))
    cw = int_or_none(u.get("cache_creation_input_tokens"))
    prompt = None if inp is None and cr is None and cw is None else (inp or 0) + (cr or 0) + (cw or 0)
    return {
        "usage_prompt_tokens": prompt,
        "usage_cached_tokens": cr,
        "usage_cache_write_tokens": cw,
        "usage_output_tokens": int_or_none(u.get("output_tokens")),
    }


def _usage_openai(u: dict, prefer_deepseek: bool = False) -> dict:
    det = u.get("prompt_tokens_details")
    details = int_or_none(det.get("cached_tokens")) if isinstance(det, dict) else None
    deepseek = int_or_none(u.get("prompt_cache_hit_tokens"))
    cached = (deepseek if deepseek is not None else details) if prefer_deepseek else (
        details if details is not None else deepseek)
    return {
        "usage_prompt_tokens": int_or_none(u.get("prompt_tokens")),
        "usage_cached_tokens": cached,
        "usage_cache_write_tokens": None,
        "usage_output_tokens": int_or_none(u.get("completion_tokens")),
    }


def usage_row(u: Any, prefer_deepseek: bool = False) -> dict:
    """Usage columns from either API's usage object (whichever keys it has)."""
    if not isinstance(u, dict):
        return {}
    if "input_tokens" in u or "cache_read_input_tokens" in u or "cache_creation_input_tokens" in u:
        return _usage_anthropic(u)
    return _usage_openai(u, prefer_deepseek)


_DICT = frozenset((dict,))
_CONTENT = frozenset((str, list, type(None)))


def _check_chat_body(body: Any, where: str) -> None:
    if not isinstance(body, dict):
        raise Reject("wrong_type", f"field '{where}' is {type_name(body)}, expected an object (the request body)")
    msgs = body.get("messages")
    if msgs is None and body.get("system") is None and body.get("tools") is None:
        raise Reject("no_prompt", "no 'messages', 'system' or 'tools' in the request body")
    if msgs is not None:
        if not isinstance(msgs, list):
            raise Reject("wrong_type", f"field 'messages' is {type_name(msgs)}, expected an array")
        # the common case in C-level loops (an agent resends hundreds of messages);
        # the loop below finds the offending message otherwise
        checked = (set(map(type, msgs)) <= _DICT
                   and set(map(type, map(dict.get, msgs, repeat("content")))) <= _CONTENT)
        for i, m in enumerate(() if checked else msgs):
            if not isinstance(m, dict):
                raise Reject("wrong_type", f"messages[{i}] is {type_name(m)}, expected an object")
            c = m.get("content")
            if c is not None and not isinstance(c, (str, list)):
                raise Reject("wrong_type", f"messages[{i}].content is {type_name(c)}, expected a string or an array")
    sysv = body.get("system")
    if sysv is not None and not isinstance(sysv, (str, list)):
        raise Reject("wrong_type", f"field 'system' is {type_name(sysv)}, expected a string or an array of blocks")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise Reject("wrong_type", f"field 'tools' is {type_name(tools)}, expected an array")
    if (not msgs) and not sysv and not tools:
        raise Reject("no_prompt", "the request body has empty 'messages' and no 'system' or 'tools'")
    # each message and tool is a blob of the body, with a separator beside it
    if 2 * (len(msgs or ()) + len(tools or ())) > MAX_LIST_ITEMS:
        raise Reject("too_large", f"the request body has {len(msgs or ()):,} messages and {len(tools or ()):,} tools, "
                                  f"more than the {MAX_LIST_ITEMS // 2:,} allowed")


def convert_chat(rec: dict, fmt: str, opts: Options) -> dict:
    """anthropic / openai record (wrapped in an envelope with `request`, or flat) → row."""
    # In a flat OpenAI record `user` is the body's end-user field, not a tenant.
    body_keys = frozenset(("user",)) if fmt == "openai" else frozenset()
    body, response, wrapped = chat_parts(rec, body_keys)
    ts = record_ts(rec, opts)
    _check_chat_body(body, "request" if wrapped else "record")
    row = common_attrs(rec, opts, frozenset() if wrapped else body_keys)
    if row["prompt_cache_key"] is None and "prompt_cache_key" not in opts.fields:
        row["prompt_cache_key"] = as_str(body.get("prompt_cache_key"), "request.prompt_cache_key")
    row["ts_us"] = ts
    if "user_id" in opts.fields:
        uid = get_path(rec, opts.fields["user_id"])
        row["user_id"] = as_str(uid, opts.fields["user_id"])
    elif fmt == "anthropic":
        md = body.get("metadata")
        row["user_id"] = as_str(md.get("user_id"), "metadata.user_id") if isinstance(md, dict) else None
    else:
        row["user_id"] = as_str(body.get("user"), "user")
    if "model" in opts.fields:
        row["model"] = as_str(get_path(rec, opts.fields["model"]), opts.fields["model"])
    else:
        model = body.get("model")
        if model is None and isinstance(response, dict):
            model = response.get("model")
        row["model"] = as_str(model, "model")
    if opts.split_body:
        row["body_obj"] = body
    else:
        row["body"] = dumps(body)
    out = None
    if isinstance(response, dict):
        if isinstance(response.get("choices"), list) and response["choices"]:
            ch = response["choices"][0]
            if isinstance(ch, dict) and ch.get("message") is not None:
                out = dumps(ch["message"])
        elif isinstance(response.get("content"), list):
            out = dumps(response["content"])
    row["output"] = out
    usage = usage_of(rec, response)
    row.update(usage_row(usage))
    row.update(diagnostics_row(response, usage, rec))  # the provider's cache verdict, where logged
    return row
