"""The report's "What to buy" section: memory tiers and routings side by side, in
hit ratio, prefill GPU-hours, GPUs at the busiest hour and dollars.

The options, per replica: GPU memory only; + host DRAM; + a pooled DRAM store
shared by every replica (Mooncake Store, LMCache remote); + DRAM and a local
SSD — each with round-robin and sticky routing. Every row is one
``replay capacity --tier`` configuration from one pass (``analysis.capacity``)
priced by the prefill cost model (``analysis.buy``). Sizes, stated in the
section: a replica is the fewest GPUs (a power of two) whose memory holds the
weights within 60 % of it; its KV cache is 90 % of its GPUs' memory less the
weights (vLLM's default ``gpu_memory_utilization``); DRAM 256 GiB per GPU of
the replica; the pool the same per replica, in one place; SSD 4 TiB per
replica. Replicas: as many as the uncached busiest hour needs (at most 16).
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from replay.analysis.buy import CostModel
from replay.analysis.capacity import CapacityGrid, capacity
from replay.analysis.report import _pyplot, headline_config
from replay.core.grid import Grid
from replay.core.tiers import TierSpec, format_tiers

GIB = 2**30
DRAM_PER_GPU = 256 * GIB
SSD_PER_REPLICA = 4 * 2**40
MAX_REPLICAS = 16
POOL_BANDWIDTH = "25GB/s"  # a 200 Gb/s RDMA NIC (gpus.toml [tiers] store)


def replica_shape(cost: CostModel) -> tuple[int, int]:
    """(GPUs per replica, KV bytes per replica) under the rule of the module's doc."""
    memory = cost.gpu.memory_bytes
    if memory is None:
        raise ValueError("the GPU's memory is not known (a table GPU has it): pass --gpu NAME")
    weights = cost.model.weight_bytes + cost.model.embedding_bytes
    tp = 1
    while weights > 0.6 * tp * memory:
        tp *= 2
    return tp, int(0.9 * tp * memory - weights)


def options(cost: CostModel, tp: int, kv: int, replicas: int) -> dict[str, tuple[TierSpec, ...]]:
    dram = f"{tp * DRAM_PER_GPU}"
    hbm = TierSpec("hbm", f"{kv}b")
    return {"GPU memory only": (hbm,),
            "+ DRAM per replica": (hbm, TierSpec("dram", dram + "b")),
            "+ pooled DRAM": (hbm, TierSpec("store", f"{replicas * tp * DRAM_PER_GPU}b", True, POOL_BANDWIDTH)),
            "+ DRAM + SSD per replica": (hbm, TierSpec("dram", dram + "b"), TierSpec("ssd", f"{SSD_PER_REPLICA}b"))}


def buy_figures(con, cost: CostModel, stream: str, block: int, tokenizer=None, warmup: float = 0.0) -> dict:
    """The options' rows (a polars frame: option, routing, hit_ratio, tier_hit_tokens
    and the cost keys) and the sizes they assume."""
    tp, kv = replica_shape(cost)
    one = CapacityGrid(blocks=(block,), streams=(stream,), tiers=((TierSpec("hbm", f"{kv}b"),),), warmup=warmup)
    first = capacity(con, one, bytes_per_token=cost.model.kv_bytes_per_token, tokenizer=tokenizer, cost=cost)
    replicas = max(1, min(MAX_REPLICAS, math.ceil(first["gpus_peak_hour_uncached"][0] / tp)))
    opts = options(cost, tp, kv, replicas)
    grid = CapacityGrid(blocks=(block,), streams=(stream,), replicas=(replicas,),
                        routings=("round-robin", "sticky"), tiers=tuple(opts.values()), warmup=warmup)
    df = capacity(con, grid, bytes_per_token=cost.model.kv_bytes_per_token, tokenizer=tokenizer, cost=cost)
    names = {format_tiers(t): name for name, t in opts.items()}
    df = df.with_columns(pl.col("tiers").replace_strict(names).alias("option"))
    return {"rows": df, "tp": tp, "kv_bytes": kv, "replicas": replicas, "stream": stream, "block": block,
            "options": list(opts)}


def recommend(df: pl.DataFrame, options: list[str]) -> dict:
    """The option to buy: the fewest GPUs at the busiest hour, then the fewest prefill
    GPU-hours; a simpler option (earlier in ``options``) wins when it needs as many
    GPUs and no more than 2 % more GPU-hours."""
    rows = sorted(df.iter_rows(named=True), key=lambda r: (r["gpus_peak_hour"], r["prefill_gpu_hours_week"] or 0))
    best = rows[0]
    for r in sorted(rows, key=lambda r: (options.index(r["option"]), r["routing"])):
        if r["gpus_peak_hour"] == best["gpus_peak_hour"] and \
                (r["prefill_gpu_hours_week"] or 0) <= 1.02 * (best["prefill_gpu_hours_week"] or 0):
            return r
    return best


