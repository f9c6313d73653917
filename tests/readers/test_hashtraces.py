"""The hash-id trace formats `bailian`, `ragpulse` and `kv-cache-tester`
(replay/readers/hashtraces.py): detection, field mapping, rejects, counts, and
sweeps against independent counts over their hash ids."""

from __future__ import annotations

import json
import math
import random
import shutil
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay import api
from replay.cli.main import main
from replay.core.grid import Grid
from support.oracle import lcp
from replay.times import ttl_us
from replay.readers.hashtraces import chain_ids
from replay.store import db
from support.paths import FIXTURES

FIX = FIXTURES / "hashtraces"
BAILIAN = FIX / "bailian_trace_blksz_16.jsonl"
RAGPULSE = FIX / "ragpulse"
KVT = FIX / "kv-cache-tester"
SECRET = "SECRET-PROMPT-TEXT"
TTLS = (0.0, 1.0, 5.0, 14.25, 60.0, 3600.0, math.inf)


@pytest.fixture
def con():
    c = db.connect(None)
    yield c
    c.close()


def _us(t) -> int:
    return int(Decimal(str(t)) * 1_000_000)


def _rows(con, cols="*"):
    return [dict(zip([d[0] for d in con.description], r))
            for r in con.execute(f"SELECT {cols} FROM requests ORDER BY request_id").fetchall()]


def _sweep(con, blocks, streams=("global",), ttls=TTLS):
    res = api.sweep(con, Grid(ttls=ttls, blocks=blocks, min_prefixes=(0,), streams=streams))
    return {(r["stream"], r["ttl_s"], r["block"]): (r["prompt_tokens"], r["hit_tokens"]) for r in res.to_dicts()}


def _key_ttl(ttl):
    return None if math.isinf(ttl) else ttl


def _reconciles(con):
    for fmt, lines, loaded, rejected in con.execute("SELECT format, lines, loaded, rejected FROM sources").fetchall():
        assert lines == loaded + rejected, fmt
    n_rej = con.execute("SELECT count(*) FROM rejects").fetchone()[0]
    assert n_rej == con.execute("SELECT sum(rejected) FROM sources").fetchone()[0]
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == \
        con.execute("SELECT sum(loaded) FROM sources").fetchone()[0]


def _details(con) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for reason, detail in con.execute("SELECT reason, detail FROM rejects ORDER BY line_no").fetchall():
        out.setdefault(reason, []).append(detail)
    return out


# ----------------------------------------------------------------- chained ids

def test_chained_ids_identify_whole_prefixes():
    """An id stands for its own id and every one before it, salted: equal up to i
    ⇔ equal ids at i; another salt never meets; an id repeated at another place
    (Bailian's per-block hashes) gets another chained id."""
    rng = random.Random(3)
    lists = [[rng.randrange(4) for _ in range(rng.randrange(0, 12))] for _ in range(300)]
    chained = [chain_ids(x, 7) for x in lists]
    seen: dict[int, tuple] = {}
    for x, c in zip(lists, chained):
        assert len(c) == len(x) and all(0 <= v < 2**62 for v in c)
        for i, v in enumerate(c):
            assert seen.setdefault(v, tuple(x[:i + 1])) == tuple(x[:i + 1])
    assert chain_ids([5, 5, 5], 1)[0] != chain_ids([5, 5, 5], 1)[1]
    assert not set(chain_ids([1, 2, 3], 1)) & set(chain_ids([1, 2, 3], 2))
    assert chain_ids([], 1) == []


# ----------------------------------------------------------------- bailian

