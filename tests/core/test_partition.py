"""Partitioned replay (replay.core.partition) against its oracle, the single pass.

Every mode, both variants, several partition counts and depths K (1, a few
symbols, more than most prompts), finite and infinite horizons: the merged rows
must equal ``replay_prompts``' rows exactly — request, stream, model, time,
length, gaps, depths and origins. The partitions are walked as the Ray engine
walks them (``replay.core.streamed``), by walkers in this process.
"""

import itertools
import math
import pickle

import numpy as np
import pytest

from replay import api
from replay.core import partition
from replay.core.grid import Grid
from replay.core.prompts import Prompt, SegmentStore, iter_prompts
from replay.core.replay import replay_prompts, store_walks
from replay.core.streams import MODES
from replay.core.sweep import sweep
from replay.times import INF_US

from support.gen import US, random_requests
from support.walks import VARIANTS, partitioned, prompts_of, same


@pytest.mark.parametrize("seed", range(40))
def test_partitioned_rows_equal_the_single_pass(seed):
    """Small alphabets (prefixes collide across tenants, keys, sessions and
    models), ties in time, gaps exactly on, under and over the horizon, empty
    prompts (max_len lets the generator draw them) and outputs."""
    reqs = random_requests(seed, n=5 + seed * 3 % 70, alphabet=3 + seed % 3, max_len=30,
                           models=(None, "m1") if seed % 2 else (None,), jitter_us=(0, 0, -1, 1),
                           gaps=(0, 0, 0, 1, 2, 5, 10))
    prompts = prompts_of(reqs)
    horizon = (INF_US, 5 * US, 2 * US)[seed % 3]
    for parts, depth, size, batch in ((1, 1, 1, 1), (3, 1, 2, 3), (2, 3, 3, 7), (5, 8, 2, 1000), (4, 50, 5, 2)):
        same(prompts, MODES, VARIANTS, horizon, parts, depth, size=size, batch=batch)


@pytest.mark.parametrize("ms", [False, True])
def test_exact_ttl_boundaries_in_ms_and_us(ms):
    """Gaps of exactly the horizon (in µs, or ms logs ×1000) stay hits in every part."""
    reqs = random_requests(7, n=60, alphabet=2, gaps=(0, 1, 5, 10), jitter_us=(0,) if ms else (0, -1, 1))
    prompts = prompts_of(reqs, ms=ms)
    h = 5 * US * (1000 if ms else 1)
    for parts, depth, size in ((2, 1, 2), (3, 4, 3)):
        same(prompts, MODES, VARIANTS, h, parts, depth, size=size, batch=5)


def test_a_cross_partition_prefix_is_found_in_the_shallow_trie():
    """Two prompts sharing 3 tokens with K = 4 land in different partitions; the
    shallow trie must give the second its 3-token hit (and the partition nothing)."""
    def p(i, ts, toks, tenant="a"):
        a = np.array(toks, dtype=np.int32)
        return Prompt(i, ts, tenant, None, None, a, None, None, len(a))
    prompts = [p(0, 0, [1, 2, 3, 4, 5, 6]), p(1, 1, [1, 2, 3, 9, 9, 9], "b"), p(2, 2, [1, 2, 3, 4, 5, 7])]
    router = partition.Router(("global",), parts=64, depth=4)
    homes = {pr.request_id: next(name for name, _ in router.route(pr)[0] if not name.endswith("shallow"))
             for pr in prompts}
    assert homes[0] == homes[2]
    got = same(prompts, ("global",), ("prompt",), INF_US, 64, 4)
    assert [r[6] for r in got[("prompt", "global")]] == [[], [3], [3, 5]]


def test_output_makes_deep_nodes_under_a_short_prompt():
    """prompt+output: a 2-token prompt whose output makes a 6-token path; a later
    prompt matching 5 of them must hit 5 though K = 3 > the first prompt's length."""
    def p(i, ts, toks, out=None):
        a = np.array(toks, dtype=np.int32)
        return Prompt(i, ts, "a", None, None, a, None, None if out is None else np.array(out, np.int32), len(a))
    prompts = [p(0, 0, [1, 2], [3, 4, 5, 6]), p(1, 1, [1, 2, 3, 4, 5, 9])]
    got = same(prompts, ("global",), VARIANTS, INF_US, 16, 3)
    assert got[("prompt+output", "global")][1][6] == [5]


