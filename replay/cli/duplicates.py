"""`replay duplicates`: the rates (the default), and the labelling protocol's
commands (label-export, label-import, audit)."""

from __future__ import annotations

import json

import click

from replay.cli import names
from replay.cli.lazy import api
from replay.cli.options import csv_values, db_option, load_logs, logs_options


class _DefaultGroup(click.Group):
    """A group whose first argument, when it is not one of its commands, goes to
    the default command (``replay duplicates LOG...``)."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["rates"] + list(args)
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultGroup)
def duplicates():
    """Exact and near duplicates, and the labelling protocol for near ones.

    \b
    replay duplicates [LOG...] [--ttl] [--stream] [--threshold] [--json]
        the rates (see `replay duplicates rates --help`)
    replay duplicates label-export   a stratified sample of near pairs to label
    replay duplicates label-import   labels in: precision per band, kappa,
                                     per-intent thresholds, adjusted shares
    replay duplicates audit          a share of the would-be hits to label
    """


@duplicates.command("rates", hidden=True)
@logs_options
@click.option("--ttl", "ttls", default="5m,1h,inf", show_default=True, callback=csv_values(names.parse_ttl),
              help="How long a response cache keeps an answer: seconds, or with s/m/h/d; 'inf' = forever.")
@click.option("--stream", "streams", default="tenant,global", show_default=True, callback=csv_values(str),
              help="Stream modes: tenant, key, session, global (a cache per stream and model).")
@click.option("--threshold", "thresholds", default=",".join(map(str, names.NEAR_THRESHOLDS)), show_default=True,
              callback=csv_values(float), help="Cosine thresholds of the near-duplicate rates.")
@click.option("--no-normalized", is_flag=True, help="Skip the rates after whatif's normalizers.")
@click.option("--no-near", is_flag=True, help="Skip near duplicates (the embedding model).")
@click.option("--json", "as_json", is_flag=True,
              help="Print exactly a JSON object: exact (rows), near (rows, or null), model.")
def rates(logs, db_path, fmt, fields, time_unit, tokenizer, ttls, streams, thresholds, no_normalized, no_near,
          as_json):
    """Exact and near duplicates: what a response cache and a semantic cache could answer.

    \b
    Exact: a request whose whole rendered prompt equals an earlier request's
    of the same stream and model, the most recent such one at most TTL
    earlier; beside it the same after whatif's normalizers (timestamps
    bucketed, headers stripped, tools and JSON keys sorted).
    Near: the last user turn's embedding (a packaged, offline, English-centric
    model: the semantic extra) within cosine THRESHOLD of an earlier one of the
    stream within TTL. Raw near rates overstate what a semantic cache could
    safely answer: label a sample before trusting them (label-export, then
    label-import: the near rows then carry labelled_precision and
    adjusted_share for the stream mode and TTL the pairs were drawn at).
    """
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    near, model = None, None
    try:
        df = api.exact_duplicates(con, ttls=ttls, streams=streams, normalized=not no_normalized,
                                  tokenizer=tokenizer)
        if not no_near:
            try:
                near = api.near_rates(con, ttls=ttls, streams=streams, thresholds=thresholds, tokenizer=tokenizer)
                model = api.NEAR_MODEL
            except api.SemanticMissing as e:
                click.echo(f"near duplicates skipped: {e}", err=True)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps({"exact": df.to_dicts(), "near": None if near is None else near.to_dicts(),
                               "model": model}))
        return
    click.echo(f"{'stream':<8} {'ttl':>6} {'requests':>9} {'duplicates':>11} {'share':>7} "
               f"{'normalized':>11} {'share':>7}")
    for r in df.iter_rows(named=True):
        ttl = names.format_ttl(float("inf") if r["ttl_s"] is None else r["ttl_s"])
        norm = (f"{r['normalized_duplicate_requests']:>11,} {100 * r['normalized_duplicate_share']:>6.1f}%"
                if "normalized_duplicate_requests" in r else "")
        click.echo(f"{r['stream']:<8} {ttl:>6} {r['requests']:>9,} {r['duplicate_requests']:>11,} "
                   f"{100 * r['duplicate_share']:>6.1f}% {norm}")
    if near is not None:
        click.echo(f"\nnear duplicates ({model}) — {api.NEAR_WARNING}")
        click.echo(f"{'stream':<8} {'ttl':>6} {'threshold':>9} {'near':>9} {'share':>7}")
        for r in near.iter_rows(named=True):
            ttl = names.format_ttl(float("inf") if r["ttl_s"] is None else r["ttl_s"])
            click.echo(f"{r['stream']:<8} {ttl:>6} {r['threshold']:>9.2f} {r['near_requests']:>9,} "
                       f"{100 * r['near_share']:>6.1f}%")


def _pair_options(f):
    f = click.option("--show-text", is_flag=True,
                     help="Put both texts in the file (prompt text: handle as you would the logs).")(f)
    f = click.option("--seed", default=0, show_default=True, help="Seed of the sample.")(f)
    f = click.option("--out", "out", default="reports/labels/pairs", show_default=True,
                     help="Where to write: OUT.csv and OUT.jsonl.")(f)
    f = click.option("--stream", default="tenant", show_default=True, type=click.Choice(list(names.MODES)),
                     help="Stream mode the pairs are drawn in.")(f)
    f = click.option("--ttl", default="1h", show_default=True, callback=lambda c, p, v: names.parse_ttl(v),
                     help="How far back a pair may reach.")(f)
    return f


def _pairs(con, ttl, stream, show_text):
    if show_text:
        click.echo("warning: the file will hold prompt text (--show-text)", err=True)
    try:
        return api.candidate_pairs(con, ttl, stream)
    except api.SemanticMissing as e:
        raise click.ClickException(str(e)) from None


@duplicates.command("label-export")
@logs_options
@_pair_options
@click.option("--pairs", "n", default=5000, show_default=True, type=click.IntRange(min=1),
              help="Pairs in the sample (an equal quota per similarity band 0.80-0.85 ... 0.99-1.00).")
def label_export(logs, db_path, fmt, fields, time_unit, tokenizer, ttl, stream, out, seed, show_text, n):
    """A stratified, seeded sample of near-duplicate pairs to label.

    Each row: a request and its most similar earlier request of the same
    stream within TTL. Three labellers fill label_1..label_3 (1/0 or yes/no:
    could the earlier answer replace this one?) and may fill intent. Texts
    only with --show-text."""
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit)
    sample = api.stratified_sample(_pairs(con, ttl, stream, show_text), n, seed, show_text)
    paths = api.write_export(sample, out)
    click.echo(f"{len(sample):,} pairs written to {paths[0]} and {paths[1]}")


@duplicates.command("audit")
@db_option
@_pair_options
@click.option("--rate", default=0.02, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Share of the would-be hits to label.")
@click.option("--threshold", default=0.95, show_default=True, help="The semantic cache's threshold.")
def audit(db_path, ttl, stream, out, seed, show_text, rate, threshold):
    """A seeded share of the would-be hits at THRESHOLD, to label (weekly)."""
    con = api.open_db(db_path)
    load_logs(con, (), None, {}, None)
    sample = api.audit_sample(_pairs(con, ttl, stream, show_text), threshold, rate, seed, show_text)
    paths = api.write_export(sample, out)
    click.echo(f"{len(sample):,} would-be hits written to {paths[0]} and {paths[1]}")


@duplicates.command("label-import")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@db_option
@click.option("--precision", "target", default=0.99, show_default=True, type=click.FloatRange(0, 1),
              help="Target precision of the per-intent thresholds.")
@click.option("--threshold", "thresholds", default=",".join(map(str, names.NEAR_THRESHOLDS)), show_default=True,
              callback=csv_values(float), help="Thresholds to give the adjusted share at.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly a JSON object.")
def label_import(files, db_path, target, thresholds, as_json):
    """Labelled pairs in: precision per band (Wilson 95 %), Fleiss' kappa,
    per-intent thresholds reaching --precision, and the adjusted near share.
    The labels are kept in the database: `replay duplicates` then fills
    labelled_precision and adjusted_share."""
    con = api.open_db(db_path)
    load_logs(con, (), None, {}, None)
    try:
        labels = api.read_labels(files)
        configs = labels.select(["mode", "ttl_s"]).unique().rows()
        if len(configs) != 1:
            raise ValueError(f"the files mix {len(configs)} (stream mode, TTL) draws: import each separately")
        mode, ttl = configs[0]
        pairs = api.candidate_pairs(con, float("inf") if ttl is None else ttl, mode)
    except (ValueError, api.SemanticMissing) as e:
        raise click.ClickException(str(e)) from None
    api.store_labels(con, labels)
    res = api.summarize_labels(labels, pairs["similarity"].fill_null(float("-inf")).to_numpy(), len(pairs),
                               thresholds, target)
    if as_json:
        click.echo(json.dumps(res))
        return
    k = res["fleiss_kappa"]
    click.echo(f"{res['labelled']:,} of {res['pairs']:,} pairs labelled; Fleiss' kappa "
               f"{'n/a' if k is None else f'{k:.3f}'}")
    for b in res["bands"]:
        click.echo(f"  band {b['band']}: precision {100 * b['precision']:.1f} % "
                   f"({b['reusable']}/{b['labelled']}, 95 % CI {100 * b['ci_low']:.1f}-{100 * b['ci_high']:.1f} %)")
    for t in res["intent_thresholds"]:
        th = "none reaches the target" if t["threshold"] is None else f"{t['threshold']:.3f}"
        click.echo(f"  intent {t['intent']}: threshold {th} ({t['labelled']} labelled)")
    for r in res["near"]:
        adj = "n/a (a band without labels)" if r["adjusted_share"] is None else f"{100 * r['adjusted_share']:.1f} %"
        click.echo(f"  cosine >= {r['threshold']:.2f}: raw {100 * r['near_share']:.1f} %, adjusted {adj}")
