"""OpenTelemetry exports of GenAI spans (``otel``) → one `requests` row per model call.

Input: the OTLP JSON encoding (what the collector's file exporter and
``OTLPSpanExporter`` JSON write) — a line or document
``{"resourceSpans": [{"resource": {"attributes": [...]}, "scopeSpans": [{"spans":
[...]}]}]}`` holding many spans, each span one *unit* (loaded or rejected, so
``lines = loaded + rejected`` counts spans) — or one span per line (OTLP JSON,
or the SDK console exporter's ``{"context": {"trace_id"}, "start_time",
"attributes": {...}}``). Attributes are OTLP ``[{"key", "value": {"stringValue"
| "intValue" | "doubleValue" | "boolValue" | "arrayValue" | "kvlistValue"}}]``
or a plain object.

A span is a model call when its ``gen_ai.operation.name`` is ``chat``,
``text_completion`` or ``generate_content`` (or, without one, it has a request
model or input messages); other spans (tools, agents, embeddings, HTTP) are
rejected as ``not_llm_span``. Fields (semantic conventions for GenAI, and the
deprecated ones instrumentations still write):

* time: ``startTimeUnixNano`` (ns, always: ``--time-unit`` does not apply) or
  the console exporter's ISO ``start_time`` → µs;
* the prompt: ``gen_ai.input.messages`` (``[{"role", "parts": [...]}]``, as an
  array or a JSON string) with ``gen_ai.system_instructions`` (a leading system
  message) and ``gen_ai.tool.definitions`` (the tools); else the deprecated
  ``gen_ai.prompt`` (a JSON string of chat messages; also the attribute of a
  ``gen_ai.content.prompt`` span event), else flat ``gen_ai.prompt.<i>.role`` /
  ``.content`` / ``.tool_call_id`` / ``.tool_calls.<j>.{id,name,arguments}``
  (OpenLLMetry). Messages already in a chat API's shape are kept as logged;
  OpenTelemetry ``parts`` become OpenAI's shape (``replay.readers.exported``);
* model: ``gen_ai.request.model``, else ``gen_ai.response.model``;
* usage: ``gen_ai.usage.input_tokens`` (the conventions have it include the
  cached tokens; where it is smaller than cache read + creation, the
  instrumentation left them out and they are added), ``gen_ai.usage.cache_read.input_tokens``,
  ``gen_ai.usage.cache_creation.input_tokens``, ``gen_ai.usage.output_tokens``
  (and the deprecated ``prompt_tokens`` / ``completion_tokens`` /
  ``cache_read_input_tokens`` / ``cache_creation_input_tokens``);
* output: ``gen_ai.output.messages`` (its first message), else the deprecated
  ``gen_ai.completion`` / ``gen_ai.completion.0.*``;
* ids: tenant = the resource's ``service.name`` (the application; else
  ``default``), session = ``gen_ai.conversation.id`` (else ``session.id``),
  user = ``user.id`` / ``enduser.id``, prompt_cache_key = an
  ``gen_ai.request.prompt_cache_key`` / ``gen_ai.openai.request.prompt_cache_key``
  attribute where an instrumentation writes one. ``--field tenant=…`` picks
  another from the normalized span: ``trace_id``, ``span_id``, ``name``,
  ``service``, ``attributes.<attribute name>``, ``resource.<attribute name>``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from replay.readers.exported import (chat_row, first, first_tokens, json_value, openai_messages, openai_tools,
                                     system_text, tokens)
from replay.readers.fields import MISSING, Options, Reject, type_name
from replay.readers.timestamps import parse_ts
from replay.store.jsontext import dumps

LLM_OPERATIONS = ("chat", "text_completion", "generate_content")
_FLAT = re.compile(r"gen_ai\.(prompt|completion)\.([0-9]{1,9})\.(.+)")
_CALL = re.compile(r"tool_calls\.([0-9]{1,9})\.(id|name|arguments)")
_NANOS = re.compile(r"[0-9]{1,30}")


def is_otel(rec: dict) -> bool:
    """An OTLP export (``resourceSpans``) or one span with GenAI attributes."""
    if isinstance(rec.get("resourceSpans"), list):
        return True
    if not (("traceId" in rec and "spanId" in rec) or isinstance(rec.get("context"), dict)):
        return False
    return "attributes" in rec and ("startTimeUnixNano" in rec or "start_time" in rec)


# ----------------------------------------------------------------- attributes

def any_value(v: Any, where: str) -> Any:
    """An OTLP JSON ``AnyValue`` → a Python value."""
    if not isinstance(v, dict):
        return v  # (a plain-object attribute map holds values directly)
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        n = tokens(v["intValue"]) if not isinstance(v["intValue"], int) else v["intValue"]
        return n if n is not None else v["intValue"]
    if "doubleValue" in v:
        return v["doubleValue"]
    if "boolValue" in v:
        return v["boolValue"]
    if "arrayValue" in v:
        vals = (v["arrayValue"] or {}).get("values") if isinstance(v["arrayValue"], dict) else None
        if vals is not None and not isinstance(vals, list):
            raise Reject("wrong_type", f"{where}.arrayValue.values is {type_name(vals)}, expected an array")
        return [any_value(x, where) for x in vals or ()]
    if "kvlistValue" in v:
        vals = (v["kvlistValue"] or {}).get("values") if isinstance(v["kvlistValue"], dict) else None
        return attributes(vals or [], where)
    if "bytesValue" in v:
        return None  # (binary: not prompt text we can render)
    return None if not v else v


def attributes(v: Any, where: str) -> dict:
    """OTLP ``[{"key", "value"}]`` (or a plain object) → ``{name: value}``."""
    if v is None:
        return {}
    if isinstance(v, dict):
        return dict(v)
    if not isinstance(v, list):
        raise Reject("wrong_type", f"field '{where}' is {type_name(v)}, expected an array of key/value pairs")
    out = {}
    for i, kv in enumerate(v):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise Reject("wrong_type", f"{where}[{i}] is {type_name(kv)}, expected a key/value object with a "
                                       "string 'key'")
        out[kv["key"]] = any_value(kv.get("value"), f"{where}[{i}].value")
    return out


# ----------------------------------------------------------------- units

def expand_otel(rec: dict) -> list:
    """The units of one parsed record: each span with its resource's attributes
    (``{"_span", "_resource"}``), or a Reject for a part that cannot be read."""
    if "resourceSpans" not in rec:
        return [{"_span": rec, "_resource": rec.get("resource")}]
    rs = rec["resourceSpans"]
    if not isinstance(rs, list):
        return [Reject("wrong_type", f"field 'resourceSpans' is {type_name(rs)}, expected an array")]
    out: list = []
    for i, r in enumerate(rs):
        if not isinstance(r, dict):
            out.append(Reject("wrong_type", f"resourceSpans[{i}] is {type_name(r)}, expected an object"))
            continue
        scopes = r.get("scopeSpans", r.get("instrumentationLibrarySpans"))
        if not isinstance(scopes, list):
            out.append(Reject("wrong_type", f"resourceSpans[{i}].scopeSpans is {type_name(scopes)}, "
                                            "expected an array"))
            continue
        for j, ss in enumerate(scopes):
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                out.append(Reject("wrong_type", f"resourceSpans[{i}].scopeSpans[{j}].spans is "
                                                f"{type_name(spans)}, expected an array"))
                continue
            out += [{"_span": s, "_resource": r.get("resource")} for s in spans]
    return out or [Reject("no_prompt", "the export holds no spans (empty 'resourceSpans')")]


def _start_us(span: dict, opts: Options) -> int:
    ns = span.get("startTimeUnixNano")
    if ns is not None:
        if isinstance(ns, str) and _NANOS.fullmatch(ns.strip()):
            n = int(ns.strip())
        elif isinstance(ns, int) and not isinstance(ns, bool) and ns >= 0:
            n = ns
        else:
            raise Reject("bad_timestamp", f"field 'startTimeUnixNano' is {type_name(ns)}, expected a "
                                          "non-negative integer (or a string of digits)")
        return parse_ts(n // 1000, "startTimeUnixNano", "us")
    v = span.get("start_time")
    if v is None:
        raise Reject("missing_timestamp", "no 'startTimeUnixNano' (or 'start_time') in the span")
    return parse_ts(v, "start_time", opts)


def _flat_messages(attrs: dict, kind: str) -> list:
    """OpenLLMetry's ``gen_ai.prompt.<i>.*`` attributes → OpenAI chat messages."""
    by: dict[int, dict] = {}
    for k, v in attrs.items():
        m = _FLAT.fullmatch(k)
        if m and m.group(1) == kind:
            by.setdefault(int(m.group(2)), {})[m.group(3)] = v
    out = []
    for i in sorted(by):
        f = by[i]
        msg: dict = {"role": f.get("role") if isinstance(f.get("role"), str) else "user",
                     "content": json_value(f.get("content"), f"gen_ai.{kind}.{i}.content")}
        if isinstance(msg["content"], dict):
            msg["content"] = dumps(msg["content"])
        calls: dict[int, dict] = {}
        for key, v in f.items():
            cm = _CALL.fullmatch(key)
            if cm:
                calls.setdefault(int(cm.group(1)), {})[cm.group(2)] = v
        if calls:
            msg["tool_calls"] = [{"id": c.get("id"), "type": "function",
                                  "function": {"name": c.get("name"), "arguments": c.get("arguments") or "{}"}}
                                 for _, c in sorted(calls.items())]
        if f.get("tool_call_id") is not None:
            msg["tool_call_id"] = f["tool_call_id"]
        out.append(msg)
    return out


