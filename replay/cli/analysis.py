"""The analyses' commands: diagnose, whatif, diff, validate."""

from __future__ import annotations

import json

import click

from replay import api
from replay.cli.options import db_option, ingest_options, load_logs, one_config


@click.command("diagnose")
@click.argument("logs", nargs=-1)
@db_option
@ingest_options
@one_config
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--show-text", is_flag=True, help="Show the differing text (masked by default).")
@click.option("--examples", default=5, show_default=True, help="Examples per cause.")
@click.option("--parquet", type=click.Path(dir_okay=False), default=None,
              help="Also write the per-request split as Parquet.")
def diagnose(logs, db_path, fmt, fields, time_unit, tokenizer, ttl, block, min_prefix, stream, profile, as_json,
             show_text, examples, parquet):
    """Why requests miss: every missed prompt token attributed to one cause.

    Given LOGS, they are ingested first (into --db).
    """
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    try:
        res = api.diagnose(con, ttl=ttl, block=block, min_prefix=min_prefix, stream=stream, profile=profile,
                           show_text=show_text, examples=examples, tokenizer=tokenizer)
        if parquet:
            api.miss_parts(con, ttl, block, min_prefix, stream, profile, tokenizer).write_parquet(parquet)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(res, ensure_ascii=False))
    else:
        click.echo(f"ttl {api.format_ttl(ttl)}, block {block}, min prefix {min_prefix}, stream {stream}, "
                   f"profile {profile}")
        click.echo(api.format_text(res))


@click.command("whatif")
@click.argument("logs", nargs=-1)
@db_option
@ingest_options
@one_config
@click.option("--fix", "fixes", required=True,
              help="Normalizers, comma-separated: strip-rotating-header, sort-tools, canonical-json, "
                   "bucket-timestamps=5m, move-volatile-after-breakpoint (or 'all').")
@click.option("--prices", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A TOML price table overriding the shipped defaults (replay/providers/prices.toml).")
@click.option("--price-model", default=None,
              help="Price the fixes as this model (default: the logged model, when the table has it).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def whatif(logs, db_path, fmt, fields, time_unit, tokenizer, ttl, block, min_prefix, stream, profile, fixes,
           prices, price_model, as_json):
    """What each fix is worth: the ceiling recomputed on normalized request bodies."""
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    names = [f.strip() for f in fixes.split(",") if f.strip()]
    if names == ["all"]:
        names = list(api.FIXES)
    try:
        model = price_model or api.logged_price_model(con, prices)
        price = api.get_price(model, prices) if model else None
        res = api.whatif(con, names, ttl=ttl, block=block, min_prefix=min_prefix, stream=stream, prices=price,
                         tokenizer=tokenizer, profile=profile)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(res) if as_json else api.format_whatif(res))


@click.command("diff")
@click.argument("stream")
@db_option
@click.option("--index", type=int, default=None,
              help="Compare request INDEX of the stream with the one before (default: the first "
                   "that does not extend its predecessor).")
@click.option("--show-text", is_flag=True, help="Show the differing text (masked by default).")
def diff(stream, db_path, index, show_text):
    """Where two consecutive requests of STREAM (a session, tenant or key; or
    tenant:X / key:X / session:X) first differ."""
    try:
        click.echo(api.diff_view(api.open_db(db_path), stream, index=index, show_text=show_text))
    except ValueError as e:
        raise click.ClickException(str(e)) from None


@click.command()
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
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    res = api.validate(con, sample, model=model, prompt_cache_size=None if prompt_cache_bytes else prompt_cache_size,
                       prompt_cache_bytes=prompt_cache_bytes, max_prompt_tokens=max_prompt_tokens, seed=seed,
                       timeout_s=timeout_s, port=port, cold_pass=not no_cold_pass, progress=not as_json,
                       tokenizer=tokenizer)
    api.store_result(con, res)
    if as_json:
        click.echo(json.dumps(res, default=float))
    else:
        for line in api.summary_lines(res):
            click.echo(line)
    if res.get("error"):
        raise SystemExit(1)
