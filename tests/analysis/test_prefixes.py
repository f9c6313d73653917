"""Top shared prefixes (`replay prefixes`) against a brute-force count straight from the contract."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.prefixes import part_labels, prefix_hash, prefixes_section
from replay.cli.main import main
from support import oracle
from replay.core.prompts import iter_prompts
from replay.times import INF_US
from replay.prepare import prepare
from replay.store import db
from replay.text.segids import MARKER_SEG

from support.gen import US, random_requests

EPOCH_US = 1_700_000_000 * US
CANARY = "PREFIX-CANARY-SECRET-TEXT"
KEYS = {"rank", "n_tokens", "hit_tokens", "requests", "sessions", "streams", "parts", "hash"}


# --------------------------------------------------------------------------- the brute force

def brute_prefixes(reqs, ids, mode: str, ttl: int, block: int, min_prefix: int) -> list[dict]:
    """The contract written out: hits from the O(n²) oracle of L_τ, every hit
    prefix's prefixes enumerated per cache, the candidates those that end a
    hit prefix or continue with two different tokens, then each counted over
    every request of its model. ``ids[i]``: the request id of ``reqs[i]``."""
    L = oracle.ceiling(reqs, mode, ttl)
    h = [oracle.block_hit(x, block, min_prefix) for x in L]
    pos = {i: k for k, i in enumerate(oracle.time_order(reqs))}
    by_cache = defaultdict(list)
    for i, r in enumerate(reqs):
        if h[i] > 0:
            by_cache[oracle.cache_of(r, mode)].append(tuple(r.tokens[:h[i]]))
    cands = set()
    for (_, model), hs in by_cache.items():
        nexts, ends = defaultdict(set), set(hs)
        for H in hs:
            for d in range(1, len(H) + 1):
                nexts[H[:d]].update(H[d:d + 1])
        cands |= {(model, Q) for Q, nx in nexts.items() if Q in ends or len(nx) >= 2}
    out = []
    for model, Q in cands:
        users = [i for i, r in enumerate(reqs)
                 if r.model == model and h[i] >= len(Q) and tuple(r.tokens[:len(Q)]) == Q]
        first = min(users, key=pos.__getitem__)
        out.append({"model": model, "n_tokens": len(Q), "hit_tokens": len(users) * len(Q), "requests": len(users),
                    "sessions": len({reqs[i].session for i in users} - {None}),
                    "streams": len({oracle.cache_of(reqs[i], mode) for i in users}),
                    "hash": prefix_hash(model, Q), "first_request": ids[first], "_first": pos[first]})
    out.sort(key=lambda x: (-x["hit_tokens"], -x["requests"], -x["n_tokens"], x["_first"]))
    for k, x in enumerate(out, 1):
        x["rank"] = k
        del x["_first"]
    return out


def _same(got: list[dict], want: list[dict]) -> None:
    assert [{k: g[k] for k in want[0]} for g in got] == want if want else got == []


def _write_tokens_log(path, reqs):
    with open(path, "w") as f:
        for r in reqs:
            rec = {"ts": EPOCH_US + r.ts, "tenant": r.tenant, "tokens": list(r.tokens)}
            for k, v in (("prompt_cache_key", r.key), ("session", r.session), ("model", r.model)):
                if v is not None:
                    rec[k] = v
            f.write(json.dumps(rec) + "\n")
    return path


def _db_of(tmp_path, reqs):
    con = db.connect(None)
    api.ingest(con, [str(_write_tokens_log(tmp_path / "log.jsonl", reqs))])
    ids = [r[0] for r in con.execute("SELECT request_id FROM requests ORDER BY request_id").fetchall()]
    assert len(ids) == len(reqs)
    prepare(con, modes=oracle_modes(), horizon_us=INF_US)  # one replay, exact for every TTL
    return con, ids


def oracle_modes():
    return ("tenant", "key", "session", "global")


# --------------------------------------------------------------------------- rankings = the brute force

@pytest.mark.parametrize("seed", range(4))
def test_the_ranking_equals_the_brute_force_on_generated_logs(tmp_path, seed):
    """Small alphabets (prefixes collide often), gaps exactly on, a µs under and
    over the TTLs, ties in time, two models in half the logs; every stream mode
    and TTLs 0 s, 2 s, 10 s and ∞, each with blocks 1, 4 or 16 (every
    combination over the first three seeds) and sometimes a minimum prefix."""
    reqs = random_requests(seed, n=36, alphabet=3, max_len=48, gaps=(0, 0, 1, 2, 5, 10, 30),
                           jitter_us=(0, 0, -1, 1), models=("a", "b") if seed % 2 else (None,))
    con, ids = _db_of(tmp_path, reqs)
    found = 0
    for mi, mode in enumerate(oracle_modes()):
        for ti, ttl in enumerate((0, 2, 10, float("inf"))):
            block = (1, 4, 16)[(mi + ti + seed) % 3]
            m = 6 if (mi + ti) % 4 == seed else 0
            got = api.top_prefixes(con, ttl=ttl, block=block, min_prefix=m, stream=mode, top=None)
            want = brute_prefixes(reqs, ids, mode, INF_US if ttl == float("inf") else int(ttl * US), block, m)
            _same(got, want)
            found += len(want)
    assert found > 20, found  # the logs do share prefixes
    assert api.top_prefixes(con, ttl=2, block=1, stream="key", top=3) == \
        api.top_prefixes(con, ttl=2, block=1, stream="key", top=None)[:3]


def test_ranking_by_requests(tmp_path):
    reqs = random_requests(7, n=30, alphabet=3, max_len=30)
    con, ids = _db_of(tmp_path, reqs)
    got = api.top_prefixes(con, ttl="inf", block=1, stream="tenant", top=None, by="requests")
    want = brute_prefixes(reqs, ids, "tenant", INF_US, 1, 0)
    want.sort(key=lambda x: (-x["requests"], -x["hit_tokens"], -x["n_tokens"]))
    assert [(g["requests"], g["hit_tokens"], g["hash"]) for g in got] == [
        (w["requests"], w["hit_tokens"], w["hash"]) for w in want]
    assert [g["rank"] for g in got] == list(range(1, len(got) + 1))
    with pytest.raises(ValueError):
        api.top_prefixes(con, by="tokens")


# --------------------------------------------------------------------------- planted prefixes

def _planted():
    """Tenant acme: 8 sessions × 3 turns opening with the system prompt S (257
    tokens), 5 sessions × 3 turns opening with the tool list T (91 tokens) then
    a system prompt of their own; tenant globex: 3 sessions × 3 turns with S.
    Each turn adds 10 tokens of its own to its session's previous prompt."""
    S = list(range(1000, 1257))
    T = list(range(5000, 5091))
    reqs, t, fresh = [], 0, iter(range(100_000, 10**6))
    sessions = ([("acme", f"b{i}", S) for i in range(8)] + [("globex", f"g{i}", S) for i in range(3)]
                + [("acme", f"a{i}", T + [next(fresh) for _ in range(40)]) for i in range(5)])
    prompts = {s: list(base) for _, s, base in sessions}
    for turn in range(3):
        for tenant, s, _ in sessions:
            prompts[s] += [next(fresh) for _ in range(10)]
            t += US
            reqs.append(oracle.OracleRequest(ts=t, tokens=list(prompts[s]), tenant=tenant, session=s))
    return reqs, S, T


