"""`replay export` (replay/analysis/export.py): the layouts against their readers'
documented fields, and the round trip — exporting at block B and sweeping the
export as a Mooncake (or Bailian) trace gives the source's ceiling at B."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay import api
from replay.cli.main import main
from support import oracle
from replay.core.grid import Grid
from replay.store import db

from support.gen import US, random_requests
from support.logs import write_tokens_log as _write_tokens_log
from support.paths import FIXTURES, ROOT

SAMPLE = ROOT / "data" / "sample"
KVT = FIXTURES / "hashtraces" / "kv-cache-tester"
SAMPLE_TTLS = (0.0, 1.0, 60.0, 300.0, 3600.0, math.inf)


@pytest.fixture(scope="module")
def tok():
    t = api.load_tokenizer()
    yield t
    t.close()


@pytest.fixture(scope="module")
def sample_db(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("sample") / "src.duckdb"
    con = db.connect(path)
    api.ingest(con, [str(SAMPLE)])
    api.prepare(con, modes=("global", "session"), tokenizer=tok)
    yield con
    con.close()


def _rows(df) -> dict:
    return {(r["stream"], r["ttl_s"], r["block"], r["min_prefix"]): (r["requests"], r["prompt_tokens"],
                                                                     r["hit_tokens"], r["requests_hit"])
            for r in df.to_dicts()}


def _reload(path: Path, fmt: str, ttls, block: int, mins=(0,)) -> dict:
    """The export read back as a trace of ``fmt``, swept in global mode."""
    con = db.connect(None)
    s = api.ingest(con, [str(path)], format=fmt)
    assert s.rejected == 0
    got = _rows(api.sweep(con, Grid(ttls=ttls, blocks=(block,), min_prefixes=mins, streams=("global",))))
    con.close()
    return {(ttl, b, m): v for (_, ttl, b, m), v in got.items()}


def _source(con, mode, ttls, block, mins=(0,), tok=None) -> dict:
    got = _rows(api.sweep(con, Grid(ttls=ttls, blocks=(block,), min_prefixes=mins, streams=(mode,)), tokenizer=tok))
    return {(ttl, b, m): v for (_, ttl, b, m), v in got.items()}


# ----------------------------------------------------------------- round trip: the sample

@pytest.mark.parametrize("block", [16, 64, 512])
def test_the_sample_round_trips_at_every_ttl(sample_db, tmp_path, block, tok):
    out = tmp_path / "sample.jsonl"
    s = api.export_trace(sample_db, out, to="mooncake", block=block, tokenizer=tok)
    want = _source(sample_db, "global", SAMPLE_TTLS, block, (0, 1024), tok)
    assert s.requests == next(iter(want.values()))[0] > 0
    got = _reload(out, "mooncake", SAMPLE_TTLS, block, (0, 1024))
    assert got == want
    assert want[(None, block, 0)][2] > 0  # something hits


def test_the_sample_salted_by_session_is_its_session_ceiling(sample_db, tmp_path, tok):
    out = tmp_path / "sample.jsonl"
    api.export_trace(sample_db, out, to="mooncake", block=16, stream="session", tokenizer=tok)
    want = _source(sample_db, "session", SAMPLE_TTLS, 16, tok=tok)
    assert _reload(out, "mooncake", SAMPLE_TTLS, 16) == want
    assert want != _source(sample_db, "global", SAMPLE_TTLS, 16, tok=tok)  # the salt changed something


def test_the_sample_round_trips_as_bailian(sample_db, tmp_path, tok):
    out = tmp_path / "sample_bailian.jsonl"
    api.export_trace(sample_db, out, to="bailian", tokenizer=tok)
    assert _reload(out, "bailian", SAMPLE_TTLS, 16) == _source(sample_db, "global", SAMPLE_TTLS, 16, tok=tok)


# ----------------------------------------------------------------- round trip: generated logs

GEN_TTLS = (0, 3, 10, 60, math.inf)


@pytest.mark.parametrize("seed", range(5))
def test_generated_logs_round_trip_against_the_oracle(tmp_path, seed, tok):
    """Small alphabets (prefixes collide), two models in some logs, ties, gaps on
    the TTLs to the µs (sub-millisecond times survive the export's ms), empty
    prompts, partial last blocks; several blocks; the export's sweep against the
    brute-force oracle and against the source's sweep."""
    reqs = random_requests(seed, n=50, alphabet=3, max_len=80, gaps=(0, 0, 3, 7, 10, 60),
                           jitter_us=(0, 0, -1, 1, 250), models=("a", "b") if seed % 2 else (None,))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    con = db.connect(None)
    api.ingest(con, [str(log)])
    for block in (1, 2, 3, 16):
        for mode in (None, "session", "key"):
            out = tmp_path / f"e{block}{mode}.jsonl"
            api.export_trace(con, out, to="mooncake", block=block, stream=mode, tokenizer=tok)
            got = _reload(out, "mooncake", GEN_TTLS, block, (0, 4))
            want = {(r["ttl_s"], r["block"], r["min_prefix"]): (r["requests"], r["prompt_tokens"], r["hit_tokens"],
                                                                r["requests_hit"])
                    for r in oracle.sweep(reqs, (mode or "global",), GEN_TTLS, (block,), (0, 4))}
            assert got == want, (block, mode)
            assert got == _source(con, mode or "global", GEN_TTLS, block, (0, 4), tok)
    con.close()


def test_hand_made_ids_partial_blocks_empty_prompts_and_ties(tmp_path, tok):
    """The ids themselves: numbered from 0 in order of first use, one per block of
    B tokens (the last one partial), equal exactly when the prompts agree up to
    the block's end; an empty prompt has none; a tie keeps input order."""
    R = oracle.OracleRequest
    reqs = [R(ts=0, tokens=[]), R(ts=0, tokens=[1, 2, 3]), R(ts=0, tokens=[1, 2, 3]),
            R(ts=1500, tokens=[1, 2, 3, 4, 5]), R(ts=1500, tokens=[1, 2], model="m"), R(ts=2 * US, tokens=[1, 2])]
    log = tmp_path / "edge.jsonl"
    _write_tokens_log(log, reqs)
    con = db.connect(None)
    api.ingest(con, [str(log)])
    out = tmp_path / "edge.jsonl.out"
    api.export_trace(con, out, to="mooncake", block=2, tokenizer=tok)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["hash_ids"] for x in lines] == [[], [0, 1], [0, 1], [0, 2, 3], [4], [0]]
    assert [x["timestamp"] for x in lines] == [0, 0, 0, 1.5, 1.5, 2000]  # ms from the first, exact
    assert [x["input_length"] for x in lines] == [0, 3, 3, 5, 2, 2]
    assert all(x["block_size"] == 2 for x in lines)
    want = {(r["ttl_s"], r["block"], r["min_prefix"]): (r["requests"], r["prompt_tokens"], r["hit_tokens"],
                                                        r["requests_hit"])
            for r in oracle.sweep(reqs, ("global",), (0, 1, math.inf), (2,), (0,))}
    assert _reload(out, "mooncake", (0, 1, math.inf), 2) == want
    con.close()


