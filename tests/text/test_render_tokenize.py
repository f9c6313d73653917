"""Render (neutral template) + tokenize stage: exactness of content-addressed segments."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import zlib

import numpy as np
import pytest

from replay.store import db
from replay.text.render import (
    DEFAULT_IMAGE_TOKENS,
    MARKERS,
    image_tokens_from_base64,
    render_layout,
    render_output,
    render_request,
    render_text,
)
from replay.text.segids import image_seg_id, marker_seg_id, text_seg_id, tokens_seg_id
from replay.text.tok import Tok, _deepseek_tokenizer_json, load_tokenizer
from replay.text.tokenize import load_prompt_tokens, tokenize_stage
from support.text import (
    ANTHROPIC_BODIES,
    OPENAI_BODIES,
    add_requests,
    agent_bodies,
    make_local_tokenizer,
)


# --------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def tok() -> Tok:
    return load_tokenizer()


def png_b64(w: int, h: int) -> str:
    """A real, decodable 8-bit grayscale PNG of w×h."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + bytes((x * 7 + y) % 256 for x in range(w)) for y in range(h))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


def segmentwise(tok: Tok, pieces) -> list[int]:
    out: list[int] = []
    for kind, payload, _ in pieces:
        if kind == "marker":
            out.append(tok.marker_id(payload))
        elif kind == "text":
            out.extend(tok.encode(payload))
        else:
            out.extend(tok.image_tokens(*payload).tolist())
    return out


def whole(tok: Tok, pieces) -> list[int]:
    return tok.tokenizer.encode(render_text(pieces, tok), add_special_tokens=False).ids


# --------------------------------------------------------------------------- markers

def test_markers_are_added_special_tokens_of_shipped_tokenizer(tok):
    data = json.loads(_deepseek_tokenizer_json().read_text(encoding="utf-8"))
    added = {t["content"]: t["id"] for t in data["added_tokens"]}
    for name, s in MARKERS.items():
        assert s in added, name
        assert tok.marker_id(name) == added[s]
        assert tok.encode(s) == [added[s]]
    assert tok.name == "deepseek-v4"
    assert tok.encode("hello") == tok.tokenizer.encode("hello", add_special_tokens=False).ids


# --------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("body", ANTHROPIC_BODIES, ids=lambda b: f"anthropic{len(json.dumps(b))}")
def test_segmentwise_equals_whole_anthropic(tok, body):
    pieces = render_request(body, "anthropic")
    assert segmentwise(tok, pieces) == whole(tok, pieces)


@pytest.mark.parametrize("body", OPENAI_BODIES, ids=lambda b: f"openai{len(json.dumps(b))}")
def test_segmentwise_equals_whole_openai(tok, body):
    pieces = render_request(body, "openai")
    assert segmentwise(tok, pieces) == whole(tok, pieces)


def test_segmentwise_equals_whole_outputs(tok):
    for out, fmt in [
        ([{"type": "thinking", "thinking": "hm "}, {"type": "text", "text": " Done.\n"},
          {"type": "tool_use", "id": "x", "name": "bash", "input": {"z": 1, "a": 2}}], "anthropic"),
        ({"role": "assistant", "content": "hi  ", "reasoning_content": "r",
          "tool_calls": [{"id": "c", "type": "function",
                          "function": {"name": "f", "arguments": "{}"}}]}, "openai"),
    ]:
        prompt = render_request({"messages": [{"role": "user", "content": "q"}]}, fmt)
        pieces = prompt + render_output(out, fmt)
        assert pieces[-1][:2] == ("marker", "eos")
        assert segmentwise(tok, pieces) == whole(tok, pieces)


def test_segmentwise_equals_whole_with_a_local_tokenizer(tmp_path):
    d = make_local_tokenizer(tmp_path / "tiny")
    t = load_tokenizer(d)
    for body in ANTHROPIC_BODIES + OPENAI_BODIES:
        pieces = render_request(body, "anthropic")
        assert segmentwise(t, pieces) == whole(t, pieces)


