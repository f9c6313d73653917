"""Savings judged per model (``--profile auto``, the report's default): each
request's ceiling under its own model's profile, priced at its own model's price
entry, per cache (stream key, model) and ISO week; totals summed across models.

    from replay.providers.model_savings import auto_frame, model_savings
    model_savings(con)                                   # every (stream, model, week), with totals
    model_savings(con, since_us=t0, until_us=t1)         # a time window: [t0, t1)
    model_savings(con, request_ids=ids, by_week=False)   # a set of requests, one row per (stream, model)
    f = auto_frame(con); model_savings(con, frame=f, ...)  # several windows from one replay

The hits are always computed over the whole log, in time order, and then the
asked-for requests kept: a request early in a window is hit by prefixes cached
before it (as ``replay.core.warmup`` counts a subset). Which profile and price
judge a model: ``replay.providers.auto`` and ``replay.providers.catalog.model_family``.
The formula is ``replay.providers.economics``'s (semantics.md, "Savings").

**Left on the table** = ceiling − realised. Where the realised ratio (the
provider's usage) exceeds the ceiling, no negative saving is shown: the row
names the reason instead (``exception``, ``reason``), found by recomputing the
ceiling with the profile's rules loosened one at a time (``replay.providers.auto.stages``):

* ``retention`` — the provider kept prefixes longer than the profile's TTL (at a
  longer documented retention the profile reaches the realised ratio);
* ``minimum`` — the provider cached prefixes the profile's minimum length (or,
  for OpenAI, its 128-token increments) excludes;
* ``breakpoints`` — (Anthropic) the provider read prefixes at positions the
  profile's breakpoint and 20-block lookback rules exclude;
* ``granularity`` — (walk profiles) the profile's block size or minimum;
* ``definition`` — even the contract's loosest ceiling on the same caches
  (block 1, no minimum, TTL ∞) is below the realised ratio: the provider counts
  tokens its own way (its chat template's extra tokens sit in the always-cached
  prefix; the rendered-vs-provider token offset is given), or shares its cache
  beyond the stream;
* ``mixed`` — a total over several models: see their own rows.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from replay.providers import economics as ec
from replay.providers.auto import MAX_STAGES, auto_hits, bound_hits, is_auto, model_choices, stages
from replay.providers.catalog import get_profile, judging_config
from replay.store import db

_PRICE_COLS = {"input": "p_in", "cache_read": "p_read", "cache_write_5m": "p_w5", "cache_write_1h": "p_w1",
               "output": "p_out"}
COLUMNS = ["stream", "model", "profile", "price_model", "week", "requests", "prompt_tokens", "hit_tokens",
           "write_5m", "write_1h", "hit_ratio", "priced_requests", "full_price_cost", "projected_cost",
           "projected_savings", "usage_requests", "usage_prompt_tokens", "usage_cached_tokens",
           "usage_write_tokens", "realized_hit_ratio", "actual_cost", "actual_full_price_cost", "actual_savings",
           "actual_output_cost", "left_on_table", "exception", "reason"]


def auto_frame(con, stream: str = "tenant", prices_path=None, tokenizer=None, progress: bool = False
               ) -> pl.DataFrame:
    """One row per request judged by its own model's profile (``auto.auto_hits``),
    with its model's prices (USD/MTok; null when unpriced), its usage (u_p, u_c,
    u_w, u_o), session and ISO week."""
    prices = ec.load_prices(prices_path)
    choices = model_choices(con, prices)
    df = auto_hits(con, choices, stream, tokenizer=tokenizer, progress=progress)
    tbl = pl.DataFrame({"price_model": list(prices), **{c: [getattr(p, a) for p in prices.values()]
                                                        for a, c in _PRICE_COLS.items()}},
                       schema={"price_model": pl.Utf8, **{c: pl.Float64 for c in _PRICE_COLS.values()}})
    usage = pl.from_arrow(db.arrow(con, """SELECT request_id, session, usage_prompt_tokens AS u_p,
        CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cached_tokens, 0) END AS u_c,
        CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cache_write_tokens, 0) END AS u_w,
        usage_output_tokens AS u_o FROM requests"""))
    return (df.join(tbl, on="price_model", how="left").join(usage, on="request_id", how="left")
            .with_columns(ec._week().alias("week")))


def _costs(df: pl.DataFrame) -> pl.DataFrame:
    """Per-request spend (USD) at the request's own prices; null when unpriced / without usage."""
    b, r, w5, w1, o = (pl.col(c) for c in _PRICE_COLS.values())
    return df.with_columns(
        (pl.col("prompt_tokens") * b / ec.MTOK).alias("c_full"),
        (((pl.col("prompt_tokens") - pl.col("hit") - pl.col("write_5m") - pl.col("write_1h")) * b
          + pl.col("hit") * r + pl.col("write_5m") * w5 + pl.col("write_1h") * w1) / ec.MTOK).alias("c_proj"),
        (((pl.col("u_p") - pl.col("u_c") - pl.col("u_w")) * b + pl.col("u_c") * r + pl.col("u_w") * w5)
         / ec.MTOK).alias("c_act"),
        (pl.col("u_p") * b / ec.MTOK).alias("c_act_full"),
        pl.when(pl.col("u_o") > 0).then(pl.col("u_o") * o / ec.MTOK).alias("c_out"))