def test_a_planted_system_prompt_and_tool_list_are_found_with_their_exact_sizes(tmp_path):
    reqs, S, T = _planted()
    con, ids = _db_of(tmp_path, reqs)
    got = api.top_prefixes(con, ttl="inf", block=1, stream="tenant", top=None)
    # every request of S's sessions but the first of each tenant reuses S; every one of T's but its first
    assert got[0]["n_tokens"] == len(S) == 257
    assert (got[0]["requests"], got[0]["sessions"], got[0]["streams"]) == (8 * 3 - 1 + 3 * 3 - 1, 11, 2)
    assert got[0]["hit_tokens"] == 31 * 257 and got[0]["hash"] == prefix_hash(None, S)
    assert got[1]["n_tokens"] == len(T) == 91
    assert (got[1]["requests"], got[1]["sessions"], got[1]["streams"]) == (5 * 3 - 1, 5, 1)
    assert got[1]["hash"] == prefix_hash(None, T) and got[0]["parts"] == got[1]["parts"] == ["tokens"]
    _same(got, brute_prefixes(reqs, ids, "tenant", INF_US, 1, 0))
    # one cache for everyone: S once more (globex's first request now hits acme's S)
    glob = api.top_prefixes(con, ttl="inf", block=1, stream="global", top=2)
    assert [(g["n_tokens"], g["requests"], g["streams"]) for g in glob] == [(257, 32, 1), (91, 14, 1)]
    # blocks of 16: the hits end at whole blocks, so S is seen as its first 256 tokens
    b16 = api.top_prefixes(con, ttl="inf", block=16, stream="tenant", top=1)
    assert (b16[0]["n_tokens"], b16[0]["requests"]) == (256, 31)


