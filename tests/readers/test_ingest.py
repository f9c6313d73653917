"""Tests of replay/readers/ingest.py (and replay/readers/formats.py)."""

from __future__ import annotations

import gzip
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from replay.store import db
from replay.readers.formats import BASH_TOOL, Reject, parse_ts
from replay.readers.ingest import IngestSummary, expand_paths, ingest, summary_text

from support.logs import SECRET, anthropic_wrapped, write_jsonl
from support.paths import SHARED as DATA  # noqa: E402

MOONCAKE = DATA / "mooncake" / "conversation_trace.jsonl"
TRAJ_DIR = DATA / "mini-swe-agent-deepseek" / "deepseek_chat_dev"


@pytest.fixture
def con():
    c = db.connect(None)
    yield c
    c.close()


def openai_wrapped(ts="2025-01-01T00:00:00Z", **over):
    rec = {
        "timestamp": ts,
        "org": "org-1",
        "request": {
            "model": "gpt-4o",
            "messages": [{"role": "system", "content": f"sys {SECRET}"},
                         {"role": "user", "content": f"q {SECRET}"}],
            "prompt_cache_key": "pck-7",
            "user": "end-user-9",
        },
        "response": {
            "model": "gpt-4o-2024",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}],
            "usage": {"prompt_tokens": 2000, "completion_tokens": 30,
                      "prompt_tokens_details": {"cached_tokens": 1920}},
        },
    }
    rec.update(over)
    return rec


def check_reconciles(con, s: IngestSummary) -> None:
    assert s.reconciles()
    n_req = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    n_rej = con.execute("SELECT count(*) FROM rejects").fetchone()[0]
    src = con.execute("SELECT sum(lines), sum(loaded), sum(rejected) FROM sources").fetchone()
    assert n_req == src[1]
    assert src[0] == src[1] + src[2]
    assert n_rej >= src[2]  # plus any file never recorded in sources (unreadable before hashing)


def rejects(con) -> list[tuple]:
    return con.execute("SELECT line_no, reason, detail FROM rejects ORDER BY line_no NULLS FIRST").fetchall()


# ----------------------------------------------------------------- formats


def test_anthropic_wrapped(con, tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [anthropic_wrapped(), anthropic_wrapped(ts=1700000001)])
    s = ingest(con, [str(p)])
    assert (s.files, s.lines, s.loaded, s.rejected) == (1, 2, 2, 0)
    check_reconciles(con, s)
    row = con.execute(
        "SELECT request_id, line_no, format, ts_us / 1000000 AS ts, tenant, session, user_id, model, body, output, "
        "usage_prompt_tokens, usage_cached_tokens, usage_cache_write_tokens, usage_output_tokens, "
        "prompt_cache_key FROM (SELECT r.* REPLACE (b.body AS body) FROM requests r JOIN request_bodies b USING (request_id)) requests ORDER BY request_id").fetchall()
    r = row[0]
    assert r[:8] == (1, 1, "anthropic", 1700000000.0, "acme", "s1", "u-42", "claude-sonnet-4")
    body = json.loads(r[8])
    assert list(body) == ["model", "max_tokens", "system", "tools", "messages", "metadata"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert r[8] == json.dumps(anthropic_wrapped()["request"], separators=(",", ":"), ensure_ascii=False)
    assert json.loads(r[9]) == [{"type": "text", "text": "hello"}]
    assert r[10:14] == (130, 100, 20, 5)
    assert r[14] is None
    assert row[1][0] == 2 and row[1][3] == 1700000001.0
    assert con.execute("SELECT format, lines, loaded, rejected FROM sources").fetchall() == [("anthropic", 2, 2, 0)]


def test_anthropic_flat(con, tmp_path):
    rec = {"timestamp": "2024-05-01T12:00:00+02:00", "organization": "o9", "session_id": "sess",
           "model": "claude-3-5-haiku", "max_tokens": 100, "system": f"be brief {SECRET}",
           "messages": [{"role": "user", "content": "hello"}],
           "response": {"content": [{"type": "text", "text": "yo"}],
                        "usage": {"input_tokens": 7, "output_tokens": 2}}}
    p = write_jsonl(tmp_path / "flat.jsonl", [rec])
    s = ingest(con, [str(p)])
    assert s.loaded == 1
    r = con.execute("SELECT format, ts_us / 1000000 AS ts, tenant, session, body, output, usage_prompt_tokens, "
                    "usage_cached_tokens, usage_output_tokens FROM (SELECT r.* REPLACE (b.body AS body) FROM requests r JOIN request_bodies b USING (request_id)) requests").fetchone()
    assert r[0] == "anthropic"
    assert r[1] == datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc).timestamp()
    assert r[2:4] == ("o9", "sess")
    assert json.loads(r[4]) == {"model": "claude-3-5-haiku", "max_tokens": 100, "system": f"be brief {SECRET}",
                                "messages": [{"role": "user", "content": "hello"}]}
    assert json.loads(r[5]) == [{"type": "text", "text": "yo"}]
    assert r[6:] == (7, None, 2)


def test_openai_wrapped_with_key_and_cache(con, tmp_path):
    p = write_jsonl(tmp_path / "o.jsonl", [openai_wrapped()])
    s = ingest(con, [str(p)])
    assert s.loaded == 1
    r = con.execute("SELECT format, ts_us / 1000000 AS ts, tenant, prompt_cache_key, user_id, model, output, "
                    "usage_prompt_tokens, usage_cached_tokens, usage_cache_write_tokens, usage_output_tokens "
                    "FROM requests").fetchone()
    assert r[:6] == ("openai", datetime(2025, 1, 1, tzinfo=timezone.utc).timestamp(), "org-1", "pck-7",
                     "end-user-9", "gpt-4o")
    assert json.loads(r[6]) == {"role": "assistant", "content": "a"}
    assert r[7:] == (2000, 1920, None, 30)


