"""The trie walk against the brute-force definition (semantics.md); the trie is
compiled (replay/core/_trie.pyx), its one implementation. Times are integer µs."""

import numpy as np
import pytest

from support import oracle
from replay.core import prompts as prompts_module
from replay.core.prompts import Prompt, mooncake_symbols
from replay.core.replay import replay_prompts
from replay.core.streams import MODES
from replay.times import INF_US
from replay.core.trie import Trie

from support.gen import TTLS_US, US, random_requests
from support.walks import prompts as _prompts
from support import kernels
from support.kernels import depth_under


@pytest.mark.parametrize("seed", range(40))
def test_the_trie_walks_as_the_brute_force_definition(seed):
    """Walk for walk against every walk remembered whole: steps (with and without
    owners) through splits, merges, long edges (compared in chunks), int32 and
    int64 symbols in one trie, insertions of prompt + output, shared prefixes,
    times a µs back, the horizon and pruning; its node count is the nodes it holds."""
    rng = np.random.default_rng(seed)
    horizon = [INF_US, 50 * US][seed % 2]
    a, b = Trie(horizon), kernels.BruteTrie(horizon)
    bases = [rng.integers(0, 6, rng.integers(0, 300)) for _ in range(5)]
    prev = None
    t = 0
    for i in range(120):
        t += int(rng.choice([0, 0, 1, 5, 30, 25, 50])) * US + int(rng.choice([0, 0, -1, 1]))
        base = bases[rng.integers(0, len(bases))]
        cut = int(rng.integers(0, len(base) + 1))
        seq = np.concatenate([base[:cut], rng.integers(0, 6, rng.integers(0, 80))])
        seq = seq.astype(np.int32 if rng.random() < 0.5 else np.int64)
        known = 0
        if prev is not None and rng.random() < 0.3:  # the previous prompt continued
            seq = np.concatenate([prev, seq]).astype(seq.dtype)
            known = len(prev)
        insert = np.concatenate([seq, rng.integers(0, 6, 20)]) if rng.random() < 0.3 else None
        owner = int(rng.integers(0, 3)) if seed % 4 >= 2 else None
        assert a.walk(seq, t, insert=insert, known=known, owner=owner) == b.walk(
            seq, t, insert=insert, known=known, owner=owner), i
        assert a.nodes == kernels.count_nodes(a)
        prev = seq
        if rng.random() < 0.05:
            a.prune(t)
            b.prune(t)
            assert a.nodes == kernels.count_nodes(a)


def _L(steps, ttl):
    return depth_under([g for g, _ in steps], [d for _, d in steps], ttl)


def _depths(rows, i, ttl):
    return depth_under(rows[i][5], rows[i][6], ttl)


@pytest.mark.parametrize("seed", range(60))
def test_walks_equal_oracle_every_mode_ttl_and_variant(seed):
    """Gaps fall exactly on, one µs under and one µs over each TTL; two models share
    tenants, keys and sessions."""
    reqs = random_requests(seed, n=1 + seed % 37, models=(None, "m1") if seed % 3 else (None,),
                           jitter_us=(0, 0, -1, 1))
    res = replay_prompts(_prompts(reqs), MODES, ("prompt", "prompt+output"))
    for variant in ("prompt", "prompt+output"):
        for mode in MODES:
            rows = {r[0]: r for r in res[(variant, mode)]}
            for ttl in TTLS_US:
                want = oracle.ceiling(reqs, mode, ttl, with_output=variant != "prompt")
                got = [_depths(rows, i, ttl) for i in range(len(reqs))]
                assert got == want, (variant, mode, ttl)


@pytest.mark.parametrize("seed", range(20))
def test_pruned_trie_is_exact_within_its_horizon(seed):
    """Prune, walk and the shared-prefix shortcut agree at the horizon to the µs."""
    reqs = random_requests(seed, n=40, gaps=(0, 1, 3, 5, 7, 10, 20), jitter_us=(0, 0, -1, 1))
    horizon = 10 * US
    res = replay_prompts(_prompts(reqs), ("tenant", "global"), ("prompt",), horizon_us=horizon)
    for mode in ("tenant", "global"):
        rows = {r[0]: r for r in res[("prompt", mode)]}
        for ttl in (0, 1 * US, 3 * US, 7 * US, 10 * US - 1, 10 * US):
            want = oracle.ceiling(reqs, mode, ttl)
            assert [_depths(rows, i, ttl) for i in range(len(reqs))] == want


