"""Benchmark: the replay on Ray with 1 and 2 workers, against this process.

    python bench/distributed.py --db /tmp/day/replay.duckdb --json   # a database bench/pipeline.py kept
    python bench/distributed.py --logs /tmp/day/logs --json          # ingest: each file parsed by a task

The database is one ``bench/pipeline.py --keep`` made (ingested and
tokenized). Each engine runs in a fresh process on its own copy of it and
recomputes the walks of the four stream modes (``replay_stage``, the stage
``prepare`` runs when they are stale) at ``--horizon`` (default the preset's
largest TTL, 2 h; ``inf`` for a cache that never forgets):

* **local**: this process, one pass (the default engine);
* **ray-N**: ``--engine ray`` on a local cluster of N CPUs, started before the
  clock starts (``ray_start_s`` is reported beside it), the engine's
  partitions (2 per CPU, plus global's shallow task) streamed to one walker
  actor per CPU.

For each: the replay's wall time, the driver's peak RSS, and every Ray worker
process's peak RSS (sampled every 50 ms from /proc: workers are the raylet's
children, not the driver's), and a digest of the ``walks`` table
(``rows_identical``: every engine's rows equal the local pass's).

With ``--logs DIR`` the stages timed are ingest and tokenize instead
(``api.ingest`` into a fresh database with the default tokenizer, as ``replay
run`` does — on Ray each file parsed, and its new body parts rendered and
encoded, by a task — then ``api.tokenize``): ``replay_s`` is then their
sum, ``ingest_s`` and ``tokenize_s`` each, and the digest covers
``requests``, ``rejects``, ``blobs``, ``segments`` and ``prompts``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from pipeline import _calibration_s, _peak_rss_mb, run_stage  # noqa: E402


class _WorkerPeaks:
    """Peak RSS of every Ray worker process (``ray::`` in its title), by pid."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        self.peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for proc in self._psutil.process_iter(["pid", "name", "cmdline", "memory_info"]):
                try:
                    title = " ".join(proc.info["cmdline"] or []) or proc.info["name"] or ""
                    if title.startswith("ray::") and proc.info["memory_info"] is not None:
                        mb = proc.info["memory_info"].rss / 2**20
                        self.peaks[proc.info["pid"]] = max(self.peaks.get(proc.info["pid"], 0.0), mb)
                except (self._psutil.Error, TypeError):
                    pass
            self._stop.wait(0.05)

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def _digest(con) -> str:
    """A digest of every walk row, in a fixed order."""
    h = hashlib.sha256()
    rel = con.execute("SELECT * FROM walks ORDER BY variant, mode, request_id")
    while True:
        rows = rel.fetchmany(50_000)
        if not rows:
            break
        h.update(repr(rows).encode())
    return h.hexdigest()


def stage_replay(args: dict) -> dict:
    from replay import api
    from replay.core.replay import replay_stage
    from replay.core.streams import MODES
    from replay.times import INF_US

    con = api.open_db(args["db"])
    horizon_us = INF_US if args["horizon_s"] is None else int(args["horizon_s"] * 1_000_000)
    engine, start_s, peaks = None, 0.0, None
    if args["workers"]:
        from replay.distributed.ray_engine import RayEngine

        t = time.perf_counter()
        engine = RayEngine(num_cpus=args["workers"])
        engine.start()
        start_s = time.perf_counter() - t
        peaks = _WorkerPeaks()
    t0 = time.perf_counter()
    summary = replay_stage(con, MODES, ("prompt",), horizon_us, engine=engine)
    wall = time.perf_counter() - t0
    workers = sorted(peaks.stop().values(), reverse=True) if peaks is not None else []
    if engine is not None:
        engine.close()
    out = {"replay_s": round(wall, 3), "ray_start_s": round(start_s, 2), "requests": summary.requests,
           "peak_rss_driver_mb": round(_peak_rss_mb(), 1),
           "peak_rss_workers_mb": [round(w, 1) for w in workers], "digest": _digest(con)}
    con.close()
    return out