def test_openai_flat_deepseek_usage(con, tmp_path):
    rec = {"ts": 1700000000123, "model": "deepseek-chat", "user": "u1", "prompt_cache_key": "k",
           "messages": [{"role": "user", "content": "x"}],
           "usage": {"prompt_tokens": 640, "completion_tokens": 3, "prompt_cache_hit_tokens": 576}}
    p = write_jsonl(tmp_path / "o.jsonl", [rec])
    ingest(con, [str(p)])
    r = con.execute("SELECT format, ts_us / 1000000 AS ts, tenant, user_id, prompt_cache_key, body, usage_cached_tokens "
                    "FROM (SELECT r.* REPLACE (b.body AS body) FROM requests r JOIN request_bodies b USING (request_id)) requests").fetchone()
    assert r[0] == "openai"
    assert r[1] == pytest.approx(1700000000.123)
    # in a flat OpenAI record `user` is the body's end-user field, not the tenant
    assert r[2:5] == ("default", "u1", "k")
    assert json.loads(r[5]) == {"model": "deepseek-chat", "user": "u1", "prompt_cache_key": "k",
                                "messages": [{"role": "user", "content": "x"}]}
    assert r[6] == 576


def test_tokens_format(con, tmp_path):
    recs = [
        {"ts": 10, "tenant": "t1", "prompt_cache_key": "k1", "session": "s", "tokens": [1, 2, 3],
         "output_tokens": [4, 5]},
        {"ts": 11.5, "tenant": "t2", "tokens": []},
        {"ts": 12, "tokens": [1]},  # no tenant
        {"ts": 13, "tenant": "t", "tokens": [1, "2"]},
        {"ts": 14, "tenant": "t", "tokens": "1 2 3"},
        {"ts": 15, "tenant": "t", "tokens": [1], "output_tokens": {"a": 1}},
    ]
    p = write_jsonl(tmp_path / "t.jsonl", recs)
    s = ingest(con, [str(p)])
    check_reconciles(con, s)
    assert (s.loaded, s.rejected) == (2, 4)
    rows = con.execute("SELECT ts_us / 1000000 AS ts, tenant, prompt_cache_key, session, tokens, output_tokens, body "
                       "FROM (SELECT r.* REPLACE (b.body AS body) FROM requests r JOIN request_bodies b USING (request_id)) requests ORDER BY request_id").fetchall()
    assert rows[0] == (10.0, "t1", "k1", "s", [1, 2, 3], [4, 5], None)
    assert rows[1] == (11.5, "t2", None, None, [], None, None)
    rej = rejects(con)
    assert [r[:2] for r in rej] == [(3, "missing_tenant"), (4, "wrong_type"), (5, "wrong_type"), (6, "wrong_type")]
    assert "tokens[1] is string" in rej[1][2]
    assert "'tokens' is string" in rej[2][2]
    assert "'output_tokens' is object" in rej[3][2]


def test_mooncake_small(con, tmp_path):
    recs = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]},
        {"timestamp": 2500, "input_length": 600, "hash_ids": [0, "x"]},
        {"timestamp": 2600, "hash_ids": [0, 3], "input_length": 1.5},
    ]
    p = write_jsonl(tmp_path / "m.jsonl", recs)
    s = ingest(con, [str(p)])
    check_reconciles(con, s)
    assert (s.loaded, s.rejected) == (2, 2)
    rows = con.execute("SELECT format, ts_us / 1000000 AS ts, tenant, block_ids, input_length, output_length FROM requests "
                       "ORDER BY request_id").fetchall()
    assert rows == [("mooncake", 0.0, "default", [0, 1], 1000, 10), ("mooncake", 1.5, "default", [0, 2], 600, 3)]
    assert [r[1] for r in rejects(con)] == ["wrong_type", "wrong_type"]


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared mooncake trace absent")
def test_mooncake_real_trace(con):
    s = ingest(con, [str(MOONCAKE)])
    assert (s.lines, s.loaded, s.rejected) == (12031, 12031, 0)
    check_reconciles(con, s)
    r = con.execute("SELECT count(*), min(ts_us) / 1000000, max(ts_us) / 1000000, avg(input_length), "
                    "bool_and(len(block_ids) = ceil(input_length / 512)) FROM requests").fetchone()
    assert r[0] == 12031 and r[1] == 0.0 and 3000 < r[2] < 3700
    assert 11000 < r[3] < 13000
    assert r[4]


@pytest.mark.skipif(not TRAJ_DIR.exists(), reason="shared mini-swe-agent trajectories absent")
def test_trajectory_real_file(con):
    path = sorted(TRAJ_DIR.glob("*.traj.json.gz"))[0]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    msgs = doc["messages"]
    assistant = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    s = ingest(con, [str(path)])
    assert s.loaded == len(assistant) > 0 and s.rejected == 0
    check_reconciles(con, s)
    rows = con.execute("SELECT line_no, format, ts_us / 1000000 AS ts, tenant, session, model, body, output, usage_prompt_tokens, "
                       "usage_cached_tokens, usage_output_tokens FROM (SELECT r.* REPLACE (b.body AS body) FROM requests r JOIN request_bodies b USING (request_id)) requests ORDER BY request_id").fetchall()
    assert [r[0] for r in rows] == list(range(1, len(assistant) + 1))
    for (line_no, fmt, ts, tenant, session, model, body, output, up, uc, uo), i in zip(rows, assistant):
        resp = msgs[i]["extra"]["response"]
        assert fmt == "trajectory" and tenant == "default" and session == doc["instance_id"]
        assert ts == resp["created"] and model == resp["model"]
        b = json.loads(body)
        assert b["tools"] == [BASH_TOOL]
        assert b["messages"] == [{k: v for k, v in m.items() if k != "extra"} for m in msgs[:i]]
        assert json.loads(output) == {k: v for k, v in msgs[i].items() if k != "extra"}
        assert up == resp["usage"]["prompt_tokens"] and uo == resp["usage"]["completion_tokens"]
        assert uc == resp["usage"]["prompt_cache_hit_tokens"]
    assert con.execute("SELECT format, lines, loaded FROM sources").fetchone() == ("trajectory", len(assistant),
                                                                                  len(assistant))


