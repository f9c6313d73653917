"""`replay show`: how one request was rendered (parsing and printing only)."""

from __future__ import annotations

import json

import click

from replay.cli.lazy import api
from replay.cli.options import load_logs, logs_options

_ATTRS = (("time", "time"), ("ts_us", "ts_us"), ("tenant", "tenant"), ("session", "session"), ("key", "key"),
          ("user", "user_id"), ("model", "model"), ("format", "format"))

_JSON_HELP = ("Print exactly one JSON object: request_id, the request's attributes, n_tokens, tokens (the ids, "
              "in order), segments (part, marker, start, n_tokens; in order), and text with --show-text.")


@click.command("show")
@click.argument("request_id", type=int)
@logs_options
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@click.option("--show-text", is_flag=True, help="Also show the prompt's text (the ids decoded; not shown by default).")
def show(request_id, logs, db_path, fmt, fields, time_unit, tokenizer, as_json, show_text):
    """How request REQUEST_ID was rendered: its segments, their parts and token counts.

    \b
    replay show 42 --db w47.duckdb            # a table of the segments
    replay show 42 --db w47.duckdb --json     # the token ids too, as one JSON object
    replay show 42 --db w47.duckdb --show-text

    Each stored segment of the prompt (the neutral template's markers and
    texts) is listed in order with its part (bos, tools, system, message k,
    generation; a pre-tokenized log's tokens; a block trace's blocks), its
    tokens and the running total, after the request's attributes (time,
    tenant, session, key, user, model, format, source file and line). The
    prompts are tokenized first if they wait for it. No prompt text unless
    --show-text (decoded with the tokenizer that encoded the prompts).

    Given LOGS, they are ingested first (into --db). Exit codes: 0; 1 when the
    database holds no request REQUEST_ID (as `replay diff` with a stream that
    does not exist) or no requests at all; 2 bad usage (REQUEST_ID not an
    integer; --show-text on prompts tokenized with another tokenizer than the
    one given).
    """
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    try:
        r = api.show_request(con, request_id, show_text=show_text, tokenizer=tokenizer, progress=not as_json)
    except api.RequestNotFound as e:
        raise click.ClickException(str(e.args[0])) from None
    except api.ShowTextRefused as e:
        raise click.UsageError(str(e)) from None
    if as_json:
        click.echo(json.dumps(r, ensure_ascii=False))
        return
    click.echo(f"request {r['request_id']}")
    for label, k in _ATTRS:
        if r[k] is not None:
            click.echo(f"  {label:<8} {r[k]}")
    if r["source"] is not None:
        click.echo(f"  {'source':<8} {r['source']}" + (f", line {r['line']}" if r["line"] is not None else ""))
    if r["usage"]:
        click.echo(f"  {'usage':<8} " + ", ".join(f"{k} {v:,}" for k, v in r["usage"].items()))
    if r["set_aside"] is not None:
        a = r["set_aside"]
        click.echo(f"not rendered: set aside ({a['reason']}" + (f": {a['detail']}" if a["detail"] else "") + ")")
        return
    segs = r["segments"]
    width = max([len("part"), *(len(s["part"]) for s in segs)])
    click.echo(f"\n{'#':>5}  {'part':<{width}}  {'marker':<11} {'tokens':>9} {'cumulative':>11}")
    for i, s in enumerate(segs):
        click.echo(f"{i:>5}  {s['part']:<{width}}  {s['marker'] or '-':<11} {s['n_tokens']:>9,} "
                   f"{s['start'] + s['n_tokens']:>11,}")
    parts: dict[str, int] = {}
    for s in segs:
        parts[s["part"]] = parts.get(s["part"], 0) + s["n_tokens"]
    click.echo(f"\n{r['n_tokens']:,} tokens in {len(segs):,} segments"
               + (f" ({r['blocks']:,} block ids: a block trace, no token ids)" if "blocks" in r else ""))
    click.echo("by part: " + ", ".join(f"{p} {n:,}" for p, n in parts.items()))
    if show_text:
        click.echo("\ntext:")
        click.echo(r["text"] if r["text"] is not None else "(no text: a block trace)")
