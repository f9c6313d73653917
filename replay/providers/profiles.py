"""Provider and engine profiles: each a small, documented set of rules layered on
the semantics contract (``../shared/docs/semantics.md``), never a change to it.

    from replay.profiles import list_profiles, profile_sweep
    profile_sweep(con, ["ideal", "deepseek", "anthropic-sonnet-4-5"], Grid())

Every profile says which grid dimensions (TTL × block × minimum prefix × stream
mode) it *honours* and which it *overrides* (fixes to the provider's value); the
rows it returns carry the values actually used, so a fixed dimension shows up
as a single value instead of a silent change.

Options may be appended to a profile name, ``name:key=value[,key=value]``, e.g.
``mlx-lm:cache_size=20``, ``openai-gpt-5:replicas=4``, ``anthropic-sonnet-4-5:auto=0``,
``anthropic-sonnet-4-5:lookback=20``.

Two implementations:

* **walk profiles** (``ideal``, ``vllm``, ``sglang``, ``mooncake``, ``deepseek``)
  are arithmetic on the stored ``walks`` (one
  DuckDB query): ``L_τ`` per request, then the profile's rounding, cap and
  minimum. ``prompt+output`` walks are used where the engine keeps generated
  tokens (``replay.pipeline.prepare(con, modes, variants=("prompt", "prompt+output"))``
  makes them; :func:`profile_sweep` calls it when they are missing).
* **simulated profiles** (``mlx-lm``, ``anthropic-*``, ``openai-*`` — the latter
  because its partition, organisation + key, is no stored stream mode) materialise the prompts (:func:`replay.replay.iter_prompts`)
  and run a small simulator of the provider's cache in processing order. Each
  simulator's pure core is tested against a brute-force reading of the same rules
  (``tests/test_profiles.py``).

Facts and their sources (looked up 2026; re-check before relying on them):

* vLLM v1 prefix caching: full 16-token blocks, parent-chained block hashes, a
  fully cached prompt still recomputes its last token (``num_computed_tokens``
  capped at ``len − 1``, block-aligned), generated tokens are hashed into blocks
  as they fill, so a finished request's output blocks are reusable.
  ``cache_salt`` / LoRA / multimodal ids partition the chain.
  https://docs.vllm.ai/en/latest/design/prefix_caching.html (v0.8+ docs).
* SGLang RadixAttention: token-level radix tree (``page_size=1`` default), the
  finished request's prompt + output inserted, at least one token always
  computed (``max_prefix_len = len(input_ids) − 1``).
  https://docs.sglang.ai, ``python/sglang/srt/mem_cache/radix_cache.py``.
* Mooncake traces: 512-token blocks, ``hash_ids`` already chained.
  https://github.com/kvcache-ai/Mooncake (FAST'25 trace README).
* mlx-lm server: see :mod:`replay.profiles_mlx` (read from mlx-lm 0.32.2).
* DeepSeek API context caching: on by default, shared across the account, hits
  counted in 64-token units, prompt + output both persisted ("each request
  produces cache prefix units at the end of the user input and at the end of the
  model output"), kept "from hours to days".
  https://api-docs.deepseek.com/guides/kv_cache (read 2026).
* Anthropic prompt caching: prefix tools → system → messages up to a
  ``cache_control`` breakpoint (≤ 4 explicit; a top-level ``cache_control`` is the
  automatic breakpoint on the last cacheable block), lookback of about 20
  content blocks before each breakpoint, minimum cacheable length per model
  (table :data:`ANTHROPIC_MIN_TOKENS`), TTL 5 min refreshed on every hit or
  1 h (``"ttl": "1h"``); writes 1.25× / 2×, reads 0.1× of base input.
  https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching (2025–26);
  the minimum table as republished by https://docs.orq.ai/docs/proxy/prompt-caching
  and https://docs.litellm.ai/docs/completion/prompt_caching (2026; they differ
  for Sonnet 4.6: 2048 vs 1024 — we use 2048).
* OpenAI prompt caching: automatic for prompts ≥ 1024 tokens, hits in 128-token
  increments, routed by a hash of the first ~256 tokens (+ ``prompt_cache_key``),
  more than ~15 requests/min per prefix + key overflow to other machines,
  in-memory retention 5–10 min idle (≤ 1 h) or 24 h extended; caches are not
  shared between organisations.
  https://platform.openai.com/docs/guides/prompt-caching (2025–26).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import polars as pl

from replay.store import db
from replay.core.sweep import Grid, _values
from replay.core.trie import hit_length

# ----------------------------------------------------------------------------- profile table

#: Anthropic minimum cacheable prompt length (tokens) by model family.
ANTHROPIC_MIN_TOKENS: dict[str, int] = {
    "opus-4-6": 4096,
    "opus-4-5": 4096,
    "sonnet-4-6": 2048,
    "haiku-4-5": 4096,
    "sonnet-4-5": 1024,
    "opus-4-1": 1024,
    "opus-4": 1024,
    "sonnet-4": 1024,
    "sonnet-3-7": 1024,
    "haiku-3-5": 2048,
    "haiku-3": 2048,
}

#: OpenAI models given a profile (all share the same caching rules).
OPENAI_MODELS = ("gpt-5", "gpt-5-mini", "gpt-4.1", "gpt-4.1-mini", "gpt-4o")


@dataclass(frozen=True)
class Profile:
    """A named set of caching rules. ``None`` for a dimension = the grid's values."""

    name: str
    kind: str                        # "walk" | "mlx" | "anthropic" | "openai"
    summary: str
    variant: str = "prompt"          # walks variant: "prompt" or "prompt+output"
    block: int | None = None         # fixed block size, or None = grid
    min_prefix: int | None = None    # fixed minimum, or None = grid
    cap_last: bool = False           # hit ≤ len − 1 (block-aligned)
    step: int | None = None          # openai: increments after the first min_prefix tokens
    ttl_fixed: bool = False          # the TTL is the provider's, not the grid's
    streams: tuple[str, ...] | None = None  # fixed stream modes, or None = grid
    honours: str = ""
    overrides: str = ""
    sources: str = ""
    params: dict = field(default_factory=dict)

    @property
    def canonical_json(self) -> bool:
        """Hosted APIs parse the request JSON before building the prompt, so key order
        and separators cannot cause a miss there (diagnose/whatif work on the canonical view)."""
        return self.kind in ("anthropic", "openai") or self.name.split(":")[0] == "deepseek"

    def describe(self) -> str:
        return (f"{self.name}: {self.summary}\n  honours: {self.honours or '-'}\n"
                f"  overrides: {self.overrides or '-'}\n  sources: {self.sources or '-'}")


