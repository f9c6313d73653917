"""Random request logs for oracle tests: small alphabets so prefixes collide often.

Times are integer microseconds; gaps are drawn in whole seconds and, with
``jitter_us``, moved by a few microseconds, so that gaps land exactly on, just
under and just over the TTLs the tests sweep."""

from __future__ import annotations

import random

import pytest

from support.oracle import OracleRequest

US = 1_000_000


def random_requests(seed: int, n: int, alphabet: int = 5, max_len: int = 40,
                    tenants="ab", keys=(None, "k1", "k2"), sessions=(None, "s1", "s2", "s3"),
                    gaps=(0, 0, 1, 2, 5, 10, 30), shuffle_times: bool = True, models=(None,),
                    jitter_us=(0,)) -> list[OracleRequest]:
    rng = random.Random(seed)
    bases = [[rng.randrange(alphabet) for _ in range(rng.randrange(0, max_len))] for _ in range(4)]
    reqs: list[OracleRequest] = []
    t = 0
    for _ in range(n):
        t += rng.choice(gaps) * US + rng.choice(jitter_us)
        t = max(t, 0)
        base = list(rng.choice(reqs).tokens) if reqs and rng.random() < 0.4 else list(rng.choice(bases))
        cut = rng.randrange(len(base) + 1)
        tokens = base[:cut] + [rng.randrange(alphabet) for _ in range(rng.randrange(0, 8))]
        reqs.append(OracleRequest(
            ts=t, tokens=tokens, tenant=rng.choice(tenants), key=rng.choice(keys),
            session=rng.choice(sessions), model=rng.choice(models),
            output=[rng.randrange(alphabet) for _ in range(rng.randrange(0, 4))]))
    if shuffle_times:  # input order is not time order: the replay must sort (stably)
        rng.shuffle(reqs)
    return reqs


#: TTLs (µs) the oracle tests sweep: gaps of the generator fall exactly on them
TTLS_US = tuple(s * US for s in (0, 1, 2, 5, 10, 30)) + (2**63 - 1,)


def use_engine(request, monkeypatch, module, what: str) -> str:
    """For a fixture parametrized by engine: "compiled" runs with ``module``'s
    compiled part (skipped where it is not built), any other value without it."""
    if request.param == "compiled" and module._compiled is None:
        pytest.skip(f"the compiled {what} is not built here")
    if request.param != "compiled":
        monkeypatch.setattr(module, "_compiled", None)
    return request.param
