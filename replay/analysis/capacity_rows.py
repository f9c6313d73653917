"""The rows of a capacity grid from prompts in processing order — no database.

What ``replay.analysis.capacity`` computes once the prompts are read (one pass
over them per (stream mode, replicas, routing) gives every TTL and every
capacity at once for LRU with routing decided in advance; ``prefix`` routing
and ``belady`` eviction are simulated per capacity on block logs gathered in
the same read). It takes any iterable of prompts, so the database path
(``capacity``) and the direct read of a hash-id trace (``replay capacity``
without a database: ``replay.readers.direct``) share every line that makes a
row. Capacities written as sizes become block counts through
``replay.providers.kv``; ``auto`` is one log-spaced grid per (stream mode,
block size), shared by every row of it so routings compare at equal memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from replay.analysis.buy import COST_KEYS, CostModel, cost_figures
from replay.core.capacity import ROUTINGS, CapacityPass, Router, Segments, counts, hit_blocks
from replay.core.prompt import Prompt
from replay.core.sampled import SampledPass, SampledRefs, sampled_counts
from replay.core.simulate import POLICIES as EVICTION_POLICIES, BlockLogBuilder, simulate
from replay.core.streams import check_modes, stream_key
from replay.core.tiers import TierSpec, check_tiers, format_tiers, tier_depths
from replay.times import INF_US, ttl_us
from replay.core.warmup import parse_warmup, warmup_count
from replay.providers.kv import auto_capacities, blocks_for, parse_size

COLUMNS = ["stream", "ttl_s", "block", "capacity_blocks", "capacity_bytes", "replicas", "routing", "policy",
           "requests", "prompt_tokens", "hit_tokens", "hit_ratio", "warm_hit_ratio", "max_replica_share"]
#: each column's type ("str", "int", "float"; "tiers": a list of {tier, tokens}), in order:
#: the polars schema of ``capacity`` and the JSON of the direct path are both made from it
TYPES = {"stream": "str", "ttl_s": "float", "block": "int", "capacity_blocks": "int", "capacity_bytes": "int",
         "replicas": "int", "routing": "str", "policy": "str", "requests": "int", "prompt_tokens": "int",
         "hit_tokens": "int", "hit_ratio": "float", "warm_hit_ratio": "float", "max_replica_share": "float"}
#: a row's extra columns with tiers: the tiers as written (fastest first) and the hit tokens each serves
TIER_TYPES = {"tiers": "str", "tier_hit_tokens": "tiers"}
COST_TYPES = {k: "str" if k == "gpu" else "int" if k.startswith("gpus_") else "float" for k in COST_KEYS}
SORT = ("stream", "replicas", "routing", "policy", "block", "ttl_s", "capacity_blocks")  # ttl_s None (∞) last
ALL_ROUTINGS = ROUTINGS + ("prefix",)
POLICIES = tuple(EVICTION_POLICIES)  # ("lru", "belady")


@dataclass
class CapacityGrid:
    """Block sizes (tokens), capacities as written (a block count, a size such as
    ``40GiB``, or ``auto``), TTLs (seconds, ``math.inf`` for none), stream
    modes, replica counts, routings (``round-robin``, ``random``, ``sticky``,
    ``prefix``) and eviction policies (``lru``, ``belady``; belady only with
    routing decided in advance); ``seed`` for random routing."""
    blocks: tuple[int, ...] = (16,)
    capacities: tuple[str, ...] = ("auto",)
    ttls: tuple[float, ...] = (math.inf,)
    streams: tuple[str, ...] = ("global",)
    replicas: tuple[int, ...] = (1,)
    routings: tuple[str, ...] = ("round-robin",)
    policies: tuple[str, ...] = ("lru",)
    seed: int = 0
    sample_rate: float | None = None
    auto_points: int = 16  # how many capacities ``auto`` spans (log-spaced)
    warmup: float = 0.0  # share of the log (by time) replayed but not measured (replay.core.warmup)
    # memory tiers, fastest first, one tuple of TierSpec per configuration (replay.core.tiers):
    # when given, the rows are these configurations' instead of ``capacities``'
    tiers: tuple[tuple[TierSpec, ...], ...] = ()

    def __post_init__(self):
        self.streams = check_modes(self.streams)
        if any(b < 1 for b in self.blocks):
            raise ValueError("block sizes must be ≥ 1")
        if any(r < 1 for r in self.replicas):
            raise ValueError("replicas must be ≥ 1")
        bad = [r for r in self.routings if r not in ALL_ROUTINGS]
        if bad:
            raise ValueError(f"unknown routing(s) {bad}; choose from {', '.join(ALL_ROUTINGS)}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad:
            raise ValueError(f"unknown policy(ies) {bad}; choose from {', '.join(POLICIES)}")
        for c in self.capacities:
            parse_size(c)
        self.warmup = parse_warmup(self.warmup)
        if self.sample_rate is not None and self.warmup:
            raise ValueError("a sampled run measures the whole log: drop the warm-up or the sample rate")
        if self.sample_rate is not None:
            if not 0 < self.sample_rate <= 1:
                raise ValueError("the sample rate must be in (0, 1]")
            if "belady" in self.policies or ("prefix" in self.routings and max(self.replicas) > 1):
                raise ValueError("a sampled run estimates LRU with routing decided in advance: "
                                 "drop belady and prefix routing, or the sample rate")

        for t in self.tiers:
            check_tiers(t)
            for spec in t:
                if parse_size(spec.size)[0] == "auto":
                    raise ValueError(f"tier {spec.name}: a size, not 'auto'")
        if self.tiers and (self.sample_rate is not None or "belady" in self.policies
                           or ("prefix" in self.routings and max(self.replicas) > 1)):
            raise ValueError("tiers are computed exactly for LRU with routing decided in advance: "
                             "drop belady, prefix routing and the sample rate")

    @property
    def pooled(self) -> bool:
        return any(t[-1].pooled for t in self.tiers)

    @property
    def horizon_us(self) -> int:
        return max((ttl_us(t) for t in self.ttls), default=INF_US)

    def routings_for(self, replicas: int) -> tuple[str, ...]:
        """The routings that differ at this replica count (one replica: all the same,
        simulated as round-robin)."""
        return self.routings if replicas > 1 else ("round-robin",)

    def simulated(self, replicas: int, routing: str, policy: str) -> bool:
        return policy == "belady" or (routing == "prefix" and replicas > 1)


def types(grid: CapacityGrid, cost: CostModel | None) -> dict[str, str]:
    """The columns of the grid's rows and their types, in order (``warmup`` last when measured after one)."""
    return TYPES | (TIER_TYPES if grid.tiers else {}) | (COST_TYPES if cost else {}) | (
        {"warmup": "float"} if grid.warmup else {})


