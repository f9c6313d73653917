"""The pipeline's commands: ingest, tokenize, sweep, run, report, profiles, synth."""

from __future__ import annotations

import json
from pathlib import Path

import click

from replay.cli.lazy import api
from replay.cli.options import (SAMPLE, db_option, grid, grid_options, ingest_options, kv_model, kv_options, load_logs,
                                logs_options, plain_name, print_table, profile_names, tokenizer_option)
from replay.cli.options import cost_options, engine_options, gpu_options, on_engine, warmup_option

@click.command()
@click.argument("logs", nargs=-1, required=True)
@db_option
@ingest_options
@click.option("--json", "as_json", is_flag=True,
              help="Print exactly a JSON object: files, lines, loaded, rejected, skipped_files, by_reason, "
                   "unordered_files (the new files not in time order: path, order).")
@engine_options
def ingest(logs, db_path, fmt, fields, time_unit, tokenizer, as_json, engine, address):
    """Load LOGS (files, globs or directories) into the database.

    Every line is either loaded or set aside in the `rejects` table with its
    reason; re-ingesting a file already loaded does nothing.
    """
    def report(s):
        click.echo(json.dumps({"files": s.files, "lines": s.lines, "loaded": s.loaded, "context": s.context,
                               "rejected": s.rejected,
                               "skipped_files": s.skipped_files, "by_reason": dict(s.rejected_by_reason),
                               "unordered_files": [{"path": p, "order": o} for p, o in s.unordered_files]}))

    with on_engine(engine, address):  # (--engine ray: a task per file, written here in order)
        load_logs(api.open_db(db_path), logs, fmt, fields, time_unit, quiet=as_json,
                  report=report if as_json else None)


def _is_plain(name: str) -> bool:
    try:
        return plain_name(None, None, name) == name
    except click.BadParameter:
        return False


@click.command()
@db_option
@tokenizer_option
def tokenize(db_path, tokenizer):
    """Render and tokenize every loaded request (unique content once)."""
    s = api.tokenize(api.open_db(db_path), tokenizer, progress=True)
    click.echo(f"tokenized {s.new_prompts:,} new prompts: {s.unique_tokens:,} unique tokens "
               f"for {s.logical_tokens:,} logical tokens in {s.seconds:.1f} s"
               + (f"; {s.failed:,} set aside (cannot be rendered)" if s.failed else ""), err=True)


@click.command()
@logs_options
@grid_options
@click.option("--profile", "profiles", multiple=True,
              help="Provider/engine rules to apply (repeat or comma-separate; `replay profiles` lists them). "
                   "`auto`: each model's requests by its own model's profile (rows auto/<profile>). "
                   "Default: ideal, the contract itself.")
@click.option("--by-stream", is_flag=True, help="One row per cache (stream key and model) as well.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly a JSON array of configurations.")
@click.option("--parquet", type=click.Path(dir_okay=False), default=None, help="Also write the rows as Parquet.")
@warmup_option
@engine_options
def sweep(logs, db_path, fmt, fields, time_unit, tokenizer, ttls, blocks, mins, streams, profiles, by_stream,
          as_json, parquet, warmup, engine, address):
    """Hit-rate ceiling for every TTL × block × minimum prefix × stream mode.

    Given LOGS, they are ingested first (into --db); given none, the sweep
    runs on what the database already holds. One replay serves the whole grid.
    """
    g = grid(ttls, blocks, mins, streams, warmup)
    names = profile_names(profiles)
    if names and g.warmup:
        raise click.BadParameter("the warm-up applies to the ideal sweep, not to --profile sweeps",
                                 param_hint="--warmup")
    con = api.open_db(db_path)
    with on_engine(engine, address):
        load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
        if names:
            df = api.profile_sweep(con, names, g, by_stream=by_stream, tokenizer=tokenizer, progress=not as_json)
        else:
            df = api.sweep(con, g, by_stream=by_stream, tokenizer=tokenizer, progress=not as_json)
    if parquet:
        df.write_parquet(parquet)
    if as_json:
        click.echo(json.dumps(df.to_dicts()))
        return
    if g.warmup:
        click.echo(f"measured over {api.describe_warmup(g.warmup)}", err=True)
    print_table(df)


def _price_options(f):
    f = click.option("--prices", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="A TOML price table overriding the shipped defaults "
                          "(replay/providers/prices.toml).")(f)
    f = click.option("--price-model", default=None,
                     help="Price the whole log as this model, judged by its profile (default: each request "
                          "judged by its own model's profile at its own model's price, `--profile auto`).")(f)
    return f


def _html_option(f):
    return click.option("--html", "html", is_flag=True,
                        help="Also write report.html beside report.md: the same report as one self-contained "
                             "page (plots embedded, tables sortable; opens without a network).")(f)