def test_trajectory_synthetic(con, tmp_path):
    doc = {"info": {}, "trajectory_format": "mini-swe-agent-1.1", "instance_id": "inst-1", "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "a1", "extra": {"timestamp": 1700000000.5,
                                                         "response": {"model": "m", "usage": {
                                                             "prompt_tokens": 100, "completion_tokens": 5,
                                                             "prompt_tokens_details": {"cached_tokens": 64}}}}},
        {"role": "user", "content": "obs", "extra": {"returncode": 0}},
        {"role": "assistant", "content": "a2", "extra": {}},
    ]}
    p = tmp_path / "x.traj.json"
    p.write_text(json.dumps(doc))
    empty = tmp_path / "empty.traj.json.gz"
    empty.write_bytes(gzip.compress(json.dumps({"instance_id": "e", "trajectory_format": "mini-swe-agent-1.1",
                                                "messages": [{"role": "system", "content": "s"}]}).encode()))
    bad = tmp_path / "bad.traj.json"
    bad.write_text('{"messages": [' + SECRET)
    s = ingest(con, [str(tmp_path)])
    check_reconciles(con, s)
    assert (s.files, s.loaded, s.rejected) == (3, 1, 2)
    r = con.execute("SELECT line_no, ts_us / 1000000 AS ts, session, usage_cached_tokens, body FROM (SELECT r.* REPLACE (b.body AS body) FROM requests r JOIN request_bodies b USING (request_id)) requests").fetchone()
    assert r[:4] == (1, 1700000000.5, "inst-1", 64)
    assert [m["content"] for m in json.loads(r[4])["messages"]] == ["s", "task"]
    assert rejects(con) == [
        (None, "malformed_json", rejects(con)[0][2]),
        (2, "missing_timestamp", "assistant turn has neither extra.response.created nor extra.timestamp"),
    ]
    assert SECRET not in rejects(con)[0][2]
    src = {Path(p).name: (f, ln, lo, rj) for p, f, ln, lo, rj in
           con.execute("SELECT path, format, lines, loaded, rejected FROM sources").fetchall()}
    assert src == {"x.traj.json": ("trajectory", 2, 1, 1), "empty.traj.json.gz": ("trajectory", 0, 0, 0),
                   "bad.traj.json": ("trajectory", 1, 0, 1)}


def test_json_array_and_parquet(con, tmp_path):
    (tmp_path / "arr.json").write_text(json.dumps([anthropic_wrapped(), anthropic_wrapped(ts=5), 3]))
    pq.write_table(pa.Table.from_pylist([
        {"ts": 1, "tenant": "a", "tokens": [1, 2]},
        {"ts": 2, "tenant": "b", "tokens": [3]},
    ]), tmp_path / "t.parquet")
    s = ingest(con, [str(tmp_path)])
    check_reconciles(con, s)
    assert (s.files, s.loaded, s.rejected) == (2, 4, 1)
    rows = con.execute("SELECT r.format, r.line_no, r.tenant, r.tokens FROM requests r ORDER BY request_id").fetchall()
    # files sorted by path: arr.json before t.parquet
    assert rows == [("anthropic", 1, "acme", None), ("anthropic", 2, "acme", None),
                    ("tokens", 1, "a", [1, 2]), ("tokens", 2, "b", [3])]
    assert rejects(con)[0][:2] == (3, "wrong_type")


# ----------------------------------------------------------------- rejects


def test_every_rejection_reason(con, tmp_path):
    good = anthropic_wrapped()
    lines = [
        json.dumps(good),                                                     # 1 ok
        "",                                                                   # 2 blank_line
        '{"timestamp": 1, "request": {"messages": [' + f'"{SECRET}',          # 3 malformed_json
        json.dumps({k: v for k, v in good.items() if k != "timestamp"}),     # 4 missing_timestamp
        json.dumps({**good, "timestamp": "next tuesday"}),                    # 5 bad_timestamp
        json.dumps({**good, "timestamp": [1]}),                               # 6 bad_timestamp (type)
        json.dumps({**good, "request": {"model": "m", "max_tokens": 1}}),    # 7 no_prompt
        json.dumps({**good, "request": {"messages": SECRET}}),               # 8 wrong_type (messages)
        json.dumps({**good, "request": {"system": {"x": SECRET}, "messages": []}}),  # 9 wrong_type (system)
        json.dumps([SECRET]),                                                 # 10 wrong_type (record)
        json.dumps({**good, "tenant": {"name": SECRET}}),                    # 11 wrong_type (tenant)
        "   ",                                                                # 12 blank_line
        b"\xff\xfe".decode("latin-1"),                                        # 13 malformed_json (utf-8)
    ]
    p = tmp_path / "mixed.jsonl"
    p.write_bytes("\n".join(lines[:12]).encode() + b"\n\xff\xfe{}\n")
    s = ingest(con, [str(p)])
    check_reconciles(con, s)
    assert (s.lines, s.loaded, s.rejected) == (13, 1, 12)
    got = rejects(con)
    reasons = [(ln, reason) for ln, reason, _ in got]
    assert reasons == [(2, "blank_line"), (3, "malformed_json"), (4, "missing_timestamp"), (5, "bad_timestamp"),
                       (6, "bad_timestamp"), (7, "no_prompt"), (8, "wrong_type"), (9, "wrong_type"),
                       (10, "wrong_type"), (11, "wrong_type"), (12, "blank_line"), (13, "malformed_json")]
    detail = {ln: d for ln, _, d in got}
    assert "timestamp" in detail[4]
    assert "'timestamp'" in detail[5] and "ISO-8601" in detail[5]
    assert "array" in detail[6]
    assert "'messages' is string" in detail[8]
    assert "'system' is object" in detail[9]
    assert "record is array" in detail[10]
    assert "'tenant' is object" in detail[11]
    assert "UTF-8" in detail[13]
    assert s.rejected_by_reason == {"blank_line": 2, "malformed_json": 2, "missing_timestamp": 1,
                                    "bad_timestamp": 2, "no_prompt": 1, "wrong_type": 4}
    for _, _, d in got:
        assert d and SECRET not in d and "next tuesday" not in d
    text = summary_text(s)
    assert "loaded: 1" in text and "wrong_type" in text and "blank_line" in text


