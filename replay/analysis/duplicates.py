"""Exact duplicates: the ceiling of a response cache.

A request is an exact duplicate under τ when its whole rendered prompt (its
tokens as the engine would see them) equals an earlier request's of the same
cache — same stream key and same model, as for prefixes — and the most recent
such request is at most τ earlier (integer µs; a gap of exactly τ counts;
"earlier" is processing order, so requests at the same time count in input
order). Such a request could have been answered from a response cache that
keeps answers for τ.

The same rates are also given after the ``whatif`` normalizers (every fix of
:data:`replay.analysis.whatif.FIXES`) are applied to the bodies: prompts that
differ only in a timestamp, a rotating header, tool order or JSON key order
then count as duplicates too — what a response cache keyed on a normalized
prompt could answer.
"""

from __future__ import annotations

import hashlib
import math

import polars as pl

from replay.analysis.labels import near_rates
from replay.analysis.near import MODEL_NAME, WARNING, SemanticMissing, stream_keys
from replay.analysis.whatif import FIXES, normalized_copy
from replay.core.prompts import iter_prompts
from replay.core.streams import check_modes
from replay.times import format_ttl, ttl_us
from replay.prepare import prepare
from replay.store import db

REPORT_NORMALIZED_MAX = 20_000  # requests; the report's normalized rates re-tokenize the log
#: nor past this much body text (an agent's log resends its conversation every call: the
#: normalized copy holds every body whole)
REPORT_NORMALIZED_MAX_CHARS = 64 << 20
REPORT_NEAR_MAX = 50_000        # requests; the near search compares every pair within the TTL
REPORT_THRESHOLDS = (0.90, 0.95)

SCHEMA = {"stream": pl.Utf8, "ttl_s": pl.Float64, "requests": pl.Int64, "duplicate_requests": pl.Int64,
          "duplicate_share": pl.Float64, "duplicate_prompt_tokens": pl.Int64}


def prompt_digests(con, tokenizer=None) -> pl.DataFrame:
    """One row per replayable request in processing order: its time, stream
    fields, model, prompt length and a 128-bit digest of its whole prompt."""
    prepare(con, modes=(), tokenizer=tokenizer)
    rows = []
    for p in iter_prompts(con):
        h = hashlib.blake2b(p.symbols.tobytes(), digest_size=16)
        h.update(str(p.symbols.dtype).encode() + b"|" + str(p.n_tokens).encode())  # (block traces: the length too)
        rows.append((p.ts, p.tenant, p.key, p.session, p.model, p.n_tokens, h.digest()))
    return pl.DataFrame(rows, schema={"ts": pl.Int64, "tenant": pl.Utf8, "key": pl.Utf8, "session": pl.Utf8,
                                      "model": pl.Utf8, "n_tokens": pl.Int64, "digest": pl.Binary},
                        orient="row")


def exact_counts(digests: pl.DataFrame, ttls=(math.inf,), streams=("tenant",)) -> pl.DataFrame:
    """The exact-duplicate rows (:data:`SCHEMA`) of prompts from :func:`prompt_digests`."""
    rows = []
    n = len(digests)
    for mode in check_modes(streams):
        keyed = digests.with_columns(stream_keys(digests, mode))
        # the most recent earlier request of the same cache with the same prompt
        gaps = keyed.with_columns(
            (pl.col("ts") - pl.col("ts").shift(1).over(["stream", "model", "digest"])).alias("gap"))
        for t in ttls:
            dup = gaps.filter(pl.col("gap").is_not_null() & (pl.col("gap") <= ttl_us(t)))
            rows.append((mode, None if t == math.inf else float(t), n, len(dup), len(dup) / n if n else 0.0,
                         int(dup["n_tokens"].sum())))
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def exact_duplicates(con, ttls=(math.inf,), streams=("tenant",), normalized: bool = True,
                     tokenizer=None) -> pl.DataFrame:
    """Exact-duplicate rows per stream mode and TTL; with ``normalized``, beside
    them ``normalized_duplicate_requests`` and ``normalized_duplicate_share``
    after every whatif normalizer."""
    raw = exact_counts(prompt_digests(con, tokenizer), ttls, streams)
    if not normalized:
        return raw
    norm = exact_counts(prompt_digests(normalized_copy(con, FIXES, tokenizer), tokenizer), ttls, streams)
    return raw.with_columns(norm["duplicate_requests"].alias("normalized_duplicate_requests"),
                            norm["duplicate_share"].alias("normalized_duplicate_share"))


