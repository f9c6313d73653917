"""The sampled capacity estimate (``replay.core.sampled``): at rate 1 it is the
exact engine, row for row; its stack distances equal a literal LRU stack; at
lower rates it stays near the exact curve."""

import dataclasses
import math

import numpy as np
import pytest

from replay import api
from replay.analysis.capacity import CapacityGrid
from replay.analysis.capacity import capacity as run_capacity
from replay.core import sampled
from replay.core.prompts import iter_prompts
from replay.times import INF_US

from support.gen import US, random_requests, use_engine
from support.paths import SAMPLE
from support.logs import write_tokens_log as _write_tokens_log
from support.walks import prompts


@pytest.fixture(params=["compiled", "python"])
def engine(request, monkeypatch):
    return use_engine(request, monkeypatch, sampled, "sampled pass")


def _stack_distances(ids, first):
    """A literal LRU stack: a request's lookups read the stack before its touches."""
    stack, out, i = [], [], 0
    while i < len(ids):
        j = i
        while j < len(ids) and first[j] == first[i]:
            j += 1
        out += [stack.index(b) if b in stack else -1 for b in ids[i:j]]
        for b in ids[i:j]:
            if b in stack:
                stack.remove(b)
            stack.insert(0, b)
        i = j
    return out


@pytest.mark.parametrize("seed", range(6))
def test_distances_equal_a_literal_lru_stack(engine, seed):
    rng = np.random.default_rng(seed)
    ids, first = [], []
    while len(ids) < 400:
        k = int(rng.integers(0, 5))
        blocks = list(rng.choice(30, size=k, replace=False))
        first += [len(ids)] * k
        ids += blocks
    ids, first = np.array(ids, dtype=np.int64), np.array(first, dtype=np.int64)
    got = sampled.distances(sampled._previous(ids), first)
    assert got.tolist() == _stack_distances(ids.tolist(), first.tolist())


@pytest.mark.parametrize("seed", range(3))
def test_rate_one_is_the_exact_engine(tmp_path, engine, seed):
    reqs = random_requests(300 + seed, n=40, alphabet=3, max_len=200, gaps=(0, 1, 5, 20, 60), models=(None, "m"))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    con = api.open_db(tmp_path / "x.duckdb")
    api.ingest(con, [str(log)])
    grid = dict(blocks=(1, 16), capacities=("1", "3", "20", "100", "auto"), ttls=(5.0, 60.0, math.inf),
                streams=("global", "tenant"), replicas=(1, 2), routings=("round-robin", "sticky"))
    exact = run_capacity(con, CapacityGrid(**grid))
    estimate = run_capacity(con, CapacityGrid(**grid, sample_rate=1.0))
    assert estimate.to_dicts() == exact.to_dicts()


@pytest.mark.parametrize("seed,exact_blocks", [(0, 2), (1, 3), (2, 1000)])
def test_small_capacities_are_exact_at_any_rate(tmp_path, engine, monkeypatch, seed, exact_blocks):
    """Below EXACT_SAMPLED_BLOCKS / rate blocks the counts come from one LRU of
    every block: exact, whatever the sample (small LRUs renumber their stamps often)."""
    monkeypatch.setattr(sampled, "EXACT_SAMPLED_BLOCKS", exact_blocks)
    reqs = random_requests(700 + seed, n=60, alphabet=4, max_len=300, gaps=(0, 1, 5, 20, 60), models=(None, "m"))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    con = api.open_db(tmp_path / "x.duckdb")
    api.ingest(con, [str(log)])
    rate = 0.5
    caps = tuple(str(c) for c in range(0, math.ceil(exact_blocks / rate) + 1, max(1, exact_blocks // 40)))
    grid = dict(blocks=(1, 4), capacities=caps, ttls=(5.0, 60.0, math.inf), streams=("global", "key"),
                replicas=(1, 3), routings=("round-robin", "random"), seed=seed)
    exact = run_capacity(con, CapacityGrid(**grid))
    estimate = run_capacity(con, CapacityGrid(**grid, sample_rate=rate))
    keep = ["stream", "ttl_s", "block", "capacity_blocks", "replicas", "routing", "hit_tokens", "warm_hit_ratio"]
    assert estimate.select(keep).to_dicts() == exact.select(keep).to_dicts()
    assert exact["hit_tokens"].sum() > 0


def _estimate(prompts, rate, seed, caps, ttls, exact_below=0):
    sp = sampled.SampledPass("global", (4,), 1, rate, seed, ttls, len(prompts), exact_below)
    for p in prompts:
        sp.add(p, 0)
    refs = sp.result()[4]
    hit, _ = sampled.sampled_counts(refs, ttls, caps)
    return hit / refs.prompt_tokens.sum()


def test_a_tenth_of_the_blocks_is_unbiased_over_samples():
    """Over a hundred samples (seeds) the mean estimate meets the exact curve
    within four standard errors; one sample of a small log whose prefixes are
    few and heavily shared can be far off (its spread is measured, not bounded)."""
    reqs = random_requests(5, n=300, alphabet=50, max_len=400, gaps=(0, 1, 5, 20, 60))
    ps = prompts(reqs, output=False)
    caps, ttls = [20, 80, 300, 10**9], [INF_US, 30 * US]
    exact = _estimate(ps, 1.0, 0, caps, ttls)
    runs = np.array([_estimate(ps, 0.1, s, caps, ttls) for s in range(100)])
    standard_error = runs.std(axis=0) / np.sqrt(len(runs))
    assert (standard_error > 0).all()
    assert (np.abs(runs.mean(axis=0) - exact) <= 4 * standard_error + 1e-3).all()


def test_sampling_refuses_the_simulated_rules():
    with pytest.raises(ValueError, match="sampled"):
        CapacityGrid(policies=("belady",), sample_rate=0.1)
    with pytest.raises(ValueError, match="sampled"):
        CapacityGrid(replicas=(2,), routings=("prefix",), sample_rate=0.1)
    with pytest.raises(ValueError, match="rate"):
        CapacityGrid(sample_rate=0.0)


def test_the_sample_is_the_same_compiled_in_python_and_without_shared_prefixes(tmp_path, monkeypatch):
    """Block ids come from prefix hashes that reuse the conversation's previous
    prompt: the same ids compiled and in numpy, and as when hashing every prompt whole."""
    con = api.open_db(tmp_path / "x.duckdb")
    api.ingest(con, [str(SAMPLE / "agent-openai.jsonl")])
    api.prepare(con, modes=())
    prompts = list(iter_prompts(con))[:300]
    assert any(p.shared for p in prompts)

    def ids(ps):
        sp = sampled.SampledPass("session", (1, 16), 1, 0.3, seed=3)
        for p in ps:
            sp.add(p, 0)
        return [np.frombuffer(sp._refs[(b, 0)]["id"], dtype=np.int64).tolist() for b in (1, 16)]

    whole = [dataclasses.replace(p, shared=0) for p in prompts]
    got = ids(prompts)
    assert got == ids(whole) and all(got)
    monkeypatch.setattr(sampled, "_compiled", None)
    assert ids(prompts) == got == ids(whole)
