"""Log formats understood by ingest: detection and record → `requests` row.

Pure functions over already-parsed JSON records; no I/O and no database here
(see `replay/ingest.py`). A record that cannot be loaded raises `Reject` with a
short reason code and a detail message that names fields and JSON types only —
never a value that could be prompt text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import repeat
from typing import Any, Iterator

from replay.core.times import UNIT_US, to_us
from replay.store.jsontext import dumps

FORMATS = ("anthropic", "openai", "tokens", "mooncake", "trajectory")
TIME_UNITS = tuple(UNIT_US)

# Default field names, looked up at the top level of a record, first one wins.
TS_NAMES = ("timestamp", "ts", "created_at", "created")
TENANT_NAMES = ("tenant", "org", "organization", "user")
KEY_NAMES = ("prompt_cache_key",)
SESSION_NAMES = ("session", "session_id", "conversation_id")
# Attributes a `fields` mapping may override with a dotted path into the record.
FIELD_KEYS = ("timestamp", "tenant", "prompt_cache_key", "session", "user_id", "model")
FIELD_ALIASES = {"ts": "timestamp", "key": "prompt_cache_key"}

# Keys of a *flat* chat record that are log metadata, not request body.
_ENVELOPE_KEYS = frozenset(TS_NAMES + TENANT_NAMES + SESSION_NAMES + ("response", "usage"))

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

# The one tool of the mini-swe-agent runs (its bash_tool_schema.py), as sent to the API.
BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The bash command to execute",
                }
            },
            "required": ["command"],
        },
    },
}

_MISSING = object()


class Reject(Exception):
    """A record (or file) that is not loaded; `reason` is a short code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Options:
    fields: dict[str, str] = field(default_factory=dict)
    time_unit: str | None = None   # forced for every file (--time-unit)
    file_unit: str | None = None   # the unit the current file settled on (reset per file by ingest)
    # ingest stores bodies as content-addressed blobs: converters then hand over
    # the parsed body (row["body_obj"]) instead of serializing it (row["body"])
    split_body: bool = False