def capacity_rows(prompts: Iterable[Prompt], n: int, grid: CapacityGrid | None = None,
                  bytes_per_token: int | None = None, cost: CostModel | None = None) -> list[tuple]:
    """The rows (tuples in the order of :func:`types`) for every configuration of
    ``grid``, sorted by :data:`SORT`, from ``prompts`` — the ``n`` replayable
    requests in processing order. What the rows mean: ``replay.analysis.capacity.capacity``."""
    grid = grid or CapacityGrid()
    configs = [(m, r, ro) for m in grid.streams for r in grid.replicas for ro in grid.routings_for(r)]
    ttls = [ttl_us(t) for t in grid.ttls]
    passes = {(m, r, ro): (CapacityPass(m, grid.blocks, r, grid.horizon_us) if grid.sample_rate is None
                           else SampledPass(m, grid.blocks, r, grid.sample_rate, grid.seed, ttls, n))
              for m, r, ro in configs if ro != "prefix"}
    for m in grid.streams if grid.pooled else ():  # a pooled tier's stack: every request on one replica
        passes.setdefault((m, 1, "round-robin"), CapacityPass(m, grid.blocks, 1, grid.horizon_us))
    needs_logs = any(grid.simulated(r, ro, p) for _, r, ro in configs for p in grid.policies)
    logs = {(m, b): BlockLogBuilder(m, b) for m in grid.streams for b in grid.blocks} if needs_logs else {}
    n = _read(prompts, passes, logs, grid.seed, n)
    segments = {k: cp.result() for k, cp in passes.items()}
    caps = _capacities(grid, segments, logs, bytes_per_token)
    rows = []
    for m, r, ro in configs:
        for policy in grid.policies:
            if policy == "belady" and ro == "prefix" and r > 1:
                continue
            for b in grid.blocks:
                key = (m, b)
                labels = grid.routings if r == 1 else (ro,)  # (one replica: every routing is the same)
                if grid.tiers:
                    pool = segments[(m, 1, "round-robin")][b] if grid.pooled else None
                    for routing in labels:
                        rows += _tier_rows(segments[(m, r, ro)][b], pool, grid, m, r, routing, b, bytes_per_token,
                                           n, cost)
                    continue
                if grid.simulated(r, ro, policy):
                    costs = {} if cost else None  # (filled by the simulation: its per-request hits)
                    figures = _simulated(logs[key].log, grid, caps[key], r, ro, policy, n, cost, costs)
                else:
                    figures = _one_pass(segments[(m, r, ro)][b], grid, caps[key], n)
                    costs = _plain_costs(segments[(m, r, ro)][b], grid, caps[key], cost) if cost else None
                for routing in labels:
                    rows += _rows(figures, grid, m, r, routing, policy, b, caps[key], bytes_per_token, n, costs)
    key = _sort_key(list(types(grid, cost)))
    rows.sort(key=key)  # (stable: rows that tie keep the order they were made in)
    if grid.warmup:  # (a whole-log run keeps its columns exactly)
        rows = [r + (float(grid.warmup),) for r in rows]
    return rows


