"""Pieces remembered from earlier texts equal pieces cut afresh.

``replay.text.line_cuts.LineCuts`` (a long run's line chunks, taken from an
earlier run that begins or ends alike) and ``replay.text.piece_memo.PieceMemo``
(a rendered text's head and the conversation so far, taken from earlier
texts) are checked against a brute-force statement of the rule: every cut made
afresh, on related texts of every kind of change.
"""

from __future__ import annotations

import random
import re
import zlib

import pytest

from replay.text import line_cuts
from replay.text.line_cuts import LineCuts, common_prefix, common_suffix
from replay.text.piece_memo import PieceMemo
from replay.text.splitter import Splitter


def fresh_cuts(span: str, at: int) -> list[int]:
    """The rule, scanned from ``at`` with nothing remembered (the module
    docstring of ``line_cuts``), cuts as positions in ``span``, its end last."""
    rx = re.compile(r"[\r\n](?=[ \t]*[!-~\w])")
    cuts, last = [], at
    for m in rx.finditer(span, at):
        p = m.end()
        if p - last >= line_cuts.LINE_CHUNK_MAX or zlib.crc32(
                span[p - 24:p].encode("utf-8", "surrogatepass")) & 7 == 0:
            cuts.append(p)
            last = p
    return cuts + [len(span)]


def _lines(r: random.Random, n: int) -> list[str]:
    words = ["alpha", "b", "{", "}", "x=1", "é", "  indent", "\t", "", " ", "#", "ü"]
    return ["".join(r.choice(words) for _ in range(r.randint(0, 12))) for _ in range(n)]


