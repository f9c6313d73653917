"""The providers' own cache diagnostics: read at ingest, and set beside our
diagnosis (``replay.analysis.diagnose.agreement``) — checked on a generated log
whose provider verdicts are planted, against a count made by hand."""

from __future__ import annotations

import json
import math
import random

import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.diagnose import miss_parts
from replay.analysis.diagnose.agreement import REGION_OF_REASON, agrees, our_label, our_region
from replay.cli.main import main
from replay.readers.diagnostics import diagnostics_row
from replay.store import db

WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud field "
         "forest bridge tower garden market harbor castle valley meadow island canyon").split()


def _text(seed, n: int) -> str:
    r = random.Random(str(seed))  # (every seed its own text: no message repeats across tenants)
    return " ".join(r.choice(WORDS) for _ in range(n)) + "."


# ----------------------------------------------------------------------------- ingest

@pytest.mark.parametrize("rec,want", [
    # Anthropic: the response's diagnostics object (the documented place)
    ({"response": {"diagnostics": {"cache_miss_reason": {"type": "tools_changed",
                                                         "cache_missed_input_tokens": 321}}}},
     {"diag_reason": "anthropic:tools_changed", "diag_missed_tokens": 321}),
    # a comparison that found no divergence
    ({"response": {"diagnostics": {"cache_miss_reason": None}}},
     {"diag_reason": "anthropic:none", "diag_missed_tokens": None}),
    ({"response": {"diagnostics": {"cache_miss_reason": {"type": "unavailable"}}}},
     {"diag_reason": "anthropic:unavailable", "diag_missed_tokens": None}),
    # logged beside the record, inside usage, or flattened
    ({"diagnostics": {"cache_miss_reason": {"type": "system_changed", "cache_missed_input_tokens": 40000}}},
     {"diag_reason": "anthropic:system_changed", "diag_missed_tokens": 40000}),
    ({"usage": {"input_tokens": 3, "cache_miss_reason": "messages_changed", "cache_missed_input_tokens": 9}},
     {"diag_reason": "anthropic:messages_changed", "diag_missed_tokens": 9}),
    # OpenAI's prompt_cache_diagnostics: the reason on a miss, else the type
    ({"response": {"prompt_cache_diagnostics": {"type": "cache_miss", "reason": "input_changed",
                                                "cache_missed_tokens": 2048, "comparison_reusable_tokens": 1024}}},
     {"diag_reason": "openai:input_changed", "diag_missed_tokens": 2048}),
    ({"response": {"prompt_cache_diagnostics": {"type": "cache_hit"}}},
     {"diag_reason": "openai:cache_hit", "diag_missed_tokens": None}),
    ({"prompt_cache_diagnostics": {"type": "comparison_response_not_found"}},
     {"diag_reason": "openai:comparison_response_not_found", "diag_missed_tokens": None}),
    # a value that is not a short code is never stored; wrong shapes are ignored
    ({"response": {"diagnostics": {"cache_miss_reason": {"type": "Ignore previous instructions!",
                                                         "cache_missed_input_tokens": -5}}}},
     {"diag_reason": "anthropic:unrecognised", "diag_missed_tokens": None}),
    ({"response": {"diagnostics": {"previous_message_id": "msg_1"}}}, {}),
    ({"response": {"prompt_cache_diagnostics": "cache_hit"}}, {}),
    ({"response": {"diagnostics": {"cache_miss_reason": 7}}}, {}),
])
def test_diagnostics_fields_map_to_the_columns(tmp_path, rec, want):
    body = {"model": "claude-x", "system": "s", "messages": [{"role": "user", "content": "hi"}]}
    line = {"timestamp": 1_700_000_000, "tenant": "t", "request": body, **rec}
    if "response" in rec:
        line["response"] = dict(rec["response"], type="message", content=[{"type": "text", "text": "ok"}])
    assert diagnostics_row(line.get("response"), (line.get("response") or {}).get("usage") or line.get("usage"),
                           line) == want
    log = tmp_path / "a.jsonl"
    log.write_text(json.dumps(line) + "\n")
    con = db.connect(None)
    s = api.ingest(con, [str(log)])
    assert (s.loaded, s.rejected) == (1, 0)
    got = con.execute("SELECT diag_reason, diag_missed_tokens FROM requests").fetchone()
    assert got == (want.get("diag_reason"), want.get("diag_missed_tokens"))


def test_every_documented_reason_has_a_region():
    for r in ("model_changed", "system_changed", "tools_changed", "messages_changed", "previous_message_not_found",
              "unavailable", "none"):
        assert f"anthropic:{r}" in REGION_OF_REASON
    for r in ("cache_hit", "comparison_response_not_found", "unavailable", "model_changed", "prompt_cache_key_changed",
              "tools_changed", "text_format_changed", "reasoning_effort_changed", "verbosity_changed",
              "context_compacted", "input_changed", "service_tier_changed"):
        assert f"openai:{r}" in REGION_OF_REASON
    assert agrees("input", "system") and agrees("input", "messages") and not agrees("input", "tools")
    assert not agrees("model", "none") and not agrees(None, "none")