def _sort_key(columns: list[str]):
    at = [columns.index(c) for c in SORT]
    return lambda r: tuple((r[i] is None, 0 if r[i] is None else r[i]) for i in at)


def row_dicts(rows: list[tuple], grid: CapacityGrid, cost: CostModel | None = None) -> list[dict]:
    """The rows as the polars frame of ``capacity`` gives them (``to_dicts``): each
    value of its column's type, None kept."""
    cols = types(grid, cost)
    cast = {"int": int, "float": float, "str": str, "tiers": lambda v: [dict(e) for e in v]}
    conv = [(c, cast[t]) for c, t in cols.items()]
    return [{c: None if v is None else f(v) for (c, f), v in zip(conv, r)} for r in rows]


def _read(prompts: Iterable[Prompt], passes: dict, logs: dict, seed: int, n: int) -> int:
    """Feed every pass and block log the ``n`` prompts, read once; returns how many there were."""
    routers = {k: Router(k[1], k[2], seed, n) for k in passes}
    i = -1
    for i, p in enumerate(prompts):
        held: dict = {}  # (the request's new symbols, copied once for all the passes)
        for k, cp in passes.items():
            cp.add(p, routers[k](i, stream_key(k[0], p.tenant, p.key, p.session)), held)
        for builder in logs.values():
            builder.add(p)
    return i + 1


def _capacities(grid: CapacityGrid, segments: dict, logs: dict, bytes_per_token: int | None) -> dict:
    """Per (stream mode, block): the capacities of the grid in blocks, ``auto``
    spanning up to the largest working set any replica has in any configuration."""
    out = {}
    for m in grid.streams:
        for b in grid.blocks:
            ws = max([int(s[b].working_set.max()) for k, s in segments.items() if k[0] == m and len(s[b].working_set)]
                     + [logs[(m, b)].log.distinct if (m, b) in logs else 0] + [1])
            caps = set()
            for spec in grid.capacities:
                kind, value = parse_size(spec)
                caps |= (set(auto_capacities(ws, grid.auto_points)) if kind == "auto"
                         else {max(0, blocks_for(kind, value, b, bytes_per_token))})
            out[(m, b)] = sorted(caps)
    return out


@dataclass
class _Figures:
    """Hit tokens [TTL, capacity] of the measured requests, the same over the
    warm half, the busiest replica's share [TTL, capacity], and the prompt
    tokens (measured, warm half) and how many requests were measured."""
    hit: np.ndarray
    warm_hit: np.ndarray
    share: np.ndarray
    prompt: int
    warm_prompt: int
    measured: int = -1  # -1: every request


def _measured(n: int, grid: CapacityGrid) -> np.ndarray:
    """Which of ``n`` requests (processing order) are measured under the grid's warm-up."""
    return np.arange(n) >= warmup_count(n, grid.warmup)


def _one_pass(seg: Segments | SampledRefs, grid: CapacityGrid, caps: list[int], n: int) -> _Figures:
    warm = np.arange(len(seg)) >= len(seg) // 2
    ttls = [ttl_us(t) for t in grid.ttls]
    if isinstance(seg, SampledRefs):
        hit, whit = sampled_counts(seg, ttls, caps)
    else:
        hit, _, whit = counts(seg, ttls, caps, warm)
    share = float(np.bincount(seg.replica).max() / n) if n else 0.0
    meas = _measured(len(seg), grid)
    if grid.warmup and not isinstance(seg, SampledRefs):
        hit = whit if np.array_equal(meas, warm) else counts(seg, ttls, caps, meas)[2]
    return _Figures(hit, whit, np.full(hit.shape, share), int(seg.prompt_tokens[meas].sum()),
                    int(seg.prompt_tokens[warm].sum()), int(meas.sum()))


