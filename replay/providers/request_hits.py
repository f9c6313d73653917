"""Per-request hits under a profile: one row per (stream mode, request, configuration).

Walk profiles read ``L_τ`` from the walks (``replay.core.hits``) and apply the
profile's rounding, cap and minimum; simulated profiles (mlx-lm, OpenAI,
Anthropic) run their simulator (``replay.providers.simulators``,
``replay.providers.mlx_cache``) over the prompts in processing order. Either
way the cache is the stream *and* the model. Everything needed is made current
first through ``replay.prepare``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from replay.core import hits
from replay.core.grid import Grid
from replay.core.prompts import Prompt, iter_prompts
from replay.core.replay import replay_prompts
from replay.core.streams import stream_key
from replay.times import ttl_us
from replay.core.walks import read_walks
from replay.prepare import prepare
from replay.providers import client_rules
from replay.providers.catalog import Profile, get_profile
from replay.providers.layouts import DEFAULT_TTL, anthropic_layouts, one_block
from replay.providers.mlx_cache import simulate_mlx
from replay.providers.simulators import (ANTHROPIC_1H_US, ANTHROPIC_5M_US, AnthropicRequest,
                                         openai_machines, openai_round, simulate_anthropic)

COLUMNS = ["stream_mode", "request_id", "stream", "model", "ts_us", "prompt_tokens", "ttl", "block",
           "min_prefix", "hit", "write_5m", "write_1h"]
_SCHEMA = {"stream_mode": pl.Utf8, "request_id": pl.Int64, "stream": pl.Utf8, "model": pl.Utf8,
           "ts_us": pl.Int64, "prompt_tokens": pl.Int64, "ttl": pl.Float64, "block": pl.Int64,
           "min_prefix": pl.Int64, "hit": pl.Int64, "write_5m": pl.Int64, "write_1h": pl.Int64}


def request_hits(con, profile: str | Profile, grid: Grid | None = None, tokenizer=None,
                 progress: bool = False) -> pl.DataFrame:
    """One row per (stream mode, request, configuration) under ``profile``:
    ``hit`` (cached prompt tokens), ``write_5m`` / ``write_1h`` (tokens written to
    the cache, for providers that bill writes; otherwise the uncached remainder
    of the prompt counts as written at the 5-minute price, which equals the base
    price for providers without a write premium). ``ttl`` is in seconds, ``inf``
    for no expiry."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    grid = grid or Grid()
    if prof.kind == "walk":
        variants = ("prompt", "prompt+output") if prof.variant == "prompt+output" else ("prompt",)
        prepare(con, modes=grid.streams, variants=variants, horizon_us=grid.horizon_us, tokenizer=tokenizer,
                progress=progress)
        df = _walk_hits(con, prof, grid)
    else:
        prepare(con, modes=(), tokenizer=tokenizer, progress=progress)  # prompts only
        sim = {"openai": _openai_sim, "mlx": _mlx_sim, "anthropic": _anthropic_sim, "client": _client_sim,
               "gemini": _client_sim}[prof.kind]
        df = sim(con, prof, grid)
    if "write_5m" not in df.columns:
        df = df.with_columns((pl.col("prompt_tokens") - pl.col("hit")).alias("write_5m"),
                             pl.lit(0, dtype=pl.Int64).alias("write_1h"))
    return df.select(COLUMNS).cast(_SCHEMA)


