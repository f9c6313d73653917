"""Gateway and tracing exports (``otel``, ``litellm``, ``langfuse``): detection,
every field mapping, rejects with reasons, counts that reconcile, and a sweep of
each export equal to the sweep of the same traffic logged as a plain chat log."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from replay import api
from replay.cli.main import main
from replay.store import db

from support import gateway_logs as gl
from support.paths import FIXTURES

FIXTURES = FIXTURES / "gateways"
SECRET = "PROMPT-TEXT-never-in-a-reject-7f3a"
NS = 1_000_000_000


def _ingest(tmp_path, lines, fmt=None, name="log.jsonl", fields=None, as_json=False):
    p = tmp_path / name
    p.write_text(json.dumps(lines) if as_json else "".join(json.dumps(x) + "\n" for x in lines))
    con = db.connect(None)
    s = api.ingest(con, [str(p)], format=fmt, fields=fields)
    assert s.reconciles() and s.lines == s.loaded + s.rejected
    return con, s


def _rows(con, cols="*"):
    cur = con.execute(f"SELECT {cols} FROM requests ORDER BY request_id")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _body(con, rid):
    return json.loads(con.execute("SELECT body FROM request_bodies WHERE request_id = ?", [rid]).fetchone()[0])


def _rejects(con):
    return con.execute("SELECT line_no, reason, detail FROM rejects ORDER BY line_no, reason").fetchall()


# ----------------------------------------------------------------------------- fixtures and detection

def test_the_fixtures_are_the_generators_output(tmp_path):
    files = gl.write_all(tmp_path, **gl.FIXTURE_ARGS)
    for p in files.values():
        assert (FIXTURES / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.mark.parametrize("name,fmt", [("otel.jsonl", "otel"), ("litellm.jsonl", "litellm"),
                                      ("litellm_spend.json", "litellm"), ("langfuse.json", "langfuse")])
def test_each_export_is_detected_and_its_counts_reconcile(name, fmt):
    reqs = gl.traffic(**gl.FIXTURE_ARGS)
    con = db.connect(None)
    s = api.ingest(con, [str(FIXTURES / name)])
    src = con.execute("SELECT format, lines, loaded, rejected FROM sources").fetchone()
    assert src[0] == fmt and src[1] == src[2] + src[3] == s.lines
    assert s.loaded == len(reqs)
    # the export's other units, each rejected with its reason
    n_lines = len((FIXTURES / name).read_text().splitlines())
    want = {"otel.jsonl": {"not_llm_span": n_lines + len(reqs)},  # an agent span per line, a tool span per call
            "litellm.jsonl": {"not_llm_call": 1},                 # the embeddings call
            "litellm_spend.json": {},
            "langfuse.json": {"not_generation": len(reqs)}}[name]  # a SPAN per trace
    assert s.rejected_by_reason == want
    assert con.execute("SELECT count(DISTINCT format) FROM requests").fetchone()[0] == 1


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Each form of a larger traffic, ingested and tokenized into its own database."""
    d = tmp_path_factory.mktemp("gw")
    files = gl.write_all(d, seed=3, tenants=("acme", "initech", "globex"), sessions=3, turns=5)
    cons = {}
    for fmt, p in files.items():
        con = db.connect(None)
        api.ingest(con, [str(p)])
        cons[fmt] = con
    return cons, gl.traffic(seed=3, tenants=("acme", "initech", "globex"), sessions=3, turns=5)


GRID = api.Grid(ttls=(10.0, 60.0, math.inf), blocks=(1, 16, 64), min_prefixes=(0, 256),
                streams=("tenant", "session", "global"))


