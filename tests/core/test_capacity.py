"""A finite cache (semantics.md, "Capacity"): the one-pass engine against the contract
simulated as written — one LRU per replica per capacity — on generated logs, the
Mooncake trace and hand-made cases; and the KV sizes."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.capacity import COLUMNS, CapacityGrid
from replay.analysis.capacity import capacity as run_capacity
from replay.cli.main import main
from replay.core import capacity as cap
from support import oracle
from replay.core.streams import stream_key
from replay.times import INF_US
from replay.providers import kv

from support.gen import TTLS_US, US, random_requests, use_engine
from support.capacity import run_pass as _engine
from support.logs import write_tokens_log as _write_tokens_log


@pytest.fixture(autouse=True, params=["compiled"])
def counts_engine(request, monkeypatch):
    """The capacity kernel is compiled only (``_capacity.pyx``): its reference is the
    contract's brute force (``oracle.capacity_hits``), not a second implementation."""
    return use_engine(request, monkeypatch, cap, "capacity pass")


@pytest.mark.parametrize("seed", range(16))
def test_every_capacity_and_ttl_equals_the_contract(seed):
    """Streams global/tenant/key; blocks 1, 2, 5; capacities from one block to past
    the working set; TTLs with gaps on, a µs under and a µs over them; one to four
    replicas, round-robin, sticky and random; two models in half the logs."""
    reqs = random_requests(seed, n=28, alphabet=3, max_len=40, models=(None, "m") if seed % 2 else (None,),
                           jitter_us=(0, 0, -1, 1))
    for mode in ("global", "tenant", "key"):
        for replicas, routing in ((1, "round-robin"), (2, "round-robin"), (4, "round-robin"), (3, "sticky"),
                                  (2, "random")):
            segs, replica_of = _engine(reqs, mode, (1, 2, 5), replicas, routing, seed)
            order = oracle.time_order(reqs)
            for block, seg in segs.items():
                for capacity in (1, 2, 3, 5, 8, 13, 40, 10_000):
                    for ttl in TTLS_US:
                        want = oracle.capacity_hits(reqs, mode, block, capacity, ttl, replica_of)
                        got = cap.hit_blocks(seg, ttl, capacity) * block
                        assert got.tolist() == [want[i] for i in order], (mode, replicas, routing, block, capacity, ttl)


@pytest.mark.parametrize("seed", range(4))
def test_the_counts_equal_the_requests_hits(seed):
    reqs = random_requests(100 + seed, n=40, alphabet=3, max_len=60)
    segs, _ = _engine(reqs, "tenant", (1, 4), 2, "sticky")
    ttls, caps = [0, 5 * US, INF_US], [1, 3, 7, 20, 500]
    for block, seg in segs.items():
        warm = np.arange(len(seg)) >= len(seg) // 2
        hit, nhit, whit = cap.counts(seg, ttls, caps, warm)
        for ti, t in enumerate(ttls):
            for ci, c in enumerate(caps):
                h = cap.hit_blocks(seg, t, c) * block
                assert (hit[ti, ci], nhit[ti, ci], whit[ti, ci]) == (h.sum(), (h > 0).sum(), h[warm].sum())


def test_hand_cases_partial_blocks_eviction_and_order():
    """Blocks of 4 tokens: a partial last block is neither a hit nor stored; with
    one block the parent survives (touched last, deepest first); another prefix
    evicts a small pool while an unbounded TTL would still hit."""
    R = oracle.OracleRequest
    a, b = [1] * 10, [2] * 10
    reqs = [R(0, a + [9]), R(1, a), R(2, b), R(3, a), R(4, a + [9, 9])]
    for capacity, want in ((1, [0, 4, 0, 0, 4]), (2, [0, 8, 0, 0, 8]), (5, [0, 8, 0, 8, 8])):
        segs, _ = _engine(reqs, "global", (4,))
        assert (cap.hit_blocks(segs[4], INF_US, capacity) * 4).tolist() == want, capacity
        assert oracle.capacity_hits(reqs, "global", 4, capacity) == want


@pytest.mark.parametrize("seed", range(3))
def test_a_pool_past_the_working_set_gives_the_sweeps_ceiling(tmp_path, seed):
    reqs = random_requests(200 + seed, n=40, alphabet=3, max_len=120, gaps=(0, 1, 5, 20, 60))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    con = api.open_db(tmp_path / "x.duckdb")
    api.ingest(con, [str(log)])
    grid = CapacityGrid(blocks=(1, 16), capacities=("1000000",), ttls=(5.0, 60.0, math.inf),
                        streams=("global", "tenant", "key"))
    got = run_capacity(con, grid)
    sweep = api.sweep(con, api.Grid(ttls=grid.ttls, blocks=grid.blocks, min_prefixes=(0,), streams=grid.streams))
    want = {(r["stream"], r["ttl_s"], r["block"]): r["hit_tokens"] for r in sweep.to_dicts()}
    assert {(r["stream"], r["ttl_s"], r["block"]): r["hit_tokens"] for r in got.to_dicts()} == want


