"""Memory tiers (semantics.md, "Capacity", the tiers paragraph): the one-pass
engine against the contract simulated literally — per replica an LRU hierarchy
whose tiers demote their least recent block to the next, one pooled LRU over
every request — on generated logs, the Mooncake trace and hand-made cases."""

import json
import math
from collections import OrderedDict

import pytest
from click.testing import CliRunner

from replay.analysis.capacity import COLUMNS
from replay.cli.main import main
from replay.core import capacity as cap
from support import oracle
from replay.core.streams import stream_key
from replay.core.tiers import TierSpec, parse_tiers, tier_depths
from replay.times import INF_US

from support.gen import TTLS_US, US, random_requests
from support.capacity import run_pass as _engine
from support.logs import write_tokens_log as _write_tokens_log


def tier_hits(requests, mode: str, block: int, sizes, pooled, ttl: int, replica_of) -> list[list[int]]:
    """The tiers paragraph read literally. Each replica: tiers of ``sizes`` blocks,
    fastest first, each an LRU; a touched block goes to the top of the first
    tier (leaving wherever it was), and a tier over its size moves its least
    recent block to the top of the next tier (the last one drops it). The
    pooled tier (``pooled`` blocks, or None): one LRU over every request of
    every replica. A request's hit: its leading blocks, each found fresh
    (last used within ``ttl`` — on its replica in a replica tier, by any
    request in the pooled one) in a replica tier or else in the pool; each hit
    block counts for the tier it was found in. Returns each request's tokens
    per tier (replica tiers, then the pooled one), input order."""
    order = oracle.time_order(requests)
    hierarchy: dict[int, list[OrderedDict]] = {}
    pool: OrderedDict = OrderedDict()  # block -> last touch by any request, least recent first
    out = [None] * len(requests)
    for i in order:
        r = requests[i]
        tiers = hierarchy.setdefault(replica_of[i], [OrderedDict() for _ in sizes])
        ids = [(oracle.cache_of(r, mode), tuple(r.tokens[:(k + 1) * block])) for k in range(len(r.tokens) // block)]
        served = [0] * (len(sizes) + (pooled is not None))
        for b in ids:
            found = [j for j, t in enumerate(tiers) if b in t and r.ts - t[b] <= ttl]
            if found:
                served[found[0]] += block
            elif pooled is not None and b in pool and r.ts - pool[b] <= ttl:
                served[-1] += block
            else:
                break
        out[i] = served
        for b in reversed(ids):  # deepest first: a parent is never less recent than its child
            for t in tiers:
                t.pop(b, None)
            tiers[0][b] = r.ts
            pool[b] = r.ts
            pool.move_to_end(b)
        for j, t in enumerate(tiers):  # demotion, fastest tier first
            while len(t) > sizes[j]:
                b, last = t.popitem(last=False)
                if j + 1 < len(tiers):
                    tiers[j + 1][b] = last  # the most recent of the slower tier
        while pooled is not None and len(pool) > pooled:
            pool.popitem(last=False)
    return out


def _replicas(reqs, mode, replicas, routing):
    router = cap.Router(replicas, routing, 0, len(reqs))
    replica_of = [0] * len(reqs)
    for pos, i in enumerate(oracle.time_order(reqs)):
        replica_of[i] = router(pos, stream_key(mode, reqs[i].tenant, reqs[i].key, reqs[i].session))
    return replica_of


TIER_SETS = [((2,), None), ((1, 2), None), ((3, 0, 4), None), ((1,), 3), ((2, 3), 5), ((0, 2), 1), ((1, 1), 40),
             ((5,), 0)]


@pytest.mark.parametrize("seed", range(10))
def test_every_tier_of_every_request_equals_the_literal_hierarchy(seed):
    """Blocks 1, 2, 5; tiers with zero, small and past-the-working-set sizes, with and
    without a pool; TTLs landing exactly on gaps, a µs under and over; one to four
    replicas, round-robin and sticky."""
    reqs = random_requests(300 + seed, n=30, alphabet=3, max_len=40, models=(None, "m") if seed % 2 else (None,),
                           jitter_us=(0, 0, -1, 1))
    order = oracle.time_order(reqs)
    for mode in ("global", "tenant"):
        pool_segs, _ = _engine(reqs, mode, (1, 2, 5), 1)
        for replicas, routing in ((1, "round-robin"), (2, "round-robin"), (4, "round-robin"), (3, "sticky")):
            segs, replica_of = _engine(reqs, mode, (1, 2, 5), replicas, routing)
            assert replica_of == _replicas(reqs, mode, replicas, routing)
            for block, seg in segs.items():
                for sizes, pooled in TIER_SETS:
                    for ttl in TTLS_US:
                        want = tier_hits(reqs, mode, block, sizes, pooled, ttl, replica_of)
                        got = tier_depths(seg, pool_segs[block], ttl, list(sizes), pooled) * block
                        assert got.T.tolist() == [want[i] for i in order], (mode, replicas, block, sizes, pooled, ttl)


def test_hand_case_demotion_and_the_pool():
    """Block 1, one replica per request alternately (round-robin of two). Tier 1 of
    one block, tier 2 of one, a pool of two. Request 0 [a b] on replica 0 leaves
    a in tier 1 (the parent is the most recent), b demoted to tier 2. Request 1
    [c] on replica 1. Request 2 [a b] on replica 0: a from tier 1, b from tier 2.
    Request 3 [a b x] on replica 1: nothing of its own, a and b from the pool
    (which holds the two most recent blocks of all: a, b)."""
    reqs = [oracle.OracleRequest(ts=t * US, tokens=toks) for t, toks in
            enumerate([[1, 2], [3], [1, 2], [1, 2, 9]])]
    want = tier_hits(reqs, "global", 1, (1, 1), 2, INF_US, [0, 1, 0, 1])
    assert want == [[0, 0, 0], [0, 0, 0], [1, 1, 0], [0, 0, 2]]
    segs, replica_of = _engine(reqs, "global", (1,), 2)
    pool, _ = _engine(reqs, "global", (1,), 1)
    assert replica_of == [0, 1, 0, 1]
    assert tier_depths(segs[1], pool[1], INF_US, [1, 1], 2).T.tolist() == want
    # the TTL applies in every tier: 1 s ago is a hit at τ = 1 s exactly, not at 1 s − 1 µs
    assert tier_depths(segs[1], pool[1], US, [1, 1], 2).T.tolist()[3] == [0, 0, 2]
    assert tier_depths(segs[1], pool[1], US - 1, [1, 1], 2).T.tolist()[3] == [0, 0, 0]


def test_hand_case_empty_prompts_partial_blocks_and_ties():
    """Block 2: an empty prompt and a 3-token prompt (its last block partial: neither
    hit nor stored) at the same time as the requests before them (ties: input
    order). Tier 1 of one block, tier 2 of one, no pool, one replica."""
    reqs = [oracle.OracleRequest(ts=0, tokens=toks) for toks in ([1, 2, 3, 4], [], [1, 2, 3], [1, 2, 3, 4, 5])]
    want = tier_hits(reqs, "global", 2, (1, 1), None, INF_US, [0] * 4)
    # request 2: block [1 2] in tier 1 (the parent, most recent); request 3: [1 2] in tier 1 and
    # [1 2 3 4] in tier 2, where request 2's touch of [1 2] demoted it (its partial block stored nothing)
    assert want == [[0, 0], [0, 0], [2, 0], [2, 2]]
    segs, replica_of = _engine(reqs, "global", (2,), 1)
    assert (tier_depths(segs[2], None, INF_US, [1, 1]) * 2).T.tolist() == want
    assert (tier_depths(segs[2], None, INF_US, [1, 0]) * 2).T.tolist() == [[0, 0], [0, 0], [2, 0], [2, 0]]


def test_tier_lists_parse_and_refuse_what_the_contract_does_not_define():
    assert parse_tiers("hbm:40GiB, dram:256GiB,store:4TiB:pooled:25GB/s") == (
        TierSpec("hbm", "40GiB"), TierSpec("dram", "256GiB"), TierSpec("store", "4TiB", True, "25GB/s"))
    for bad in ("hbm", "dram:1:pooled,hbm:2", "hbm:1,dram:2:pooled,ssd:3", "hbm:1,hbm:2", "hbm:1:fast", ""):
        with pytest.raises(ValueError):
            parse_tiers(bad)


def _oracle_rows(reqs, rows, sizes_of):
    """Each JSON row's hit and per-tier tokens from the literal hierarchy."""
    order = oracle.time_order(reqs)
    for r in rows:
        mode, block = r["stream"], r["block"]
        ttl = INF_US if r["ttl_s"] is None else round(r["ttl_s"] * US)
        replica_of = _replicas(reqs, mode, r["replicas"], r["routing"])
        names, sizes, pooled = sizes_of(r)
        per = tier_hits(reqs, mode, block, sizes, pooled, ttl, replica_of)
        want = {name: sum(p[j] for p in per) for j, name in enumerate(names)}
        assert r["tier_hit_tokens"] == want, r
        assert r["hit_tokens"] == sum(want.values()), r
        warm = sum(sum(per[i]) for i in order[len(order) // 2:])
        warm_prompt = sum(len(reqs[i].tokens) for i in order[len(order) // 2:])
        assert r["warm_hit_ratio"] == pytest.approx(warm / warm_prompt)


@pytest.mark.parametrize("unit", ["us", "ms", "s"])
def test_the_json_rows_equal_the_hierarchy_through_the_cli(tmp_path, unit):
    """`replay capacity --tier … --json` on a log in seconds and one in milliseconds
    (TTL boundaries exactly at τ): per-tier tokens adding up to hit_tokens, and a
    row with every tier but the first at zero equal to the plain --capacity row."""
    reqs = random_requests(11, n=30, alphabet=2, max_len=300, gaps=(0, 1, 5, 20), models=(None, "m"))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs, unit=unit)
    base = ["capacity", str(log), "--db", str(tmp_path / "c.duckdb"), "--block", "1,16", "--ttl", "5,inf",
            "--stream", "global,tenant", "--replicas", "1,2,4", "--routing", "round-robin,sticky", "--json"]
    tiers = ["--tier", "hbm:3,dram:7", "--tier", "hbm:2,dram:0,store:9:pooled", "--tier", "hbm:5,dram:0"]
    res = CliRunner().invoke(main, base + tiers)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    # streams × blocks × TTLs × replicas (1, 2, 4) × routings (one replica: a row per routing too) × tier sets
    assert len(rows) == 2 * 2 * 2 * 3 * 2 * 3
    assert all(list(r)[:len(COLUMNS)] == COLUMNS and r["tiers"] for r in rows)

    def sizes_of(r):
        specs = parse_tiers(r["tiers"])
        pooled = int(specs[-1].size) if specs[-1].pooled else None
        return [t.name for t in specs], [int(t.size) for t in specs if not t.pooled], pooled
    _oracle_rows(reqs, rows, sizes_of)
    plain = CliRunner().invoke(main, base + ["--capacity", "5"])
    assert plain.exit_code == 0, plain.output
    plain_rows = json.loads(plain.stdout)
    zero = [{k: r[k] for k in COLUMNS} for r in rows if r["tiers"] == "hbm:5,dram:0"]
    assert zero == plain_rows


def test_the_mooncake_trace_with_tiers_equals_the_hierarchy(shared_data, tmp_path):
    """The trace's prefix-chained 512-token blocks: two replicas round-robin and sticky,
    GPU memory, DRAM and a pooled store, against the literal hierarchy over its hash ids."""
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    records = [json.loads(line) for line in open(path) if line.strip()]
    reqs = [oracle.OracleRequest(ts=round(r["timestamp"] * 1000), tokens=[]) for r in records]
    for q, r in zip(reqs, records):  # one token a block: the hash ids are the chain already
        q.tokens = list(r["hash_ids"][:r["input_length"] // 512])
    res = CliRunner().invoke(main, ["capacity", str(path), "--format", "mooncake", "--block", "512",
                                    "--db", str(tmp_path / "m.duckdb"), "--replicas", "2",
                                    "--routing", "round-robin", "--tier", "hbm:2000,dram:6000,store:20000:pooled",
                                    "--tier", "hbm:8000,dram:0", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["tiers"] for r in rows} == {"hbm:2000,dram:6000,store:20000:pooled", "hbm:8000,dram:0"}
    for r in rows:
        specs = parse_tiers(r["tiers"])
        sizes = [int(t.size) for t in specs if not t.pooled]
        pooled = int(specs[-1].size) if specs[-1].pooled else None
        replica_of = _replicas(reqs, "global", 2, "round-robin")
        per = tier_hits(reqs, "global", 1, sizes, pooled, INF_US, replica_of)
        want = {t.name: 512 * sum(p[j] for p in per) for j, t in enumerate(specs)}
        assert r["tier_hit_tokens"] == want
        assert r["prompt_tokens"] == sum(x["input_length"] for x in records)
    assert min(rows[0]["tier_hit_tokens"].values()) > 0  # every tier serves something here


def test_the_cost_keys_equal_the_cost_model_on_the_hierarchys_hits(tmp_path):
    """`--model … --gpu … --gpu-price`: each row's GPU-hours, GPUs and dollars are the
    cost model applied to the literal hierarchy's per-request, per-tier hits
    (a DRAM tier's hits loaded over the GPU's host link, a pooled store's at the
    bandwidth written); without --gpu the rows have no cost keys."""
    from replay.analysis.buy import COST_KEYS, CostModel, cost_figures
    from replay.providers import gpus
    from replay.providers.prefill_cost import compute_for
    import numpy as np

    reqs = random_requests(21, n=40, alphabet=2, max_len=400, gaps=(0, 60, 600, 1800))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    args = ["capacity", str(log), "--db", str(tmp_path / "c.duckdb"), "--block", "16", "--replicas", "2",
            "--routing", "round-robin", "--tier", "hbm:2,dram:3,store:6:pooled:10GB/s", "--model", "llama-3.1-8b",
            "--gpu", "a100", "--gpu-price", "1.5", "--mfu", "0.4", "--target-utilisation", "0.6", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    order = oracle.time_order(reqs)
    per = tier_hits(reqs, "global", 16, (2, 3), 6, INF_US, _replicas(reqs, "global", 2, "round-robin"))
    tiers = np.array([per[i] for i in order]).T
    cost = CostModel(compute_for("llama-3.1-8b"), gpus.get_gpu("a100"), 0.4, 0.6, 1.5)
    want = cost_figures(cost, np.array([len(reqs[i].tokens) for i in order]), np.array([reqs[i].ts for i in order]),
                        np.ones(len(reqs), bool), tiers, [math.inf, 32e9, 10e9])
    for k in COST_KEYS:
        assert row[k] == (pytest.approx(want[k]) if isinstance(want[k], float) else want[k]), k
    assert row["prefill_gpu_hours_week"] < row["prefill_gpu_hours_week_uncached"]
    assert row["load_gpu_hours_week"] > 0
    plain = CliRunner().invoke(main, args[:6] + ["--capacity", "5", "--json"])
    assert plain.exit_code == 0 and not set(COST_KEYS) & set(json.loads(plain.stdout)[0])
    refused = CliRunner().invoke(main, args[:6] + ["--gpu", "h100", "--json"])
    assert refused.exit_code != 0 and "--model" in refused.output
    refused = CliRunner().invoke(main, args[:6] + ["--gpu-price", "2", "--json"])
    assert refused.exit_code != 0 and "--gpu NAME" in refused.output


def test_simulated_rows_are_priced_from_their_own_hits(tmp_path):
    """Prefix routing and Belady rows carry the cost keys too: the cost model on the
    rule's per-request hits (``oracle.capacity_hits_by_rule``), all in GPU memory."""
    from replay.analysis.buy import COST_KEYS, CostModel, cost_figures
    from replay.providers import gpus
    from replay.providers.prefill_cost import compute_for
    import numpy as np

    reqs = random_requests(23, n=30, alphabet=2, max_len=300, gaps=(0, 60, 600))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    res = CliRunner().invoke(main, ["capacity", str(log), "--db", str(tmp_path / "c.duckdb"), "--block", "16",
                                    "--capacity", "4", "--replicas", "2", "--routing", "prefix", "--model",
                                    "qwen3-8b", "--gpu", "l40s", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    order = oracle.time_order(reqs)
    want, _ = oracle.capacity_hits_by_rule(reqs, "global", 16, 4, INF_US, 2, routing="prefix")
    cost = CostModel(compute_for("qwen3-8b"), gpus.get_gpu("l40s"))
    figures = cost_figures(cost, np.array([len(reqs[i].tokens) for i in order]), np.array([reqs[i].ts for i in order]),
                           np.ones(len(reqs), bool), np.array([[want[i] for i in order]]), [math.inf])
    assert row["hit_tokens"] == sum(want)
    for k in COST_KEYS:
        assert row[k] == (pytest.approx(figures[k]) if isinstance(figures[k], float) else figures[k]), k
