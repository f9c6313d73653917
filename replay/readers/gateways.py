"""Gateway and observability exports: LiteLLM (``litellm``) and Langfuse (``langfuse``).

**LiteLLM** — a line is either the proxy's ``StandardLoggingPayload`` (what its
logging callbacks receive as ``standard_logging_object``; also accepted wrapped
as ``{"standard_logging_object": {...}}``) or a row of its ``LiteLLM_SpendLogs``
table (``/spend/logs``; JSON columns may come as strings):

* time: ``startTime`` (epoch seconds as a float, or an ISO date-time);
* the prompt: ``proxy_server_request`` when it holds the request body the
  client sent (``messages`` / ``system`` / ``tools``), else ``messages`` (a
  chat API's messages; a plain string is one user message) with ``tools`` and
  ``system`` from ``model_parameters``;
* model: ``model`` (else ``model_group``); output: ``response`` (a chat API's
  response object, its usage and any provider diagnostics with it);
* usage: ``response.usage``, else ``prompt_tokens`` / ``completion_tokens``
  with the cache figures of ``metadata.additional_usage_values`` (or
  ``metadata.usage_object``); LiteLLM's ``prompt_tokens`` already includes the
  cached tokens;
* ids: tenant = the virtual key (``metadata.user_api_key_hash``, the spend
  log's ``api_key``; else the team, else the organization), user =
  ``end_user`` / ``user`` / ``metadata.user_api_key_user_id``, session =
  ``session_id`` / ``metadata.litellm_session_id`` / ``trace_id`` (LiteLLM fills
  ``trace_id`` with a fresh id per request when the client sends no session:
  such requests are sessions of one);
* calls that are not chat or completions (embeddings, images, audio,
  moderation, rerank, files, batches) are rejected as ``not_llm_call``.

**Langfuse** — an export of observations (the public API's
``/api/public/observations`` or ``/api/public/v2/observations``: a page
``{"data": [...], "meta": {...}}`` whose every observation is a unit, or one
observation per line):

* only ``type: GENERATION`` is a model call (others: ``not_generation``);
* time: ``startTime`` (ISO); model: ``model`` (else ``providedModelName``);
* the prompt: ``input`` — a list of chat messages, a request-like object
  (``messages`` with ``tools`` / ``system``), one message, or a string;
* usage: ``usageDetails`` — Langfuse keeps ``input`` *without* the cached
  tokens, so the prompt is ``input`` plus every ``input_*`` and
  ``cache_*_input_tokens`` key; cached = ``input_cached_tokens`` /
  ``cache_read_input_tokens`` / ``input_cache_read``, written =
  ``cache_creation_input_tokens`` / ``input_cache_creation``; else the legacy
  ``usage`` (``input``, ``output``);
* ids: tenant = ``projectId`` (else ``environment``, else ``default``), user
  = ``userId``, session = ``sessionId`` (the observations API v2 carries the
  trace's); ``--field`` mappings name any other (``traceId``,
  ``metadata.…``).
"""

from __future__ import annotations

import functools
from typing import Any

from replay.readers.exported import (MISSING, chat_row, first, first_tokens, json_value, openai_messages, optional,
                                     tokens)
from replay.readers.fields import Options, Reject, type_name
from replay.readers.timestamps import parse_ts

_NOT_CHAT = ("embedding", "image", "moderation", "transcription", "speech", "rerank", "file", "batch",
             "vector_store", "search")


def _nz(v: Any) -> Any:
    return None if v is MISSING else v


# ----------------------------------------------------------------- LiteLLM

def is_litellm(rec: dict) -> bool:
    if isinstance(rec.get("standard_logging_object"), dict):
        return True
    return "call_type" in rec and "startTime" in rec and ("messages" in rec or "proxy_server_request" in rec)


def _litellm_body(rec: dict) -> dict:
    psr = optional(rec.get("proxy_server_request"), "proxy_server_request")
    if isinstance(psr, dict) and isinstance(psr.get("body"), dict):
        psr = psr["body"]
    if isinstance(psr, dict) and any(k in psr for k in ("messages", "system")):
        return psr
    if "messages" not in rec or rec["messages"] is None:
        raise Reject("no_prompt", "no 'messages' (and no request body in 'proxy_server_request') in the record")
    msgs = json_value(rec["messages"], "messages")
    if isinstance(msgs, str):
        msgs = [{"role": "user", "content": msgs}]
    if isinstance(msgs, dict) and ("messages" in msgs or "system" in msgs):
        return msgs
    body: dict = {"messages": openai_messages(msgs, "messages")}
    params = optional(rec.get("model_parameters"), "model_parameters")
    if isinstance(params, dict):
        for k in ("system", "tools"):
            if params.get(k) is not None:
                body[k] = params[k]
    return body


def _litellm_usage(rec: dict, md: dict, response: Any) -> dict | None:
    """The usage columns from the record's own counts, where the response has no usage."""
    if isinstance(response, dict) and isinstance(response.get("usage"), dict):
        return None  # (the chat converter reads it)
    extra = optional(md.get("additional_usage_values") or md.get("usage_object"), "metadata.additional_usage_values")
    extra = extra if isinstance(extra, dict) else {}
    det = extra.get("prompt_tokens_details") if isinstance(extra.get("prompt_tokens_details"), dict) else {}
    cached = tokens(det.get("cached_tokens"))
    if cached is None:
        cached = tokens(extra.get("cache_read_input_tokens"))
    return {"usage_prompt_tokens": tokens(rec.get("prompt_tokens", extra.get("prompt_tokens"))),
            "usage_cached_tokens": cached,
            "usage_cache_write_tokens": tokens(extra.get("cache_creation_input_tokens")),
            "usage_output_tokens": tokens(rec.get("completion_tokens", extra.get("completion_tokens")))}