def _simulated(log, grid: CapacityGrid, caps: list[int], replicas: int, routing: str, policy: str,
               n: int, cost: CostModel | None = None, costs: dict | None = None) -> _Figures:
    ttls = [ttl_us(t) for t in grid.ttls]
    shape = (len(ttls), len(caps))
    hit, whit, share = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64), np.zeros(shape)
    warm = np.arange(len(log)) >= len(log) // 2
    meas = _measured(len(log), grid)
    replica_of = None
    if routing != "prefix":
        router = Router(replicas, routing, grid.seed, len(log))
        replica_of = np.array([router(i, k) for i, k in enumerate(log.keys)], dtype=np.int64)
    tokens = np.asarray(log.prompt_tokens, dtype=np.int64)
    for ci, c in enumerate(caps):
        h, where = simulate(log, c, ttls, replicas, replica_of, "prefix" if replica_of is None else "fixed", policy)
        hit[:, ci], whit[:, ci] = h[:, meas].sum(axis=1), h[:, warm].sum(axis=1)
        for ti in range(len(ttls)):
            share[ti, ci] = np.bincount(where[ti], minlength=replicas).max() / n if n else 0.0
            if cost is not None:
                costs[(ti, ci)] = cost_figures(cost, tokens, np.asarray(log.ts, dtype=np.int64), meas,
                                               h[ti][None, :], [math.inf])
    return _Figures(hit, whit, share, int(tokens[meas].sum()), int(tokens[warm].sum()), int(meas.sum()))


def _rows(f: _Figures, grid: CapacityGrid, mode: str, replicas: int, routing: str, policy: str, block: int,
          caps: list[int], bytes_per_token: int | None, n: int, costs: dict | None = None) -> list[tuple]:
    out = []
    for ti, t in enumerate(grid.ttls):
        for ci, c in enumerate(caps):
            h = int(f.hit[ti, ci])
            out.append((mode, None if t == math.inf else float(t), block, c,
                        None if bytes_per_token is None else c * block * bytes_per_token, replicas, routing, policy,
                        n if f.measured < 0 else f.measured, f.prompt, h, h / f.prompt if f.prompt else 0.0,
                        int(f.warm_hit[ti, ci]) / f.warm_prompt if f.warm_prompt else 0.0, float(f.share[ti, ci]))
                       + (() if costs is None else tuple(costs.get((ti, ci), {}).get(k) for k in COST_KEYS)))
    return out


def _plain_costs(seg: Segments, grid: CapacityGrid, caps: list[int], cost: CostModel) -> dict:
    """Each (TTL, capacity)'s cost figures: one tier, the GPUs' own memory."""
    meas = _measured(len(seg), grid)
    out = {}
    for ti, t in enumerate(grid.ttls):
        for ci, c in enumerate(caps):
            hit = hit_blocks(seg, ttl_us(t), c)[None, :] * seg.block
            out[(ti, ci)] = cost_figures(cost, seg.prompt_tokens, seg.ts, meas, hit, [math.inf])
    return out


def _tier_rows(seg: Segments, pool: Segments | None, grid: CapacityGrid, mode: str, replicas: int, routing: str,
               block: int, bytes_per_token: int | None, n: int, cost: CostModel | None) -> list[tuple]:
    """One row per (TTL, tier configuration): per-tier hit tokens from the tier
    depths of every request (``replay.core.tiers``)."""
    warm = np.arange(len(seg)) >= len(seg) // 2
    meas = _measured(len(seg), grid)
    share = float(np.bincount(seg.replica).max() / n) if n else 0.0
    prompt, warm_prompt = int(seg.prompt_tokens[meas].sum()), int(seg.prompt_tokens[warm].sum())
    out = []
    for tiers in grid.tiers:
        sizes = [max(0, blocks_for(*parse_size(t.size), block, bytes_per_token)) for t in tiers]
        pooled = sizes.pop() if tiers[-1].pooled else None
        bandwidths = cost.bandwidths(tiers) if cost else None
        for t in grid.ttls:
            per_tier = tier_depths(seg, pool, ttl_us(t), sizes, pooled) * block
            hit = per_tier.sum(axis=0)
            h = int(hit[meas].sum())
            row = (mode, None if t == math.inf else float(t), block, sizes[0],
                   None if bytes_per_token is None else sizes[0] * block * bytes_per_token, replicas, routing,
                   "lru", int(meas.sum()), prompt, h, h / prompt if prompt else 0.0,
                   int(hit[warm].sum()) / warm_prompt if warm_prompt else 0.0, share, format_tiers(tiers),
                   [{"tier": s.name, "tokens": int(v)} for s, v in zip(tiers, per_tier[:, meas].sum(axis=1))])
            if cost:
                figures = cost_figures(cost, seg.prompt_tokens, seg.ts, meas, per_tier, bandwidths)
                row += tuple(figures[k] for k in COST_KEYS)
            out.append(row)
    return out
