"""The mlx-lm cache simulator against (1) a brute-force oracle written from the
rules the dumbest way and (2) mlx-lm's own ``LRUPromptCache`` driven with fake
KV caches (skipped when mlx-lm is absent)."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from replay.providers.mlx_cache import ideal_lcp, simulate_mlx
from support.kernels import mlx_cache_hits as oracle


# ----------------------------------------------------------------- workloads

def random_workload(rng: random.Random, n: int, vocab: int = 6):
    """Conversations that grow, shared system prefixes, exact repeats, tiny
    vocabularies (so chance matches and generated tokens that continue the
    next prompt happen), and very short prompts."""
    prompts, outputs = [], []
    sessions: list[list[int]] = []
    systems = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 8))] for _ in range(3)]
    for _ in range(n):
        r = rng.random()
        if sessions and r < 0.45:
            s = rng.choice(sessions)
            s.extend(rng.randrange(vocab) for _ in range(rng.randrange(0, 6)))
            p = list(s)
        elif prompts and r < 0.55:
            p = list(rng.choice(prompts))  # exact repeat
        elif prompts and r < 0.62:
            q = rng.choice(prompts)
            p = list(q[: rng.randrange(1, len(q) + 1)])  # a prefix of an earlier prompt
        else:
            s = list(rng.choice(systems)) + [rng.randrange(vocab) for _ in range(rng.randrange(0, 10))]
            if not s:
                s = [0]
            sessions.append(s)
            p = list(s)
        if not p:
            p = [rng.randrange(vocab)]
        prompts.append(np.array(p, dtype=np.int64))
        k = rng.choice([0, 1, 1, 1, 2])
        outputs.append(np.array([rng.randrange(vocab) for _ in range(k)], dtype=np.int64))
    return prompts, outputs


@pytest.mark.parametrize("seed", range(40))
def test_simulator_matches_oracle(seed):
    rng = random.Random(seed)
    prompts, outputs = random_workload(rng, 60)
    size = rng.choice([1, 2, 3, 5, 10, None])
    assert simulate_mlx(prompts, outputs, cache_size=size) == oracle(prompts, outputs, size)
    assert simulate_mlx(prompts, None, cache_size=size) == oracle(prompts, None, size)
    cb = rng.choice([20, 50, 200])
    assert simulate_mlx(prompts, outputs, cache_size=size, cache_bytes=cb, bytes_per_token=1) == \
        oracle(prompts, outputs, size, cb, 1)


def test_eviction_happens_and_matters():
    rng = random.Random(1)
    prompts, outputs = random_workload(rng, 200, vocab=50)
    small = simulate_mlx(prompts, outputs, cache_size=2)
    big = simulate_mlx(prompts, outputs, cache_size=None)
    assert sum(small) < sum(big)
    assert sum(big) <= sum(ideal_lcp(prompts)) + len(prompts)  # ideal ignores the exact-match case


def test_rules_by_hand():
    P = np.array([1, 2, 3, 4])
    # repeat: capped at len - 1 (the stored key is P + generated token)
    assert simulate_mlx([P, P], [np.array([9]), np.array([9])]) == [0, 3]
    # the next prompt continues P + generated token → reuse len(P) + 1
    Q = np.array([1, 2, 3, 4, 9, 5])
    assert simulate_mlx([P, Q], [np.array([9]), np.array([7])]) == [0, 5]
    # oldest inserted goes first, a hit does not refresh
    A, B, C = np.array([5, 5, 5]), np.array([6, 6, 6]), np.array([7, 7, 7])
    A2 = np.array([5, 5, 5, 1])
    assert simulate_mlx([A, B, A2, C, A2], [np.array([0])] * 5, cache_size=2) == [0, 0, 3, 0, 3]
    # A, B, C with room for two: A is gone when it comes back
    assert simulate_mlx([A, B, C, A], [np.array([0])] * 4, cache_size=2) == [0, 0, 0, 0]


# ------------------------------------------------------------ mlx-lm's own LRUPromptCache

class _FakeKV:
    """Enough of a KV cache for LRUPromptCache: a token count and its bytes."""

    def __init__(self, n: int, bpt: int):
        self.n, self.bpt = n, bpt

    @property
    def nbytes(self):
        return self.n * self.bpt

    def is_trimmable(self):
        return True

    def trim(self, k):
        k = min(self.n, k)
        self.n -= k
        return k


class _BufKV(_FakeKV):
    """Like mlx's KVCache: trimming moves the offset, the buffer (nbytes) stays."""

    def __init__(self, n, bpt):
        super().__init__(n, bpt)
        self.buf = n

    @property
    def nbytes(self):
        return self.buf * self.bpt


def real_mlx_buf(prompts, outputs, cache_size, cache_bytes=None, bpt=0):
    from mlx_lm.models.cache import LRUPromptCache

    cache = LRUPromptCache(max_size=cache_size if cache_size is not None else 1 << 62)
    hits = []
    for i, p in enumerate(prompts):
        p = [int(x) for x in p]
        out = [int(x) for x in outputs[i]] if outputs is not None else []
        kv, rest = cache.fetch_nearest_cache("m", p)
        hits.append(len(p) - len(rest))
        if cache_bytes is not None:
            active = kv[0].nbytes if kv is not None else 0
            cache.trim_to(n_bytes=cache_bytes - active)
        n_kv = len(p) + len(out)
        cache.insert_cache("m", p + out, [_BufKV(n_kv, bpt)])
    return hits


@pytest.mark.parametrize("seed", range(40))
def test_simulator_matches_mlx_lm_code(seed):
    pytest.importorskip("mlx_lm")
    rng = random.Random(1000 + seed)
    prompts, outputs = random_workload(rng, 60)
    size = rng.choice([1, 2, 3, 5, 10, None])
    assert simulate_mlx(prompts, outputs, cache_size=size) == real_mlx_buf(prompts, outputs, size)
    cb = rng.choice([20, 50, 200])
    assert simulate_mlx(prompts, outputs, cache_size=size, cache_bytes=cb, bytes_per_token=1) == \
        real_mlx_buf(prompts, outputs, size, cb, 1)


def test_fake_kv_is_deepcopyable():
    kv = _BufKV(3, 2)
    assert copy.deepcopy(kv).nbytes == 6
