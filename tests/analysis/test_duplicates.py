"""Exact duplicates (``replay.analysis.duplicates``) against a brute-force
reading of the contract: same cache (stream key and model), whole prompt
equal, the most recent such earlier request at most τ before (a gap of exactly
τ counts), processing order = time, then input order."""

import importlib.util
import json
import math
import random

import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis import duplicates as D
from replay.cli.main import main
from replay.core.streams import stream_key

from support.gen import TTLS_US, US, random_requests
from support.logs import write_tokens_log as _write_tokens_log

MODES = ("tenant", "key", "session", "global")


def _with_repeats(seed, n=80):
    """Random requests where a third repeat an earlier prompt exactly, and some
    differ from one by a single token (near misses)."""
    rng = random.Random(seed)
    reqs = random_requests(seed, n=n, alphabet=4, max_len=30, models=(None, "m1", "m2"))
    for i, r in enumerate(reqs):
        if i and rng.random() < 0.35:
            r.tokens = list(rng.choice(reqs[:i]).tokens)
        elif i and rng.random() < 0.1:
            t = list(rng.choice(reqs[:i]).tokens) or [0]
            t[rng.randrange(len(t))] += 1
            r.tokens = t
    return reqs


def _oracle(reqs, mode, ttl_us):
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].ts, i))
    dup = tokens = 0
    for pos, i in enumerate(order):
        r = reqs[i]
        me = (stream_key(mode, r.tenant, r.key, r.session), r.model, tuple(r.tokens))
        for j in reversed(order[:pos]):
            q = reqs[j]
            if (stream_key(mode, q.tenant, q.key, q.session), q.model, tuple(q.tokens)) == me:
                if r.ts - q.ts <= ttl_us:
                    dup += 1
                    tokens += len(r.tokens)
                break
    return dup, tokens


def _db(tmp_path, reqs, unit="us"):
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs, unit)
    con = api.open_db(tmp_path / "d.duckdb")
    api.ingest(con, [str(log)])
    return con


@pytest.mark.parametrize("seed", range(5))
def test_exact_duplicates_equal_the_contract(tmp_path, seed):
    reqs = _with_repeats(seed)
    con = _db(tmp_path, reqs)
    ttls = [t / US if t < 2**62 else math.inf for t in TTLS_US]
    df = D.exact_duplicates(con, ttls=ttls, streams=MODES, normalized=False)
    assert len(df) == len(MODES) * len(ttls)
    for r in df.iter_rows(named=True):
        t = math.inf if r["ttl_s"] is None else r["ttl_s"]
        want = _oracle(reqs, r["stream"], 2**63 - 1 if t == math.inf else round(t * US))
        assert (r["duplicate_requests"], r["duplicate_prompt_tokens"]) == want, r
        assert r["requests"] == len(reqs)
        assert r["duplicate_share"] == pytest.approx(want[0] / len(reqs))
    assert df["duplicate_requests"].max() > 0


def test_millisecond_boundaries_near_misses_and_empty_prompts(tmp_path):
    """Identical prompts exactly 60 s apart (ms timestamps) are duplicates at
    60 s, not at 59.999 s; one token different never; empty prompts equal."""
    from support.oracle import OracleRequest

    def req(ts_us, tokens, session="s"):
        return OracleRequest(ts=ts_us, tokens=tokens, tenant="a", key=None, session=session, model=None, output=[])

    reqs = [req(0, [1, 2, 3]), req(60_000_000, [1, 2, 3]), req(120_001_000, [1, 2, 3]),
            req(120_002_000, [1, 2, 4]), req(130_000_000, []), req(130_000_000, [])]
    con = _db(tmp_path, reqs, unit="ms")
    df = D.exact_duplicates(con, ttls=(59.999, 60.0, 60.001, math.inf), streams=("session",), normalized=False)
    got = {r["ttl_s"]: r["duplicate_requests"] for r in df.iter_rows(named=True)}
    # 59.999: only the two empty prompts (same ms); 60: + the one at exactly 60 s; 60.001: + 60.001 s later
    assert got == {59.999: 1, 60.0: 2, 60.001: 3, None: 3}


def _chat_log(path, times):
    with open(path, "w") as f:
        for i, clock in enumerate(times):
            body = {"model": "gpt-4.1", "messages": [
                {"role": "system", "content": f"You are helpful. Current time: 2026-11-16T10:{clock}Z"},
                {"role": "user", "content": "What is a prefix cache?"}]}
            f.write(json.dumps({"timestamp": 1794813649 + 60 * i, "tenant": "t", "request": body}) + "\n")


def test_normalized_rates_side_by_side_and_the_cli(tmp_path):
    """Prompts that differ only in a time of day are not duplicates as sent, and
    are once the timestamps are bucketed (whatif's normalizers)."""
    log = tmp_path / "chat.jsonl"
    _chat_log(log, ["00:01", "00:30", "01:00"])
    res = CliRunner().invoke(main, ["duplicates", str(log), "--db", str(tmp_path / "c.duckdb"),
                                    "--ttl", "10m,inf", "--stream", "tenant,global", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"exact", "near", "model"}
    rows = out["exact"]
    assert {(r["stream"], r["ttl_s"]) for r in rows} == {("tenant", 600.0), ("tenant", None),
                                                          ("global", 600.0), ("global", None)}
    for r in rows:
        assert set(D.SCHEMA) <= set(r)
        assert r["requests"] == 3 and r["duplicate_requests"] == 0
        assert r["normalized_duplicate_requests"] == 2 and r["normalized_duplicate_share"] == pytest.approx(2 / 3)
    assert "prefix cache" not in res.output and "Current time" not in res.output


def test_the_report_section(tmp_path, monkeypatch):
    log = tmp_path / "chat.jsonl"
    _chat_log(log, ["00:01", "00:30", "01:00"])
    con = api.open_db(tmp_path / "c.duckdb")
    api.ingest(con, [str(log)])
    text = D.duplicates_section(con, ttls=(math.inf,), streams=("tenant",))
    assert "| tenant | inf | 3 | 0 | 0.0 % | 0 | 2 | 66.7 % |" in text
    assert "What is a prefix cache" not in text and "Current time" not in text
    monkeypatch.setattr(D, "REPORT_NORMALIZED_MAX", 2)
    text = D.duplicates_section(con, ttls=(math.inf,), streams=("tenant",))
    assert "| tenant | inf | 3 | 0 | 0.0 % | 0 | — | — |" in text and "above 2 requests" in text
    near = text.split("### Near duplicates")[1]
    if importlib.util.find_spec("wordllama"):
        assert "**Warning —" in near and "| tenant | inf | 66.7 % | 66.7 % |" in near
    else:
        assert "semantic" in near and "%" not in near
    monkeypatch.setattr(D, "REPORT_NEAR_MAX", 2)
    near = D.duplicates_section(con, ttls=(math.inf,), streams=("tenant",)).split("### Near duplicates")[1]
    assert "above 2 requests" in near and "%" not in near
