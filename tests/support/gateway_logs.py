"""The same agent traffic written as a plain OpenAI chat log and as the gateway /
tracing exports (OTLP JSON spans, LiteLLM's StandardLoggingPayload and spend
logs, a Langfuse observations page), in the shapes those projects document.

Every export carries exactly the requests of the plain log (same times to the
millisecond, same prompts once the export's message shape is read back, same
tenant / session partition, same usage), plus what an export holds beside them
(tool and agent spans, SPAN observations, an embeddings call) — so a sweep of
an export must equal the sweep of the plain log, and its extra units are
rejected with their reasons.

``python tests/support/gateway_logs.py DIR`` writes the checked-in fixtures
(``tests/fixtures/gateways``).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import sys
from pathlib import Path

WORDS = ("the cache prefix token request stream tenant session model agent tool result file function value "
         "error build test deploy query table index branch commit review plan memory budget latency window "
         "header schema order json key user system message turn history summary edit patch config").split()
T0_MS = 1_763_000_000_123  # 2025-11-13T02:13:20.123Z


def _text(r: random.Random, n: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(n)).capitalize() + "."


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def traffic(seed: int = 0, tenants=("acme", "initech"), sessions: int = 2, turns: int = 4) -> list[dict]:
    """Logical requests in OpenAI's chat shape, in time order: per tenant an agent
    (its system prompt and tools), per session a conversation growing each turn
    with a tool call and its result."""
    r = random.Random(seed)
    out: list[dict] = []
    for ti, tenant in enumerate(tenants):
        system = "\n\n".join(_text(r, 60) for _ in range(3))
        tools = [{"type": "function", "function": {
            "name": name, "description": _text(r, 25),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
            for name in ("read_file", "run_shell", "search_code")]
        for s in range(sessions):
            t = T0_MS + ti * 600_000 + s * 7_000
            session, user = f"{tenant}-s{s}", f"{tenant}-u{s}"
            msgs: list[dict] = [{"role": "user", "content": _text(r, 40)}]
            cached = 0
            for turn in range(turns):
                t += r.randint(3_000, 40_000)
                prompt = 300 + 120 * turn + r.randint(0, 30)
                call_id = f"call_{r.getrandbits(40):010x}"
                args = json.dumps({"path": f"src/{_text(r, 1)}"}, separators=(",", ":")) if turn < turns - 1 else ""
                reply = ({"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": args}}]}
                         if turn < turns - 1 else {"role": "assistant", "content": _text(r, 30)})
                out.append({"ms": t, "tenant": tenant, "session": session, "user": user, "model": "gpt-4.1",
                            "system": system, "tools": tools, "messages": [dict(m) for m in msgs], "output": reply,
                            "usage": {"prompt": prompt, "cached": cached, "output": 20 + turn}})
                cached = prompt - prompt % 128
                msgs += [reply] if turn == turns - 1 else [
                    reply, {"role": "tool", "tool_call_id": call_id, "content": _text(r, 30)},
                    {"role": "user", "content": _text(r, 12)}]
    out.sort(key=lambda q: (q["ms"], q["tenant"], q["session"]))
    return out


def _openai_usage(q):
    u = q["usage"]
    return {"prompt_tokens": u["prompt"], "completion_tokens": u["output"], "total_tokens": u["prompt"] + u["output"],
            "prompt_tokens_details": {"cached_tokens": u["cached"]}}


def _openai_body(q):
    return {"model": q["model"], "messages": [{"role": "system", "content": q["system"]}] + q["messages"],
            "tools": q["tools"], "user": q["user"]}


def openai_log(reqs) -> list[dict]:
    """The plain chat log the exports must equal."""
    return [{"timestamp": _iso(q["ms"]), "tenant": q["tenant"], "session": q["session"], "request": _openai_body(q),
             "response": {"object": "chat.completion", "model": q["model"],
                          "choices": [{"index": 0, "message": q["output"], "finish_reason": "stop"}],
                          "usage": _openai_usage(q)}} for q in reqs]


# ------------------------------------------------------------------ OpenTelemetry (OTLP JSON)

def _parts(m: dict) -> dict:
    """An OpenAI chat message → the GenAI conventions' ``{"role", "parts"}``."""
    if m["role"] == "tool":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": m["tool_call_id"],
                                           "response": m["content"]}]}
    parts = [{"type": "text", "content": m["content"]}] if m.get("content") else []
    for c in m.get("tool_calls") or ():
        parts.append({"type": "tool_call", "id": c["id"], "name": c["function"]["name"],
                      "arguments": json.loads(c["function"]["arguments"])})
    out = {"role": m["role"], "parts": parts}
    if m["role"] == "assistant" and m.get("tool_calls"):
        out["finish_reason"] = "tool_call"
    return out