def test_the_json_rows_equal_the_contract_through_the_cli(tmp_path):
    """`replay capacity --json`: exactly a JSON array with the documented keys;
    blocks 1, 16 and 512 on long prompts, every row equal to the simulation."""
    reqs = random_requests(7, n=24, alphabet=2, max_len=1800, gaps=(0, 1, 5, 20), models=(None, "m"))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    args = ["capacity", str(log), "--db", str(tmp_path / "c.duckdb"), "--block", "1,16,512",
            "--capacity", "1,2,9,50,400,5000,100000", "--ttl", "5,inf", "--stream", "global,tenant",
            "--replicas", "1,2", "--routing", "round-robin,sticky", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows and all(list(r) == COLUMNS for r in rows)
    assert len(rows) == 2 * 3 * 7 * 2 * 2 * 2  # streams × blocks × capacities × TTLs × replicas × routings
    order = oracle.time_order(reqs)
    for r in rows:
        mode, block, c = r["stream"], r["block"], r["capacity_blocks"]
        ttl = INF_US if r["ttl_s"] is None else int(r["ttl_s"] * US)
        router = cap.Router(r["replicas"], r["routing"], 0, len(reqs))
        replica_of = [0] * len(reqs)
        for pos, i in enumerate(order):
            replica_of[i] = router(pos, stream_key(mode, reqs[i].tenant, reqs[i].key, reqs[i].session))
        want = oracle.capacity_hits(reqs, mode, block, c, ttl, replica_of)
        assert r["hit_tokens"] == sum(want), r
        warm = sum(want[i] for i in order[len(order) // 2:])
        warm_prompt = sum(len(reqs[i].tokens) for i in order[len(order) // 2:])
        assert r["warm_hit_ratio"] == pytest.approx(warm / warm_prompt)
        assert r["max_replica_share"] == max(replica_of.count(k) for k in range(r["replicas"])) / len(reqs)
        assert r["capacity_bytes"] is None and r["policy"] == "lru"


def _mooncake_lru(path, capacity: int) -> tuple[int, int]:
    """The contract on Mooncake's hash ids (already prefix-chained 512-token
    blocks), one global LRU: whole blocks only, lookup, touch deepest first, evict."""
    from collections import OrderedDict

    pool: OrderedDict = OrderedDict()
    hit = prompt = 0
    records = [json.loads(line) for line in open(path) if line.strip()]
    for r in sorted(records, key=lambda r: r["timestamp"]):
        whole = r["hash_ids"][:r["input_length"] // 512]
        k = 0
        while k < len(whole) and whole[k] in pool:
            k += 1
        hit += k * 512
        prompt += r["input_length"]
        for b in reversed(whole):
            pool[b] = True
            pool.move_to_end(b)
        while len(pool) > capacity:
            pool.popitem(last=False)
    return prompt, hit


def test_the_mooncake_trace_equals_a_plain_lru_over_its_hash_ids(shared_data, counts_engine):
    if counts_engine == "python":
        pytest.skip("(the compiled run covers it; the Python count of 12,031 requests is slow)")
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    con = api.open_db(None)
    api.ingest(con, [str(path)])
    caps = (100, 1_000, 10_000, 50_000)
    rows = run_capacity(con, CapacityGrid(blocks=(512,), capacities=tuple(map(str, caps)))).to_dicts()
    for r in rows:
        prompt, hit = _mooncake_lru(path, r["capacity_blocks"])
        assert (r["prompt_tokens"], r["hit_tokens"]) == (prompt, hit), r["capacity_blocks"]
    assert rows[0]["hit_ratio"] < rows[-1]["hit_ratio"]


def test_kv_bytes_per_token():
    assert kv.kv_bytes_per_token("llama-3.1-8b") == 32 * 8 * 128 * 2 * 2 == 128 * 1024
    assert kv.kv_bytes_per_token("meta-llama/Llama-3.1-8B-Instruct") == 128 * 1024
    assert kv.kv_bytes_per_token("llama-3.1-8b", kv_dtype="fp8") == 64 * 1024
    assert kv.kv_bytes_per_token("deepseek-v3") == 61 * (512 + 64) * 2
    assert kv.kv_bytes_per_token(kv_bytes=1000) == 1000
    assert kv.kv_bytes_per_token() is None
    with pytest.raises(ValueError, match="no KV shape"):
        kv.kv_bytes_per_token("no-such-model")


def test_kv_bytes_from_a_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
        "torch_dtype": "bfloat16"}))
    assert kv.kv_bytes_per_token(model_config=tmp_path) == 2 * 28 * 4 * 128 * 2
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "torch_dtype": "float8_e4m3fn"}))
    assert kv.kv_bytes_per_token(model_config=tmp_path / "config.json") == 61 * 576 * 1


