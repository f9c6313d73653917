"""What the gateway and tracing exports share (``otel``, ``litellm``, ``langfuse``).

Their message bodies are OpenAI- or Anthropic-shaped (or OpenTelemetry's
``parts``, turned into OpenAI's shape here), so every one of them ends in the
existing chat converter (:func:`replay.readers.chat.convert_chat`): rendering,
tokenizing and the provider diagnostics are those of a chat log. Here: the
parts → OpenAI conversion, JSON values logged as strings, the ids taken from
the export (a ``--field`` mapping may name another), and :func:`chat_row`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from replay.readers.chat import chat_scores, convert_chat
from replay.readers.fields import MISSING, Options, Reject, as_str, get_path, int_or_none, type_name
from replay.store.jsontext import dumps

_DIGITS = re.compile(r"[0-9]{1,18}")  # (an int64 count; not int() of any string: it takes other digits too)


def json_value(v: Any, fname: str) -> Any:
    """A JSON array/object logged as a string (exports often do) → the value; others unchanged."""
    if isinstance(v, str) and v.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(v)
        except ValueError:
            raise Reject("wrong_type", f"field '{fname}' is a string that is not valid JSON") from None
    return v


def optional(v: Any, fname: str) -> Any:
    """:func:`json_value` for a field the request does not need (a response, metadata):
    one that cannot be read is left out (None), not a reason to reject the request."""
    try:
        return json_value(v, fname)
    except Reject:
        return None


def first(d: Any, *names: str) -> Any:
    """The first of ``names`` present (not null, not empty) in ``d``, else MISSING."""
    if not isinstance(d, dict):
        return MISSING
    for n in names:
        v = d.get(n)
        if v is not None and v != "":
            return v
    return MISSING


# ----------------------------------------------------------------- OpenTelemetry's parts → OpenAI

def _call_args(v: Any) -> str:
    return v if isinstance(v, str) else dumps(v if v is not None else {})


def parts_message(m: dict, where: str) -> list[dict]:
    """One OpenTelemetry GenAI message (``{"role", "parts": [...]}``) → OpenAI chat
    messages: text parts become the content, ``tool_call`` parts the assistant's
    ``tool_calls``, each ``tool_call_response`` part a ``tool`` message; any other
    part (blob, file, uri, reasoning…) stays a content block as logged."""
    parts = m.get("parts")
    if not isinstance(parts, list):
        raise Reject("wrong_type", f"{where}.parts is {type_name(parts)}, expected an array")
    role = m.get("role") if isinstance(m.get("role"), str) else "user"
    blocks: list = []
    calls: list = []
    responses: list = []
    for i, p in enumerate(parts):
        if not isinstance(p, dict):
            raise Reject("wrong_type", f"{where}.parts[{i}] is {type_name(p)}, expected an object")
        t = p.get("type")
        if t == "text":
            blocks.append({"type": "text", "text": p.get("content") if isinstance(p.get("content"), str) else ""})
        elif t == "tool_call":
            calls.append({"id": p.get("id"), "type": "function",
                          "function": {"name": p.get("name"), "arguments": _call_args(p.get("arguments"))}})
        elif t == "tool_call_response":
            r = p.get("response", p.get("result"))
            responses.append({"role": "tool", "tool_call_id": p.get("id"),
                              "content": r if isinstance(r, str) else dumps(r)})
        else:
            blocks.append(p)
    out: list[dict] = []
    if blocks or calls or not responses:
        content: Any = blocks[0]["text"] if len(blocks) == 1 and blocks[0].get("type") == "text" else blocks
        msg: dict = {"role": role, "content": content if blocks else ("" if not calls else None)}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out + responses


def openai_messages(msgs: Any, where: str) -> list:
    """A list of messages, OpenTelemetry-shaped (``parts``) or already a chat API's."""
    if not isinstance(msgs, list):
        raise Reject("wrong_type", f"field '{where}' is {type_name(msgs)}, expected an array of messages")
    out: list = []
    for i, m in enumerate(msgs):
        if isinstance(m, dict) and "parts" in m and "content" not in m:
            out += parts_message(m, f"{where}[{i}]")
        else:
            out.append(m)
    return out


