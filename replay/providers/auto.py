"""``--profile auto``: every request judged by its own model's profile.

The mapping from a logged model name to its family and profile is
:func:`replay.providers.catalog.model_family` (its table is there: ``claude-*`` →
the Anthropic profile of that generation, ``gpt-4o*`` / ``gpt-4.1*`` / ``gpt-5*`` /
o-series → OpenAI's rules, ``deepseek-*`` → ``deepseek``, anything else → the
ideal contract, said so). This module adds the price entry and computes the
per-request hits.

* **Price entry** (:func:`price_entry`): the logged name itself, else its
  normalised name (:func:`replay.providers.catalog.model_name`: no gateway
  prefix, no date or version suffix), must be a key of the price table —
  normalised the same way. There is no nearest-name guess (``gpt-4.1-mini`` is
  never priced as ``gpt-4.1``): a model without an entry is *unpriced*, its
  ratios shown and its dollars not.
* **Caches**: a request is in the cache (stream key, model) whatever the
  profile (semantics.md, "a cache belongs to one model"), so one run of a
  profile over the whole log, keeping its model's rows, gives that model's hits
  exactly; models that share a profile's rules share the run. OpenAI profiles
  partition by organisation + ``prompt_cache_key`` (stream ``org:<tenant>|key:<key>``),
  the others by the stream mode asked for.
* **Configuration**: each profile at its judging configuration
  (:func:`replay.providers.catalog.judging_config`: Anthropic and OpenAI 5 min,
  ``deepseek`` and the ideal contract no expiry).
* **Loosened bounds** (:func:`stages`, :func:`bound_hits`): the profile with its
  rules loosened one at a time — longer retention, then no minimum, then the
  contract itself on the same caches (block 1, no minimum, TTL ∞). Where the
  provider's realised ratio exceeds the ceiling, the first stage that reaches it
  names the rule the profile lacks; when none does, the difference is one of
  definition (the provider counts its own tokens). ``replay.providers.model_savings``
  prices the hits and writes the reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable

import polars as pl

from replay.core.grid import Grid
from replay.providers.catalog import ModelFamily, Profile, get_profile, judging_config, model_family, model_name
from replay.providers.request_hits import request_hits
from replay.store import db

AUTO = "auto"
#: the most loosened stages any profile has (the width of :func:`bound_hits`)
MAX_STAGES = 4


def is_auto(spec: str | None) -> bool:
    return spec is not None and spec.strip().lower() == AUTO


@dataclass(frozen=True)
class ModelChoice:
    """A logged model under ``--profile auto``: its family and profile, and its price entry (None: unpriced)."""
    family: ModelFamily
    price: str | None

    @property
    def model(self) -> str | None:
        return self.family.model

    @property
    def profile(self) -> str:
        return self.family.profile


def price_entry(model: str | None, price_keys: Iterable[str]) -> str | None:
    """The price-table key of a logged model (module docstring), or None."""
    if not model:
        return None
    keys = list(price_keys)
    exact = {k.lower(): k for k in keys}
    if model.strip().lower() in exact:
        return exact[model.strip().lower()]
    norm = {model_name(k): k for k in keys}
    return norm.get(model_name(model))


def logged_models(con) -> list[str | None]:
    """The logged model names (None: requests without one), most requests first."""
    rows = db.arrow(con, "SELECT model, count(*) AS n FROM requests GROUP BY model ORDER BY n DESC, model")
    return [r["model"] for r in rows.to_pylist()]


#: a client whose logs call for its own rules (``catalog``: the providers as coding agents use them)
CLIENT_PROFILES = {("anthropic", "claude-code"): "anthropic-claude-code", ("openai", "codex"): "openai-responses"}


def model_choices(con, price_keys: Iterable[str] = ()) -> dict[str | None, ModelChoice]:
    """Each logged model's choice; a model whose every request came from one coding
    agent (``requests.client``) is judged by the provider's rules as that agent uses them."""
    keys = list(price_keys)
    clients = dict(con.execute("""SELECT model, any_value(client) FROM requests GROUP BY model
                                  HAVING count(DISTINCT client) = 1 AND count(client) = count(*)""").fetchall())
    out = {}
    for m in logged_models(con):
        fam = model_family(m)
        client_profile = CLIENT_PROFILES.get((fam.family, clients.get(m)))
        if client_profile is not None:
            fam = replace(fam, profile=client_profile, note=f"{fam.note}; as {clients[m]} uses it")
        out[m] = ModelChoice(fam, price_entry(m, keys))
    return out