def _base_profiles() -> dict[str, Profile]:
    p: dict[str, Profile] = {}
    p["ideal"] = Profile(
        "ideal", "walk", "the contract itself: longest common prefix with any earlier prompt of the stream",
        honours="ttl, block, min_prefix, stream", sources="semantics.md")
    p["vllm"] = Profile(
        "vllm", "walk", "vLLM v1: 16-token full blocks, hit capped at len−1 (block-aligned), output kept",
        variant="prompt+output", block=16, min_prefix=0, cap_last=True,
        honours="ttl (stand-in for LRU capacity), stream (= the replicas a router pins a stream to)",
        overrides="block=16, min_prefix=0; cache_salt/LoRA are not in the logs (no partition)",
        sources="docs.vllm.ai design/prefix_caching (v0.8+, read 2026)")
    p["sglang"] = Profile(
        "sglang", "walk", "SGLang radix cache: token level, output kept, hit capped at len−1",
        variant="prompt+output", block=1, min_prefix=0, cap_last=True,
        honours="ttl (stand-in for LRU capacity), stream", overrides="block=1, min_prefix=0",
        sources="sglang radix_cache.py / schedule_batch.py (read 2026)")
    p["mooncake"] = Profile(
        "mooncake", "walk", "Mooncake traces: 512-token blocks (hash_ids already chained)",
        block=512, min_prefix=0, honours="ttl, stream", overrides="block=512, min_prefix=0",
        sources="github.com/kvcache-ai/Mooncake trace README (FAST'25)")
    p["deepseek"] = Profile(
        "deepseek", "walk", "DeepSeek API: 64-token units, prompt + output cached, account-wide",
        variant="prompt+output", block=64, min_prefix=64,
        honours="ttl (disk cache kept hours to days: inf is the faithful value), stream "
                "(tenant = account is the faithful one; global = tenant for a one-account log)",
        overrides="block=64, min_prefix=64", sources="api-docs.deepseek.com/guides/kv_cache (read 2026)")
    p["mlx-lm"] = Profile(
        "mlx-lm", "mlx", "mlx-lm server: token-level nearest prefix over an LRU of 10 stored prompt caches",
        variant="prompt+output", block=1, min_prefix=0, ttl_fixed=True,
        honours="stream", overrides="ttl (none: count-capped LRU, option cache_size=10), block=1, min_prefix=0",
        sources="mlx-lm 0.32.2 models/cache.py, server.py (see replay.profiles_mlx)",
        params={"cache_size": 10})
    for fam, m in ANTHROPIC_MIN_TOKENS.items():
        name = f"anthropic-{fam}"
        p[name] = Profile(
            name, "anthropic",
            f"Anthropic claude-{fam}: hits only at cache breakpoints (≤4 explicit or automatic), "
            f"~20-block lookback, minimum {m} tokens, TTL 5m refreshed on hit or 1h",
            block=1, min_prefix=m, ttl_fixed=True,
            honours="stream (tenant = organisation is the faithful one); ttl only as the default TTL of "
                    "breakpoints without an explicit ttl, and only the values 5m and 1h",
            overrides=f"block=1 (hits at breakpoints), min_prefix={m}",
            sources="docs.anthropic.com prompt-caching (2025-26); minimum table via docs.orq.ai (2026)",
            params={"auto": 1, "lookback": 20})
    for model in OPENAI_MODELS:
        name = f"openai-{model}"
        p[name] = Profile(
            name, "openai",
            f"OpenAI {model}: automatic ≥1024 tokens, 128-token increments, partition organisation + "
            "prompt_cache_key; replicas>1 simulates the overflow above 15 req/min per prefix+key",
            block=1, min_prefix=1024, step=128, streams=("org+key",),
            honours="ttl (in-memory 5–10 min idle, ≤1h; extended retention 24h)",
            overrides="block (1024 then 128-token increments), min_prefix=1024, stream=org+key",
            sources="platform.openai.com/docs/guides/prompt-caching (2025-26)",
            params={"replicas": 1, "rpm": 15, "route_tokens": 256})
    return p