def _kv(key, value):
    if isinstance(value, bool):
        v = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}  # (int64 is a string in OTLP JSON)
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list):
        v = {"arrayValue": {"values": [{"stringValue": x} for x in value]}}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


def _span(trace, span, parent, name, start_ms, dur_ms, attrs, kind=3):
    return {"traceId": trace, "spanId": span, "parentSpanId": parent, "name": name, "kind": kind,
            "startTimeUnixNano": str(start_ms * 1_000_000), "endTimeUnixNano": str((start_ms + dur_ms) * 1_000_000),
            "attributes": [_kv(k, v) for k, v in attrs.items()], "status": {}}


def otel_lines(reqs, seed: int = 0) -> list[dict]:
    """The collector's file-exporter output: one ExportTraceServiceRequest per
    line, a line per tenant-batch of requests; besides each chat span, a tool
    span (execute_tool) and, per line, the agent's root span (invoke_agent)."""
    r = random.Random(seed + 1)
    lines = []
    by_tenant: dict[str, list] = {}
    for q in reqs:
        by_tenant.setdefault(q["tenant"], []).append(q)
    for tenant, qs in by_tenant.items():
        for k in range(0, len(qs), 3):
            spans, trace = [], f"{r.getrandbits(128):032x}"
            root = f"{r.getrandbits(64):016x}"
            batch = qs[k:k + 3]
            spans.append(_span(trace, root, "", "invoke_agent coder", batch[0]["ms"] - 5, 60_000, {
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "coder",
                "gen_ai.conversation.id": batch[0]["session"]}, kind=1))
            for q in batch:
                u = q["usage"]
                sid = f"{r.getrandbits(64):016x}"
                spans.append(_span(trace, sid, root, f"chat {q['model']}", q["ms"], 900, {
                    "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": q["model"], "gen_ai.response.model": q["model"] + "-2025-04-14",
                    "gen_ai.conversation.id": q["session"], "user.id": q["user"],
                    "gen_ai.request.temperature": 0.2, "gen_ai.response.finish_reasons": ["stop"],
                    "server.address": "api.openai.com", "server.port": 443,
                    "gen_ai.usage.input_tokens": u["prompt"], "gen_ai.usage.output_tokens": u["output"],
                    "gen_ai.usage.cache_read.input_tokens": u["cached"],
                    "gen_ai.system_instructions": json.dumps([{"type": "text", "content": q["system"]}]),
                    "gen_ai.tool.definitions": json.dumps([dict(type="function", **t["function"])
                                                           for t in q["tools"]]),
                    "gen_ai.input.messages": json.dumps([_parts(m) for m in q["messages"]]),
                    "gen_ai.output.messages": json.dumps([_parts(q["output"])])}))
                spans.append(_span(trace, f"{r.getrandbits(64):016x}", root, "execute_tool read_file",
                                   q["ms"] + 950, 40, {"gen_ai.operation.name": "execute_tool",
                                                       "gen_ai.tool.name": "read_file",
                                                       "gen_ai.tool.call.id": f"call_{k}"}, kind=1))
            lines.append({"resourceSpans": [{
                "resource": {"attributes": [_kv("service.name", tenant), _kv("service.version", "1.4.2"),
                                            _kv("telemetry.sdk.language", "python")]},
                "scopeSpans": [{"scope": {"name": "opentelemetry.instrumentation.openai_v2", "version": "2.1b0"},
                                "spans": spans}]}]})
    return lines