def test_bailian_fields(con):
    s = api.ingest(con, [str(BAILIAN)])
    assert (s.loaded, s.rejected) == (8, 0)
    assert con.execute("SELECT format FROM sources").fetchone()[0] == "bailian"
    rows = _rows(con)
    r0, r1, r2 = rows[0], rows[1], rows[2]
    assert r0["format"] == "bailian" and r0["ts_us"] == 61_114_000  # seconds, read through their digits
    assert (r0["input_length"], r0["output_length"], r0["model"], r0["tenant"]) == (90, 132, None, "default")
    assert r0["block_lengths"] == [16, 16, 16, 16, 16, 10]  # 16-token blocks, the last one partial
    assert len(r0["block_ids"]) == 6
    # the session is the chat chain's root: 159 → 161 → 164, 160 → 165
    sessions = [r["session"] for r in rows]
    assert sessions[0] == sessions[2] == sessions[5] == "bailian_trace_blksz_16:159"
    assert sessions[1] == sessions[6] == "bailian_trace_blksz_16:160"
    assert len(set(sessions)) == 5
    # re-chained: a shared prefix has the same ids, a repeated raw id at another place does not
    assert r1["block_ids"][:3] == r0["block_ids"][:3] and r1["block_ids"][3] != r0["block_ids"][3]
    assert r2["block_ids"][:5] == r0["block_ids"][:5]
    r4 = rows[4]  # raw [1089, 1091, 1090]: 1091 and 1090 in other places than in chat 159
    assert r4["block_ids"][0] == r0["block_ids"][0] and not set(r4["block_ids"][1:]) & set(r0["block_ids"])
    _reconciles(con)


def _bailian_count(path, block, ttl) -> tuple[int, int]:
    """Independent count: the longest common run of raw hash ids with an earlier
    request within the TTL (stable time order), in tokens, floored to ``block``."""
    recs = [json.loads(x) for x in open(path) if x.strip()]
    order = sorted(range(len(recs)), key=lambda i: _us(recs[i]["timestamp"]))
    prompt = hit = 0
    for pos, i in enumerate(order):
        r = recs[i]
        best = 0
        for j in order[:pos]:
            if _us(r["timestamp"]) - _us(recs[j]["timestamp"]) <= ttl:
                best = max(best, lcp(r["hash_ids"], recs[j]["hash_ids"]))
        n = r["input_length"]
        depth = min(16 * best, n)  # the matched ids' tokens (the last one partial)
        hit += depth // block * block
        prompt += n
    return prompt, hit


def test_bailian_sweep_equals_an_independent_count(con):
    api.ingest(con, [str(BAILIAN)])
    got = _sweep(con, (1, 16, 32))
    for ttl in TTLS:
        for b in (1, 16, 32):
            assert got[("global", _key_ttl(ttl), b)] == _bailian_count(BAILIAN, b, ttl_us(ttl)), (ttl, b)
    assert got[("global", None, 16)][1] > 0


def test_bailian_rejects(con, tmp_path):
    good = json.loads(BAILIAN.read_text().splitlines()[0])
    bad = [
        {**good, "hash_ids": SECRET},                                  # wrong_type
        {k: v for k, v in good.items() if k != "input_length"},        # missing_field
        {**good, "input_length": 80},                                  # bad_length: 6 blocks need > 80
        {**good, "chat_id": SECRET},                                   # wrong_type
        {k: v for k, v in good.items() if k != "timestamp"},           # missing_timestamp
        {**good, "hash_ids": [1, SECRET]},                             # wrong_type
        {**good, "block_size": 0},                                     # wrong_type
    ]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [good, *bad, good]) + "\n")
    s = api.ingest(con, [str(path)], format="bailian")
    assert (s.lines, s.loaded, s.rejected) == (9, 2, 7)
    d = _details(con)
    assert len(d["wrong_type"]) == 4 and d["missing_field"] and d["bad_length"] and d["missing_timestamp"]
    assert any("'hash_ids' is string" in x for x in d["wrong_type"])
    assert any("'chat_id' is string" in x for x in d["wrong_type"])
    assert all(SECRET not in x for v in d.values() for x in v)
    _reconciles(con)


# ----------------------------------------------------------------- ragpulse

def _lengths(folder: Path) -> dict[int, int]:
    out = {}
    for f in sorted(folder.glob("[1-5]_*.jsonl")):
        for line in open(f):
            if line.strip():
                d = json.loads(line)
                out[d[next(k for k in d if k != "token_length")]] = d["token_length"]
    return out