def parses_json(con, profile: str | None) -> bool:
    """Whether ``profile`` reads requests as a hosted API does (JSON parsed: key
    order cannot miss). Under ``auto``: when every logged model is a hosted
    API's (a provider profile), else not (a self-hosted engine sees the bytes)."""
    if profile in (None, "", "ideal"):
        return False
    if is_auto(profile):
        fams = [model_family(m) for m in logged_models(con)]
        return bool(fams) and all(f.known and get_profile(f.profile).canonical_json for f in fams)
    return get_profile(profile).canonical_json


def describe() -> str:
    """``auto`` as ``replay profiles`` lists it."""
    return ("auto: each request judged by its own model's profile and priced at its own model's price entry\n"
            "  mapping: claude-<tier>-<generation> → anthropic-<tier>-<generation> (other claude-* → ideal); "
            "gpt-4o*, gpt-4.1*, gpt-5*, o1/o3/o4*, chatgpt-*, codex-* → openai-<model> (gpt-3.5*, gpt-4, gpt-4-* "
            "→ ideal: no documented caching); gemini-* → gemini-<generation>; deepseek-* → deepseek; anything "
            "else → ideal, said so\n"
            "  clients: a model whose every request came from Claude Code → anthropic-claude-code, from Codex → "
            "openai-responses (the provider as that client uses it, hidden parts inferred from usage)\n"
            "  prices: the logged name or its name without date/version suffix must be a price-table key "
            "(no nearest-name guess); otherwise unpriced\n"
            "  sources: replay.providers.catalog.model_family, replay.providers.auto")


# ----------------------------------------------------------------------------- per-request hits

@dataclass(frozen=True)
class Stage:
    """One loosening of a profile: ``reason`` names the rule it drops, ``label`` says how."""
    reason: str
    label: str
    profile: Profile
    ttl: float


def stages(profile: str) -> list[Stage]:
    """The profile loosened one rule at a time, each stage keeping the previous ones'
    loosening (module docstring). Empty for the ideal contract at its judging
    configuration (already the loosest)."""
    prof = get_profile(profile)
    ideal = get_profile("ideal")
    contract = "the contract on the same caches (block 1, no minimum, TTL ∞)"
    if prof.kind == "anthropic":
        return [Stage("retention", "1 h TTL", prof, 3600.0),
                Stage("minimum", f"no {prof.min_prefix}-token minimum",
                      replace(prof, name=prof.name + "~nomin", min_prefix=0), 3600.0),
                Stage("breakpoints", contract, ideal, math.inf)]
    if prof.kind == "openai":
        return [Stage("retention", "10 min TTL (in-memory retention, upper end)", prof, 600.0),
                Stage("retention", "1 h TTL (in-memory, longest)", prof, 3600.0),
                Stage("retention", "24 h TTL (extended retention)", prof, 86400.0),
                Stage("minimum", "no 1024-token minimum nor 128-token increments, TTL ∞ (the contract on "
                      "organisation + key)", replace(prof, name=prof.name + "~loose", min_prefix=1, step=1),
                      math.inf)]
    if prof.kind == "walk" and (prof.block, prof.min_prefix, prof.cap_last) not in ((None, None, False), (1, 0, False)):
        return [Stage("granularity", f"{contract}, variant {prof.variant}",
                      replace(prof, name=prof.name + "~loose", block=1, min_prefix=0, cap_last=False), math.inf)]
    return []


def rules_key(prof: Profile) -> tuple:
    """Profiles with the same rules give the same hits (they differ in name only)."""
    return (prof.kind, prof.variant, prof.block, prof.min_prefix, prof.cap_last, prof.step, prof.streams,
            prof.ttl_fixed, tuple(sorted((k, str(v)) for k, v in prof.params.items())))