def _walk_hits(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    blocks = (prof.block,) if prof.block is not None else grid.blocks
    mins = (prof.min_prefix,) if prof.min_prefix is not None else grid.min_prefixes
    w = read_walks(con, grid.streams, variant=prof.variant, horizon_us=grid.horizon_us)
    L = hits.depths_under(w.offsets, w.gaps, w.depths, [ttl_us(t) for t in grid.ttls])
    cols: dict[str, list] = {c: [] for c in COLUMNS[:10]}
    base_cols = {"stream_mode": np.asarray(grid.streams, dtype=object)[w.mode], "request_id": w.request_id,
                 "stream": w.stream, "model": w.model,
                 "ts_us": w.ts_us,
                 "prompt_tokens": w.prompt_tokens}
    last = np.maximum(w.prompt_tokens - 1, 0)
    for ti, ttl in enumerate(grid.ttls):
        for b in blocks:
            floored = (L[:, ti] // b) * b
            if prof.cap_last:  # a fully cached prompt still computes its last token
                floored = np.minimum(floored, (last // b) * b)
            for m in mins:
                for c, v in base_cols.items():
                    cols[c].append(v)
                cols["ttl"].append(np.full(len(w), ttl))
                cols["block"].append(np.full(len(w), b))
                cols["min_prefix"].append(np.full(len(w), m))
                cols["hit"].append(np.where(floored < m, 0, floored))
    data = {c: np.concatenate(v) if v else [] for c, v in cols.items()}
    for c in ("stream_mode", "stream", "model"):  # strings (numpy holds them as objects)
        data[c] = data[c].tolist() if len(data[c]) else []
    return pl.DataFrame(data, schema={c: _SCHEMA[c] for c in cols})


# ----------------------------------------------------------------------------- materialised prompts

@dataclass
class SimRequest:
    """One request as the simulators see it (processing order, ``ts`` in µs)."""
    request_id: int
    ts: int
    tenant: str
    key: str | None
    session: str | None
    model: str | None
    tokens: np.ndarray
    output: np.ndarray | None
    n_tokens: int

    def stream(self, mode: str) -> str:
        return stream_key(mode, self.tenant, self.key, self.session)


def _sim_requests(con, with_output: bool) -> list[SimRequest]:
    return [SimRequest(p.request_id, p.ts, p.tenant, p.key, p.session, p.model, p.symbols, p.output, p.n_tokens)
            for p in iter_prompts(con, with_output=with_output)]


def _frame(rows, extra=()) -> pl.DataFrame:
    cols = COLUMNS[:10] + list(extra)
    return pl.DataFrame(rows, schema={c: _SCHEMA[c] for c in cols}, orient="row")


def _by_cache(reqs: list[SimRequest], mode: str) -> dict[tuple[str, str | None], list[SimRequest]]:
    by: dict[tuple[str, str | None], list[SimRequest]] = {}
    for r in reqs:
        by.setdefault((r.stream(mode), r.model), []).append(r)
    return by


def _mlx_sim(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    size = prof.params.get("cache_size", 10)
    size = None if size in (0, "none", "None") else int(size)
    reqs = _sim_requests(con, with_output=True)
    rows = []
    for mode in grid.streams:
        for (s, model), rs in _by_cache(reqs, mode).items():
            got = simulate_mlx([r.tokens for r in rs], [r.output for r in rs], cache_size=size)
            rows += [(mode, r.request_id, s, model, r.ts, r.n_tokens, float("inf"), 1, 0, h)
                     for r, h in zip(rs, got)]
    return _frame(rows)


def _openai_sim(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    """OpenAI: the cache is organisation (tenant) + prompt_cache_key (+ model);
    with ``replicas>1`` also the machine the overflow rule sends the request to.
    The walk is the contract's trie walk over those partitions."""
    replicas = int(prof.params.get("replicas", 1))
    rpm = int(prof.params.get("rpm", 15))
    route_n = int(prof.params.get("route_tokens", 256))
    min_t, step = int(prof.min_prefix or 1024), int(prof.step or 128)
    reqs = _sim_requests(con, with_output=False)
    parts = [f"org:{r.tenant}|key:{r.key}" if r.key is not None else f"org:{r.tenant}" for r in reqs]
    machines = [0] * len(reqs)
    if replicas > 1:
        machines = openai_machines([(r.ts, f"{p}|{r.model}", tuple(r.tokens[:route_n].tolist()))
                                    for r, p in zip(reqs, parts)], rpm, replicas)
    prompts = [Prompt(r.request_id, r.ts, p if replicas <= 1 else f"{p}|m{m}", None, None, np.asarray(r.tokens),
                      None, None, r.n_tokens, r.model) for r, p, m in zip(reqs, parts, machines)]
    walks = replay_prompts(prompts, modes=("tenant",), variants=("prompt",))[("prompt", "tenant")]
    part_of = {r.request_id: p for r, p in zip(reqs, parts)}
    offsets = np.cumsum([0] + [len(w[5]) for w in walks], dtype=np.int64)
    L_all = hits.depths_under(offsets, [g for w in walks for g in w[5]], [d for w in walks for d in w[6]],
                              [ttl_us(ttl) for ttl in grid.ttls])
    rows = []
    for (rid, _s, model, ts, n, _gaps, _depths, _origins), Ls in zip(walks, L_all.tolist()):
        for ttl, L in zip(grid.ttls, Ls):
            rows.append(("org+key", rid, part_of[rid], model, ts, n, float(ttl), 1, min_t,
                         openai_round(L, min_t, step)))
    return _frame(rows)


def _client_sim(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    """A provider as its client uses it (``client_rules``: Claude Code's breakpoints,
    OpenAI's Responses API, Gemini per backend), with the parts the log does not
    hold inferred from usage: ``prompt_tokens`` counts them. The provider fixes the
    cache and the TTL: the rows carry the profile's stream mode and ``ttl`` inf (the
    rules' own TTLs, not the grid's)."""
    rows = client_rules.load_rows(con, with_usage_only=False)
    got = client_rules.RULES[prof.family](con, rows, client_rules.hidden_lengths(rows))
    out = []
    for mode in (prof.streams or grid.streams):
        for r, (n, _h, hit, _part) in zip(rows, got):
            s = stream_key(mode, r.tenant, r.key, r.session) if mode != "org+key" else r.stream
            out.append((mode, r.request_id, s, r.model, r.ts, n, math.inf, 1, int(prof.min_prefix or 0), hit))
    return _frame(out)


def _anthropic_sim(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    """Anthropic: breakpoints and lookback per request; the grid's TTL only picks the
    default TTL of breakpoints that name none (5 minutes or 1 hour)."""
    ttls = [t for t in grid.ttls if t in (300.0, 3600.0)] or [300.0]
    lookback = int(prof.params.get("lookback", 20))
    auto = bool(int(prof.params.get("auto", 1)))
    min_t = int(prof.min_prefix or 0)
    reqs = _sim_requests(con, with_output=False)
    shapes = anthropic_layouts(con, auto)
    rows = []
    for default_ttl in ttls:
        d_us = ANTHROPIC_1H_US if default_ttl == 3600.0 else ANTHROPIC_5M_US
        layouts = {}
        for r in reqs:
            bps, bounds = shapes.get(r.request_id) or one_block(r.n_tokens, auto)
            layouts[r.request_id] = ([(p, d_us if t == DEFAULT_TTL else t) for p, t in bps], bounds)
        for mode in grid.streams:
            areqs = [AnthropicRequest(r.ts, f"{r.stream(mode)}\0{r.model}", r.tokens, *layouts[r.request_id])
                     for r in reqs]
            res = simulate_anthropic(areqs, min_t, lookback)
            rows += [(mode, r.request_id, r.stream(mode), r.model, r.ts, r.n_tokens, default_ttl, 1, min_t,
                      rd, w5, w1) for r, (rd, w5, w1) in zip(reqs, res)]
    return _frame(rows, extra=("write_5m", "write_1h"))


def ttl_s_column(ttl: pl.Expr) -> pl.Expr:
    """A ``ttl`` column (seconds, inf for none) as the sweep's ``ttl_s`` (null for none)."""
    return pl.when(ttl.is_infinite()).then(None).otherwise(ttl)

