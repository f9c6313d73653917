"""Predicted against realised: what each provider's rules predict on a log,
beside what the provider actually cached (the usage in the log).

    from replay.providers.realised import realised
    rows = realised(con)            # one dict per (provider, model) and per provider ("model": "*")

Every request with usage is judged by the profile ``--profile auto`` gives its
model (``replay.providers.auto.model_choices``): a coding agent's calls by its
provider's rules as that agent uses them (``replay.providers.client_rules``:
Anthropic as Claude Code places its breakpoints, OpenAI's Responses API as
Codex uses it, with the parts the log does not hold as opaque runs —
``replay.providers.hidden``), Gemini's implicit cache per serving backend,
DeepSeek's disk cache, the other Anthropic and OpenAI models by their profiles
at their judging configuration, unknown models by the ideal contract — each on
its prompt as we render and tokenize it.

Ratios, not counts: no local tokenizer counts Claude's, GPT-5's or Gemini's
tokens. ``predicted_hit_ratio`` = our predicted hit tokens / our prompt tokens
(the inferred hidden runs included); ``realised_hit_ratio`` = the provider's
cached tokens / its prompt tokens (Anthropic: cache read / (input + creation +
read)); ``gap_points`` = 100 × (predicted − realised).

``gap_parts`` splits ``gap_points`` by request: each request adds
``100 × (predicted_i / Σ ours − realised_i / Σ provider)`` to the part of the
rule that decided its prediction, first that applies:

* ``hidden-part inference`` — the first request of a stream whose hidden
  prefix was inferred (its prediction rests on that inference);
* ``minimum`` — a prompt below the provider's minimum (predicted 0);
* ``TTL expiry`` — the stream's previous request is older than the TTL;
* ``backend split`` — a Gemini request served by another backend than the
  stream's previous one (a separate cache);
* ``breakpoints`` — an Anthropic request whose previous breakpoint lies beyond
  the lookback, or a prediction the profile's rounding cut below the common
  prefix by more than its step;
* ``unexplained`` — every other request: what the documented rules leave open.

So the parts add up to ``gap_points`` exactly, and a large ``unexplained`` part
is the evidence that the provider does something its documentation does not
say (``docs/realised.md``).
"""

from __future__ import annotations

import math
from collections import defaultdict

import polars as pl

from replay.core.grid import Grid
from replay.prepare import prepare
from replay.providers.auto import model_choices
from replay.providers.catalog import get_profile, judging_config, model_family
from replay.providers.client_rules import PARTS, RequestRow, judge, load_rows
from replay.providers.request_hits import request_hits

JSON_KEYS = ("provider", "model", "requests", "sessions", "prompt_tokens", "provider_prompt_tokens",
             "predicted_hit_ratio", "realised_hit_ratio", "gap_points", "inferred_share", "gap_parts")
#: calls per session, for the ratio by session length
LENGTH_BUCKETS = ((1, 1, "1"), (2, 5, "2–5"), (6, 20, "6–20"), (21, 100, "21–100"), (101, math.inf, "> 100"))


def _profile_hits(con, rows: list[RequestRow], profile: str) -> list[tuple]:
    """(prompt tokens, 0, predicted, part) per request under a profile of the catalog
    at its judging configuration (``catalog.judging_config``), on its own caches."""
    prof = get_profile(profile)
    ttl, block, minimum = judging_config(prof)
    stream = prof.streams[0] if prof.streams else "tenant"
    g = Grid(ttls=(ttl,), blocks=(block,), min_prefixes=(minimum,),
             streams=("tenant",) if stream == "org+key" else (stream,))
    df = request_hits(con, prof, g)
    if prof.kind == "anthropic":
        df = df.filter(pl.col("ttl") == df["ttl"].min())
    got = dict(zip(df["request_id"].to_list(), df["hit"].to_list()))
    return [(r.n_tokens, 0, int(got.get(r.request_id, 0)), "minimum" if r.n_tokens < minimum else "unexplained")
            for r in rows]


def provider_of(model: str | None) -> str:
    fam = model_family(model).family
    return fam if fam != "unknown" else "other"