def test_unknown_format(con, tmp_path):
    p = write_jsonl(tmp_path / "u.jsonl", [{"when": 1, "text": SECRET}, {"when": 2, "text": SECRET}, "oops{"])
    s = ingest(con, [str(p)])
    check_reconciles(con, s)
    assert s.rejected_by_reason == {"unknown_format": 2, "malformed_json": 1}
    for _, reason, d in rejects(con):
        assert SECRET not in d
    assert "format=" in rejects(con)[0][2]
    assert con.execute("SELECT format, lines, rejected FROM sources").fetchone() == (None, 3, 3)


def test_unreadable_file(con, tmp_path):
    write_jsonl(tmp_path / "good.jsonl", [anthropic_wrapped()])
    bad = tmp_path / "broken.jsonl.gz"
    data = gzip.compress(("\n".join(json.dumps(anthropic_wrapped(ts=i)) for i in range(50))).encode())
    bad.write_bytes(data[: len(data) // 2])  # truncated gzip stream
    s = ingest(con, [str(tmp_path)])
    check_reconciles(con, s)
    assert (s.files, s.loaded, s.rejected) == (2, 1, 1)
    assert rejects(con)[0][:2] == (None, "unreadable_file")
    # the truncated file contributed nothing (all or nothing), ids stay dense
    assert con.execute("SELECT list(request_id ORDER BY request_id) FROM requests").fetchone()[0] == [1]


# ----------------------------------------------------------------- idempotence, compression, paths


def test_idempotent_reingest(con, tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [anthropic_wrapped(ts=i) for i in range(5)])
    s1 = ingest(con, [str(p)])
    assert s1.loaded == 5 and s1.skipped_files == 0
    s2 = ingest(con, [str(p)])
    assert (s2.files, s2.skipped_files, s2.lines, s2.loaded) == (1, 1, 0, 0)
    assert s2.reconciles()
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 5
    assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 1
    # a new file continues the request ids
    q = write_jsonl(tmp_path / "b.jsonl", [anthropic_wrapped(ts=9)])
    s3 = ingest(con, [str(tmp_path)])
    assert (s3.files, s3.skipped_files, s3.loaded) == (2, 1, 1)
    assert con.execute("SELECT request_id, source_id, line_no FROM requests WHERE ts_us = 9000000").fetchone() == (6, 2, 1)
    # identical bytes under another name are skipped too
    (tmp_path / "copy.jsonl").write_bytes(q.read_bytes())
    assert ingest(con, [str(tmp_path / "copy.jsonl")]).skipped_files == 1


@pytest.fixture(params=[False, True], ids=["fast-hash", "slow-hash"])
def slow_hash(request, monkeypatch):
    """A file is loaded while its hash is computed beside it. A slow hash makes
    every file take that optimistic path; otherwise small files are hashed first."""
    if request.param:
        import replay.readers.ingest as ingest_mod

        real = ingest_mod.file_keys

        def slow(path):
            time.sleep(0.2)
            return real(path)

        monkeypatch.setattr(ingest_mod, "file_keys", slow)
    return request.param


def test_same_content_twice_in_one_run(con, tmp_path, slow_hash):
    """A second path with the same bytes is rolled back once its hash is known —
    rows, rejects, blobs and request ids all as if it had never been read."""
    recs = [anthropic_wrapped(ts=i) for i in range(4)] + ["{broken"]
    a = write_jsonl(tmp_path / "a.jsonl", recs)
    (tmp_path / "b.jsonl").write_bytes(a.read_bytes())
    c = write_jsonl(tmp_path / "c.jsonl", [anthropic_wrapped(ts=7)])
    s = ingest(con, [str(a), str(tmp_path / "b.jsonl"), str(c)])
    check_reconciles(con, s)
    assert (s.files, s.skipped_files, s.loaded, s.rejected) == (3, 1, 5, 1)
    assert con.execute("SELECT count(*) FROM rejects").fetchone()[0] == 1
    assert con.execute("SELECT path FROM sources ORDER BY source_id").fetchall() == [(str(a),), (str(c),)]
    assert con.execute("SELECT request_id, source_id FROM requests WHERE ts_us = 7000000").fetchone() == (5, 2)
    # no blob is stored twice, and every body reads back whole
    assert con.execute("SELECT count(*) - count(DISTINCT blob_id) FROM blobs").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM request_bodies WHERE body IS NULL").fetchone()[0] == 0
    bodies = con.execute("SELECT body FROM request_bodies ORDER BY request_id").fetchall()
    assert [json.loads(b[0])["messages"] for b in bodies[:4]] == [r["request"]["messages"] for r in recs[:4]]


def test_file_vanishing_before_it_is_read(con, tmp_path, monkeypatch, slow_hash):
    import replay.readers.ingest as ingest_mod

    good = write_jsonl(tmp_path / "good.jsonl", [anthropic_wrapped()])
    gone = str(tmp_path / "gone.jsonl")
    monkeypatch.setattr(ingest_mod, "expand_paths", lambda paths: [gone, str(good)])
    s = ingest(con, ["ignored"])
    check_reconciles(con, s)
    assert (s.files, s.loaded, s.rejected, s.rejected_by_reason) == (2, 1, 1, {"unreadable_file": 1})
    assert con.execute("SELECT source_id, path, reason FROM rejects").fetchall() == [(None, gone, "unreadable_file")]
    assert con.execute("SELECT path FROM sources").fetchall() == [(str(good),)]
    assert con.execute("SELECT request_id FROM requests").fetchall() == [(1,)]


def test_integers_beyond_64_bits_keep_their_digits(con, tmp_path):
    """orjson would read them as floats: such lines go to the standard parser."""
    big, neg = 123456789012345678901234567890, -9999999999999999999
    rec = anthropic_wrapped(ts=1)
    rec["request"]["metadata"]["n"] = big
    rec["request"]["messages"].append({"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"seed": neg, "ok": 18446744073709551615}}]})
    p = write_jsonl(tmp_path / "a.jsonl", [rec, anthropic_wrapped(ts=2)])
    s = ingest(con, [str(p)])
    check_reconciles(con, s)
    body = json.loads(con.execute("SELECT body FROM request_bodies WHERE request_id = 1").fetchone()[0])
    assert body["metadata"]["n"] == big and isinstance(body["metadata"]["n"], int)
    assert body["messages"][-1]["content"][0]["input"] == {"seed": neg, "ok": 18446744073709551615}


def test_gz_and_zst(con, tmp_path):
    write_jsonl(tmp_path / "a.jsonl.gz", [anthropic_wrapped(ts=1)], opener=gzip.open)
    cctx = zstandard.ZstdCompressor()
    raw = "\n".join(json.dumps(openai_wrapped(ts=i)) for i in range(3000)).encode()
    (tmp_path / "b.jsonl.zst").write_bytes(cctx.compress(raw))
    s = ingest(con, [str(tmp_path / "a.jsonl.gz"), str(tmp_path / "b.jsonl.zst")])
    check_reconciles(con, s)
    assert (s.files, s.loaded, s.rejected) == (2, 3001, 0)
    assert con.execute("SELECT format, count(*) FROM requests GROUP BY 1 ORDER BY 1").fetchall() == [
        ("anthropic", 1), ("openai", 3000)]


def test_directory_and_glob(con, tmp_path):
    sub = tmp_path / "logs" / "2025" / "01"
    sub.mkdir(parents=True)
    write_jsonl(sub / "b.jsonl", [anthropic_wrapped(ts=2)])
    write_jsonl(tmp_path / "logs" / "a.jsonl", [anthropic_wrapped(ts=1)])
    (tmp_path / "logs" / "notes.txt").write_text("not a log")
    write_jsonl(tmp_path / "other.jsonl", [anthropic_wrapped(ts=3)])
    files = expand_paths([str(tmp_path / "logs")])
    assert [Path(f).name for f in files] == ["b.jsonl", "a.jsonl"] or [Path(f).name for f in files] == [
        "a.jsonl", "b.jsonl"]
    assert files == sorted(files)
    s = ingest(con, [str(tmp_path / "logs")])
    assert (s.files, s.loaded) == (2, 2)
    s = ingest(con, [str(tmp_path / "*.jsonl")])
    assert (s.files, s.loaded) == (1, 1)
    s = ingest(con, [str(tmp_path / "**" / "*.jsonl")])
    assert (s.files, s.skipped_files, s.loaded) == (3, 3, 0)
    with pytest.raises(FileNotFoundError):
        ingest(con, [str(tmp_path / "nope-*.jsonl")])
    with pytest.raises(FileNotFoundError):
        ingest(con, [str(tmp_path / "missing.jsonl")])


def test_request_id_order(con, tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [anthropic_wrapped(ts=1), anthropic_wrapped(ts=1)])
    write_jsonl(tmp_path / "a.jsonl", [anthropic_wrapped(ts=5), "", anthropic_wrapped(ts=0)])
    ingest(con, [str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl")])
    rows = con.execute("SELECT request_id, s.path, line_no FROM requests JOIN sources s USING (source_id) "
                       "ORDER BY request_id").fetchall()
    assert [(Path(p).name, ln) for _, p, ln in rows] == [("a.jsonl", 1), ("a.jsonl", 3), ("b.jsonl", 1),
                                                         ("b.jsonl", 2)]
    assert [r[0] for r in rows] == [1, 2, 3, 4]


# ----------------------------------------------------------------- timestamps, fields, forcing


@pytest.mark.parametrize("value, unit, expected", [
    (1700000000, None, 1700000000_000000),
    (1700000000123, None, 1700000000_123000),
    (1700000000123456, None, 1700000000_123456),
    ("1700000000", None, 1700000000_000000),
    (" 1700000000.5 ", None, 1700000000_500000),
    ("1700000000.000001", None, 1700000000_000001),
    (1700000000.000001, None, 1700000000_000001),   # a float: its shortest decimal, exactly
    ("2024-01-01T00:00:00Z", None, 1704067200_000000),
    ("2024-01-01T00:00:00", None, 1704067200_000000),
    ("2024-01-01 01:00:00+01:00", None, 1704067200_000000),
    ("2024-01-01T00:00:00.250Z", None, 1704067200_250000),
    (1500, "ms", 1_500_000),
    (1500, "us", 1500),
    (60000, "ms", 60_000_000),                       # exactly 60 s, never 60.00000000000023
    (1700000000123, "s", 1700000000123_000000),
    ("2024-01-01T00:00:00Z", "ms", 1704067200_000000),  # ISO strings are never scaled
    (12.5, None, 12_500_000),
])
def test_parse_ts(value, unit, expected):
    """Integer microseconds, exactly."""
    got = parse_ts(value, "timestamp", unit)
    assert isinstance(got, int) and got == expected


def test_the_time_unit_is_decided_once_per_file(con, tmp_path):
    """A file's first numeric timestamp decides its unit (here ms, by magnitude); a later
    small number in the same file is read in ms too, not taken for seconds. Another
    file decides anew; the decided unit is recorded with the file."""
    p = write_jsonl(tmp_path / "a.jsonl", [{"ts": 1700000000000, "tenant": "t", "tokens": [1]},
                                           {"ts": 1700000060000, "tenant": "t", "tokens": [1]},
                                           {"ts": 5000, "tenant": "t", "tokens": [1]}])
    q = write_jsonl(tmp_path / "b.jsonl", [{"ts": 1700000000, "tenant": "t", "tokens": [1]},
                                           {"ts": 1700000000123, "tenant": "t", "tokens": [1]}])
    ingest(con, [str(p), str(q)])
    got = [r[0] for r in con.execute("SELECT ts_us FROM requests ORDER BY request_id").fetchall()]
    assert got == [1700000000_000000, 1700000060_000000, 5_000_000, 1700000000_000000, 1700000000123_000000]
    units = dict(con.execute("SELECT path, time_unit FROM sources").fetchall())
    assert units == {str(p): "ms", str(q): "s"}


@pytest.mark.parametrize("value, reason", [
    (None, "missing_timestamp"), ("yesterday", "bad_timestamp"), (True, "bad_timestamp"),
    ({"s": 1}, "bad_timestamp"), ("nan", "bad_timestamp"),
])
def test_parse_ts_rejects(value, reason):
    with pytest.raises(Reject) as ei:
        parse_ts(value, "timestamp", None)
    assert ei.value.reason == reason


def test_time_unit_option(con, tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"ts": 1500, "tenant": "t", "tokens": [1]},
                                           {"created_at": "2500", "tenant": "t", "tokens": [1]}])
    ingest(con, [str(p)], time_unit="ms")
    assert [r[0] for r in con.execute("SELECT ts_us FROM requests ORDER BY request_id").fetchall()] == [1_500_000, 2_500_000]
    with pytest.raises(ValueError):
        ingest(con, [str(p)], time_unit="h")


def test_mooncake_time_unit_override(con, tmp_path):
    p = write_jsonl(tmp_path / "m.jsonl", [{"timestamp": 3, "input_length": 1, "hash_ids": [1]}])
    ingest(con, [str(p)], time_unit="s")
    assert con.execute("SELECT ts_us FROM requests").fetchone()[0] == 3_000_000


def test_field_mapping_dotted_path(con, tmp_path):
    rec = anthropic_wrapped()
    rec["meta"] = {"when": "2024-01-01T00:00:00Z", "conv": {"id": 77}}
    del rec["timestamp"]
    p = write_jsonl(tmp_path / "a.jsonl", [rec, {**rec, "request": {**rec["request"], "metadata": {}}}])
    s = ingest(con, [str(p)], fields={"tenant": "request.metadata.user_id", "timestamp": "meta.when",
                                      "session": "meta.conv.id", "key": "request.model"})
    assert s.loaded == 2
    rows = con.execute("SELECT tenant, ts_us / 1000000 AS ts, session, prompt_cache_key FROM requests ORDER BY request_id").fetchall()
    assert rows[0] == ("u-42", 1704067200.0, "77", "claude-sonnet-4")
    assert rows[1][0] == "default"  # mapped path absent → default tenant
    with pytest.raises(ValueError):
        ingest(con, [str(p)], fields={"colour": "x"})


def test_format_forcing(con, tmp_path):
    # plain messages fit both APIs: detected as openai unless forced
    rec = {"timestamp": 1, "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    p = write_jsonl(tmp_path / "plain.jsonl", [rec])
    ingest(con, [str(p)])
    assert con.execute("SELECT format FROM requests").fetchone()[0] == "openai"
    con2 = db.connect(None)
    ingest(con2, [str(p)], format="anthropic")
    assert con2.execute("SELECT format FROM requests").fetchone()[0] == "anthropic"
    assert con2.execute("SELECT format FROM sources").fetchone()[0] == "anthropic"
    # forcing a format that does not fit rejects with that format's reasons
    con3 = db.connect(None)
    s = ingest(con3, [str(p)], format="tokens")
    assert s.rejected_by_reason == {"no_prompt": 1}
    with pytest.raises(ValueError):
        ingest(con3, [str(p)], format="csv")


def test_detection_looks_past_ambiguous_records(con, tmp_path):
    plain = {"timestamp": 1, "request": {"messages": [{"role": "user", "content": "hi"}]}}
    p = write_jsonl(tmp_path / "x.jsonl", [plain, plain, anthropic_wrapped()])
    ingest(con, [str(p)])
    assert {r[0] for r in con.execute("SELECT format FROM requests").fetchall()} == {"anthropic"}


def test_progress_and_summary_text(con, tmp_path, capsys):
    p = write_jsonl(tmp_path / "a.jsonl", [anthropic_wrapped(), ""])
    s = ingest(con, [str(p)], progress=True)
    text = summary_text(s)
    assert "loaded: 1" in text and "rejected: 1" in text and "blank_line" in text
    assert capsys.readouterr().out == ""  # progress goes to stderr


def test_odd_files(con, tmp_path):
    import io

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{"ts": 1, "tenant": "a", "tokens": [1, 2]}]), buf)
    (tmp_path / "t.parquet.gz").write_bytes(gzip.compress(buf.getvalue()))
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"ts": 1, "tenant": "a", "tokens": [1]}).encode()
                                        + b"\n" + json.dumps({"ts": 2, "tenant": "a", "tokens": [2]}).encode())
    (tmp_path / "garbage.parquet").write_bytes(b"not a parquet file")
    (tmp_path / "m.jsonl").write_text(json.dumps({"timestamp": 1, "hash_ids": [1], "input_length": 3}) + "\n"
                                      + json.dumps({"timestamp": 2, "hash_ids": [1], "input_length": None}) + "\n")
    s = ingest(con, [str(tmp_path)])
    check_reconciles(con, s)
    assert (s.files, s.loaded) == (4, 4)
    assert s.rejected_by_reason == {"unreadable_file": 1, "missing_field": 1}
    src = {Path(p).name: (f, ln, lo, rj) for p, f, ln, lo, rj in
           con.execute("SELECT path, format, lines, loaded, rejected FROM sources").fetchall()}
    assert src["t.parquet.gz"] == ("tokens", 1, 1, 0)
    assert src["bom.json"] == ("tokens", 2, 2, 0)  # JSON Lines named .json
    assert src["garbage.parquet"] == (None, 1, 0, 1)