def test_pruning_bounds_memory_to_the_window():
    rng = np.random.default_rng(0)
    t = Trie(horizon=10 * US)
    for i in range(2000):
        t.walk(rng.integers(0, 50_000, 64).astype(np.int32), i * US)
    # only prompts from the last ~15 s can still be held (prune runs every horizon/2)
    assert t.nodes <= 1 + 16


@pytest.mark.parametrize("unit_us", [1, 1_000, 1_000_000])
def test_ttl_boundary_is_inclusive_to_the_microsecond(unit_us):
    """A gap of exactly τ is a hit, one µs more is not (τ = 300 units of µs, ms, s)."""
    ttl = 300 * unit_us
    for gap, hit in ((ttl - 1, 3), (ttl, 3), (ttl + 1, 0)):
        t = Trie()
        t.walk(np.array([1, 2, 3]), 1_700_000_000 * US)
        steps = t.walk(np.array([1, 2, 3, 4]), 1_700_000_000 * US + gap)
        assert _L(steps, ttl) == hit, gap


def test_a_gap_of_exactly_the_horizon_survives_pruning():
    """Prune drops nodes idle for *more* than the horizon: a prompt exactly the
    horizon later still finds its prefix, one µs later it does not."""
    for late, hit in ((0, 3), (1, 0)):
        t = Trie(horizon=60 * US)
        t.walk(np.array([1, 2, 3]), 0)
        t.walk(np.array([9, 9]), 59 * US)          # prunes at 59 s: nothing is old enough
        steps = t.walk(np.array([1, 2, 3, 4]), 60 * US + late)
        assert _L(steps, 60 * US) == hit


def test_same_timestamp_hits_in_input_order():
    t = Trie()
    assert t.walk(np.array([7, 8]), 5) == []
    assert t.walk(np.array([7, 8, 9]), 5) == [(0, 2)]


def test_empty_prompt_and_prompt_equal_to_an_earlier_one():
    t = Trie()
    assert t.walk(np.array([], dtype=np.int32), 0) == []
    t.walk(np.array([1, 2, 3]), 1)
    assert t.walk(np.array([1, 2, 3]), 2) == [(1, 3)]
    assert t.walk(np.array([], dtype=np.int32), 3) == []


def test_steps_refresh_and_split():
    t = Trie()
    t.walk(np.array([1, 2, 3, 4, 5]), 0)
    t.walk(np.array([1, 2, 9]), 10)   # refreshes [1, 2] at 10
    steps = t.walk(np.array([1, 2, 3, 4, 5, 6]), 15)
    assert steps == [(5, 2), (15, 5)]


def test_block_trace_depths_are_tokens_with_a_partial_last_block():
    a_sym, a_cum = mooncake_symbols([0, 1, 2], 512 * 2 + 100)
    b_sym, b_cum = mooncake_symbols([0, 1, 5, 3], 512 * 3 + 7)
    t = Trie()
    t.walk(a_sym, 0, cum=a_cum)
    assert t.walk(a_sym, 1, cum=a_cum) == [(1, 1124)]  # whole prompt, partial block too
    assert t.walk(b_sym, 2, cum=b_cum) == [(1, 1024)]  # ids stand for whole blocks


def test_two_models_never_share_a_cache():
    """A tenant alternating two models with identical prompts: no hit crosses the
    models, in every stream mode; each model hits its own earlier prompt."""
    toks = np.arange(50, dtype=np.int32)
    prompts = [Prompt(i, i * US, "acme", "k", "s", toks, None, None, 50, ("m-a", "m-b")[i % 2])
               for i in range(6)]
    res = replay_prompts(prompts, MODES)
    for mode in MODES:
        got = [depth_under(r[5], r[6], INF_US) for r in res[("prompt", mode)]]
        assert got == [0, 0, 50, 50, 50, 50], mode
        assert [r[2] for r in res[("prompt", mode)]] == ["m-a", "m-b"] * 3


