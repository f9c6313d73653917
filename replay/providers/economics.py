"""What the cache is worth: spend per stream and ISO week, realised against the
profile's ceiling, and the rendering-fidelity check on logs with provider usage.

Prices come from ``replay/providers/prices.toml`` (dated defaults, USD per MTok), merged
with a user file of the same layout (:func:`load_prices`). The savings formula
(semantics.md, "Savings"):

    savings = Σ cached × (base − read) − Σ written × (write − base)

with the write price of each written token's TTL (5 min or 1 h). Spend figures
cover *input* tokens (what caching changes); output spend is shown apart where
the log has output usage.

* **full price**: the same prompt volume with no caching at all, ``prompt × base``;
* **projected** (ceiling): the profile's per-request hits and writes
  (:func:`replay.providers.request_hits.request_hits`) priced, on the rendered token counts;
* **actual**: the provider's usage (``usage_prompt_tokens``, ``usage_cached_tokens``,
  ``usage_cache_write_tokens``, written at the 5-minute price since logs do not
  split writes by TTL), on the provider's token counts, for requests that carry it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from replay.core.grid import Grid
from replay.times import US_PER_S
from replay.providers.catalog import get_profile, judging_config
from replay.providers.request_hits import request_hits
from replay.store import db
from replay.text.renderers import render_of

DEFAULT_PRICES = Path(__file__).with_name("prices.toml")
MTOK = 1_000_000


@dataclass(frozen=True)
class Price:
    model: str
    input: float
    cache_read: float
    cache_write_5m: float
    cache_write_1h: float
    output: float
    provider: str = ""
    profile: str = ""
    source: str = ""
    as_of: str = ""


def load_prices(path: str | Path | None = None) -> dict[str, Price]:
    """The shipped price table, with ``path`` (same TOML layout) merged over it."""
    tables = [tomllib.loads(DEFAULT_PRICES.read_text())]
    if path is not None:
        tables.append(tomllib.loads(Path(path).read_text()))
    merged: dict[str, dict] = {}
    for t in tables:
        for name, row in (t.get("models") or {}).items():
            merged.setdefault(name, {}).update(row)
    out = {}
    for name, row in merged.items():
        base = float(row["input"])
        out[name] = Price(
            name, base, float(row.get("cache_read", base)), float(row.get("cache_write_5m", base)),
            float(row.get("cache_write_1h", row.get("cache_write_5m", base))), float(row.get("output", 0.0)),
            str(row.get("provider", "")), str(row.get("profile", "")), str(row.get("source", "")),
            str(row.get("as_of", "")))
    return out


def get_price(price_model: str | Price, prices_path=None) -> Price:
    if isinstance(price_model, Price):
        return price_model
    prices = load_prices(prices_path)
    if price_model in prices:
        return prices[price_model]
    hits = [k for k in prices if price_model.startswith(k) or k.startswith(price_model)]
    if hits:
        return prices[max(hits, key=len)]
    raise ValueError(f"no price for model {price_model!r}; known: {', '.join(prices)} "
                     "(add it to a prices file and pass its path)")


def savings_per_request(hit, write_5m, write_1h, price: Price):
    """Savings (USD) of one request or column expression: the formula above."""
    return (hit * (price.input - price.cache_read) - write_5m * (price.cache_write_5m - price.input)
            - write_1h * (price.cache_write_1h - price.input)) / MTOK


def default_config(profile: str) -> tuple[float, int, int]:
    """(ttl, block, min_prefix) used for savings when not given: the profile's
    fixed values, else token level with no minimum; the provider's TTL
    (OpenAI in-memory 5 min, Anthropic 5 min), else no expiry."""
    return judging_config(get_profile(profile))


def _week(ts_col: str = "ts_us") -> pl.Expr:
    """ISO week 'YYYY-Www' for epoch times (µs); 'w<n>' (n = whole weeks) for relative times."""
    c = pl.col(ts_col)
    iso = pl.from_epoch(c, time_unit="us")
    return (pl.when(c > 100_000_000 * US_PER_S)
            .then(iso.dt.iso_year().cast(pl.Utf8) + "-W" + iso.dt.week().cast(pl.Utf8).str.zfill(2))
            .otherwise(pl.lit("w") + (c // (604800 * US_PER_S)).cast(pl.Utf8)))


def _requests_frame(con, profile: str, stream: str, ttl: float | None, block: int | None,
                    min_prefix: int | None) -> pl.DataFrame:
    d_ttl, d_block, d_min = default_config(profile)
    g = Grid(ttls=(d_ttl if ttl is None else ttl,), blocks=(block or d_block,),
             min_prefixes=(d_min if min_prefix is None else min_prefix,), streams=(stream,))
    df = request_hits(con, profile, g)
    usage = _df(con, """SELECT request_id, session, usage_prompt_tokens AS u_p,
        CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cached_tokens, 0) END AS u_c,
        CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cache_write_tokens, 0) END AS u_w,
        usage_output_tokens AS u_o FROM requests""")
    return df.join(usage, on="request_id", how="left")


def savings_table(con, profile: str, price_model: str | Price, prices_path=None, stream: str = "tenant",
                  ttl: float | None = None, block: int | None = None, min_prefix: int | None = None,
                  total: bool = True) -> pl.DataFrame:
    """Spend and savings per stream and ISO week (plus ``stream='ALL'`` rows per
    week and an ``ALL``/``ALL`` grand total when ``total``).

    Columns: stream, week, requests, prompt_tokens, hit_tokens, write_5m, write_1h,
    hit_ratio, full_price_cost, projected_cost, projected_savings,
    usage_requests, usage_prompt_tokens, usage_cached_tokens, usage_write_tokens,
    realized_hit_ratio, actual_cost, actual_full_price_cost, actual_savings,
    actual_output_cost (costs in USD; ``actual_*`` null where no request has usage).
    """
    price = get_price(price_model, prices_path)
    df = _requests_frame(con, profile, stream, ttl, block, min_prefix).with_columns(_week().alias("week"))
    b, r, w5, w1, o = price.input, price.cache_read, price.cache_write_5m, price.cache_write_1h, price.output
    aggs = [
        pl.len().alias("requests"), pl.col("prompt_tokens").sum().alias("prompt_tokens"),
        pl.col("hit").sum().alias("hit_tokens"), pl.col("write_5m").sum().alias("write_5m"),
        pl.col("write_1h").sum().alias("write_1h"),
        pl.col("u_p").count().alias("usage_requests"), pl.col("u_p").sum().alias("usage_prompt_tokens"),
        pl.col("u_c").sum().alias("usage_cached_tokens"), pl.col("u_w").sum().alias("usage_write_tokens"),
        pl.col("u_o").sum().alias("usage_output_tokens"),
    ]

    def finish(g: pl.DataFrame) -> pl.DataFrame:
        has = pl.col("usage_requests") > 0
        g = g.with_columns(
            (pl.col("hit_tokens") / pl.col("prompt_tokens").clip(1)).alias("hit_ratio"),
            (pl.col("prompt_tokens") * b / MTOK).alias("full_price_cost"),
            ((pl.col("prompt_tokens") - pl.col("hit_tokens") - pl.col("write_5m") - pl.col("write_1h")) * b
             + pl.col("hit_tokens") * r + pl.col("write_5m") * w5 + pl.col("write_1h") * w1).truediv(MTOK)
            .alias("projected_cost"),
            pl.when(has).then(pl.col("usage_cached_tokens") / pl.col("usage_prompt_tokens").clip(1))
            .alias("realized_hit_ratio"),
            pl.when(has).then(((pl.col("usage_prompt_tokens") - pl.col("usage_cached_tokens")
                                - pl.col("usage_write_tokens")) * b + pl.col("usage_cached_tokens") * r
                               + pl.col("usage_write_tokens") * w5) / MTOK).alias("actual_cost"),
            pl.when(has).then(pl.col("usage_prompt_tokens") * b / MTOK).alias("actual_full_price_cost"),
            pl.when(pl.col("usage_output_tokens") > 0).then(pl.col("usage_output_tokens") * o / MTOK)
            .alias("actual_output_cost"))
        return g.with_columns(
            (pl.col("full_price_cost") - pl.col("projected_cost")).alias("projected_savings"),
            (pl.col("actual_full_price_cost") - pl.col("actual_cost")).alias("actual_savings"))

    parts = [df.group_by(["stream", "week"]).agg(aggs)]
    if total:
        parts.append(df.group_by("week").agg(aggs).with_columns(pl.lit("ALL").alias("stream")))
        parts.append(df.select(aggs).with_columns(pl.lit("ALL").alias("stream"), pl.lit("ALL").alias("week")))
    cols = ["stream", "week", "requests", "prompt_tokens", "hit_tokens", "write_5m", "write_1h", "usage_requests",
            "usage_prompt_tokens", "usage_cached_tokens", "usage_write_tokens", "usage_output_tokens"]
    out = pl.concat([finish(p.select(cols).with_columns(pl.col(c).cast(pl.Int64) for c in cols[2:]))
                     for p in parts])
    out = out.with_columns(pl.when(pl.col("usage_requests") > 0).then(pl.col(c)).alias(c)
                           for c in ("usage_prompt_tokens", "usage_cached_tokens", "usage_write_tokens"))
    return out.select(
        "stream", "week", "requests", "prompt_tokens", "hit_tokens", "write_5m", "write_1h", "hit_ratio",
        "full_price_cost", "projected_cost", "projected_savings", "usage_requests", "usage_prompt_tokens",
        "usage_cached_tokens", "usage_write_tokens", "realized_hit_ratio", "actual_cost",
        "actual_full_price_cost", "actual_savings", "actual_output_cost",
    ).sort([pl.col("stream") == "ALL", "stream", pl.col("week") == "ALL", "week"])


SESSION_BUCKETS = ("1 turn", "2-19 turns", "20+ turns")


def session_length_table(con, profile: str = "ideal", stream: str = "tenant", ttl: float | None = None,
                         frame: pl.DataFrame | None = None) -> pl.DataFrame:
    """Hit ratio by session length (requests per session; a request without a
    session is a 1-turn session): predicted under ``profile`` and realised.
    ``frame``: per-request hits already computed (columns request_id, session,
    prompt_tokens, hit, u_p, u_c; ``replay.providers.model_savings.auto_frame``)."""
    df = frame if frame is not None else _requests_frame(con, profile, stream, ttl, None, None)
    df = df.with_columns(pl.col("session").fill_null(pl.lit("#") + pl.col("request_id").cast(pl.Utf8)))
    df = df.with_columns(pl.len().over("session").alias("turns"))
    df = df.with_columns(pl.when(pl.col("turns") == 1).then(pl.lit(SESSION_BUCKETS[0]))
                         .when(pl.col("turns") < 20).then(pl.lit(SESSION_BUCKETS[1]))
                         .otherwise(pl.lit(SESSION_BUCKETS[2])).alias("session_length"))
    g = df.group_by("session_length").agg(
        pl.col("session").n_unique().alias("sessions"), pl.len().alias("requests"),
        pl.col("prompt_tokens").sum().alias("prompt_tokens"), pl.col("hit").sum().alias("hit_tokens"),
        pl.col("u_p").sum().alias("usage_prompt_tokens"), pl.col("u_c").sum().alias("usage_cached_tokens"),
        pl.col("u_p").count().alias("usage_requests"))
    full = pl.DataFrame({"session_length": list(SESSION_BUCKETS)})
    g = full.join(g, on="session_length", how="left").with_columns(
        pl.col("sessions", "requests", "prompt_tokens", "hit_tokens").fill_null(0))
    return g.with_columns(
        (pl.col("hit_tokens") / pl.col("prompt_tokens").clip(1)).alias("hit_ratio"),
        pl.when(pl.col("usage_requests") > 0)
        .then(pl.col("usage_cached_tokens") / pl.col("usage_prompt_tokens").clip(1)).alias("realized_hit_ratio"))


# ----------------------------------------------------------------------------- fidelity

def _df(con, sql: str) -> pl.DataFrame:
    return pl.from_arrow(db.arrow(con, sql))


def fidelity(con) -> pl.DataFrame:
    """Rendered prompt tokens against the provider's ``usage_prompt_tokens`` per
    request (requests with both): diff = rendered − provider, rel_diff = diff / provider."""
    return _df(con, """
        SELECT r.request_id, r.session, r.format, r.model, p.n_tokens AS rendered_tokens,
               r.usage_prompt_tokens AS provider_tokens,
               p.n_tokens - r.usage_prompt_tokens AS diff,
               (p.n_tokens - r.usage_prompt_tokens) / r.usage_prompt_tokens::DOUBLE AS rel_diff
        FROM requests r JOIN prompts p USING (request_id)
        WHERE r.usage_prompt_tokens IS NOT NULL AND r.usage_prompt_tokens > 0
        ORDER BY r.ts_us, r.request_id""")


def fidelity_summary(df: pl.DataFrame) -> dict:
    if len(df) == 0:
        return {"requests": 0}
    q = lambda c, x: float(df[c].quantile(x))  # noqa: E731
    return {"requests": len(df), "rendered_tokens": int(df["rendered_tokens"].sum()),
            "provider_tokens": int(df["provider_tokens"].sum()),
            "diff_p05": q("diff", 0.05), "diff_median": q("diff", 0.5), "diff_p95": q("diff", 0.95),
            "rel_diff_p05": q("rel_diff", 0.05), "rel_diff_median": q("rel_diff", 0.5),
            "rel_diff_p95": q("rel_diff", 0.95), "exact_share": float((df["diff"] == 0).mean())}


def fidelity_section(con, out_dir=None) -> str:
    df = fidelity(con)
    if len(df) == 0:
        return ""
    s = fidelity_summary(df)
    used = db.get_meta(con, "tokenizer")
    how = {"deepseek": "DeepSeek's encoding (`--render deepseek`)",
           "template": "a chat template (`--chat-template`)"}.get(
        render_of(used), "the neutral template; `--render deepseek` renders DeepSeek's encoding")
    lines = ["## Rendering fidelity", "",
             f"Rendered prompt tokens ({how}; tokenizer {used or 'DeepSeek-V4'}) against the "
             "provider's reported prompt tokens, per request with usage. Hit ratios are computed on each side's own "
             "token counts; a steady offset (the provider's chat template adds role and tool-wrapper tokens) "
             "mostly sits in the always-cached prefix.", "",
             "| requests | rendered tokens | provider tokens | diff p5 / median / p95 (tokens) | "
             "relative p5 / median / p95 | exact |", "|---|---|---|---|---|---|",
             f"| {s['requests']:,} | {s['rendered_tokens']:,} | {s['provider_tokens']:,} | "
             f"{s['diff_p05']:+,.0f} / {s['diff_median']:+,.0f} / {s['diff_p95']:+,.0f} | "
             f"{100 * s['rel_diff_p05']:+.1f}% / {100 * s['rel_diff_median']:+.1f}% / {100 * s['rel_diff_p95']:+.1f}% | "
             f"{100 * s['exact_share']:.1f}% |", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- report section

def logged_price_model(con, prices_path=None) -> str | None:
    rows = db.arrow(con, "SELECT model, count(*) AS n FROM requests WHERE model IS NOT NULL "
                          "GROUP BY model ORDER BY n DESC").to_pylist()
    prices = load_prices(prices_path)
    for row in rows:
        try:
            return get_price(row["model"], prices_path).model
        except ValueError:
            m = row["model"].lower()
            for k in prices:
                if k in m or m in k:
                    return k
    return None


def session_length_lines(st: pl.DataFrame) -> list[str]:
    """The report's "Hit ratio by session length" table (rows of :func:`session_length_table`)."""
    lines = ["", "### Hit ratio by session length", "",
             "| session length | sessions | requests | prompt tokens | ceiling hit | realised hit |",
             "|---|---|---|---|---|---|"]
    for r in st.to_dicts():
        lines.append(f"| {r['session_length']} | {r['sessions']:,} | {r['requests']:,} | {r['prompt_tokens']:,} | "
                     f"{_fmt_pct(r['hit_ratio'])} | {_fmt_pct(r['realized_hit_ratio'])} |")
    return lines