def test_inside_caller_transaction(con, tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [anthropic_wrapped()])
    con.begin()
    s = ingest(con, [str(p)])
    con.commit()
    assert s.loaded == 1
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 1


def test_directories_skip_underscore_and_hidden_files(tmp_path):
    from replay.store import db
    from replay.readers.ingest import expand_paths, ingest

    (tmp_path / "a.jsonl").write_text('{"ts": 1, "tenant": "t", "tokens": [1, 2]}\n')
    (tmp_path / "_truth.jsonl").write_text('{"not": "a request"}\n')
    (tmp_path / ".hidden.jsonl").write_text('{"not": "a request"}\n')
    assert [p.rsplit("/", 1)[1] for p in expand_paths([tmp_path])] == ["a.jsonl"]
    # named explicitly, it is taken (and here rejected as an unknown format)
    s = ingest(db.connect(None), [str(tmp_path / "_truth.jsonl")])
    assert s.rejected_by_reason == {"unknown_format": 1}


# ----------------------------------------------------------------- the fast JSON paths

def _random_json(rng, depth: int = 0) -> str:
    """A random JSON text: odd numbers (huge ints, exponents, -0), escapes, nesting."""
    import struct

    def number():
        k = rng.random()
        if k < 0.25:
            return repr(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0])
        if k < 0.5:
            return str(rng.randint(-10 ** 30, 10 ** 30))
        if k < 0.75:
            return f"{rng.randint(0, 10 ** rng.randint(1, 22))}.{rng.randint(0, 10 ** rng.randint(1, 22))}e{rng.randint(-330, 310)}"
        return rng.choice(["0", "-0", "-0.0", "1E5", "1e-5", "2.5E+3", "9007199254740993", "18446744073709551616",
                           "-9223372036854775809", "5e-324", "1.7976931348623157e308", "1e400", "100.0"])

    def string():
        parts = [rng.choice(['\\n', '\\"', '\\\\', '\\/', '\\b', '\\u00e9', '\\u2028', '\\ud83d\\ude00', '\\ud800',
                             '\\u0000', 'ab cé€😀', '12.5e3', str(rng.randint(0, 10 ** 20))])
                 for _ in range(rng.randint(0, 5))]
        return '"' + "".join(parts) + '"'

    k = rng.random()
    if depth > 3 or k < 0.4:
        return rng.choice([number, string, lambda: rng.choice(["true", "false", "null"])])()
    if k < 0.7:
        return "[" + ",".join(_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))) + "]"
    return "{" + ",".join(f"{string()}:{_random_json(rng, depth + 1)}" for _ in range(rng.randint(0, 4))) + "}"


