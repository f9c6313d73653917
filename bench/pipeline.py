"""Benchmark: the real pipeline on agent-like traffic, against two baselines.

    python bench/pipeline.py --requests 3000 --json     # one JSON object
    python bench/pipeline.py --week --json              # ≈200,000 requests over 7 days
    python bench/pipeline.py --scaling --json           # same rate over 1× and 4× the duration

Traffic comes from the sample generator (``replay.synth.generator.generate``) with long
coding-agent sessions (``--turns``, median model calls per main session) and a
small chat app (``--chat-share``), one generator call per day (seed + day), so a
longer duration at the same rate is simply more days. Generation runs in its own
process before anything is measured; the pipeline and the baselines each run in
a fresh process too, so each ``peak_rss`` is that stage's own (the pipeline's
includes its encoder process: see ``peak_rss_encoder_mb``).

The pipeline is the package's real stages (ingest → tokenize → replay → sweep)
on a DuckDB file, with a grid of 6 finite TTLs × 5 block sizes × 2 minimum
prefixes × 4 stream modes = 240 configurations; the replay horizon is the largest
TTL, so trie state older than that is pruned. The baselines (``naive.py``) walk
every block of every prompt through a plain dict: the naive one after
tokenizing every full prompt, the unique one after the pipeline's own
tokenize stage (unique content once). ``speedup_vs_naive`` over
``speedup_vs_unique`` is what tokenizing unique content is worth;
``speedup_vs_unique`` what the trie and the one-pass sweep are worth. Both
sweeps must equal the pipeline's (``naive_results_identical``,
``unique_results_identical``).

``--chat-template PATH`` renders the bodies with that chat template in the
pipeline (as ``replay … --chat-template PATH`` does: ``api.tokenizer_spec``);
the baselines render neutrally, so it runs with ``--no-naive`` only (the
default when it is given).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

TTLS = (60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
BLOCKS = (1, 16, 64, 128, 512)
MIN_PREFIXES = (0, 1024)
STREAMS = ("tenant", "key", "session", "global")
WEEK_REQUESTS = 200_000
WEEK_RATE = WEEK_REQUESTS / 7.0  # requests per day of the --week preset
START = datetime(2026, 11, 16, tzinfo=timezone.utc)  # a Monday


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _helper_peak_rss_mb() -> float:
    """Largest peak RSS of this process's finished helpers (the encoder process)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def _children_cpu_s() -> float:
    """CPU seconds of the finished child processes (the encoder process, once closed)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _own_mb(pid: int) -> float:
    """A process's proportional share of memory (PSS: a page shared by k processes
    — the replay workers' memory-mapped segments — counts 1/k in each), else its RSS."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            return int(fh.read().split("Pss:")[1].split()[0]) / 1024.0
    except (OSError, IndexError, ValueError):
        with open(f"/proc/{pid}/status") as fh:
            return int(fh.read().split("VmRSS:")[1].split()[0]) / 1024.0


def _tree_rss_mb(pid: int) -> float:
    """Memory of a process and its descendants (each one's PSS), from /proc (Linux), in MB."""
    total = 0.0
    try:
        total += _own_mb(pid)
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                total += sum(_tree_rss_mb(int(c)) for c in fh.read().split())
    except (OSError, IndexError, ValueError):
        pass
    return total


class _TreePeak:
    """Samples this process tree's RSS every 20 ms: the memory the job really held
    at once, helpers included (the sum of each process's own peak overstates it)."""

    def __init__(self):
        import threading

        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss_mb(os.getpid()))
            self._stop.wait(0.25)  # (reading PSS walks each process's page tables: not too often)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _peak_rss_mb())


# ------------------------------------------------------------------ stages (each in its own process)