def _extra_sections(g, prices=None, price_model=None, kv=(None, None), tokenizer=None, cost=None):
    """Sections the analyses contribute to the report (``kv``: what ``kv_model`` returns;
    ``cost``: the prefill cost model, None without --gpu)."""
    return [lambda con, out: api.why_miss_section(con, out, tokenizer=tokenizer),
            lambda con, out: api.origin_section(con, out, g),
            lambda con, out: api.memory_section(con, out, g, kv[0], kv[1], tokenizer=tokenizer),
            lambda con, out: api.buy_section(con, out, g, cost, tokenizer=tokenizer),
            lambda con, out: api.duplicates_section(con, out, tokenizer=tokenizer),
            lambda con, out: api.validation_section(con, out),
            lambda con, out: api.realised_section(con, out, tokenizer=tokenizer),
            lambda con, out: api.savings_section(con, out, price_model=price_model, prices_path=prices),
            lambda con, out: api.trend_section(con, out, g, price_model=price_model, prices_path=prices),
            lambda con, out: api.prefixes_section(con, out, g, tokenizer=tokenizer)]


_GPU_KEYS = ("gpu", "gpu_tflops", "gpu_hbm", "gpu_host_link", "gpu_price", "mfu", "target_utilisation")


def _kv_and_cost(options: dict):
    """The KV options as ``kv_model`` returns them, and the prefill cost model (None without --gpu)."""
    gpu = {k: options.pop(k) for k in _GPU_KEYS}
    kv = kv_model(**options)
    return kv, cost_options(options["model"], options["model_config"], kv[0], **gpu)


@click.command()
@logs_options
@grid_options
@click.option("--name", default=None, callback=plain_name,
              help="Report folder name under --out: one plain name (default: 'sample' for the shipped "
                   "sample, else the first log's stem).")
@click.option("--out", default="reports", show_default=True, type=click.Path(file_okay=False))
@click.option("--fresh", is_flag=True, help="Start from an empty database file.")
@_price_options
@kv_options
@gpu_options
@warmup_option
@_html_option
@engine_options
def run(logs, db_path, fmt, fields, time_unit, tokenizer, ttls, blocks, mins, streams, name, out, fresh,
        prices, price_model, warmup, html, engine, address, **kv):
    """The batch job: ingest → tokenize → replay → sweep → report.

    Without LOGS it runs on the shipped sample (data/sample). The report goes
    to OUT/NAME/report.md with its plots (and, with --html, report.html).
    """
    g = grid(ttls, blocks, mins, streams, warmup)
    kv, cost = _kv_and_cost(kv)
    if not logs:
        if not Path(SAMPLE).exists():
            raise click.ClickException(f"no logs given and no shipped sample at {SAMPLE} "
                                       "(run from the project root, or `replay synth data/sample`)")
        logs = (SAMPLE,)
        name = name or "sample"
    name = name or Path(logs[0].partition("?")[0].rstrip("/")).stem.split(".")[0] or "report"  # (a URI's query)
    name = name if _is_plain(name) else "report"
    if fresh:
        api.remove_db(db_path)
    con = api.open_db(db_path)
    tok = api.load_tokenizer(tokenizer)  # its encoder process loads and works while ingest runs
    with on_engine(engine, address):
        load_logs(con, logs, fmt, fields, time_unit, tokenizer=tok)
        path = api.write_report(con, Path(out) / name, g, title=f"Prefix-cache sizing — {name}",
                                extra_sections=_extra_sections(g, prices, price_model, kv, tok, cost), progress=True,
                                tokenizer=tok, html=html)
    click.echo(f"report written to {path}" + (f" and {path.with_name('report.html')}" if html else ""))


@click.command()
@db_option
@grid_options
@click.option("--name", default="report", show_default=True, callback=plain_name,
              help="Report folder name under --out: one plain name.")
@click.option("--out", default="reports", show_default=True, type=click.Path(file_okay=False))
@_price_options
@kv_options
@gpu_options
@warmup_option
@_html_option
def report(db_path, ttls, blocks, mins, streams, name, out, prices, price_model, warmup, html, **kv):
    """Write the report from what the database already holds."""
    g = grid(ttls, blocks, mins, streams, warmup)
    kv, cost = _kv_and_cost(kv)
    con = api.open_db(db_path)
    load_logs(con, (), None, {}, None)
    path = api.write_report(con, Path(out) / name, g, extra_sections=_extra_sections(g, prices, price_model, kv,
                                                                                      cost=cost),
                            progress=True, html=html)
    click.echo(f"report written to {path}" + (f" and {path.with_name('report.html')}" if html else ""))


@click.command("profiles")
def profiles_cmd():
    """List the provider/engine profiles `sweep --profile` accepts, with their rules and sources."""
    for p in api.list_profiles():
        click.echo(p.describe())
        click.echo()
    click.echo(api.describe_auto())


@click.command()
@click.argument("out", type=click.Path(file_okay=False), default=SAMPLE)
@click.option("--seed", default=0, show_default=True)
@click.option("--scale", default=1.0, show_default=True, help="Multiplies sessions and request counts.")
def synth(out, seed, scale):
    """Write a realistic synthetic log (agents, sub-agents, a chat app) to OUT."""
    res = api.synth(out, seed=seed, scale=scale)
    click.echo(f"wrote {res}", err=True)