def test_piece_structure_and_parts():
    body = ANTHROPIC_BODIES[1]
    pieces = render_request(body, "anthropic")
    n = len(body["messages"])
    assert pieces[0] == ("marker", "bos", 0)
    assert pieces[-1] == ("marker", "assistant", 2 + n)
    assert [p[2] for p in pieces] == sorted(p[2] for p in pieces)
    assert {p[2] for p in pieces} == {0, 1} | {2 + k for k in range(n + 1)}
    kinds = [p[0] for p in pieces]
    # a marker sits between any two text pieces, and no text piece is empty
    for a, b in zip(pieces, pieces[1:]):
        assert not (a[0] == "text" and b[0] == "text")
    assert all(p[1] for p in pieces if p[0] == "text")
    assert kinds.count("marker") > kinds.count("text")
    # cache_control is never rendered
    assert not any("cache_control" in p[1] for p in pieces if p[0] == "text")
    # render is deterministic
    assert render_request(json.loads(json.dumps(body)), "anthropic") == pieces


def test_openai_roles_render_in_place():
    pieces = render_request(OPENAI_BODIES[1], "openai")
    roles = [p[1] for p in pieces if p[0] == "marker" and p[1] in
             ("user", "assistant", "system", "tool_result")]
    # developer→system, user, assistant, tool→tool_result ×2, assistant, system, user, generation
    assert roles == ["system", "user", "assistant", "tool_result", "tool_result", "assistant",
                     "system", "user", "assistant"]
    calls = [pieces[i + 1][1] for i, p in enumerate(pieces) if p[1] == "tool_call"]
    assert calls == ['{"name":"get_weather","arguments":"{\\"location\\": \\"Paris\\"}"}',
                     '{"name":"get_weather","arguments":"{\\"location\\":\\"東京\\"}"}']


def test_layout_breakpoints_point_at_last_piece_of_marked_block():
    body = ANTHROPIC_BODIES[1]
    pieces, bps = render_layout(body, "anthropic")
    assert pieces == render_request(body, "anthropic")
    assert len(bps) == 3
    assert pieces[bps[0]][1].startswith('{"name":"str_replace_editor"')   # tool def
    assert pieces[bps[1]] == ("text", "\n\nsecond block\n", 1)            # system block
    assert pieces[bps[2]] == ("text", "total 0\r\ndrwx  2 root\n\n", 4)   # tool result
    assert render_layout({"messages": [{"role": "user", "content": "x"}]})[1] == []


# --------------------------------------------------------------------------- key order

def test_tool_definition_key_order_is_kept(tok):
    raw = ('{"tools":[{"name":"zeta","input_schema":{"type":"object","required":["b","a"],'
           '"properties":{"b":{"type":"string"},"a":{"type":"integer"}}},"description":"Zé"}],'
           '"messages":[{"role":"user","content":"hi"}]}')
    body = json.loads(raw)
    pieces = render_request(body, "anthropic")
    tool_text = pieces[2][1]
    assert pieces[1] == ("marker", "tool_def", 0)
    assert tool_text == raw[len('{"tools":['):raw.index('],"messages"')]
    assert tool_text != json.dumps(body["tools"][0], separators=(",", ":"), sort_keys=True,
                                   ensure_ascii=False)
    swapped = json.loads(raw)
    t = swapped["tools"][0]
    swapped["tools"][0] = {"description": t["description"], "name": t["name"],
                           "input_schema": t["input_schema"]}
    p2 = render_request(swapped, "anthropic")
    assert p2[2][1] != tool_text
    assert segmentwise(tok, p2) != segmentwise(tok, pieces)
    assert text_seg_id(p2[2][1]) != text_seg_id(tool_text)


def test_tool_use_input_key_order_is_kept():
    body = json.loads('{"messages":[{"role":"assistant","content":[{"type":"tool_use",'
                      '"input":{"z":1,"a":{"y":2,"b":3}},"name":"t","id":"1"}]}]}')
    pieces = render_request(body, "anthropic")
    assert ("text", '{"input":{"z":1,"a":{"y":2,"b":3}},"name":"t"}', 2) in pieces


# --------------------------------------------------------------------------- images

def image_body(data: str, media: str = "image/png") -> dict:
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}]}]}


