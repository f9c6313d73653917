"""Sweep stage: TTL × block × minimum prefix × stream mode, from the walks alone.

No replay happens here. For each TTL, ``L_τ`` per request is the deepest step
whose gap is within the TTL; the block and minimum-prefix rules are then plain
arithmetic (semantics.md, "Blocks and minimum prefix"). It runs as one DuckDB
query, so hundreds of configurations cost about as much as a handful.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

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


def ceilings(con, grid: Grid, variant: str = "prompt") -> str:
    """SQL (a CTE list) giving L per (mode, request, ttl) for the grid: relation `ceil`."""
    modes = ", ".join(repr(m) for m in grid.streams)
    return f"""
    {_values('ttls', 'ttl', 'DOUBLE', grid.ttls)},
    w AS (SELECT * FROM walks WHERE variant = {variant!r} AND mode IN ({modes})),
    steps AS (SELECT mode, request_id, unnest(gaps) AS gap, unnest(depths) AS depth FROM w),
    ceil AS (
        SELECT w.mode, w.request_id, w.stream, w.ts, w.prompt_tokens, t.ttl,
               coalesce(max(s.depth) FILTER (WHERE s.gap <= t.ttl), 0) AS L
        FROM w CROSS JOIN ttls t
        LEFT JOIN steps s ON s.mode = w.mode AND s.request_id = w.request_id
        GROUP BY ALL)"""


def sweep(con, grid: Grid | None = None, by_stream: bool = False, store: bool = True,
          profile: str = "ideal") -> pl.DataFrame:
    """Hit figures for every configuration of ``grid`` (the ``ideal`` contract).

    ``by_stream=True`` adds the stream column (one row per stream per configuration).
    """
    grid = grid or Grid()
    _check_walks(con, grid)
    group = "c.mode, c.stream" if by_stream else "c.mode"
    sql = f"""
    WITH {ceilings(con, grid)},
    {_values('blocks', 'block', 'BIGINT', grid.blocks)},
    {_values('mins', 'min_prefix', 'BIGINT', grid.min_prefixes)},
    hits AS (
        SELECT c.*, b.block, m.min_prefix,
               CASE WHEN (c.L // b.block) * b.block < m.min_prefix THEN 0
                    ELSE (c.L // b.block) * b.block END AS hit
        FROM ceil c CROSS JOIN blocks b CROSS JOIN mins m)
    SELECT {group.replace('c.mode', 'c.mode AS stream_mode').replace('c.stream', 'c.stream AS stream_key')},
           CASE WHEN c.ttl = 'infinity'::DOUBLE THEN NULL ELSE c.ttl END AS ttl_s,
           c.block, c.min_prefix,
           count(*) AS requests, sum(c.prompt_tokens)::BIGINT AS prompt_tokens,
           sum(c.hit)::BIGINT AS hit_tokens,
           count(*) FILTER (WHERE c.hit > 0) AS requests_hit
    FROM hits c
    GROUP BY ALL
    """
    df = pl.from_arrow(db.arrow(con, sql))
    df = df.with_columns(
        pl.when(pl.col("prompt_tokens") > 0)
        .then(pl.col("hit_tokens") / pl.col("prompt_tokens"))
        .otherwise(0.0).alias("hit_ratio"))
    df = df.rename({"stream_mode": "stream"})
    order = {m: i for i, m in enumerate(grid.streams)}
    df = (df.with_columns(pl.col("stream").replace_strict(order, return_dtype=pl.Int32).alias("_o"),
                          pl.col("ttl_s").fill_null(math.inf).alias("_t"))
          .sort(["_o", "_t", "block", "min_prefix"] + (["stream_key"] if by_stream else []))
          .drop(["_o", "_t"]))
    cols = ["stream"] + (["stream_key"] if by_stream else []) + [
        "ttl_s", "block", "min_prefix", "requests", "prompt_tokens", "hit_tokens", "hit_ratio",
        "requests_hit"]
    df = df.select(cols)
    if store and not by_stream:
        con.execute("DELETE FROM results WHERE profile = ?", [profile])
        res = df.with_columns(pl.lit(profile).alias("profile")).select(["profile"] + cols).to_arrow()
        con.execute("INSERT INTO results SELECT * FROM res")  # DuckDB reads the Arrow table by name
    return df


def _check_walks(con, grid: Grid) -> None:
    have = {m for (m,) in con.execute("SELECT DISTINCT mode FROM walks WHERE variant='prompt'").fetchall()}
    missing = [m for m in grid.streams if m not in have]
    if missing:
        raise RuntimeError(f"no walks for stream mode(s) {missing}: run the replay stage for them first")
    h = db.get_meta(con, "replay_horizon", "inf")
    horizon = math.inf if h == "inf" else float(h)
    too_long = [t for t in grid.ttls if t > horizon]
    if too_long:
        raise RuntimeError(f"the replay kept state for {format_ttl(horizon)} only; "
                           f"TTL(s) {[format_ttl(t) for t in too_long]} need a longer replay horizon")


def to_records(df: pl.DataFrame) -> list[dict]:
    """Rows as plain dicts for JSON (ttl_s None for inf)."""
    return df.to_dicts()