PROFILES: dict[str, Profile] = _base_profiles()


def list_profiles() -> list[Profile]:
    """Every registered profile (``name:opt=value`` variants are not listed)."""
    return list(PROFILES.values())


def get_profile(spec: str) -> Profile:
    """A profile from ``name`` or ``name:key=value,key=value``.

    ``anthropic-<model>`` / ``openai-<model>`` also accept full model ids
    (``anthropic-claude-sonnet-4-5-20250929`` → ``anthropic-sonnet-4-5``).
    """
    name, _, opts = spec.partition(":")
    prof = PROFILES.get(name) or _fuzzy(name)
    if prof is None:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    if opts:
        params = dict(prof.params)
        for kv in opts.split(","):
            k, _, v = kv.partition("=")
            k = k.strip()
            if k not in params:
                raise ValueError(f"profile {prof.name} has no option {k!r} (options: {sorted(params)})")
            params[k] = int(v) if v.strip().lstrip("-").isdigit() else v.strip()
        prof = replace(prof, name=spec, params=params)
    return prof


def _fuzzy(name: str) -> Profile | None:
    n = name.lower().replace("claude-", "").replace(".", "-") if name.startswith("anthropic-") else name.lower()
    if n.startswith("anthropic-"):
        rest = n[len("anthropic-"):]
        for fam in sorted(ANTHROPIC_MIN_TOKENS, key=len, reverse=True):
            if rest.startswith(fam):
                return PROFILES[f"anthropic-{fam}"]
    if n.startswith("openai-"):
        # any OpenAI model gets the common rules
        base = PROFILES["openai-gpt-5"]
        return replace(base, name=name, summary=base.summary.replace("gpt-5", name[7:]))
    return None


def profile_for_model(model: str | None) -> str | None:
    """The profile that models a logged ``model`` name (None when unknown)."""
    if not model:
        return None
    m = model.lower()
    if "deepseek" in m:
        return "deepseek"
    if "claude" in m:
        p = _fuzzy("anthropic-" + m)
        return p.name if p is not None else None
    if m.startswith(("gpt-", "o1", "o3", "o4")):
        return f"openai-{m}"
    return None


# ----------------------------------------------------------------------------- SQL helpers

def _df(con, sql: str, params=None) -> pl.DataFrame:
    return pl.from_arrow(db.arrow(con, sql, params))


def _ensure_walks(con, modes: Sequence[str], variant: str, horizon: float) -> None:
    """Replay (through ``pipeline.prepare``) when the walks of ``variant`` are missing."""
    have = {(r["variant"], r["mode"]) for r in
            db.arrow(con, "SELECT DISTINCT variant, mode FROM walks").to_pylist()}
    if all((variant, m) in have for m in modes):
        return
    from replay.api import prepare

    variants = ("prompt", "prompt+output") if variant == "prompt+output" else ("prompt",)
    prepare(con, modes=tuple(modes), variants=variants, horizon=horizon)


def _has_requests(con) -> bool:
    return db.arrow(con, "SELECT count(*) AS n FROM requests").column("n")[0].as_py() > 0


# ----------------------------------------------------------------------------- walk profiles

def _walk_hits_sql(prof: Profile, grid: Grid, blocks, mins) -> str:
    """SQL giving one row per (mode, request, ttl, block, min_prefix) with `hit`."""
    modes = ", ".join(repr(m) for m in grid.streams)
    if prof.step is not None:  # openai: min_prefix then `step` increments
        hit = (f"CASE WHEN c.L < m.min_prefix THEN 0 "
               f"ELSE m.min_prefix + ((c.L - m.min_prefix) // {prof.step}) * {prof.step} END")
    else:
        base = "(c.L // b.block) * b.block"
        if prof.cap_last:
            base = f"least({base}, ((greatest(c.prompt_tokens - 1, 0)) // b.block) * b.block)"
        hit = f"CASE WHEN {base} < m.min_prefix THEN 0 ELSE {base} END"
    return f"""
    {_values('ttls', 'ttl', 'DOUBLE', grid.ttls)},
    {_values('blocks', 'block', 'BIGINT', blocks)},
    {_values('mins', 'min_prefix', 'BIGINT', mins)},
    w AS (SELECT * FROM walks WHERE variant = {prof.variant!r} AND mode IN ({modes})),
    steps AS (SELECT mode, request_id, unnest(gaps) AS gap, unnest(depths) AS depth FROM w),
    ceil AS (
        SELECT w.mode, w.request_id, w.stream, w.ts, w.prompt_tokens, t.ttl,
               coalesce(max(s.depth) FILTER (WHERE s.gap <= t.ttl), 0) AS L
        FROM w CROSS JOIN ttls t
        LEFT JOIN steps s ON s.mode = w.mode AND s.request_id = w.request_id
        GROUP BY ALL),
    hits AS (
        SELECT c.mode, c.request_id, c.stream, c.ts, c.prompt_tokens, c.ttl, b.block, m.min_prefix,
               {hit} AS hit
        FROM ceil c CROSS JOIN blocks b CROSS JOIN mins m)"""