def test_image_token_estimate_from_real_png_header():
    assert image_tokens_from_base64(png_b64(100, 30)) == 4          # ceil(3000/750)
    assert image_tokens_from_base64(png_b64(61, 37)) == 4           # ceil(2257/750)
    big = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
                           + struct.pack(">II", 4000, 3000) + b"\x08\x02\x00\x00\x00").decode()
    assert image_tokens_from_base64(big) == 1600                     # capped
    gif = base64.b64encode(b"GIF89a" + struct.pack("<HH", 300, 250) + b"\x00" * 8).decode()
    assert image_tokens_from_base64(gif) == 100
    jpeg = (b"\xff\xd8" + b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
            + b"\xff\xc0" + struct.pack(">HBHH", 17, 8, 150, 200) + b"\x03" + b"\x00" * 9)
    assert image_tokens_from_base64(base64.b64encode(jpeg).decode()) == 40   # 200×150
    webp = (b"RIFF" + struct.pack("<I", 30) + b"WEBP" + b"VP8X" + struct.pack("<I", 10)
            + b"\x00" * 4 + (639).to_bytes(3, "little") + (479).to_bytes(3, "little"))
    assert image_tokens_from_base64(base64.b64encode(webp).decode()) == 410  # 640×480
    assert image_tokens_from_base64("bm90IGFuIGltYWdl") == DEFAULT_IMAGE_TOKENS
    assert image_tokens_from_base64("%%%") == DEFAULT_IMAGE_TOKENS


def test_image_placeholders_are_deterministic(tok):
    a, b = png_b64(100, 30), png_b64(100, 31)
    pa_ = render_request(image_body(a), "anthropic")
    img = [p for p in pa_ if p[0] == "image"]
    assert len(img) == 1
    i = pa_.index(img[0])
    assert pa_[i - 1][:2] == ("marker", "image")
    sha, n = img[0][1]
    assert sha == hashlib.sha256(a.encode()).hexdigest() and n == 4
    run1 = tok.image_tokens(sha, n)
    assert np.array_equal(run1, load_tokenizer().image_tokens(sha, n))  # same data → same run
    assert run1.dtype == np.int32 and ((run1 >= 0) & (run1 < 128000)).all()
    sha_b, n_b = [p for p in render_request(image_body(b), "anthropic") if p[0] == "image"][0][1]
    assert sha_b != sha
    assert not np.array_equal(tok.image_tokens(sha_b, n_b), run1)   # different data → different run
    # openai data URL of the same bytes: same hash, same estimate
    oa = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + a}}]}]}
    assert [p for p in render_request(oa, "openai") if p[0] == "image"][0][1] == (sha, n)
    url = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}
    assert [p for p in render_request(url, "openai") if p[0] == "image"][0][1][1] == DEFAULT_IMAGE_TOKENS
    with pytest.raises(ValueError):
        render_text(pa_)


# --------------------------------------------------------------------------- seg ids

def test_seg_id_definitions():
    def h(b: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(b).digest()[:8], "big")
    assert text_seg_id("héllo") == h(b"text\0" + "héllo".encode())
    assert marker_seg_id("user") == h(b"marker\0user")
    assert image_seg_id("ab" * 32, 7) == h(b"image\0" + b"ab" * 32 + b"\0" + b"7")
    assert tokens_seg_id([1, 2, 3]) == h(b"tokens\0" + np.array([1, 2, 3], "<i4").tobytes())
    assert 0 <= text_seg_id("x") < 2 ** 64


# --------------------------------------------------------------------------- stage

class CountingTok(Tok):
    """Records every text handed to the encoder."""

    def __init__(self, base: Tok):
        self.__dict__.update(base.__dict__)
        self.owns_process = False  # (base's encoder process: base stops it)
        self.seen: list[str] = []

    def encode_arrays(self, texts):
        texts = list(texts)
        self.seen.extend(texts)
        return super().encode_arrays(texts)