PARTS = ("sys_prompt", "passages_ids", "history", "web_search", "user_input")


def test_ragpulse_fields(con):
    s = api.ingest(con, [str(RAGPULSE)])
    assert (s.lines, s.loaded, s.rejected) == (6, 5, 1) and s.rejected_by_reason == {"blank_line": 1}
    fmts = sorted(f for (f,) in con.execute("SELECT format FROM sources").fetchall())
    assert fmts == ["ragpulse"] + ["ragpulse-lengths"] * 5  # the side files hold no request
    lengths = _lengths(RAGPULSE)
    rows = _rows(con)
    recs = [json.loads(x) for x in open(RAGPULSE / "0_trace.jsonl") if x.strip()]
    for row, rec in zip(rows, recs):
        ids = [i for p in PARTS for i in rec["hash_ids"][p]]  # the documented component order
        assert row["format"] == "ragpulse" and row["ts_us"] == int(rec["timestamp"]) * 1_000_000
        assert row["block_lengths"] == [lengths[i] for i in ids]
        assert row["input_length"] == rec["input_length"] > sum(row["block_lengths"])  # the template's tail
        assert row["output_length"] == rec["output_length"] and row["session"] == rec["session_id"]
    # requests 0 and 4 share sys_prompt, passages and history: the same chained ids up to there
    assert rows[0]["block_ids"][:7] == rows[4]["block_ids"][:7] and rows[0]["block_ids"][7] != rows[4]["block_ids"][7]
    _reconciles(con)


def _ragpulse_count(folder: Path, block: int) -> tuple[int, int]:
    """Independent count (infinite TTL, global): every earlier request's chunk
    sequence prefixes in a set; a request's hit is the tokens of its longest
    chunk prefix seen before, floored to ``block``."""
    lengths = _lengths(folder)
    recs = [json.loads(x) for x in open(folder / "0_trace.jsonl") if x.strip()]
    recs.sort(key=lambda r: int(r["timestamp"]))
    seen: set = set()
    prompt = hit = 0
    for r in recs:
        ids = tuple(i for p in PARTS for i in r["hash_ids"].get(p, []))
        k = max((k for k in range(len(ids) + 1) if k == 0 or ids[:k] in seen), default=0)
        hit += sum(lengths[i] for i in ids[:k]) // block * block
        prompt += r["input_length"]
        seen.update(ids[:k] for k in range(1, len(ids) + 1))
    return prompt, hit


def test_ragpulse_sweep_equals_an_independent_count(con):
    api.ingest(con, [str(RAGPULSE)], format="ragpulse")  # forced: the side files are still side files
    got = _sweep(con, (1, 16, 64), ttls=(math.inf,))
    for b in (1, 16, 64):
        assert got[("global", None, b)] == _ragpulse_count(RAGPULSE, b), b
    assert got[("global", None, 1)][1] > 0


def test_the_real_ragpulse_trace(con, shared_data):
    folder = shared_data / "ragpulse"
    s = api.ingest(con, [str(folder)])
    assert (s.lines, s.loaded, s.rejected) == (7107, 7106, 1)  # one line is blank
    got = _sweep(con, (1, 512), ttls=(math.inf,))
    for b in (1, 512):
        assert got[("global", None, b)] == _ragpulse_count(folder, b), b