def _run(con, needs: list[tuple[Profile, float]], stream: str, tokenizer, progress) -> dict[tuple, pl.DataFrame]:
    """request_hits once per set of rules, for every TTL it is needed at: {(rules, ttl): rows}."""
    by: dict[tuple, tuple[Profile, set]] = {}
    for prof, ttl in needs:
        by.setdefault(rules_key(prof), (prof, set()))[1].add(float(ttl))
    out = {}
    for key, (prof, ttls) in by.items():
        _, block, mn = judging_config(prof)
        g = Grid(ttls=tuple(sorted(ttls)), blocks=(block,), min_prefixes=(mn,), streams=(stream,))
        df = request_hits(con, prof, g, tokenizer=tokenizer, progress=progress)
        for t in ttls:
            out[(key, t)] = df.filter(pl.col("ttl") == t)
    return out


def _of_model(df: pl.DataFrame, model: str | None) -> pl.DataFrame:
    return df.filter(pl.col("model").is_null() if model is None else pl.col("model") == model)


def auto_hits(con, choices: dict[str | None, ModelChoice], stream: str = "tenant", tokenizer=None,
              progress: bool = False) -> pl.DataFrame:
    """One row per request, judged by its model's profile at its judging configuration:
    request_id, stream, model, ts_us, prompt_tokens, hit, write_5m, write_1h (as
    ``request_hits``), profile, family, known, price_model."""
    needs = [(get_profile(c.profile), judging_config(get_profile(c.profile))[0]) for c in choices.values()]
    runs = _run(con, needs, stream, tokenizer, progress)
    parts = []
    for m, c in choices.items():
        prof = get_profile(c.profile)
        rows = _of_model(runs[(rules_key(prof), judging_config(prof)[0])], m)
        parts.append(rows.select("request_id", "stream", "model", "ts_us", "prompt_tokens", "hit", "write_5m",
                                 "write_1h").with_columns(
            pl.lit(c.profile).alias("profile"), pl.lit(c.family.family).alias("family"),
            pl.lit(c.family.known).alias("known"), pl.lit(c.price, pl.Utf8).alias("price_model")))
    if not parts:
        return pl.DataFrame(schema={"request_id": pl.Int64, "stream": pl.Utf8, "model": pl.Utf8, "ts_us": pl.Int64,
                                    "prompt_tokens": pl.Int64, "hit": pl.Int64, "write_5m": pl.Int64,
                                    "write_1h": pl.Int64, "profile": pl.Utf8, "family": pl.Utf8,
                                    "known": pl.Boolean, "price_model": pl.Utf8})
    return pl.concat(parts)


def bound_hits(con, choices: dict[str | None, ModelChoice], models: Iterable[str | None], stream: str = "tenant",
               tokenizer=None) -> pl.DataFrame:
    """Per request of ``models``: ``b0`` … ``b{MAX_STAGES-1}``, its hit at each of its
    profile's :func:`stages` (null past the profile's last stage)."""
    wanted = [m for m in models if m in choices]
    needs = [(s.profile, s.ttl) for m in wanted for s in stages(choices[m].profile)]
    runs = _run(con, needs, stream, tokenizer, False)
    parts = []
    for m in wanted:
        st = stages(choices[m].profile)
        if not st:
            continue
        frame = None
        for i, s in enumerate(st):
            col = _of_model(runs[(rules_key(s.profile), s.ttl)], m).select("request_id", pl.col("hit").alias(f"b{i}"))
            frame = col if frame is None else frame.join(col, on="request_id", how="left")
        parts.append(frame.with_columns(pl.lit(None, pl.Int64).alias(f"b{i}")
                                        for i in range(len(st), MAX_STAGES)).select(
            "request_id", *[pl.col(f"b{i}").cast(pl.Int64) for i in range(MAX_STAGES)]))
    schema = {"request_id": pl.Int64, **{f"b{i}": pl.Int64 for i in range(MAX_STAGES)}}
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)