def _money(x) -> str:
    return "–" if x is None else f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def _hours(x) -> str:
    """Three significant figures below 100 (a small log's week is a fraction of an hour)."""
    return "–" if x is None else f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3g}"


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def buy_markdown(f: dict, cost: CostModel) -> list[str]:
    df = f["rows"]
    g, m = cost.gpu, cost.model
    lines = ["## What to buy", "",
             f"Prefill of `{m.name}` on **{g.name}** ({g.flops / 1e12:,.0f} dense BF16 TFLOP/s at "
             f"{100 * cost.utilisation:.0f} % utilisation, {g.hbm_bytes_s / 1e9:,.0f} GB/s memory, "
             f"{g.host_bytes_s / 1e9:,.0f} GB/s host link; {g.source}), stream `{f['stream']}`, "
             f"{f['block']}-token blocks, no TTL. A replica is {f['tp']} GPU(s) with "
             f"{f['kv_bytes'] / GIB:,.0f} GiB of KV cache; {f['replicas']} replica(s) — what the busiest hour "
             f"needs without a cache. DRAM {f['tp'] * DRAM_PER_GPU // GIB} GiB per replica over the host link; "
             f"the pool {f['replicas'] * f['tp'] * DRAM_PER_GPU // GIB} GiB shared at {POOL_BANDWIDTH}; "
             f"SSD {SSD_PER_REPLICA // 2**40} TiB per replica at 7 GB/s. A hit from a lower tier is loaded "
             f"(bytes / bandwidth), not free. GPU-hours are prefill only, a week at the log's rate; GPUs at "
             f"the busiest hour at {100 * cost.target:.0f} % busy.", "",
             "![prefill GPU-hours by option](what_to_buy.png)", "",
             "| option | routing | hit ratio | prefill GPU-h/week | of which loads | saved | GPUs at peak | "
             "$/week (prefill) | $/week (fleet) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    uncached = df.row(0, named=True)
    lines.append(f"| no cache | – | 0.0 % | {_hours(uncached['prefill_gpu_hours_week_uncached'])} | – | – | "
                 f"{uncached['gpus_peak_hour_uncached']} | {_money(uncached['prefill_dollars_week_uncached'])} | "
                 f"{_money(uncached['fleet_dollars_week_uncached'])} |")
    for r in sorted(df.iter_rows(named=True), key=lambda r: (f["options"].index(r["option"]), r["routing"])):
        lines.append(f"| {r['option']} | {r['routing']} | {100 * r['hit_ratio']:.1f} % | "
                     f"{_hours(r['prefill_gpu_hours_week'])} | {_hours(r['load_gpu_hours_week'])} | "
                     f"{_hours(r['gpu_hours_saved_week'])} | {r['gpus_peak_hour']} | "
                     f"{_money(r['prefill_dollars_week'])} | {_money(r['fleet_dollars_week'])} |")
    best = recommend(df, f["options"])
    saved = best["gpu_hours_saved_week"]
    text = (f"**Buy: {best['option'].lstrip('+ ')}, {best['routing']} routing** — {100 * best['hit_ratio']:.1f} % "
            f"of prompt tokens from cache, {_gpus(best['gpus_peak_hour'])} at the busiest hour instead of "
            f"{uncached['gpus_peak_hour_uncached']}")
    text += f", {_hours(saved)} prefill GPU-hours a week saved" if saved is not None else ""
    text += (f" ({_money(saved * cost.price)} a week)." if saved is not None and cost.price is not None else ".")
    if cost.price is None:
        text += " Pass `--gpu-price DOLLARS` (per GPU-hour) for dollars."
    lines += ["", text, "", "_The fewest GPUs at the busiest hour, then the fewest GPU-hours; a simpler option "
              "wins when it needs as many GPUs and at most 2 % more GPU-hours. Decode is not modelled._", ""]
    return lines


def plot_buy(f: dict, path: Path) -> None:
    """Prefill GPU-hours a week per option, a bar per routing, the uncached figure dashed."""
    plt = _pyplot()
    df = f["rows"]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    routings = sorted(set(df["routing"]))
    width = 0.8 / len(routings)
    for k, routing in enumerate(routings):
        part = {r["option"]: r for r in df.filter(pl.col("routing") == routing).iter_rows(named=True)}
        xs = [i + k * width for i in range(len(f["options"]))]
        ax.bar(xs, [part[o]["prefill_gpu_hours_week"] or 0 for o in f["options"]], width, label=routing)
    ax.axhline(df["prefill_gpu_hours_week_uncached"][0] or 0, color="k", linestyle="--", linewidth=0.8,
               label="no cache")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(f["options"]))], f["options"], fontsize=8)
    ax.set_ylabel("prefill GPU-hours per week")
    ax.set_title("Prefill GPU-hours by memory option (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def buy_section(con, out_dir, grid: Grid | None = None, cost: CostModel | None = None, tokenizer=None) -> str:
    """Markdown (and ``what_to_buy.png``) for the report; without a cost model, which flags to pass."""
    if cost is None:
        return "\n".join(["## What to buy", "", "_Pass `--model NAME --gpu NAME` (e.g. `--model llama-3.1-8b "
                          "--gpu h100`, and `--gpu-price 2.5` for dollars) to `replay run` for GPU-hours, GPUs and "
                          "dollars per memory option (GPU memory, DRAM, a pooled store, SSD) and routing._", ""])
    grid = grid or Grid()
    h = headline_config(grid)
    f = buy_figures(con, cost, h["stream"], h["block"], tokenizer, grid.warmup)
    plot_buy(f, Path(out_dir) / "what_to_buy.png")
    return "\n".join(buy_markdown(f, cost))