def _aggs(bounds: bool) -> list[pl.Expr]:
    has_usage = pl.col("u_p").is_not_null()
    out = [pl.len().alias("requests"), pl.col("prompt_tokens").sum().alias("prompt_tokens"),
           pl.col("hit").sum().alias("hit_tokens"), pl.col("write_5m").sum().alias("write_5m"),
           pl.col("write_1h").sum().alias("write_1h"), pl.col("p_in").count().alias("priced_requests"),
           (has_usage & pl.col("p_in").is_not_null()).sum().alias("_priced_usage"),
           pl.col("u_p").count().alias("usage_requests"), pl.col("u_p").sum().alias("usage_prompt_tokens"),
           pl.col("u_c").sum().alias("usage_cached_tokens"), pl.col("u_w").sum().alias("usage_write_tokens"),
           pl.col("prompt_tokens").filter(has_usage).sum().alias("_rendered_with_usage"),
           pl.col("hit").filter(has_usage).sum().alias("_hit_with_usage"),
           pl.col("c_full").sum().alias("full_price_cost"), pl.col("c_proj").sum().alias("projected_cost"),
           pl.col("c_act").sum().alias("actual_cost"), pl.col("c_act_full").sum().alias("actual_full_price_cost"),
           pl.col("c_out").sum().alias("actual_output_cost"), pl.col("c_out").count().alias("_outputs"),
           pl.col("profile").n_unique().alias("_profiles"), pl.col("profile").first().alias("profile"),
           pl.col("price_model").n_unique().alias("_prices"), pl.col("price_model").first().alias("price_model")]
    if bounds:
        out += [pl.col(f"b{i}").filter(has_usage).sum().alias(f"b{i}") for i in range(MAX_STAGES)]
    return out