def system_text(v: Any, where: str) -> str | list:
    """OpenTelemetry's ``gen_ai.system_instructions`` (parts) → a system message's content."""
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise Reject("wrong_type", f"field '{where}' is {type_name(v)}, expected an array of parts")
    texts = [p.get("content") for p in v if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) == len(v) and all(isinstance(t, str) for t in texts):
        return texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    return [p if not (isinstance(p, dict) and p.get("type") == "text") else {"type": "text", "text": p.get("content")}
            for p in v]


def openai_tools(v: Any, where: str) -> list:
    """OpenTelemetry's ``gen_ai.tool.definitions`` (``{"type": "function", "name", …}``)
    → OpenAI tools (``{"type": "function", "function": {…}}``); others as logged."""
    if not isinstance(v, list):
        raise Reject("wrong_type", f"field '{where}' is {type_name(v)}, expected an array of tool definitions")
    out = []
    for t in v:
        if isinstance(t, dict) and t.get("type", "function") == "function" and "function" not in t \
                and "name" in t and "input_schema" not in t:
            out.append({"type": "function", "function": {k: x for k, x in t.items() if k != "type"}})
        else:
            out.append(t)
    return out


# ----------------------------------------------------------------- the row

def lookup(norm: dict, opts: Options, key: str, default: Any) -> tuple[str, Any]:
    """(field name, value) of an attribute: a ``--field`` mapping (a dotted path
    into the export's normalized record; ``attributes.<name>`` reaches an
    attribute whose name has dots), else ``default``."""
    path = opts.fields.get(key)
    if path is None:
        return key, default
    v = get_path(norm, path)
    if v is MISSING:
        for prefix in ("attributes.", "resource."):
            inner = norm.get(prefix[:-1])
            if path.startswith(prefix) and isinstance(inner, dict):
                v = inner.get(path[len(prefix):], MISSING)
    return path, (None if v is MISSING or v == "" else v)


def chat_row(ts_us: int, body: dict, response: Any, ids: dict, opts: Options, where: str = "request",
             norm: dict | None = None, usage: dict | None = None) -> dict:
    """The chat converter's row for one exported request.

    ``ids``: tenant, session, prompt_cache_key, user_id, model as the export
    names them (``--field`` mappings over ``norm`` win); ``usage``: the usage
    columns when the export's own fields give them (else the response's usage).
    The dialect (anthropic / openai) is the body's, as for a chat log.
    """
    if not isinstance(body, dict):
        raise Reject("wrong_type", f"field '{where}' is {type_name(body)}, expected the request body")
    norm = norm if norm is not None else {}
    got = {}
    for key, default in ids.items():
        fname, v = lookup(norm, opts, key, default)
        got[key] = as_str(v, fname)
    if got.get("model") is not None and "model" not in body:
        body = dict(body, model=got["model"])
    resp = response if isinstance(response, dict) else None
    rec = {"timestamp": ts_us, "tenant": got.get("tenant") or "default", "request": body}
    if resp is not None:
        rec["response"] = resp
    a, o = chat_scores(body, resp, (resp or {}).get("usage"))
    local = dataclasses.replace(opts, fields={}, time_unit="us", file_unit="us")
    row = convert_chat(rec, "anthropic" if a > o else "openai", local)
    for key in ("session", "user_id", "model", "prompt_cache_key"):
        if got.get(key) is not None:
            row[key] = got[key]
    if usage:
        row.update({k: v for k, v in usage.items() if v is not None or k not in row})
    return row


def first_tokens(d: dict, *names: str) -> int | None:
    """The first of ``names`` in ``d`` holding a token count, else None."""
    for n in names:
        v = tokens(d.get(n))
        if v is not None:
            return v
    return None


def tokens(v: Any) -> int | None:
    """A token count (int, integral float or digit string), else None."""
    if isinstance(v, str) and _DIGITS.fullmatch(v.strip()):
        return int(v.strip())
    n = int_or_none(v)
    return n if n is not None and n >= 0 else None
