"""The report's "Predicted vs realised" section: the provider's own cache counts
beside what its rules predict on the same requests (``replay.providers.realised``)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from replay.analysis.report import _pyplot, finish_figure
from replay.providers.realised import by_length, by_session, has_usage, judged, realised


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def realised_section(con, out_dir=None, tokenizer=None) -> str:
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
           "| provider | model | requests | sessions | our visible / provider tokens | predicted | realised "
           "| gap (pts) | inferred | gap parts (pts) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        parts = ", ".join(f"{k} {v:+.2f}" for k, v in r["gap_parts"].items() if abs(v) >= 0.005) or "-"
        visible = r["prompt_tokens"] * (1 - r["inferred_share"])  # (our tokens the log holds)
        ratio = visible / r["provider_prompt_tokens"] if r["provider_prompt_tokens"] else 0.0
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
        if out_dir is not None:
            plot_sessions(s, Path(out_dir) / PLOT)
            out += ["", f"![predicted against realised per session]({PLOT})"]
    return "\n".join(out)


PLOT = "realised_by_session.png"


def plot_sessions(s: pl.DataFrame, path: Path | None = None):
    """Predicted against realised hit ratio, one point per session (its size: its
    calls), one colour per provider; the diagonal is agreement. Saved to ``path``,
    else returned (a matplotlib figure, for a notebook)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for (prov,), part in s.group_by(["provider"], maintain_order=True):
        ax.scatter(100 * part["realised_ratio"].to_numpy(), 100 * part["predicted_ratio"].to_numpy(),
                   s=8 + 2 * part["calls"].clip(upper_bound=200).to_numpy() ** 0.75, alpha=0.6, label=prov)
    ax.plot([0, 100], [0, 100], color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("realised hit ratio (%): the provider's usage")
    ax.set_ylabel("predicted hit ratio (%): its rules, our tokens")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Per session (point size: calls)", fontsize=10)
    return finish_figure(fig, path)


def session_frame(con, tokenizer=None) -> pl.DataFrame:
    """Per session: provider, calls, predicted and realised ratio (the notebook's distribution)."""
    return by_session(judged(con, tokenizer))
