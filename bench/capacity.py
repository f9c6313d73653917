"""Benchmark: the capacity grid from one pass, against one LRU simulation per
capacity, and the sampled estimate's error.

    python bench/capacity.py --db /tmp/w/replay.duckdb --json   # a database bench/pipeline.py kept

The database is one ``bench/pipeline.py --keep`` made (ingested and
tokenized); every stage runs in a fresh process on it, one after the other:

* **exact**: ``replay.api.capacity`` over the grid (``--blocks`` × the week's
  TTLs and ∞ × ``--replicas`` round-robin × ``auto`` capacities, global
  stream), its wall time and peak RSS; **exact_preset_ttls** the same without
  ∞ (the pipeline's own TTLs, up to 2 h: the trie forgets what is older, where
  a cache that never forgets must hold every block of the log);
* **naive**: the prompts read once into block logs, then one LRU simulation
  (``replay.core.simulate``, the contract block by block) per capacity, for
  ``--naive-capacities`` capacities of each block size and replica count,
  spread over the grid. Its rows must equal the exact ones
  (``naive_results_identical``); ``naive_grid_s_estimated`` is the read
  plus the mean simulation times the grid's size (the whole grid is hours),
  and ``speedup_vs_naive`` that over the exact stage;
* **sampled**: ``--sample-rate`` for each of ``--seeds`` seeds on the exact
  stage's capacities: the largest error in hit-ratio points, over all rows and
  over the rows the sample estimates (those above the exactly-counted small
  capacities), its time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from pipeline import TTLS, _calibration_s, _TreePeak, run_stage  # noqa: E402

KEY = ("block", "ttl_s", "replicas", "capacity_blocks")


def _grid(args: dict, capacities=("auto",), sample_rate=None, seed=0):
    from replay.analysis.capacity import CapacityGrid

    return CapacityGrid(blocks=tuple(args["blocks"]), capacities=tuple(capacities), ttls=tuple(args["ttls"]),
                        streams=("global",), replicas=tuple(args["replicas"]), routings=("round-robin",),
                        sample_rate=sample_rate, seed=seed)


def stage_capacity(args: dict) -> dict:
    """The grid through ``replay.api.capacity``: ``auto`` capacities exactly, or,
    with ``rate``, the given ``capacities`` sampled."""
    from replay import api

    con = api.open_db(args["db"])
    grid = _grid(args) if args.get("rate") is None else \
        _grid(args, [str(c) for c in args["capacities"]], args["rate"], args["seed"])
    tree = _TreePeak()
    t0 = time.perf_counter()
    df = api.capacity(con, grid, progress=False)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_rss_mb": tree.stop(), "rows": df.to_dicts()}


def stage_naive(args: dict) -> dict:
    """One LRU simulation per (block, replicas, capacity) asked for."""
    import numpy as np

    from replay import api
    from replay.core.prompts import iter_prompts
    from replay.core.simulate import BlockLogBuilder, simulate
    from replay.times import ttl_us

    con = api.open_db(args["db"])
    tree = _TreePeak()
    t0 = time.perf_counter()
    builders = {b: BlockLogBuilder("global", b) for b in args["blocks"]}
    for p in iter_prompts(con):
        for builder in builders.values():
            builder.add(p)
    read_s = time.perf_counter() - t0
    ttls = [ttl_us(t) for t in args["ttls"]]
    rows, sims = [], []
    for b, replicas, c in args["cases"]:
        log = builders[b].log
        t1 = time.perf_counter()
        hit, _ = simulate(log, c, ttls, replicas, np.arange(len(log)) % replicas)
        sims.append(time.perf_counter() - t1)
        for ti, t in enumerate(args["ttls"]):
            rows.append({"block": b, "ttl_s": None if t == math.inf else float(t), "replicas": replicas,
                         "capacity_blocks": c, "hit_tokens": int(hit[ti].sum())})
    return {"read_s": read_s, "simulation_s": sims, "peak_rss_mb": tree.stop(), "rows": rows}


def _sub(stage: str, **kw) -> dict:
    return run_stage(__file__, stage, **kw)


def _keyed(rows) -> dict:
    return {tuple(r[k] for k in KEY): r for r in rows}


def _naive_cases(exact_rows, blocks, replicas, k: int) -> list:
    """``k`` capacities per (block, replicas), spread over the grid (log-spaced)."""
    cases = []
    for b in blocks:
        caps = sorted({r["capacity_blocks"] for r in exact_rows if r["block"] == b})
        picks = sorted({caps[round(i * (len(caps) - 1) / max(1, k - 1))] for i in range(k)}) if caps else []
        cases += [(b, r, c) for r in replicas for c in picks]
    return cases


def _errors(exact: dict, rows, small_blocks: int) -> dict:
    """The largest |estimate − exact| in hit-ratio points, over every row and
    over the rows above the exactly-counted capacities."""
    every, estimated = 0.0, 0.0
    for key, r in _keyed(rows).items():
        e = exact.get(key)
        if e is None:  # (a capacity of another block size's grid)
            continue
        err = 100 * abs(r["hit_ratio"] - e["hit_ratio"])
        every = max(every, err)
        if r["capacity_blocks"] > small_blocks:
            estimated = max(estimated, err)
    return {"max_error_pts": every, "max_error_estimated_rows_pts": estimated}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="a DuckDB file bench/pipeline.py --keep made (ingested and tokenized)")
    ap.add_argument("--blocks", default="16,512")
    ap.add_argument("--replicas", default="1,4")
    ap.add_argument("--naive-capacities", type=int, default=3, help="capacities simulated per block and replicas")
    ap.add_argument("--sample-rate", type=float, default=0.1)
    ap.add_argument("--seeds", type=int, default=3, help="samples (seeds) of the sampled stage")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--_stage", help=argparse.SUPPRESS)
    ap.add_argument("--_args", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._stage:
        print(json.dumps({"capacity": stage_capacity, "naive": stage_naive}[a._stage](
            json.loads(a._args))))
        return
    if not a.db:
        ap.error("--db is required")
    from replay.core import sampled

    args = {"db": a.db, "blocks": [int(b) for b in a.blocks.split(",")],
            "replicas": [int(r) for r in a.replicas.split(",")], "ttls": list(TTLS) + [math.inf]}
    out = {"calibration_loop_s": _calibration_s()}
    exact = _sub("capacity", **args)
    out["exact"] = {k: exact[k] for k in ("seconds", "peak_rss_mb")}
    finite = _sub("capacity", **dict(args, ttls=list(TTLS)))
    out["exact_preset_ttls"] = {k: finite[k] for k in ("seconds", "peak_rss_mb")}
    # (rows at the capacities both grids have: under a horizon the working set
    # counts a block forgotten and used again twice, so ``auto`` spans a little further)
    keyed, shared = _keyed(exact["rows"]), [(k, r) for k, r in _keyed(finite["rows"]).items()]
    shared = [(k, r) for k, r in shared if k in keyed]
    out["exact_preset_ttls_identical"] = bool(shared) and all(keyed[k] == r for k, r in shared)
    out["exact_preset_ttls_rows_compared"] = len(shared)
    out["rows"] = len(exact["rows"])
    by_key = _keyed(exact["rows"])

    cases = _naive_cases(exact["rows"], args["blocks"], args["replicas"], a.naive_capacities)
    naive = _sub("naive", cases=cases, **args)
    same = all(by_key[tuple(r[k] for k in KEY)]["hit_tokens"] == r["hit_tokens"] for r in naive["rows"])
    per_sim = sum(naive["simulation_s"]) / max(1, len(naive["simulation_s"]))
    grid_sims = len({(r["block"], r["replicas"], r["capacity_blocks"]) for r in exact["rows"]})
    estimated = naive["read_s"] + per_sim * grid_sims
    out["naive"] = {"read_s": naive["read_s"], "simulations": len(cases), "mean_simulation_s": per_sim,
                    "peak_rss_mb": naive["peak_rss_mb"], "grid_simulations": grid_sims,
                    "naive_grid_s_estimated": estimated}
    out["naive_results_identical"] = same
    out["speedup_vs_naive"] = estimated / exact["seconds"]

    caps = sorted({r["capacity_blocks"] for r in exact["rows"]})
    small = math.ceil(sampled.EXACT_SAMPLED_BLOCKS / a.sample_rate)
    runs = []
    for seed in range(a.seeds):
        s = _sub("capacity", capacities=caps, rate=a.sample_rate, seed=seed, **args)
        runs.append({"seed": seed, "seconds": s["seconds"], "peak_rss_mb": s["peak_rss_mb"],
                     **_errors(by_key, s["rows"], small)})
    out["sampled"] = {"rate": a.sample_rate, "exact_below_blocks": small, "runs": runs,
                      "max_error_pts": max(r["max_error_pts"] for r in runs)}
    print(json.dumps(out, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