def _event_prompt(span: dict) -> Any:
    """The deprecated ``gen_ai.content.prompt`` event's ``gen_ai.prompt`` attribute."""
    events = span.get("events")
    for e in events if isinstance(events, list) else ():
        if isinstance(e, dict) and e.get("name") == "gen_ai.content.prompt":
            return attributes(e.get("attributes"), "events[].attributes").get("gen_ai.prompt", MISSING)
    return MISSING


def _body(attrs: dict, span: dict) -> dict:
    msgs = attrs.get("gen_ai.input.messages")
    if msgs is not None:
        messages = openai_messages(json_value(msgs, "gen_ai.input.messages"), "gen_ai.input.messages")
    else:
        old = attrs.get("gen_ai.prompt", _event_prompt(span))
        if old is not MISSING and old is not None:
            messages = openai_messages(json_value(old, "gen_ai.prompt"), "gen_ai.prompt")
        else:
            messages = _flat_messages(attrs, "prompt")
    body: dict = {}
    sys = attrs.get("gen_ai.system_instructions")
    if sys is not None:
        messages = [{"role": "system", "content": system_text(json_value(sys, "gen_ai.system_instructions"),
                                                              "gen_ai.system_instructions")}] + messages
    tools = attrs.get("gen_ai.tool.definitions")
    if tools is not None:
        body["tools"] = openai_tools(json_value(tools, "gen_ai.tool.definitions"), "gen_ai.tool.definitions")
    if not messages and "tools" not in body:
        raise Reject("no_prompt", "the span has no input messages (gen_ai.input.messages, gen_ai.prompt or "
                                  "gen_ai.prompt.<i>.*)")
    body["messages"] = messages
    return body