def judged(con, tokenizer=None, progress: bool = False) -> pl.DataFrame:
    """One row per request with usage: request_id, provider, model, session, stream,
    prompt_tokens (ours, hidden included), hidden_tokens, predicted, provider_prompt_tokens,
    realised, part (the rule that decided it: module docstring)."""
    prepare(con, modes=(), tokenizer=tokenizer, progress=progress)  # prompts only
    choices = model_choices(con)
    by_profile: dict[str, list[RequestRow]] = {}
    for r in load_rows(con):
        by_profile.setdefault(choices[r.model].profile, []).append(r)
    rows = []
    for profile, rs in by_profile.items():
        prof = get_profile(profile)
        got = (judge(con, rs, prof.family) if prof.kind in ("client", "gemini")
               else _profile_hits(con, rs, profile))
        rows += [(r.request_id, provider_of(r.model), r.model, r.session, r.stream, n, h, pred,
                  r.usage_prompt, r.usage_cached, part) for r, (n, h, pred, part) in zip(rs, got)]
    return pl.DataFrame(rows, schema={"request_id": pl.Int64, "provider": pl.Utf8, "model": pl.Utf8,
                                      "session": pl.Utf8, "stream": pl.Utf8, "prompt_tokens": pl.Int64,
                                      "hidden_tokens": pl.Int64, "predicted": pl.Int64,
                                      "provider_prompt_tokens": pl.Int64, "realised": pl.Int64, "part": pl.Utf8},
                        orient="row")


def _summary(provider: str, model: str, g: pl.DataFrame) -> dict:
    ours = int(g["prompt_tokens"].sum())
    prov = int(g["provider_prompt_tokens"].sum())
    pred = int(g["predicted"].sum())
    real = int(g["realised"].sum())
    pr = pred / ours if ours else 0.0
    rr = real / prov if prov else 0.0
    parts = {name: 0.0 for name in PARTS}
    if ours and prov:
        contrib = g.with_columns(
            (100.0 * (pl.col("predicted") / ours - pl.col("realised") / prov)).alias("_d"))
        for part, d in contrib.group_by("part").agg(pl.col("_d").sum()).iter_rows():
            parts[part] = parts.get(part, 0.0) + float(d)
    sessions = g["session"].drop_nulls().str.split("/").list.first().n_unique()  # (a sidechain is its session's)
    return {
        "provider": provider, "model": model, "requests": len(g), "sessions": sessions,
        "prompt_tokens": ours, "provider_prompt_tokens": prov,
        "predicted_hit_ratio": pr, "realised_hit_ratio": rr, "gap_points": 100.0 * (pr - rr),
        "inferred_share": float(g["hidden_tokens"].sum()) / ours if ours else 0.0,
        "gap_parts": parts,
    }


def realised(con, tokenizer=None, progress: bool = False, frame: pl.DataFrame | None = None) -> list[dict]:
    """One dict per (provider, model) and one per provider with ``"model": "*"``
    (keys :data:`JSON_KEYS`), providers and models by requests, most first."""
    df = judged(con, tokenizer, progress) if frame is None else frame
    out: list[dict] = []
    by_provider = defaultdict(list)
    for (prov, model), g in sorted(df.group_by(["provider", "model"]), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        by_provider[prov].append(_summary(prov, model or "", g))
    order = sorted(by_provider, key=lambda p: -sum(r["requests"] for r in by_provider[p]))
    for prov in order:
        out += by_provider[prov]
        out.append(_summary(prov, "*", df.filter(pl.col("provider") == prov)))
    return out


def by_session(df: pl.DataFrame) -> pl.DataFrame:
    """Per session (its sidechains included): provider, calls, predicted and realised ratio."""
    return (df.with_columns(pl.col("session").fill_null("").str.split("/").list.first().alias("sess"))
            .group_by(["provider", "sess"])
            .agg(pl.len().alias("calls"), pl.col("prompt_tokens").sum(), pl.col("predicted").sum(),
                 pl.col("provider_prompt_tokens").sum(), pl.col("realised").sum())
            .with_columns((pl.col("predicted") / pl.col("prompt_tokens").clip(1)).alias("predicted_ratio"),
                          (pl.col("realised") / pl.col("provider_prompt_tokens").clip(1)).alias("realised_ratio"))
            .sort(["provider", "sess"]))


def by_length(df: pl.DataFrame) -> list[dict]:
    """Predicted and realised ratio by session length (calls per session), per provider."""
    s = by_session(df)
    out = []
    for prov in s["provider"].unique(maintain_order=True).to_list():
        sp = s.filter(pl.col("provider") == prov)
        for lo, hi, label in LENGTH_BUCKETS:
            b = sp.filter((pl.col("calls") >= lo) & (pl.col("calls") <= hi))
            if not len(b):
                continue
            ours, prov_t = int(b["prompt_tokens"].sum()), int(b["provider_prompt_tokens"].sum())
            out.append({"provider": prov, "calls": label, "sessions": len(b),
                        "predicted_hit_ratio": int(b["predicted"].sum()) / ours if ours else 0.0,
                        "realised_hit_ratio": int(b["realised"].sum()) / prov_t if prov_t else 0.0})
    return out


def has_usage(con) -> bool:
    return bool(con.execute("SELECT count(*) FROM requests WHERE usage_prompt_tokens IS NOT NULL").fetchone()[0])
