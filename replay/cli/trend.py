"""`replay trend`: week over week — per stream the ceiling, realised ratio and savings, and regressions."""

from __future__ import annotations

import json

import click

from replay.cli import names
from replay.cli.lazy import api
from replay.cli.options import load_logs, logs_options, one_configuration


@click.command("trend")
@logs_options
@one_configuration
@click.option("--threshold", default=names.TREND_THRESHOLD, show_default=True, type=click.FloatRange(min=0),
              help="Flag a stream whose ceiling dropped by more than this many points from its previous week.")
@click.option("--prices", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A TOML price table overriding the shipped defaults (replay/providers/prices.toml).")
@click.option("--price-model", default=None, help="Price every model's savings as this one model, at the trend's configuration "
                   "(default: each model judged by its own profile at its own prices, as the report's savings).")
@click.option("--json", "as_json", is_flag=True,
              help="Print exactly one JSON object: config, weeks, rows (per stream and week), regressions.")
def trend(logs, db_path, fmt, fields, time_unit, tokenizer, stream, ttl, block, min_prefix, threshold, prices,
          price_model, as_json):
    """Week over week: per stream and ISO week, the ceiling, the realised ratio and
    the savings; flags streams whose ceiling dropped by more than --threshold points
    from their previous week, naming the miss cause that grew most.

    Given LOGS, they are ingested first (into --db): ingest each week's logs into
    the same database and run this after.
    """
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    try:
        res = api.trend(con, stream=stream, ttl=ttl, block=block, min_prefix=min_prefix, threshold=threshold,
                        price_model=price_model, prices_path=prices, tokenizer=tokenizer, progress=not as_json)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(res, ensure_ascii=False) if as_json else api.format_trend(res))
