"""Sweep: TTL × block × minimum prefix × stream mode, from the walks alone.

No replay happens here: the walks of the grid's modes are read once (refused
unless current for the grid's largest TTL) and ``replay.core.hits`` counts hit
tokens and requests hit for every configuration in one pass, so hundreds of
configurations cost milliseconds. ``replay.prepare`` makes the walks current
first; ``replay.api.sweep`` does both.

Beside the hit tokens, the same pass splits them by origin (docs/origin.md):
``hit_same_session`` + ``hit_other_session`` + ``hit_other_tenant`` =
``hit_tokens`` in every row. The stored `results` keep the columns before them.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from replay.core import hits
from replay.core.grid import Grid
from replay.core.streams import ORIGINS
from replay.times import INF_US, seconds
from replay.core.walks import Walks, read_walks
from replay.core.warmup import measured_walks
from replay.store import db
from replay.store.failpoints import failpoint

STORED_COLUMNS = ["stream", "ttl_s", "block", "min_prefix", "requests", "prompt_tokens", "hit_tokens", "hit_ratio",
                  "requests_hit"]  # the columns of `results`
ORIGIN_COLUMNS = [f"hit_{o}" for o in ORIGINS]  # hit tokens by origin, after `requests_hit`
COLUMNS = STORED_COLUMNS + ORIGIN_COLUMNS
STREAM_COLUMNS = ["stream_key", "model"]  # after `stream`, with by_stream
WARMUP_COLUMN = "warmup"  # last, only with a warm-up: the share of the log replayed but not measured


def sweep(con, grid: Grid | None = None, by_stream: bool = False, store: bool = True,
          profile: str = "ideal") -> pl.DataFrame:
    """Hit figures for every configuration of ``grid`` (the ``ideal`` contract).

    ``by_stream=True`` adds the cache's stream key and model (one row per cache
    per configuration). Rows come mode by mode, then TTL, minimum prefix, block
    size (and cache) as in ``grid``; aggregate rows are also stored in `results`.
    With ``grid.warmup`` = f > 0 the figures count only the last 1 − f of the
    requests by time (``replay.core.warmup``; the replay still saw them all),
    rows gain a last ``warmup`` column and are stored as profile ``ideal warmup=f``.
    """
    grid = grid or Grid()
    w = read_walks(con, grid.streams, horizon_us=grid.horizon_us, with_streams=by_stream, with_origins=True)
    w = measured_walks(w, grid.warmup)  # (the replay saw every request; only the measured ones count)
    group, caches, first = _groups(w, len(grid.streams), by_stream)
    n_groups = first[-1]
    req = np.bincount(group, minlength=n_groups)
    ptk = np.bincount(group, weights=w.prompt_tokens, minlength=n_groups).astype(np.int64)
    ttls, blocks, mins = grid.arrays()
    hit, nhit, by_origin = hits.hit_counts(w.offsets, w.gaps, w.depths, group, n_groups, ttls, blocks, mins,
                                           origins=w.origins)
    data = _columns(grid, caches, first, req, ptk, hit, nhit, by_origin, by_stream)
    if store and not by_stream:
        # warm-up figures are another measure: kept beside the whole log's, never over them
        _store(con, data, profile if not grid.warmup else f"{profile} warmup={grid.warmup:g}")
    cols = COLUMNS[:1] + (STREAM_COLUMNS if by_stream else []) + COLUMNS[1:]
    df = pl.DataFrame([pl.Series(c, data[c], dtype=_TYPES[c][1], nan_to_null=(c == "ttl_s")) for c in cols])
    if grid.warmup:  # (a whole-log sweep keeps its columns exactly)
        df = df.with_columns(pl.lit(grid.warmup, dtype=pl.Float64).alias(WARMUP_COLUMN))
    return df


def _groups(w: Walks, n_modes: int, by_stream: bool):
    """The groups the figures are summed over: a mode's requests, or a mode's
    requests of one cache — (stream key, model), numbered mode by mode in sorted
    order. Returns (group per request, each mode's caches, first group of each mode)."""
    if not by_stream:
        return w.mode.astype(np.int64), None, list(range(n_modes + 1))
    group, caches, first = np.empty(len(w), dtype=np.int64), [], [0]
    models = np.array(["" if m is None else "\0" + m for m in w.model], dtype=object)  # None sorts first
    for k in range(n_modes):
        rows = np.flatnonzero(w.mode == k)
        pairs = sorted(set(zip(w.stream[rows].tolist(), models[rows].tolist())))
        index = {p: i for i, p in enumerate(pairs)}
        group[rows] = first[-1] + np.fromiter((index[p] for p in zip(w.stream[rows].tolist(),
                                                                      models[rows].tolist())),
                                              dtype=np.int64, count=len(rows))
        caches.append([(s, m[1:] if m else None) for s, m in pairs])
        first.append(first[-1] + len(pairs))
    return group, caches, first


def _columns(grid: Grid, caches, first, req, ptk, hit, nhit, by_origin, by_stream: bool) -> dict:
    """Every column by array operations, a mode at a time, in the sweep's row order."""
    ttls, blocks, mins = grid.arrays()
    n_t, n_m, n_b = len(ttls), len(mins), len(blocks)
    ttl_s = np.array([np.nan if t >= INF_US else seconds(int(t)) for t in ttls], dtype=np.float64)
    parts: dict[str, list] = {c: [] for c in COLUMNS + STREAM_COLUMNS if c != "hit_ratio"}
    for k, mode in enumerate(grid.streams):
        g0, g1 = first[k], first[k + 1]
        ti, mi, bi, gi = np.indices((n_t, n_m, n_b, g1 - g0)).reshape(4, -1)
        parts["stream"].append([mode] * len(gi))
        if by_stream:  # the cache varies fastest
            parts["stream_key"].append([s for s, _ in caches[k]] * (n_t * n_m * n_b))
            parts["model"].append([m for _, m in caches[k]] * (n_t * n_m * n_b))
        gi = gi + g0
        for col, values in (("ttl_s", ttl_s[ti]), ("block", blocks[bi]), ("min_prefix", mins[mi]),
                            ("requests", req[gi]), ("prompt_tokens", ptk[gi]),
                            ("hit_tokens", hit[gi, ti, mi, bi]), ("requests_hit", nhit[gi, ti, mi, bi]),
                            *((c, by_origin[gi, ti, mi, bi, o]) for o, c in enumerate(ORIGIN_COLUMNS))):
            parts[col].append(values)
    data = {c: [x for p in v for x in p] if c in ("stream", "stream_key", "model") else
            (np.concatenate(v) if v else np.zeros(0)) for c, v in parts.items() if v or c in COLUMNS}
    h, pt = data["hit_tokens"], data["prompt_tokens"]
    data["hit_ratio"] = np.divide(h, pt, out=np.zeros(len(pt)), where=pt > 0)
    return data


def _store(con, data: dict, profile: str) -> None:
    n = len(data["hit_tokens"])
    res = pa.table({"profile": pa.array([profile] * n, pa.string()),  # noqa: F841 (read by DuckDB)
                    **{c: pa.array(data[c], _TYPES[c][0], from_pandas=True) for c in STORED_COLUMNS}})  # NaN -> null
    con.execute("BEGIN TRANSACTION")  # (a run stopped here keeps the profile's previous rows)
    try:
        con.execute("DELETE FROM results WHERE profile = ?", [profile])
        failpoint("sweep.results_deleted")
        con.execute("INSERT INTO results SELECT * FROM res")  # DuckDB reads the Arrow table by name
        con.execute("COMMIT")
    except BaseException:
        db.rollback_quietly(con)
        raise


_STRING, _FLOAT, _INT = (pa.string(), pl.String), (pa.float64(), pl.Float64), (pa.int64(), pl.Int64)
# a column: (its Arrow type, stored; its polars type, returned)
_TYPES = {"stream": _STRING, "stream_key": _STRING, "model": _STRING, "ttl_s": _FLOAT, "block": _INT,
          "min_prefix": _INT, "requests": _INT, "prompt_tokens": _INT, "hit_tokens": _INT,
          "hit_ratio": _FLOAT, "requests_hit": _INT, **{c: _INT for c in ORIGIN_COLUMNS}}
