"""Week over week: per stream and ISO week, the ceiling, the realised ratio and the savings,
and the streams whose ceiling regressed — with the miss cause that grew most.

For the weekly batch job: each week's logs are ingested into the same database,
and the trend compares the weeks it holds, at one configuration (stream mode,
TTL, block, minimum prefix; the report's headline one by default).

* **Weeks** are ISO weeks (Monday 00:00 UTC to the next Monday, exclusive) of
  each request's own time: a request at exactly Monday 00:00 UTC opens the new
  week. Relative times (the same rule as the savings table: below 10⁸ s) are
  counted in whole weeks from 0, labelled ``w<n>``.
* **Ceiling**: the replay runs over the whole log — a request early in a week
  may hit a prefix cached late in the week before — and each request's hit
  (``L_τ`` floored to blocks, ``replay.core.hits``) counts in its own week, as
  ``replay.core.warmup`` counts a subset of the requests by time after a replay
  of them all. ``ceiling`` = hit tokens / prompt tokens of the cache's requests
  of that week.
* **Realised**: the provider's logged cache counts, as the savings table reads
  them: Σ ``usage_cached_tokens`` / Σ ``usage_prompt_tokens`` over the requests
  that carry usage (null when none does).
* **Savings** (USD), by default per model as the report's savings section
  computes them (``--profile auto``, ``replay.providers.model_savings``): each
  request judged by its own model's profile at that profile's judging
  configuration (not the trend's: ``projected_savings`` prices that profile's
  hits and writes, so it is not a price of the ``ceiling`` column) and priced
  at its own model's price entry; ``actual_savings`` prices the provider's
  usage. A row is one model, so its figures are the savings section's for that
  stream, model and week — summed over the section's streams where the
  profile partitions more finely than the trend's stream mode (OpenAI:
  organisation + ``prompt_cache_key``). The row names the ``profile`` and
  ``price_model`` (null: the model has no price entry — *unpriced*, its
  savings null, as the savings section shows them). With ``price_model``
  given, every model is instead priced at that one entry and judged at the
  trend's configuration (``replay.providers.economics.savings_per_request``:
  the ceiling's hits, the uncached remainder written at the 5-minute price).
  Savings are null without usage (actual) or without a price.
* **Regression**: a cache (stream key and model) whose ceiling dropped by more
  than ``threshold`` points from its previous week present in the log. Its
  *cause* is the part of the diagnosis (``replay.analysis.diagnose``: the
  premature-divergence causes such as ``timestamp``, the structural losses such
  as ``ttl_expired``, and ``new_content``) whose share of the week's prompt
  tokens grew most from that previous week. The ceiling's drop is exactly the
  sum of those growths (the parts add up to the prompt), so the named cause is
  the largest term of the drop. The diagnosis runs only when there is a
  regression to explain.

Nothing here shows prompt text: stream keys, models, week labels and figures.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import polars as pl

from replay.analysis.diagnose import CAUSES, miss_parts
from replay.analysis.diagnose.split import STRUCTURAL
from replay.core import hits
from replay.times import US_PER_S, format_ttl, parse_ttl, ttl_us
from replay.core.walks import read_walks
from replay.prepare import prepare
from replay.providers.economics import get_price, savings_per_request
from replay.providers.model_savings import auto_frame, model_savings
from replay.store import db

DEFAULT_THRESHOLD = 5.0  # points of ceiling
WEEK_US = 7 * 86400 * US_PER_S
_MONDAY_US = 3 * 86400 * US_PER_S  # 1970-01-01 was a Thursday: ISO weeks start 3 days before it
_EPOCH_MIN_US = 100_000_000 * US_PER_S  # below: relative times (the savings table's rule)
#: the parts a drop of the ceiling is made of, in the order ties are named
LOSSES = CAUSES + STRUCTURAL + ("new_content",)
ONE_WEEK = "one ISO week in the log"

ROW_COLUMNS = ["stream", "model", "week", "requests", "prompt_tokens", "hit_tokens", "requests_hit", "ceiling",
               "change_points", "usage_requests", "usage_prompt_tokens", "usage_cached_tokens", "realised",
               "profile", "price_model", "projected_savings", "actual_savings"]
#: ``pricing`` of a trend: each model at its own profile and prices, or one price entry for all
PER_MODEL, ONE_PRICE = "per model", "one price"


# ----------------------------------------------------------------------------- weeks

def week_keys(ts_us) -> list[tuple[int, int]]:
    """Each time's week as a sortable key: (1, ISO week number since the epoch's
    Monday) for epoch times, (0, whole weeks since 0) for relative times."""
    ts = np.asarray(ts_us, dtype=np.int64)
    epoch = ts > _EPOCH_MIN_US
    idx = np.where(epoch, (ts + _MONDAY_US) // WEEK_US, ts // WEEK_US)  # floor division, exact in int64
    return list(zip(epoch.astype(np.int64).tolist(), idx.tolist()))


def week_label(key: tuple[int, int]) -> str:
    """'2026-W47' (the ISO year and week of that Monday) or 'w3' (relative times)."""
    epoch, idx = key
    if not epoch:
        return f"w{idx}"
    monday = dt.date(1970, 1, 1) + dt.timedelta(days=7 * idx - 3)
    year, week, _ = monday.isocalendar()
    return f"{year}-W{week:02d}"


def week_labels(ts_us) -> tuple[list[str], list[str]]:
    """(each time's week label, the weeks present in time order)."""
    keys = week_keys(ts_us)
    names = {k: week_label(k) for k in set(keys)}
    return [names[k] for k in keys], [names[k] for k in sorted(names)]


# ----------------------------------------------------------------------------- ceilings

def request_ceilings(con, stream: str = "tenant", ttl: float = 300.0, block: int = 16,
                     min_prefix: int = 0) -> tuple[pl.DataFrame, list[str]]:
    """One row per request of mode ``stream`` (its walks must be current for ``ttl``):
    request_id, stream, model, week, prompt_tokens, hit — the hit of the replay over
    the whole log. Returns (frame, the weeks in time order)."""
    w = read_walks(con, (stream,), horizon_us=ttl_us(ttl))
    L = hits.depths_under(w.offsets, w.gaps, w.depths, [ttl_us(ttl)])[:, 0]
    labels, weeks = week_labels(w.ts_us)
    df = pl.DataFrame({"request_id": w.request_id, "stream": w.stream.tolist(), "model": w.model.tolist(),
                       "week": labels, "prompt_tokens": w.prompt_tokens,
                       "hit": hits.block_hit(L, int(block), int(min_prefix))},
                      schema={"request_id": pl.Int64, "stream": pl.Utf8, "model": pl.Utf8, "week": pl.Utf8,
                              "prompt_tokens": pl.Int64, "hit": pl.Int64})
    return df, weeks


def weekly_ceilings(con, stream: str = "tenant", ttl: float = 300.0, block: int = 16,
                    min_prefix: int = 0) -> pl.DataFrame:
    """Per cache (stream key, model) and week: requests, prompt_tokens, hit_tokens,
    requests_hit, ceiling — the sweep's figures restricted to that week's requests
    (the walks must be current; :func:`trend` prepares them)."""
    per, weeks = request_ceilings(con, stream, ttl, block, min_prefix)
    return _ceiling_rows(per, weeks)


def _ceiling_rows(per: pl.DataFrame, weeks: list[str]) -> pl.DataFrame:
    g = per.group_by("stream", "model", "week").agg(
        pl.len().cast(pl.Int64).alias("requests"), pl.col("prompt_tokens").sum(),
        pl.col("hit").sum().alias("hit_tokens"), (pl.col("hit") > 0).sum().cast(pl.Int64).alias("requests_hit"))
    g = g.with_columns((pl.col("hit_tokens") / pl.col("prompt_tokens").clip(1)).alias("ceiling"))
    return _in_order(g, weeks)


def _in_order(rows: pl.DataFrame, weeks: list[str]) -> pl.DataFrame:
    """Rows by cache, then week in time order."""
    order = pl.DataFrame({"week": weeks, "_w": list(range(len(weeks)))}, schema={"week": pl.Utf8, "_w": pl.Int64})
    return rows.join(order, on="week").sort(["stream", "model", "_w"], nulls_last=False).drop("_w")


# ----------------------------------------------------------------------------- usage and savings

def _usage(con) -> pl.DataFrame:
    """The provider's usage per request, as the savings table reads it (cached and
    written tokens count 0 where the request has usage but not those fields)."""
    return pl.from_arrow(db.arrow(con, """SELECT request_id, usage_prompt_tokens AS u_p,
        CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cached_tokens, 0) END AS u_c,
        CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cache_write_tokens, 0) END AS u_w
        FROM requests""")).cast({"request_id": pl.Int64, "u_p": pl.Int64, "u_c": pl.Int64, "u_w": pl.Int64})


def model_savings_rows(con, per: pl.DataFrame, stream: str = "tenant", prices_path=None,
                       tokenizer=None) -> pl.DataFrame:
    """Per trend row (stream, model, week of ``per``): profile, price_model,
    projected_savings, actual_savings from ``model_savings`` — each request judged
    by its own model's profile, priced at its own model's entry — over the row's
    requests (the section's rows of that model and week, summed where its streams
    are finer than the trend's)."""
    keys = {"stream": pl.Utf8, "model": pl.Utf8, "week": pl.Utf8}
    out = {**keys, "profile": pl.Utf8, "price_model": pl.Utf8, "projected_savings": pl.Float64,
           "actual_savings": pl.Float64}
    if per.is_empty():
        return pl.DataFrame(schema=out)
    frame = auto_frame(con, stream, prices_path, tokenizer=tokenizer)
    # each request labelled with the trend's cache and week: model_savings sums per label
    frame = frame.drop("stream", "week").join(per.select("request_id", "stream", "week"), on="request_id")
    g = model_savings(con, stream, prices_path, frame=frame, by_week=True, total=False, reasons=False)
    return g.select(*[pl.col(c).cast(t) for c, t in out.items()])


def _weekly_rows(con, per: pl.DataFrame, weeks: list[str], price, savings: pl.DataFrame | None = None
                 ) -> pl.DataFrame:
    """The ceiling rows with realised ratio, savings and the change from the cache's previous week:
    ``savings`` (:func:`model_savings_rows`) per model, else all at ``price`` (None: no savings)."""
    rows = _ceiling_rows(per, weeks)
    df = per.join(_usage(con), on="request_id", how="left")
    zero = pl.lit(0, dtype=pl.Int64)
    aggs = [pl.col("u_p").count().cast(pl.Int64).alias("usage_requests"),
            pl.col("u_p").sum().alias("usage_prompt_tokens"), pl.col("u_c").sum().alias("usage_cached_tokens")]
    if savings is None and price is not None:
        aggs += [savings_per_request(pl.col("hit"), pl.col("prompt_tokens") - pl.col("hit"), zero, price)
                 .sum().alias("projected_savings"),
                 savings_per_request(pl.col("u_c"), pl.col("u_w"), zero, price).sum().alias("actual_savings")]
    extra = df.group_by("stream", "model", "week").agg(aggs)
    keys = ["stream", "model", "week"]
    rows = rows.join(extra, on=keys, how="left", nulls_equal=True)
    if savings is not None:
        rows = rows.join(savings, on=keys, how="left", nulls_equal=True)
    rows = _in_order(rows, weeks)
    has = pl.col("usage_requests") > 0
    rows = rows.with_columns(
        pl.when(has).then(pl.col("usage_prompt_tokens")).alias("usage_prompt_tokens"),
        pl.when(has).then(pl.col("usage_cached_tokens")).alias("usage_cached_tokens"),
        pl.when(has).then(pl.col("usage_cached_tokens") / pl.col("usage_prompt_tokens").clip(1)).alias("realised"),
        (pl.col("ceiling") - pl.col("ceiling").shift(1).over(["stream", "model"])).mul(100).alias("change_points"))
    if savings is None:
        rows = rows.with_columns(pl.lit(None, dtype=pl.Utf8).alias("profile"),
                                 pl.lit(None if price is None else price.model, dtype=pl.Utf8).alias("price_model"))
    if savings is None and price is None:
        rows = rows.with_columns(pl.lit(None, dtype=pl.Float64).alias("projected_savings"),
                                 pl.lit(None, dtype=pl.Float64).alias("actual_savings"))
    else:
        rows = rows.with_columns(pl.when(has).then(pl.col("actual_savings")).alias("actual_savings"))
    return rows.select(ROW_COLUMNS)


# ----------------------------------------------------------------------------- regressions and causes

def _regressions(rows: pl.DataFrame, threshold: float) -> list[dict]:
    out = []
    prev: dict = {}
    for r in rows.iter_rows(named=True):  # a cache's weeks come in time order
        cache = (r["stream"], r["model"])
        p = prev.get(cache)
        prev[cache] = r
        if p is None:
            continue
        drop = 100 * (p["ceiling"] - r["ceiling"])
        if drop > threshold:
            out.append({"stream": r["stream"], "model": r["model"], "week": r["week"],
                        "previous_week": p["week"], "ceiling": r["ceiling"], "previous_ceiling": p["ceiling"],
                        "drop_points": drop, "cause": None, "cause_growth_points": None, "causes": {}})
    return out


def cause_shares(parts: pl.DataFrame, per: pl.DataFrame) -> dict:
    """(stream, model, week) → (prompt tokens, {loss: tokens}) from the diagnosis's
    per-request split (``miss_parts``), each request in its own week."""
    df = parts.select("request_id", "prompt_tokens", "cause", "premature", *STRUCTURAL, "new_content").join(
        per.select("request_id", "stream", "model", "week"), on="request_id")
    keys = ["stream", "model", "week"]
    base = df.group_by(keys).agg(pl.col("prompt_tokens").sum(), *[pl.col(c).sum() for c in STRUCTURAL],
                                 pl.col("new_content").sum())
    prem = df.filter(pl.col("cause").is_not_null()).group_by(keys + ["cause"]).agg(pl.col("premature").sum())
    out: dict = {}
    for r in base.iter_rows(named=True):
        out[(r["stream"], r["model"], r["week"])] = (r["prompt_tokens"], {c: int(r[c]) for c in STRUCTURAL}
                                                     | {"new_content": int(r["new_content"])})
    for r in prem.iter_rows(named=True):
        out[(r["stream"], r["model"], r["week"])][1][r["cause"]] = int(r["premature"])
    return out


def name_causes(regressions: list[dict], shares: dict) -> None:
    """Fill each regression's ``cause`` (the loss whose share of prompt tokens grew
    most from the previous week), its growth in points, and the three largest growths."""
    for reg in regressions:
        now = shares.get((reg["stream"], reg["model"], reg["week"]))
        before = shares.get((reg["stream"], reg["model"], reg["previous_week"]))
        if now is None or before is None:
            continue
        growth = {c: 100 * (now[1].get(c, 0) / max(now[0], 1) - before[1].get(c, 0) / max(before[0], 1))
                  for c in LOSSES}
        ranked = sorted(LOSSES, key=lambda c: (-growth[c], LOSSES.index(c)))
        reg["cause"], reg["cause_growth_points"] = ranked[0], growth[ranked[0]]
        reg["causes"] = {c: growth[c] for c in ranked[:3] if growth[c] > 0}


# ----------------------------------------------------------------------------- the trend

def trend(con, stream: str = "tenant", ttl: float | str = 300.0, block: int = 16, min_prefix: int = 0,
          threshold: float = DEFAULT_THRESHOLD, price_model: str | None = None, prices_path=None,
          causes: bool = True, tokenizer=None, progress: bool = False) -> dict:
    """Week over week at one configuration, as one JSON-ready dict:

    ``config``; ``weeks`` (in time order); ``single_week`` and ``note`` (a log of
    one week: no comparison, no regression possible); ``pricing`` — ``"per
    model"`` (the default: each model judged by its own profile at its own prices,
    as the report's savings section, module docstring) or ``"one price"`` (with
    ``price_model``); ``price_model`` (that one entry, else null);
    ``unpriced_models`` (per model: the logged models without a price entry, whose
    savings are null); ``rows`` — one per cache
    and week: stream, model, week, requests, prompt_tokens, hit_tokens,
    requests_hit, ceiling (ratio), change_points (from the cache's previous week
    present), usage_requests, usage_prompt_tokens, usage_cached_tokens, realised
    (ratio), profile (the one judging the savings; null with ``price_model``),
    price_model (null: unpriced), projected_savings, actual_savings (USD); ``regressions`` — stream,
    model, week, previous_week, ceiling, previous_ceiling, drop_points, cause,
    cause_growth_points, causes (the three largest growths, points);
    ``causes_computed`` (false when ``causes`` is off: the diagnosis is not run)."""
    ttl = parse_ttl(ttl)
    if int(block) < 1:
        raise ValueError("block must be ≥ 1")
    if int(min_prefix) < 0:
        raise ValueError("minimum prefix must be ≥ 0")
    if not threshold >= 0:
        raise ValueError("threshold must be ≥ 0 points")
    prepare(con, modes=(stream,), horizon_us=ttl_us(ttl), tokenizer=tokenizer, progress=progress)
    per, weeks = request_ceilings(con, stream, ttl, block, min_prefix)
    price = get_price(price_model, prices_path) if price_model else None
    savings = None if price is not None else model_savings_rows(con, per, stream, prices_path, tokenizer)
    rows = _weekly_rows(con, per, weeks, price, savings)
    unpriced = [] if price is not None else sorted(
        {m for m, p in rows.select("model", "price_model").unique().iter_rows() if p is None},
        key=lambda m: (m is None, m or ""))
    regressions = _regressions(rows, float(threshold))
    if regressions and causes:
        parts = miss_parts(con, ttl=ttl, block=int(block), min_prefix=int(min_prefix), stream=stream,
                           tokenizer=tokenizer)
        name_causes(regressions, cause_shares(parts, per))
    regressions.sort(key=lambda r: (weeks.index(r["week"]), -r["drop_points"], r["stream"]))
    return {"config": {"stream": stream, "ttl_s": None if ttl == math.inf else ttl, "block": int(block),
                       "min_prefix": int(min_prefix), "threshold_points": float(threshold)},
            "weeks": weeks, "single_week": len(weeks) == 1,
            "note": (f"{ONE_WEEK}: no week-over-week comparison, no regression possible" if len(weeks) == 1
                     else "no replayed request" if not weeks else None),
            "pricing": ONE_PRICE if price is not None else PER_MODEL,
            "price_model": price.model if price is not None else None, "unpriced_models": unpriced,
            "rows": rows.to_dicts(), "regressions": regressions, "causes_computed": bool(causes)}


# ----------------------------------------------------------------------------- text

def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _usd(x) -> str:
    return "–" if x is None else f"${x:,.2f}"


def _pts(x) -> str:
    return "–" if x is None else f"{x:+.1f}"


def _usd_of(r: dict, col: str) -> str:
    """A row's savings: 'unpriced' where its model has no price entry (null savings)."""
    return "unpriced" if r.get("price_model") is None else _usd(r[col])


def describe_savings(res: dict) -> str:
    """How the savings are priced, and which models are not."""
    if res.get("pricing") == ONE_PRICE:
        return (f"savings (USD) at `{res['price_model']}` prices for every model, at the configuration above: "
                "projected prices the ceiling, actual the provider's usage")
    out = ("savings (USD) per model, as the report's savings section (`--profile auto`): each request judged by "
           "its own model's profile at that profile's configuration, priced at its own model's price entry; "
           "projected prices that profile's hits (not the ceiling column), actual the provider's usage")
    if res.get("unpriced_models"):
        out += ("; unpriced (no price entry: savings null): "
                + ", ".join("(none)" if m is None else m for m in res["unpriced_models"]))
    return out


def _cache(stream: str, model) -> str:
    return stream if model is None else f"{stream} ({model})"


def describe_config(res: dict) -> str:
    c = res["config"]
    return (f"stream {c['stream']}, TTL {format_ttl(c['ttl_s'])}, block {c['block']}, min prefix "
            f"{c['min_prefix']}; a regression is a drop of more than {c['threshold_points']:g} points from the "
            "stream's previous week")


def regression_line(r: dict) -> str:
    cause = ("cause not computed" if r["cause"] is None else
             f"cause: {r['cause']} (+{r['cause_growth_points']:.1f} points of the week's prompt tokens)")
    return (f"{_cache(r['stream'], r['model'])} in {r['week']}: ceiling {_pct(r['previous_ceiling'])} in "
            f"{r['previous_week']} → {_pct(r['ceiling'])} (−{r['drop_points']:.1f} points); {cause}")


def format_text(res: dict) -> str:
    """The trend as a short table and the regressions, for the terminal."""
    lines = [describe_config(res), describe_savings(res), "weeks: " + ", ".join(res["weeks"])]
    if res["single_week"]:
        lines.append(res["note"])
    n = min(max([len(_cache(r["stream"], r["model"])) for r in res["rows"]] + [6]), 60)
    lines += ["", f"{'stream':<{n}} {'week':<9} {'requests':>9} {'ceiling':>8} {'change':>7} {'realised':>9} "
                  f"{'proj. savings':>14} {'actual savings':>15}"]
    for r in res["rows"]:
        lines.append(f"{_cache(r['stream'], r['model'])[:n]:<{n}} {r['week']:<9} {r['requests']:>9,} "
                     f"{_pct(r['ceiling']):>8} {_pts(r['change_points']):>7} {_pct(r['realised']):>9} "
                     f"{_usd_of(r, 'projected_savings'):>14} {_usd_of(r, 'actual_savings'):>15}")
    if not res["single_week"]:
        lines += ["", "regressions:" if res["regressions"] else "regressions: none"]
        lines += ["  " + regression_line(r) for r in res["regressions"]]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- report section

#: streams shown in the report's table and plot (by prompt tokens over all weeks)
REPORT_STREAMS = 25
PLOT_STREAMS = 8


def trend_section(con, out_dir, grid=None, price_model: str | None = None, prices_path=None,
                  threshold: float = DEFAULT_THRESHOLD) -> str:
    """Markdown for the report: per stream the weekly ceiling, realised ratio and
    savings at the report's headline configuration, and the flagged regressions
    (one line when the log holds a single week); writes ``trend_ceiling.png``."""
    from replay.analysis.diagnose.summary import REPORT_DIAGNOSE_MAX
    from replay.analysis.report import headline_config
    from replay.core.grid import Grid

    h = headline_config(grid or Grid())
    n_requests = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    res = trend(con, stream=h["stream"], ttl=h["ttl"], block=h["block"], min_prefix=h["min_prefix"],
                threshold=threshold, price_model=price_model, prices_path=prices_path,
                causes=n_requests <= REPORT_DIAGNOSE_MAX)
    lines = ["## Week over week", ""]
    if res["single_week"]:
        return "\n".join(lines + [f"{ONE_WEEK} ({res['weeks'][0]}): no week-over-week comparison.", ""])
    lines += [f"Per stream and ISO week (UTC) at the headline configuration — {describe_config(res)}. Each "
              "request counts in its own week; the replay runs over the whole log, so a request may hit a "
              "prefix of the week before. *Realised* is the provider's logged cache counts; "
              + describe_savings(res) + ".", ""]
    regs = res["regressions"]
    if regs:
        lines += ["**Regressions:**", ""] + [f"- {regression_line(r)}" for r in regs]
        if not res["causes_computed"]:
            lines.append(f"- (causes not computed in the report for a log of {n_requests:,} requests: "
                         "run `replay trend`)")
    else:
        lines.append("No regression: no stream's ceiling dropped by more than "
                     f"{res['config']['threshold_points']:g} points from its previous week.")
    if res["rows"]:
        rows = pl.DataFrame(res["rows"], infer_schema_length=None)
        totals = (rows.group_by("stream", "model").agg(pl.col("prompt_tokens").sum().alias("_t"))
                  .sort(["_t", "stream"], descending=[True, False]))
        top = totals.head(REPORT_STREAMS)
        shown = rows.join(top.select("stream", "model"), on=["stream", "model"], how="semi", nulls_equal=True)
        png = _plot(shown, top.head(PLOT_STREAMS), res, Path(out_dir))
        which = (f"the {len(top)} largest of {len(totals)} streams by prompt tokens" if len(top) < len(totals)
                 else f"{len(top)} stream(s)")
        lines += ["", f"![ceiling per week]({png})", "", f"Per stream and week ({which}):", "",
                  "| stream | model | week | requests | ceiling | change (points) | realised | projected savings | "
                  "actual savings |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in shown.iter_rows(named=True):
            lines.append(f"| {r['stream']} | {r['model'] or ''} | {r['week']} | {r['requests']:,} | "
                         f"{_pct(r['ceiling'])} | {_pts(r['change_points'])} | {_pct(r['realised'])} | "
                         f"{_usd_of(r, 'projected_savings')} | {_usd_of(r, 'actual_savings')} |")
    return "\n".join(lines) + "\n"


def _plot(rows: pl.DataFrame, top: pl.DataFrame, res: dict, out_dir: Path) -> str:
    """The ceiling per week of the largest streams, regressions marked."""
    from replay.analysis.report import _pyplot

    plt = _pyplot()
    weeks = res["weeks"]
    x = {w: i for i, w in enumerate(weeks)}
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(weeks) + 3) + 3.2, 3.8))
    for s, m in top.select("stream", "model").iter_rows():
        d = rows.filter((pl.col("stream") == s) & pl.col("model").eq_missing(m))
        ax.plot([x[w] for w in d["week"]], [100 * v for v in d["ceiling"]], marker="o", ms=3,
                label=_cache(s, m)[:60])
    plotted = set(top.select("stream", "model").iter_rows())
    flagged = [r for r in res["regressions"] if (r["stream"], r["model"]) in plotted]
    if flagged:
        ax.scatter([x[r["week"]] for r in flagged], [100 * r["ceiling"] for r in flagged], marker="x", s=60,
                   color="red", zorder=3, label="regression")
    ax.set_xticks(range(len(weeks)), weeks, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("ceiling (hit ratio, %)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot, off the lines
    ax.set_title("Ceiling per stream and week", fontsize=9)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / "trend_ceiling.png", dpi=110)
    plt.close(fig)
    return "trend_ceiling.png"