def _dims(prof: Profile, grid: Grid) -> tuple[tuple, tuple]:
    blocks = (prof.block,) if prof.block is not None else tuple(grid.blocks)
    mins = (prof.min_prefix,) if prof.min_prefix is not None else tuple(grid.min_prefixes)
    return blocks, mins


def _walk_request_hits(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    blocks, mins = _dims(prof, grid)
    if prof.step is not None:
        blocks = (1,)
    sql = f"WITH {_walk_hits_sql(prof, grid, blocks, mins)} SELECT * FROM hits"
    df = _df(con, sql)
    return df.rename({"mode": "stream_mode"})


# ----------------------------------------------------------------------------- per-request hits

REQ_COLS = ["stream_mode", "request_id", "stream", "ts", "prompt_tokens", "ttl", "block", "min_prefix",
            "hit", "write_5m", "write_1h"]


def request_hits(con, profile: str | Profile, grid: Grid | None = None) -> pl.DataFrame:
    """One row per (stream mode, request, configuration) under ``profile``:
    ``hit`` (cached prompt tokens), ``write_5m`` / ``write_1h`` (tokens written to
    the cache, for providers that bill writes; otherwise the uncached remainder
    of the prompt counts as written at the 5-minute price, which equals the base
    price for providers without a write premium).

    ``ttl`` is ``inf`` for no expiry (``profile_sweep`` turns it into a null ``ttl_s``).
    """
    prof = get_profile(profile) if isinstance(profile, str) else profile
    grid = grid or Grid()
    horizon = max(grid.ttls) if grid.ttls else math.inf
    if prof.kind == "walk":
        _ensure_walks(con, grid.streams, prof.variant, horizon)
        df = _walk_request_hits(con, prof, grid)
    elif prof.kind == "openai" and int(prof.params.get("replicas", 1)) <= 1:
        df = _openai_sim(con, prof, grid, simulate=False)
    elif prof.kind == "openai":
        df = _openai_sim(con, prof, grid, simulate=True)
    elif prof.kind == "mlx":
        df = _mlx_sim(con, prof, grid)
    elif prof.kind == "anthropic":
        df = _anthropic_sim(con, prof, grid)
    else:  # pragma: no cover
        raise ValueError(prof.kind)
    if "write_5m" not in df.columns:
        df = df.with_columns((pl.col("prompt_tokens") - pl.col("hit")).alias("write_5m"),
                             pl.lit(0, dtype=pl.Int64).alias("write_1h"))
    return df.select(REQ_COLS).with_columns(
        pl.col("hit").cast(pl.Int64), pl.col("prompt_tokens").cast(pl.Int64),
        pl.col("write_5m").cast(pl.Int64), pl.col("write_1h").cast(pl.Int64),
        pl.col("block").cast(pl.Int64), pl.col("min_prefix").cast(pl.Int64),
        pl.col("ttl").cast(pl.Float64))


# ----------------------------------------------------------------------------- materialised prompts

@dataclass
class SimRequest:
    """One request as the simulators see it (processing order)."""
    request_id: int
    ts: float
    tenant: str
    key: str | None
    session: str | None
    tokens: np.ndarray
    output: np.ndarray | None
    n_tokens: int


def _sim_requests(con, with_output: bool) -> list[SimRequest]:
    from replay.core.replay import iter_prompts

    out = [SimRequest(p.request_id, float(p.ts), p.tenant, p.key, p.session, p.symbols, p.output, p.n_tokens)
           for p in iter_prompts(con, with_output=with_output)]
    try:
        con.complete()
    except Exception:  # noqa: BLE001 - older duckdb: nothing to complete
        pass
    return out


def _stream(mode: str, r: SimRequest) -> str:
    from replay.core.replay import stream_key

    return stream_key(mode, r.tenant, r.key, r.session)


# ----------------------------------------------------------------------------- mlx-lm

def _mlx_sim(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    from replay.providers.mlx_cache import simulate_mlx

    size = prof.params.get("cache_size", 10)
    size = None if size in (0, "none", "None") else int(size)
    reqs = _sim_requests(con, with_output=True)
    rows = []
    for mode in grid.streams:
        by: dict[str, list[SimRequest]] = {}
        for r in reqs:
            by.setdefault(_stream(mode, r), []).append(r)
        for s, rs in by.items():
            hits = simulate_mlx([r.tokens for r in rs], [r.output for r in rs], cache_size=size)
            rows += [(mode, r.request_id, s, r.ts, r.n_tokens, math.inf, 1, 0, h) for r, h in zip(rs, hits)]
    return _rows(rows)


def _rows(rows, extra: Sequence[str] = ()) -> pl.DataFrame:
    cols = ["stream_mode", "request_id", "stream", "ts", "prompt_tokens", "ttl", "block", "min_prefix",
            "hit", *extra]
    if not rows:
        return pl.DataFrame({c: [] for c in cols}, schema={
            "stream_mode": pl.Utf8, "request_id": pl.Int64, "stream": pl.Utf8, "ts": pl.Float64,
            "prompt_tokens": pl.Int64, "ttl": pl.Float64, "block": pl.Int64, "min_prefix": pl.Int64,
            "hit": pl.Int64, **{c: pl.Int64 for c in extra}})
    return pl.DataFrame(rows, schema=cols, orient="row")


# ----------------------------------------------------------------------------- OpenAI

def openai_round(L: int, min_tokens: int = 1024, step: int = 128) -> int:
    """OpenAI's cached tokens for a common prefix of ``L`` tokens."""
    return 0 if L < min_tokens else min_tokens + ((L - min_tokens) // step) * step


def openai_machines(reqs: Sequence[tuple[float, str, tuple]], rpm: int, replicas: int) -> list[int]:
    """Machine index per request (processing order) under the overflow rule.

    ``reqs[i] = (ts, partition, route)`` with ``route`` the first ``route_tokens``
    tokens. Requests of the same partition + route are counted over a trailing
    60-second window (``t − 60 < t' ≤ t``, earlier requests only): the ``k``-th
    one (0-based) in the window goes to machine ``(k // rpm) % replicas`` —
    the first ``rpm`` a minute stay on the home machine, the next ``rpm`` spill
    to the next one, and so on.
    """
    from collections import deque

    windows: dict[tuple, deque] = {}
    out = []
    for ts, part, route in reqs:
        q = windows.setdefault((part, route), deque())
        while q and q[0] <= ts - 60.0:
            q.popleft()
        out.append((len(q) // rpm) % replicas)
        q.append(ts)
    return out


def _openai_sim(con, prof: Profile, grid: Grid, simulate: bool) -> pl.DataFrame:
    """OpenAI: the stream is organisation (tenant) + prompt_cache_key; with
    ``replicas>1`` also the machine the overflow rule sends the request to."""
    from replay.core.replay import Prompt, replay_prompts

    replicas = int(prof.params.get("replicas", 1))
    rpm = int(prof.params.get("rpm", 15))
    route_n = int(prof.params.get("route_tokens", 256))
    min_t, step = int(prof.min_prefix or 1024), int(prof.step or 128)
    reqs = _sim_requests(con, with_output=False)
    parts = [f"org:{r.tenant}|key:{r.key}" if r.key is not None else f"org:{r.tenant}" for r in reqs]
    machines = [0] * len(reqs)
    if simulate and replicas > 1:
        machines = openai_machines([(r.ts, p, tuple(r.tokens[:route_n].tolist())) for r, p in zip(reqs, parts)],
                                   rpm, replicas)
    prompts = []
    for r, p, m in zip(reqs, parts, machines):
        tenant = p if not (simulate and replicas > 1) else f"{p}|m{m}"
        prompts.append(Prompt(r.request_id, r.ts, tenant, None, None, np.asarray(r.tokens), None, None,
                              r.n_tokens))
    res = replay_prompts(prompts, modes=("tenant",), variants=("prompt",))
    walks = res[("prompt", "tenant")]
    rows = []
    by_id = {r.request_id: p for r, p in zip(reqs, parts)}
    for rid, s, ts, n, gaps, depths in walks:
        for ttl in grid.ttls:
            L = hit_length(gaps, depths, ttl)
            rows.append(("org+key", rid, by_id[rid], ts, n, float(ttl), 1, min_t, openai_round(L, min_t, step)))
    return _rows(rows)


# ----------------------------------------------------------------------------- Anthropic

@dataclass
class AnthropicRequest:
    """What the Anthropic simulator needs of one request.

    ``breakpoints``: ``(token position, ttl seconds)`` — the prefix ``tokens[:pos]``
    is what the breakpoint caches; ``boundaries``: token positions where content
    blocks end (sorted), for the lookback.
    """
    ts: float
    stream: str
    tokens: np.ndarray
    breakpoints: list[tuple[int, float]]
    boundaries: Sequence[int]


def anthropic_candidates(bp_pos: int, boundaries: Sequence[int], lookback: int) -> list[int]:
    """Positions checked for a hit for the breakpoint at ``bp_pos``: itself and the
    ``lookback`` block boundaries before it."""
    before = [b for b in boundaries if b < bp_pos]
    return [bp_pos] + before[-lookback:] if lookback > 0 else [bp_pos]


def simulate_anthropic(reqs: Sequence[AnthropicRequest], min_tokens: int, lookback: int = 20,
                       max_breakpoints: int = 4) -> list[tuple[int, int, int]]:
    """(read, write_5m, write_1h) tokens per request, requests in processing order.

    Rules (our reading of Anthropic's docs; the brute force in the tests reads
    them literally):

    1. Only the first ``max_breakpoints`` breakpoints count; a breakpoint whose
       prefix is shorter than ``min_tokens`` caches nothing.
    2. Lookup: for each breakpoint, its own position and the ``lookback`` block
       boundaries before it are candidate prefixes; the read is the longest
       candidate (≥ ``min_tokens``) whose prefix is in the stream's cache and
       alive (``t − last_refresh ≤ its ttl``). It is refreshed (ttl from now).
    3. After the request, every eligible breakpoint's prefix is in the cache with
       its own ttl from now (created or refreshed).
    4. Writes: the tokens between the read and each eligible breakpoint beyond
       it, in ascending order, each span billed at the ttl of the breakpoint
       that ends it (Anthropic's ``cache_creation_input_tokens``, split by ttl).
    """
    caches: dict[str, dict[tuple[int, bytes], list[float]]] = {}
    out = []
    for r in reqs:
        cache = caches.setdefault(r.stream, {})
        toks = np.asarray(r.tokens)
        n = len(toks)
        bps = [(int(p), float(ttl)) for p, ttl in r.breakpoints[:max_breakpoints] if 0 < int(p) <= n]
        by_pos: dict[int, float] = {}
        for p, ttl in bps:
            if p >= min_tokens:
                by_pos[p] = max(ttl, by_pos.get(p, 0.0))  # two breakpoints on one prefix: the longer ttl
        elig = sorted(by_pos.items())
        cand = set()
        for p, _ in bps:
            cand.update(c for c in anthropic_candidates(p, r.boundaries, lookback) if c >= min_tokens and c <= n)
        positions = sorted(cand | {p for p, _ in elig})
        keys = _prefix_keys(toks, positions)
        read = 0
        for c in sorted(cand, reverse=True):
            e = cache.get(keys[c])
            if e is not None and r.ts - e[0] <= e[1]:
                read = c
                e[0] = r.ts
                break
        w5 = w1 = 0
        prev = read
        for p, ttl in elig:
            if p > prev:
                span = p - prev
                if ttl > 300:
                    w1 += span
                else:
                    w5 += span
                prev = p
            e = cache.get(keys[p])
            if e is None or r.ts - e[0] > e[1]:
                cache[keys[p]] = [r.ts, ttl]
            else:
                e[0] = r.ts
                e[1] = max(e[1], ttl)
        out.append((read, w5, w1))
    return out


def _prefix_keys(toks: np.ndarray, positions: Sequence[int]) -> dict[int, tuple[int, bytes]]:
    """(position, blake2b of tokens[:position]) for each position, in one pass."""
    h = hashlib.blake2b(digest_size=16)
    buf = np.ascontiguousarray(toks, dtype=np.int64)
    keys, done = {}, 0
    for p in sorted(positions):
        h.update(buf[done:p].tobytes())
        done = p
        keys[p] = (p, h.copy().digest())
    return keys


def _ttl_of(cc, default: float) -> float:
    if isinstance(cc, dict) and str(cc.get("ttl", "")).lower() in ("1h", "3600", "3600s", "60m"):
        return 3600.0
    if isinstance(cc, dict) and str(cc.get("ttl", "")).lower() in ("5m", "300", "300s"):
        return 300.0
    return default


def anthropic_layout(body: dict | None, seg_tokens: Sequence[int], fmt: str, default_ttl: float,
                     auto: bool) -> tuple[list[tuple[int, float]], list[int]]:
    """Breakpoints ``(pos, ttl)`` and content-block boundaries (token positions) of
    a request whose rendered pieces have ``seg_tokens`` tokens each.

    Block boundaries are the ends of the non-marker pieces (a tool definition, a
    system block, a content block, a tool call). The automatic breakpoint
    (top-level ``cache_control``, or ``auto`` for requests with no breakpoint at
    all) sits at the end of the last content block.
    """
    cum = np.cumsum(np.asarray(seg_tokens, dtype=np.int64)) if len(seg_tokens) else np.zeros(0, np.int64)
    n = int(cum[-1]) if len(cum) else 0
    if body is None:  # tokens format: the whole prompt is one block
        return ([(n, default_ttl)] if auto and n else []), ([n] if n else [])
    from replay.text.render import _render

    r = _render(body, fmt)
    pieces = r.pieces
    if len(pieces) != len(cum):  # rendering drifted from the tokenized one: treat as one block
        return ([(n, default_ttl)] if auto and n else []), ([n] if n else [])
    bounds = [int(cum[i]) for i, pc in enumerate(pieces) if pc[0] != "marker"]
    # the ttl of each explicit breakpoint: re-walk the body for cache_control objects in render order
    ccs = _cache_controls(body)
    bps = []
    for k, i in enumerate(r.breaks):
        ttl = _ttl_of(ccs[k], default_ttl) if k < len(ccs) else default_ttl
        bps.append((int(cum[i]), ttl))
    top = body.get("cache_control") if isinstance(body, dict) else None
    if (top is not None or (auto and not bps)) and bounds:
        bps.append((bounds[-1], _ttl_of(top, default_ttl)))
    return bps, bounds


def _cache_controls(body: dict) -> list:
    """The ``cache_control`` objects of a body in rendering order (tools, system, messages)."""
    found: list = []

    def visit(obj):
        if isinstance(obj, list):
            for x in obj:
                visit(x)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if k != "cache_control" and isinstance(v, (list, dict)):
                    visit(v)
            if obj.get("cache_control") is not None:
                found.append(obj["cache_control"])

    for part in ("tools", "system", "instructions", "messages", "input"):
        if part in body:
            visit(body[part])
    return found


def _anthropic_inputs(con, prof: Profile, default_ttl: float) -> tuple[list[SimRequest], dict]:
    reqs = _sim_requests(con, with_output=False)
    tbl = db.arrow(con, """
        SELECT r.request_id, r.format, b.body,
               p.seg_ids
        FROM requests r JOIN prompts p USING (request_id) JOIN request_bodies b USING (request_id)""")
    seg_n = {r["seg_id"]: r["n_tokens"] for r in db.arrow(con, "SELECT seg_id, n_tokens FROM segments").to_pylist()}
    auto = bool(int(prof.params.get("auto", 1)))
    layouts = {}
    for row in tbl.to_pylist():
        body = None
        if row["body"] is not None and row["format"] != "tokens":
            try:
                body = json.loads(row["body"])
            except ValueError:
                body = None
        layouts[row["request_id"]] = (body, [seg_n[s] for s in row["seg_ids"]], row["format"])
    out = {}
    for r in reqs:
        body, segs, fmt = layouts.get(r.request_id, (None, [r.n_tokens], "tokens"))
        out[r.request_id] = anthropic_layout(body if isinstance(body, dict) else None, segs, fmt,
                                             default_ttl, auto)
    return reqs, out


def _anthropic_sim(con, prof: Profile, grid: Grid) -> pl.DataFrame:
    ttls = [t for t in grid.ttls if t in (300.0, 3600.0)] or [300.0]
    lookback = int(prof.params.get("lookback", 20))
    rows = []
    for default_ttl in ttls:
        reqs, layouts = _anthropic_inputs(con, prof, default_ttl)
        for mode in grid.streams:
            areqs = [AnthropicRequest(r.ts, _stream(mode, r), r.tokens, *layouts[r.request_id]) for r in reqs]
            res = simulate_anthropic(areqs, int(prof.min_prefix or 0), lookback)
            rows += [(mode, r.request_id, a.stream, r.ts, r.n_tokens, default_ttl, 1, int(prof.min_prefix or 0),
                      rd, w5, w1) for r, a, (rd, w5, w1) in zip(reqs, areqs, res)]
    return _rows(rows, extra=("write_5m", "write_1h"))


# ----------------------------------------------------------------------------- the sweep

RESULT_COLS = ["profile", "stream", "ttl_s", "block", "min_prefix", "requests", "prompt_tokens", "hit_tokens",
               "hit_ratio", "requests_hit", "realized_requests", "realized_prompt_tokens", "realized_hit_tokens",
               "realized_hit_ratio"]


def realized(con, by: str | None = None) -> pl.DataFrame:
    """Provider usage totals (requests with usage only); ``by`` a requests column."""
    key = f"{by}, " if by else ""
    return _df(con, f"""
        SELECT {key}count(usage_prompt_tokens) AS realized_requests,
               sum(usage_prompt_tokens)::BIGINT AS realized_prompt_tokens,
               sum(CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cached_tokens, 0) END)::BIGINT
                   AS realized_hit_tokens,
               sum(CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cache_write_tokens, 0) END)::BIGINT
                   AS realized_write_tokens
        FROM requests {'GROUP BY ' + by if by else ''}""")


def profile_sweep(con, profiles: Sequence[str] = ("ideal",), grid: Grid | None = None,
                  by_stream: bool = False, store: bool = True) -> pl.DataFrame:
    """Hit figures per profile × configuration (rows as ``sweep.sweep`` plus the
    profile and the realised usage columns).

    ``realized_*`` are the provider's own usage figures summed over the requests
    that carry usage (null when none does); per stream mode they are the same for
    every configuration. With ``by_stream`` a ``stream_key`` column is added and
    the realised figures are per stream key.
    """
    grid = grid or Grid()
    frames = []
    for spec in profiles:
        prof = get_profile(spec)
        df = request_hits(con, prof, grid)
        keys = ["stream_mode"] + (["stream"] if by_stream else []) + ["ttl", "block", "min_prefix"]
        agg = (df.group_by(keys).agg(
            pl.len().alias("requests"), pl.col("prompt_tokens").sum().alias("prompt_tokens"),
            pl.col("hit").sum().alias("hit_tokens"), (pl.col("hit") > 0).sum().alias("requests_hit")))
        if by_stream:
            rz = _realized_by_request(con)
            per = (df.join(rz, on="request_id", how="left")
                   .group_by(keys).agg(pl.col("u_p").count().alias("realized_requests"),
                                       pl.col("u_p").sum().alias("realized_prompt_tokens"),
                                       pl.col("u_c").sum().alias("realized_hit_tokens")))
            agg = agg.join(per, on=keys, how="left")
        else:
            tot = realized(con).row(0, named=True)
            agg = agg.with_columns(pl.lit(tot["realized_requests"], pl.Int64).alias("realized_requests"),
                                   pl.lit(tot["realized_prompt_tokens"], pl.Int64).alias("realized_prompt_tokens"),
                                   pl.lit(tot["realized_hit_tokens"], pl.Int64).alias("realized_hit_tokens"))
        agg = agg.with_columns(
            pl.when(pl.col("realized_requests") > 0).then(pl.col("realized_prompt_tokens")).otherwise(None)
            .alias("realized_prompt_tokens"),
            pl.when(pl.col("realized_requests") > 0).then(pl.col("realized_hit_tokens")).otherwise(None)
            .alias("realized_hit_tokens"))
        agg = agg.with_columns(
            pl.when(pl.col("prompt_tokens") > 0).then(pl.col("hit_tokens") / pl.col("prompt_tokens"))
            .otherwise(0.0).alias("hit_ratio"),
            pl.when(pl.col("realized_prompt_tokens") > 0)
            .then(pl.col("realized_hit_tokens") / pl.col("realized_prompt_tokens")).otherwise(None)
            .alias("realized_hit_ratio"),
            pl.when(pl.col("ttl").is_infinite()).then(None).otherwise(pl.col("ttl")).alias("ttl_s"),
            pl.lit(spec).alias("profile"))
        order = {m: i for i, m in enumerate(list(grid.streams) + ["org+key"])}
        agg = (agg.rename({"stream": "stream_key"} if by_stream else {})
               .rename({"stream_mode": "stream"})
               .with_columns(pl.col("stream").replace_strict(order, default=99, return_dtype=pl.Int32).alias("_o"))
               .sort(["_o", "ttl", "block", "min_prefix"] + (["stream_key"] if by_stream else [])))
        cols = RESULT_COLS[:2] + (["stream_key"] if by_stream else []) + RESULT_COLS[2:]
        frames.append(agg.select(cols).with_columns(
            pl.col("requests").cast(pl.Int64), pl.col("prompt_tokens").cast(pl.Int64),
            pl.col("hit_tokens").cast(pl.Int64), pl.col("requests_hit").cast(pl.Int64),
            pl.col("realized_requests").cast(pl.Int64), pl.col("block").cast(pl.Int64),
            pl.col("min_prefix").cast(pl.Int64)))
    out = pl.concat(frames) if frames else pl.DataFrame()
    if store and not by_stream and len(out):
        for spec in profiles:
            con.execute("DELETE FROM results WHERE profile = ?", [spec])
        res = out.select(["profile", "stream", "ttl_s", "block", "min_prefix", "requests", "prompt_tokens",
                          "hit_tokens", "hit_ratio", "requests_hit"]).to_arrow()
        con.register("_profile_res", res)
        con.execute("INSERT INTO results SELECT * FROM _profile_res")
        con.unregister("_profile_res")
    return out


def _realized_by_request(con) -> pl.DataFrame:
    return _df(con, """SELECT request_id, usage_prompt_tokens AS u_p,
                              CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cached_tokens, 0) END
                                  AS u_c,
                              CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cache_write_tokens, 0)
                                  END AS u_w
                       FROM requests""")


def per_request_agreement(con, profile: str = "deepseek", stream: str = "global",
                          ttl: float = math.inf) -> pl.DataFrame:
    """Predicted against realised cached tokens per request (requests with usage).

    Columns: request_id, stream, ts, prompt_tokens (rendered), usage_prompt_tokens,
    predicted, realized, ``abs_diff_share`` = |predicted / prompt_tokens − realised /
    usage_prompt_tokens| (each side in its own tokenization, so a constant
    template overhead does not count as disagreement) and
    ``abs_diff_tokens_share`` = |predicted − realised| / usage_prompt_tokens.
    """
    prof = get_profile(profile)
    g = Grid(ttls=(ttl,), blocks=(prof.block or 1,), min_prefixes=(prof.min_prefix or 0,),
             streams=prof.streams or (stream,))
    df = request_hits(con, prof, g)
    if prof.kind == "anthropic":
        df = df.filter(pl.col("ttl") == df["ttl"].min())
    rz = _realized_by_request(con).filter(pl.col("u_p").is_not_null())
    j = df.join(rz, on="request_id", how="inner")
    return j.select(
        "request_id", "stream", "ts", "prompt_tokens", pl.col("u_p").alias("usage_prompt_tokens"),
        pl.col("hit").alias("predicted"), pl.col("u_c").alias("realized"),
        (pl.col("hit") / pl.col("prompt_tokens").clip(1) - pl.col("u_c") / pl.col("u_p").clip(1)).abs()
        .alias("abs_diff_share"),
        ((pl.col("hit") - pl.col("u_c")).abs() / pl.col("u_p").clip(1)).alias("abs_diff_tokens_share")).sort("ts")