def test_ragpulse_rejects(con, tmp_path):
    folder = tmp_path / "rp"
    shutil.copytree(RAGPULSE, folder)
    good = json.loads((RAGPULSE / "0_trace.jsonl").read_text().splitlines()[0])
    hid = good["hash_ids"]
    bad = [
        {**good, "hash_ids": [1, 2]},                                         # wrong_type (array)
        {**good, "hash_ids": {**hid, SECRET: [1]}},                           # wrong_type (a component too many)
        {**good, "hash_ids": {**hid, "user_input": [999_999]}},               # unknown_chunk
        {**good, "input_length": 100},                                        # bad_length
        {**good, "hash_ids": {**hid, "passages_ids": [6124, SECRET]}},        # wrong_type
        {k: v for k, v in good.items() if k != "hash_ids"},                   # no_prompt
        {**good, "timestamp": SECRET},                                        # bad_timestamp
    ]
    (folder / "0_trace.jsonl").write_text("\n".join(json.dumps(x) for x in [good, *bad]) + "\n")
    s = api.ingest(con, [str(folder)])
    assert (s.lines, s.loaded, s.rejected) == (8, 1, 7)
    d = _details(con)
    assert len(d["wrong_type"]) == 3 and d["unknown_chunk"] and d["bad_length"] and d["no_prompt"]
    assert d["bad_timestamp"]
    assert any("hash_ids.user_input[0]" in x and "4_user_input.jsonl" in x for x in d["unknown_chunk"])
    assert all(SECRET not in x for v in d.values() for x in v)
    _reconciles(con)


# ----------------------------------------------------------------- kv-cache-tester

def _kv_requests(paths) -> list[tuple]:
    """(µs, file, order, model, hash_ids, in) of every request, sub-agents' included
    at their absolute times (the sub-agent's t plus theirs), in input order."""
    out: list[tuple] = []

    def walk(entries, base, f):
        for e in entries:
            if e.get("type") == "subagent":
                walk(e["requests"], base + _us(e["t"]), f)
            else:
                out.append((base + _us(e["t"]), f, len(out), e["model"], e["hash_ids"], e["in"]))

    for f, p in enumerate(sorted(paths)):
        walk(json.loads(Path(p).read_text())["requests"], 0, f)
    return out


def _kv_count(paths, ttl: int) -> tuple[int, int]:
    """Independent brute force: in time order (ties in input order), a request
    hits 64 tokens per leading hash id it shares with an earlier request of the
    same file and model at most ``ttl`` µs before; its tokens beyond its ids
    count as prompt tokens only."""
    reqs = sorted(_kv_requests(paths), key=lambda r: (r[0], r[2]))
    prompt = hit = 0
    for i, r in enumerate(reqs):
        best = 0
        for e in reqs[:i]:
            if e[1] == r[1] and e[3] == r[3] and r[0] - e[0] <= ttl:
                best = max(best, lcp(r[4], e[4]))
        hit += 64 * best
        prompt += r[5]
    return prompt, hit


def test_kv_cache_tester_fields(con):
    s = api.ingest(con, [str(KVT)])
    assert (s.lines, s.loaded, s.rejected) == (12, 12, 0)
    assert {f for (f,) in con.execute("SELECT format FROM sources").fetchall()} == {"kv-cache-tester"}
    rows = _rows(con)
    doc = json.loads((KVT / "trace_0001.json").read_text())
    first, sub = doc["requests"][0], doc["requests"][3]
    r0 = rows[0]
    assert (r0["ts_us"], r0["input_length"], r0["output_length"], r0["model"]) == (0, first["in"], first["out"],
                                                                                  first["model"])
    assert r0["session"] == "trace_0001" and r0["block_lengths"] == [64] * len(first["hash_ids"])
    # a sub-agent's requests: numbered where its entry stands, timed from its own t
    r3 = rows[3]
    assert r3["line_no"] == 4 and r3["ts_us"] == _us(sub["t"]) + _us(sub["requests"][0]["t"])
    assert r3["model"] == sub["requests"][0]["model"] and r3["session"] == "trace_0001"
    # one file's ids: the sub-agent's request on the parent's model repeats the parent's prefix
    r5 = rows[5]
    assert r5["block_ids"] == rows[2]["block_ids"]
    # ids local to a file: the same numbers in another file never meet
    other = [r for r in rows if r["session"] == "trace_0002"]
    assert len(other) == 3 and not {i for r in other for i in r["block_ids"]} & {i for r in rows[:9]
                                                                                for i in r["block_ids"]}
    _reconciles(con)


