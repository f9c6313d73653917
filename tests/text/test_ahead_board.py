"""The board the tokenize stage and the encoder process share
(``replay.text.ahead_board``), and how the stage meets that process in a chunk
(``replay.text.tokenize_ahead``): wherever they meet, the rows are those of
rendering in the stage alone, each row is rendered by one side, and the texts
the stage sent ahead are not encoded again when it stores its chunk."""

from __future__ import annotations

import subprocess
import sys

import pytest

import replay.api as rp
from replay.text import tokenize, tokenize_ahead
from replay.text.ahead_board import Board
from replay.text.template_ahead import RequestsAhead
from replay.text.tok import load_tokenizer
from replay.text.tokenize import tokenize_stage

from support.conversations import DATED, STRIPS, conversations_log
from support.text import CHUNK, InProcess
from support.text import baseline as _baseline
from support.text import rows as _rows


def test_the_board_is_shared_with_another_process():
    board = Board()
    try:
        assert board.at() < 0 and not any(board.claimed(r) for r in (-5, 0, 1, 10**12))
        board.claim(10, 20)
        code = ("import sys; from replay.text.ahead_board import Board; b = Board(int(sys.argv[1])); "
                "b.start(41); print(*(int(b.claimed(r)) for r in (9, 10, 15, 20, 21)))")
        out = subprocess.run([sys.executable, "-c", code, str(board.fd)], pass_fds=(board.fd,), check=True,
                             capture_output=True, text=True).stdout.split()
        assert out == ["0", "1", "1", "1", "0"]
        assert board.at() == 41  # (written there, read here)
        board.claim(30, 40)  # (the next chunk's)
        assert not board.claimed(20) and board.claimed(30) and board.claimed(40)
        board.unclaim()
        assert not any(board.claimed(r) for r in (10, 30, 40))
    finally:
        board.close()


def _requests(n):
    blobs = [(1, "glue", '{"messages":['), (2, "message", '{"role":"user","content":"hello there"}'),
             (3, "glue", "]}")]
    return blobs, [(rid, 1_000_000 * rid, "openai", [1, 2, 3]) for rid in range(1, n + 1)]


@pytest.mark.usefixtures("inline")
def test_the_encoder_process_skips_what_the_stage_claimed():
    tok = load_tokenizer(template=DATED)
    tpl = tok.template
    board = Board()
    ahead = RequestsAhead(tok._inline_engine(), (tpl.source, tpl.origin, tpl.specials), str(tok.path), board)
    board.claim(3, 4)
    ahead.add(*_requests(6))
    assert board.at() == 6  # (every request handed over was reached, the claimed ones too)
    got, _ = ahead.take([1, 2, 3, 4, 5, 6], through=6)
    assert sorted(got) == [1, 2, 5, 6]
    got, _ = ahead.take([], through=7)  # (nothing to take; 7 is the stage's from now on)
    assert not got
    ahead.add([], [(7, 7_000_000, "openai", [1, 2, 3]), (8, 8_000_000, "openai", [1, 2, 3])])
    assert ahead.stats["rendered"] == 5 and sorted(ahead.requests) == [8]
    board.close()
    tok.close()


def _counted_renders(tok) -> list:
    """The times of the requests ``tok`` renders from now on (in this process)."""
    rendered, render = [], tok.render_request
    tok.render_request = lambda body, fmt, ts: rendered.append(ts) or render(body, fmt, ts)
    return rendered


class Met(InProcess):
    """The in-process stand-in, with a board: what it rendered before the stage
    starts is where the stage meets it."""

    def __init__(self, tok):
        super().__init__(tok)
        self.board = self.ahead.board = Board()
        self.sent: list[dict] = []
        tok.ahead_board = lambda: self.board
        tok.encode_for_stage = self._sent

    def _sent(self, texts):
        self.sent.append(dict(texts))
        self.ahead.encode_for_stage(texts)


