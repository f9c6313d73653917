"""Sweep stage: TTL × block × minimum prefix × stream mode, from the walks alone.

No replay happens here. For each TTL, ``L_τ`` per request is the deepest step
whose gap is within the TTL; the block and minimum-prefix rules are then plain
arithmetic (semantics.md, "Blocks and minimum prefix"), vectorised over all
requests at once, so hundreds of configurations cost milliseconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import polars as pl

from . import db

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


def ceiling_arrays(con, grid: Grid, variant: str = "prompt", with_streams: bool = True) -> dict[str, dict]:
    """Per stream mode: the walks as arrays and ``L[ttl]`` per request
    (``stream``, the stream keys, only ``with_streams``).

    Steps are stored gap-ascending with depth ascending, so ``L_τ`` of a request
    is the depth of its last step with gap ≤ τ: count the qualifying steps per
    request and index — no per-request Python, no join. Raises when the walks
    lack a mode of the grid.
    """
    _check_horizon(con, grid)  # (first: its execute() also ends a result the caller left unfinished)
    modes = ", ".join(repr(m) for m in grid.streams)
    # every mode's walks at once, the mode as its place in the grid (numpy only from here:
    # no per-mode filtering of list columns)
    tbl = db.arrow(con, f"""SELECT list_position([{modes}], mode)::INTEGER - 1 AS mode_code,
                                   {'stream, ' if with_streams else ''}prompt_tokens, gaps, depths
                            FROM walks WHERE variant = {variant!r} AND mode IN ({modes})""")
    gaps = tbl.column("gaps").combine_chunks()
    depths = tbl.column("depths").combine_chunks()
    offsets = gaps.offsets.to_numpy().astype(np.int64)
    starts, lengths = offsets[:-1] - offsets[0], np.diff(offsets)
    n = len(tbl)
    g = gaps.flatten().to_numpy(zero_copy_only=False)
    d = depths.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    row = np.repeat(np.arange(n), lengths)
    L = {}
    for ttl in grid.ttls:  # per request, whatever its mode
        cnt = np.bincount(row[g <= ttl], minlength=n)
        last = np.clip(starts + cnt - 1, 0, max(len(d) - 1, 0))
        L[ttl] = np.where(cnt > 0, d[last] if len(d) else 0, 0)
    code = tbl.column("mode_code").to_numpy()
    missing = [m for k, m in enumerate(grid.streams) if not (code == k).any()]
    if missing:
        raise RuntimeError(f"no walks for stream mode(s) {missing}: run the replay stage for them first")
    pt = tbl.column("prompt_tokens").to_numpy().astype(np.int64)
    streams = tbl.column("stream").to_numpy(zero_copy_only=False) if with_streams else None
    out = {}
    for k, mode in enumerate(grid.streams):
        rows = np.flatnonzero(code == k)
        out[mode] = {"prompt_tokens": pt[rows], "L": {ttl: L[ttl][rows] for ttl in grid.ttls}}
        if with_streams:
            out[mode]["stream"] = streams[rows]
    return out


def block_hits(L: np.ndarray, block: int, min_prefix: int) -> np.ndarray:
    """semantics.md: whole blocks only, and nothing below the minimum prefix."""
    h = (L // block) * block
    if min_prefix > 0:
        h = np.where(h < min_prefix, 0, h)
    return h


def sweep(con, grid: Grid | None = None, by_stream: bool = False, store: bool = True,
          profile: str = "ideal") -> pl.DataFrame:
    """Hit figures for every configuration of ``grid`` (the ``ideal`` contract).

    ``by_stream=True`` adds the stream column (one row per stream per configuration).
    Computed from the stored walks with vectorised numpy — hundreds of
    configurations cost milliseconds.
    """
    grid = grid or Grid()
    cols = ["stream"] + (["stream_key"] if by_stream else []) + [
        "ttl_s", "block", "min_prefix", "requests", "prompt_tokens", "hit_tokens", "hit_ratio",
        "requests_hit"]
    # built column by column (polars' row-wise constructor took ~0.1 s on its
    # first use in a process and its expressions ~0.01 s, as much as the rest of
    # a day's sweep)
    data: dict[str, list] = {c: [] for c in cols if c != "hit_ratio"}
    for mode, w in ceiling_arrays(con, grid, with_streams=by_stream).items():
        n, pt = len(w["prompt_tokens"]), w["prompt_tokens"]
        if by_stream:  # per stream key: its requests and prompt tokens
            keys, code = np.unique(w["stream"].astype(str), return_inverse=True)
            keys = keys.tolist()
            req = np.bincount(code, minlength=len(keys)).tolist()
            ptk = np.bincount(code, weights=pt, minlength=len(keys)).astype(np.int64).tolist()
        else:
            keys, req, ptk = None, [n], [int(pt.sum())]
        per = len(req)  # rows per configuration
        blocks = np.asarray(grid.blocks, dtype=np.int64)[:, None]
        for ttl in grid.ttls:
            floored = (w["L"][ttl][None, :] // blocks) * blocks  # every block size at once
            ttl_s = None if ttl == math.inf else float(ttl)
            for m in grid.min_prefixes:
                hm = np.where(floored < m, 0, floored) if m > 0 else floored
                if by_stream:
                    hits = [np.bincount(code, weights=h, minlength=per).astype(np.int64).tolist() for h in hm]
                    nhits = [np.bincount(code, weights=h > 0, minlength=per).astype(np.int64).tolist() for h in hm]
                else:  # all block sizes in one pass
                    hits = [[h] for h in hm.sum(axis=1).tolist()]
                    nhits = [[h] for h in (hm > 0).sum(axis=1).tolist()]
                for bi, b in enumerate(grid.blocks):
                    for col, values in (("stream", [mode] * per), ("ttl_s", [ttl_s] * per),
                                        ("block", [int(b)] * per), ("min_prefix", [int(m)] * per),
                                        ("requests", req), ("prompt_tokens", ptk),
                                        ("hit_tokens", hits[bi]), ("requests_hit", nhits[bi])):
                        data[col].extend(values)
                    if by_stream:
                        data["stream_key"].extend(keys)
    hit = np.asarray(data["hit_tokens"], dtype=np.int64)
    pt = np.asarray(data["prompt_tokens"], dtype=np.int64)
    data["hit_ratio"] = np.divide(hit, pt, out=np.zeros(len(pt)), where=pt > 0)
    if store and not by_stream:
        res = pa.table({c: pa.array(data[c], _TYPES[c][0]) for c in cols})
        con.execute("DELETE FROM results WHERE profile = ?", [profile])
        res_p = res.add_column(0, "profile", pa.array([profile] * len(res), pa.string()))  # noqa: F841
        con.execute("INSERT INTO results SELECT * FROM res_p")  # DuckDB reads the Arrow table by name
    # the frame from the same columns, not from the Arrow table: polars' first
    # conversion from Arrow in a process took 0.02-0.04 s, as much as the rest
    # of a day's sweep; from Python lists and numpy ~0.002 s
    return pl.DataFrame([pl.Series(c, data[c], dtype=_TYPES[c][1]) for c in cols])


_STRING, _FLOAT, _INT = (pa.string(), pl.String), (pa.float64(), pl.Float64), (pa.int64(), pl.Int64)
_TYPES = {"stream": _STRING, "stream_key": _STRING, "ttl_s": _FLOAT, "block": _INT, "min_prefix": _INT,
          "requests": _INT, "prompt_tokens": _INT, "hit_tokens": _INT, "hit_ratio": _FLOAT,
          "requests_hit": _INT}  # a sweep column: (its Arrow type, stored; its polars type, returned)


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
