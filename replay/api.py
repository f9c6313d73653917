"""The Python API over the stages — what the CLI and the notebooks both call.

    import replay.api as rp
    con = rp.open_db("data/replay.duckdb")
    rp.ingest(con, ["data/sample"])
    df = rp.sweep(con)                      # tokenize → replay as needed, then sweep

Each stage leaves its tables in DuckDB; ``prepare`` decides what is current, so
re-running a job neither repeats work nor double-counts.
"""

from __future__ import annotations

import functools
import os
from contextlib import nullcontext as _nullcontext

import polars as pl

from replay.analysis.buy import COST_KEYS, CostModel  # noqa: F401
from replay.analysis.capacity import CapacityGrid, capacity  # noqa: F401
from replay.core.tiers import parse_tiers  # noqa: F401
from replay.providers.gpus import get_gpu, known_gpus  # noqa: F401
from replay.providers.prefill_cost import CONFIGS as _COST_CONFIGS, compute_for  # noqa: F401
from replay.analysis.duplicates import duplicates_section, exact_duplicates  # noqa: F401
from replay.analysis.export import TARGETS as EXPORT_TARGETS, TEXT_TARGETS as EXPORT_TEXT_TARGETS  # noqa: F401
from replay.analysis.export import ExportRefused, ExportSummary, TextRefused, export as export_trace  # noqa: F401
from replay.analysis.near import MODEL_NAME as NEAR_MODEL, THRESHOLDS as NEAR_THRESHOLDS  # noqa: F401
from replay.analysis.near import WARNING as NEAR_WARNING, SemanticMissing, near_duplicates  # noqa: F401
from replay.analysis.labels import audit_sample, candidate_pairs, read_labels, store_labels  # noqa: F401
from replay.analysis.labels import near_rates, stratified_sample, summarize as summarize_labels, write_export  # noqa: F401
from replay.analysis.memory import memory_figures, memory_section, plot_memory  # noqa: F401
from replay.analysis.what_to_buy import buy_figures, buy_section  # noqa: F401
from replay.analysis.diagnose import diagnose, diff_view, format_text, miss_parts, why_miss_section  # noqa: F401
from replay.analysis.overview import idle_gaps, overview  # noqa: F401
from replay.analysis.origin import origin_figures, origin_section, routable_shares  # noqa: F401
from replay.analysis.prefixes import BY as PREFIX_RANKINGS, prefixes_section, top_prefixes  # noqa: F401
from replay.analysis.report import write_report  # noqa: F401
from replay.analysis.show import RequestNotFound, TextRefused as ShowTextRefused, show_request  # noqa: F401
from replay.analysis.trend import DEFAULT_THRESHOLD as TREND_THRESHOLD, format_text as format_trend  # noqa: F401
from replay.analysis.trend import trend, trend_section, weekly_ceilings  # noqa: F401
from replay.analysis.whatif import FIXES, format_whatif, whatif  # noqa: F401
from replay.core.grid import DEFAULT_BLOCKS, DEFAULT_MIN_PREFIXES, DEFAULT_STREAMS, DEFAULT_TTLS, Grid  # noqa: F401
from replay.core.streams import MODES  # noqa: F401
from replay.core.sweep import sweep as _sweep
from replay import distributed
from replay.distributed import (ENGINES, DistributedIngestFailed, DistributedReplayFailed,  # noqa: F401
                                EngineUnavailable, WorkerFailed)
from replay.distributed import engine_context as replay_engine
from replay.times import format_ttl, parse_ttl  # noqa: F401
from replay.core.warmup import describe as describe_warmup, parse_warmup  # noqa: F401
from replay.prepare import as_tokenizer, prepare
from replay.providers import profiles as _profiles
from replay.providers.catalog import get_profile, list_profiles  # noqa: F401
from replay.providers.kv import MODELS as KV_MODELS, kv_bytes_per_token  # noqa: F401
from replay.providers.economics import get_price, logged_price_model  # noqa: F401
from replay.providers.auto import AUTO, describe as describe_auto  # noqa: F401
from replay.providers.catalog import model_family  # noqa: F401
from replay.providers.model_savings import auto_frame, model_savings, savings_section  # noqa: F401
from replay.readers.files import InputUnreachable  # noqa: F401
from replay.providers.realised import JSON_KEYS as REALISED_KEYS, judged as realised_requests  # noqa: F401
from replay.providers.realised import realised  # noqa: F401
from replay.analysis.realised import realised_section, session_frame as realised_sessions  # noqa: F401
from replay.readers.formats import FORMATS, TIME_UNITS  # noqa: F401
from replay.readers.ingest import IngestSummary, summary_text  # noqa: F401
from replay.readers.ingest import ingest as _ingest
from replay.readers.parsed import parse_unit as _parse_unit
from replay.store import db
from replay.store.db import DEFAULT_DB  # noqa: F401
from replay.synth.generator import generate as synth  # noqa: F401
from replay.text.renderers import RENDERS, TEMPLATE  # noqa: F401
from replay.text.tok import load_tokenizer, tokenizer_spec  # noqa: F401
from replay.text.tokenize import tokenize_stage
from replay.validate.check import store_result, summary_lines, validate, validation_section  # noqa: F401