def stage_generate(out: str, requests: int, days: float, seed: int, turns: float,
                   chat_share: float) -> dict:
    """Write ~``requests`` over ``days`` days (one generator call per day) into ``out``."""
    from replay.synth.generator import generate

    t0 = time.perf_counter()
    n_days = max(1, math.ceil(days - 1e-9))
    per_day = requests / days
    # calibrate: requests of one day at scale 1 (deterministic)
    probe = generate(Path(out) / "_probe", seed=seed, scale=1.0, days=1, turns=turns,
                     chat_share=chat_share).requests
    shutil.rmtree(Path(out) / "_probe")
    total = 0
    nbytes = 0
    for d in range(n_days):
        frac = min(1.0, days - d)
        scale = per_day * frac / probe
        res = generate(Path(out) / f"day{d:03d}", seed=seed * 1000 + d, scale=scale,
                       start=(START + timedelta(days=d)).isoformat(), hours=24.0 * frac,
                       turns=turns, chat_share=chat_share)
        (Path(out) / f"day{d:03d}" / "_truth.jsonl").unlink()
        total += res.requests
        nbytes += sum(p.stat().st_size for p in res.files.values())
    return {"requests": total, "log_bytes": nbytes, "days": days, "seconds": time.perf_counter() - t0}


def _grid(ttls=TTLS):
    from replay.core.grid import Grid

    return Grid(ttls=tuple(ttls), blocks=BLOCKS, min_prefixes=MIN_PREFIXES, streams=STREAMS)


def stage_pipeline(logs: str, dbfile: str, ttls=TTLS, chat_template: str | None = None, workers: int = 1) -> dict:
    """The real stages through the package API, timed one by one: ingest, then the
    one ``prepare`` (tokenize and replay; what is left of its time is the wait for
    the encoder's checks), then the sweep. ``workers`` > 1: the replay's engine is
    ``replay.distributed.make("local", workers=workers)``, made first (its fork
    server starts while ingest runs)."""
    import replay.readers.ingest
    from replay import api, distributed
    from replay.core.sweep import sweep

    grid = _grid(ttls)
    engine = distributed.make("local", workers=workers)
    con = api.open_db(dbfile)
    before = replay.readers.ingest.DEFAULT_BODY_BLOBS
    replay.readers.ingest.DEFAULT_BODY_BLOBS = True  # content-addressed bodies (see bench/README.md)
    try:
        tree = _TreePeak()
        t0, c0 = time.perf_counter(), time.process_time()
        # (the tokenizer spec as the CLI's --chat-template makes it; without one: the default, neutral)
        tokenizer = api.load_tokenizer(api.tokenizer_spec(None, None, chat_template))  # its encoder process loads and works while ingest runs, as in `replay run`
        k0 = _children_cpu_s()
        ing = api.ingest(con, [logs], tokenizer=tokenizer, workers=workers)
        t1, c1 = time.perf_counter(), time.process_time()
        ingest_workers_cpu = _children_cpu_s() - k0  # (the pool's processes, ended with ingest; not the encoder)
    finally:
        replay.readers.ingest.DEFAULT_BODY_BLOBS = before
    peak = {"ingest": _peak_rss_mb()}  # max RSS so far: which stage sets the peak
    done = api.prepare(con, modes=STREAMS, horizon_us=grid.horizon_us, tokenizer=tokenizer, engine=engine)
    c3 = time.process_time()
    workers_peak = _workers_peak_mb(engine)
    if engine is not None:
        engine.close()  # (its fork server: the workers ended with the replay)
    tok, rep = done["tokenize"], done["replay"]
    peak["replay"] = _peak_rss_mb()
    own = time.perf_counter()  # the bench's own look at the encoder process: not counted
    encoder_used = tokenizer.encoder_name()
    own = time.perf_counter() - own
    tokenizer.close()
    helper_peak = _helper_peak_rss_mb()  # (once it has ended)
    t3c = time.perf_counter()
    df = sweep(con, grid)
    t4, c4 = time.perf_counter(), time.process_time()
    peak["sweep"] = _peak_rss_mb()
    ov = api.overview(con)
    t5 = time.perf_counter()
    con.close()  # writes what is still only in DuckDB's write-ahead log
    close_s = time.perf_counter() - t5
    tree_peak = tree.stop()
    rows = df.select(["stream", "ttl_s", "block", "min_prefix", "requests", "prompt_tokens",
                      "hit_tokens", "requests_hit"]).to_dicts()
    return {
        "requests": ing.loaded, "rejected": ing.rejected,
        "logical_prompt_tokens": ov["logical_prompt_tokens"],
        "unique_content_tokens": ov["unique_content_tokens"],
        "unique_segments": ov["unique_segments"],
        "ingest_s": t1 - t0, "tokenize_s": tok.seconds, "replay_s": rep.seconds,
        # what prepare spent beside its stages (waiting for the encoder's checks) and closing the encoder
        "check_s": (t3c - t1 - own) - tok.seconds - rep.seconds, "sweep_s": t4 - t3c, "close_s": close_s,
        # CPU seconds of this process (all its threads) per stage, and of the
        # encoder process in all: on two cores, the sum over wall time says how
        # much of the second core was used
        "cpu_seconds": {"ingest": c1 - c0, "ingest_workers": ingest_workers_cpu, "prepare": c3 - c1,
                        # (the replay's workers are the fork server's children, reaped with it: not the encoder)
                        "sweep": c4 - c3,
                        "encoder": _children_cpu_s() - ingest_workers_cpu - (workers_cpu_s(engine) or 0.0),
                        "replay_workers": workers_cpu_s(engine)},
        "workers": workers, "peak_rss_replay_workers_mb": workers_peak,
        "encoder": encoder_used, "tokenizer": tokenizer.name, "pipeline_s": t4 - t0 - own + close_s,
        "configs": grid.size, "trie_nodes": rep.trie_nodes,
        "db_mb": os.path.getsize(dbfile) / 1e6,
        # the encoder process runs beside ingest and tokenize: peak_rss_mb is what
        # the two held at once (sampled); each one's own peak beside it
        "peak_rss_mb": tree_peak, "peak_rss_main_mb": _peak_rss_mb(),
        "peak_rss_encoder_mb": helper_peak, "peak_rss_after_stage_mb": peak, "rows": rows,
    }