def test_kv_cache_tester_fixture_sweep_is_the_brute_force_count(tmp_path):
    """The command of the contract: `--format kv-cache-tester --stream session
    --block 64`, every TTL, against the independent count."""
    ttls = "0,1,5,14.25,60,3600,inf"
    res = CliRunner().invoke(main, ["sweep", str(KVT), "--db", str(tmp_path / "k.duckdb"), "--format",
                                    "kv-cache-tester", "--stream", "session", "--block", "64", "--min-prefix", "0",
                                    "--ttl", ttls, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 7
    paths = sorted(KVT.glob("*.json"))
    for r in rows:
        ttl = math.inf if r["ttl_s"] is None else r["ttl_s"]
        assert (r["prompt_tokens"], r["hit_tokens"]) == _kv_count(paths, ttl_us(ttl)), r["ttl_s"]
    assert rows[-1]["hit_tokens"] > 0


def _random_kv_trace(rng: random.Random, name: str) -> dict:
    """A conversation of the kv-cache-tester shape: small id numbers (they repeat
    across files), growing prompts with s/n pairs, now and then an edit of an
    earlier block or a compaction, sub-agents on another model, tails of 0–63
    tokens, whole-second times so gaps fall on the TTLs."""
    models = ("claude-opus-4-5-20251101", "claude-haiku-4-5-20251001")
    nxt = [1]

    def new(k):
        ids = list(range(nxt[0], nxt[0] + k))
        nxt[0] += k
        return ids

    def conversation(n, model, t0=0):
        out, ids, t = [], new(rng.randrange(0, 5)), t0
        for _ in range(n):
            r = rng.random()
            if r < 0.15 and ids:
                ids = ids[:rng.randrange(len(ids))] + new(rng.randrange(1, 3))  # an edit / compaction
            elif r < 0.25:
                ids = new(rng.randrange(0, 4))                                   # a fresh prompt
            else:
                ids = ids + new(rng.randrange(0, 4))
            t += rng.choice((0, 1, 5, 14.25, 60, 600))
            tail = rng.randrange(64)
            for kind in (("s", "n") if rng.random() < 0.5 else ("n",)):
                out.append({"t": t, "type": kind, "model": model, "in": 64 * len(ids) + tail,
                            "out": rng.randrange(1, 500), "hash_ids": list(ids), "input_types": [],
                            "output_types": ["text"], "stop": ""})
                t += rng.choice((0, 1, 5))
        return out

    reqs = conversation(rng.randrange(1, 12), models[0])
    for _ in range(rng.randrange(0, 3)):
        at = rng.randrange(len(reqs) + 1)
        start = reqs[at - 1]["t"] if at else 0
        reqs.insert(at, {"t": start, "type": "subagent", "agent_id": f"agent_{at}", "models": [models[1]],
                         "requests": conversation(rng.randrange(1, 5), rng.choice(models))})
    return {"id": name, "models": list(models), "block_size": 64, "hash_id_scope": "local", "tool_tokens": 0,
            "system_tokens": 0, "requests": reqs}


@pytest.mark.parametrize("seed", range(4))
def test_kv_cache_tester_random_traces_are_the_brute_force_count(tmp_path, seed):
    rng = random.Random(seed)
    folder = tmp_path / "traces"
    folder.mkdir()
    for i in range(rng.randrange(1, 5)):
        (folder / f"trace_{i:04d}.json").write_text(json.dumps(_random_kv_trace(rng, f"trace_{i:04d}")))
    con = db.connect(None)
    s = api.ingest(con, [str(folder)], format="kv-cache-tester")
    assert s.rejected == 0
    got = _sweep(con, (64,), streams=("session",))
    paths = sorted(folder.glob("*.json"))
    for ttl in TTLS:
        assert got[("session", _key_ttl(ttl), 64)] == _kv_count(paths, ttl_us(ttl)), ttl


def test_kv_cache_tester_rejects(con, tmp_path):
    doc = json.loads((KVT / "trace_0002.json").read_text())
    good = doc["requests"][0]
    doc["requests"] = [
        good,
        SECRET,                                                          # wrong_type: not an object
        {k: v for k, v in good.items() if k != "hash_ids"},              # no_prompt
        {**good, "in": 64},                                              # bad_length: 8 whole blocks need 512
        {**good, "t": SECRET},                                           # bad_timestamp
        {**good, "hash_ids": [1, 2.5]},                                  # wrong_type
        {"t": 3.0, "type": "subagent", "requests": SECRET},              # wrong_type: a sub-agent without requests
        {"t": 3.0, "type": "subagent", "requests": [good, {**good, "in": -1}]},  # 1 loaded, 1 wrong_type
        {k: v for k, v in good.items() if k != "in"},                    # missing_field
    ]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    s = api.ingest(con, [str(path)])
    assert con.execute("SELECT format FROM sources").fetchone()[0] == "kv-cache-tester"
    assert (s.lines, s.loaded, s.rejected) == (10, 2, 8)
    d = _details(con)
    assert len(d["wrong_type"]) == 4 and d["no_prompt"] and d["bad_length"] and d["bad_timestamp"]
    assert d["missing_field"]
    assert any("requests[1] is string" in x for x in d["wrong_type"])
    assert all(SECRET not in x for v in d.values() for x in v)
    # a document that is no trace is one reject for the file
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "not.json").write_text(json.dumps({"requests": SECRET, "block_size": 64}))
    s2 = api.ingest(con, [str(tmp_path / "x" / "not.json")], format="kv-cache-tester")
    assert (s2.lines, s2.rejected) == (1, 1)
    _reconciles(con)


def test_a_trace_line_cannot_be_forced_as_a_kv_cache_tester_document(con, tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_text(json.dumps({"requests": []}) + "\n")
    s = api.ingest(con, [str(path)], format="kv-cache-tester")
    assert (s.loaded, s.rejected) == (0, 1)
    assert "whole JSON document" in _details(con)["wrong_type"][0]


def test_detection_tells_the_trace_formats_apart(con, tmp_path):
    moon = tmp_path / "m.jsonl"
    moon.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}) + "\n")
    api.ingest(con, [str(moon), str(BAILIAN), str(RAGPULSE), str(KVT)])
    got = dict(con.execute("SELECT format, count(*) FROM requests GROUP BY format").fetchall())
    assert got == {"mooncake": 1, "bailian": 8, "ragpulse": 5, "kv-cache-tester": 12}
    # a Mooncake record's ids are stored as they are (its 512-token rule: no lengths)
    assert con.execute("SELECT block_ids, block_lengths FROM requests WHERE format = 'mooncake'").fetchone() == \
        ([1, 2], None)


