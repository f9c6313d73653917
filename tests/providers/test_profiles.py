"""Every profile against a brute-force reading of its own rules on generated logs."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from support import oracle
from replay.core.grid import Grid
from replay.core.sweep import sweep
from replay.times import ttl_us
from replay.prepare import prepare
from replay.providers.catalog import get_profile, list_profiles, profile_for_model
from replay.providers.profiles import profile_sweep
from replay.providers.request_hits import request_hits
from replay.providers.simulators import AnthropicRequest, anthropic_layout, openai_round, simulate_anthropic
from replay.text.render import render_request

from support.gen import US, random_requests
from support.logs import make_db
from support.kernels import mlx_cache_hits as mlx_oracle

MODES4 = ("tenant", "key", "session", "global")
TTLS = (0, 2, 5, 30, math.inf)


# ----------------------------------------------------------------------------- a DB holding generated logs

def brute_walk_hit(reqs, mode, ttl, with_output, block, min_prefix, cap_last):
    L = oracle.ceiling(reqs, mode, ttl_us(ttl), with_output=with_output)
    out = []
    for r, x in zip(reqs, L):
        h = (x // block) * block
        if cap_last:
            h = min(h, (max(len(r.tokens) - 1, 0) // block) * block)
        out.append(0 if h < min_prefix else h)
    return out


def _by_key(df, mode, ttl):
    sub = df.filter((df["stream_mode"] == mode) & (df["ttl"] == float(ttl)))
    return dict(zip(sub["request_id"].to_list(), sub["hit"].to_list()))


# ----------------------------------------------------------------------------- registry

def test_registry_lists_the_required_profiles_with_sources():
    names = {p.name for p in list_profiles()}
    for n in ("ideal", "vllm", "sglang", "mooncake", "mlx-lm", "deepseek", "anthropic-sonnet-4-5",
              "anthropic-opus-4-5", "anthropic-haiku-4-5", "openai-gpt-5", "openai-gpt-4.1"):
        assert n in names
    for p in list_profiles():
        assert p.sources and p.summary
    assert get_profile("anthropic-claude-sonnet-4-5-20250929").name == "anthropic-sonnet-4-5"
    assert get_profile("mlx-lm:cache_size=20").params["cache_size"] == 20
    assert get_profile("openai-o3").kind == "openai"
    assert profile_for_model("deepseek-chat") == "deepseek"
    assert profile_for_model("claude-haiku-4-5") == "anthropic-haiku-4-5"
    with pytest.raises(ValueError):
        get_profile("nope")
    with pytest.raises(ValueError):
        get_profile("mlx-lm:bogus=1")


# ----------------------------------------------------------------------------- walk profiles

@pytest.mark.parametrize("seed", range(8))
def test_ideal_profile_equals_the_sweep(seed):
    reqs = random_requests(seed, n=6 + 3 * seed, models=(None, "m") if seed % 2 else (None,))
    con = make_db(reqs)
    grid = Grid(ttls=TTLS, blocks=(1, 2, 3), min_prefixes=(0, 4), streams=MODES4)
    got = profile_sweep(con, ["ideal"], grid, store=False)
    prepare(con, modes=MODES4)
    want = sweep(con, grid, store=False)
    cols = ["stream", "ttl_s", "block", "min_prefix", "requests", "prompt_tokens", "hit_tokens", "requests_hit"]
    assert got.select(cols).sort(cols[:4]).to_dicts() == want.select(cols).sort(cols[:4]).to_dicts()


@pytest.mark.parametrize("name", ["vllm", "sglang", "mooncake", "deepseek"])
@pytest.mark.parametrize("seed", range(6))
def test_walk_profiles_equal_brute_force(name, seed):
    reqs = random_requests(100 + seed, n=8 + 4 * seed, alphabet=3, max_len=60, jitter_us=(0, -1, 1),
                           models=(None, "m") if seed % 2 else (None,))
    # shrink the fixed block so small generated prompts exercise the rounding
    prof = get_profile(name)
    prof = replace(prof, block={16: 2, 1: 1, 512: 5, 64: 3}[prof.block],
                   min_prefix=3 if prof.min_prefix else 0)
    con = make_db(reqs)
    grid = Grid(ttls=TTLS, blocks=(1,), min_prefixes=(0,), streams=MODES4)
    df = request_hits(con, prof, grid)
    for mode in MODES4:
        for ttl in TTLS:
            got = _by_key(df, mode, ttl)
            want = brute_walk_hit(reqs, mode, ttl, prof.variant == "prompt+output", prof.block,
                                  prof.min_prefix, prof.cap_last)
            assert [got[i] for i in range(len(reqs))] == want, (mode, ttl)


def test_vllm_caps_a_fully_cached_prompt_at_len_minus_one_block_aligned():
    R = oracle.OracleRequest
    reqs = [R(0, list(range(40))), R(1, list(range(40))), R(2, list(range(33)))]
    con = make_db(reqs)
    df = request_hits(con, "vllm", Grid(ttls=(math.inf,), streams=("global",)))
    hits = _by_key(df, "global", math.inf)
    assert hits == {0: 0, 1: 32, 2: 32}  # 40 → (39 // 16) * 16; 33 → 32 (len − 1 = 32 is aligned)


def test_deepseek_keeps_the_output_and_rounds_to_64():
    R = oracle.OracleRequest
    p = list(range(100))
    out = list(range(100, 180))
    reqs = [R(0, p, output=out), R(1, p + out + [7] * 30)]
    con = make_db(reqs)
    df = request_hits(con, "deepseek", Grid(ttls=(math.inf,), streams=("tenant",)))
    assert _by_key(df, "tenant", math.inf) == {0: 0, 1: 128}  # LCP 180 → 128; prompt-only would give 64


# ----------------------------------------------------------------------------- mlx-lm

@pytest.mark.parametrize("seed", range(6))
def test_mlx_profile_equals_brute_force_per_stream(seed):
    reqs = random_requests(200 + seed, n=10 + 3 * seed, models=(None, "m") if seed % 2 else (None,))
    con = make_db(reqs)
    prof = get_profile("mlx-lm:cache_size=3")
    df = request_hits(con, prof, Grid(streams=("tenant", "global")))
    order = oracle.time_order(reqs)
    for mode in ("tenant", "global"):
        want = {}
        streams = {}
        for i in order:
            streams.setdefault(oracle.cache_of(reqs[i], mode), []).append(i)
        for ids in streams.values():
            hits = mlx_oracle([reqs[i].tokens for i in ids], [reqs[i].output for i in ids], 3)
            want.update(zip(ids, hits))
        got = _by_key(df, mode, math.inf)
        assert got == want


# ----------------------------------------------------------------------------- OpenAI

def brute_openai(reqs, ttl, min_t, step, replicas=1, rpm=15, route_n=256):
    order = oracle.time_order(reqs)
    part = lambda r: (r.tenant, r.key, r.model)  # noqa: E731
    machine = {}
    for pos, i in enumerate(order):
        r = reqs[i]
        # earlier requests (processing order) of the same partition and route within 60 s
        k = sum(1 for j in order[:pos] if part(reqs[j]) == part(r)
                and tuple(reqs[j].tokens[:route_n]) == tuple(r.tokens[:route_n]) and r.ts - reqs[j].ts < 60 * US)
        machine[i] = (k // rpm) % replicas if replicas > 1 else 0
    out = {}
    for pos, i in enumerate(order):
        r = reqs[i]
        best = 0
        for j in order[:pos]:
            e = reqs[j]
            if part(e) == part(r) and machine[j] == machine[i] and r.ts - e.ts <= ttl_us(ttl):
                best = max(best, oracle.lcp(r.tokens, e.tokens))
        out[i] = 0 if best < min_t else min_t + ((best - min_t) // step) * step
    return out


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("seed", range(5))
def test_openai_profile_equals_brute_force(seed, replicas):
    reqs = random_requests(300 + seed, n=12 + 4 * seed, alphabet=3, max_len=50, gaps=(0, 1, 5, 20, 60, 70),
                           jitter_us=(0, -1, 1), models=(None, "m") if seed % 2 else (None,))
    con = make_db(reqs)
    prof = replace(get_profile("openai-gpt-5"), min_prefix=6, step=4,
                   params={"replicas": replicas, "rpm": 2, "route_tokens": 3})
    df = request_hits(con, prof, Grid(ttls=TTLS))
    for ttl in TTLS:
        got = _by_key(df, "org+key", ttl)
        assert got == brute_openai(reqs, ttl, 6, 4, replicas, 2, 3), ttl


def test_openai_rounding():
    assert [openai_round(x) for x in (0, 1023, 1024, 1151, 1152, 5000)] == [0, 0, 1024, 1024, 1152, 4992]


# ----------------------------------------------------------------------------- Anthropic

def brute_anthropic(reqs, min_tokens, lookback, max_bp=4):
    """The rules of ``simulate_anthropic`` read literally: entries are
    (stream, prefix tuple) → [last refresh, ttl]."""
    cache = {}
    out = []
    for r in reqs:
        toks = tuple(int(x) for x in r.tokens)
        bps = [(p, t) for p, t in r.breakpoints[:max_bp] if 0 < p <= len(toks)]
        cands = set()
        for p, _ in bps:
            before = sorted(b for b in r.boundaries if b < p)
            for c in [p] + (before[-lookback:] if lookback else []):
                if min_tokens <= c <= len(toks):
                    cands.add(c)
        read = 0
        for c in sorted(cands, reverse=True):
            e = cache.get((r.stream, toks[:c]))
            if e and r.ts - e[0] <= e[1]:
                read = c
                e[0] = r.ts
                break
        elig = {}
        for p, t in bps:
            if p >= min_tokens:
                elig[p] = max(t, elig.get(p, 0))
        w5 = w1 = 0
        prev = read
        for p in sorted(elig):
            t = elig[p]
            if p > prev:
                if t > 300 * US:
                    w1 += p - prev
                else:
                    w5 += p - prev
                prev = p
            e = cache.get((r.stream, toks[:p]))
            if e and r.ts - e[0] <= e[1]:
                e[0], e[1] = r.ts, max(e[1], t)
            else:
                cache[(r.stream, toks[:p])] = [r.ts, t]
        out.append((read, w5, w1))
    return out


def random_anthropic(seed, n):
    rng = random.Random(seed)
    base = [rng.randrange(3) for _ in range(60)]
    reqs, t = [], 0
    for _ in range(n):
        t += rng.choice((0, 1, 50, 200, 300, 400, 3000, 3600, 4000)) * US + rng.choice((0, -1, 1))
        cut = rng.randrange(10, 60)
        toks = base[:cut] + [rng.randrange(3) for _ in range(rng.randrange(0, 8))]
        bounds = sorted(set(rng.sample(range(1, len(toks) + 1), k=min(len(toks), rng.randrange(1, 30)))))
        bps = [(rng.choice(bounds), rng.choice((300, 300, 3600)) * US) for _ in range(rng.randrange(0, 6))]
        reqs.append(AnthropicRequest(t, rng.choice(("a", "b")), np.array(toks), bps, bounds))
    return reqs


@pytest.mark.parametrize("lookback", [0, 2, 20])
@pytest.mark.parametrize("seed", range(10))
def test_anthropic_simulator_equals_brute_force(seed, lookback):
    reqs = random_anthropic(seed, 30)
    for min_tokens in (1, 12):
        assert simulate_anthropic(reqs, min_tokens, lookback) == brute_anthropic(reqs, min_tokens, lookback)


def test_anthropic_hand_cases():
    t = np.arange(3000)
    A = AnthropicRequest
    # a hit only at a breakpoint: the second request's breakpoint sits later, the earlier
    # breakpoint position is found through the lookback
    r1 = A(0, "s", t[:2000], [(2000, 300 * US)], [1000, 2000])
    r2 = A(10 * US, "s", t[:3000], [(3000, 300 * US)], [1000, 2000, 3000])
    assert simulate_anthropic([r1, r2], 1024, 20) == [(0, 2000, 0), (2000, 1000, 0)]
    assert simulate_anthropic([r1, r2], 1024, 0) == [(0, 2000, 0), (0, 3000, 0)]  # no lookback: miss
    # expiry after 5 minutes unless refreshed by a hit
    r3 = A(400 * US, "s", t[:2000], [(2000, 300 * US)], [2000])
    assert simulate_anthropic([r1, r3], 1024)[1] == (0, 2000, 0)
    assert simulate_anthropic([r1, replace(r3, ts=300 * US)], 1024)[1] == (2000, 0, 0)  # exactly 5 min: a hit
    assert simulate_anthropic([r1, replace(r3, ts=300 * US + 1)], 1024)[1] == (0, 2000, 0)
    mid = A(200 * US, "s", t[:2000], [(2000, 300 * US)], [2000])
    assert simulate_anthropic([r1, mid, r3], 1024)[2] == (2000, 0, 0)  # refreshed at 200 s
    # 1h breakpoint survives 40 minutes; under the minimum nothing is cached or read
    h1 = A(0, "s", t[:2000], [(2000, 3600 * US)], [2000])
    assert simulate_anthropic([h1, replace(r3, ts=2400 * US)], 1024) == [(0, 0, 2000), (2000, 0, 0)]
    small = [A(0, "s", t[:900], [(900, 300 * US)], [900]), A(1, "s", t[:900], [(900, 300 * US)], [900])]
    assert simulate_anthropic(small, 1024) == [(0, 0, 0), (0, 0, 0)]


def test_anthropic_layout_from_a_body():
    body = {"system": [{"type": "text", "text": "S" * 10, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]},
                {"role": "user", "content": "c"}]}
    pieces = render_request(body)
    seg = [5] * len(pieces)
    bps, bounds = anthropic_layout(body, seg, "anthropic", 300 * US, auto=True)
    # pieces: bos, system, S.., user, a, block, b, user, c, assistant
    assert [k for k, _, _ in pieces] == ["marker", "marker", "text", "marker", "text", "marker", "text",
                                         "marker", "text", "marker"]
    assert bps == [(15, 3600 * US), (35, 300 * US)]
    assert bounds == [15, 25, 35, 45]
    nobp = {"messages": [{"role": "user", "content": "x"}]}
    assert anthropic_layout(nobp, [5, 5, 5, 5], "anthropic", 300 * US, auto=True)[0] == [(15, 300 * US)]
    assert anthropic_layout(nobp, [5, 5, 5, 5], "anthropic", 300 * US, auto=False)[0] == []
    top = {**nobp, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    assert anthropic_layout(top, [5, 5, 5, 5], "anthropic", 300 * US, auto=False)[0] == [(15, 3600 * US)]


@pytest.mark.parametrize("seed", range(4))
def test_anthropic_profile_on_a_db_equals_brute_force(seed):
    # tokens-format requests: the automatic breakpoint at the end of the prompt
    reqs = random_requests(400 + seed, n=15, alphabet=3, max_len=40, gaps=(0, 1, 100, 300, 400),
                           jitter_us=(0, -1, 1), models=(None, "m") if seed % 2 else (None,))
    con = make_db(reqs)
    prof = replace(get_profile("anthropic-sonnet-4-5"), min_prefix=5)
    df = request_hits(con, prof, Grid(ttls=(300.0, 3600.0), streams=("tenant",)))
    order = oracle.time_order(reqs)
    for ttl in (300.0, 3600.0):
        areqs = [AnthropicRequest(reqs[i].ts, f"tenant:{reqs[i].tenant}|{reqs[i].model}",
                                  np.array(reqs[i].tokens, dtype=np.int64),
                                  [(len(reqs[i].tokens), ttl_us(ttl))] if reqs[i].tokens else [],
                                  [len(reqs[i].tokens)] if reqs[i].tokens else []) for i in order]
        want = dict(zip(order, brute_anthropic(areqs, 5, 20)))
        sub = df.filter(df["ttl"] == ttl)
        got = {r["request_id"]: (r["hit"], r["write_5m"], r["write_1h"]) for r in sub.to_dicts()}
        assert got == want


# ----------------------------------------------------------------------------- realised columns

def test_realized_columns_follow_the_usage():
    R = oracle.OracleRequest
    reqs = [R(0, [1, 2, 3, 4], tenant="a"), R(1, [1, 2, 3, 5], tenant="a"), R(2, [9, 9], tenant="b")]
    con = make_db(reqs, usage={0: (10, 0, 0), 1: (12, 8, 2)})
    df = profile_sweep(con, ["ideal"], Grid(ttls=(math.inf,), blocks=(1,), min_prefixes=(0,),
                                            streams=("tenant",)), store=False)
    r = df.to_dicts()[0]
    assert (r["hit_tokens"], r["realized_requests"], r["realized_prompt_tokens"], r["realized_hit_tokens"]) == \
        (3, 2, 22, 8)
    per = profile_sweep(con, ["ideal"], Grid(ttls=(math.inf,), blocks=(1,), min_prefixes=(0,),
                                             streams=("tenant",)), by_stream=True, store=False)
    rows = {x["stream_key"]: x for x in per.to_dicts()}
    assert rows["tenant:a"]["realized_prompt_tokens"] == 22
    assert rows["tenant:b"]["realized_prompt_tokens"] is None
    none = make_db(reqs)
    assert profile_sweep(none, ["ideal"], Grid(ttls=(math.inf,), streams=("global",)),
                         store=False)["realized_prompt_tokens"].null_count() > 0


def test_profile_sweep_stores_results_and_rows_carry_fixed_dimensions():
    reqs = random_requests(7, n=20)
    con = make_db(reqs)
    df = profile_sweep(con, ["ideal", "deepseek", "vllm"], Grid())
    assert set(df["profile"]) == {"ideal", "deepseek", "vllm"}
    assert set(df.filter(df["profile"] == "deepseek")["block"]) == {64}
    assert set(df.filter(df["profile"] == "vllm")["block"]) == {16}
    n = con.execute("SELECT count(*) FROM results").fetchall()[0][0]
    assert n == len(df)