__all__ = ["open_db", "remove_db", "ingest", "load_tokenizer", "tokenize", "prepare", "sweep", "profile_sweep",
           "replay_engine", "idle_gaps", "overview", "diagnose", "miss_parts", "diff_view", "whatif",
           "write_report",
           "list_profiles", "get_profile", "requests_count", "capacity", "CapacityGrid", "kv_bytes_per_token",
           "CostModel", "COST_KEYS", "COST_MODELS", "parse_tiers", "get_gpu", "known_gpus", "compute_for", "cost_model",
           "memory_figures", "memory_section", "plot_memory", "buy_figures", "buy_section", "exact_duplicates", "duplicates_section",
           "near_duplicates", "trend", "trend_section", "top_prefixes", "prefixes_section",
           "origin_section", "show_request", "Grid", "format_ttl", "parse_ttl"]

COST_MODELS = tuple(_COST_CONFIGS)  # the models the prefill cost model knows by name
open_db = db.connect
remove_db = db.remove


def ingest(con, paths, format=None, fields=None, time_unit=None, progress=False, tokenizer=None,
           engine=None, address=None, workers=None):
    """Load logs; with ``tokenizer`` (a ``Tok``) its encoder process is handed the
    new content as it is found, to encode ahead for the tokenize stage.
    ``engine``: where the files are parsed — ``"local"`` (here), ``"ray"`` (a
    task per file or byte range of a large file, written here in the same order:
    the same rows and ids), or None: the enclosing :func:`replay_engine`'s (a
    local engine's ``workers`` parse here as ``workers`` would).
    ``workers``: with no engine elsewhere, parse on that many local worker
    processes (``replay.distributed.file_pool``; None or 1: in this process,
    and a log too small to pay their start is parsed here too)."""
    with distributed.using(engine, address) as eng:
        if getattr(eng, "name", None) == "local":  # (this machine's workers parse, as they replay)
            workers, eng = (eng.workers if workers is None else workers), None
        return _ingest_on(eng, workers, con, paths, format, fields, time_unit, progress, tokenizer)


def _ingest_on(eng, workers, con, paths, format, fields, time_unit, progress, tokenizer):
    from replay.distributed.file_pool import local_pool

    # (this machine's workers when they are asked for and no other engine parses;
    # they start only once there is work worth them)
    with local_pool(None if eng is not None else workers) as pool:
        eng = eng if pool is None else pool
        parse, prepared = _parse_unit, None
        if (eng is not None and tokenizer is not None and tokenizer.render == "neutral"
                and getattr(eng, "prepares_parts", lambda: False)()):
            # (each task also renders and encodes its file's new body parts, with the reference)
            from replay.distributed.files import parse_and_prepare

            parse = functools.partial(parse_and_prepare, tokenizer_json=str(tokenizer.path))
            prepared = tokenizer.add_prepared
        return _ingest(con, list(paths) if not isinstance(paths, (str, os.PathLike)) else [paths], format=format,
                       fields=fields, time_unit=time_unit, progress=progress,
                       warm=tokenizer.warm if tokenizer is not None else None, engine=eng, parse=parse,
                       warm_requests=tokenizer.warm_requests if tokenizer is not None
                       and tokenizer.render == TEMPLATE else None,
                       prepared=prepared, workers=workers if pool is not None else None)


def tokenize(con, tokenizer=None, progress=False):
    """Render and tokenize pending requests; ``tokenizer``: a ``Tok``, a path or None."""
    return tokenize_stage(con, as_tokenizer(tokenizer), progress=progress)


def sweep(con, grid: Grid | None = None, by_stream=False, tokenizer=None, progress=False,
          engine=None, address=None) -> pl.DataFrame:
    """The ideal-contract sweep over ``grid``, preparing its walks first (on
    ``engine``: ``"local"``, ``"ray"`` with an optional cluster ``address``, or
    None — the enclosing :func:`replay_engine`'s)."""
    grid = grid or Grid()
    prepare(con, modes=grid.streams, horizon_us=grid.horizon_us, tokenizer=tokenizer, progress=progress,
            engine=engine, address=address)
    return _sweep(con, grid, by_stream=by_stream)


def profile_sweep(con, profiles, grid: Grid | None = None, by_stream=False, tokenizer=None,
                  progress=False, engine=None, address=None) -> pl.DataFrame:
    """Sweep under provider/engine profiles (``replay.providers.profiles``), with realised usage columns."""
    grid = grid or Grid()
    with replay_engine(engine, address) if engine is not None else _nullcontext():
        return _profiles.profile_sweep(con, list(profiles), grid, by_stream=by_stream, tokenizer=tokenizer,
                                       progress=progress)


def requests_count(con) -> int:
    """How many requests the database holds."""
    return con.execute("SELECT count(*) FROM requests").fetchone()[0]


def cost_model(model=None, model_config=None, kv_bytes_per_token=None, gpu=None, gpu_tflops=None, gpu_hbm=None,
               gpu_host_link=None, price=None, utilisation=0.5, target=0.7) -> CostModel | None:
    """The prefill cost model of a model on a GPU (``replay.analysis.buy``), or None
    unless both a model (name or config.json) and a GPU (name or figures) are given."""
    g = get_gpu(gpu, gpu_tflops, gpu_hbm, gpu_host_link)
    m = compute_for(model, model_config, kv_bytes_per_token) if (model or model_config) and g else None
    if g is None or m is None:
        return None
    return CostModel(m, g, utilisation, target, price)