# ------------------------------------------------------------------ LiteLLM

def _litellm_md(q):
    return {"user_api_key_hash": f"sk-hash-{q['tenant']}", "user_api_key_alias": f"{q['tenant']}-prod",
            "user_api_key_team_id": f"team-{q['tenant']}", "user_api_key_org_id": None,
            "user_api_key_user_id": None, "user_api_key_team_alias": q["tenant"], "spend_logs_metadata": None,
            "requester_ip_address": "", "requester_metadata": {}}


def litellm_payloads(reqs) -> list[dict]:
    """StandardLoggingPayload per request (a custom callback writing
    ``kwargs["standard_logging_object"]``), and one embeddings call."""
    out = []
    for i, q in enumerate(reqs):
        u = q["usage"]
        out.append({
            "id": f"chatcmpl-{i:06d}", "trace_id": q["session"], "call_type": "acompletion",
            "stream": False, "response_cost": 0.0012, "status": "success",
            "custom_llm_provider": "openai", "total_tokens": u["prompt"] + u["output"],
            "prompt_tokens": u["prompt"], "completion_tokens": u["output"],
            "startTime": q["ms"] / 1000, "endTime": q["ms"] / 1000 + 0.9, "completionStartTime": q["ms"] / 1000 + 0.9,
            "response_time": 0.9, "model_map_information": {"model_map_key": q["model"], "model_map_value": None},
            "model": q["model"], "model_id": "deployment-1", "model_group": q["model"],
            "api_base": "https://api.openai.com/v1", "metadata": _litellm_md(q), "cache_hit": None,
            "cache_key": None, "saved_cache_cost": 0.0, "request_tags": [], "end_user": q["user"],
            "requester_ip_address": "", "messages": [{"role": "system", "content": q["system"]}] + q["messages"],
            "response": {"id": f"chatcmpl-{i:06d}", "object": "chat.completion", "model": q["model"],
                         "choices": [{"index": 0, "message": q["output"], "finish_reason": "stop"}],
                         "usage": _openai_usage(q)},
            "error_str": None, "model_parameters": {"temperature": 0.2, "tools": q["tools"]},
            "hidden_params": {"model_id": "deployment-1", "cache_key": None, "api_base": "https://api.openai.com/v1",
                              "response_cost": "0.0012", "additional_headers": {}}})
    q = reqs[0]
    out.insert(1, dict(out[0], id="emb-1", call_type="aembedding", messages=None, response=None,
                       model="text-embedding-3-small"))
    return out


def litellm_spend_rows(reqs) -> list[dict]:
    """Rows of ``LiteLLM_SpendLogs`` as ``/spend/logs`` returns them (JSON columns as strings)."""
    out = []
    for i, q in enumerate(reqs):
        u = q["usage"]
        out.append({
            "request_id": f"req-{i:06d}", "call_type": "acompletion", "api_key": f"sk-hash-{q['tenant']}",
            "spend": 0.0012, "total_tokens": u["prompt"] + u["output"], "prompt_tokens": u["prompt"],
            "completion_tokens": u["output"], "startTime": _iso(q["ms"]).replace("Z", "+00:00"),
            "endTime": _iso(q["ms"] + 900).replace("Z", "+00:00"), "request_duration_ms": 900,
            "completionStartTime": None, "model": q["model"], "model_id": "deployment-1", "model_group": q["model"],
            "custom_llm_provider": "openai", "api_base": "https://api.openai.com/v1", "user": "",
            "metadata": json.dumps(dict(_litellm_md(q), additional_usage_values={
                "prompt_tokens_details": {"cached_tokens": u["cached"]}, "completion_tokens_details": None})),
            "cache_hit": "False", "cache_key": "Cache OFF", "request_tags": "[]", "team_id": f"team-{q['tenant']}",
            "organization_id": None, "end_user": q["user"], "requester_ip_address": "",
            "messages": "{}", "response": "{}", "session_id": q["session"], "status": "success",
            "mcp_namespaced_tool_name": None, "agent_id": None,
            "proxy_server_request": json.dumps(_openai_body(q))})
    return out