def _table(df: pl.DataFrame, by_week: bool, total: bool, bounds: bool) -> pl.DataFrame:
    aggs = _aggs(bounds)
    wk = pl.col("week") if by_week else pl.lit("ALL")
    df = df.with_columns(wk.alias("week"))
    parts = [df.group_by(["stream", "model", "week"]).agg(aggs)]
    if total:
        parts.append(df.group_by("model").agg(aggs).with_columns(pl.lit("ALL").alias("stream"),
                                                                 pl.lit("ALL").alias("week")))
        if by_week:
            parts.append(df.group_by("week").agg(aggs).with_columns(pl.lit("ALL").alias("stream"),
                                                                    pl.lit("ALL").alias("model")))
        parts.append(df.select(aggs).with_columns(pl.lit("ALL").alias("stream"), pl.lit("ALL").alias("model"),
                                                  pl.lit("ALL").alias("week")))
    cols = list(parts[0].columns)
    g = pl.concat([p.select(cols).with_columns(pl.col("model").cast(pl.Utf8)) for p in parts], how="vertical_relaxed")
    has = pl.col("usage_requests") > 0
    priced, priced_usage = pl.col("priced_requests") > 0, pl.col("_priced_usage") > 0
    g = g.with_columns(
        (pl.col("hit_tokens") / pl.col("prompt_tokens").clip(1)).alias("hit_ratio"),
        pl.when(has).then(pl.col("usage_cached_tokens") / pl.col("usage_prompt_tokens").clip(1))
        .alias("realized_hit_ratio"),
        pl.when(pl.col("_profiles") == 1).then(pl.col("profile")).otherwise(pl.lit("(several)")).alias("profile"),
        pl.when(pl.col("_prices") > 1).then(pl.lit("(several)")).otherwise(pl.col("price_model"))
        .alias("price_model"),
        *[pl.when(priced).then(pl.col(c)).alias(c) for c in ("full_price_cost", "projected_cost")],
        *[pl.when(priced_usage).then(pl.col(c)).alias(c) for c in ("actual_cost", "actual_full_price_cost")],
        pl.when(pl.col("_outputs") > 0).then(pl.col("actual_output_cost")).alias("actual_output_cost"),
        *[pl.when(has).then(pl.col(c)).alias(c) for c in ("usage_prompt_tokens", "usage_cached_tokens",
                                                          "usage_write_tokens")])
    g = g.with_columns((pl.col("full_price_cost") - pl.col("projected_cost")).alias("projected_savings"),
                       (pl.col("actual_full_price_cost") - pl.col("actual_cost")).alias("actual_savings"))
    # compared on the same requests: those that carry usage
    g = g.with_columns(pl.when(has).then(pl.col("_hit_with_usage") / pl.col("_rendered_with_usage").clip(1))
                       .alias("_ceiling_u"))
    over = pl.col("realized_hit_ratio") > pl.col("_ceiling_u") + 1e-12
    return g.with_columns(pl.when(over).then(None).otherwise(pl.col("_ceiling_u") - pl.col("realized_hit_ratio"))
                          .alias("left_on_table"), over.fill_null(False).alias("_over"))


def _reason(r: dict) -> tuple[str, str]:
    """(code, text) for a row whose realised ratio exceeds its ceiling (module docstring)."""
    ceil, real, base = r["_ceiling_u"], r["realized_hit_ratio"], max(r["_rendered_with_usage"] or 0, 1)
    head = f"ceiling {100 * ceil:.1f}% < realised {100 * real:.1f}%"
    if r["_profiles"] != 1 or r["profile"] == "(several)":
        return "mixed", f"{head} over several models: see each model's rows"
    st = stages(r["profile"])
    prof = get_profile(r["profile"])
    ttl, _, mn = judging_config(prof)
    chain = []
    for i, s in enumerate(st):
        x = (r.get(f"b{i}") or 0) / base
        chain.append(f"{s.label} {100 * x:.1f}%")
        if x + 1e-12 >= real:
            what = {"retention": f"the provider kept prefixes longer than the profile's {_ttl_text(ttl)} TTL",
                    "minimum": f"the provider cached prefixes the profile's {mn}-token minimum"
                               + (" and 128-token increments" if prof.kind == "openai" else "") + " exclude",
                    "breakpoints": "the provider read prefixes at positions the profile's breakpoint and "
                                   f"{prof.params.get('lookback', 20)}-block lookback rules exclude",
                    "granularity": "the provider cached at a finer granularity than the profile's blocks / minimum",
                    }[s.reason]
            return s.reason, (f"{head}: {what} (a provider rule the profile lacks) — the profile's ceiling with "
                              f"its rules loosened in turn: {' → '.join(chain)}")
    loose = (r.get(f"b{len(st) - 1}") or 0) if st else r["_hit_with_usage"]
    rendered, provider = r["_rendered_with_usage"] or 0, r["usage_prompt_tokens"] or 0
    offset = (f"; the provider counts {provider:,} prompt tokens where the replay renders {rendered:,} "
              f"({100 * (provider - rendered) / max(rendered, 1):+.0f}%)" if rendered else "")
    return "definition", (f"{head}: a definition difference — even the loosest ceiling on the same caches (block 1, "
                          f"no minimum, TTL ∞) is {100 * loose / base:.1f}%{offset}"
                          + (f" (loosened in turn: {' → '.join(chain)})" if chain else "") + ": the "
                          "provider's tokenizer and chat template differ from the replay's (template tokens sit "
                          "in the always-cached prefix), or it shares its cache beyond the stream")