def test_quiet_streams_are_swept_so_memory_follows_the_window():
    # 200 sessions, each active for a moment and then never again
    prompts = [Prompt(i, i * 10 * US, "t", None, f"s{i}", np.arange(i, i + 50, dtype=np.int32), None, None, 50)
               for i in range(200)]
    res = replay_prompts(prompts, ("session",), ("prompt",), horizon_us=30 * US)
    # nodes count each trie's root: 2 per live session; only those of the last ~45 s remain
    assert res["_nodes"]["prompt/session"] <= 2 * 5
    full = replay_prompts(prompts, ("session",), ("prompt",))
    assert full["_nodes"]["prompt/session"] == 2 * 200


def test_a_shared_prefix_is_trusted_only_in_its_stream_and_within_the_horizon():
    """replay_prompts skips comparing the symbols a prompt shares with its
    conversation's previous one only where that one's path must still be in the
    trie. Here the path is gone (pruned; another key's stream) and a different
    path starts with the same symbol: trusting it would report 5 tokens, not 2."""
    def p(i, ts, toks, key=None, session=None, shared=0, previous=None, model=None):
        return Prompt(i, ts, "t", key, session, np.array(toks, dtype=np.int32), None, None, len(toks),
                      model, shared, previous)

    first, other = [1, 2, 3, 4, 5, 6], [1, 2, 7, 7, 7]
    # past the horizon: the first path is pruned before the other one is walked
    pruned = [p(0, 0, first, session="x"), p(1, 700 * US, other, session="y"),
              p(2, 800 * US, first + [8, 8], session="x", shared=6, previous=(0, None, "x", None))]
    out = replay_prompts(pruned, modes=("tenant",), horizon_us=600 * US)
    assert out[("prompt", "tenant")][2][6] == [2]
    # one µs past the horizon is past it
    edge = [p(0, 0, first, session="x"), p(1, 600 * US + 1, other, session="y"),
            p(2, 600 * US + 1, first + [8, 8], session="x", shared=6, previous=(0, None, "x", None))]
    out = replay_prompts(edge, modes=("tenant",), horizon_us=600 * US)
    assert out[("prompt", "tenant")][2][6] == [2]
    # the same session under another key: in key mode another stream's trie
    moved = [p(0, 0, first, key="A", session="x"), p(1, 1, other, key="B"),
             p(2, 2, first + [8], key="B", session="x", shared=6, previous=(0, "A", "x", None))]
    out = replay_prompts(moved, modes=("key", "session"))
    assert out[("prompt", "key")][2][6] == [2]
    assert out[("prompt", "session")][2][6] == [6]  # same stream: the whole shared part hits
    # the same conversation on another model: another cache
    switched = [p(0, 0, first, session="x", model="a"), p(1, 1, other, session="y", model="b"),
                p(2, 2, first + [8], session="x", model="b", shared=6, previous=(0, None, "x", "a"))]
    out = replay_prompts(switched, modes=("session", "tenant"))
    assert out[("prompt", "tenant")][2][6] == [2]
    assert out[("prompt", "session")][2][6] == []


def test_the_cycle_collector_is_paused_while_walking_and_left_as_it_was():
    """replay_prompts pauses Python's cycle collector (the tries hold no cycles, and a
    week's replay spent a sixth of its time in it), and gives back the caller's setting."""
    import gc

    seen = []

    def prompts():
        for p in _prompts(random_requests(3, n=20)):
            seen.append(gc.isenabled())
            yield p

    assert gc.isenabled()
    replay_prompts(prompts(), ("tenant",))
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        replay_prompts(prompts(), ("tenant",))
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("seed", range(10))
def test_the_prompt_assembly_equals_its_definition(seed):
    """SegmentStore.extend against the segments concatenated and the part shared
    by definition: an agent's next turn, an earlier message changed, the same
    prompt again, nothing shared, no previous prompt, empty segments and empty
    prompts."""
    rng = np.random.default_rng(seed)
    store = object.__new__(prompts_module.SegmentStore)
    store._tokens = {int(s): rng.integers(0, 1000, rng.integers(0, 40)).astype(np.int32)
                     for s in rng.choice(2**62, 60, replace=False)}
    sids = list(store._tokens)
    prev = None
    for _ in range(200):
        how = rng.integers(0, 6)
        if prev is None or how == 0:
            ids = [sids[i] for i in rng.integers(0, len(sids), rng.integers(0, 30))]
        elif how == 1:  # the next turn: all but the last, then new segments
            ids = prev[0][:-1] + [sids[i] for i in rng.integers(0, len(sids), rng.integers(0, 5))]
        elif how == 2 and prev[0]:  # an earlier segment changed
            ids = list(prev[0])
            ids[rng.integers(0, len(ids))] = sids[rng.integers(0, len(sids))]
        elif how == 3:
            ids = list(prev[0])
        else:
            ids = prev[0] + [sids[i] for i in rng.integers(0, len(sids), rng.integers(0, 5))]
        before = None if rng.random() < 0.1 else prev
        got, shared = store.extend(ids, before)
        want, want_shared = kernels.extend(store._tokens, ids, before)
        assert got.dtype == want.dtype == np.int32
        assert got.tolist() == want.tolist() and shared == want_shared
        prev = (ids, got)