@pytest.mark.parametrize("fmt", ["otel", "litellm", "litellm-spend", "langfuse"])
def test_a_sweep_of_each_export_equals_the_plain_chat_log(exports, fmt):
    """Same prompts token for token (the export's messages read back into a chat
    API's shape), same times, same stream partition: the same sweep, row by row."""
    cons, reqs = exports
    want = api.sweep(cons["openai"], GRID).to_dicts()
    got = api.sweep(cons[fmt], GRID).to_dicts()
    assert got == want and len(got) == GRID.size
    assert {r["requests"] for r in got} == {len(reqs)} and min(r["hit_tokens"] for r in got) < \
        max(r["hit_tokens"] for r in got)
    # prompt by prompt, and the columns besides the tenant's name
    cols = ("ts_us", "session", "user_id", "model", "usage_prompt_tokens", "usage_cached_tokens",
            "usage_output_tokens")
    q = (f"SELECT {', '.join('r.' + c for c in cols)}, p.n_tokens, p.seg_ids FROM requests r "
         "JOIN prompts p USING (request_id) ORDER BY r.ts_us, r.session")
    assert cons[fmt].execute(q).fetchall() == cons["openai"].execute(q).fetchall()
    if fmt != "litellm-spend":  # (a spend log keeps no response)
        q = "SELECT output FROM requests ORDER BY ts_us, session"
        assert cons[fmt].execute(q).fetchall() == cons["openai"].execute(q).fetchall()
    tenants = {t for (t,) in cons[fmt].execute("SELECT DISTINCT tenant FROM requests").fetchall()}
    assert len(tenants) == 3 and "default" not in tenants


# ----------------------------------------------------------------------------- OpenTelemetry

def _kv(k, v):
    return gl._kv(k, v)


def _otel_span(attrs, start_ns=1_763_000_000 * NS + 123_456_789, **extra):
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "chat m", "kind": 3,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + NS),
            "attributes": [_kv(k, v) if not isinstance(v, dict) else {"key": k, "value": v}
                           for k, v in attrs.items()]}
    span.update(extra)
    return span


def _export(*spans, service="svc-a"):
    return {"resourceSpans": [{"resource": {"attributes": [_kv("service.name", service)]},
                               "scopeSpans": [{"scope": {"name": "x"}, "spans": list(spans)}]}]}


BASE = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hello"}]}])}


