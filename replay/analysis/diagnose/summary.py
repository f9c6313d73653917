"""The diagnosis of one configuration: causes ranked by tokens lost, per cache, examples.

``miss_parts`` gives the per-request split (``replay.analysis.diagnose.split``);
``diagnose`` sums it into causes and per-stream parts; ``why_miss_section`` is
the report's section (with the what-if of every fix).
"""

from __future__ import annotations

import polars as pl

from replay.analysis.diagnose.agreement import agreement, agreement_lines
from replay.analysis.diagnose.rules import shown
from replay.analysis.diagnose.split import CAUSES, PARTS, STRUCTURAL, analyse, check_renderable, frame
from replay.analysis.whatif import FIXES, TEMPLATE_FIXES, _tokenizer, normalized_copy, whatif
from replay.core.streams import check_modes
from replay.times import INF_US, format_ttl, parse_ttl
from replay.prepare import prepare
from replay.providers.auto import parses_json
from replay.store import db
from replay.text.renderers import TEMPLATE, render_of


def miss_parts(con, ttl: float | str = 300, block: int = 16, min_prefix: int = 0,
               stream: str = "tenant", profile: str = "ideal", tokenizer=None) -> pl.DataFrame:
    """One row per request: its prompt split into additive parts (``replay.analysis.diagnose``).

    Columns: request_id, stream, model, ts (seconds), prompt_tokens, hit,
    block_rounding, below_minimum, ttl_expired, stream_split, premature,
    new_content, cause (of the premature tokens; null when none), also (other
    causes by which the request differs from the previous request of its stream
    / session, comma-separated; no tokens attributed to them), where (tools /
    system / message k of n: where the prompt diverged from its closest earlier
    request), compared_with (that request), idle_gap_s (the idle gap that
    expired the prefix, when ttl_expired > 0), L_global. For every row
    hit + block_rounding + below_minimum + ttl_expired + stream_split + premature
    + new_content == prompt_tokens.
    """
    rows, _ = _miss_rows(con, ttl, block, min_prefix, stream, profile, tokenizer)
    return frame(rows)


def _miss_rows(con, ttl, block, min_prefix, stream, profile, tokenizer=None):
    ttl = parse_ttl(ttl)
    if block < 1:
        raise ValueError("block must be ≥ 1")
    check_modes((stream,))
    tok = None if tokenizer is None else _tokenizer(tokenizer)  # (one Tok, one encoder process)
    if render_of(db.get_meta(con, "tokenizer")) == TEMPLATE and getattr(tok, "template", None) is None:
        check_renderable(con, tok)  # tokenized under a chat template: refused without one
    work = con
    if parses_json(con, profile):
        # a hosted API parses the JSON before building the prompt: key order cannot miss there
        work = normalized_copy(con, ["canonical-json"], tokenizer=tok)
    prepare(work, modes=(stream, "global"), horizon_us=INF_US, tokenizer=tok)
    rows, pending = analyse(work, stream, ttl, int(block), int(min_prefix),
                            tok if getattr(tok, "template", None) is not None else None)
    return rows, (work, pending)


