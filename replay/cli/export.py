"""`replay export`: the requests as a trace for other replay tools (parsing and printing only)."""

from __future__ import annotations

import click

from replay.cli import names
from replay.cli.lazy import api
from replay.cli.options import load_logs, logs_options


@click.command("export")
@logs_options
@click.option("--to", "to", required=True, type=click.Choice(list(names.EXPORT_TARGETS)),
              help="Layout: mooncake or bailian (hash ids, no text); vllm-custom or sglang (prompt text: "
                   "needs --show-text).")
@click.option("--block", type=click.IntRange(min=1), default=None,
              help="Tokens per hash id (default: 512 for mooncake, 16 for bailian). Sweeping the export "
                   "gives the source's ceiling at this block.")
@click.option("--stream", type=click.Choice(list(names.MODES)), default=None,
              help="Also salt the ids with each request's stream key under this mode, so no block is shared "
                   "across streams (the model always salts them).")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="File to write (JSON Lines; vLLM's custom dataset wants a name ending in .jsonl).")
@click.option("--show-text", is_flag=True,
              help="Allow the text layouts (vllm-custom, sglang): the file then holds every prompt's text.")
def export(logs, db_path, fmt, fields, time_unit, tokenizer, to, block, stream, output, show_text):
    """Write the requests as a trace that vLLM's and SGLang's benchmarks replay.

    \b
    replay export logs/ --to mooncake -o trace.jsonl            # 512-token hash ids, no text
    replay export --db w47.duckdb --to bailian --block 16 -o w47_bailian.jsonl
    replay export logs/ --to vllm-custom --show-text -o prompts.jsonl

    Given LOGS, they are ingested first (into --db). Hash ids are chained per
    block and salted by the request's model (and stream, with --stream): a
    sweep of the export (`--format mooncake`) gives the source's global
    ceiling at the same block for every TTL.
    """
    if to in names.EXPORT_TEXT_TARGETS and not show_text:
        raise click.UsageError(f"--to {to} writes every prompt's text: pass --show-text to allow it "
                               "(or export hash ids: --to mooncake or --to bailian)")
    if block is not None and to in names.EXPORT_TEXT_TARGETS:
        raise click.BadParameter(f"--to {to} writes text, not blocks", param_hint="--block")
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit)
    if show_text and to in names.EXPORT_TEXT_TARGETS:
        click.echo(f"warning: {output} will hold the text of every prompt (--show-text): keep it where the "
                   "logs themselves may be kept", err=True)
    try:
        s = api.export_trace(con, output, to=to, block=block, stream=stream, show_text=show_text,
                             tokenizer=tokenizer, progress=True)
    except api.ExportRefused as e:
        raise click.UsageError(str(e)) from None
    what = (f"{s.blocks:,} ids of {s.block} tokens ({s.distinct_blocks:,} distinct)" if s.block
            else "their prompt text")
    click.echo(f"exported {s.requests:,} requests to {s.path} as {s.target}: {what}"
               + (f"; {s.skipped:,} block-trace requests left out (no text)" if s.skipped else ""), err=True)