def _same_value(a, b) -> bool:
    import math

    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b) or (a != a and b != b)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_value, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_value(a[k], b[k]) for k in a)
    return a == b


def test_fast_parser_reads_what_the_standard_parser_reads():
    import random

    from replay.store.jsontext import JSONDecodeError, loads, loads_fast
    from replay.readers.files import parse_line

    rng = random.Random(0)
    refused = 0
    for _ in range(30_000):
        text = _random_json(rng)
        try:
            want = json.loads(text)
        except json.JSONDecodeError:
            continue  # the generator's rare invalid text
        try:
            got = loads_fast(text.encode())
        except JSONDecodeError:
            refused += 1  # the standard parser reads these (NaN, 1e400, lone surrogates)
            got = loads(text)
        assert _same_value(got, want), text
        assert _same_value(parse_line(text.encode() + b"\n"), want), text
    assert refused > 0  # the fallback was exercised too


def test_blob_text_equals_the_standard_serialization():
    import random

    import orjson

    from replay.store.jsontext import compact_dumps
    from replay.readers.blobs import part_text, part_text_of

    rng = random.Random(1)
    for _ in range(20_000):
        try:
            obj = json.loads(_random_json(rng))
        except json.JSONDecodeError:
            continue
        try:
            ser = orjson.dumps(obj)
        except (TypeError, orjson.JSONEncodeError):
            continue  # integers beyond 64 bits, lone surrogates: the standard path is taken
        try:
            want = part_text(obj)
        except Exception:
            continue
        assert part_text_of(ser, obj) == want
        assert compact_dumps(obj) == json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("fail_on", ["requests", "commit"])
