"""The analyses' commands: diagnose, whatif, diff, validate, capacity."""

from __future__ import annotations

import json

import click

from replay.cli import names
from replay.cli.lazy import api
from replay.cli.options import csv_values, db_option, kv_model, kv_options, load_logs, logs_options, one_config
from replay.cli.options import cost_options, engine_options, gpu_options, on_engine, tier_option, warmup_option
from replay.cli.direct import direct_capacity


@click.command("diagnose")
@logs_options
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
        click.echo(f"ttl {names.format_ttl(ttl)}, block {block}, min prefix {min_prefix}, stream {stream}, "
                   f"profile {profile}")
        click.echo(api.format_text(res))


@click.command("realised")
@logs_options
@click.option("--json", "as_json", is_flag=True,
              help="Print exactly a JSON array: one object per (provider, model) and one per provider "
                   "with \"model\": \"*\".")
def realised(logs, db_path, fmt, fields, time_unit, tokenizer, as_json):
    """Predicted against realised: what each provider's rules predict (as under
    --profile auto, with the client's breakpoints and the parts the log does not
    hold inferred from usage) beside what the provider cached, per provider and
    model. Needs logs with the provider's usage (Claude Code transcripts, Codex
    rollouts, agent trajectories, chat logs with usage).

    Given LOGS, they are ingested first (into --db).

    \b
      replay realised ~/.claude/projects/
      replay realised ~/.codex/sessions/ --json
    """
    con = api.open_db(db_path)
    load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
    rows = api.realised(con, tokenizer=tokenizer, progress=not as_json)
    if as_json:
        click.echo(json.dumps(rows, ensure_ascii=False))
        return
    if not rows:
        raise click.ClickException("no request in the database carries the provider's usage: nothing to compare")
    click.echo(f"{'provider':<10} {'model':<32} {'requests':>8} {'predicted':>9} {'realised':>8} {'gap':>6} "
               f"{'inferred':>8}")
    for r in rows:
        click.echo(f"{r['provider']:<10} {r['model']:<32} {r['requests']:>8,} {100 * r['predicted_hit_ratio']:>8.1f}% "
                   f"{100 * r['realised_hit_ratio']:>7.1f}% {r['gap_points']:>+6.2f} {100 * r['inferred_share']:>7.1f}%")
        parts = ", ".join(f"{k} {v:+.2f}" for k, v in r["gap_parts"].items() if abs(v) >= 0.005)
        if parts:
            click.echo(f"{'':<10} gap parts (points): {parts}")


@click.command("whatif")
@logs_options
@one_config
@click.option("--fix", "fixes", required=True,
              help="Normalizers, comma-separated: strip-rotating-header, sort-tools, canonical-json, "
                   "bucket-timestamps=5m, move-volatile-after-breakpoint; with --chat-template also "
                   "fixed-template-date, keep-history-as-rendered (or 'all').")
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
        if getattr(tokenizer, "template", None) is not None:  # (a TokenizerSpec with --chat-template)
            from replay.analysis.whatif import TEMPLATE_FIXES
            names += list(TEMPLATE_FIXES)
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
@logs_options
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


@click.command("capacity")
@logs_options
@click.option("--block", "blocks", default="16", show_default=True, callback=csv_values(int),
              help="Block sizes in tokens (the engine's KV block; 1 = token level).")
@click.option("--capacity", "capacities", default=None, callback=csv_values(str),
              help="Pool per replica: block counts (4096), sizes with a unit (512MiB, 40GiB, 1TiB; KB, MB, GB "
                   "decimal) — sizes need the KV bytes per token — or 'auto' (a log-spaced grid from one block "
                   "to the working set; the default without --tier).")
@tier_option
@click.option("--ttl", "ttls", default="inf", show_default=True, callback=csv_values(names.parse_ttl),
              help="TTLs: seconds, or with s/m/h/d; 'inf' = no expiry.")
@click.option("--stream", "streams", default="global", show_default=True, callback=csv_values(str),
              help="Stream modes: tenant, key, session, global (a cache per stream and model; a replica's "
                   "pool holds every cache routed to it).")
@click.option("--replicas", default="1", show_default=True, callback=csv_values(int), help="Replica counts.")
@click.option("--routing", "routings", default="round-robin", show_default=True, callback=csv_values(str),
              help="round-robin (request i to replica i mod R), random (seeded), sticky (by the stream key), "
                   "prefix (to the replica holding the longest resident prefix, ties to the one that has "
                   "served fewest; simulated per capacity).")
@click.option("--policy", "policies", default="lru", show_default=True, callback=csv_values(str),
              help="Eviction: lru, belady (evict the block used again farthest in the future: a bound on "
                   "smarter eviction; simulated per capacity, not with prefix routing).")
@click.option("--seed", default=0, show_default=True, help="Seed of random routing.")
@click.option("--sample-rate", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Estimate from this share of blocks (e.g. 0.1; SHARDS sampling) instead of exactly: for logs "
                   "whose trie would not fit in memory. Capacities up to 1000/rate blocks stay exact (one small "
                   "LRU of every block), larger ones are estimated. LRU, routing decided in advance.")