def _fmt_pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _fmt_usd(x) -> str:
    return "–" if x is None else f"${x:,.2f}"


def savings_section(con, out_dir, profile: str | None = None, price_model: str | None = None,
                    prices_path=None, stream: str = "tenant") -> str:
    """Markdown: realised against ceiling per stream and week, the savings table,
    hit ratio by session length, and (when the log has usage) rendering fidelity —
    the whole log judged by one profile and priced at one model's prices (the
    report's default judges each model on its own:
    ``replay.providers.model_savings.savings_section``).
    Writes ``savings_weekly.png`` into ``out_dir`` when matplotlib is available."""
    price_model = price_model or logged_price_model(con, prices_path)
    if price_model is None:
        return ("## Savings\n\nNo logged model matches the price table; pass a price model "
                "(see `replay/providers/prices.toml`).\n")
    price = get_price(price_model, prices_path)
    profile = profile or price.profile or "ideal"
    tbl = savings_table(con, profile, price, stream=stream)
    ttl, block, mn = default_config(profile)
    lines = [f"## Savings — profile `{profile}`, prices `{price.model}`", "",
             f"Prices (USD/MTok, as of {price.as_of}, {price.source}): input {price.input}, cache read "
             f"{price.cache_read}, write 5m {price.cache_write_5m}, write 1h {price.cache_write_1h}, "
             f"output {price.output}. Ceiling under the profile's rules (TTL {ttl:g} s, block {block}, "
             f"minimum {mn}; stream mode `{stream}`). savings = Σ cached × (base − read) − Σ written × "
             "(write − base). *Actual* is priced from the provider's usage fields; *projected* from the replay.", "",
             "### Realised against ceiling, per stream and week", "",
             "| stream | week | requests | ceiling hit | realised hit | left on the table | full price | "
             "projected spend | projected savings | actual spend | actual savings |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tbl.head(200).to_dicts():
        left = (None if r["realized_hit_ratio"] is None else r["hit_ratio"] - r["realized_hit_ratio"])
        lines.append(
            f"| {r['stream']} | {r['week']} | {r['requests']:,} | {_fmt_pct(r['hit_ratio'])} | "
            f"{_fmt_pct(r['realized_hit_ratio'])} | {'–' if left is None else f'{100 * left:+.1f} pts'} | "
            f"{_fmt_usd(r['full_price_cost'])} | {_fmt_usd(r['projected_cost'])} | "
            f"{_fmt_usd(r['projected_savings'])} | {_fmt_usd(r['actual_cost'])} | {_fmt_usd(r['actual_savings'])} |")
    if len(tbl) > 200:
        lines.append(f"\n({len(tbl) - 200} more rows in savings.csv)")
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tbl.write_csv(Path(out_dir) / "savings.csv")
    except OSError:
        pass
    lines += session_length_lines(session_length_table(con, profile, stream))
    png = _plot_weekly(tbl, Path(out_dir))
    if png:
        lines += ["", f"![realised against ceiling per week]({png})"]
    fid = fidelity_section(con)
    if fid:
        lines += ["", fid]
    return "\n".join(lines) + "\n"


def _plot_weekly(tbl: pl.DataFrame, out_dir: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    wk = tbl.filter((pl.col("stream") == "ALL") & (pl.col("week") != "ALL")).sort("week")
    if len(wk) == 0:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = list(range(len(wk)))
    ax.plot(x, [100 * v for v in wk["hit_ratio"].to_list()], marker="o", label="ceiling (profile)")
    if wk["realized_hit_ratio"].null_count() < len(wk):
        ax.plot(x, [None if v is None else 100 * v for v in wk["realized_hit_ratio"].to_list()],
                marker="s", label="realised (provider usage)")
    ax.set_xticks(x, wk["week"].to_list(), rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("hit ratio (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / "savings_weekly.png", dpi=120)
    plt.close(fig)
    return "savings_weekly.png"