def test_a_conversation_split_across_partitions_is_not_trusted_as_a_path():
    """The previous prompt of a conversation went to another partition: its shared
    prefix is no path of this partition's trie, where another prompt that collides
    in the hash branches off inside it. Trusting it (the ``_known`` shortcut)
    would match 7 symbols where there are 3."""
    def p(i, ts, toks, session, shared=0, previous=None):
        a = np.array(toks, dtype=np.int32)
        return Prompt(i, ts, "a", None, session, a, None, None, len(a), None, shared, previous)
    prompts = [p(0, 0, [1, 2, 3, 4, 5, 6], "s"), p(1, 1, [1, 2, 9, 9, 7, 7, 7], "q"),
               p(2, 2, [1, 2, 3, 9, 7, 7, 7, 5], "s", shared=3, previous=(0, None, "s", None))]
    key = [partition._digest(None, pr.symbols[:4]) for pr in prompts]
    parts = next(n for n in range(2, 500) if key[0] % n != key[2] % n and key[1] % n == key[2] % n)
    got = same(prompts, ("global",), ("prompt",), INF_US, parts, 4)
    assert got[("prompt", "global")][2][6] == [2, 3]


@pytest.mark.parametrize("parts,depth", [(2, 1), (4, 64), (3, 4096)])
def test_sample_partitioned_equals_single_pass(sample_con, parts, depth):
    prompts = list(iter_prompts(sample_con, with_output=True))
    for horizon in (INF_US, 300 * US):
        same(prompts, MODES, VARIANTS, horizon, parts, depth)


@pytest.mark.parametrize("parts,depth", [(2, 1), (4, 64)])
def test_light_prompts_assembled_from_segments_equal_single_pass(sample_con, parts, depth):
    """Light prompts (what the Ray engine ships): text prompts carry segment ids,
    not tokens, and each walker assembles them again from the segments it was sent."""
    prompts = list(iter_prompts(sample_con, with_output=True))
    segments = SegmentStore(sample_con)
    for horizon in (INF_US, 300 * US):
        same(prompts, MODES, VARIANTS, horizon, parts, depth, segments)
    router, full = partition.Router(MODES, parts, depth, travel_light=True), partition.Router(MODES, parts, depth)
    shipped = [router.route(p)[0] for p in prompts]
    for name, q in itertools.chain.from_iterable(shipped):
        assert (q.symbols is None) == (name != f"global/{partition.SHALLOW}"), name
    heavy = [full.route(p)[0] for p in prompts]
    assert len(pickle.dumps(shipped)) < len(pickle.dumps(heavy)) / 5


def test_mooncake_slice_partitioned_equals_single_pass(shared_data, tmp_path):
    """A block trace (negative block ids, token depths via cum): K in blocks."""
    src = shared_data / "mooncake" / "conversation_trace.jsonl"
    path = tmp_path / "mooncake.jsonl"
    with open(src) as f, open(path, "w") as g:
        g.writelines(itertools.islice(f, 1500))
    con = api.open_db(tmp_path / "m.duckdb")
    api.ingest(con, [str(path)])
    prompts = list(iter_prompts(con))
    for parts, depth in ((3, 1), (4, 2), (5, 6)):
        same(prompts, MODES, ("prompt",), INF_US, parts, depth)
    same(prompts, MODES, ("prompt",), INF_US, 3, 2, SegmentStore(con))  # (block traces travel whole)
    same(prompts, ("global",), ("prompt",), 60 * US, 4, 2)
    con.close()


def test_sweep_of_merged_walks_equals_the_single_pass_sweep(sample_con, tmp_path):
    grid = Grid(ttls=(0.0, 60.0, 300.0, math.inf), blocks=(1, 16, 64), min_prefixes=(0, 1024),
                streams=MODES)
    prompts = list(iter_prompts(sample_con))
    store_walks(sample_con, replay_prompts(prompts, MODES, ("prompt",)))
    want = sweep(sample_con, grid, by_stream=True).to_dicts()
    merged, _ = partitioned(prompts, MODES, ("prompt",), INF_US, parts=3, depth=8)
    store_walks(sample_con, merged)
    assert sweep(sample_con, grid, by_stream=True).to_dicts() == want


def test_bad_partition_arguments_are_refused():
    with pytest.raises(ValueError):
        partition.Router(MODES, parts=0)
    with pytest.raises(ValueError):
        partition.Router(MODES, depth=0)
    with pytest.raises(ValueError):
        partition.Router(("nope",))

