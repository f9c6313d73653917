"""`replay show`: one request's stored prompt, its segments and parts, against an independent render."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.show import segment_parts
from replay.cli.main import main
from replay.store import db
from replay.text.render import render_request
from replay.text.segids import MARKER_SEG
from replay.text.tok import load_tokenizer
from replay.text.tokenize import load_prompt_tokens

CANARY = "SHOW-CANARY-SECRET-TEXT"
KEYS = {"request_id", "ts_us", "time", "tenant", "session", "key", "user_id", "model", "format", "source", "line",
        "usage", "n_tokens", "tokens", "segments", "set_aside"}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _chat_log(path):
    """Anthropic requests with tools, a system prompt (string and blocks), tool use and results, a
    conversation without the generation marker's lone part, and the canary in every user message."""
    tools = [{"name": "read_file", "description": "Read a file.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    recs = []
    for s in range(3):
        msgs = [{"role": "user", "content": f"Task {s}: fix it {CANARY}"}]
        if s >= 1:
            msgs += [{"role": "assistant", "content": [
                        {"type": "text", "text": "Reading."},
                        {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a.py"}}]},
                     {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "print(1)"},
                        {"type": "text", "text": f"and now? {CANARY}"}]}]
        body = {"model": "m1", "max_tokens": 10, "messages": msgs,
                "system": "Be brief." if s != 2 else [{"type": "text", "text": "Be brief."},
                                                      {"type": "text", "text": "Cite files."}]}
        if s != 1:
            body["tools"] = tools
        recs.append({"timestamp": 1_700_000_000 + 5 * s, "tenant": "acme", "session": f"s{s}",
                     "prompt_cache_key": "k1", "request": body})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path, recs


def _label(part: int, n_messages: int, first: bool) -> str:
    if first:
        return "bos"
    if part == 2 + n_messages:
        return "generation"
    return {0: "tools", 1: "system"}.get(part) or f"message {part - 2}"


def test_tokens_and_segments_equal_the_stored_prompt_and_an_independent_render(tmp_path, tok):
    log, recs = _chat_log(tmp_path / "chat.jsonl")
    con = db.connect(None)
    api.ingest(con, [str(log)])
    ids = [r for (r,) in con.execute("SELECT request_id FROM requests ORDER BY request_id").fetchall()]
    assert len(ids) == len(recs)
    for rid in ids:
        got = api.show_request(con, rid)
        assert KEYS <= set(got) and "text" not in got
        body = recs[got["line"] - 1]["request"]
        assert (got["tenant"], got["key"], got["model"], got["format"]) == ("acme", "k1", "m1", "anthropic")
        assert got["session"] == f"s{got['line'] - 1}" and got["source"].endswith("chat.jsonl")
        toks, segs = got["tokens"], got["segments"]
        # the stored prompt's tokens, in order
        assert toks == load_prompt_tokens(con, [rid])[rid].tolist()
        assert got["n_tokens"] == len(toks) == sum(s["n_tokens"] for s in segs)
        assert [s["start"] for s in segs] == [sum(x["n_tokens"] for x in segs[:i]) for i in range(len(segs))]
        assert [t for s in segs for t in toks[s["start"]:s["start"] + s["n_tokens"]]] == toks
        # independently: render the logged body, tokenize each piece with the reference (Hugging Face
        # tokenizers) and the whole text at once
        pieces = render_request(body)
        ref = tok.tokenizer
        per_piece = [[tok.marker_id(p)] if k == "marker" else ref.encode(p, add_special_tokens=False).ids
                     for k, p, _ in pieces]
        assert [len(x) for x in per_piece] == [s["n_tokens"] for s in segs]
        assert [t for x in per_piece for t in x] == toks
        whole = "".join(tok.marker_token(p) if k == "marker" else p for k, p, _ in pieces)
        assert ref.encode(whole, add_special_tokens=False).ids == toks
        # the parts and markers, segment by segment
        n_msgs = len(body["messages"])
        assert [s["part"] for s in segs] == [_label(part, n_msgs, i == 0) for i, (_, _, part) in enumerate(pieces)]
        assert [s["marker"] for s in segs] == [p if k == "marker" else None for k, p, _ in pieces]
        assert segs[-1]["part"] == "generation" and segs[0]["part"] == "bos"
        assert ("tools" in {s["part"] for s in segs}) == ("tools" in body)
    # text only when asked: the ids decoded with the tokenizer that encoded them
    shown = api.show_request(con, ids[0], show_text=True)
    assert CANARY in shown["text"] and ref.encode(shown["text"], add_special_tokens=False).ids == shown["tokens"]


def test_segment_parts():
    bos, gen, user = MARKER_SEG["bos"], MARKER_SEG["assistant"], MARKER_SEG["user"]
    assert segment_parts([bos, 11, 12, user, 13, gen], [0, 0, 1, 2, 2, 3]) == [
        "bos", "tools", "system", "message 0", "message 0", "generation"]
    # a last assistant message (no generation marker alone in its part) stays a message
    assert segment_parts([bos, user, 13, gen, 14], [0, 2, 2, 3, 3]) == [
        "bos", "message 0", "message 0", "message 1", "message 1"]
    assert segment_parts([99], [1], "tokens") == ["tokens"]


def test_cli_json_is_exactly_one_object_and_no_text_without_show_text(tmp_path):
    log, _ = _chat_log(tmp_path / "chat.jsonl")
    dbp = str(tmp_path / "c.duckdb")
    res = CliRunner().invoke(main, ["show", "2", str(log), "--db", dbp, "--json"])
    assert res.exit_code == 0, res.output
    assert len(res.stdout.strip().splitlines()) == 1
    got = json.loads(res.stdout)            # stdout is the object and nothing else
    assert isinstance(got, dict) and KEYS <= set(got) and "text" not in got
    assert got["request_id"] == 2 and got["n_tokens"] == len(got["tokens"]) == sum(
        s["n_tokens"] for s in got["segments"])
    assert {"part", "marker", "start", "n_tokens"} <= set(got["segments"][0])
    assert CANARY not in res.output and "Be brief" not in res.output
    table = CliRunner().invoke(main, ["show", "2", "--db", dbp])
    assert table.exit_code == 0, table.output
    assert CANARY not in table.output and "Be brief" not in table.output
    for want in ("generation", "message 2", "cumulative", f"{got['n_tokens']:,} tokens", "session", "s1",
                 "chat.jsonl, line 2"):
        assert want in table.output
    for args in (["--json", "--show-text"], ["--show-text"]):
        res = CliRunner().invoke(main, ["show", "2", "--db", dbp, *args])
        assert res.exit_code == 0, res.output
        assert CANARY in res.output and "Be brief" in res.output
    assert CANARY in json.loads(CliRunner().invoke(main, ["show", "2", "--db", dbp, "--json",
                                                          "--show-text"]).stdout)["text"]


def test_unknown_and_malformed_ids(tmp_path):
    log, _ = _chat_log(tmp_path / "chat.jsonl")
    dbp = str(tmp_path / "c.duckdb")
    assert CliRunner().invoke(main, ["show", "1", str(log), "--db", dbp]).exit_code == 0
    res = CliRunner().invoke(main, ["show", "99", "--db", dbp])
    assert res.exit_code == 1 and "no request 99" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert CliRunner().invoke(main, ["show", "0", "--db", dbp, "--json"]).exit_code == 1
    for bad in ("x", "1.5", ""):
        assert CliRunner().invoke(main, ["show", bad, "--db", dbp]).exit_code == 2
    empty = CliRunner().invoke(main, ["show", "1", "--db", str(tmp_path / "empty.duckdb")])
    assert empty.exit_code == 1 and "holds no requests" in empty.output
    with pytest.raises(api.RequestNotFound):
        api.show_request(db.connect(dbp), 1234)


def test_text_of_another_tokenizer_is_refused(tmp_path):
    log, _ = _chat_log(tmp_path / "chat.jsonl")
    dbp = str(tmp_path / "c.duckdb")
    assert CliRunner().invoke(main, ["show", "1", str(log), "--db", dbp]).exit_code == 0
    con = db.connect(dbp)
    db.set_meta(con, "tokenizer", "some-other-tokenizer")
    con.close()
    res = CliRunner().invoke(main, ["show", "1", "--db", dbp, "--show-text"])
    assert res.exit_code == 2 and "some-other-tokenizer" in res.output and CANARY not in res.output


def test_pre_tokenized_logs_and_block_traces(tmp_path):
    log = tmp_path / "t.jsonl"
    log.write_text(json.dumps({"ts": 1_700_000_000, "tenant": "t", "tokens": [5, 6, 7, 8]}) + "\n")
    con = db.connect(None)
    api.ingest(con, [str(log)])
    got = api.show_request(con, 1)
    assert got["tokens"] == [5, 6, 7, 8] and [(s["part"], s["n_tokens"]) for s in got["segments"]] == [("tokens", 4)]
    mc = tmp_path / "mc.jsonl"
    mc.write_text("".join(json.dumps(r) + "\n" for r in [{"timestamp": 0, "input_length": 1100, "hash_ids": [0, 1, 2]},
                                                         {"timestamp": 5, "input_length": 700, "hash_ids": [0, 3]}]))
    con = db.connect(None)
    api.ingest(con, [str(mc)], format="mooncake")
    got = api.show_request(con, 1, show_text=True)
    assert got["tokens"] is None and got["text"] is None and got["blocks"] == 3 and got["n_tokens"] == 1100
    assert [(s["part"], s["n_tokens"]) for s in got["segments"]] == [("blocks", 1100)]


def test_a_request_set_aside_is_shown_with_its_reason(tmp_path):
    log, _ = _chat_log(tmp_path / "chat.jsonl")
    dbp = str(tmp_path / "c.duckdb")
    assert CliRunner().invoke(main, ["show", "1", str(log), "--db", dbp]).exit_code == 0
    con = db.connect(dbp)   # as the tokenize stage leaves a request it could not render
    con.execute("DELETE FROM prompts WHERE request_id = 1")
    con.execute("INSERT INTO set_aside VALUES (1, 'tokenize', 'unrenderable', 'TypeError', ?)",
                [db.get_meta(con, "tokenizer")])
    con.close()
    res = CliRunner().invoke(main, ["show", "1", "--db", dbp, "--json", "--show-text"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["set_aside"] == {"reason": "unrenderable", "detail": "TypeError"}
    assert (got["tokens"], got["segments"], got["text"]) == (None, [], None)
    table = CliRunner().invoke(main, ["show", "1", "--db", dbp])
    assert table.exit_code == 0 and "set aside (unrenderable: TypeError)" in table.output