# ------------------------------------------------------------------ Langfuse

def langfuse_page(reqs) -> dict:
    """``GET /api/public/v2/observations``: a generation per request, and a SPAN per trace."""
    data = []
    for i, q in enumerate(reqs):
        u = q["usage"]
        trace = f"trace-{q['session']}-{i}"
        data.append({"id": f"span-{i}", "traceId": trace, "type": "SPAN", "name": "agent-step",
                     "startTime": _iso(q["ms"] - 2), "endTime": _iso(q["ms"] + 1000),
                     "projectId": f"proj-{q['tenant']}",
                     "environment": "production", "userId": q["user"], "sessionId": q["session"],
                     "parentObservationId": None, "level": "DEFAULT", "input": None, "output": None, "metadata": {}})
        data.append({
            "id": f"gen-{i}", "traceId": trace, "type": "GENERATION", "name": "OpenAI-generation",
            "startTime": _iso(q["ms"]), "endTime": _iso(q["ms"] + 900), "completionStartTime": _iso(q["ms"] + 850),
            "projectId": f"proj-{q['tenant']}", "environment": "production", "userId": q["user"],
            "sessionId": q["session"], "parentObservationId": f"span-{i}", "level": "DEFAULT", "statusMessage": None,
            "version": None, "model": q["model"], "providedModelName": q["model"],
            "modelParameters": {"temperature": 0.2, "max_tokens": "inf"},
            "input": {"messages": [{"role": "system", "content": q["system"]}] + q["messages"], "tools": q["tools"]},
            "output": q["output"], "metadata": {"ls_provider": "openai"},
            "usageDetails": {"input": u["prompt"] - u["cached"], "input_cached_tokens": u["cached"],
                             "output": u["output"], "total": u["prompt"] + u["output"]},
            "costDetails": {"input": 0.0006, "output": 0.0002, "total": 0.0008},
            "promptName": None, "promptVersion": None, "latency": 0.9, "timeToFirstToken": 0.85})
    return {"data": data, "meta": {"page": 1, "limit": 1000, "totalItems": len(data), "totalPages": 1}}


def write_all(out: Path, seed: int = 0, **kw) -> dict[str, Path]:
    """Every form of the same traffic into ``out``; returns {format: path}."""
    reqs = traffic(seed, **kw)
    out.mkdir(parents=True, exist_ok=True)
    files = {"openai": out / "openai.jsonl", "otel": out / "otel.jsonl", "litellm": out / "litellm.jsonl",
             "litellm-spend": out / "litellm_spend.json", "langfuse": out / "langfuse.json"}
    jsonl = (lambda rows: "".join(json.dumps(x) + "\n" for x in rows))
    files["openai"].write_text(jsonl(openai_log(reqs)))
    files["otel"].write_text(jsonl(otel_lines(reqs, seed)))
    files["litellm"].write_text(jsonl(litellm_payloads(reqs)))
    files["litellm-spend"].write_text(json.dumps(litellm_spend_rows(reqs), indent=1) + "\n")
    files["langfuse"].write_text(json.dumps(langfuse_page(reqs), indent=1) + "\n")
    return files


#: the checked-in fixtures: small, every shape of each export
FIXTURE_ARGS = dict(seed=0, sessions=1, turns=3)

if __name__ == "__main__":  # pragma: no cover
    write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gateways"), **FIXTURE_ARGS)