# ----------------------------------------------------------------- layouts

def _sglang_mooncake_loader(path: Path) -> list[dict]:
    """What SGLang's bench_serving does with a Mooncake file
    (python/sglang/benchmark/datasets/mooncake.py): one JSON object per non-blank
    line; sorted by ``timestamp`` (ms); ``hash_ids`` and ``output_length`` read
    with defaults; a prompt built from the ids, ``block_size`` words each."""
    records = [json.loads(line) for line in open(path) if line.strip()]
    records.sort(key=lambda r: r["timestamp"])
    for r in records:
        assert isinstance(r["timestamp"], (int, float)) and r["timestamp"] >= 0
        ids = r.get("hash_ids", [])
        assert all(type(i) is int and i >= 0 for i in ids)
        assert type(r.get("output_length", 256)) is int
        r["_prompt"] = "".join(f"{i}" + " ".join(["hi"] * 4) for i in ids)
    return records


def test_the_mooncake_layout(sample_db, tmp_path, tok):
    out = tmp_path / "m.jsonl"
    api.export_trace(sample_db, out, to="mooncake", tokenizer=tok)
    recs = _sglang_mooncake_loader(out)
    assert len(recs) == api.requests_count(sample_db) and recs[0]["timestamp"] == 0
    for r in recs:
        assert set(r) - {"_prompt"} <= {"timestamp", "input_length", "output_length", "hash_ids"}  # 512: Mooncake's own
        assert type(r["input_length"]) is int and len(r["hash_ids"]) == -(-r["input_length"] // 512)
    # text-free: every value is a number or a list of numbers
    for line in out.read_text().splitlines():
        assert all(isinstance(v, (int, float, list)) for v in json.loads(line).values())
    ids = sorted({i for r in recs for i in r["hash_ids"]})
    assert ids == list(range(len(ids)))  # remapped from 0, as Mooncake's


def test_the_bailian_layout(sample_db, tmp_path, tok):
    """The fields of the Bailian README's specification, with their types; the
    session's requests chained by parent_chat_id with growing turns."""
    out = tmp_path / "b.jsonl"
    api.export_trace(sample_db, out, to="bailian", tokenizer=tok)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    keys = {"chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn", "hash_ids"}
    by_id = {}
    for r in recs:
        assert set(r) == keys and r["type"] == "text"
        assert all(type(r[k]) is int for k in ("chat_id", "parent_chat_id", "input_length", "output_length", "turn"))
        assert len(r["hash_ids"]) == -(-r["input_length"] // 16)
        if r["parent_chat_id"] >= 0:
            assert r["turn"] == by_id[r["parent_chat_id"]]["turn"] + 1
        else:
            assert r["turn"] == 1
        by_id[r["chat_id"]] = r
    assert any(r["turn"] > 1 for r in recs)


def test_text_layouts_need_show_text(tmp_path):
    db_path = str(tmp_path / "t.duckdb")
    for to in ("vllm-custom", "sglang"):
        out = tmp_path / f"{to}.jsonl"
        res = CliRunner().invoke(main, ["export", str(SAMPLE), "--db", db_path, "--to", to, "-o", str(out)])
        assert res.exit_code == 2 and "--show-text" in res.output and not out.exists()
    with pytest.raises(api.TextRefused):
        api.export_trace(db.connect(None), tmp_path / "x.jsonl", to="vllm-custom")


def test_the_text_layouts(tmp_path):
    """vLLM's CustomDataset reads a .jsonl with a 'prompt' column; SGLang's custom
    dataset the 'content' of the first two turns of 'conversations'. The warning
    is on stderr; a block trace has no text and is left out, counted."""
    db_path = str(tmp_path / "t.duckdb")
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", str(SAMPLE), str(KVT), "--db", db_path])
    assert res.exit_code == 0, res.output
    out = tmp_path / "prompts.jsonl"
    res = runner.invoke(main, ["export", "--db", db_path, "--to", "vllm-custom", "--show-text", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "warning" in res.stderr and "12 block-trace requests left out" in res.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 268 and all(set(r) == {"prompt"} and isinstance(r["prompt"], str) and r["prompt"] for r in recs)
    out2 = tmp_path / "sglang.jsonl"
    res = runner.invoke(main, ["export", "--db", db_path, "--to", "sglang", "--show-text", "-o", str(out2)])
    assert res.exit_code == 0, res.output
    recs2 = [json.loads(x) for x in out2.read_text().splitlines()]
    assert len(recs2) == 268
    for r, p in zip(recs2, recs):
        convs = r["conversations"]
        assert len(convs) >= 2 and convs[0]["role"] == "user" and convs[0]["content"] == p["prompt"]
        assert isinstance(convs[1].get("content", convs[1].get("value", "")), str)
    assert sum(bool(r["conversations"][1]["content"]) for r in recs2) > 0  # the logged outputs


def test_export_cli_usage_and_failures(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["export", "--db", str(tmp_path / "e.duckdb"), "--to", "mooncake", "-o",
                               str(tmp_path / "o.jsonl")])
    assert res.exit_code == 1 and "holds no requests" in res.output  # nothing to export: the job failed
    res = runner.invoke(main, ["export", "--db", str(tmp_path / "e.duckdb"), "--to", "parquet", "-o", "x"])
    assert res.exit_code == 2
    res = runner.invoke(main, ["export", "--db", str(tmp_path / "e.duckdb"), "--to", "mooncake", "--block", "0",
                               "-o", "x"])
    assert res.exit_code == 2
    res = runner.invoke(main, ["export", "--help"])
    assert res.exit_code == 0 and "--show-text" in res.output and "--block" in res.output


def test_the_export_of_a_block_trace_keeps_its_hits(tmp_path):
    """kv-cache-tester traces re-blocked at 64 (their own) and 128: the export's
    sweep is the trace's own at that block, whole blocks only (the tail of each
    request gets ids of its own)."""
    con = db.connect(None)
    api.ingest(con, [str(KVT)])
    for block in (64, 128):
        out = tmp_path / f"k{block}.jsonl"
        api.export_trace(con, out, to="mooncake", block=block, stream="session")
        want = _source(con, "session", GEN_TTLS, block)
        assert _reload(out, "mooncake", GEN_TTLS, block) == want
        assert want[(None, block, 0)][2] > 0
    con.close()


def test_the_mooncake_trace_exports_to_itself(shared_data, tmp_path):
    """The real trace read and exported at its own 512-token blocks gives back
    every record as it was: the same times, lengths and ids (Mooncake's are
    chained and numbered from 0 in order of first use, as ours)."""
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    con = db.connect(None)
    api.ingest(con, [str(path)])
    out = tmp_path / "again.jsonl"
    s = api.export_trace(con, out, to="mooncake")
    assert s.requests == 12_031
    want = [json.loads(x) for x in open(path) if x.strip()]
    got = [json.loads(x) for x in open(out)]
    assert got == want
    con.close()


def test_text_is_decoded_only_with_the_tokenizer_that_encoded_it(tmp_path):
    """A database tokenized with another tokenizer than the default: its text
    export needs that tokenizer named (else wrong text), a usage error."""
    db_path = str(tmp_path / "o.duckdb")
    con = db.connect(db_path)
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, [oracle.OracleRequest(ts=0, tokens=[1, 2, 3])])
    api.ingest(con, [str(log)])
    db.set_meta(con, "tokenizer", "some-other-tokenizer-1a2b3c4d")
    with pytest.raises(api.ExportRefused, match="some-other-tokenizer"):
        api.export_trace(con, tmp_path / "p.jsonl", to="vllm-custom", show_text=True)
    con.close()
    res = CliRunner().invoke(main, ["export", "--db", db_path, "--to", "sglang", "--show-text", "-o",
                                    str(tmp_path / "s.jsonl")])
    assert res.exit_code == 2 and "--tokenizer" in res.output and not (tmp_path / "s.jsonl").exists()