def test_a_failure_on_the_database_thread_stops_the_ingest_cleanly(con, tmp_path, monkeypatch, fail_on):
    """Inserts and commits run on a thread of their own (db.Deferred): a
    failure there, noticed a batch or a file later, still leaves the files
    before it committed, it and the ones after not at all; the next run loads them."""
    import duckdb

    import replay.readers.ingest as ingest_mod
    import replay.readers.writer as writer_mod

    paths = [write_jsonl(tmp_path / f"{n}.jsonl", [anthropic_wrapped(ts=10 * k + i) for i in range(3)])
             for k, n in enumerate("abc")]
    real_insert = writer_mod.Writer._insert_now
    calls = {"commits": 0}

    def insert(self, table, tbl, schema):
        if fail_on == "requests" and table == "requests" and min(tbl.column("ts_us").to_pylist()) >= 10_000_000:
            raise duckdb.ConstraintException("planted")
        return real_insert(self, table, tbl, schema)

    monkeypatch.setattr(writer_mod.Writer, "_insert_now", insert)
    if fail_on == "commit":
        class Deferred(ingest_mod.db.Deferred):
            def submit(self, fn, *args):
                if getattr(fn, "__name__", "") == "commit":
                    calls["commits"] += 1
                    if calls["commits"] == 2:
                        def fn():
                            raise duckdb.TransactionException("planted")
                super().submit(fn, *args)

        monkeypatch.setattr(ingest_mod.db, "Deferred", Deferred)
    with pytest.raises(duckdb.Error, match="planted"):
        ingest(con, [str(p) for p in paths])
    assert con.execute("SELECT path FROM sources").fetchall() == [(str(paths[0]),)]
    assert con.execute("SELECT max(ts_us) FROM requests").fetchone()[0] < 10_000_000
    monkeypatch.undo()
    s = ingest(con, [str(p) for p in paths])
    check_reconciles(con, s)
    assert (s.skipped_files, s.loaded) == (1, 6)
    assert con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchone() == (9, 9)


