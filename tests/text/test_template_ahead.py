"""A chat template's requests rendered ahead, in the encoder process, while ingest
runs (``replay.text.template_ahead``) and taken by the tokenize stage
(``replay.text.tokenize``): the stored rows are those of rendering in the
stage alone, whichever requests were rendered ahead, and a render that does not
belong to the row read (an id used again) or whose segments are gone is not
taken."""

from __future__ import annotations

import re
import sys
import time

import numpy as np
import pytest

import replay.api as rp
from replay.text import render_template
from replay.text.tok import load_tokenizer
from replay.text.tokenize import tokenize_stage

from support.conversations import DATED, STRIPS, conversations_log
from support.text import CHUNK, InProcess
from support.text import baseline as _baseline
from support.text import rows as _rows


@pytest.mark.parametrize("template, fmt", [(DATED, "anthropic"), (STRIPS, "openai")])
@pytest.mark.parametrize("keep", ["all", "odd", "none"])
def test_rows_rendered_ahead_equal_rows_rendered_in_the_stage(tmp_path, inline, template, fmt, keep):
    log = tmp_path / "log.jsonl"
    records = conversations_log((4, 5), fmt, log, n_conv=4, turns=5)
    want = _baseline(tmp_path, log, template)
    assert len(want[0]) == len(records)

    tok = load_tokenizer(template=template)
    pool = InProcess(tok)
    con = rp.open_db(tmp_path / "ahead.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    assert sum(len(r) for _, r in pool.handed) == len(records)  # every request, with the parts it needs
    pool.render({"all": lambda rid: True, "odd": lambda rid: rid % 2 == 1, "none": lambda rid: False}[keep])
    taken = tokenize_stage(con, tok, chunk_requests=CHUNK).rendered_ahead
    assert _rows(con) == want
    firsts = (len(records) + CHUNK - 1) // CHUNK  # (each chunk's first row is rendered in the stage)
    if keep == "all":
        assert taken == len(records) - firsts
    elif keep == "odd":
        assert 0 < taken < len(records) - firsts
    else:
        assert taken == 0
    con.close()
    tok.close()


def test_a_render_of_another_row_or_with_segments_gone_is_not_taken(tmp_path, inline):
    """An id used again (another time, format or parts) and a segment whose
    tokens were handed to a chunk since rolled back: those rows are rendered in
    the stage, and the rows are the same."""
    log = tmp_path / "log.jsonl"
    records = conversations_log((6,), "anthropic", log, n_conv=4, turns=5)
    want = _baseline(tmp_path, log, DATED)

    tok = load_tokenizer(template=DATED)
    pool = InProcess(tok)
    con = rp.open_db(tmp_path / "ahead.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    pool.render()
    held = pool.ahead.requests
    rids = sorted(held)
    stale = {rids[1]: 0, rids[3]: 1, rids[5]: 2}  # which of (time, format, parts) differs
    for rid, k in stale.items():
        ts, fmt, bids, sids, parts = held[rid]
        changed = [ts, fmt, bids]
        changed[k] = (ts + 1, "openai", bids[:-1])[k]
        held[rid] = (*changed, sids, parts)
    # a segment only one request has, its tokens handed over before (to a chunk rolled back since)
    counts = {}
    for r in held.values():
        for s in set(r[3].tolist()):
            counts[s] = counts.get(s, 0) + 1
    gone_rid = next(rid for rid in rids[6:] if any(counts[s] == 1 for s in held[rid][3].tolist()))
    gone = next(s for s in held[gone_rid][3].tolist() if counts[s] == 1)
    pool.ahead.tokens.pop(gone)
    pool.ahead.handed.add(gone)

    taken = tokenize_stage(con, tok, chunk_requests=CHUNK).rendered_ahead
    assert _rows(con) == want
    firsts = (len(records) + CHUNK - 1) // CHUNK
    assert taken == len(records) - firsts - len(stale) - 1
    con.close()
    tok.close()


def test_requests_asked_for_are_left_to_the_stage(inline):
    """The encoder process skips the requests up to the last one asked for, and
    hands each segment's tokens over once."""
    tok = load_tokenizer(template=DATED)
    pool = InProcess(tok)
    body = '{"messages":[{"role":"user","content":"hello there"}]}'
    blobs = [(1, "glue", '{"messages":['), (2, "message", '{"role":"user","content":"hello there"}'), (3, "glue", "]}")]
    requests = [(rid, 1_000_000 * rid, "openai", [1, 2, 3]) for rid in range(1, 7)]
    assert body  # (the parts joined)
    pool.ahead.add(blobs, requests[:2])
    got, tokens = pool.ahead.take([1, 2, 3, 4])
    assert set(got) == {1, 2} and tokens
    assert set(tokens) == set(np.concatenate([g[3] for g in got.values()]).tolist())
    pool.ahead.add([], requests[2:])  # 3 and 4 were asked for: the stage renders them
    got, tokens = pool.ahead.take([5, 6])
    assert set(got) == {5, 6} and pool.ahead.stats["rendered"] == 4
    # the same texts as requests 1 and 2, but the date line: only that segment's tokens are new
    assert len(tokens) < len(set(np.concatenate([g[3] for g in got.values()]).tolist()))
    tok.close()


def test_the_encoder_process_renders_ahead_while_ingest_runs(tmp_path):
    """The real thing: the encoder process is handed the requests as ingest
    writes them, renders them, and the stage takes them."""
    log = tmp_path / "log.jsonl"
    records = conversations_log((7, 8), "anthropic", log, n_conv=4, turns=5)
    want = _baseline(tmp_path, log, STRIPS)
    tok = load_tokenizer(template=STRIPS)
    con = rp.open_db(tmp_path / "ahead.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    deadline = time.monotonic() + 120
    while True:  # (until every request handed over is rendered: then the stage takes all it can)
        m = re.search(r"([\d,]+) of ([\d,]+) requests rendered ahead", tok.encoder_name())
        if m and m.group(1) == m.group(2) == str(len(records)) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert m and int(m.group(2).replace(",", "")) == len(records)
    got = tokenize_stage(con, tok, chunk_requests=CHUNK)
    assert _rows(con) == want
    assert got.rendered_ahead == len(records) - (len(records) + CHUNK - 1) // CHUNK
    con.close()
    tok.close()


def test_a_template_that_fails_to_compile_stops_the_stage(tmp_path, inline, monkeypatch):
    """A template that parses at load but that transformers cannot compile fails
    every request alike: the stage stops with the reason, nothing is set aside."""
    log = tmp_path / "log.jsonl"
    conversations_log((9,), "anthropic", log, n_conv=2, turns=2)
    tok = load_tokenizer(template=DATED)
    con = rp.open_db(tmp_path / "t.duckdb")
    rp.ingest(con, [str(log)])

    def broken(source):
        raise render_template.TemplateError("the chat template does not compile: TemplateSyntaxError: x")

    monkeypatch.setattr(render_template, "compile_template", broken)
    with pytest.raises(render_template.TemplateError, match="does not compile"):
        tokenize_stage(con, tok)
    assert con.execute("SELECT count(*) FROM set_aside").fetchone()[0] == 0
    con.close()
    tok.close()


def test_the_syntax_check_agrees_with_transformers(tmp_path):
    """load_template refuses what transformers' environment cannot compile and
    takes what it can (its generation block, loop controls), without importing it."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    ok = ["{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
          "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
          DATED.read_text(), STRIPS.read_text()]
    bad = ["{% for m in messages %}{{ m.content }}", "{% generation %}x", "{{ 1 + }}", "{% continue %}x{% endx %}"]
    for k, source in enumerate(ok + bad):
        f = tmp_path / f"t{k}.jinja"
        f.write_text(source)
        try:
            _compile_jinja_template(source)
            compiles = True
        except Exception:  # noqa: BLE001 - jinja's TemplateSyntaxError and friends
            compiles = False
        assert compiles == (source in ok)
        if compiles:
            render_template.load_template(f)
        else:
            with pytest.raises(render_template.TemplateError, match="does not compile"):
                render_template.load_template(f)


@pytest.mark.parametrize("max_chars", [6_000, 64_000_000])
def test_parts_of_conversations_going_on_stay_through_the_generations(tmp_path, inline, monkeypatch, max_chars):
    """With little room for parsed parts (generations of 6,000 characters,
    turned over a few times), the encoder process still assembles every
    request's body: a part a body uses moves back to the young generation
    (forgetting them all at once, it assembled 15 of the 36). The stage
    re-reads what it lacks; the rows are the same."""
    from replay.readers import writer
    from replay.text.template_bodies import TemplateBodies

    monkeypatch.setattr(TemplateBodies, "MAX_CHARS", max_chars)
    monkeypatch.setattr(writer, "AHEAD_REQUESTS", 1)  # (one request a frame: room is made before each)
    log = tmp_path / "log.jsonl"
    records = conversations_log((10, 11), "anthropic", log, n_conv=3, turns=6)
    want = _baseline(tmp_path, log, DATED)
    tok = load_tokenizer(template=DATED)
    pool = InProcess(tok)
    con = rp.open_db(tmp_path / "ahead.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    rotations = []
    room = TemplateBodies.room

    def counted(self):
        before = self.old
        room(self)
        rotations.append(self.old is not before)

    monkeypatch.setattr(TemplateBodies, "room", counted)
    pool.render()
    assert pool.ahead.stats["rendered"] == len(records)
    assert (sum(rotations) >= 2) == (max_chars < 10_000)
    taken = tokenize_stage(con, tok, chunk_requests=CHUNK).rendered_ahead
    assert _rows(con) == want
    assert taken == len(records) - (len(records) + CHUNK - 1) // CHUNK
    con.close()
    tok.close()


def test_the_writer_hands_over_every_part_a_request_needs_even_after_a_discard():
    """Each request handed over comes with (or after) every part its body needs,
    also after a file's rows were discarded (rolled back) midway."""
    from replay.readers import writer
    from replay.readers.blobs import Blobs
    from replay.store import db

    con, deferred = db.connect(None), db.Deferred()
    handed = []
    w = writer.Writer(con, deferred, blobs=Blobs(set()), ahead=lambda b, r: handed.append((b, r)))

    def request(rid, text):
        w.request({"request_id": rid, "source_id": 1, "line_no": rid, "format": "openai"},
                  {"ts_us": rid, "tenant": "t", "body_obj": {"messages": [{"role": "user", "content": text},
                                                           {"role": "assistant", "content": text + "!"}]}})

    n = writer.AHEAD_REQUESTS + 6
    for rid in range(1, n):  # (one hand-over, then some left pending)
        request(rid, f"first {rid}")
    assert len(handed) == 1
    w.discard(whole_file=True)
    for rid in range(1, 2 * n):  # (the ids again, other bodies)
        request(rid, f"second {rid % 9}")
    w.flush()
    deferred.wait()
    seen = set()
    for blobs, requests in handed:
        seen.update(b for b, _, _ in blobs)
        for rid, ts_us, fmt, bids in requests:
            assert ts_us == rid and fmt == "openai" and set(bids) <= seen, rid
    assert sum(len(r) for _, r in handed) == writer.AHEAD_REQUESTS + 2 * n - 1
    deferred.close()
    con.close()


def test_only_a_template_hands_requests_over(tmp_path, inline, monkeypatch):
    """The neutral path renders parts, not requests: its ingest builds no hand-over."""
    from replay.text.tok import Tok

    log = tmp_path / "log.jsonl"
    conversations_log((12,), "openai", log, n_conv=2, turns=2)
    calls = []
    monkeypatch.setattr(Tok, "warm_requests", lambda self, blobs, requests: calls.append(self.render))
    for template in (None, DATED):
        tok = load_tokenizer(template=template)
        con = rp.open_db(tmp_path / f"{template is None}.duckdb")
        rp.ingest(con, [str(log)], tokenizer=tok)
        con.close()
        tok.close()
    assert calls == ["template"]


def test_the_stage_takes_the_parts_ingest_handed_over(tmp_path, inline, monkeypatch):
    """The body parts ingest handed over for a template's requests are read by
    the stage from the tokenizer (``Tok.recent_parts``), not from the database:
    the same rows, no part read again."""
    from replay.text.template_bodies import TemplateBodies

    log = tmp_path / "log.jsonl"
    records = conversations_log((4, 5), "anthropic", log, n_conv=4, turns=5)
    want = _baseline(tmp_path, log, DATED)
    reads = []
    real = TemplateBodies.rows

    class Counting:
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *args):
            reads.append("FROM blobs" in sql)
            _replay_blob_ids = sys._getframe(1).f_locals.get("_replay_blob_ids")  # noqa: F841 - read by DuckDB
            return self.con.execute(sql, *args)

    monkeypatch.setattr(TemplateBodies, "rows", lambda self, con, *a: real(self, Counting(con), *a))
    tok = load_tokenizer(template=DATED)
    con = rp.open_db(tmp_path / "kept.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    assert tok.recent_parts  # (handed over while ingest ran)
    tokenize_stage(con, tok, chunk_requests=CHUNK)
    assert _rows(con) == want and len(want[0]) == len(records)
    assert not any(reads)  # every part was at hand
    assert not tok.recent_parts  # (let go once the stage is done)
    con.close()
    tok.close()
    tok = load_tokenizer(template=DATED)  # without them: read from the database
    con = rp.open_db(tmp_path / "read.duckdb")
    rp.ingest(con, [str(log)])
    tokenize_stage(con, tok, chunk_requests=CHUNK)
    assert _rows(con) == want and any(reads)
    con.close()
    tok.close()