def test_long_block_lists_are_read_within_a_small_memory_cap(tmp_path, monkeypatch):
    """Thousands of ids a request (kv-cache-tester's prompts reach 13,000): a scan
    of the lists holds 2,048 rows' items at once, beyond a small cap; the replay
    raises the cap while it reads them and puts it back. Without the raise, the
    same replay runs out of memory (the test would fail)."""
    from replay.core import prompts

    reqs = [{"t": i, "type": "n", "model": "m", "in": 64 * 1500, "out": 1,
             "hash_ids": list(range(i % 7, i % 7 + 1500))} for i in range(4200)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"id": "long", "block_size": 64, "requests": reqs}))
    con = db.connect(tmp_path / "l.duckdb")
    api.ingest(con, [str(path)])
    con.execute("SET memory_limit = '40MB'")
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    got = sum(p.n_tokens for p in prompts.iter_prompts(con))
    assert got == 4200 * 64 * 1500
    after = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert abs(prompts._bytes(after) - prompts._bytes(limit)) < 2**20  # put back (to its shown precision)
    monkeypatch.setattr(prompts.MemoryRoom, "run", lambda self, query: query())
    with pytest.raises(Exception, match="(?i)memory"):
        sum(p.n_tokens for p in prompts.iter_prompts(con))
    con.close()
