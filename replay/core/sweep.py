"""Sweep stage: TTL × block × minimum prefix × stream mode, from the walks alone.

No replay happens here. For each TTL, ``L_τ`` per request is the deepest step
whose gap is within the TTL; the block and minimum-prefix rules are then plain
arithmetic (semantics.md, "Blocks and minimum prefix"), counted for every
configuration in one pass over the walks (:func:`hit_counts`), so hundreds of
configurations cost milliseconds.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import polars as pl

from replay.store import db

try:  # the same counts in one compiled pass (replay/_sweep.pyx), where it is built
    from replay.core._hits import hit_counts as _compiled_hit_counts
except ImportError:
    _compiled_hit_counts = None
if os.environ.get("REPLAY_PURE_SWEEP"):
    _compiled_hit_counts = None

DEFAULT_TTLS = (300.0, 1800.0, 3600.0, math.inf)
DEFAULT_BLOCKS = (1, 16, 512)
DEFAULT_MIN_PREFIXES = (0, 1024)
DEFAULT_STREAMS = ("tenant", "key", "global")

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str | float) -> float:
    """'5m' → 300, '1h' → 3600, '90' → 90 (seconds), 'inf' → ∞."""
    if isinstance(text, (int, float)):
        return float(text)
    s = text.strip().lower()
    if s in ("inf", "infinity", "none", "∞"):
        return math.inf
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", s)
    if not m:
        raise ValueError(f"bad TTL {text!r}: use a number of seconds or a unit s/m/h/d, or 'inf'")
    return float(m.group(1)) * _UNITS[m.group(2)]


def format_ttl(ttl: float | None) -> str:
    if ttl is None or ttl == math.inf:
        return "inf"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if ttl >= size and ttl % size == 0:
            return f"{int(ttl // size)}{unit}"
    return f"{ttl:g}s"


@dataclass
class Grid:
    ttls: tuple[float, ...] = DEFAULT_TTLS
    blocks: tuple[int, ...] = DEFAULT_BLOCKS
    min_prefixes: tuple[int, ...] = DEFAULT_MIN_PREFIXES
    streams: tuple[str, ...] = DEFAULT_STREAMS

    @property
    def size(self) -> int:
        return len(self.ttls) * len(self.blocks) * len(self.min_prefixes) * len(self.streams)


def _values(name: str, col: str, typ: str, values) -> str:
    rows = ", ".join(f"({'CAST(' + repr('infinity') + ' AS DOUBLE)' if v == math.inf else v})" for v in values)
    return f"{name}({col}) AS (SELECT CAST({col} AS {typ}) FROM (VALUES {rows}) v({col}))"


@dataclass
class Walks:
    """The stored walks of the grid's stream modes, flat: request ``r``'s steps are
    ``gaps[offsets[r]:offsets[r + 1]]`` (ascending) and the depths beside them."""
    mode: np.ndarray           # the request's stream mode, as its place in the grid
    stream: np.ndarray | None  # its stream key (only when asked for)
    prompt_tokens: np.ndarray  # int64
    offsets: np.ndarray        # int64, n + 1, from 0
    gaps: np.ndarray           # float64
    depths: np.ndarray         # int64


def read_walks(con, grid: Grid, variant: str = "prompt", with_streams: bool = True) -> Walks:
    """The walks of ``grid``'s stream modes; raises when a mode was not walked
    or a TTL is beyond the replay's horizon."""
    _check_horizon(con, grid)  # (first: its execute() also ends a result the caller left unfinished)
    modes = ", ".join(repr(m) for m in grid.streams)
    # every mode's walks at once, the mode as its place in the grid (numpy only from here:
    # no per-mode filtering of list columns)
    tbl = db.arrow(con, f"""SELECT list_position([{modes}], mode)::INTEGER - 1 AS mode_code,
                                   {'stream, ' if with_streams else ''}prompt_tokens, gaps, depths
                            FROM walks WHERE variant = {variant!r} AND mode IN ({modes})""")
    code = tbl.column("mode_code").to_numpy()
    missing = [m for m, n in zip(grid.streams, np.bincount(code, minlength=len(grid.streams))) if n == 0]
    if missing:
        raise RuntimeError(f"no walks for stream mode(s) {missing}: run the replay stage for them first")
    gaps = tbl.column("gaps").combine_chunks()
    offsets = gaps.offsets.to_numpy().astype(np.int64)
    return Walks(
        mode=code, stream=tbl.column("stream").to_numpy(zero_copy_only=False) if with_streams else None,
        prompt_tokens=tbl.column("prompt_tokens").to_numpy().astype(np.int64),
        offsets=offsets - offsets[0],
        gaps=gaps.flatten().to_numpy(zero_copy_only=False).astype(np.float64, copy=False),
        depths=tbl.column("depths").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64))