def test_a_log_and_its_compressed_copies_are_one_file(con, tmp_path, slow_hash):
    """Log rotation leaves x.jsonl beside x.jsonl.gz (and .zst): loaded once, in
    either order, the others skipped; a damaged archive is still read (and
    its damage reported), not taken for the log."""
    plain = write_jsonl(tmp_path / "x.jsonl", [anthropic_wrapped(ts=i) for i in range(3)])
    data = plain.read_bytes()
    (tmp_path / "x.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "x.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    s = ingest(con, [str(tmp_path / "x.jsonl.gz"), str(tmp_path / "x.jsonl"), str(tmp_path / "x.jsonl.zst")])
    check_reconciles(con, s)
    assert (s.files, s.skipped_files, s.loaded) == (3, 2, 3)
    (tmp_path / "y.jsonl.gz").write_bytes(gzip.compress(data)[:-12])  # truncated: not the same content
    s = ingest(con, [str(tmp_path / "y.jsonl.gz")])
    assert s.skipped_files == 0


# ----------------------------------------------------------------- odd file names, oversized documents


def test_file_names_that_are_not_utf8_load_and_are_stored_escaped(con, tmp_path):
    import os

    base = os.fsencode(tmp_path)
    good = os.path.join(base, b"caf\xe9-\xff.jsonl")
    with open(good, "wb") as fh:
        fh.write((json.dumps(anthropic_wrapped()) + "\n").encode())
    traj = os.path.join(base, b"run-\xe9.traj.json")
    with open(traj, "wb") as fh:
        fh.write(json.dumps({"instance_id": None, "trajectory_format": "mini-swe-agent-1.1", "messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "t"},
            {"role": "assistant", "content": "a", "extra": {"timestamp": 1700000000}}]}).encode())
    broken = os.path.join(base, b"bad-\xe9.jsonl.gz")
    with open(broken, "wb") as fh:
        fh.write(gzip.compress(b'{"a": 1}\n' * 50)[:30])
    s = ingest(con, [str(tmp_path)])
    check_reconciles(con, s)
    assert (s.files, s.loaded, s.rejected) == (3, 2, 1)
    paths = sorted(Path(p).name for (p,) in con.execute("SELECT path FROM sources").fetchall())
    assert paths == ["bad-\\xe9.jsonl.gz", "caf\\xe9-\\xff.jsonl", "run-\\xe9.traj.json"]
    assert [Path(p).name for p, _, _ in rejects_with_path(con)] == ["bad-\\xe9.jsonl.gz"]
    again = ingest(con, [str(tmp_path)])
    assert (again.files, again.skipped_files, again.lines) == (3, 3, 0)
    with pytest.raises(FileNotFoundError, match=r"missing-\\xe9\.jsonl'"):  # printable, not a lone surrogate
        expand_paths([os.fsdecode(os.path.join(base, b"missing-\xe9.jsonl"))])


def rejects_with_path(con):
    return con.execute("SELECT path, reason, detail FROM rejects ORDER BY path, line_no").fetchall()


def test_a_whole_document_over_the_size_cap_is_one_reject_and_json_lines_still_stream(con, tmp_path, monkeypatch):
    from replay.readers import files

    monkeypatch.setattr(files, "MAX_DOCUMENT_BYTES", 2000)
    records = [anthropic_wrapped(ts=1700000000 + i) for i in range(6)]
    (tmp_path / "big.json").write_text(json.dumps(records))  # one array: a whole document
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in records) + "\n")  # JSON Lines named .json
    doc = {"instance_id": "i", "trajectory_format": "mini-swe-agent-1.1", "messages": [
        {"role": "system", "content": "s" * 3000}, {"role": "user", "content": "t"},
        {"role": "assistant", "content": "a", "extra": {"timestamp": 1700000000}}]}
    (tmp_path / "t.traj.json").write_text(json.dumps(doc))
    (tmp_path / "small.json").write_text(json.dumps(records[:1]))
    s = ingest(con, [str(tmp_path)])
    check_reconciles(con, s)
    assert (s.files, s.lines, s.loaded, s.rejected) == (4, 9, 7, 2)
    assert s.rejected_by_reason == {"too_large": 2}
    got = {Path(p).name: (ln, lo, rj) for p, ln, lo, rj in
           con.execute("SELECT path, lines, loaded, rejected FROM sources").fetchall()}
    assert got == {"big.json": (1, 0, 1), "lines.json": (6, 6, 0), "t.traj.json": (1, 0, 1), "small.json": (1, 1, 0)}
    assert all(SECRET not in d for _, _, d in rejects_with_path(con))


@pytest.mark.parametrize("cap, during", [("128MB", "256.0 MiB"), ("1GB", "953.6 MiB")])
@pytest.mark.parametrize("by_units", [False, True])
def test_ingest_sets_duckdb_for_its_work_and_sets_it_back(tmp_path, monkeypatch, cap, during, by_units):
    """A file's rows wait in its open transaction until it commits: below
    ``INGEST_MEMORY`` DuckDB would spill them, so ingest raises the cap while it
    runs (never lowers one); no checkpoint vacuums (it would rewrite the earlier
    files' row groups at every file); with an engine, DuckDB works on one thread
    (the cores are the workers'). All set back after, even when ingest fails."""
    from replay.readers import ingest as ingest_module
    from support.ranges import InProcess

    path = write_jsonl(tmp_path / "a.jsonl", [anthropic_wrapped(ts=1_700_000_000 + i) for i in range(3)])
    c = db.connect(str(tmp_path / "db.duckdb"))
    c.execute(f"SET memory_limit = '{cap}'")
    c.execute("SET threads = 2")
    now = "SELECT current_setting('memory_limit'), current_setting('threads'), current_setting('max_vacuum_tasks')"
    before = c.execute(now).fetchone()
    seen = []
    commit = ingest_module._Run._commit
    monkeypatch.setattr(ingest_module._Run, "_commit",
                        lambda self, *a: (seen.append(c.cursor().execute(now).fetchone()), commit(self, *a)))
    engine = InProcess() if by_units else None
    assert ingest(c, [str(path)], engine=engine).loaded == 3
    assert seen == [(during, 1 if by_units else 2, 0)] and c.execute(now).fetchone() == before
    assert before[2] == 100  # (DuckDB's own: set back)
    monkeypatch.setattr(ingest_module._Run, "_commit", lambda self, *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        ingest(c, [str(tmp_path / "a.jsonl"), str(write_jsonl(tmp_path / "b.jsonl", [anthropic_wrapped(ts=5)]))],
               engine=engine)
    assert c.execute(now).fetchone() == before
    c.close()
