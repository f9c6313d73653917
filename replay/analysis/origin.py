"""Hit origin in the report: whose writes the hits read (docs/origin.md).

Each hit token is attributed to the request that last wrote its prefix — the
same session, another session of the same tenant, or another tenant — by the
sweep itself (``hit_same_session``, ``hit_other_session``, ``hit_other_tenant``,
adding up to ``hit_tokens``). This section shows those shares per stream mode
at the report's headline TTL and block, beside how many requests carry what a
provider could route on: a session id and a ``prompt_cache_key``.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from replay.analysis.report import headline_config
from replay.core.grid import Grid
from replay.core.sweep import ORIGIN_COLUMNS, sweep
from replay.times import format_ttl
from replay.prepare import prepare

LABELS = {"hit_same_session": "same session", "hit_other_session": "other session",
          "hit_other_tenant": "other tenant"}


def origin_figures(con, grid: Grid) -> pl.DataFrame:
    """The aggregate sweep rows (with their origin columns) of every stream mode of
    ``grid`` at its headline TTL, block and minimum prefix (``headline_config``)."""
    h = headline_config(grid)
    g = Grid(ttls=(h["ttl"],), blocks=(h["block"],), min_prefixes=(h["min_prefix"],), streams=grid.streams,
             warmup=grid.warmup)
    prepare(con, modes=g.streams, horizon_us=g.horizon_us)
    return sweep(con, g, store=False)


def routable_shares(con) -> dict:
    """How many requests carry a session id, a prompt_cache_key, either or both."""
    n, session, key, either, both = con.execute(
        """SELECT count(*), count(session), count(prompt_cache_key),
                  count(*) FILTER (WHERE session IS NOT NULL OR prompt_cache_key IS NOT NULL),
                  count(*) FILTER (WHERE session IS NOT NULL AND prompt_cache_key IS NOT NULL)
           FROM requests""").fetchone()
    return {"requests": int(n), "session": int(session), "prompt_cache_key": int(key), "either": int(either),
            "both": int(both)}


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "–"


def origin_section(con, out: Path | None, grid: Grid) -> str:
    """Markdown: the hit origin per stream mode at the headline configuration, and
    the share of requests with a session id and a prompt_cache_key. (``out``, the
    report's folder, is not written to: the section has no plot.)"""
    h = headline_config(grid)
    res = origin_figures(con, grid)
    lines = ["## Where the hits come from", "",
             f"Each hit token at TTL {format_ttl(h['ttl'])}, block {h['block']}"
             + (f", minimum prefix {h['min_prefix']}" if h["min_prefix"] else "")
             + ", by who last wrote its prefix in the cache: the request's own session (same session id), "
               "another session of its tenant (or a request without a session id), or another tenant "
               "(only where a stream spans tenants: `global`, or a key or session id shared across "
               "tenants). Shares of hit tokens; they add up to 100 %.", "",
             "| stream | requests | hit % | " + " | ".join(LABELS.values()) + " |",
             "|---|---:|---:|" + "---:|" * len(LABELS)]
    for r in res.to_dicts():
        hit = r["hit_tokens"]
        lines.append(f"| {r['stream']} | {r['requests']:,} | {_pct(hit, r['prompt_tokens'])} | "
                     + " | ".join(_pct(r[c], hit) for c in ORIGIN_COLUMNS) + " |")
    s = routable_shares(con)
    n = s["requests"]
    lines += ["", "What a provider could route on — the requests that carry a session id or a "
              "`prompt_cache_key`. Routing on the session keeps the same-session hits; those written by "
              "another session or tenant need a cache shared beyond it:",
              "", "| carries | requests | share |", "|---|---:|---:|"]
    for label, k in (("a session id", "session"), ("a prompt_cache_key", "prompt_cache_key"),
                     ("either", "either"), ("both", "both")):
        lines.append(f"| {label} | {s[k]:,} | {_pct(s[k], n)} |")
    if math.isinf(h["ttl"]):
        lines += ["", "_With no TTL every earlier write counts: the shares are those of an unbounded cache._"]
    return "\n".join(lines) + "\n"
