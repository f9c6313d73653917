"""`replay capacity TRACE` without a database: a Mooncake trace read straight into the pass.

Taken only when nothing differs from the database path but the file left
behind: one plain ``.jsonl`` file that every line of which ingest would load
as Mooncake's format (``replay.readers.direct`` decides, else None), no
``--db`` given and no database at the default path (the rows would then be
those of these LOGS alone, the same ones a fresh database gives), no
``--field``, tokenizer or Ray engine. The rows come from the same code as the
database path's (``replay.analysis.capacity_rows``) over the same prompts in
the same order; no database file is written (docs/architecture.md, "A hash
trace without a database"). Anything else returns None: the caller ingests.
"""

from __future__ import annotations

import os

import click
from click.core import ParameterSource

from replay.cli import names

_NOT_PLAIN = ("*", "?", "[", "://")  # a glob or a URI: ingest's to expand


def direct_capacity(logs, fmt, fields, time_unit, tokenizer, engine, address, as_json, bytes_per_token, cost,
                    grid_args: dict) -> list[dict] | None:
    """The capacity command's rows (as ``to_dicts`` gives them) read straight from
    the one trace of ``logs``, or None when the database path must run."""
    ctx = click.get_current_context()
    if (len(logs) != 1 or fmt not in (None, "mooncake") or fields or tokenizer is not None or engine != "local"
            or address is not None or ctx.get_parameter_source("db_path") != ParameterSource.DEFAULT
            or os.path.exists(names.DEFAULT_DB) or os.path.exists(names.DEFAULT_DB + ".wal")):
        return None
    path = logs[0]
    if not path.endswith(".jsonl") or any(c in path for c in _NOT_PLAIN) or not os.path.isfile(path):
        return None
    from replay.analysis.capacity_rows import CapacityGrid, capacity_rows, row_dicts
    from replay.core.prompt import trace_prompts
    from replay.readers.direct import read_mooncake

    try:
        grid = CapacityGrid(**grid_args)
    except ValueError:
        return None  # (the database path says why, after ingest, as it always did)
    trace = read_mooncake(path, time_unit)
    if trace is None:
        return None
    prompts = trace_prompts(trace)
    try:
        rows = row_dicts(capacity_rows(prompts, len(prompts), grid, bytes_per_token, cost), grid, cost)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if not as_json:
        click.echo(f"files: 1 read directly (no database written: give --db FILE to keep the requests)\n"
                   f"lines: {len(trace):,}  loaded: {len(trace):,}  rejected: 0"
                   + (f"\ntime order: {path} is {trace.time_order} (sorted by time all the same)"
                      if trace.time_order in ("reversed", "shuffled") else ""), err=True)
    return rows
