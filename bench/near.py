"""Benchmark: near duplicates — reading the last user turns, embedding them,
searching — against a naive search in the same run.

    python bench/near.py --db /tmp/w/replay.duckdb --json   # a database bench/pipeline.py kept

Stages, timed in this process: ``turns`` (every replayable request's last user
turn read back from its body), ``embed`` (the unique texts through the
packaged model), ``search`` (``near.best_earlier`` for each stream mode at
the TTLs 5 min, 1 h and ∞). The naive search computes every pair of a group
with every mask (no windows), on the first ``--naive-requests`` requests only
(it is quadratic in memory traffic too); both must give the same best
similarities there (``naive_results_identical``), and ``speedup_vs_naive``
compares the two on that part.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TTLS = (300.0, 3600.0, math.inf)
MODES = ("tenant", "global")


def naive_best(vectors, ts, groups, ttls_us):
    """Every earlier pair of a group, every mask: the definition, with no window."""
    best = np.full((len(ttls_us), len(ts)), -np.inf, dtype=np.float32)
    has_text = np.linalg.norm(vectors, axis=1) > 0
    for g in np.unique(groups):
        rows = np.flatnonzero((groups == g) & has_text)
        v, t = vectors[rows], ts[rows]
        for start in range(0, len(rows), 256):
            end = min(start + 256, len(rows))
            sims = v[start:end] @ v[:end].T
            earlier = np.arange(end)[None, :] < np.arange(start, end)[:, None]
            for ti, ttl in enumerate(ttls_us):
                ok = earlier & (t[start:end, None] - t[None, :end] <= ttl)
                best[ti, rows[start:end]] = np.where(ok, sims, -np.inf).max(axis=1)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--naive-requests", type=int, default=20_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from replay import api
    from replay.analysis import near
    from replay.times import ttl_us

    con = api.open_db(a.db)
    out = {}
    t0 = time.perf_counter()
    df = near.turns(con)
    out["requests"], out["turns_s"] = len(df), time.perf_counter() - t0
    embed = near.load_embedder()
    texts = df["text"].to_list()
    unique = sorted({x for x in texts if x})
    t0 = time.perf_counter()
    vecs = embed(unique)
    out["unique_texts"], out["embed_s"] = len(unique), time.perf_counter() - t0
    index = {x: i for i, x in enumerate(unique)}
    vectors = np.zeros((len(texts), vecs.shape[1]), dtype=np.float32)
    for i, x in enumerate(texts):
        if x:
            vectors[i] = vecs[index[x]]
    ts, ttls = df["ts"].to_numpy(), [ttl_us(t) for t in TTLS]
    out["search_s"], identical, ratios = {}, True, {}
    for mode in MODES:
        groups = near.cache_groups(df, mode)
        t0 = time.perf_counter()
        near.best_earlier(vectors, ts, groups, ttls)
        out["search_s"][mode] = time.perf_counter() - t0
        k = min(a.naive_requests, len(ts))
        t0 = time.perf_counter()
        fast = near.best_earlier(vectors[:k], ts[:k], groups[:k], ttls)
        fast_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        slow = naive_best(vectors[:k], ts[:k], groups[:k], ttls)
        ratios[mode] = (time.perf_counter() - t0) / fast_s
        # (the same dot products, summed by BLAS in blocks of another shape: equal to float32 rounding)
        identical &= bool(np.array_equal(np.isinf(fast), np.isinf(slow))
                          and np.allclose(fast[~np.isinf(fast)], slow[~np.isinf(slow)], rtol=0, atol=1e-5))
    out["total_s"] = out["turns_s"] + out["embed_s"] + sum(out["search_s"].values())
    out["naive_requests"], out["naive_results_identical"], out["speedup_vs_naive"] = \
        min(a.naive_requests, len(ts)), identical, ratios
    print(json.dumps(out, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
