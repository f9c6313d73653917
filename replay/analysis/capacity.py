"""How much memory, how many replicas: the hit ratio of a finite cache, per configuration.

The database's entry (``capacity``): the prompts read back from the DuckDB file
(after ``prepare``) go through ``replay.analysis.capacity_rows``, which makes
every row, and come back as a polars frame.
"""

from __future__ import annotations

import polars as pl

from replay.analysis.buy import CostModel
from replay.analysis.capacity_rows import (ALL_ROUTINGS, COLUMNS, POLICIES, CapacityGrid,  # noqa: F401
                                           capacity_rows, types)
from replay.core.prompts import REPLAYABLE, iter_prompts
from replay.prepare import prepare

_POLARS = {"str": pl.String, "int": pl.Int64, "float": pl.Float64,
           "tiers": pl.List(pl.Struct({"tier": pl.String, "tokens": pl.Int64}))}


def capacity(con, grid: CapacityGrid | None = None, bytes_per_token: int | None = None, tokenizer=None,
             progress: bool = False, cost: CostModel | None = None) -> pl.DataFrame:
    """The rows of :data:`COLUMNS` for every configuration of ``grid``: per replica
    a pool of ``capacity_blocks`` blocks (``capacity_bytes`` with
    ``bytes_per_token``); ``warm_hit_ratio`` over the last half of the requests
    (processing order); ``max_replica_share`` the busiest replica's share of
    the requests. Belady with prefix routing has no row (its future would
    depend on the routing being simulated). With ``grid.warmup`` = f > 0,
    requests, prompt_tokens, hit_tokens and hit_ratio count only the last
    1 − f of the requests by time (the pass still sees them all) and a last
    ``warmup`` column says so; warm_hit_ratio stays the last half's and
    max_replica_share all requests'. With ``grid.tiers`` each row is one tier
    configuration (``capacity_blocks``/``capacity_bytes``: its first tier's)
    with columns ``tiers`` and ``tier_hit_tokens`` (tokens each tier serves,
    adding up to hit_tokens); with ``cost``, the :data:`COST_KEYS` of
    ``replay.analysis.buy``."""
    grid = grid or CapacityGrid()
    prepare(con, modes=(), tokenizer=tokenizer, progress=progress)
    n = con.execute(f"SELECT count(*) FROM requests r LEFT JOIN prompts p USING (request_id) "
                    f"WHERE {REPLAYABLE}").fetchone()[0]
    rows = capacity_rows(iter_prompts(con), n, grid, bytes_per_token, cost)
    return pl.DataFrame(rows, schema={c: _POLARS[t] for c, t in types(grid, cost).items()}, orient="row")
