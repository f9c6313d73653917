"""The report's "Predicted vs realised" section: the provider's own cache counts
beside what its rules predict on the same requests (``replay.providers.realised``)."""

from __future__ import annotations

import polars as pl

from replay.providers.realised import by_length, by_session, has_usage, judged, realised


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def realised_section(con, out=None, tokenizer=None) -> str:
    """Markdown; empty when no request carries the provider's usage."""
    if not has_usage(con):
        return ""
    df = judged(con, tokenizer)
    rows = realised(con, frame=df)
    out = ["## Predicted vs realised", "",
           "What each provider's rules predict on these requests (its client's breakpoints, minimums, TTLs, "
           "serving backends; `replay profiles`), beside what the provider actually cached according to the "
           "usage in the log. Ratios, not counts: our tokenizer is not the provider's. *Inferred* is the share "
           "of our prompt tokens that the log does not hold and was inferred from usage (system prompt and "
           "tools of coding agents). The gap parts add up to the gap: each request's difference is counted "
           "under the rule that decided its prediction (docs/realised.md).", "",
           "| provider | model | requests | sessions | our / provider tokens | predicted | realised | gap (pts) "
           "| inferred | gap parts (pts) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        parts = ", ".join(f"{k} {v:+.2f}" for k, v in r["gap_parts"].items() if abs(v) >= 0.005) or "-"
        ratio = r["prompt_tokens"] / r["provider_prompt_tokens"] if r["provider_prompt_tokens"] else 0.0
        name = "**all**" if r["model"] == "*" else f"`{r['model']}`"
        out.append(f"| {r['provider']} | {name} | {r['requests']:,} | {r['sessions']:,} | {ratio:.2f} | "
                   f"{_pct(r['predicted_hit_ratio'])} | {_pct(r['realised_hit_ratio'])} | {r['gap_points']:+.2f} | "
                   f"{_pct(r['inferred_share'])} | {parts} |")
    lengths = by_length(df)
    if lengths:
        out += ["", "By session length (calls per session; cache rates grow with task length):", "",
                "| provider | calls | sessions | predicted | realised |", "|---|---|---:|---:|---:|"]
        out += [f"| {b['provider']} | {b['calls']} | {b['sessions']:,} | {_pct(b['predicted_hit_ratio'])} | "
                f"{_pct(b['realised_hit_ratio'])} |" for b in lengths]
    s = by_session(df)
    if len(s) > 1:
        d = (s["predicted_ratio"] - s["realised_ratio"]) * 100
        q = d.quantile(0.05), d.median(), d.quantile(0.95)
        out += ["", f"Per session, predicted − realised: p5 {q[0]:+.1f}, median {q[1]:+.1f}, p95 {q[2]:+.1f} points "
                f"over {len(s):,} sessions."]
    return "\n".join(out)


def session_frame(con, tokenizer=None) -> pl.DataFrame:
    """Per session: provider, calls, predicted and realised ratio (the notebook's distribution)."""
    return by_session(judged(con, tokenizer))