@kv_options
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel degree: adds capacity_bytes_per_gpu (a replica's bytes / TP).")
@gpu_options
@click.option("--json", "as_json", is_flag=True, help="Print exactly a JSON array, one object per configuration.")
@warmup_option
@engine_options
def capacity(logs, db_path, fmt, fields, time_unit, tokenizer, blocks, capacities, tiers, ttls, streams, replicas,
             routings, policies, seed, sample_rate, model, model_config, kv_bytes_per_token, kv_dtype, tp, gpu,
             gpu_tflops, gpu_hbm, gpu_host_link, gpu_price, mfu, target_utilisation, as_json, warmup, engine,
             address):
    """How much memory and how many replicas: the hit ratio of a finite cache.

    \b
    Units: a capacity is per replica, in blocks of --block tokens, or in bytes
    of KV cache (C blocks hold C x block x KV-bytes-per-token; KiB/MiB/GiB/TiB
    are powers of 2, KB/MB/GB/TB powers of 10). One pass over the log gives
    every capacity and TTL of the grid (LRU, routing decided in advance);
    prefix routing and belady are simulated per capacity. warm_hit_ratio is
    over the last half of the requests, max_replica_share the busiest
    replica's share of them; with --warmup F, requests, prompt_tokens,
    hit_tokens and hit_ratio count only the last 1 - F of the requests (a
    last `warmup` column says so).

    \b
    Tiers (--tier): each configuration's rows add `tiers` and `tier_hit_tokens`
    (tier name -> hit tokens it serves; they add up to hit_tokens). A
    replica's tiers are one LRU hierarchy; a pooled tier is one LRU over every
    request. With --gpu (or its figures) and --model, each row adds: gpu,
    prefill_gpu_hours_week_uncached and prefill_gpu_hours_week (prefill
    GPU-hours a week at the log's rate, without and with the cache; the
    latter includes load_gpu_hours_week, loading lower tiers' hits),
    gpu_hours_saved_week, gpus_peak_hour_uncached and gpus_peak_hour (GPUs
    the busiest clock hour needs at --target-utilisation), and with
    --gpu-price prefill_dollars_week[_uncached] (GPU-hours x price) and
    fleet_dollars_week[_uncached] (GPUs at the busiest hour x 168 h x
    price); docs/semantics.md, "Capacity".

    \b
    Given LOGS, they are ingested first (into --db) and the rows are over
    everything the database holds. One Mooncake trace (.jsonl) with no --db
    and no database at the default path is read directly instead: the same
    rows, no database written (docs/architecture.md).
    """
    bpt, _ = kv_model(model, model_config, kv_bytes_per_token, kv_dtype)
    cost = cost_options(model, model_config, bpt, gpu, gpu_tflops, gpu_hbm, gpu_host_link, gpu_price, mfu,
                        target_utilisation)
    if tiers and capacities:
        raise click.ClickException("pass --capacity or --tier, not both (a tier list's first tier is the capacity)")
    rows = direct_capacity(logs, fmt, fields, time_unit, tokenizer, engine, address, as_json, bpt, cost,
                           dict(blocks=blocks, capacities=capacities or ("auto",), ttls=ttls, streams=streams,
                                replicas=replicas, routings=routings, policies=policies, seed=seed,
                                sample_rate=sample_rate, warmup=warmup, tiers=tiers))
    if rows is None:
        con = api.open_db(db_path)
        # (--engine: where the logs are parsed and the walks prepared; the finite-cache pass itself runs
        # here — every stream shares the replica's pool, so it does not split into independent partitions)
        with on_engine(engine, address):
            load_logs(con, logs, fmt, fields, time_unit, quiet=as_json)
            try:
                grid = api.CapacityGrid(blocks=blocks, capacities=capacities or ("auto",), ttls=ttls,
                                        streams=streams, replicas=replicas, routings=routings, policies=policies,
                                        seed=seed, sample_rate=sample_rate, warmup=warmup, tiers=tiers)
                rows = api.capacity(con, grid, bytes_per_token=bpt, tokenizer=tokenizer, progress=not as_json,
                                    cost=cost).to_dicts()
            except ValueError as e:
                raise click.ClickException(str(e)) from None
    for r in rows:
        if tp > 1:
            r["capacity_bytes_per_gpu"] = None if r["capacity_bytes"] is None else r["capacity_bytes"] // tp
        if "tier_hit_tokens" in r:  # (a mapping in JSON: tier name -> tokens, fastest first)
            r["tier_hit_tokens"] = {e["tier"]: e["tokens"] for e in r["tier_hit_tokens"]}
    if as_json:
        click.echo(json.dumps(rows))
        return
    if warmup:
        from replay.core.warmup import describe

        click.echo(f"hit % measured over {describe(warmup)}; warm % over the last half", err=True)
    click.echo(f"{'stream':<8} {'ttl':>6} {'block':>6} {'capacity':>12} {'GiB':>9} {'R':>3} {'routing':<12} "
               f"{'policy':<7} {'hit %':>6} {'warm %':>7} {'busiest':>8}")
    for r in rows:
        gib = "-" if r["capacity_bytes"] is None else f"{r['capacity_bytes'] / 2**30:.2f}"
        click.echo(f"{r['stream']:<8} {names.format_ttl(r['ttl_s']):>6} {r['block']:>6} {r['capacity_blocks']:>12,} "
                   f"{gib:>9} {r['replicas']:>3} {r['routing']:<12} {r['policy']:<7} {100 * r['hit_ratio']:>6.1f} "
                   f"{100 * r['warm_hit_ratio']:>7.1f} {100 * r['max_replica_share']:>7.1f}%" + _extras(r))


def _extras(r: dict) -> str:
    """A row's tiers (each one's share of the prompt tokens) and prefill figures, where it has them."""
    out = ""
    if "tiers" in r:
        prompt = r["prompt_tokens"] or 1
        share = {k: 100 * v / prompt for k, v in r["tier_hit_tokens"].items()}
        out += f"  {r['tiers']}: " + ", ".join(f"{k} {v:.1f}%" for k, v in share.items())
    if r.get("prefill_gpu_hours_week") is not None:
        out += (f"  prefill {r['prefill_gpu_hours_week']:.1f} GPU-h/wk (uncached "
                f"{r['prefill_gpu_hours_week_uncached']:.1f}), {r['gpus_peak_hour']} GPUs at peak")
    return out