def test_tokenize_stage_end_to_end(tok):
    con = db.connect(None)
    bodies = agent_bodies(6)
    rows = [{"body": b} for b in bodies]
    rows[2]["output"] = [{"type": "text", "text": "ok "}, {"type": "tool_use", "id": "t",
                                                           "name": "bash", "input": {"c": 1}}]
    rows.append({"format": "openai", "body": OPENAI_BODIES[1],
                 "output": {"role": "assistant", "content": "bye"}})
    rows.append({"format": "tokens", "tokens": [5, 6, 7, 8], "output_tokens": [9, 10]})
    rows.append({"format": "tokens", "tokens": [5, 6, 7, 8]})
    rows.append({"format": "mooncake", "block_ids": [1, 2, 3]})
    add_requests(con, rows)
    ctok = CountingTok(tok)
    s = tokenize_stage(con, ctok, chunk_requests=3)

    assert s.requests == 9 and s.new_prompts == 9 and s.skipped == 1 and s.failed == 0
    # every unique text was encoded exactly once
    assert len(ctok.seen) == len(set(ctok.seen))
    all_texts = set()
    for b in bodies + [OPENAI_BODIES[1]]:
        all_texts |= {p[1] for p in render_request(b, "anthropic") if p[0] == "text"}
    all_texts |= {p[1] for p in render_output(rows[2]["output"], "anthropic") if p[0] == "text"}
    all_texts.add("bye")
    assert set(ctok.seen) == all_texts
    n_seg = con.execute("SELECT count(*) FROM segments").fetchone()[0]
    assert s.unique_segments == n_seg
    assert s.unique_tokens == con.execute("SELECT sum(n_tokens) FROM segments").fetchone()[0]
    assert s.logical_tokens == con.execute("SELECT sum(n_tokens) FROM prompts").fetchone()[0]
    assert s.logical_tokens > s.unique_tokens
    # n_tokens == Σ segment n_tokens; seg_parts aligned with seg_ids
    bad = con.execute("""
        SELECT count(*) FROM (
          SELECT p.request_id, any_value(p.n_tokens) AS n, sum(s.n_tokens) AS total
          FROM prompts p, unnest(p.seg_ids) AS u(sid) JOIN segments s ON s.seg_id = u.sid
          GROUP BY p.request_id) WHERE n <> total""").fetchone()[0]
    assert bad == 0
    assert con.execute("SELECT count(*) FROM prompts WHERE len(seg_ids) <> len(seg_parts)"
                       ).fetchone()[0] == 0
    assert db.get_meta(con, "tokenizer") == "deepseek-v4"

    # full prompts equal whole-prompt tokenization
    toks = load_prompt_tokens(con, range(9))
    assert set(toks) == set(range(9))
    for rid, b in enumerate(bodies):
        pieces = render_request(b, "anthropic")
        assert toks[rid].tolist() == whole(tok, pieces)
        parts = con.execute("SELECT seg_parts FROM prompts WHERE request_id = ?", [rid]).fetchone()[0]
        assert parts == [p[2] for p in pieces]
    # prompts share prefixes: request k's tokens are a prefix of request k+1's up to the generation marker
    for k in range(5):
        a, b = toks[k], toks[k + 1]
        assert np.array_equal(a[:-1], b[:len(a) - 1])

    # output
    out_n, out_ids = con.execute(
        "SELECT output_n_tokens, output_seg_ids FROM prompts WHERE request_id = 2").fetchone()
    out_pieces = render_output(rows[2]["output"], "anthropic")
    assert out_n == len(segmentwise(tok, out_pieces)) and len(out_ids) == len(out_pieces)
    with_out = load_prompt_tokens(con, [2], with_output=True)[2]
    assert with_out.tolist() == toks[2].tolist() + segmentwise(tok, out_pieces)
    assert con.execute("SELECT count(*) FROM prompts WHERE output_seg_ids IS NULL").fetchone()[0] == 6

    # tokens format
    r = con.execute("SELECT n_tokens, seg_parts, output_n_tokens, seg_ids FROM prompts "
                    "WHERE request_id IN (7, 8) ORDER BY request_id").fetchall()
    assert r[0][:3] == (4, [1], 2) and r[1][:3] == (4, [1], None)
    assert r[0][3] == r[1][3] == [tokens_seg_id([5, 6, 7, 8])]
    assert toks[7].tolist() == [5, 6, 7, 8]
    assert load_prompt_tokens(con, [7], with_output=True)[7].tolist() == [5, 6, 7, 8, 9, 10]
    # mooncake: no prompt row
    assert 9 not in load_prompt_tokens(con, [9])

    # idempotent
    ctok.seen.clear()
    s2 = tokenize_stage(con, ctok)
    assert (s2.requests, s2.new_prompts, s2.unique_segments, s2.unique_tokens) == (0, 0, 0, 0)
    assert ctok.seen == []
    # new requests only tokenize new content
    add_requests(con, [{"body": agent_bodies(7)[-1]}])
    s3 = tokenize_stage(con, ctok)
    assert s3.new_prompts == 1 and 0 < s3.unique_segments <= 4
    assert len(ctok.seen) == len(set(ctok.seen)) <= 2