def duplicates_section(con, out_dir=None, ttls=(300.0, 3600.0, math.inf), streams=("tenant", "global"),
                       tokenizer=None) -> str:
    """Markdown for the report: the exact-duplicate rates, as sent and (up to
    :data:`REPORT_NORMALIZED_MAX` requests: it tokenizes the normalized log again) normalized."""
    n = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    small = n <= REPORT_NORMALIZED_MAX and sum(s for _, s in db.body_sizes(con)) <= REPORT_NORMALIZED_MAX_CHARS
    df = exact_duplicates(con, ttls=ttls, streams=streams, normalized=small,
                          tokenizer=tokenizer)
    if "normalized_duplicate_requests" not in df.columns:
        df = df.with_columns(pl.lit(None, dtype=pl.Int64).alias("normalized_duplicate_requests"),
                             pl.lit(None, dtype=pl.Float64).alias("normalized_duplicate_share"))
    lines = ["## Duplicates (what a response cache could answer)", "",
             "A request is an exact duplicate when its whole rendered prompt equals an earlier request's of the "
             "same stream and model, at most the TTL earlier: a response cache keeping answers that long could "
             "have answered it without running the model at all. *Normalized*: the same after `whatif`'s "
             "normalizers (timestamps bucketed to 5 minutes, rotating headers stripped, tools and JSON keys "
             "sorted, volatile lines moved after the breakpoint).", "",
             "| stream | TTL | requests | exact duplicates | share | prompt tokens | normalized | share |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in df.iter_rows(named=True):
        ttl = format_ttl(math.inf if r["ttl_s"] is None else r["ttl_s"])
        lines.append(f"| {r['stream']} | {ttl} | {r['requests']:,} | {r['duplicate_requests']:,} | "
                     f"{100 * r['duplicate_share']:.1f} % | {r['duplicate_prompt_tokens']:,} | "
                     + ("— | — |" if r["normalized_duplicate_requests"] is None else
                        f"{r['normalized_duplicate_requests']:,} | {100 * r['normalized_duplicate_share']:.1f} % |"))
    if not small:
        lines += ["", f"_Normalized rates not computed in the report above {REPORT_NORMALIZED_MAX:,} requests "
                  f"or {REPORT_NORMALIZED_MAX_CHARS >> 20} MiB of bodies (they tokenize the normalized log "
                  "again): run `replay duplicates` on the log._"]
    return "\n".join(lines + [""] + _near_lines(con, n, ttls, streams, tokenizer))


def _near_lines(con, n: int, ttls, streams, tokenizer) -> list[str]:
    """The near-duplicate rates, only ever beside their warning."""
    head = ["### Near duplicates (what a semantic cache could answer: raw, unlabelled)", ""]
    if n > REPORT_NEAR_MAX:
        return head + [f"_Not computed in the report above {REPORT_NEAR_MAX:,} requests (the search compares "
                       "every pair within the TTL): run `replay duplicates` on the log._", ""]
    try:
        near = near_rates(con, ttls=ttls, streams=streams, thresholds=REPORT_THRESHOLDS, tokenizer=tokenizer)
    except SemanticMissing as e:
        return head + [f"_Not computed: {e}._", ""]
    lines = head + [f"**Warning — {WARNING}.** Last user turn embedded with {MODEL_NAME}.", "",
                    "| stream | TTL | " + " | ".join(f"cosine ≥ {t:.2f}" for t in REPORT_THRESHOLDS) + " |",
                    "|---|---|" + "---:|" * len(REPORT_THRESHOLDS)]
    for (stream, ttl), part in near.group_by(["stream", "ttl_s"], maintain_order=True):
        cells = {r["threshold"]: f"{100 * r['near_share']:.1f} %" + (
            "" if r["adjusted_share"] is None else f" (labelled: {100 * r['adjusted_share']:.1f} %)")
            for r in part.iter_rows(named=True)}
        lines.append(f"| {stream} | {format_ttl(math.inf if ttl is None else ttl)} | " +
                     " | ".join(cells[t] for t in REPORT_THRESHOLDS) + " |")
    labelled = near["adjusted_share"].is_not_null().any()
    return lines + ["", "Labelled: the share after `replay duplicates label-import` (each similarity band weighted "
                    "by the share of its labelled pairs judged reusable)." if labelled else
                    "_No labels yet: `replay duplicates label-export`, label, then `label-import`._", ""]