def _output(attrs: dict) -> Any:
    out = attrs.get("gen_ai.output.messages")
    if out is not None:
        msgs = openai_messages(json_value(out, "gen_ai.output.messages"), "gen_ai.output.messages")
        return msgs[0] if msgs else None
    old = attrs.get("gen_ai.completion")
    if old is not None:
        msgs = json_value(old, "gen_ai.completion")
        return msgs[0] if isinstance(msgs, list) and msgs else msgs if isinstance(msgs, dict) else None
    flat = _flat_messages(attrs, "completion")
    return flat[0] if flat else None


def _usage(attrs: dict) -> dict:
    get = functools.partial(first_tokens, attrs)
    inp = get("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
    cr = get("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens",
             "gen_ai.usage.input_tokens.cached")
    cw = get("gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_creation_input_tokens",
             "gen_ai.usage.input_tokens.cache_write")
    if inp is not None and inp < (cr or 0) + (cw or 0):
        inp += (cr or 0) + (cw or 0)  # (the instrumentation left the cached part out of input_tokens)
    return {"usage_prompt_tokens": inp, "usage_cached_tokens": cr, "usage_cache_write_tokens": cw,
            "usage_output_tokens": get("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")}


def convert_otel(unit: dict, opts: Options) -> dict:
    """One span (a unit of :func:`expand_otel`) → row (raises Reject)."""
    span = unit.get("_span", unit)
    if not isinstance(span, dict):
        raise Reject("wrong_type", f"the span is {type_name(span)}, expected an object")
    res = unit.get("_resource")
    resource = attributes(res.get("attributes") if isinstance(res, dict) else res, "resource.attributes")
    attrs = attributes(span.get("attributes"), "attributes")
    op = attrs.get("gen_ai.operation.name")
    if op is not None and op not in LLM_OPERATIONS:
        raise Reject("not_llm_span", "the span's gen_ai.operation.name is not chat, text_completion or "
                                     "generate_content (a tool, agent, embeddings or other span)")
    if op is None and not any(k.startswith(("gen_ai.request.model", "gen_ai.input.messages", "gen_ai.prompt"))
                              for k in attrs):
        raise Reject("not_llm_span", "the span has no gen_ai.operation.name, gen_ai.request.model or input "
                                     "messages: not a model call")
    ts = _start_us(span, opts)
    if span.get("startTimeUnixNano") is not None and opts.file_unit is None:
        opts.file_unit = "ns"  # (recorded in `sources`: the export's own unit)
    body = _body(attrs, span)
    ctx = span.get("context") if isinstance(span.get("context"), dict) else {}
    norm = {"trace_id": first(span, "traceId") if "traceId" in span else ctx.get("trace_id"),
            "span_id": first(span, "spanId") if "spanId" in span else ctx.get("span_id"),
            "name": span.get("name"), "service": resource.get("service.name"),
            "attributes": attrs, "resource": resource}
    pick = (lambda *names: next((attrs[n] for n in names if attrs.get(n) not in (None, "")), None))
    ids = {"tenant": resource.get("service.name"),
           "session": pick("gen_ai.conversation.id", "session.id"),
           "user_id": pick("user.id", "enduser.id"),
           "model": pick("gen_ai.request.model", "gen_ai.response.model"),
           "prompt_cache_key": pick("gen_ai.request.prompt_cache_key", "gen_ai.openai.request.prompt_cache_key")}
    try:
        out = _output(attrs)
    except Reject:  # (an output that cannot be read is left out: the prompt is what is replayed)
        out = None
    response = {"choices": [{"message": out}]} if isinstance(out, dict) else None
    return chat_row(ts, body, response, ids, opts, "gen_ai.input.messages", norm, _usage(attrs))