def test_chunking_does_not_change_results(tok):
    results = []
    for chunk in (1, 4, 1000):
        con = db.connect(None)
        add_requests(con, [{"body": b} for b in agent_bodies(5)]
                     + [{"format": "openai", "body": b} for b in OPENAI_BODIES])
        tokenize_stage(con, tok, chunk_requests=chunk, batch_chars=50)
        results.append((
            con.execute("SELECT * FROM prompts ORDER BY request_id").fetchall(),
            con.execute("SELECT * FROM segments ORDER BY seg_id").fetchall()))
    assert results[0] == results[1] == results[2]


def test_a_failed_commit_keeps_the_chunks_before_it_and_a_rerun_completes(tok, monkeypatch):
    """Each chunk's COMMIT runs on a thread beside the next chunk's work
    (db.Deferred). When one fails, the stage raises it; the chunks
    committed before stay, that chunk's rows are not there, and running the
    stage again gives what a run without the failure gives."""
    import replay.text.tokenize as rt

    def requests(con):
        add_requests(con, [{"body": b} for b in agent_bodies(6)]
                     + [{"format": "openai", "body": b} for b in OPENAI_BODIES])

    clean = db.connect(None)
    requests(clean)
    tokenize_stage(clean, tok, chunk_requests=2)
    want = (clean.execute("SELECT * FROM prompts ORDER BY request_id").fetchall(),
            clean.execute("SELECT * FROM segments ORDER BY seg_id").fetchall())

    con = db.connect(None)
    requests(con)
    real, calls = rt._commit, []

    def failing_second(c):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        real(c)

    monkeypatch.setattr(rt, "_commit", failing_second)
    with pytest.raises(RuntimeError, match="disk full"):
        tokenize_stage(con, tok, chunk_requests=2)
    first_chunk = [r[0] for r in con.execute("SELECT request_id FROM requests ORDER BY 1 LIMIT 2").fetchall()]
    assert [r[0] for r in con.execute("SELECT request_id FROM prompts ORDER BY 1").fetchall()] == first_chunk
    monkeypatch.setattr(rt, "_commit", real)
    tokenize_stage(con, tok, chunk_requests=2)
    assert (con.execute("SELECT * FROM prompts ORDER BY request_id").fetchall(),
            con.execute("SELECT * FROM segments ORDER BY seg_id").fetchall()) == want


def test_an_unrenderable_request_is_set_aside_and_the_pipeline_goes_on(tok, capsys):
    """A request the stage cannot render is set aside with its reason (no prompt
    text), stays loaded, is not tried again, and the replay and sweep go on
    without it (they used to refuse: "run the tokenize stage first")."""
    from replay.core.grid import Grid
    from replay.core.sweep import sweep
    from replay.prepare import prepare

    con = db.connect(None)
    add_requests(con, [{"body": {"messages": [{"role": "user", "content": "ok"}]}},
                       {"format": "tokens"},
                       {"body": {"messages": [{"role": "user", "content": "ok again"}]}}])
    s = tokenize_stage(con, tok)
    assert s.new_prompts == 2 and s.failed == 1
    assert "set aside" in capsys.readouterr().err
    aside = con.execute("SELECT request_id, stage, reason, detail FROM set_aside").fetchall()
    assert aside == [(1, "tokenize", "unrenderable", "cannot render the request body (ValueError)")]
    assert db.untokenized(con) == 0
    assert tokenize_stage(con, tok).requests == 0  # not tried again
    prepare(con, modes=("global",))
    df = sweep(con, Grid(streams=("global",), ttls=(float("inf"),), blocks=(1,), min_prefixes=(0,)))
    assert df["requests"].to_list() == [2]
    loaded = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    replayed = con.execute("SELECT count(*) FROM walks WHERE mode = 'global'").fetchone()[0]
    assert loaded == replayed + len(aside)  # the counts reconcile