@pytest.mark.usefixtures("inline")
@pytest.mark.parametrize("template", [DATED, STRIPS])
@pytest.mark.parametrize("where", [0, 0.3, 0.75, 1])
def test_the_stage_meets_the_encoder_process_where_it_is(tmp_path, monkeypatch, template, where):
    """The encoder process rendered the requests up to a point (none, some of a
    chunk, all): the stage renders every row after it, backward, takes every
    row before it that is not a chunk's first, and stores the rows of
    rendering alone; texts it sent ahead are not encoded again."""
    monkeypatch.setattr(tokenize_ahead, "ENCODE_TEXTS", 3)
    log = tmp_path / "log.jsonl"
    records = conversations_log((21, 22), "anthropic", log, n_conv=4, turns=4)
    want = _baseline(tmp_path, log, template)
    n = len(records)
    upto = int(where * n)  # requests 1..upto rendered ahead (ids follow the log's lines)

    tok = load_tokenizer(template=template)
    pool = Met(tok)
    con = rp.open_db(tmp_path / "met.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    pool.render(lambda rid: rid <= upto)
    rendered_here = _counted_renders(tok)
    encoded = []  # (what the stage encodes when it stores a chunk)
    encode = tokenize._encode_batches
    monkeypatch.setattr(tokenize, "_encode_batches", lambda t, texts, b: encoded.extend(texts) or encode(t, texts, b))

    taken = tokenize_stage(con, tok, chunk_requests=CHUNK).rendered_ahead
    assert _rows(con) == want
    rids = con.execute("SELECT request_id FROM requests ORDER BY 1").fetchnumpy()["request_id"].tolist()
    firsts = set(rids[::CHUNK])
    assert taken == sum(1 for r in rids if r <= upto and r not in firsts)
    assert len(rendered_here) == n - taken  # (each row rendered by one side: no row twice)
    sent = {t for batch in pool.sent for t in batch.values()}
    assert bool(sent) == (upto < n - 1)
    assert not sent.intersection(encoded)  # (their tokens came back with the take)
    assert not pool.board.claimed(rids[-1])  # (the last chunk's claim let go)
    con.close()
    tok.close()


def test_the_real_encoder_process_meets_the_stage(tmp_path):
    """The encoder process still rendering when the stage starts: the rows are the
    same wherever the two meet, and every row is rendered by one side."""
    log = tmp_path / "log.jsonl"
    records = conversations_log((23, 24, 25), "openai", log, n_conv=5, turns=6)
    want = _baseline(tmp_path, log, STRIPS)
    tok = load_tokenizer(template=STRIPS)
    con = rp.open_db(tmp_path / "real.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    rendered_here = _counted_renders(tok)
    got = tokenize_stage(con, tok, chunk_requests=CHUNK)
    assert _rows(con) == want
    assert len(rendered_here) == len(records) - got.rendered_ahead  # (the stage renders a row once, or takes it)
    con.close()
    tok.close()


def test_without_a_board_the_stage_takes_what_is_ready(tmp_path, monkeypatch):
    """No board could be made (no temporary file): the encoder process still
    renders ahead, the stage takes what is ready when it reaches a chunk and
    renders the rest; the rows are the same."""
    from replay.text import encoder

    def no_board(fd=None):
        raise OSError("no temporary file here")

    monkeypatch.setattr(encoder.ahead_board, "Board", no_board)
    log = tmp_path / "log.jsonl"
    records = conversations_log((26, 27), "anthropic", log, n_conv=4, turns=5)
    want = _baseline(tmp_path, log, DATED)
    tok = load_tokenizer(template=DATED)
    assert tok.ahead_board() is None and tok._proc is not None
    con = rp.open_db(tmp_path / "unboarded.duckdb")
    rp.ingest(con, [str(log)], tokenizer=tok)
    rendered_here = _counted_renders(tok)
    got = tokenize_stage(con, tok, chunk_requests=CHUNK)
    assert _rows(con) == want
    assert len(rendered_here) == len(records) - got.rendered_ahead
    con.close()
    tok.close()


def test_the_encoder_process_starts_without_pyarrow():
    """It only assembles bodies: importing pyarrow would delay its first render."""
    code = "import sys, replay.text.encoder; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"