def stage_ingest(args: dict) -> dict:
    from replay import api

    con = api.open_db(args["db"])
    engine, start_s, peaks = None, 0.0, None
    if args["workers"]:
        from replay.distributed.ray_engine import RayEngine

        t = time.perf_counter()
        engine = RayEngine(num_cpus=args["workers"], prepare_parts=args.get("prepare_parts") or None)
        engine.start()
        start_s = time.perf_counter() - t
        peaks = _WorkerPeaks()
    tok = api.load_tokenizer(None)  # (as `replay run` does: its encoder process loads beside ingest)
    t0 = time.perf_counter()
    summary = api.ingest(con, [args["logs"]], engine=engine or "local", tokenizer=tok)
    t1 = time.perf_counter()
    api.tokenize(con, tok)
    wall = time.perf_counter() - t0
    tok.close()
    workers = sorted(peaks.stop().values(), reverse=True) if peaks is not None else []
    if engine is not None:
        engine.close()
    digest = hashlib.sha256()
    for t in ("requests", "rejects", "blobs", "segments", "prompts"):
        digest.update(repr(con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()).encode())
    out = {"replay_s": round(wall, 3), "ingest_s": round(t1 - t0, 3), "tokenize_s": round(wall - (t1 - t0), 3),
           "ray_start_s": round(start_s, 2), "requests": summary.loaded,
           "peak_rss_driver_mb": round(_peak_rss_mb(), 1),
           "peak_rss_workers_mb": [round(w, 1) for w in workers], "digest": digest.hexdigest()[:16]}
    con.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="a tokenized database (bench/pipeline.py --keep)")
    ap.add_argument("--logs", help="time ingest of these logs instead (a fresh database per run)")
    ap.add_argument("--prepare-parts", action="store_true",
                    help="with --logs: the tasks also render and encode their files' body parts (default: only "
                         "on a cluster larger than this machine)")
    ap.add_argument("--horizon", default="7200", help="seconds, or inf (default 7200: the preset's largest TTL)")
    ap.add_argument("--workers", default="1,2", help="Ray cluster sizes to run (default 1,2)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each engine, alternating (medians reported)")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--_stage", help=argparse.SUPPRESS)
    ap.add_argument("--_args", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._stage:
        print(json.dumps({"replay": stage_replay, "ingest": stage_ingest}[a._stage](json.loads(a._args))))
        return 0
    if not a.db and not a.logs:
        ap.error("--db (the replay) or --logs (ingest) is required")
    horizon_s = None if a.horizon in ("inf", "∞") else float(a.horizon)
    engines = [0] + [int(w) for w in a.workers.split(",") if w]
    runs: dict[int, list[dict]] = {w: [] for w in engines}
    out = {"db": a.db, "logs": a.logs, "horizon_s": horizon_s, "calibration_loop_s": round(_calibration_s(), 3)}
    with tempfile.TemporaryDirectory(prefix="replay-dist-") as tmp:
        for _ in range(a.repeat):
            for w in engines:
                copy = Path(tmp) / f"w{w}.duckdb"
                if a.logs:
                    runs[w].append(run_stage(__file__, "ingest", db=str(copy), logs=a.logs, workers=w,
                                             prepare_parts=a.prepare_parts))
                else:
                    shutil.copy(a.db, copy)
                    runs[w].append(run_stage(__file__, "replay", db=str(copy), horizon_s=horizon_s, workers=w))
                copy.unlink()
                if not a.json:
                    print(f"{'local' if w == 0 else f'ray-{w}'}: {runs[w][-1]['replay_s']} s", file=sys.stderr)
    digest = runs[0][0]["digest"]
    for w, rs in runs.items():
        name = "local" if w == 0 else f"ray-{w}"
        walls = sorted(r["replay_s"] for r in rs)
        out[name] = {"replay_s_median": walls[len(walls) // 2], "replay_s": [r["replay_s"] for r in rs],
                     "ray_start_s": rs[0]["ray_start_s"], "requests": rs[0]["requests"],
                     "peak_rss_driver_mb": max(r["peak_rss_driver_mb"] for r in rs),
                     "peak_rss_workers_mb": max((r["peak_rss_workers_mb"] for r in rs), key=lambda x: x[:1]),
                     "rows_identical": all(r["digest"] == digest for r in rs)}
        for k in ("ingest_s", "tokenize_s"):
            if k in rs[0]:
                out[name][k] = sorted(r[k] for r in rs)[len(rs) // 2]
    for w in engines[1:]:
        out[f"ray-{w}"]["ratio_vs_local"] = round(out[f"ray-{w}"]["replay_s_median"] / out["local"]["replay_s_median"], 3)
    if len(engines) > 2:
        out["speedup_2_vs_1"] = round(out["ray-1"]["replay_s_median"] / out[f"ray-{engines[2]}"]["replay_s_median"], 3) \
            if 1 in engines else None
    print(json.dumps(out, indent=None if a.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