def hit_counts(w: Walks, group: np.ndarray, n_groups: int, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Hit tokens and requests hit per group of requests and configuration, as two
    int64 arrays indexed [group, TTL, minimum prefix, block] (``grid``'s order).

    A request's ``L_τ`` is the depth of its last step with gap ≤ τ (steps are
    stored gap-ascending, depth ascending); its hit is ``L_τ`` floored to whole
    blocks, nothing below the minimum prefix (semantics.md, "Blocks and minimum
    prefix")."""
    ttls, blocks, mins = _grid_arrays(grid)
    group = np.ascontiguousarray(group, dtype=np.int64)
    if _compiled_hit_counts is not None:
        return _compiled_hit_counts(w.offsets, w.gaps, w.depths, group, n_groups, ttls, blocks, mins)
    return hit_counts_numpy(w, group, n_groups, ttls, blocks, mins)


def hit_counts_numpy(w: Walks, group, n_groups: int, ttls, blocks, mins) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hit_counts` with array operations (where the compiled one is not built)."""
    n, n_b = len(w.offsets) - 1, len(blocks)
    shape = (n_groups, len(ttls), len(mins), n_b)
    hits, nhit = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    # requests ordered by group, so that a group's sums are one np.add.reduceat
    # over a contiguous run (exact in int64)
    order = np.argsort(group, kind="stable")
    sizes = np.bincount(group, minlength=n_groups)
    present = np.flatnonzero(sizes)
    bounds = (np.cumsum(sizes) - sizes)[present]
    starts = w.offsets[:-1]
    row = np.repeat(np.arange(n), np.diff(w.offsets))
    for ti, ttl in enumerate(ttls):
        cnt = np.bincount(row[w.gaps <= ttl], minlength=n)  # steps within the TTL
        L = np.zeros(n, dtype=np.int64)
        L[cnt > 0] = w.depths[(starts + cnt - 1)[cnt > 0]]
        L = L[order]
        floored = (L[None, :] // blocks[:, None]) * blocks[:, None]  # every block size at once
        for mi, m in enumerate(mins):
            hm = np.where(floored < m, 0, floored) if m > 0 else floored
            if len(present):
                hits[present, ti, mi] = np.add.reduceat(hm, bounds, axis=1).T
                nhit[present, ti, mi] = np.add.reduceat((hm > 0).astype(np.int64), bounds, axis=1).T
    return hits, nhit


def sweep(con, grid: Grid | None = None, by_stream: bool = False, store: bool = True,
          profile: str = "ideal") -> pl.DataFrame:
    """Hit figures for every configuration of ``grid`` (the ``ideal`` contract).

    ``by_stream=True`` adds the stream column (one row per stream per configuration).
    Computed from the stored walks in one pass (:func:`hit_counts`) — hundreds of
    configurations cost milliseconds. Rows come mode by mode, then TTL, minimum
    prefix, block size (and stream key) as in ``grid``.
    """
    grid = grid or Grid()
    cols = ["stream"] + (["stream_key"] if by_stream else []) + [
        "ttl_s", "block", "min_prefix", "requests", "prompt_tokens", "hit_tokens", "hit_ratio",
        "requests_hit"]
    w = read_walks(con, grid, with_streams=by_stream)
    # the groups the figures are summed over: a mode's requests, or a mode's
    # requests of one stream key (numbered mode by mode, keys in sorted order)
    if by_stream:
        group, keys, first = np.empty(len(w.mode), dtype=np.int64), [], [0]
        for k in range(len(grid.streams)):
            rows = np.flatnonzero(w.mode == k)
            mode_keys, local = np.unique(w.stream[rows].astype(str), return_inverse=True)
            group[rows] = first[-1] + local
            keys.append(mode_keys.tolist())
            first.append(first[-1] + len(mode_keys))
    else:
        group, keys, first = w.mode, None, list(range(len(grid.streams) + 1))
    n_groups = first[-1]
    req = np.bincount(group, minlength=n_groups)
    ptk = np.bincount(group, weights=w.prompt_tokens, minlength=n_groups).astype(np.int64)
    hits, nhit = hit_counts(w, group, n_groups, grid)
    # every column by array operations, a mode at a time (not a Python list
    # extended per configuration and column: with the counts compiled, the rows
    # were what was left of a day's sweep beside DuckDB's reads and writes)
    ttls, blocks, mins = _grid_arrays(grid)
    n_t, n_m, n_b = len(ttls), len(mins), len(blocks)
    parts: dict[str, list] = {c: [] for c in cols if c != "hit_ratio"}
    for k, mode in enumerate(grid.streams):
        g0, g1 = first[k], first[k + 1]
        ti, mi, bi, gi = np.indices((n_t, n_m, n_b, g1 - g0)).reshape(4, -1)
        parts["stream"].append([mode] * len(gi))
        if by_stream:
            parts["stream_key"].append(keys[k] * (n_t * n_m * n_b))  # the key varies fastest
        gi = gi + g0
        for col, values in (("ttl_s", ttls[ti]), ("block", blocks[bi]), ("min_prefix", mins[mi]),
                            ("requests", req[gi]), ("prompt_tokens", ptk[gi]),
                            ("hit_tokens", hits[gi, ti, mi, bi]), ("requests_hit", nhit[gi, ti, mi, bi])):
            parts[col].append(values)
    data = {c: [x for p in v for x in p] if c in ("stream", "stream_key") else np.concatenate(v)
            for c, v in parts.items()}
    data["ttl_s"][np.isinf(data["ttl_s"])] = np.nan  # ∞ is a null TTL
    hit, pt = data["hit_tokens"], data["prompt_tokens"]
    data["hit_ratio"] = np.divide(hit, pt, out=np.zeros(len(pt)), where=pt > 0)
    if store and not by_stream:
        res = pa.table({"profile": pa.array([profile] * len(hit), pa.string()),  # noqa: F841 (read by DuckDB)
                        **{c: pa.array(data[c], _TYPES[c][0], from_pandas=True) for c in cols}})  # NaN -> null
        con.execute("DELETE FROM results WHERE profile = ?", [profile])
        con.execute("INSERT INTO results SELECT * FROM res")  # DuckDB reads the Arrow table by name
    # the frame from the same columns, not from the Arrow table: polars' first
    # conversion from Arrow in a process took 0.02-0.04 s, as much as the rest
    # of a day's sweep; from Python lists and numpy ~0.002 s
    return pl.DataFrame([pl.Series(c, data[c], dtype=_TYPES[c][1], nan_to_null=(c == "ttl_s")) for c in cols])


_STRING, _FLOAT, _INT = (pa.string(), pl.String), (pa.float64(), pl.Float64), (pa.int64(), pl.Int64)
_TYPES = {"stream": _STRING, "stream_key": _STRING, "ttl_s": _FLOAT, "block": _INT, "min_prefix": _INT,
          "requests": _INT, "prompt_tokens": _INT, "hit_tokens": _INT, "hit_ratio": _FLOAT,
          "requests_hit": _INT}  # a sweep column: (its Arrow type, stored; its polars type, returned)


def _grid_arrays(grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.asarray(grid.ttls, dtype=np.float64), np.asarray(grid.blocks, dtype=np.int64),
            np.asarray(grid.min_prefixes, dtype=np.int64))


def _check_horizon(con, grid: Grid) -> None:
    h = db.get_meta(con, "replay_horizon", "inf")
    horizon = math.inf if h == "inf" else float(h)
    too_long = [t for t in grid.ttls if t > horizon]
    if too_long:
        raise RuntimeError(f"the replay kept state for {format_ttl(horizon)} only; "
                           f"TTL(s) {[format_ttl(t) for t in too_long]} need a longer replay horizon")


def to_records(df: pl.DataFrame) -> list[dict]:
    """Rows as plain dicts for JSON (ttl_s None for inf)."""
    return df.to_dicts()