def test_the_prompt_assembly_refuses_other_than_int32_tokens():
    """It copies raw memory: an int64 segment would be read past its end."""
    tokens = {1: np.array([1, 2], dtype=np.int32), 2: np.array([3], dtype=np.int64)}
    assert prompts_module._extend(tokens, [1], None)[0].tolist() == [1, 2]
    with pytest.raises(TypeError, match="int32"):
        prompts_module._extend(tokens, [1, 2], None)
    with pytest.raises(TypeError, match="int32"):  # the previous prompt's tokens too
        prompts_module._extend(tokens, [1, 1], ([1, 1], np.array([1, 2, 1, 2], dtype=np.int64)))


def _arrays(trie) -> dict[int, np.ndarray]:
    """The arrays a trie's edges are views of, by identity."""
    out, stack = {}, [trie.root]
    while stack:
        node = stack.pop()
        out[id(node.base)] = node.base
        stack.extend(node.children.values())
    return out


def test_tries_walking_one_request_hold_one_copy_of_its_new_symbols():
    """Memory at TTL ∞: the stream modes' tries all walk each request, and the part
    of it they must hold (from where it leaves what they knew, to its end) is
    copied once for all of them — not once per trie, nor the whole prompt."""
    rng = np.random.default_rng(3)
    history = rng.integers(0, 50, 500).astype(np.int32)
    branches = [np.append(history, np.int32(1000 + k)) for k in range(2)]  # (a branch point at 500)
    new = np.concatenate([history, rng.integers(50, 100, 40).astype(np.int32)])

    def walked(held):
        tries = [Trie(INF_US) for _ in range(3)]
        for trie in tries:
            for seq in branches:
                trie.walk(seq, 1 * US)
        before = [_arrays(t) for t in tries]
        for trie in tries:
            trie.walk(new, 2 * US, held=held)
        return [{i: a for i, a in _arrays(t).items() if i not in b} for t, b in zip(tries, before)]

    fresh = walked({})
    assert all(len(f) == 1 for f in fresh)
    assert fresh[0].keys() == fresh[1].keys() == fresh[2].keys()  # one array, shared
    (arr,) = fresh[0].values()
    assert arr.nbytes == 40 * arr.itemsize  # the new symbols only
    # without a shared ``held``, each trie copies them for itself (as a lone walk must)
    assert len({i for f in walked(None) for i in f}) == 3


def test_a_split_edge_stays_a_view_and_a_late_branch_holds_only_its_own_symbols():
    """A branch late in a long prompt keeps its own few symbols, not the prompt
    it was cut from; splitting an edge copies nothing."""
    rng = np.random.default_rng(4)
    a = rng.integers(0, 50, 1000).astype(np.int32)
    b = np.concatenate([a[:990], rng.integers(50, 100, 20).astype(np.int32)])
    trie = Trie(INF_US)
    trie.walk(a, 1 * US)
    trie.walk(b, 2 * US)
    held = sum(arr.nbytes for arr in _arrays(trie).values() if len(arr))
    assert held == (1000 + 20) * 4
    assert trie.walk(b, 3 * US) == [(1 * US, 1010)]
    assert trie.walk(a, 4 * US) == [(1 * US, 990), (3 * US, 1000)]