def test_capacities_as_counts_sizes_and_auto():
    assert kv.parse_size("4096") == ("blocks", 4096)
    assert kv.parse_size("40GiB") == ("bytes", 40 * 2**30)
    assert kv.parse_size("1.5 TB") == ("bytes", 1.5e12)
    assert kv.parse_size("auto") == ("auto", 0)
    assert kv.blocks_for("bytes", 2**30, 16, 128 * 1024) == 512  # 1 GiB of 16-token blocks of Llama-3.1-8B
    with pytest.raises(ValueError, match="KV size per token"):
        kv.blocks_for("bytes", 2**30, 16, None)
    with pytest.raises(ValueError):
        kv.parse_size("lots")
    grid = kv.auto_capacities(100_000)
    assert grid[0] == 1 and grid[-1] == 100_000 and grid == sorted(set(grid)) and len(grid) >= 10


def test_the_kernel_equals_the_contract_past_its_growth():
    """Thousands of requests on one replica (past the recorder's first sizes, 1024
    rows and owners): every request's hit equals the contract simulated as written."""
    reqs = random_requests(77, n=3000, alphabet=2, max_len=14, gaps=(0, 1, 2))
    segs, replica_of = _engine(reqs, "global", (1, 3))
    order = oracle.time_order(reqs)
    assert len(segs[1].gap) > 2048
    for block, seg in segs.items():
        for capacity in (1, 7, 50, 400):
            want = oracle.capacity_hits(reqs, "global", block, capacity, 2 * US, replica_of)
            assert (cap.hit_blocks(seg, 2 * US, capacity) * block).tolist() == [want[i] for i in order]


def test_prefix_routing_and_belady_rows_equal_their_rules_through_the_cli(tmp_path, counts_engine):
    """`--routing prefix` and `--policy belady`: every row equals the rule read
    literally (``oracle.capacity_hits_by_rule``), hits and busiest replica (the
    rules themselves are checked at length in test_simulate.py)."""
    if counts_engine == "python":
        pytest.skip("(simulated, not counted: the compiled run covers it)")
    reqs = random_requests(11, n=22, alphabet=2, max_len=160, gaps=(0, 1, 5, 20))
    log = tmp_path / "log.jsonl"
    _write_tokens_log(log, reqs)
    args = ["capacity", str(log), "--db", str(tmp_path / "c.duckdb"), "--block", "1,16",
            "--capacity", "2,20,100000", "--ttl", "5,inf", "--stream", "global,tenant",
            "--replicas", "1,3", "--routing", "sticky,prefix", "--policy", "lru,belady", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    # per stream × block × capacity × TTL: one replica (2 routing labels × 2 policies) + 3 replicas
    # (sticky lru, sticky belady, prefix lru)
    assert len(rows) == 2 * 2 * 3 * 2 * (4 + 3)
    order = oracle.time_order(reqs)
    for r in rows:
        mode, block, c, R = r["stream"], r["block"], r["capacity_blocks"], r["replicas"]
        ttl = INF_US if r["ttl_s"] is None else int(r["ttl_s"] * US)
        if r["routing"] == "prefix" and R > 1:
            want, where = oracle.capacity_hits_by_rule(reqs, mode, block, c, ttl, R, routing="prefix",
                                                       policy=r["policy"])
        else:
            router = cap.Router(R, "sticky" if R > 1 else "round-robin", 0, len(reqs))
            replica_of = [0] * len(reqs)
            for pos, i in enumerate(order):
                replica_of[i] = router(pos, stream_key(mode, reqs[i].tenant, reqs[i].key, reqs[i].session))
            want, where = oracle.capacity_hits_by_rule(reqs, mode, block, c, ttl, R, replica_of=replica_of,
                                                       policy=r["policy"])
        assert r["hit_tokens"] == sum(want), r
        assert r["max_replica_share"] == max(where.count(k) for k in range(R)) / len(reqs), r
    assert not [r for r in rows if r["routing"] == "prefix" and r["replicas"] > 1 and r["policy"] == "belady"]