def convert_litellm(rec: dict, opts: Options) -> dict:
    """A StandardLoggingPayload or a spend-log row → row (raises Reject)."""
    if isinstance(rec.get("standard_logging_object"), dict):
        rec = rec["standard_logging_object"]
    ct = rec.get("call_type")
    if ct is not None and not isinstance(ct, str):
        raise Reject("wrong_type", f"field 'call_type' is {type_name(ct)}, expected a string")
    if ct and any(w in ct for w in _NOT_CHAT):
        raise Reject("not_llm_call", "field 'call_type' names a call that is not a chat or completion")
    if rec.get("startTime") is None:
        raise Reject("missing_timestamp", "no 'startTime' in the record")
    ts = parse_ts(rec["startTime"], "startTime", opts)
    md = json_value(rec.get("metadata"), "metadata")
    md = md if isinstance(md, dict) else {}
    body = _litellm_body(rec)
    response = optional(rec.get("response"), "response")
    ids = {"tenant": _nz(first(md, "user_api_key_hash")) or _nz(first(rec, "api_key"))
           or _nz(first(md, "user_api_key_team_id")) or _nz(first(rec, "team_id"))
           or _nz(first(md, "user_api_key_org_id")) or _nz(first(rec, "organization_id")),
           "user_id": _nz(first(rec, "end_user", "user")) or _nz(first(md, "user_api_key_user_id")),
           "session": _nz(first(rec, "session_id")) or _nz(first(md, "litellm_session_id", "session_id"))
           or _nz(first(rec, "trace_id")),
           "model": _nz(first(rec, "model", "model_group"))}
    norm = dict(rec, metadata=md)
    return chat_row(ts, body, response, ids, opts, "messages", norm, _litellm_usage(rec, md, response))


# ----------------------------------------------------------------- Langfuse

def is_langfuse(rec: dict) -> bool:
    data = rec.get("data")
    if isinstance(data, list) and isinstance(rec.get("meta"), dict):
        rec = data[0] if data and isinstance(data[0], dict) else {}  # (an API page: its first observation)
    return isinstance(rec.get("type"), str) and "traceId" in rec and "startTime" in rec and "input" in rec


def expand_langfuse(rec: dict) -> list:
    """An API page's observations, or the record itself."""
    if "data" in rec and "meta" in rec:
        data = rec["data"]
        if not isinstance(data, list):
            return [Reject("wrong_type", f"field 'data' is {type_name(data)}, expected an array of observations")]
        return list(data) or [Reject("no_prompt", "the page holds no observations (empty 'data')")]
    return [rec]


def _langfuse_body(inp: Any) -> dict:
    inp = json_value(inp, "input")
    if isinstance(inp, str):
        return {"messages": [{"role": "user", "content": inp}]}
    if isinstance(inp, dict):
        if "messages" in inp or "system" in inp:
            return inp
        if "role" in inp:
            return {"messages": [inp]}
    if isinstance(inp, list):
        return {"messages": openai_messages(inp, "input")}
    raise Reject("wrong_type", f"field 'input' is {type_name(inp)}, expected chat messages, a request object or "
                               "a string")


def _langfuse_usage(o: dict) -> dict:
    d = o.get("usageDetails")
    if isinstance(d, dict) and d:
        get = functools.partial(first_tokens, d)
        inp = get("input")
        extra = sum(tokens(v) or 0 for k, v in d.items() if isinstance(k, str) and (
            k.startswith("input_") or (k.startswith("cache_") and k.endswith("input_tokens"))))
        return {"usage_prompt_tokens": None if inp is None and not extra else (inp or 0) + extra,
                "usage_cached_tokens": get("input_cached_tokens", "cache_read_input_tokens", "input_cache_read"),
                "usage_cache_write_tokens": get("cache_creation_input_tokens", "input_cache_creation",
                                                "input_cache_write"),
                "usage_output_tokens": get("output")}
    u = o.get("usage")
    if isinstance(u, dict):
        return {"usage_prompt_tokens": tokens(u.get("input", u.get("promptTokens"))), "usage_cached_tokens": None,
                "usage_cache_write_tokens": None,
                "usage_output_tokens": tokens(u.get("output", u.get("completionTokens")))}
    return {}


def convert_langfuse(o: dict, opts: Options) -> dict:
    """One observation → row (raises Reject)."""
    if not isinstance(o, dict):
        raise Reject("wrong_type", f"the observation is {type_name(o)}, expected an object")
    t = o.get("type")
    if not isinstance(t, str) or t.upper() != "GENERATION":
        what = "not GENERATION" if isinstance(t, str) else type_name(t)
        raise Reject("not_generation", f"observation field 'type' is {what} (only generations are model calls)")
    if o.get("startTime") is None:
        raise Reject("missing_timestamp", "no 'startTime' in the observation")
    ts = parse_ts(o["startTime"], "startTime", opts)
    if o.get("input") is None:
        raise Reject("no_prompt", "the observation has no 'input'")
    body = _langfuse_body(o["input"])
    out = optional(o.get("output"), "output")
    if isinstance(out, str):
        out = {"role": "assistant", "content": out}
    elif isinstance(out, list):
        out = out[0] if out and isinstance(out[0], dict) else None
    response = {"choices": [{"message": out}]} if isinstance(out, dict) else None
    ids = {"tenant": _nz(first(o, "projectId", "environment")), "user_id": _nz(first(o, "userId")),
           "session": _nz(first(o, "sessionId")), "model": _nz(first(o, "model", "providedModelName"))}
    return chat_row(ts, body, response, ids, opts, "input", o, _langfuse_usage(o))
