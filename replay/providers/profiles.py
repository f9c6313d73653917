"""Hit figures under provider/engine profiles, beside the provider's realised usage.

    from replay.providers.profiles import profile_sweep
    profile_sweep(con, ["ideal", "deepseek", "anthropic-sonnet-4-5"], Grid())

The profiles and their sources are in ``replay.providers.catalog``; the
per-request hits in ``replay.providers.request_hits``.
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

from replay.core.grid import Grid
from replay.providers.auto import is_auto, model_choices, rules_key
from replay.providers.catalog import get_profile
from replay.providers.request_hits import request_hits, ttl_s_column
from replay.store import db


def _df(con, sql: str, params=None) -> pl.DataFrame:
    return pl.from_arrow(db.arrow(con, sql, params))


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
                  by_stream: bool = False, store: bool = True, tokenizer=None, progress: bool = False
                  ) -> pl.DataFrame:
    """Hit figures per profile × configuration (rows as ``replay.core.sweep.sweep``
    plus the profile and the realised usage columns).

    ``realized_*`` are the provider's own usage figures summed over the requests
    that carry usage (null when none does); per stream mode they are the same for
    every configuration. With ``by_stream``, ``stream_key`` and ``model`` columns
    are added (one row per cache) and the realised figures are per cache.

    ``auto`` (``replay.providers.auto``) judges each model's requests by its own
    model's profile: one set of rows per profile used, named ``auto/<profile>``
    (``auto/ideal`` for models no provider profile fits), each counting only its
    models' requests (and their realised usage).
    """
    grid = grid or Grid()
    frames = []
    runs: dict[tuple, pl.DataFrame] = {}  # profiles that differ in name only share one run
    for label, spec, models in _expand(con, profiles):
        prof = get_profile(spec)
        key = rules_key(prof)
        if key not in runs:
            runs[key] = request_hits(con, prof, grid, tokenizer=tokenizer, progress=progress)
        df = runs[key]
        if models is not None:
            df = df.filter(pl.col("model").is_in([m for m in models if m is not None])
                           | (pl.col("model").is_null() if None in models else pl.lit(False)))
        keys = ["stream_mode"] + (["stream", "model"] if by_stream else []) + ["ttl", "block", "min_prefix"]
        agg = (df.group_by(keys).agg(
            pl.len().alias("requests"), pl.col("prompt_tokens").sum().alias("prompt_tokens"),
            pl.col("hit").sum().alias("hit_tokens"), (pl.col("hit") > 0).sum().alias("requests_hit")))
        if by_stream:
            rz = _realized_by_request(con)
            per = (df.join(rz, on="request_id", how="left")
                   .group_by(keys).agg(pl.col("u_p").count().alias("realized_requests"),
                                       pl.col("u_p").sum().alias("realized_prompt_tokens"),
                                       pl.col("u_c").sum().alias("realized_hit_tokens")))
            agg = agg.join(per, on=keys, how="left", nulls_equal=True)
        else:
            tot = realized(con).row(0, named=True) if models is None else _realized_of(con, df)
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
            ttl_s_column(pl.col("ttl")).alias("ttl_s"),
            pl.lit(label).alias("profile"))
        order = {m: i for i, m in enumerate(list(grid.streams) + ["org+key"])}
        agg = (agg.rename({"stream": "stream_key"} if by_stream else {})
               .rename({"stream_mode": "stream"})
               .with_columns(pl.col("stream").replace_strict(order, default=99, return_dtype=pl.Int32).alias("_o"))
               .sort(["_o", "ttl", "block", "min_prefix"] + (["stream_key", "model"] if by_stream else []),
                     nulls_last=False))
        cols = RESULT_COLS[:2] + (["stream_key", "model"] if by_stream else []) + RESULT_COLS[2:]
        frames.append(agg.select(cols).with_columns(
            pl.col("requests").cast(pl.Int64), pl.col("prompt_tokens").cast(pl.Int64),
            pl.col("hit_tokens").cast(pl.Int64), pl.col("requests_hit").cast(pl.Int64),
            pl.col("realized_requests").cast(pl.Int64), pl.col("block").cast(pl.Int64),
            pl.col("min_prefix").cast(pl.Int64)))
    out = pl.concat(frames) if frames else pl.DataFrame()
    if store and not by_stream and len(out):
        for spec in profiles:
            con.execute("DELETE FROM results WHERE profile = ?" + (" OR profile LIKE 'auto/%'" if is_auto(spec)
                                                                  else ""), [spec])
        res = out.select(["profile", "stream", "ttl_s", "block", "min_prefix", "requests", "prompt_tokens",
                          "hit_tokens", "hit_ratio", "requests_hit"]).to_arrow()
        con.register("_profile_res", res)
        con.execute("INSERT INTO results SELECT * FROM _profile_res")
        con.unregister("_profile_res")
    return out


def _expand(con, profiles: Sequence[str]) -> list[tuple[str, str, list | None]]:
    """(label, profile, models or None for all) per profile asked for; ``auto`` → one per profile its models use."""
    out: list[tuple[str, str, list | None]] = []
    for spec in profiles:
        if not is_auto(spec):
            out.append((spec, spec, None))
            continue
        by: dict[str, list] = {}
        for m, c in model_choices(con).items():
            by.setdefault(c.profile, []).append(m)
        out += [(f"auto/{p}", p, ms) for p, ms in by.items()]
    return out


def _realized_of(con, df: pl.DataFrame) -> dict:
    """Usage totals over the requests of ``df`` (as :func:`realized`)."""
    rz = _realized_by_request(con).join(df.select("request_id").unique(), on="request_id", how="inner")
    return {"realized_requests": rz["u_p"].count(), "realized_prompt_tokens": rz["u_p"].sum(),
            "realized_hit_tokens": rz["u_c"].sum()}


def _realized_by_request(con) -> pl.DataFrame:
    return _df(con, """SELECT request_id, usage_prompt_tokens AS u_p,
                              CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cached_tokens, 0) END
                                  AS u_c,
                              CASE WHEN usage_prompt_tokens IS NOT NULL THEN coalesce(usage_cache_write_tokens, 0)
                                  END AS u_w
                       FROM requests""")