def diagnose(con, ttl: float | str = 300, block: int = 16, min_prefix: int = 0,
             stream: str = "tenant", profile: str = "ideal", show_text: bool = False,
             examples: int = 5, tokenizer=None) -> dict:
    """``{"causes": [...], "by_stream": [...], "examples": [...]}`` for one configuration.

    ``causes``: every loss — the structural ones (block_rounding, below_minimum,
    ttl_expired — with the idle gaps that caused it —, stream_split) and the
    premature-divergence causes — as ``{"cause", "requests", "tokens_lost",
    "share_of_prompt_tokens"}``, ranked by tokens lost. For a divergence cause,
    ``requests`` counts every request that differs from its predecessor by it and
    ``requests_charged`` those whose lost tokens are charged to it (the first
    divergence), so ``tokens_lost`` stays an exact, additive split. ``by_stream``: per
    stream, the additive parts (``hit`` … ``new_content``) and tokens per cause.
    ``examples``: up to ``examples`` requests per premature cause showing where
    and what differs (masked unless ``show_text``). ``provider_agreement``: our
    cause against the provider's own cache diagnostics where the log holds them
    (``replay.analysis.diagnose.agreement``), else null.
    """
    rows, (work, pending) = _miss_rows(con, ttl, block, min_prefix, stream, profile, tokenizer)
    df = frame(rows)
    total = int(df["prompt_tokens"].sum()) if len(df) else 0
    causes = []
    for part in STRUCTURAL:
        sub = df.filter(pl.col(part) > 0)
        entry = {"cause": part, "requests": len(sub), "tokens_lost": int(sub[part].sum()) if len(sub) else 0,
                 "share_of_prompt_tokens": (int(sub[part].sum()) / total) if total and len(sub) else 0.0}
        if part == "ttl_expired":
            gaps = sub["idle_gap_s"].drop_nulls()
            entry["idle_gap_s"] = None if not len(gaps) else {
                "median": float(gaps.median()), "p90": float(gaps.quantile(0.9)),
                "min": float(gaps.min()), "max": float(gaps.max())}
        causes.append(entry)
    prem = df.filter(pl.col("cause").is_not_null())
    present = (df.with_columns(pl.col("also").fill_null("").str.split(",").alias("_a"))
               .select("cause", "_a").to_dicts())
    for cause in CAUSES:
        sub = prem.filter(pl.col("cause") == cause)
        # a request can differ from its predecessor by several causes; its tokens go to
        # the first divergence (``requests_charged``), ``requests`` counts them all
        affected = sum(1 for r in present if r["cause"] == cause or cause in r["_a"])
        if not affected:
            continue
        lost = int(sub["premature"].sum()) if len(sub) else 0
        causes.append({"cause": cause, "requests": affected, "requests_charged": len(sub),
                       "tokens_lost": lost, "share_of_prompt_tokens": lost / total if total else 0.0})
    causes = [c for c in causes if c["tokens_lost"] > 0 or c.get("requests_charged") is not None]
    causes.sort(key=lambda c: -c["tokens_lost"])

    by_stream = []
    if len(df):
        agg = df.group_by("stream", "model").agg(
            pl.len().alias("requests"), pl.col("prompt_tokens").sum(),
            *[pl.col(p).sum() for p in PARTS]).sort("prompt_tokens", descending=True)
        per_cause = (prem.group_by(["stream", "model", "cause"]).agg(pl.col("premature").sum())
                     if len(prem) else None)
        for s in agg.to_dicts():
            entry = {"stream": s["stream"], "model": s["model"], "requests": s["requests"],
                     "prompt_tokens": s["prompt_tokens"],
                     "hit_ratio": s["hit"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0}
            entry.update({p: int(s[p]) for p in PARTS})
            pc = {}
            if per_cause is not None:
                for x in per_cause.filter((pl.col("stream") == s["stream"])
                                          & pl.col("model").eq_missing(s["model"])).to_dicts():
                    pc[x["cause"]] = int(x["premature"])
            entry["causes"] = dict(sorted(pc.items(), key=lambda kv: -kv[1]))
            by_stream.append(entry)

    ex = _examples(work, pending, show_text, examples)
    return {"causes": causes, "by_stream": by_stream, "examples": ex,
            "provider_agreement": agreement(con, df)}


def _examples(con, pending, show_text: bool, per_cause: int) -> list[dict]:
    out: list[dict] = []
    count: dict[str, int] = {}
    chosen = sorted((x for x in pending if x[0].get("cause")), key=lambda x: -x[0]["premature"])
    for row, r, c, i, pot in chosen:
        cause = row["cause"]
        if count.get(cause, 0) >= per_cause:
            continue
        count[cause] = count.get(cause, 0) + 1
        _i, info = row.get("_detail", (i, {}))
        ex = {"cause": cause, "request_id": row["request_id"], "compared_with": c.rid,
              "stream": row["stream"], "where": row["where"], "tokens_lost": row["premature"],
              "token_offset": row["L_global"], "char_offset": info.get("char_offset")}
        if "tool_index" in info:
            ex["tool_index"] = info["tool_index"]
        if "line_a" in info:
            la, lb, w0, wa, wb = info["line_a"], info["line_b"], info["w0"], info["wa"], info["wb"]
            ex["before"] = shown(lb[w0:wb], show_text)
            ex["after"] = shown(la[w0:wa], show_text)
            ex["line"] = shown(la, show_text)
        out.append(ex)
    out.sort(key=lambda e: (CAUSES.index(e["cause"]), -e["tokens_lost"]))
    return out


def format_text(result: dict, ttl=None) -> str:
    """The diagnosis as a short human-readable table."""
    lines = []
    total = sum(s["prompt_tokens"] for s in result["by_stream"])
    hit = sum(s["hit"] for s in result["by_stream"])
    new = sum(s["new_content"] for s in result["by_stream"])
    lines.append(f"prompt tokens {total:,}   hit {hit:,} ({100 * hit / total if total else 0:.1f} %)   "
                 f"new content {new:,} ({100 * new / total if total else 0:.1f} %)")
    lines.append("")
    lines.append(f"{'cause':<24} {'requests':>9} {'tokens lost':>13} {'share':>7}")
    for c in result["causes"]:
        lines.append(f"{c['cause']:<24} {c['requests']:>9,} {c['tokens_lost']:>13,} "
                     f"{100 * c['share_of_prompt_tokens']:>6.1f}%")
        if c["cause"] == "ttl_expired" and c.get("idle_gap_s"):
            g = c["idle_gap_s"]
            lines.append(f"{'':<24} idle gaps: median {g['median']:.0f} s, p90 {g['p90']:.0f} s, "
                         f"max {g['max']:.0f} s")
    if result.get("provider_agreement"):
        lines += [""] + agreement_lines(result["provider_agreement"])
    if result["examples"]:
        lines.append("")
        lines.append("examples:")
        for e in result["examples"]:
            what = ""
            if "before" in e:
                what = f": {e['before']} → {e['after']}"
            lines.append(f"  {e['cause']:<24} request {e['request_id']} vs {e['compared_with']} "
                         f"in {e['where']} at char {e['char_offset']} "
                         f"({e['tokens_lost']:,} tokens){what}")
    return "\n".join(lines)


#: the report's why-miss section runs the diagnosis / the what-ifs only up to these sizes
REPORT_DIAGNOSE_MAX = 50_000
REPORT_WHATIF_MAX = 20_000


def why_miss_section(con, out_dir=None, ttl: float = 300, block: int = 16, min_prefix: int = 0,
                     stream: str = "tenant", fixes: tuple[str, ...] | None = None, tokenizer=None) -> str:
    """Markdown for the report: causes ranked by tokens lost, and the ceiling after each fix
    (``tokenizer``: the one the prompts were tokenized with; a chat template
    tokenization also gets the template causes and fixes)."""
    n_requests = con.execute("SELECT count(*) FROM requests").fetchall()[0][0]
    if n_requests > REPORT_DIAGNOSE_MAX:
        # the diagnosis keeps every request's segment list in memory, and each what-if
        # re-tokenizes and replays the whole log: too much to add to a batch report
        return ("## Why requests miss\n\nNot computed in the report for a log of "
                f"{n_requests:,} requests (over {REPORT_DIAGNOSE_MAX:,}): run `replay diagnose` and "
                "`replay whatif --fix all` on it (or on a part of it) separately.\n")
    try:
        res = diagnose(con, ttl=ttl, block=block, min_prefix=min_prefix, stream=stream, examples=2,
                       tokenizer=tokenizer)
    except ValueError as exc:  # e.g. a chat template tokenization and no template given
        return f"## Why requests miss\n\nNot computed: {exc}.\n"
    if fixes is None:
        tok = None if tokenizer is None else _tokenizer(tokenizer)
        fixes = FIXES + (TEMPLATE_FIXES if getattr(tok, "template", None) is not None else ())
    total = sum(s["prompt_tokens"] for s in res["by_stream"])
    hit = sum(s["hit"] for s in res["by_stream"])
    new = sum(s["new_content"] for s in res["by_stream"])
    lines = ["## Why requests miss", "",
             f"Configuration: TTL {format_ttl(ttl)}, block {block}, minimum prefix {min_prefix}, "
             f"stream `{stream}`. Every prompt token is either a hit, genuinely new content, or lost "
             "to exactly one of the causes below (the parts add up to the prompt length).", "",
             f"Hit {hit:,} of {total:,} prompt tokens ({100 * hit / total if total else 0:.1f} %); "
             f"genuinely new content {new:,} ({100 * new / total if total else 0:.1f} %).", "",
             "| cause | requests | tokens lost | share of prompt tokens |", "|---|---:|---:|---:|"]
    for c in res["causes"]:
        extra = ""
        if c["cause"] == "ttl_expired" and c.get("idle_gap_s"):
            g = c["idle_gap_s"]
            extra = f" (idle gaps: median {g['median']:.0f} s, p90 {g['p90']:.0f} s)"
        lines.append(f"| {c['cause']}{extra} | {c['requests']:,} | {c['tokens_lost']:,} | "
                     f"{100 * c['share_of_prompt_tokens']:.2f} % |")
    if not res["causes"]:
        lines.append("| (none) | 0 | 0 | 0 % |")
    if res.get("provider_agreement"):
        lines += [""] + agreement_lines(res["provider_agreement"], markdown=True)
    if n_requests > REPORT_WHATIF_MAX:
        lines += ["", f"(The ceiling after each fix is not computed in the report above "
                      f"{REPORT_WHATIF_MAX:,} requests: `replay whatif --fix all`.)"]
        return "\n".join(lines) + "\n"
    try:
        w = whatif(con, list(fixes or FIXES), ttl=ttl, block=block, min_prefix=min_prefix, stream=stream,
                   tokenizer=tokenizer)
    except Exception as exc:  # noqa: BLE001 - the section still reports the diagnosis
        lines += ["", f"(what-if not computed: {type(exc).__name__})"]
        return "\n".join(lines) + "\n"
    lines += ["", "### The ceiling after each fix", "",
              "Each normalizer is applied to the request bodies and the log replayed from scratch.", "",
              "| fix | hit ratio | gain (points) | hit tokens |", "|---|---:|---:|---:|",
              f"| (as logged) | {100 * w['before']['hit_ratio']:.2f} % | — | {w['before']['hit_tokens']:,} |"]
    for f in w["fixes"] + [w["all"]]:
        lines.append(f"| {f['fix']} | {100 * f['after']['hit_ratio']:.2f} % | "
                     f"{100 * f['gain_hit_ratio']:+.2f} | {f['after']['hit_tokens']:,} |")
    return "\n".join(lines) + "\n"
