"""What the database holds, and the idle gaps between requests of a cache."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from replay.times import US_PER_S
from replay.prepare import prepare
from replay.readers.timeorder import FLAGGED
from replay.store import db


def idle_gaps(con, mode: str = "tenant", tokenizer=None) -> pl.DataFrame:
    """Gap (seconds) between each request and the previous request of its cache
    (stream and model) under ``mode``; the first ones are null."""
    prepare(con, modes=(mode,), horizon_us=0, tokenizer=tokenizer)  # (any horizon: no steps are read)
    return pl.from_arrow(db.arrow(con, f"""
        SELECT request_id, stream, model, ts_us / {US_PER_S} AS ts,
               (ts_us - lag(ts_us) OVER (PARTITION BY stream, model ORDER BY ts_us, request_id)) / {US_PER_S}
                   AS gap_s
        FROM walks WHERE variant = 'prompt' AND mode = ?""", [mode]))


def overview(con) -> dict:
    """Counts of requests, tenants, keys, sessions, models; the time span (seconds);
    lines rejected at ingest and requests set aside; logical and unique tokens; the
    files whose requests were not in time order (``unordered_files``: (path, order),
    ``replay.readers.timeorder``)."""
    r = con.execute("""SELECT count(*), count(DISTINCT tenant), count(DISTINCT prompt_cache_key),
                              count(DISTINCT session), count(DISTINCT model), min(ts_us), max(ts_us)
                       FROM requests""").fetchone()
    rej = con.execute("SELECT count(*) FROM rejects").fetchone()[0]
    aside = con.execute("SELECT count(*) FROM set_aside").fetchone()[0]
    tok = con.execute("SELECT coalesce(sum(n_tokens), 0) FROM prompts").fetchone()[0]
    seg = con.execute("SELECT count(*), coalesce(sum(n_tokens), 0) FROM segments").fetchone()
    unordered = con.execute("SELECT path, time_order FROM sources WHERE list_contains(?, time_order) "
                            "ORDER BY source_id", [list(FLAGGED)]).fetchall()
    return {"requests": r[0], "tenants": r[1], "keys": r[2], "sessions": r[3], "models": r[4],
            "first_ts": None if r[5] is None else r[5] / US_PER_S,
            "last_ts": None if r[6] is None else r[6] / US_PER_S, "rejected": rej, "set_aside": aside,
            "logical_prompt_tokens": int(tok), "unique_segments": seg[0], "unique_content_tokens": int(seg[1]),
            "tokenizer": db.get_meta(con, "tokenizer"), "unordered_files": [tuple(r) for r in unordered]}


def unordered_note(files: list[tuple[str, str]], shown: int = 5) -> str | None:
    """The report's line on the files not in time order (``overview()['unordered_files']``):
    how many, of which order, and the first ``shown`` by file name (never their text)."""
    if not files:
        return None
    counts = ", ".join(f"{n} {o}" for o in FLAGGED if (n := sum(1 for _, x in files if x == o)))
    names = ", ".join(f"`{Path(p).name}` ({o})" for p, o in files[:shown])
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return (f"{len(files):,} input file(s) were not in time order ({counts}): {names}{more}. The replay sorts "
            "requests by time whatever the order of a file, so the figures are unaffected; a file only "
            "slightly out of order (a few lines, by under a minute) is not counted here.")