def _ttl_text(ttl: float) -> str:
    return "no-expiry" if ttl == float("inf") else (f"{ttl / 60:g} min" if ttl < 3600 else f"{ttl / 3600:g} h")


def model_savings(con, stream: str = "tenant", prices_path=None, request_ids=None, since_us: int | None = None,
                  until_us: int | None = None, by_week: bool = True, total: bool = True,
                  frame: pl.DataFrame | None = None, reasons: bool = True, tokenizer=None) -> pl.DataFrame:
    """Spend and savings per cache (stream key, model) and ISO week (``week='ALL'``
    when not ``by_week``), each request judged by its own model's profile and
    priced at its own model's prices; with ``total``, rows ``stream='ALL'`` per
    model, per week (``model='ALL'``) and overall (dollars summed across models).

    Restrict to ``request_ids`` and/or the time window ``since_us ≤ ts_us <
    until_us`` (µs); the hits still come from the whole log (module docstring).
    ``frame``: :func:`auto_frame`'s result, to reuse one replay. Columns:
    :data:`COLUMNS` — ratios, costs in USD (null where unpriced or without
    usage), ``left_on_table`` (ceiling − realised over the requests that carry
    usage — the same as ``hit_ratio − realized_hit_ratio`` when all do —, never
    negative: null where realised exceeds the ceiling), and there ``exception``
    (the reason's code) and ``reason`` (in words) when ``reasons``.
    """
    df = frame if frame is not None else auto_frame(con, stream, prices_path, tokenizer=tokenizer)
    if request_ids is not None:
        df = df.filter(pl.col("request_id").is_in(list(request_ids)))
    if since_us is not None:
        df = df.filter(pl.col("ts_us") >= since_us)
    if until_us is not None:
        df = df.filter(pl.col("ts_us") < until_us)
    df = _costs(df)
    g = _table(df, by_week, total, bounds=False)
    models = set(g.filter(pl.col("_over") & pl.col("model").ne_missing("ALL"))["model"].to_list())
    if reasons and models:
        choices = model_choices(con, ec.load_prices(prices_path))
        b = bound_hits(con, choices, models, stream, tokenizer=tokenizer)
        df = df.join(b, on="request_id", how="left")
        g = _table(df, by_week, total, bounds=True)
    codes, texts = [], []
    for r in g.to_dicts():
        code, text = _reason(r) if (r["_over"] and reasons) else (None, None)
        codes.append(code)
        texts.append(text)
    g = g.with_columns(pl.Series("exception", codes, pl.Utf8), pl.Series("reason", texts, pl.Utf8))
    return g.select(COLUMNS).sort([pl.col("stream") == "ALL", "stream", pl.col("model").eq_missing("ALL"),
                                   pl.col("model").is_null(), "model", pl.col("week") == "ALL", "week"])


# ----------------------------------------------------------------------------- the report section