def normalize_fields(fields: dict[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (fields or {}).items():
        k2 = FIELD_ALIASES.get(k, k)
        if k2 not in FIELD_KEYS:
            raise ValueError(f"unknown field {k!r} in field mapping; expected one of {', '.join(FIELD_KEYS)}")
        if not isinstance(v, str) or not v:
            raise ValueError(f"field mapping for {k!r} must be a non-empty dotted path")
        out[k2] = v
    return out


# ----------------------------------------------------------------- helpers

def type_name(v: Any) -> str:
    """JSON type of a value, for reject details."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def get_path(rec: Any, path: str) -> Any:
    """Value at a dotted path (`request.metadata.user_id`, `a.0.b`), or _MISSING."""
    cur = rec
    for part in path.split("."):
        if isinstance(cur, dict):
            if part not in cur:
                return _MISSING
            cur = cur[part]
        elif isinstance(cur, list) and part.lstrip("-").isdigit():
            i = int(part)
            if not -len(cur) <= i < len(cur):
                return _MISSING
            cur = cur[i]
        else:
            return _MISSING
    return cur


def _first(rec: dict, names: tuple[str, ...], skip: frozenset = frozenset()) -> tuple[str | None, Any]:
    for n in names:
        if n in skip:
            continue
        v = rec.get(n)
        if v is not None and v != "":
            return n, v
    return None, _MISSING


def _lookup(rec: dict, opts: Options, key: str, names: tuple[str, ...],
            skip: frozenset = frozenset()) -> tuple[str, Any]:
    """(field name used, value or _MISSING) of an attribute: mapping first, then default names."""
    path = opts.fields.get(key)
    if path is not None:
        v = get_path(rec, path)
        return path, (_MISSING if v is None or v == "" else v)
    name, v = _first(rec, names, skip)
    return (name or names[0] if names else key), v


def _as_str(v: Any, fname: str) -> str | None:
    if v is _MISSING or v is None:
        return None
    if isinstance(v, str):
        s = v
    elif isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, int):
        s = str(v)
    elif isinstance(v, float):
        s = str(int(v)) if v.is_integer() else repr(v)
    else:
        raise Reject("wrong_type", f"field '{fname}' is {type_name(v)}, expected a string")
    if s == "":
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if INT64[0] <= v <= INT64[1] else None
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    return None


# ----------------------------------------------------------------- timestamps

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _iso_us(s: str) -> int | None:
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    return _datetime_us(dt)


def _datetime_us(dt: datetime) -> int:
    if dt.tzinfo is None:  # a naive time is taken as UTC
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - _EPOCH) // timedelta(microseconds=1)


def guess_unit(x: float) -> str:
    """The unit of a numeric timestamp by its magnitude: |x| > 1e14 → µs, > 1e11 → ms, else s."""
    ax = abs(x)
    return "us" if ax > 1e14 else "ms" if ax > 1e11 else "s"


def parse_ts(v: Any, fname: str, opts: "Options | str | None", default_unit: str | None = None) -> int:
    """Integer microseconds from a number, numeric string or ISO-8601 string.

    The unit of numbers is decided once per file (semantics.md): ``opts.time_unit``
    when given (``--time-unit``), else the unit this file already settled on
    (``opts.file_unit``), else ``default_unit`` (a format's own, e.g. Mooncake's
    ms), else the magnitude of this first number (:func:`guess_unit`); the
    choice is kept in ``opts.file_unit`` for the rest of the file. ISO strings
    are never scaled; a naive ISO time is taken as UTC. ``opts`` may also be a
    unit name (or None) for a one-off conversion.
    """
    if v is _MISSING or v is None or v == "":
        raise Reject("missing_timestamp", f"no timestamp: field '{fname}' is absent or null")
    if isinstance(v, bool):
        raise Reject("bad_timestamp", f"field '{fname}' is a boolean, expected a number or an ISO-8601 string")
    if isinstance(v, datetime):  # parquet timestamp columns
        return _datetime_us(v)
    if isinstance(v, str):
        num: Any = v.strip()
        try:
            float(num)
        except ValueError:
            t = _iso_us(num)
            if t is None:
                raise Reject("bad_timestamp",
                             f"field '{fname}' is a string of length {len(num)} that is neither a number "
                             f"nor an ISO-8601 date-time") from None
            return t
    elif isinstance(v, (int, float)):
        num = v
    else:
        raise Reject("bad_timestamp", f"field '{fname}' is {type_name(v)}, expected a number or an ISO-8601 string")
    x = float(num)
    if not math.isfinite(x):
        raise Reject("bad_timestamp", f"field '{fname}' is not a finite number")
    if isinstance(opts, Options):
        unit = opts.time_unit or opts.file_unit or default_unit or guess_unit(x)
        opts.file_unit = opts.file_unit or unit
    else:
        unit = opts or default_unit or guess_unit(x)
    return to_us(num, unit)


def _ts(rec: dict, opts: Options, default_unit: str | None = None) -> int:
    fname, v = _lookup(rec, opts, "timestamp", TS_NAMES)
    if v is _MISSING:
        names = opts.fields.get("timestamp") or "/".join(TS_NAMES)
        raise Reject("missing_timestamp", f"no timestamp field ({names}) in the record")
    return parse_ts(v, fname, opts, default_unit)


# ----------------------------------------------------------------- detection

def _as_obj(v: Any) -> Any:
    """A JSON object logged as a string (some loggers do) → dict; otherwise unchanged."""
    if isinstance(v, str) and v[:1] == "{":
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _chat_parts(rec: dict, flat_skip: frozenset = frozenset()) -> tuple[Any, Any, bool]:
    """(body, response, wrapped) of a chat record."""
    if "request" in rec:
        return _as_obj(rec["request"]), _as_obj(rec.get("response")), True
    body = {k: v for k, v in rec.items() if k not in _ENVELOPE_KEYS or k in flat_skip}
    return body, _as_obj(rec.get("response")), False


def _usage_of(rec: dict, response: Any) -> Any:
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


def detect_record(rec: Any, whole_document: bool = False) -> tuple[str | None, bool]:
    """(format, confident) of one parsed record; (None, False) when undetectable.

    `confident` is False for a chat body that fits both APIs equally (plain
    string messages): ingest then looks at a few more records before settling
    on `openai`.
    """
    if not isinstance(rec, dict):
        return None, False
    if whole_document and isinstance(rec.get("messages"), list) and (
        "trajectory_format" in rec or ("info" in rec and "instance_id" in rec)
    ):
        return "trajectory", True
    if isinstance(rec.get("hash_ids"), list) and "input_length" in rec:
        return "mooncake", True
    if isinstance(rec.get("tokens"), list):
        return "tokens", True
    body, response, _ = _chat_parts(rec)
    if not isinstance(body, dict):
        return None, False
    if not any(k in body for k in ("messages", "system")):
        return None, False
    a, o = chat_scores(body, response, _usage_of(rec, response))
    if a > o:
        return "anthropic", True
    if o > a:
        return "openai", True
    return "openai", False


# ----------------------------------------------------------------- converters

def _usage_anthropic(u: dict) -> dict:
    inp = _int_or_none(u.get("input_tokens"))
    cr = _int_or_none(u.get("cache_read_input_tokens"))
    cw = _int_or_none(u.get("cache_creation_input_tokens"))
    prompt = None if inp is None and cr is None and cw is None else (inp or 0) + (cr or 0) + (cw or 0)
    return {
        "usage_prompt_tokens": prompt,
        "usage_cached_tokens": cr,
        "usage_cache_write_tokens": cw,
        "usage_output_tokens": _int_or_none(u.get("output_tokens")),
    }


def _usage_openai(u: dict, prefer_deepseek: bool = False) -> dict:
    det = u.get("prompt_tokens_details")
    details = _int_or_none(det.get("cached_tokens")) if isinstance(det, dict) else None
    deepseek = _int_or_none(u.get("prompt_cache_hit_tokens"))
    cached = (deepseek if deepseek is not None else details) if prefer_deepseek else (
        details if details is not None else deepseek)
    return {
        "usage_prompt_tokens": _int_or_none(u.get("prompt_tokens")),
        "usage_cached_tokens": cached,
        "usage_cache_write_tokens": None,
        "usage_output_tokens": _int_or_none(u.get("completion_tokens")),
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


def _common_attrs(rec: dict, opts: Options, tenant_skip: frozenset = frozenset()) -> dict:
    tname, tenant = _lookup(rec, opts, "tenant", TENANT_NAMES, tenant_skip)
    kname, key = _lookup(rec, opts, "prompt_cache_key", KEY_NAMES)
    sname, sess = _lookup(rec, opts, "session", SESSION_NAMES)
    return {
        "tenant": _as_str(tenant, tname) or "default",
        "prompt_cache_key": _as_str(key, kname),
        "session": _as_str(sess, sname),
    }


def convert_chat(rec: dict, fmt: str, opts: Options) -> dict:
    """anthropic / openai record (wrapped in an envelope with `request`, or flat) → row."""
    # In a flat OpenAI record `user` is the body's end-user field, not a tenant.
    body_keys = frozenset(("user",)) if fmt == "openai" else frozenset()
    body, response, wrapped = _chat_parts(rec, body_keys)
    ts = _ts(rec, opts)
    _check_chat_body(body, "request" if wrapped else "record")
    row = _common_attrs(rec, opts, frozenset() if wrapped else body_keys)
    if row["prompt_cache_key"] is None and "prompt_cache_key" not in opts.fields:
        row["prompt_cache_key"] = _as_str(body.get("prompt_cache_key"), "request.prompt_cache_key")
    row["ts_us"] = ts
    if "user_id" in opts.fields:
        uid = get_path(rec, opts.fields["user_id"])
        row["user_id"] = _as_str(uid, opts.fields["user_id"])
    elif fmt == "anthropic":
        md = body.get("metadata")
        row["user_id"] = _as_str(md.get("user_id"), "metadata.user_id") if isinstance(md, dict) else None
    else:
        row["user_id"] = _as_str(body.get("user"), "user")
    if "model" in opts.fields:
        row["model"] = _as_str(get_path(rec, opts.fields["model"]), opts.fields["model"])
    else:
        model = body.get("model")
        if model is None and isinstance(response, dict):
            model = response.get("model")
        row["model"] = _as_str(model, "model")
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
    row.update(usage_row(_usage_of(rec, response)))
    return row


def _int_list(v: Any, fname: str, bounds: tuple[int, int]) -> list[int]:
    if not isinstance(v, list):
        raise Reject("wrong_type", f"field '{fname}' is {type_name(v)}, expected an array of integers")
    lo, hi = bounds
    for i, x in enumerate(v):
        if type(x) is not int:
            if isinstance(x, float) and x.is_integer():
                v = [int(y) if isinstance(y, float) and y.is_integer() else y for y in v]
                return _int_list(v, fname, bounds)
            raise Reject("wrong_type", f"{fname}[{i}] is {type_name(x)}, expected an integer")
        if not lo <= x <= hi:
            raise Reject("wrong_type", f"{fname}[{i}] is out of range for a {'32' if hi < 2**32 else '64'}-bit integer")
    return v


def convert_tokens(rec: dict, opts: Options) -> dict:
    ts = _ts(rec, opts)
    if "tokens" not in rec or rec["tokens"] is None:
        raise Reject("no_prompt", "no 'tokens' field in the record")
    toks = _int_list(rec["tokens"], "tokens", INT32)
    row = _common_attrs(rec, opts)
    tname, tenant = _lookup(rec, opts, "tenant", TENANT_NAMES)
    if tenant is _MISSING:
        raise Reject("missing_tenant", f"no tenant field ({opts.fields.get('tenant') or '/'.join(TENANT_NAMES)}) "
                                       f"in the record; the tokens format requires one")
    row["ts_us"] = ts
    row["tokens"] = toks
    if rec.get("output_tokens") is not None:
        row["output_tokens"] = _int_list(rec["output_tokens"], "output_tokens", INT32)
    if "model" in opts.fields:
        row["model"] = _as_str(get_path(rec, opts.fields["model"]), opts.fields["model"])
    else:
        row["model"] = _as_str(rec.get("model"), "model")
    if "user_id" in opts.fields:
        row["user_id"] = _as_str(get_path(rec, opts.fields["user_id"]), opts.fields["user_id"])
    return row


def _length(rec: dict, name: str, required: bool) -> int | None:
    v = rec.get(name)
    if v is None:
        if required:
            raise Reject("missing_field", f"no '{name}' field in the record")
        return None
    n = _int_or_none(v)
    if n is None or n < 0:
        raise Reject("wrong_type", f"field '{name}' is {type_name(v)}, expected a non-negative integer")
    return n


def convert_mooncake(rec: dict, opts: Options) -> dict:
    ts = _ts(rec, opts, default_unit="ms")
    if rec.get("hash_ids") is None:
        raise Reject("no_prompt", "no 'hash_ids' field in the record")
    blocks = _int_list(rec["hash_ids"], "hash_ids", INT64)
    row = _common_attrs(rec, opts)
    row["ts_us"] = ts
    row["block_ids"] = blocks
    row["input_length"] = _length(rec, "input_length", True)
    row["output_length"] = _length(rec, "output_length", False)
    row["model"] = _as_str(rec.get("model"), "model")
    return row


CONVERTERS = {
    "anthropic": lambda rec, opts: convert_chat(rec, "anthropic", opts),
    "openai": lambda rec, opts: convert_chat(rec, "openai", opts),
    "tokens": convert_tokens,
    "mooncake": convert_mooncake,
}


def convert_record(rec: Any, fmt: str | None, opts: Options) -> dict:
    """One parsed line/record of a line-based file → row dict (raises Reject)."""
    if not isinstance(rec, dict):
        raise Reject("wrong_type", f"the record is {type_name(rec)}, expected a JSON object")
    if fmt is None:
        raise Reject("unknown_format", "could not detect the log format of this file from its records "
                                       f"(record has {len(rec)} top-level keys{_key_hint(rec)}); "
                                       "pass format= to force one")
    if fmt == "trajectory":
        raise Reject("wrong_type", "a trajectory record must be a whole JSON document, not one line of a file")
    return CONVERTERS[fmt](rec, opts)


def _key_hint(rec: dict) -> str:
    names = [k for k in list(rec)[:8] if isinstance(k, str) and k.isidentifier() and len(k) <= 40]
    return f": {', '.join(names)}" if names else ""


# ----------------------------------------------------------------- trajectories

def _strip_extra(m: Any) -> Any:
    return {k: v for k, v in m.items() if k != "extra"} if isinstance(m, dict) else m


def convert_trajectory(doc: Any, stem: str, opts: Options) -> Iterator[tuple[int, dict | Reject]]:
    """A mini-swe-agent trajectory → one row (or Reject) per assistant turn, numbered from 1.

    Raises Reject for the whole file when the document is not a trajectory.
    """
    if not isinstance(doc, dict):
        raise Reject("wrong_type", f"the document is {type_name(doc)}, expected a trajectory object")
    msgs = doc.get("messages")
    if not isinstance(msgs, list):
        raise Reject("wrong_type" if "messages" in doc else "no_prompt",
                     f"field 'messages' is {type_name(msgs) if 'messages' in doc else 'absent'}, expected an array")
    session = _as_str(doc.get("instance_id"), "instance_id") or stem
    prefix = '{"tools":' + dumps([BASH_TOOL]) + ',"messages":['
    ser: list[str] = []
    objs: list[Any] = []
    turn = 0
    for i, m in enumerate(msgs):
        if isinstance(m, dict) and m.get("role") == "assistant":
            turn += 1
            try:
                yield turn, _trajectory_row(m, prefix, ser, session, opts, objs)
            except Reject as r:
                yield turn, r
        if opts.split_body:
            objs.append(_strip_extra(m))
        else:
            ser.append(dumps(_strip_extra(m)))


def _trajectory_row(m: dict, prefix: str, ser: list[str], session: str, opts: Options,
                    objs: list | None = None) -> dict:
    extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
    resp = extra.get("response") if isinstance(extra.get("response"), dict) else {}
    if resp.get("created") is not None:
        ts = parse_ts(resp["created"], "extra.response.created", opts)
    elif extra.get("timestamp") is not None:
        ts = parse_ts(extra["timestamp"], "extra.timestamp", opts)
    else:
        raise Reject("missing_timestamp", "assistant turn has neither extra.response.created nor extra.timestamp")
    row = {
        "ts_us": ts,
        "tenant": "default",
        "session": session,
        "model": _as_str(resp.get("model"), "extra.response.model"),
        "output": dumps(_strip_extra(m)),
    }
    if opts.split_body:
        row["body_obj"] = {"tools": [BASH_TOOL], "messages": list(objs or ())}
    else:
        row["body"] = prefix + ",".join(ser) + "]}"
    row.update(usage_row(resp.get("usage"), prefer_deepseek=True))
    return row