# --------------------------------------------------------------------------- chat logs: parts, text

def _chat_log(path, canary: str = CANARY):
    """An anthropic log: two tools and a system prompt shared by every session
    of tenant acme, a first user message of its own per session, each next turn
    the previous conversation plus the reply and a new message (the canary in
    every user message)."""
    tools = [{"name": "read_file", "description": "Read a file from the workspace.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
             {"name": "run", "description": "Run a shell command and return its output.",
              "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
    system = "You are a careful coding agent. Answer briefly and cite the files you read."
    recs, t = [], 0
    for turn in range(3):
        for s in range(4):
            msgs = [{"role": "user", "content": f"Session {s} task: fix bug number {100 + s} {canary}"}]
            for k in range(turn):
                msgs += [{"role": "assistant", "content": f"Step {k} of session {s} done."},
                         {"role": "user", "content": f"Continue with step {k + 1} {canary}"}]
            t += 7
            recs.append({"timestamp": 1_700_000_000 + t, "tenant": "acme" if s < 3 else "other",
                         "session": f"s{s}", "request": {"model": "m1", "max_tokens": 100, "tools": tools,
                                                         "system": system, "messages": msgs}})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_chat_logs_equal_the_brute_force_and_name_their_parts(tmp_path):
    con = db.connect(None)
    api.ingest(con, [str(_chat_log(tmp_path / "chat.jsonl"))])
    prepare(con, modes=("tenant", "session"), horizon_us=INF_US)
    ps = list(iter_prompts(con))
    assert any(p.shared for p in ps)  # the next turns start from their previous prompt
    reqs = [oracle.OracleRequest(ts=p.ts, tokens=p.symbols.tolist(), tenant=p.tenant, key=p.key,
                                 session=p.session, model=p.model) for p in ps]
    ids = [p.request_id for p in ps]
    for mode in ("tenant", "session"):
        for block in (1, 4, 16):
            got = api.top_prefixes(con, ttl="inf", block=block, stream=mode, top=None)
            _same(got, brute_prefixes(reqs, ids, mode, INF_US, block, 0))
    top = api.top_prefixes(con, ttl="inf", block=1, stream="tenant", top=1)[0]
    # acme's sessions share the tools, the system prompt and the start of the first user message; so
    # do the next turns of tenant other's one session (their hits extend it): one prefix, two caches
    assert top["parts"] == ["tools", "system", "message 0 (partial)"] and top["model"] == "m1"
    assert (top["requests"], top["sessions"], top["streams"]) == (3 * 3 - 1 + 2, 4, 2)
    assert CANARY not in json.dumps(api.top_prefixes(con, ttl="inf", block=1, top=None))


def test_part_labels():
    bos, gen = MARKER_SEG["bos"], MARKER_SEG["assistant"]
    segs, parts = [bos, 11, 12, 13, 14, 15, 16, 17, gen], [0, 0, 1, 2, 2, 3, 4, 5, 6]
    sizes = [1, 10, 5, 2, 3, 4, 4, 4, 1]  # ends: 1 11 16 18 21 25 29 33 34
    assert part_labels(segs, parts, sizes, 1) == ["bos"]
    assert part_labels(segs, parts, sizes, 5) == ["tools (partial)"]
    assert part_labels(segs, parts, sizes, 11) == ["tools"]
    assert part_labels(segs, parts, sizes, 18) == ["tools", "system", "message 0 (partial)"]
    assert part_labels(segs, parts, sizes, 21) == ["tools", "system", "message 0"]
    assert part_labels(segs, parts, sizes, 30) == ["tools", "system", "messages 0-2", "message 3 (partial)"]
    assert part_labels(segs, parts, sizes, 34) == ["tools", "system", "messages 0-3", "generation prompt"]
    assert part_labels([bos, 20, 21], [0, 2, 2], [1, 3, 3], 5) == ["message 0 (partial)"]  # no tools, no system


def test_no_prompt_text_is_printed_without_show_text(tmp_path):
    log = _chat_log(tmp_path / "chat.jsonl")
    dbp = str(tmp_path / "c.duckdb")
    for extra in ([], ["--json"], ["--by", "requests", "--block", "1"]):
        res = CliRunner().invoke(main, ["prefixes", str(log), "--db", dbp, "--ttl", "inf", "--top", "50"] + extra)
        assert res.exit_code == 0, res.output
        assert CANARY not in res.output and "careful coding agent" not in res.output
    res = CliRunner().invoke(main, ["prefixes", "--db", dbp, "--ttl", "inf", "--block", "1", "--top", "50",
                                    "--json", "--show-text"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert any(CANARY in r["text"] for r in rows)  # the text is there when asked for
    assert rows[0]["text"].count("careful coding agent") == 1
    table = CliRunner().invoke(main, ["prefixes", "--db", dbp, "--ttl", "inf", "--block", "1", "--show-text"])
    assert table.exit_code == 0 and "read_file" in table.output


# --------------------------------------------------------------------------- the command

def test_cli_json_is_exactly_an_array_with_the_keys(tmp_path):
    reqs, S, T = _planted()
    log = _write_tokens_log(tmp_path / "log.jsonl", reqs)
    res = CliRunner().invoke(main, ["prefixes", str(log), "--db", str(tmp_path / "p.duckdb"), "--ttl", "inf",
                                    "--block", "1", "--top", "5", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)  # stdout is the array and nothing else
    assert isinstance(rows, list) and len(rows) == 5
    assert all(KEYS <= set(r) and "text" not in r for r in rows)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    assert (rows[0]["n_tokens"], rows[1]["n_tokens"]) == (257, 91)
    assert all(len(r["hash"]) == 12 and int(r["hash"], 16) >= 0 for r in rows)
    text = CliRunner().invoke(main, ["prefixes", "--db", str(tmp_path / "p.duckdb"), "--ttl", "inf", "--block", "1",
                                     "--top", "2"])
    assert text.exit_code == 0 and "257" in text.output and "tokens" in text.output


def test_an_empty_database_exits_1_and_no_shared_prefix_is_an_empty_answer(tmp_path):
    res = CliRunner().invoke(main, ["prefixes", "--db", str(tmp_path / "empty.duckdb")])
    assert res.exit_code == 1 and "holds no requests" in res.output and "Traceback" not in res.output
    lone = oracle.OracleRequest(ts=0, tokens=[1, 2, 3], tenant="t")
    log = _write_tokens_log(tmp_path / "one.jsonl", [lone])
    dbp = str(tmp_path / "one.duckdb")
    res = CliRunner().invoke(main, ["prefixes", str(log), "--db", dbp, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == []
    res = CliRunner().invoke(main, ["prefixes", "--db", dbp])
    assert res.exit_code == 0 and "no prefix is shared" in res.output
    bad = CliRunner().invoke(main, ["prefixes", "--db", dbp, "--ttl", "soon"])
    assert bad.exit_code == 2


def test_block_traces_count_their_blocks(tmp_path):
    """Mooncake: 512-token blocks; a hit ends on whole blocks (or the partial last one)."""
    recs = [{"timestamp": 1000 * i, "input_length": n, "hash_ids": ids} for i, (n, ids) in enumerate([
        (1536, [0, 1, 2]), (1536, [0, 1, 3]), (2048, [0, 1, 2, 4]), (1100, [0, 1, 5]), (700, [9, 8]),
        (1100, [0, 1, 5])])]
    log = tmp_path / "mc.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    con = db.connect(None)
    api.ingest(con, [str(log)], format="mooncake")
    got = api.top_prefixes(con, ttl="inf", block=16, stream="global", top=None)
    # [0,1] (1024 tokens) reused by the 2nd, 3rd, 4th and 6th request, [0,1,2] (1536) by the 3rd; the
    # 6th repeats the 4th (1100 tokens): its hit ends inside the last, partial block, at 1088
    assert [(g["n_tokens"], g["requests"], g["parts"]) for g in got] == [
        (1024, 4, ["blocks"]), (1536, 1, ["blocks"]), (1088, 1, ["blocks"])]
    assert api.top_prefixes(con, ttl="inf", block=16, stream="global", show_text=True)[0]["text"] is None


def test_the_report_section_has_the_table_without_text_or_hash(tmp_path):
    con = db.connect(None)
    api.ingest(con, [str(_chat_log(tmp_path / "chat.jsonl"))])
    md = prefixes_section(con, tmp_path, api.Grid(ttls=(300.0, float("inf")), blocks=(1, 16)))
    assert md.startswith("## Top shared prefixes") and "| rank | tokens |" in md
    assert CANARY not in md and "careful coding agent" not in md
    top = api.top_prefixes(con, ttl=300, block=16, top=1, with_hash=False)[0]
    assert "hash" not in top and f"| 1 | {top['n_tokens']:,} | {top['hit_tokens']:,} |" in md
    assert np.all(np.diff([int(line.split("|")[3].replace(",", "")) for line in md.splitlines()
                           if line.startswith("| ") and line[2].isdigit()]) <= 0)