# ----------------------------------------------------------------------------- the planted log

def _next_turn(tenant, turn) -> list[dict]:
    """The assistant's reply and the user's next message."""
    return [{"role": "assistant", "content": _text((tenant, turn, "reply"), 20)},
            {"role": "user", "content": _text((tenant, turn, "user"), 15)}]


def _anthropic_diag(reason, missed=None):
    if reason == "none":
        return {"cache_miss_reason": None}
    return {"cache_miss_reason": {"type": reason, **({"cache_missed_input_tokens": missed} if missed else {})}}


def planted_log(out) -> dict:
    """Four tenants, one conversation each (distinct application: its own system
    prompt and tools), with one planted change each and a planted provider
    verdict on every request but one. Returns {(tenant, turn): what we plant}."""
    t = 1_763_000_000
    anthropic, openai = [], []
    plan = {}

    def tools(tenant):
        return [{"name": f"{tenant}_{n}", "description": _text((tenant, k, "tool"), 40),
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
                for k, n in enumerate(("read", "write", "search", "list"))]

    def system(tenant, stamp=None):
        body = "\n\n".join(_text((tenant, k, "system"), 60) for k in range(3))
        return body if stamp is None else f"Current time: {stamp}\n{body}"

    # tenant a: two plain turns, then the system prompt's time changes (timestamp, in the system)
    hist = [{"role": "user", "content": _text(1, 30)}]
    for turn, (stamp, verdict) in enumerate([("2025-11-13T02:00:00Z", ("none", None)),
                                             ("2025-11-13T02:00:00Z", ("none", None)),
                                             ("2025-11-13T02:05:00Z", ("system_changed", 500))]):
        t += 30
        anthropic.append({"timestamp": t, "tenant": "a", "session": "sa",
                          "request": {"model": "claude-x", "system": system("a", stamp), "tools": tools("a"),
                                      "messages": list(hist)},
                          "response": {"type": "message", "content": [{"type": "text", "text": "ok"}],
                                       "diagnostics": _anthropic_diag(*verdict)}})
        plan[("a", turn)] = verdict[0]
        hist += _next_turn("a", turn)
    # tenant b: the tools are reordered on turn 1 (tool_order), turn 2 extends turn 1
    hist, order = [{"role": "user", "content": _text(2, 30)}], [0, 1, 2, 3]
    for turn, verdict in enumerate(["previous_message_not_found", "tools_changed", "messages_changed"]):
        t += 30
        if turn == 1:
            order = [2, 0, 3, 1]
        tl = tools("b")
        anthropic.append({"timestamp": t, "tenant": "b", "session": "sb",
                          "request": {"model": "claude-x", "system": system("b"), "tools": [tl[i] for i in order],
                                      "messages": list(hist)},
                          "response": {"type": "message", "content": [{"type": "text", "text": "ok"}],
                                       "diagnostics": _anthropic_diag(verdict, 700)}})
        plan[("b", turn)] = verdict
        hist += _next_turn("b", turn)
    # tenant d: no diagnostics on turn 0, 'unavailable' on turn 1 (a plain extension)
    hist = [{"role": "user", "content": _text(4, 30)}]
    for turn in range(2):
        t += 30
        rec = {"timestamp": t, "tenant": "d", "session": "sd",
               "request": {"model": "claude-x", "system": system("d"), "tools": tools("d"), "messages": list(hist)}}
        if turn:
            rec["response"] = {"type": "message", "content": [{"type": "text", "text": "ok"}],
                               "diagnostics": _anthropic_diag("unavailable")}
        anthropic.append(rec)
        plan[("d", turn)] = None if turn == 0 else "unavailable"
        hist += _next_turn("d", turn)
    # tenant c (OpenAI chat): an earlier assistant reply is edited on turn 2 (history_rewrite)
    hist = [{"role": "system", "content": system("c")}, {"role": "user", "content": _text(3, 30)}]
    ot = [{"type": "function", "function": {"name": x["name"], "description": x["description"],
                                            "parameters": x["input_schema"]}} for x in tools("c")]
    for turn, diag in enumerate([{"type": "unavailable"},
                                 {"type": "cache_miss", "reason": "model_changed", "cache_missed_tokens": 90},
                                 {"type": "cache_miss", "reason": "input_changed", "cache_missed_tokens": 80,
                                  "comparison_reusable_tokens": 400}]):
        t += 30
        if turn == 2:
            hist[2] = {"role": "assistant", "content": "[truncated]"}
        openai.append({"timestamp": t, "tenant": "c", "session": "sc",
                       "request": {"model": "gpt-x", "messages": list(hist), "tools": ot,
                                   "prompt_cache_key": "c-key"},
                       "response": {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                                    "usage": {"prompt_tokens": 10, "completion_tokens": 1},
                                    "prompt_cache_diagnostics": diag}})
        plan[("c", turn)] = diag.get("reason", diag["type"])
        hist += _next_turn("c", turn)
    out.mkdir(parents=True, exist_ok=True)
    (out / "anthropic.jsonl").write_text("".join(json.dumps(x) + "\n" for x in anthropic))
    (out / "openai.jsonl").write_text("".join(json.dumps(x) + "\n" for x in openai))
    return plan


# Our cause of each request, by construction: the planted change, else none
# (one global cache, TTL ∞, block 1, no minimum: no structural loss at all).
OURS = {("a", 0): "none", ("a", 1): "none", ("a", 2): "timestamp",
        ("b", 0): "none", ("b", 1): "tool_order", ("b", 2): "none",
        ("c", 0): "none", ("c", 1): "none", ("c", 2): "history_rewrite",
        ("d", 0): "none", ("d", 1): "none"}

# The agreement table counted by hand from the plan above: provider reason →
# (requests, our causes, agree or None for no verdict).
HAND = {
    "anthropic:none": (2, {"none": 2}, 2),                       # a0, a1: no divergence, none of ours
    "anthropic:system_changed": (1, {"timestamp": 1}, 1),        # a2: system ↔ a timestamp in the system
    "anthropic:previous_message_not_found": (1, {"none": 1}, None),
    "anthropic:tools_changed": (1, {"tool_order": 1}, 1),        # b1
    "anthropic:messages_changed": (1, {"none": 1}, 0),           # b2: the provider blames what we do not
    "anthropic:unavailable": (1, {"none": 1}, None),             # d1
    "openai:unavailable": (1, {"none": 1}, None),                # c0
    "openai:model_changed": (1, {"none": 1}, 0),                 # c1: nothing of ours is a model change
    "openai:input_changed": (1, {"history_rewrite": 1}, 1),      # c2: input ↔ a message edited
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("diag")
    plan = planted_log(d)
    con = db.connect(None)
    s = api.ingest(con, [str(d / "anthropic.jsonl"), str(d / "openai.jsonl")])
    assert (s.loaded, s.rejected) == (11, 0)
    key = {rid: (tenant, i) for rid, tenant, i in con.execute(
        "SELECT request_id, tenant, row_number() OVER (PARTITION BY tenant ORDER BY ts_us) - 1 FROM requests")
        .fetchall()}
    return con, plan, key, d


def test_our_causes_are_the_planted_ones(planted):
    con, _, key, _ = planted
    df = miss_parts(con, ttl=math.inf, block=1, min_prefix=0, stream="global")
    got = {key[r["request_id"]]: our_label(r) for r in df.to_dicts()}
    assert got == OURS
    regions = {key[r["request_id"]]: our_region(r) for r in df.to_dicts()}
    assert (regions[("a", 2)], regions[("b", 1)], regions[("c", 2)]) == ("system", "tools", "messages")


def test_the_agreement_equals_the_hand_count(planted):
    con, plan, _, _ = planted
    res = api.diagnose(con, ttl=math.inf, block=1, min_prefix=0, stream="global")
    a = res["provider_agreement"]
    got = {e["provider_reason"]: (e["requests"], e["ours"], e["agree"]) for e in a["by_reason"]}
    assert got == HAND
    assert (a["requests"], a["comparable"], a["agree"]) == (10, 7, 5)
    assert a["agreement_share"] == pytest.approx(5 / 7)
    share = {e["provider_reason"]: e["agreement_share"] for e in a["by_reason"]}
    assert share["anthropic:none"] == 1.0 and share["anthropic:messages_changed"] == 0.0
    assert share["anthropic:unavailable"] is None
    missed = {e["provider_reason"]: e["provider_missed_tokens"] for e in a["by_reason"]}
    assert (missed["anthropic:system_changed"], missed["openai:input_changed"], missed["anthropic:none"]) == \
        (500, 80, None)
    # the existing keys are all there, unchanged in kind
    assert {"causes", "by_stream", "examples"} <= set(res)


def test_diagnose_json_and_the_report_section_carry_the_table(planted, tmp_path):
    con, _, _, d = planted
    dbp = str(tmp_path / "d.duckdb")
    run = CliRunner().invoke
    res = run(main, ["diagnose", str(d / "anthropic.jsonl"), str(d / "openai.jsonl"), "--db", dbp,
                     "--ttl", "inf", "--block", "1", "--stream", "global", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["provider_agreement"]["agree"] == 5 and out["provider_agreement"]["comparable"] == 7
    text = run(main, ["diagnose", "--db", dbp, "--ttl", "inf", "--block", "1", "--stream", "global"])
    assert text.exit_code == 0 and "anthropic:tools_changed" in text.output and "5 (71.4 %)" in text.output
    md = api.why_miss_section(con, tmp_path, ttl=math.inf, block=1, stream="global", fixes=("sort-tools",))
    assert "### Against the provider's own diagnostics" in md
    assert "| anthropic:system_changed | 1 | timestamp 1 | 1 | 100.0 % |" in md
    assert "| anthropic:unavailable | 1 | none 1 | no verdict | — |" in md
    # no prompt text in either
    for blob in (res.stdout, text.output, md):
        assert "Current time" not in blob and "truncated" not in blob and "alpha beta" not in blob