def test_a_request_with_an_unrenderable_body_part_is_set_aside(tmp_path, tok, monkeypatch):
    """Bodies stored as content-addressed parts: a part that cannot be rendered sets
    aside every request holding it, and only those."""
    from replay.readers.ingest import ingest
    from replay.synth.generator import generate
    from replay.text import blob_cache as tokenize_module
    from replay.text.tok import load_tokenizer

    generate(tmp_path / "logs", seed=3, scale=0.2)
    con = db.connect(tmp_path / "x.duckdb")
    ingest(con, [str(tmp_path / "logs")])
    bad = con.execute("SELECT blob_id, text FROM blobs WHERE kind = 'message' LIMIT 1").fetchone()
    bad_obj = json.loads(bad[1])
    holders = {r for (r,) in con.execute("SELECT request_id FROM requests WHERE list_contains(body_blobs, ?)",
                                         [bad[0]]).fetchall()}
    real = tokenize_module.render_part

    def render_part(kind, obj, part=2):
        if kind == "message" and obj == bad_obj:
            raise RecursionError("too deep")
        return real(kind, obj, part)

    monkeypatch.setattr(tokenize_module, "render_part", render_part)
    monkeypatch.setenv("REPLAY_ENCODER", "inline")  # (the helper process would render it itself)
    s = tokenize_stage(con, load_tokenizer())
    aside = dict(con.execute("SELECT request_id, detail FROM set_aside").fetchall())
    assert set(aside) == holders and s.failed == len(holders) > 0
    assert all(d == "cannot render the request body (RecursionError)" for d in aside.values())
    n = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    assert con.execute("SELECT count(*) FROM prompts").fetchone()[0] == n - len(holders)


def test_switching_tokenizer_clears_old_rows(tmp_path, tok):
    d = make_local_tokenizer(tmp_path / "tiny")
    local = load_tokenizer(str(d))
    assert local.name.startswith("tiny-") and len(local.name) == len("tiny-") + 8
    for name in MARKERS:
        assert local.encode(MARKERS[name]) == [local.marker_id(name)]

    con = db.connect(tmp_path / "x.duckdb")
    add_requests(con, [{"body": b} for b in agent_bodies(3)])
    s1 = tokenize_stage(con, tok)
    assert s1.new_prompts == 3 and not s1.cleared
    ds_tokens = load_prompt_tokens(con, [2])[2]

    s2 = tokenize_stage(con, str(d))
    assert s2.cleared and s2.new_prompts == 3
    assert db.get_meta(con, "tokenizer") == local.name
    local_tokens = load_prompt_tokens(con, [2])[2]
    assert local_tokens.tolist() == whole(local, render_request(agent_bodies(3)[2], "anthropic"))
    assert local_tokens.tolist() != ds_tokens.tolist()
    assert con.execute("SELECT count(*) FROM segments WHERE n_tokens > 0 AND "
                       "list_max(tokens) >= 400 AND n_tokens > 1").fetchone()[0] == 0
    # same tokenizer again: nothing cleared, nothing added
    s3 = tokenize_stage(con, local)
    assert not s3.cleared and s3.new_prompts == 0
    con.close()


def test_list_rows_views_each_row_and_none_for_nulls():
    import pyarrow as pa

    col = pa.chunked_array([pa.array([[1, 2], None], pa.list_(pa.int64())),
                            pa.array([[], [3]], pa.list_(pa.int64()))])
    rows = db.list_rows(col)
    assert [None if r is None else r.tolist() for r in rows] == [[1, 2], None, [], [3]]
    assert db.list_rows(pa.array([None, None])) == [None, None]  # a column of NULLs (``NULL AS x``)