def savings_section(con, out_dir, profile: str | None = None, price_model: str | None = None, prices_path=None,
                    stream: str = "tenant") -> str:
    """The report's savings section. By default (``profile`` None or ``auto``, no
    ``price_model``) each model judged and priced on its own (:func:`model_savings`);
    a named ``profile`` or a ``price_model`` judges and prices the whole log by that
    one (``economics.savings_section``)."""
    if price_model is not None or (profile is not None and not is_auto(profile)):
        return ec.savings_section(con, out_dir, profile=profile, price_model=price_model, prices_path=prices_path,
                                  stream=stream)
    prices = ec.load_prices(prices_path)
    choices = model_choices(con, prices)
    frame = auto_frame(con, stream, prices_path)
    tbl = model_savings(con, stream, prices_path, frame=frame)
    lines = ["## Savings — each model judged by its own profile, at its own prices (`--profile auto`)", "",
             "Each request's ceiling comes from its own model's profile at the profile's rules (Anthropic and "
             f"OpenAI 5 min TTL; stream mode `{stream}`, OpenAI's own partition organisation + prompt_cache_key), "
             "and is priced at its own model's entry of the price table; totals add the models' dollars. "
             "savings = Σ cached × (base − read) − Σ written × (write − base). *Actual* is priced from the "
             "provider's usage fields; *projected* from the replay. Models:", "",
             "| model | requests | family | judged by | price entry (USD/MTok: input / read / write 5m / output) "
             "| note |", "|---|---|---|---|---|---|"]
    counts = {row["model"]: row["len"] for row in frame.group_by("model").len().to_dicts()}
    for m, c in choices.items():
        p = prices.get(c.price) if c.price else None
        price = (f"`{p.model}`: {p.input:g} / {p.cache_read:g} / {p.cache_write_5m:g} / {p.output:g} "
                 f"(as of {p.as_of})" if p else "**none: unpriced** (add it to a prices file; its dollars are "
                 "left out of the totals)")
        judged = f"`{c.profile}`" + ("" if c.family.known else " — **not a provider profile**")
        lines.append(f"| {m if m is not None else '(none)'} | {counts.get(m, 0):,} | {c.family.family} | {judged} "
                     f"| {price} | {c.family.note} |")
    lines += ["", "### Realised against ceiling, per stream, model and week", "",
              "| stream | model | week | requests | ceiling hit | realised hit | left on the table | full price | "
              "projected spend | projected savings | actual spend | actual savings |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    for r in tbl.head(300).to_dicts():
        if r["exception"] is not None:
            notes.append(f"{r['stream']} · {r['model'] or '(none)'} · {r['week']} — **{r['exception']}**: "
                         f"{r['reason']}")
            left = f"none ({r['exception']}, note {len(notes)})"
        else:
            left = "–" if r["left_on_table"] is None else f"{100 * r['left_on_table']:.1f} pts"
        lines.append(
            f"| {r['stream']} | {r['model'] or '(none)'} | {r['week']} | {r['requests']:,} | "
            f"{ec._fmt_pct(r['hit_ratio'])} | {ec._fmt_pct(r['realized_hit_ratio'])} | {left} | "
            f"{ec._fmt_usd(r['full_price_cost'])} | {ec._fmt_usd(r['projected_cost'])} | "
            f"{ec._fmt_usd(r['projected_savings'])} | {ec._fmt_usd(r['actual_cost'])} | "
            f"{ec._fmt_usd(r['actual_savings'])} |")
    if len(tbl) > 300:
        lines.append(f"\n({len(tbl) - 300} more rows in savings.csv)")
    if notes:
        lines += ["", "**Where the realised ratio exceeds the ceiling** nothing is left on the table; the reason, "
                  "from the ceiling recomputed with the profile's rules loosened one at a time:", ""]
        lines += [f"{i}. {n}" for i, n in enumerate(notes, 1)]
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tbl.write_csv(Path(out_dir) / "savings.csv")
    except OSError:
        pass
    lines += ec.session_length_lines(ec.session_length_table(con, frame=frame))
    png = ec._plot_weekly(tbl.filter(pl.col("model") == "ALL"), Path(out_dir))
    if png:
        lines += ["", f"![realised against ceiling per week]({png})"]
    fid = ec.fidelity_section(con)
    if fid:
        lines += ["", fid]
    return "\n".join(lines) + "\n"
