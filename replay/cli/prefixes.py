"""`replay prefixes`: the top shared prefixes (parsing and printing only)."""

from __future__ import annotations

import json

import click

from replay.cli import names
from replay.cli.lazy import api
from replay.cli.options import load_logs, logs_options, one_configuration

TEXT_SHOWN = 160  # characters of a prefix's text the table shows (head and tail); --json gives it whole


@click.command("prefixes")
@logs_options
@one_configuration
@click.option("--top", default=20, show_default=True, type=click.IntRange(min=1), help="Prefixes to show.")
@click.option("--by", default="hit_tokens", show_default=True, type=click.Choice(list(names.PREFIX_RANKINGS)),
              help="Rank by the hit tokens a prefix served, or by the requests that reused it.")
@click.option("--json", "as_json", is_flag=True,
              help="Print exactly a JSON array, best first: rank, model, n_tokens, hit_tokens, requests, "
                   "sessions, streams, parts, hash, first_request, first_stream (and text with --show-text).")
@click.option("--show-text", is_flag=True, help="Show each prefix's text (decoded; not shown by default).")
def prefixes(logs, db_path, fmt, fields, time_unit, tokenizer, top, ttl, block, min_prefix, stream, by, as_json,
             show_text):
    """The top shared prefixes: where many requests branch, ranked by the hit tokens they serve.

    \b
    For one configuration, each request's hit prefix (its first hit tokens)
    goes into a trie per cache (stream key and model); a prefix is a point
    where those branch or where one ends. hit_tokens = the requests that reused
    it x its length; the same prefix in several caches of a model is counted
    once, over all of them (streams: how many). Each is described by its
    length, the parts it spans (tools, system, message k; "(partial)": it ends
    inside that part), its sessions and streams, and a short hash (keyed per
    run: equal hashes within one output are the same prefix). No text unless
    --show-text.

    Given LOGS, they are ingested first (into --db). Exit codes: 0 (also when
    nothing is shared: an empty table, or [] with --json), 1 when the database
    holds no requests, 2 bad usage.
    """
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    try:
        rows = api.top_prefixes(con, ttl=ttl, block=block, min_prefix=min_prefix, stream=stream, top=top, by=by,
                                show_text=show_text, tokenizer=tokenizer, progress=not as_json)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(rows, ensure_ascii=False))
        return
    click.echo(f"ttl {names.format_ttl(ttl)}, block {block}, min prefix {min_prefix}, stream {stream}; "
               f"ranked by {by.replace('_', ' ')}")
    if not rows:
        click.echo("no prefix is shared at this configuration")
        return
    width = max(5, *(len(str(r["model"] or "-")) for r in rows))
    click.echo(f"{'rank':>4} {'tokens':>9} {'hit_tok':>12} {'requests':>9} {'sessions':>8} {'streams':>7} "
               f"{'hash':<12}  {'model':<{width}}  parts")
    for r in rows:
        click.echo(f"{r['rank']:>4} {r['n_tokens']:>9,} {r['hit_tokens']:>12,} {r['requests']:>9,} "
                   f"{r['sessions']:>8,} {r['streams']:>7,} {r['hash']:<12}  {str(r['model'] or '-'):<{width}}  "
                   f"{', '.join(r['parts'])}")
        if show_text:
            click.echo(f"     text: {_short(r['text'])}")


def _short(text: str | None) -> str:
    if text is None:
        return "(no text: a block trace)"
    s = json.dumps(text, ensure_ascii=False)[1:-1]  # one line, escapes visible
    return s if len(s) <= TEXT_SHOWN else f"{s[:TEXT_SHOWN * 2 // 3]} … {s[-TEXT_SHOWN // 3:]}"
