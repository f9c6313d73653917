"""The two encoding backends of ``Tok``: fastokens must give exactly the ids of
Hugging Face ``tokenizers`` (the reference), and any disagreement must be caught."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest

from replay import db
from replay.render import MARKERS
from replay.tokenize import Tok, load_prompt_tokens, load_tokenizer, tokenize_stage

fastokens = pytest.importorskip("fastokens")

from test_render_tokenize import add_requests, agent_bodies, make_local_tokenizer  # noqa: E402


def adversarial_texts(seed: int, n: int) -> list[str]:
    """Short random strings over the characters the pre-tokenizer treats specially."""
    rng = random.Random(seed)
    alphabet = (list(" \t\n\r\x0b\x0c\u00a0\u2028\u3000abcXYZ0123456789٣४१२.,;:!?'\"`~-_=+*/\\|<>()[]{}@#$%^&")
                + list("你好世界ひらがなカタカナ・ー゛한국어éü\u0301\u200b😀🤖\x00\x7f")
                + list(MARKERS.values()) + [" 's", "'re", "\r\n", "\n\n\n", "    ", "123456789"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60))) for _ in range(n)]


def real_agent_texts(shared: "Path", limit: int = 4000) -> list[str]:
    """Message texts and tool calls of the real DeepSeek agent sessions."""
    texts: list[str] = []
    for f in sorted((shared / "mini-swe-agent-deepseek").glob("*/*.traj.json*"))[:20]:
        doc = json.load(gzip.open(f) if f.suffix == ".gz" else open(f))
        for m in doc["messages"]:
            if isinstance(m.get("content"), str):
                texts.append(m["content"])
            texts.extend(json.dumps(tc) for tc in m.get("tool_calls") or [])
    return list(dict.fromkeys(texts))[:limit]


def both(path=None):
    return load_tokenizer(path, backend="fastokens"), load_tokenizer(path, backend="tokenizers")


def assert_same(fast: Tok, ref: Tok, texts: list[str]) -> None:
    got, want = fast.encode_arrays(texts), ref.encode_arrays(texts)
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if not np.array_equal(a, b)]
    assert not bad, f"{len(bad)} texts differ, e.g. {texts[bad[0]][:60]!r}"
    assert fast.stats["fastokens_texts"] == len(texts) and fast.stats["mismatches"] == 0
    assert ref.stats["fastokens_texts"] == 0


def test_fastokens_equals_tokenizers_on_adversarial_text():
    fast, ref = both()
    texts = adversarial_texts(0, 20_000) + ["", "x" * 100_000, "1234567890" * 3000, " " * 5000 + "a",
                                            "\ud800 lone surrogate", "a<｜User｜>b" * 10]
    assert_same(fast, ref, texts)


def test_fastokens_equals_tokenizers_on_real_agent_text(shared_data):
    fast, ref = both()
    assert_same(fast, ref, real_agent_texts(shared_data))


def test_fastokens_built_from_json_when_markers_were_added(tmp_path):
    d = make_local_tokenizer(tmp_path / "tiny")  # lacks the markers: fastokens gets the JSON with them
    fast, ref = both(d)
    texts = adversarial_texts(1, 3000) + [MARKERS["user"] + "hi" + MARKERS["assistant"]]
    assert_same(fast, ref, texts)
    for name in MARKERS:
        assert fast.encode(MARKERS[name]) == [fast.marker_id(name)] == [ref.marker_id(name)]


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


class FixedLoader:
    def __init__(self, enc):
        self.enc = enc

    def get(self, wait):
        return self.enc


def test_a_disagreement_on_a_verified_text_drops_fastokens(capsys):
    fast, ref = both()
    fast._ready()
    real = fast._fast.get(True)
    texts = [f"text number {i} with words" for i in range(200)]
    fast._fast = FixedLoader(WrongFast(real, bad_index=50))  # 50 is verified (every 50th)
    got = fast.encode_arrays(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref.encode_arrays(texts)))
    assert fast.stats["mismatches"] == 1 and fast._fast is None
    assert "disagreed" in capsys.readouterr().err
    assert fast.encode_arrays(["later"])[0].tolist() == ref.encode("later")  # the reference from now on


def test_a_disagreement_off_the_sample_is_not_claimed_to_be_caught():
    # the check samples every VERIFY_EVERY-th text: this documents its reach
    fast, _ = both()
    fast._ready()
    real = fast._fast.get(True)
    fast._fast = FixedLoader(WrongFast(real, bad_index=7))
    fast.encode_arrays([f"text {i}" for i in range(20)])
    assert fast.stats["mismatches"] == 0


def test_backend_tokenizers_never_uses_fastokens(monkeypatch):
    monkeypatch.setenv("REPLAY_TOKENIZER_BACKEND", "tokenizers")
    t = load_tokenizer()
    t.encode_arrays(["a" * 2_000_000])
    assert t.stats["fastokens_texts"] == 0 and t.stats["tokenizers_texts"] == 1
    monkeypatch.setenv("REPLAY_TOKENIZER_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="REPLAY_TOKENIZER_BACKEND"):
        load_tokenizer()


def test_tokenize_stage_tables_identical_across_backends(tmp_path):
    tables = []
    for backend in ("tokenizers", "fastokens"):
        con = db.connect(tmp_path / f"{backend}.duckdb")
        add_requests(con, [{"body": b} for b in agent_bodies(12)])
        tokenize_stage(con, load_tokenizer(backend=backend))
        segs = con.execute("SELECT seg_id, n_tokens, tokens FROM segments ORDER BY seg_id").fetchall()
        prompts = con.execute("SELECT request_id, n_tokens, seg_ids FROM prompts ORDER BY request_id").fetchall()
        tables.append((segs, prompts, {k: v.tolist() for k, v in load_prompt_tokens(con, range(12)).items()}))
        con.close()
    assert tables[0] == tables[1]
