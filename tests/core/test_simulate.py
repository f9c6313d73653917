"""The per-capacity simulation (``replay.core.simulate``) against the contract read
literally (``tests/support/oracle.py``): LRU with fixed routing, routing by cache
state (``prefix``) and clairvoyant eviction (``belady``), on generated logs."""

import numpy as np
import pytest

from replay.core import capacity as cap
from replay.core import simulate
from support import oracle
from replay.core.prompts import Prompt
from replay.core.streams import stream_key

from support.gen import TTLS_US, random_requests

CAPACITIES = (1, 2, 3, 5, 8, 13, 40, 10_000)


def _prompts(reqs):
    return [Prompt(i, reqs[i].ts, reqs[i].tenant, reqs[i].key, reqs[i].session,
                   np.array(reqs[i].tokens, dtype=np.int32), None, None, len(reqs[i].tokens), reqs[i].model)
            for i in oracle.time_order(reqs)]


def _routed(reqs, ps, mode, replicas, routing, seed=0):
    """Each request's replica: processing order (for simulate) and input order (for the oracle)."""
    router = cap.Router(replicas, routing, seed, len(ps))
    by_order = np.array([router(i, stream_key(mode, p.tenant, p.key, p.session)) for i, p in enumerate(ps)],
                        dtype=np.int64)
    by_input = [0] * len(reqs)
    for p, r in zip(ps, by_order):
        by_input[p.request_id] = int(r)
    return by_order, by_input


def _in_order(values, reqs):
    return [values[i] for i in oracle.time_order(reqs)]


@pytest.mark.parametrize("seed", range(8))
def test_lru_with_fixed_routing_equals_the_contract(seed):
    reqs = random_requests(seed, n=28, alphabet=3, max_len=40, models=(None, "m") if seed % 2 else (None,),
                           jitter_us=(0, 0, -1, 1))
    ps = _prompts(reqs)
    for mode in ("global", "tenant", "key"):
        for replicas, routing in ((1, "round-robin"), (3, "round-robin"), (2, "sticky")):
            by_order, by_input = _routed(reqs, ps, mode, replicas, routing, seed)
            for block in (1, 2, 5):
                log = simulate.block_log(ps, mode, block)
                for capacity in CAPACITIES:
                    hit, where = simulate.simulate(log, capacity, TTLS_US, replicas, by_order)
                    for ti, ttl in enumerate(TTLS_US):
                        want = oracle.capacity_hits(reqs, mode, block, capacity, ttl, by_input)
                        assert hit[ti].tolist() == _in_order(want, reqs), (mode, replicas, block, capacity, ttl)
                        assert where[ti].tolist() == by_order.tolist()


@pytest.mark.parametrize("seed", range(8))
def test_prefix_routing_equals_its_written_rule(seed):
    reqs = random_requests(50 + seed, n=30, alphabet=3, max_len=40, jitter_us=(0, 1))
    ps = _prompts(reqs)
    for mode in ("global", "tenant"):
        for replicas in (2, 3):
            for block in (1, 4):
                log = simulate.block_log(ps, mode, block)
                for capacity in (1, 3, 8, 10_000):
                    ttls = (TTLS_US[0], TTLS_US[3], TTLS_US[-1])
                    hit, where = simulate.simulate(log, capacity, ttls, replicas, routing="prefix")
                    for ti, ttl in enumerate(ttls):
                        want, want_where = oracle.capacity_hits_by_rule(reqs, mode, block, capacity, ttl,
                                                                        replicas, routing="prefix")
                        assert hit[ti].tolist() == _in_order(want, reqs), (mode, replicas, block, capacity, ttl)
                        assert where[ti].tolist() == _in_order(want_where, reqs)


@pytest.mark.parametrize("seed", range(8))
def test_belady_equals_its_written_rule_and_bounds_lru(seed):
    reqs = random_requests(80 + seed, n=30, alphabet=3, max_len=40, jitter_us=(0, 1))
    ps = _prompts(reqs)
    for mode in ("global", "key"):
        for replicas, routing in ((1, "round-robin"), (2, "round-robin"), (2, "sticky")):
            by_order, by_input = _routed(reqs, ps, mode, replicas, routing)
            for block in (1, 3):
                log = simulate.block_log(ps, mode, block)
                for capacity in (1, 2, 5, 13, 10_000):
                    ttls = (TTLS_US[2], TTLS_US[-1])
                    hit, _ = simulate.simulate(log, capacity, ttls, replicas, by_order, policy="belady")
                    for ti, ttl in enumerate(ttls):
                        want, _ = oracle.capacity_hits_by_rule(reqs, mode, block, capacity, ttl, replicas,
                                                               replica_of=by_input, policy="belady")
                        assert hit[ti].tolist() == _in_order(want, reqs), (mode, replicas, block, capacity, ttl)
                    lru, _ = simulate.simulate(log, capacity, TTLS_US[-1:], replicas, by_order)
                    assert hit[-1].sum() >= lru.sum(), (mode, replicas, block, capacity)


def test_hand_case_belady_keeps_what_comes_back():
    """Pool of one block of 2 tokens: LRU keeps the last prompt's block, Belady the
    one asked for again."""
    R = oracle.OracleRequest
    reqs = [R(0, [1, 1]), R(1, [2, 2]), R(2, [1, 1]), R(3, [2, 2])]
    ps = _prompts(reqs)
    log = simulate.block_log(ps, "global", 2)
    assert simulate.simulate(log, 1)[0].tolist() == [[0, 0, 0, 0]]
    # Belady: after request 1, block [1,1] comes back at 2 and [2,2] at 3: evict [2,2]
    assert simulate.simulate(log, 1, policy="belady")[0].tolist() == [[0, 0, 2, 0]]


def test_belady_with_prefix_routing_is_refused():
    reqs = random_requests(1, n=5)
    log = simulate.block_log(_prompts(reqs), "global", 1)
    with pytest.raises(ValueError, match="belady"):
        simulate.simulate(log, 4, replicas=2, routing="prefix", policy="belady")
