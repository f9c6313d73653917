"""The report's "How much memory" section: the hit ratio of a finite LRU cache
against its size, the smallest size reaching a share of the unbounded ceiling,
and what spreading the traffic over replicas costs, by routing.

Everything comes from :func:`replay.analysis.capacity.capacity` (the one-pass
capacity curve; prefix routing simulated at the one capacity the replicas
table uses). Sizes are per replica, in GiB when the KV bytes per token are
known, else in blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from replay.analysis.capacity import CapacityGrid, capacity
from replay.analysis.report import _pyplot, finish_figure, headline_config
from replay.core.grid import Grid
from replay.times import format_ttl

SHARES = (0.5, 0.9, 0.99)            # of the ceiling: the sizes the section names
REPLICAS = (1, 2, 4, 8)
ROUTINGS = ("round-robin", "random", "sticky", "prefix")
CURVE_POINTS = 64                    # capacities on the curve (log-spaced up to the working set)
PREFIX_ROUTING_MAX_REQUESTS = 20_000  # prefix routing is simulated block by block: skipped above this
GIB = 2 ** 30


@dataclass
class MemoryFigures:
    """The section's numbers: ``curve`` (capacity rows, one replica: stream,
    ttl_s, capacity_blocks, capacity_bytes, hit_ratio), ``sizes`` (per stream
    and TTL: the ceiling and the smallest capacity reaching each share of it),
    ``replicas`` (the headline stream and TTL at the 90 % size per replica:
    replicas, routing, hit_ratio, max_replica_share)."""
    block: int
    bytes_per_token: int | None
    model: str | None
    curve: pl.DataFrame
    sizes: pl.DataFrame
    replicas: pl.DataFrame
    headline: tuple[str, float]


def memory_figures(con, streams=("tenant", "global"), ttls=(300.0, math.inf), block: int = 16,
                   bytes_per_token: int | None = None, model: str | None = None,
                   headline: tuple[str, float] | None = None, tokenizer=None,
                   warmup: float = 0.0) -> MemoryFigures:
    """Compute the section's figures (see :class:`MemoryFigures`); ``headline``
    (stream, TTL) picks the curve the replicas table is for (default: the first
    of each); ``warmup``: measure on the last 1 − warmup of the requests (``replay.core.warmup``)."""
    headline = headline or (streams[0], ttls[0])
    grid = CapacityGrid(blocks=(block,), capacities=("auto",), ttls=tuple(ttls), streams=tuple(streams),
                        auto_points=CURVE_POINTS, warmup=warmup)
    curve = capacity(con, grid, bytes_per_token=bytes_per_token, tokenizer=tokenizer).select(
        ["stream", "ttl_s", "capacity_blocks", "capacity_bytes", "hit_ratio"])
    sizes = _sizes(curve)
    ttl_key = None if headline[1] == math.inf else float(headline[1])
    size90 = sizes.filter((pl.col("stream") == headline[0]) & (pl.col("ttl_s").eq_missing(ttl_key)))
    replicas = pl.DataFrame()
    if len(size90) and size90["blocks_90"][0]:
        n = con.execute("SELECT count(*) FROM requests").fetchone()[0]
        routings = tuple(r for r in ROUTINGS if r != "prefix" or n <= PREFIX_ROUTING_MAX_REQUESTS)
        rgrid = CapacityGrid(blocks=(block,), capacities=(str(size90["blocks_90"][0]),), ttls=(headline[1],),
                             streams=(headline[0],), replicas=REPLICAS, routings=routings, warmup=warmup)
        replicas = capacity(con, rgrid, bytes_per_token=bytes_per_token, tokenizer=tokenizer).select(
            ["replicas", "routing", "capacity_blocks", "hit_ratio", "max_replica_share"])
    return MemoryFigures(block, bytes_per_token, model, curve, sizes, replicas, headline)


def _sizes(curve: pl.DataFrame) -> pl.DataFrame:
    """Per (stream, TTL): the ceiling (the hit ratio once everything fits) and
    the smallest capacity on the curve reaching each share of it."""
    rows = []
    for (stream, ttl), part in curve.group_by(["stream", "ttl_s"], maintain_order=True):
        part = part.sort("capacity_blocks")
        ceiling = float(part["hit_ratio"].max())
        row = {"stream": stream, "ttl_s": ttl, "ceiling": ceiling,
               "working_set_blocks": int(part["capacity_blocks"].max())}
        for share in SHARES:
            reach = part.filter(pl.col("hit_ratio") >= share * ceiling - 1e-12)
            row[f"blocks_{round(share * 100)}"] = int(reach["capacity_blocks"][0]) if ceiling > 0 else 0
        rows.append(row)
    return pl.DataFrame(rows)


def _size(blocks: int, f: MemoryFigures) -> str:
    if f.bytes_per_token is None:
        return f"{blocks:,} blocks"
    gib = blocks * f.block * f.bytes_per_token / GIB
    return f"{gib:.3g} GiB" if gib >= 0.01 else f"{gib * 1024:.3g} MiB"


def plot_memory(f: MemoryFigures, path: Path | None = None):
    """Hit ratio against capacity (log axis), one line per stream and TTL, each
    ceiling dashed in its line's colour; saved to ``path``, else returned (a
    matplotlib figure, for a notebook)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    scale = f.block * f.bytes_per_token / GIB if f.bytes_per_token else 1.0
    for (stream, ttl), part in f.curve.filter(pl.col("capacity_blocks") > 0).group_by(
            ["stream", "ttl_s"], maintain_order=True):
        part = part.sort("capacity_blocks")
        x = part["capacity_blocks"].to_numpy() * scale
        label = f"{stream}, TTL {format_ttl(math.inf if ttl is None else ttl)}"
        (line,) = ax.plot(x, 100 * part["hit_ratio"].to_numpy(), marker=".", markersize=3, label=label)
        ax.axhline(100 * part["hit_ratio"].max(), color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(f"KV cache per replica (GiB, {f.model or 'given'} bytes per token)" if f.bytes_per_token
                  else f"KV cache per replica (blocks of {f.block} tokens)")
    ax.set_ylabel("hit ratio (% of prompt tokens)")
    ax.set_title("Hit ratio against cache size (dashed: unbounded ceiling)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return finish_figure(fig, path)


def memory_markdown(f: MemoryFigures) -> list[str]:
    unit = (f"GiB of KV cache per replica for `{f.model}` ({f.bytes_per_token:,} bytes per token)"
            if f.bytes_per_token else f"blocks of {f.block} tokens per replica")
    lines = ["## How much memory", "",
             f"An LRU cache of whole {f.block}-token blocks (`semantics.md`, \"Capacity\"), sizes in {unit}."]
    if f.bytes_per_token is None:
        lines += ["", "_No model given, so sizes are in blocks: pass `--model NAME` (e.g. `llama-3.1-8b`, "
                  "`deepseek-v3`), `--model-config PATH/config.json` or `--kv-bytes-per-token N` to "
                  "`replay run` for GiB._"]
    lines += ["", "![hit ratio vs cache size](memory_vs_hits.png)", "",
              "| stream | TTL | ceiling | 50 % of it | 90 % of it | 99 % of it | everything (working set) |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in f.sizes.iter_rows(named=True):
        ttl = format_ttl(math.inf if r["ttl_s"] is None else r["ttl_s"])
        lines.append(f"| {r['stream']} | {ttl} | {100 * r['ceiling']:.1f} % | " +
                     " | ".join(_size(r[f"blocks_{round(s * 100)}"], f) for s in SHARES) +
                     f" | {_size(r['working_set_blocks'], f)} |")
    ws = int(f.sizes["working_set_blocks"].max()) if len(f.sizes) else 1
    step = 100 * (math.exp(math.log(max(ws, 2)) / (CURVE_POINTS - 1)) - 1)
    lines += ["", f"Each size is the smallest on a {CURVE_POINTS}-point log-spaced grid up to the working set "
              f"(each point about {step:.0f} % larger than the one before).", ""]
    lines += _replicas_table(f) + _recommendation(f)
    return lines


def _replicas_table(f: MemoryFigures) -> list[str]:
    if not len(f.replicas):
        return []
    stream, ttl = f.headline
    size = _size(int(f.replicas["capacity_blocks"][0]), f)
    lines = [f"### Replicas and routing ({stream}, TTL {format_ttl(ttl)}, {size} per replica)", "",
             "Each replica has its own cache of that size. The busiest replica's share "
             "of the requests (1/R is perfectly even): cache-aware routing trades evenness for hits.", "",
             "| replicas | routing | hit ratio | busiest replica's share |", "|---:|---|---:|---:|"]
    one = f.replicas.filter(pl.col("replicas") == 1).head(1).with_columns(routing=pl.lit("(any)"))
    for r in pl.concat([one, f.replicas.filter(pl.col("replicas") > 1)]).sort(
            ["replicas", "routing"]).iter_rows(named=True):
        lines.append(f"| {r['replicas']} | {r['routing']} | {100 * r['hit_ratio']:.1f} % | "
                     f"{100 * r['max_replica_share']:.0f} % |")
    if "prefix" not in f.replicas["routing"].to_list():
        lines += ["", f"_Prefix routing is simulated block by block: left out above "
                  f"{PREFIX_ROUTING_MAX_REQUESTS:,} requests (run `replay capacity --routing prefix` on a part)._"]
    return lines + [""]


def _recommendation(f: MemoryFigures) -> list[str]:
    stream, ttl = f.headline
    ttl_key = None if ttl == math.inf else float(ttl)
    row = f.sizes.filter((pl.col("stream") == stream) & pl.col("ttl_s").eq_missing(ttl_key))
    if not len(row) or row["ceiling"][0] <= 0:
        return ["### Recommendation", "", "No prefix is ever reused in this log: a cache would not help.", ""]
    r = row.row(0, named=True)
    at90 = f.curve.filter((pl.col("stream") == stream) & pl.col("ttl_s").eq_missing(ttl_key) &
                          (pl.col("capacity_blocks") == r["blocks_90"]))["hit_ratio"][0]
    text = (f"With one cache per `{stream}` and TTL {format_ttl(ttl)}, **{_size(r['blocks_90'], f)}** per replica "
            f"keeps at least 90 % of what an unbounded cache would hit ({100 * at90:.1f} % of prompt tokens "
            f"against {100 * r['ceiling']:.1f} %); {_size(r['blocks_99'], f)} keeps 99 %, and "
            f"{_size(r['working_set_blocks'], f)} holds everything this log ever used.")
    if len(f.replicas):
        one = f.replicas.filter(pl.col("replicas") == 1)["hit_ratio"]
        most = f.replicas.filter(pl.col("replicas") == max(REPLICAS))
        best = most.sort("hit_ratio", descending=True).row(0, named=True)
        rr = most.filter(pl.col("routing") == "round-robin")
        text += (f" Spread over {max(REPLICAS)} replicas of that size, round-robin routing keeps "
                 f"{100 * rr['hit_ratio'][0]:.1f} % (one replica: {100 * one[0]:.1f} %); "
                 f"{best['routing']} routing keeps {100 * best['hit_ratio']:.1f} % with the busiest replica taking "
                 f"{100 * best['max_replica_share']:.0f} % of requests.") if len(rr) else ""
    return ["### Recommendation", "", text, ""]


def memory_section(con, out_dir, grid: Grid | None = None, bytes_per_token: int | None = None,
                   model: str | None = None, tokenizer=None) -> str:
    """Markdown (and ``memory_vs_hits.png`` in ``out_dir``) for the report: the
    report grid's headline stream and ``global`` (where the grid has them),
    its headline TTL and ∞, its headline block size."""
    grid = grid or Grid()
    h = headline_config(grid)
    streams = tuple(dict.fromkeys([h["stream"]] + [m for m in ("global",) if m in grid.streams]))
    ttls = tuple(dict.fromkeys([h["ttl"], math.inf]))
    f = memory_figures(con, streams, ttls, h["block"], bytes_per_token, model, tokenizer=tokenizer,
                       warmup=grid.warmup)
    plot_memory(f, Path(out_dir) / "memory_vs_hits.png")
    return "\n".join(memory_markdown(f))