def workers_cpu_s(engine) -> float | None:
    """CPU seconds of the replay's worker processes (children of the fork server,
    not of this process: each reported its own)."""
    return None if engine is None else sum(engine.worker_stats.get("cpu_s", []))


def _workers_peak_mb(engine) -> list | None:
    return None if engine is None else engine.worker_stats.get("peak_rss_mb")


def stage_naive(logs: str, ttls=TTLS) -> dict:
    import naive

    res = naive.run([logs], ttls, BLOCKS, MIN_PREFIXES, STREAMS)
    res["peak_rss_mb"] = _peak_rss_mb()
    return res


def stage_unique(logs: str, dbfile: str, ttls=TTLS) -> dict:
    import naive

    res = naive.run_unique([logs], dbfile, ttls, BLOCKS, MIN_PREFIXES, STREAMS)
    res["peak_rss_mb"] = _peak_rss_mb()
    return res


def _sub(stage: str, **kw) -> dict:
    """Run one stage in a fresh interpreter; return its JSON result."""
    return run_stage(__file__, stage, **kw)


def run_stage(script: str, stage: str, **kw) -> dict:
    """Run ``script --_stage STAGE --_args JSON`` in a fresh interpreter; return
    the JSON its last line prints (the benches' way of measuring a stage alone)."""
    cmd = [sys.executable, str(Path(script).resolve()), "--_stage", stage, "--_args", json.dumps(kw)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"stage {stage} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ comparisons

def _key(r):
    return (r["stream"], math.inf if r["ttl_s"] is None else r["ttl_s"], r["block"], r["min_prefix"])


def same_results(a: list[dict], b: list[dict]) -> bool:
    cols = ("requests", "prompt_tokens", "hit_tokens", "requests_hit")
    da = {_key(r): tuple(int(r[c]) for c in cols) for r in a}
    db_ = {_key(r): tuple(int(r[c]) for c in cols) for r in b}
    return da == db_


def _calibration_s() -> float:
    """Seconds of a fixed pure-Python loop just before the run: this shared machine's
    speed drifts by up to a half from one minute to the next, so figures from
    different runs compare only alongside it (bench/README.md)."""
    t = time.perf_counter()
    s = 0
    for i in range(5_000_000):
        s += i
    return time.perf_counter() - t


def one_run(requests: int, days: float, seed: int, turns: float, chat_share: float,
            naive: bool, workdir: Path, keep: bool, unique: bool | None = None,
            chat_template: str | None = None, workers: int = 1) -> dict:
    """One generated log through the pipeline and, when asked, the two baselines
    (``unique`` defaults to ``naive``; neither with ``chat_template``: they render neutrally)."""
    unique = naive if unique is None else unique
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    dbfile = workdir / "replay.duckdb"
    if dbfile.exists():
        dbfile.unlink()
    gen = None
    if not (logs.exists() and keep):
        if logs.exists():
            shutil.rmtree(logs)
        gen = _sub("generate", out=str(logs), requests=requests, days=days, seed=seed, turns=turns,
                   chat_share=chat_share)
    calibration = _calibration_s()
    if chat_template is not None and (naive or unique):
        raise ValueError("the baselines render neutrally: --chat-template needs --no-naive")
    pipe = _sub("pipeline", logs=str(logs), dbfile=str(dbfile), chat_template=chat_template, workers=workers)
    out = {k: v for k, v in pipe.items() if k != "rows"}
    out["calibration_loop_s"] = calibration
    out["chat_template"] = chat_template
    total = pipe["pipeline_s"]
    out["logical_tokens_per_s"] = pipe["logical_prompt_tokens"] / total if total > 0 else None
    out["sweep_share_of_replay"] = pipe["sweep_s"] / pipe["replay_s"] if pipe["replay_s"] > 0 else None
    out["days"] = days
    out["traffic"] = {"turns": turns, "chat_share": chat_share, "seed": seed}
    if gen is not None:
        out["log_bytes"] = gen["log_bytes"]
        out["generate_s"] = gen["seconds"]
    out["log_bytes"] = out.get("log_bytes") or sum(p.stat().st_size for p in logs.rglob("*") if p.is_file())
    out["cost_model"] = cost_model(pipe, out["log_bytes"])
    if workers > 1:  # the same log in one process, in the same run
        dbfile.unlink()
        one = _sub("pipeline", logs=str(logs), dbfile=str(dbfile), chat_template=chat_template, workers=1)
        out["one_worker"] = {k: one[k] for k in ("pipeline_s", "ingest_s", "tokenize_s", "replay_s",
                                                  "peak_rss_mb", "cpu_seconds")}
        out["speedup_vs_one_worker"] = one["pipeline_s"] / total
        out["rows_identical_to_one_worker"] = same_results(pipe["rows"], one["rows"])
    for name, run, enabled in (("naive", {"logs": str(logs)}, naive),
                               ("unique", {"logs": str(logs), "dbfile": str(workdir / "unique.duckdb")}, unique)):
        if not enabled:
            out[f"{name}_s"] = out[f"speedup_vs_{name}"] = out[f"{name}_results_identical"] = None
            continue
        nv = _sub(name, **run)
        out[f"{name}_s"] = nv["seconds"]["total"]
        out[f"{name}_stages_s"] = nv["seconds"]
        out[f"{name}_peak_rss_mb"] = nv["peak_rss_mb"]
        out[f"speedup_vs_{name}"] = nv["seconds"]["total"] / total
        out[f"{name}_results_identical"] = (same_results(pipe["rows"], nv["rows"])
                                            and nv["logical_prompt_tokens"] == pipe["logical_prompt_tokens"])
    # (the first baseline's flag under its historical name)
    out["results_identical"] = out["naive_results_identical"]
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


NODES = (8, 32, 128)  # two-core nodes of the 100×-week estimate


def cost_model(pipe: dict, log_bytes: int, scale: int = 100, cores: int = 2) -> dict:
    """What this run cost the driver (this process: ingest's placing and writing, the
    tokenize stage's assembly, the replay's export and inserts, the sweep) and the
    workers (parsing, the encoder process, rendering, the replay's walks), per 1,000
    requests and per GB of logs, and the paper estimate for ``scale``× the log on
    two-core nodes: the driver's CPU stays serial, the workers' divides over every
    core, and the two are added (no overlap counted)."""
    cpu = pipe["cpu_seconds"]
    driver = cpu["ingest"] + cpu["prepare"] + cpu["sweep"]
    workers = cpu.get("ingest_workers", 0.0) + cpu["encoder"] + (cpu.get("replay_workers") or 0.0)
    gb, kreq = log_bytes / 1e9, pipe["requests"] / 1000
    est = {}
    for nodes in NODES:
        d, w = scale * driver, scale * workers / (nodes * cores)
        est[str(nodes)] = {"driver_s": d, "workers_s": w, "wall_h": (d + w) / 3600, "driver_share": d / (d + w)}
    return {"driver_cpu_s": driver, "worker_cpu_s": workers,
            "driver_cpu_s_per_1k_requests": driver / kreq, "driver_cpu_s_per_gb": driver / gb,
            "worker_cpu_s_per_gb": workers / gb, f"estimate_{scale}x_by_nodes": est}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="about this many requests (default 3000)")
    ap.add_argument("--days", type=float, default=None,
                    help="duration in days (default: the --week preset's rate, at least 1 day)")
    ap.add_argument("--week", action="store_true", help=f"preset: ≈{WEEK_REQUESTS:,} requests over 7 days")
    ap.add_argument("--scaling", action="store_true",
                    help="run 1× and 4× the duration at the same rate and report the ratios")
    ap.add_argument("--turns", type=float, default=30.0, help="median model calls per main agent session")
    ap.add_argument("--chat-share", type=float, default=0.2, help="chat-app users, relative to the sample mix")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--naive", dest="naive", action="store_true", default=None,
                    help="run the baselines (default: on, except for --week and --scaling)")
    ap.add_argument("--no-naive", dest="naive", action="store_false")
    ap.add_argument("--workdir", default=None, help="where logs and the DuckDB file go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep (and reuse) the generated logs")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--chat-template", default=None, metavar="PATH",
                    help="render bodies with this chat template (a Jinja file or a model directory, as the "
                         "CLI's --chat-template) in the pipeline; the baselines cannot: needs --no-naive (its default)")
    ap.add_argument("--workers", type=int, default=1, metavar="N",
                    help="processes of this machine for ingest, tokenize and the replay (default 1: one process); "
                         "N > 1 also runs the log in one process, in the same run (speedup_vs_one_worker)")
    ap.add_argument("--_stage", help=argparse.SUPPRESS)
    ap.add_argument("--_args", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a._stage:
        kw = json.loads(a._args)
        fn = {"generate": stage_generate, "pipeline": stage_pipeline, "naive": stage_naive,
              "unique": stage_unique}[a._stage]
        print(json.dumps(fn(**kw)))
        return 0

    requests = WEEK_REQUESTS if a.week else a.requests
    days = a.days if a.days is not None else (7.0 if a.week else max(1.0, round(requests / WEEK_RATE, 3)))
    if a.chat_template is not None:
        if a.naive:
            ap.error("--chat-template: the baselines (bench/naive.py) render neutrally; give --no-naive")
        if not Path(a.chat_template).exists():
            ap.error(f"--chat-template: no such file or directory: {a.chat_template}")
        a.chat_template = str(Path(a.chat_template).resolve())
    naive = a.naive if a.naive is not None else not (a.week or a.scaling or a.chat_template)
    base = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="replay-bench-"))
    if a.scaling:
        r1 = one_run(requests, days, a.seed, a.turns, a.chat_share, naive, base / "x1", a.keep,
                     chat_template=a.chat_template, workers=a.workers)
        r4 = one_run(4 * requests, 4 * days, a.seed, a.turns, a.chat_share, naive, base / "x4", a.keep,
                     chat_template=a.chat_template, workers=a.workers)
        out = {"x1": r1, "x4": r4,
               "requests_ratio": r4["requests"] / r1["requests"],
               "peak_rss_ratio": r4["peak_rss_mb"] / r1["peak_rss_mb"],
               "wall_ratio": r4["pipeline_s"] / r1["pipeline_s"],
               "replay_wall_ratio": r4["replay_s"] / r1["replay_s"]}
    else:
        out = one_run(requests, days, a.seed, a.turns, a.chat_share, naive, base, a.keep,
                      chat_template=a.chat_template, workers=a.workers)
    if not a.keep and not a.workdir:
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