def test_otel_time_model_ids_and_usage(tmp_path):
    attrs = dict(BASE, **{"gen_ai.response.model": "gpt-4o-2024", "gen_ai.conversation.id": "conv-1",
                          "user.id": "u-9", "gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 7,
                          "gen_ai.usage.cache_read.input_tokens": 1024,
                          "gen_ai.usage.cache_creation.input_tokens": 100,
                          "gen_ai.request.prompt_cache_key": "pck-1"})
    con, s = _ingest(tmp_path, [_export(_otel_span(attrs))])
    r = _rows(con)[0]
    assert r["ts_us"] == 1_763_000_000_123_456  # ns floored to µs, exactly
    assert (r["tenant"], r["session"], r["user_id"], r["model"], r["prompt_cache_key"]) == \
        ("svc-a", "conv-1", "u-9", "gpt-4o", "pck-1")
    assert (r["usage_prompt_tokens"], r["usage_cached_tokens"], r["usage_cache_write_tokens"],
            r["usage_output_tokens"]) == (1200, 1024, 100, 7)  # input_tokens includes the cached part
    assert con.execute("SELECT time_unit FROM sources").fetchone()[0] == "ns"
    # an instrumentation that leaves the cached part out of input_tokens (Anthropic's usage)
    attrs2 = dict(BASE, **{"gen_ai.usage.input_tokens": 50, "gen_ai.usage.cache_read_input_tokens": 1000,
                           "gen_ai.usage.cache_creation_input_tokens": 200, "gen_ai.usage.completion_tokens": 3,
                           "session.id": "sess-2"})
    con, _ = _ingest(tmp_path, [_export(_otel_span(attrs2))], name="b.jsonl")
    r = _rows(con)[0]
    assert (r["usage_prompt_tokens"], r["usage_cached_tokens"], r["usage_cache_write_tokens"],
            r["usage_output_tokens"], r["session"]) == (1250, 1000, 200, 3, "sess-2")
    # no model requested: the response's; no service name: the default tenant
    attrs3 = {k: v for k, v in BASE.items() if k != "gen_ai.request.model"}
    attrs3["gen_ai.response.model"] = "gpt-4o-mini"
    con, _ = _ingest(tmp_path, [{"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [_otel_span(attrs3)]}]}]}],
                     name="c.jsonl")
    r = _rows(con)[0]
    assert (r["model"], r["tenant"], r["session"]) == ("gpt-4o-mini", "default", None)


def test_otel_messages_in_every_shape(tmp_path):
    """The conventions' parts (as a JSON string or as OTLP arrays/kvlists), system
    instructions and tool definitions; the deprecated gen_ai.prompt (attribute or
    event) and OpenLLMetry's flat gen_ai.prompt.<i>.*."""
    parts = [{"role": "user", "parts": [{"type": "text", "content": "look"}]},
             {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "grep",
                                               "arguments": {"q": "x"}}]},
             {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"hits": 2}}]}]
    want_msgs = [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": "look"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q":"x"}'}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": '{"hits":2}'}]
    want_tools = [{"type": "function", "function": {"name": "grep", "description": "d",
                                                    "parameters": {"type": "object"}}}]
    common = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
              "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "be brief"}]),
              "gen_ai.tool.definitions": json.dumps([{"type": "function", "name": "grep", "description": "d",
                                                      "parameters": {"type": "object"}}])}
    as_string = dict(common, **{"gen_ai.input.messages": json.dumps(parts)})

    def kvlist(d):  # a value as OTLP's own structured AnyValue
        if isinstance(d, dict):
            return {"kvlistValue": {"values": [{"key": k, "value": kvlist(v)} for k, v in d.items()]}}
        if isinstance(d, list):
            return {"arrayValue": {"values": [kvlist(x) for x in d]}}
        return {"stringValue": d}
    structured = dict(common, **{"gen_ai.input.messages": kvlist(parts)})
    structured["gen_ai.input.messages"]["arrayValue"]["values"][1]["kvlistValue"]["values"][1]["value"][
        "arrayValue"]["values"][0]["kvlistValue"]["values"][3]["value"] = {"stringValue": '{"q":"x"}'}
    old = {"gen_ai.system": "openai", "gen_ai.request.model": "m",
           "gen_ai.prompt": json.dumps([{"role": "user", "content": "old style"}])}
    event = _otel_span({"gen_ai.request.model": "m"}, events=[{"name": "gen_ai.content.prompt", "timeUnixNano": "1",
                                                               "attributes": [_kv("gen_ai.prompt", json.dumps(
                                                                   [{"role": "user", "content": "from event"}]))]}])
    flat = {"gen_ai.request.model": "m", "gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "sys",
            "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "q",
            "gen_ai.prompt.2.role": "assistant", "gen_ai.prompt.2.tool_calls.0.id": "t1",
            "gen_ai.prompt.2.tool_calls.0.name": "f", "gen_ai.prompt.2.tool_calls.0.arguments": "{}",
            "gen_ai.prompt.3.role": "tool", "gen_ai.prompt.3.tool_call_id": "t1", "gen_ai.prompt.3.content": "ok",
            "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "done"}
    spans = [_otel_span(as_string), _otel_span(structured), _otel_span(old), event, _otel_span(flat)]
    con, s = _ingest(tmp_path, [_export(*spans)])
    assert (s.loaded, s.rejected) == (5, 0)
    rids = [r["request_id"] for r in _rows(con, "request_id")]
    b0, b1 = _body(con, rids[0]), _body(con, rids[1])
    assert b0["messages"] == want_msgs and b0["tools"] == want_tools
    assert b1["messages"] == want_msgs and b1["tools"] == want_tools
    assert _body(con, rids[2])["messages"] == [{"role": "user", "content": "old style"}]
    assert _body(con, rids[3])["messages"] == [{"role": "user", "content": "from event"}]
    assert _body(con, rids[4])["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "t1"}]
    out = con.execute("SELECT output FROM requests WHERE request_id = ?", [rids[4]]).fetchone()[0]
    assert json.loads(out) == {"role": "assistant", "content": "done"}


def test_otel_console_exporter_spans_and_field_mappings(tmp_path):
    """One span per line as the SDK's console exporter writes it (plain attribute
    objects, ISO start time); --field picks an attribute with dots in its name."""
    span = {"name": "chat m", "context": {"trace_id": "0x" + "1" * 32, "span_id": "0x" + "2" * 16},
            "kind": "SpanKind.CLIENT", "parent_id": None, "start_time": "2025-11-13T02:13:20.123456Z",
            "end_time": "2025-11-13T02:13:21.000000Z",
            "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "tenant.id": "t-77",
                           "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                               {"type": "text", "content": "hi"}]}])},
            "events": [], "links": [], "resource": {"attributes": {"service.name": "svc"}, "schema_url": ""}}
    con, s = _ingest(tmp_path, [span], fields={"tenant": "attributes.tenant.id", "session": "trace_id"})
    r = _rows(con)[0]
    assert (r["format"], r["ts_us"], r["tenant"], r["session"]) == \
        ("otel", 1_763_000_000_123_456, "t-77", "0x" + "1" * 32)
    con, s = _ingest(tmp_path, [span], name="b.jsonl")
    assert _rows(con)[0]["tenant"] == "svc"


@pytest.mark.parametrize("bad,reason,field", [
    (_otel_span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "x"}), "not_llm_span",
     "gen_ai.operation.name"),
    (_otel_span({"http.method": "POST"}), "not_llm_span", "gen_ai"),
    (_otel_span(BASE, startTimeUnixNano=None), "missing_timestamp", "startTimeUnixNano"),
    (_otel_span(BASE, startTimeUnixNano=SECRET), "bad_timestamp", "startTimeUnixNano"),
    (_otel_span(BASE, startTimeUnixNano=-5), "bad_timestamp", "startTimeUnixNano"),
    (_otel_span({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}), "no_prompt", "input messages"),
    (_otel_span(dict(BASE, **{"gen_ai.input.messages": SECRET + "{"})), "wrong_type", "gen_ai.input.messages"),
    (_otel_span(dict(BASE, **{"gen_ai.input.messages": "{" + SECRET})), "wrong_type", "gen_ai.input.messages"),
    (_otel_span(dict(BASE, **{"gen_ai.input.messages": json.dumps({"role": SECRET})})), "wrong_type",
     "gen_ai.input.messages"),
    (_otel_span(dict(BASE, **{"gen_ai.input.messages": json.dumps([{"role": "user", "parts": SECRET}])})),
     "wrong_type", "parts"),
    (_otel_span(dict(BASE, **{"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [SECRET]}])})),
     "wrong_type", "parts[0]"),
    (_otel_span(dict(BASE, **{"gen_ai.tool.definitions": json.dumps({"name": SECRET})})), "wrong_type",
     "gen_ai.tool.definitions"),
    (_otel_span(BASE, attributes=[_kv("gen_ai.operation.name", "chat"),
                                  {"key": "bad", "value": {"arrayValue": {"values": SECRET}}}]),
     "wrong_type", "arrayValue"),
    (_otel_span(BASE, attributes=[{"key": 5, "value": {"stringValue": SECRET}}]), "wrong_type", "attributes[0]"),
    ({"resourceSpans": SECRET}, "wrong_type", "resourceSpans"),
    ({"resourceSpans": [SECRET]}, "wrong_type", "resourceSpans[0]"),
    ({"resourceSpans": [{"scopeSpans": SECRET}]}, "wrong_type", "scopeSpans"),
    ({"resourceSpans": [{"scopeSpans": [{"spans": {"x": SECRET}}]}]}, "wrong_type", "spans"),
    ({"resourceSpans": []}, "no_prompt", "resourceSpans"),
])
def test_otel_rejects_name_fields_and_types_never_values(tmp_path, bad, reason, field):
    good = _export(_otel_span(BASE))
    con, s = _ingest(tmp_path, [good, bad, good], fmt="otel")
    assert (s.loaded, s.rejected) == (2, 1)
    (line, got, detail), = _rejects(con)
    assert (line, got) == (2, reason) and field in detail and SECRET not in detail and "hello" not in detail


def test_otel_counts_reconcile_per_span_with_mixed_lines(tmp_path):
    """A line of three spans (a chat span, a tool span, a broken chat span), a line
    with none, and a line that is not JSON: five units, two loaded."""
    line1 = _export(_otel_span(BASE), _otel_span({"gen_ai.operation.name": "execute_tool"}),
                    _otel_span(BASE, startTimeUnixNano=None))
    p = tmp_path / "mixed.jsonl"
    p.write_text(json.dumps(line1) + "\n" + json.dumps({"resourceSpans": []}) + "\n" + "{not json\n"
                 + json.dumps(_export(_otel_span(BASE))) + "\n")
    con = db.connect(None)
    s = api.ingest(con, [str(p)], format="otel")
    assert (s.lines, s.loaded, s.rejected) == (6, 2, 4) and s.reconciles()
    assert [r[:2] for r in _rejects(con)] == [(1, "missing_timestamp"), (1, "not_llm_span"), (2, "no_prompt"),
                                             (3, "malformed_json")]
    assert con.execute("SELECT lines, loaded, rejected FROM sources").fetchone() == (6, 2, 4)


# ----------------------------------------------------------------------------- LiteLLM

def _payload(**kw):
    rec = {"id": "chatcmpl-1", "trace_id": "tr-1", "call_type": "acompletion", "status": "success",
           "startTime": 1763000000.25, "endTime": 1763000001.0, "model": "gpt-4o", "model_group": "gpt-4o",
           "metadata": {"user_api_key_hash": "sk-h1", "user_api_key_team_id": "team-1",
                        "user_api_key_org_id": "org-1", "user_api_key_user_id": "ku-1"},
           "end_user": "eu-1", "prompt_tokens": 900, "completion_tokens": 9,
           "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
           "model_parameters": {"temperature": 0, "tools": [{"type": "function", "function": {"name": "f"}}]},
           "response": {"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "yo"}}],
                        "usage": {"prompt_tokens": 900, "completion_tokens": 9,
                                  "prompt_tokens_details": {"cached_tokens": 768}}}}
    rec.update(kw)
    return rec


def test_litellm_standard_logging_payload_fields(tmp_path):
    con, s = _ingest(tmp_path, [_payload(), {"standard_logging_object": _payload(id="2", startTime=1763000002.5)}])
    assert (s.loaded, s.rejected) == (2, 0)
    r = _rows(con)[0]
    assert (r["format"], r["ts_us"], r["tenant"], r["session"], r["user_id"], r["model"]) == \
        ("litellm", 1_763_000_000_250_000, "sk-h1", "tr-1", "eu-1", "gpt-4o")
    assert (r["usage_prompt_tokens"], r["usage_cached_tokens"], r["usage_output_tokens"]) == (900, 768, 9)
    b = _body(con, r["request_id"])
    assert b["messages"][1] == {"role": "user", "content": "hi"} and b["tools"][0]["function"]["name"] == "f"
    assert json.loads(r["output"]) == {"role": "assistant", "content": "yo"}
    assert _rows(con)[1]["ts_us"] == 1_763_000_002_500_000


def test_litellm_id_fallbacks_usage_and_prompt_shapes(tmp_path):
    md = {"user_api_key_team_id": "team-1", "litellm_session_id": "ls-1",
          "additional_usage_values": {"cache_read_input_tokens": 500, "cache_creation_input_tokens": 40}}
    recs = [
        # no key hash: the team; a session id set by the client; usage from the record and metadata
        _payload(metadata=md, trace_id=None, response=None, end_user=None),
        # the org when there is neither key nor team; a text prompt; no end user: the key's user
        _payload(metadata={"user_api_key_org_id": "org-1", "user_api_key_user_id": "ku-1"}, end_user=None,
                 messages="complete this", model_parameters={}),
        # an Anthropic call through the proxy: the body the client sent, with the provider's diagnostics
        _payload(call_type="anthropic_messages", messages=[{"role": "user", "content": "x"}],
                 proxy_server_request=json.dumps({"model": "claude-x", "system": [{"type": "text", "text": "S"}],
                                                  "messages": [{"role": "user", "content": [
                                                      {"type": "text", "text": "x", "cache_control": {
                                                          "type": "ephemeral"}}]}]}),
                 model="claude-x",
                 response={"type": "message", "content": [{"type": "text", "text": "ok"}],
                           "usage": {"input_tokens": 10, "cache_read_input_tokens": 2000,
                                     "cache_creation_input_tokens": 0, "output_tokens": 4},
                           "diagnostics": {"cache_miss_reason": None}}),
    ]
    con, s = _ingest(tmp_path, recs)
    assert (s.loaded, s.rejected) == (3, 0)
    a, b, c = _rows(con)
    assert (a["tenant"], a["session"], a["user_id"]) == ("team-1", "ls-1", None)
    assert (a["usage_prompt_tokens"], a["usage_cached_tokens"], a["usage_cache_write_tokens"],
            a["usage_output_tokens"]) == (900, 500, 40, 9)
    assert (b["tenant"], b["user_id"]) == ("org-1", "ku-1")
    assert _body(con, b["request_id"])["messages"] == [{"role": "user", "content": "complete this"}]
    assert (c["model"], c["usage_prompt_tokens"], c["usage_cached_tokens"], c["diag_reason"]) == \
        ("claude-x", 2010, 2000, "anthropic:none")
    assert _body(con, c["request_id"])["system"] == [{"type": "text", "text": "S"}]


def test_litellm_spend_log_rows(tmp_path):
    rows = gl.litellm_spend_rows(gl.traffic(**gl.FIXTURE_ARGS))
    con, s = _ingest(tmp_path, rows, name="spend.json", as_json=True)
    assert (s.loaded, s.rejected) == (len(rows), 0)
    r = _rows(con)[0]
    md = json.loads(rows[0]["metadata"])
    assert (r["tenant"], r["session"], r["user_id"]) == (rows[0]["api_key"], rows[0]["session_id"], rows[0]["end_user"])
    assert (r["usage_prompt_tokens"], r["usage_cached_tokens"]) == \
        (rows[0]["prompt_tokens"], md["additional_usage_values"]["prompt_tokens_details"]["cached_tokens"])
    assert _body(con, r["request_id"]) == json.loads(rows[0]["proxy_server_request"])


@pytest.mark.parametrize("bad,reason,field", [
    (_payload(call_type="aembedding"), "not_llm_call", "call_type"),
    (_payload(call_type=["x", SECRET]), "wrong_type", "call_type"),
    (_payload(startTime=None), "missing_timestamp", "startTime"),
    (_payload(startTime=SECRET), "bad_timestamp", "startTime"),
    (_payload(messages=None), "no_prompt", "messages"),
    (_payload(messages=[SECRET]), "wrong_type", "messages[0]"),
    (_payload(messages=42), "wrong_type", "messages"),
    (_payload(messages="[" + SECRET), "wrong_type", "messages"),
    (_payload(metadata="{" + SECRET), "wrong_type", "metadata"),
    (_payload(metadata={"user_api_key_hash": [SECRET]}), "wrong_type", "tenant"),
    (_payload(model={"name": SECRET}), "wrong_type", "model"),
    (_payload(messages=[], model_parameters={}), "no_prompt", "messages"),
])
def test_litellm_rejects_name_fields_and_types_never_values(tmp_path, bad, reason, field):
    con, s = _ingest(tmp_path, [_payload(), bad, _payload()], fmt="litellm")
    assert (s.loaded, s.rejected) == (2, 1)
    (line, got, detail), = _rejects(con)
    assert (line, got) == (2, reason) and field in detail and SECRET not in detail, detail


# ----------------------------------------------------------------------------- Langfuse

def _obs(**kw):
    o = {"id": "g1", "traceId": "t1", "type": "GENERATION", "name": "gen", "startTime": "2025-11-13T02:13:20.5Z",
         "projectId": "proj-1", "environment": "prod", "userId": "u1", "sessionId": "s1", "model": "gpt-4o",
         "input": [{"role": "user", "content": "hi"}], "output": {"role": "assistant", "content": "yo"},
         "usageDetails": {"input": 100, "input_cached_tokens": 1024, "output": 5, "total": 1129}}
    o.update(kw)
    return o


def test_langfuse_observation_fields(tmp_path):
    page = {"data": [_obs(), _obs(id="sp", type="SPAN"), _obs(id="g2", startTime="2025-11-13T02:13:21Z")],
            "meta": {"page": 1, "limit": 50, "totalItems": 3, "totalPages": 1}}
    con, s = _ingest(tmp_path, page, name="page.json", as_json=True)
    assert (s.lines, s.loaded, s.rejected, s.rejected_by_reason) == (3, 2, 1, {"not_generation": 1})
    r = _rows(con)[0]
    assert (r["format"], r["ts_us"], r["tenant"], r["session"], r["user_id"], r["model"]) == \
        ("langfuse", 1_763_000_000_500_000, "proj-1", "s1", "u1", "gpt-4o")
    assert (r["usage_prompt_tokens"], r["usage_cached_tokens"], r["usage_output_tokens"]) == (1124, 1024, 5)
    assert json.loads(r["output"]) == {"role": "assistant", "content": "yo"}


def test_langfuse_inputs_usage_and_ids(tmp_path):
    recs = [
        _obs(input="a plain prompt", output="text out", usageDetails={
            "input": 10, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 300, "output": 1}),
        _obs(input={"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function",
                                                                              "function": {"name": "f"}}]},
             usageDetails=None, usage={"input": 77, "output": 3, "unit": "TOKENS"}, projectId=None,
             sessionId=None),
        _obs(input={"role": "user", "content": "one"}, type="generation", usageDetails={}),
        _obs(input=json.dumps([{"role": "user", "content": "as a string"}])),
    ]
    con, s = _ingest(tmp_path, recs)
    assert (s.loaded, s.rejected) == (4, 0)
    a, b, c, d = _rows(con)
    assert _body(con, a["request_id"])["messages"] == [{"role": "user", "content": "a plain prompt"}]
    assert (a["usage_prompt_tokens"], a["usage_cached_tokens"], a["usage_cache_write_tokens"]) == (2310, 2000, 300)
    assert json.loads(a["output"]) == {"role": "assistant", "content": "text out"}
    assert _body(con, b["request_id"])["tools"][0]["function"]["name"] == "f"
    assert (b["usage_prompt_tokens"], b["tenant"], b["session"]) == (77, "prod", None)
    assert _body(con, c["request_id"])["messages"] == [{"role": "user", "content": "one"}]
    assert _body(con, d["request_id"])["messages"] == [{"role": "user", "content": "as a string"}]


@pytest.mark.parametrize("bad,reason,field", [
    (_obs(type="EVENT"), "not_generation", "type"),
    (_obs(type=[SECRET]), "not_generation", "type"),
    (_obs(startTime=None), "missing_timestamp", "startTime"),
    (_obs(startTime=SECRET), "bad_timestamp", "startTime"),
    (_obs(input=None), "no_prompt", "input"),
    (_obs(input=12), "wrong_type", "input"),
    (_obs(input={"foo": SECRET}), "wrong_type", "input"),
    (_obs(input=[SECRET]), "wrong_type", "messages[0]"),
    (_obs(input=[{"role": "user", "content": {"x": SECRET}}]), "wrong_type", "messages[0].content"),
    (_obs(userId={"id": SECRET}), "wrong_type", "user_id"),
])
def test_langfuse_rejects_name_fields_and_types_never_values(tmp_path, bad, reason, field):
    con, s = _ingest(tmp_path, [_obs(), bad, _obs()], fmt="langfuse")
    assert (s.loaded, s.rejected) == (2, 1)
    (line, got, detail), = _rejects(con)
    assert (line, got) == (2, reason) and field in detail and SECRET not in detail, detail


def test_a_langfuse_page_that_is_not_one(tmp_path):
    con, s = _ingest(tmp_path, [{"data": SECRET, "meta": {}}, {"data": [], "meta": {}}], fmt="langfuse")
    assert [r[1] for r in _rejects(con)] == ["wrong_type", "no_prompt"] and s.loaded == 0
    assert all(SECRET not in r[2] for r in _rejects(con))


# ----------------------------------------------------------------------------- command line

@pytest.mark.parametrize("name", ["otel.jsonl", "litellm.jsonl", "litellm_spend.json", "langfuse.json"])
def test_sweep_command_on_each_fixture_prints_exactly_json(tmp_path, name):
    fmt = {"otel.jsonl": "otel", "langfuse.json": "langfuse"}.get(name, "litellm")
    res = CliRunner().invoke(main, ["sweep", str(FIXTURES / name), "--db", str(tmp_path / "x.duckdb"),
                                    "--format", fmt, "--ttl", "5m,inf", "--block", "1,16", "--min-prefix", "0",
                                    "--stream", "tenant,global", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    plain = CliRunner().invoke(main, ["sweep", str(FIXTURES / "openai.jsonl"), "--db", str(tmp_path / "p.duckdb"),
                                      "--ttl", "5m,inf", "--block", "1,16", "--min-prefix", "0",
                                      "--stream", "tenant,global", "--json"])
    assert rows == json.loads(plain.stdout) and any(r["hit_tokens"] for r in rows)
