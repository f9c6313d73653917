"""The sizing report: Markdown plus PNG plots under ``reports/<name>/``.

Other features add sections through ``extra_sections`` (a list of callables
``(con, out_dir) -> markdown``), so this module stays about the ceiling itself.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from replay.analysis.html import HTML_NAME, write_html
from replay.analysis.overview import idle_gaps, overview, unordered_note
from replay.core.grid import Grid
from replay.core.sweep import sweep
from replay.times import format_ttl
from replay.core.warmup import describe as describe_warmup
from replay.prepare import prepare
from replay.store.failpoints import failpoint

Section = Callable[[object, Path], str]


def _pyplot():
    """matplotlib's pyplot, drawing to files (imported when a plot is made: it is
    the slowest import of the package, and most commands draw nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish_figure(fig, path: Path | None):
    """Lay ``fig`` out and save it to ``path`` (then close it), or return it when no
    path is given (a notebook shows it)."""
    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return None


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _md_table(df: pl.DataFrame) -> str:
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.iter_rows():
        lines.append("| " + " | ".join("" if v is None else str(v) for v in row) + " |")
    return "\n".join(lines)


def plot_ceiling_vs_ttl(res: pl.DataFrame, grid: Grid, path: Path) -> None:
    """Hit ratio against TTL, one panel per stream mode, one line per block size."""
    modes = list(grid.streams)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 3.6), sharey=True, squeeze=False)
    finite = sorted(t for t in grid.ttls if t != math.inf)
    xs = {t: i for i, t in enumerate(finite + ([math.inf] if math.inf in grid.ttls else []))}
    labels = [format_ttl(t) for t in xs]
    for ax, mode in zip(axes[0], modes):
        for block in grid.blocks:
            for m, style in zip(sorted(grid.min_prefixes), ("-", "--", ":", "-.")):
                d = res.filter((pl.col("stream") == mode) & (pl.col("block") == block)
                               & (pl.col("min_prefix") == m))
                pts = sorted((xs[math.inf if r["ttl_s"] is None else r["ttl_s"]], r["hit_ratio"])
                             for r in d.to_dicts())
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3,
                            label=f"block {block}" + (f", min {m}" if m else ""))
        ax.set_title(f"stream = {mode}")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("TTL")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("hit ratio (token-weighted)")
    axes[0][0].set_ylim(0, 1)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("Prefix-cache ceiling against TTL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_idle_gaps(gaps: pl.DataFrame, ttls, path: Path) -> None:
    """CDF of the idle gap to the previous request of the same stream, with the TTLs."""
    g = gaps.drop_nulls("gap_s")["gap_s"].to_numpy()
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if len(g):
        g = np.sort(np.maximum(g, 0.01))
        ax.step(g, np.arange(1, len(g) + 1) / len(g), where="post")
        for t in ttls:
            if t != math.inf:
                ax.axvline(t, color="grey", ls="--", lw=0.8)
                ax.text(t, 0.02, format_ttl(t), rotation=90, fontsize=7, va="bottom")
        ax.set_xscale("log")
    ax.set_xlabel("idle gap to the previous request of the stream (s)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_stream_bars(per: pl.DataFrame, path: Path, title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(per) + 1.2))
    labels = [s if m is None else f"{s} ({m})" for s, m in zip(per["stream_key"], per["model"])]
    ax.barh(labels[::-1], per["hit_ratio"].to_list()[::-1])
    ax.set_xlim(0, 1)
    ax.set_xlabel("hit ratio")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def headline_config(grid: Grid) -> dict:
    """The configuration quoted first: the shortest TTL ≥ 5 min, the smallest block ≥ 16."""
    ttl = min((t for t in grid.ttls if t >= 300), default=max(grid.ttls))
    block = min((b for b in grid.blocks if b >= 16), default=max(grid.blocks))
    stream = "tenant" if "tenant" in grid.streams else grid.streams[0]
    return {"stream": stream, "ttl": ttl, "block": block, "min_prefix": min(grid.min_prefixes)}


def write_report(con, out_dir: str | Path, grid: Grid | None = None, title: str | None = None,
                 extra_sections: list[Section] = (), progress=False, tokenizer=None, html: bool = False) -> Path:
    """Sweep ``grid`` (preparing its walks first) and write ``report.md`` with its
    plots, ``sweep.parquet`` and ``sweep.json`` into ``out_dir``; the
    ``extra_sections`` follow the ceiling's own (one that fails is named in the
    report, and the rest still come). ``html``: also ``report.html``, the same
    report as one self-contained page (``replay.analysis.html``). Returns the
    report's path."""
    grid = grid or Grid()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    # report.md is written last, whole or not at all: a run stopped on the way
    # leaves no report.md rather than an earlier run's beside this run's plots
    path.unlink(missing_ok=True)
    (out / HTML_NAME).unlink(missing_ok=True)  # (an earlier run's page: never beside another report)
    prepare(con, modes=grid.streams, horizon_us=grid.horizon_us, tokenizer=tokenizer, progress=progress)
    res = sweep(con, grid)
    res.write_parquet(out / "sweep.parquet")
    (out / "sweep.json").write_text(json.dumps(res.to_dicts(), indent=1))
    h = headline_config(grid)
    plot_ceiling_vs_ttl(res, grid, out / "ceiling_vs_ttl.png")
    plot_idle_gaps(idle_gaps(con, h["stream"]), grid.ttls, out / "idle_gaps.png")
    lines = _summary(overview(con), res, grid, h, title)
    lines += _per_stream(con, grid, h, out)
    lines += ["## Idle gaps against the TTLs", "",
              "How long each stream sat idle before a request. Requests to the right of a TTL line "
              "find their prefix gone at that TTL.", "", "![idle gaps](idle_gaps.png)", ""]
    for section in extra_sections:
        failpoint("report.section")
        try:
            lines += [section(con, out), ""]
        except Exception as exc:  # noqa: BLE001 - an optional section must not lose the report
            print(f"report: a section could not be computed ({failure(exc)})", file=sys.stderr)
            lines += [f"_A section could not be computed: {failure(exc)}_", ""]
    lines += ["## How to read this", "",
              "- *Hit ratio* = cached prompt tokens / all prompt tokens (token-weighted, first requests "
              "included), as vLLM reports it. A hit is the longest prefix shared with an earlier request "
              "of the same stream within the TTL, floored to whole blocks, and zero below the minimum "
              "prefix (`semantics.md`).",
              "- Stream modes: `tenant` — one cache per tenant; `key` — per prompt_cache_key (tenant when "
              "missing); `global` — everyone shares one cache. Whatever the mode, a cache belongs to one "
              "model: requests to different models never share a prefix.", ""]
    text = "\n".join(lines)
    if html:  # written before report.md, which stays the mark of a finished report
        write_html(text, out)
    tmp = path.with_name(".report.md.partial")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _generated_at() -> dt.datetime:
    """Now, or SOURCE_DATE_EPOCH when set (the reproducible-builds convention:
    two runs over the same data then write the same bytes)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return (dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch and epoch.isdigit()
            else dt.datetime.now(dt.timezone.utc))


_PACKAGE = Path(__file__).resolve().parents[1]  # replay/: its own code (not a folder that happens to be named so)


def failure(exc: BaseException) -> str:
    """What failed: the message when replay's own code raised it (those name
    options, fields and types, never a value of the logs); else the exception's
    type and where — not its message, which may quote the logs' text (a value
    that did not parse, a key that was missing)."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    if last is not None and Path(last.filename).resolve().is_relative_to(_PACKAGE) \
            and (last.line or "").startswith("raise "):
        return f"{type(exc).__name__}: {exc}"
    where = f" in {Path(last.filename).name}:{last.lineno} ({last.name})" if last is not None else ""
    return f"{type(exc).__name__}{where}; its message is not shown, as it may quote prompt text"