def _edit(r: random.Random, lines: list[str]) -> list[str]:
    """A related text: a line changed, added or removed at the start, the end or the middle."""
    out = list(lines)
    where = r.choice([0, 1, len(out) // 2, len(out) - 1, len(out)])
    kind = r.choice(["change", "insert", "delete", "append"])
    new = "".join(r.choice("abc 12\t") for _ in range(r.randint(0, 40)))
    if kind == "append":
        out.extend(_lines(r, r.randint(1, 5)))
    elif kind == "insert" or not out:
        out.insert(min(where, len(out)), new)
    elif kind == "delete":
        del out[min(where, len(out) - 1)]
    else:
        out[min(where, len(out) - 1)] = new
    return out


@pytest.mark.parametrize("seed", range(6))
def test_line_cuts_remembered_equal_the_rule(seed, monkeypatch):
    """Runs sharing their beginning, their end, both or neither, with and
    without carriage returns, scanned from various starts; a small forced-cut
    length so that both kinds of cut occur."""
    r = random.Random(seed)
    if seed % 2:
        monkeypatch.setattr(line_cuts, "LINE_CHUNK_MAX", 40)
    cuts = LineCuts()
    lines = _lines(r, 300)
    reused = 0
    for step in range(60):
        lines = _edit(r, lines) if r.random() < 0.8 else _lines(r, r.randint(50, 300))
        sep = "\r\n" if r.random() < 0.2 else "\n"
        body = sep.join(lines)
        prefix = r.choice(["", "x", "<t>" * r.randint(1, 12)])
        text = prefix + body + r.choice(["", "<t>tail"])
        start, end = len(prefix), len(prefix) + len(body)
        if end - start < 30:
            continue
        before = dict(cuts._by_end)
        out: list = []
        cuts.cut(text, start, end, out)
        base = max(0, start - line_cuts.WINDOW)
        want = fresh_cuts(text[base:end], start - base)
        got = [p + len(piece) - base for p, piece in out]
        assert got == want, (seed, step)
        assert "".join(piece for _, piece in out) == text[start:end]
        assert [p for p, _ in out] == [start] + [base + c for c in want[:-1]]
        reused += bool(before)
    assert reused > 30  # (most runs had an earlier one to start from)


def test_common_prefix_and_suffix():
    r = random.Random(1)
    for _ in range(300):
        a = "".join(r.choice("ab") for _ in range(r.randint(0, 3000)))
        b = a[:r.randint(0, len(a))] + "".join(r.choice("abc") for _ in range(r.randint(0, 50)))
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n
        ra, rb = a[::-1], b[::-1]
        assert common_suffix(ra, rb) == n


# ----------------------------------------------------------------------------- PieceMemo

def _added(content, **flags):
    return {"id": 0, "content": content, "special": True, "normalized": False, "lstrip": False,
            "rstrip": False, "single_word": False, **flags}


def _splitter() -> Splitter:
    """Plain and normalized tokens that overlap one another and share first
    characters (as DeepSeek's do), cut into line chunks (the known rule assumed)."""
    plain = ["<a>", "<a><b>", "b>c", "<x>", "|p|", "|p|q"]
    normalized = ["<｜U｜>", "<｜A｜>", "<｜A｜>x", "x<a", "zz", "<n>", "|n|", "q|p"]
    sp = Splitter([_added(t) for t in plain] + [_added(t, normalized=True, special=False) for t in normalized],
                  None, None)
    sp.lines = True  # (the line argument's pre-tokenizer is assumed: these are cuts, not tokens)
    return sp


_BITS = ["<a>", "<a><b>", "b>c", "<x>", "|p|", "|p|q", "<｜U｜>", "<｜A｜>", "x<a", "zz", "<n>", "|n|", "q|p",
         "<", ">", "|", "｜", "a", "b", "c", "x", "z", "q", "p", " ", "\n", "\n  ", "word", "\t"]


def _message(r: random.Random) -> str:
    start = r.choice(["<｜U｜>", "<｜A｜>", "<x>", "<a>", "", "<｜A｜>x", "<x>\n", "<x>\nab\n"])
    if r.random() < 0.2:  # (a long run right after a short token: its first line cuts read the text before)
        return start + "\n".join("".join(r.choice("ab c{}") for _ in range(r.randint(0, 30))) for _ in range(150))
    n = r.choice([r.randint(0, 30), r.randint(100, 3000)])
    return start + "".join(r.choice(_BITS) for _ in range(n // 3))


def _rendered(r: random.Random, head: str, messages: list[str]) -> tuple[str, list[int]]:
    gen = r.choice(["", "<｜A｜>", "<｜A｜>x", "zz"])
    text, bounds = head, []
    for m in messages:
        bounds.append(len(text))
        text += m
    return text + gen, bounds


@pytest.mark.parametrize("seed", range(8))
def test_piece_memo_equals_pieces_cut_afresh(seed):
    """Conversations that grow a turn at a time, some heads changed in a line
    (a per-request header), several conversations interleaved, messages that
    begin with a token, with part of one, or with none: the pieces taken from
    earlier texts are those of cutting each whole text afresh."""
    r = random.Random(seed)
    sp = _splitter()
    memo = PieceMemo(sp)
    system = "\n".join("".join(r.choice(_BITS[13:]) for _ in range(r.randint(0, 40))) for _ in range(200))
    convs = [[_message(r)] for _ in range(3)]
    reused = 0
    for step in range(80):
        k = r.randrange(len(convs))
        convs[k].append(_message(r))
        if r.random() < 0.1:
            convs[k] = convs[k][:r.randint(1, len(convs[k]))]  # (a conversation that forgot turns)
        header = r.choice(["", f"billing {r.randint(0, 9)}\n", "<a>"])
        footer = r.choice(["", "", "\nnow: " + "".join(r.choice("0123456789") for _ in range(30))])
        text, bounds = _rendered(r, "<x>" + header + system + footer, convs[k])
        had = dict(memo._rests)
        starts, pieces = memo.pieces(text, bounds)
        want = _splitter().pieces(text)
        assert list(zip(starts, pieces)) == want, (seed, step)
        reused += bool(had)
    assert reused > 40


def test_starts_afresh_only_where_the_scan_would_start_afresh():
    sp = _splitter()
    assert sp.starts_afresh("<x><a>c", 3)
    assert sp.starts_afresh("..<｜A｜>", 2)  # (a normalized token)
    assert not sp.starts_afresh("<a><b>c", 3)  # "<a><b>" starts before 3 and reaches past it
    assert not sp.starts_afresh("..x<a>", 2)  # (the first pass takes "<a>" out of the normalized "x<a")
    assert not sp.starts_afresh("abc", 1) and not sp.starts_afresh("<x>", 0)
    # whatever the answer, a text cut there has the pieces of the whole
    r = random.Random(5)
    for _ in range(3000):
        text = "".join(r.choice(_BITS) for _ in range(r.randint(1, 12)))
        at = r.randint(1, len(text) - 1) if len(text) > 1 else 1
        if sp.starts_afresh(text, at):
            assert sp.pieces(text[:at]) + sp.pieces(text, at) == sp.pieces(text), (text, at)


@pytest.mark.parametrize("seed", range(6))
def test_heads_ending_alike_equal_heads_cut_afresh(seed, monkeypatch):
    """Heads that end alike (with tokens in their common end, or parts of
    tokens everywhere), with tokens or parts of tokens where they begin to
    agree: looking for tokens only where they differ gives the pieces of
    cutting each afresh."""
    r = random.Random(seed)
    sp = _splitter()
    memo = PieceMemo(sp)
    limited = []
    real = sp.matches
    monkeypatch.setattr(sp, "matches", lambda text, start, end: limited.append(end < len(text)) or real(text, start, end))
    rare = ["a", "b", " ", "\n", "word", "\t", "c", "<", "|", "｜"]  # (no token forms of these alone)
    # (each tail begins with the end of a token, each head's own part may end with its beginning)
    tails = [r.choice(["a>", "><b>", "|", "p|q", "｜A｜>x", "b>c", "z", ""])
             + "".join(r.choice(rare if k < 2 or r.random() < 0.99 else _BITS) for _ in range(r.randint(800, 3000)))
             + r.choice(["", "<x>\nuse <｜A｜>then|p|\n", "zz"]) for k in range(5)]
    for step in range(200):
        tail = r.choice(tails)
        own = "".join(r.choice(_BITS + rare) for _ in range(r.randint(0, 12)))
        head = "<x>" + own + r.choice(["", "<", "|", "<｜", "<a", "<a><", "x", "q", "z", "<｜A"]) + tail
        text = head + "<｜U｜>" + "".join(r.choice(_BITS) for _ in range(r.randint(0, 40)))
        starts, pieces = memo.pieces(text, [len(head)])
        assert list(zip(starts, pieces)) == _splitter().pieces(text), (seed, step)
    assert sum(limited) > 25  # (tokens were looked for in part of the head only)