def _summary(ov: dict, res: pl.DataFrame, grid: Grid, h: dict, title: str | None) -> list[str]:
    """The report's head: what was read, the headline ceiling and the sweep's spread."""
    sel = res.filter((pl.col("stream") == h["stream"]) & (pl.col("block") == h["block"])
                     & (pl.col("min_prefix") == h["min_prefix"]))
    head = sel.filter(pl.col("ttl_s") == h["ttl"]) if h["ttl"] != math.inf else sel.filter(pl.col("ttl_s").is_null())
    head_ratio = head["hit_ratio"][0] if len(head) else float("nan")
    lo, hi = res["hit_ratio"].min(), res["hit_ratio"].max()
    best = res.sort("hit_ratio", descending=True).row(0, named=True)
    worst = res.sort("hit_ratio").row(0, named=True)
    span_h = ((ov["last_ts"] or 0) - (ov["first_ts"] or 0)) / 3600
    aside = (f", {ov['set_aside']:,} request(s) set aside as unrenderable (see `set_aside`)"
             if ov["set_aside"] else "")
    table = res.with_columns(
        pl.col("ttl_s").fill_null(float("inf")).map_elements(format_ttl, return_dtype=pl.String).alias("ttl"),
        (pl.col("hit_ratio") * 100).round(1).alias("hit %")).select(
        ["stream", "ttl", "block", "min_prefix", "requests", "prompt_tokens", "hit_tokens", "hit %", "requests_hit"])
    return [
        f"# {title or 'Prefix-cache sizing report'}", "",
        f"_Generated {_generated_at():%Y-%m-%d %H:%M} UTC by `replay`; tokenizer: "
        f"`{ov['tokenizer'] or 'none (block trace)'}`._", "",
        "## Summary", "",
        f"- **{ov['requests']:,} requests** over {span_h:.1f} h from {ov['tenants']} tenant(s), "
        f"{ov['keys']} prompt_cache_key(s), {ov['sessions']} session(s), {ov['models']} model(s); "
        f"{ov['rejected']:,} input line(s) rejected at ingest (see `rejects`){aside}.",
        *([f"- {note}"] if (note := unordered_note(ov.get("unordered_files", []))) else []),
        f"- {ov['logical_prompt_tokens']:,} prompt tokens in all, made of "
        f"{ov['unique_content_tokens']:,} tokens of unique content.",
        f"- **Ceiling at {format_ttl(h['ttl'])} TTL, block {h['block']}, per {h['stream']}: "
        f"{_pct(head_ratio)}** of prompt tokens could come from a prefix cache.",
        f"- Across the whole sweep ({grid.size} configurations) the ceiling ranges from "
        f"**{_pct(lo)}** ({worst['stream']}, TTL {format_ttl(worst['ttl_s'])}, block {worst['block']}, "
        f"min {worst['min_prefix']}) to **{_pct(hi)}** ({best['stream']}, TTL {format_ttl(best['ttl_s'])}, "
        f"block {best['block']}, min {best['min_prefix']}). That spread is the honest error bar of the "
        "estimate: which end applies depends on what your provider or engine shares and keeps.",
        "- This is a *ceiling*: what an unbounded cache with these rules would hit. Provider rules, "
        "capacity and prices lower it (see the later sections where present).",
        f"- Measured over {describe_warmup(grid.warmup)}; `--warmup` changes it.", "",
        "## Ceiling against TTL", "", "![ceiling vs TTL](ceiling_vs_ttl.png)", "",
        "<details><summary>The whole sweep</summary>", "", _md_table(table), "", "</details>", ""]


def _per_stream(con, grid: Grid, h: dict, out: Path) -> list[str]:
    """Per cache (stream key and model) of the tenant and key modes: the top 25 by tokens."""
    lines = ["## Per stream", "",
             "An aggregate over streams misleads: a few large streams can carry the ratio. "
             f"Per stream at TTL {format_ttl(h['ttl'])}, block {h['block']}:", ""]
    per_grid = Grid(ttls=tuple(sorted({h["ttl"], math.inf})), blocks=(h["block"],),
                    min_prefixes=(h["min_prefix"],), warmup=grid.warmup,
                    streams=tuple(m for m in ("tenant", "key") if m in grid.streams) or grid.streams[:1])
    prepare(con, modes=per_grid.streams, horizon_us=per_grid.horizon_us)
    per = sweep(con, per_grid, by_stream=True)
    for mode in per_grid.streams:
        d = per.filter((pl.col("stream") == mode) & (pl.col("ttl_s") == h["ttl"]) if h["ttl"] != math.inf
                       else (pl.col("stream") == mode) & pl.col("ttl_s").is_null())
        inf = per.filter((pl.col("stream") == mode) & pl.col("ttl_s").is_null()).select(
            ["stream_key", "model", pl.col("hit_ratio").alias("hit_inf")])
        d = d.join(inf, on=["stream_key", "model"], how="left", nulls_equal=True).sort("prompt_tokens",
                                                                                     descending=True)
        top = d.head(25)
        if not len(top):
            continue
        plot_stream_bars(top, out / f"streams_{mode}.png",
                         f"hit ratio per {mode} stream (TTL {format_ttl(h['ttl'])}, block {h['block']})")
        shown = top.select(["stream_key", "model", "requests", "prompt_tokens",
                            (pl.col("hit_ratio") * 100).round(1).alias(f"hit % @{format_ttl(h['ttl'])}")]
                           + ([(pl.col("hit_inf") * 100).round(1).alias("hit % @inf")]
                              if h["ttl"] != math.inf else []))  # (a headline TTL of inf: one column)
        lines += [f"### By {mode} ({len(d)} streams{', top 25 by tokens' if len(d) > 25 else ''})", "",
                  f"![per {mode}](streams_{mode}.png)", "", _md_table(shown), ""]
    return lines
