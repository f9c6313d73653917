"""The Python API over the stages — what the CLI and the notebooks both call.

    import replay.pipeline as rp
    con = rp.open_db("data/replay.duckdb")
    rp.ingest(con, ["data/sample"])
    df = rp.sweep(con)                      # ingest → tokenize → replay as needed, then sweep

Each stage leaves its table in DuckDB and is skipped when its output is
already current, so re-running a job neither repeats work nor double-counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import polars as pl

from replay.store import db
from replay.core.replay import MODES, replay_stage, walks_current
from replay.core.sweep import Grid, format_ttl, parse_ttl  # noqa: F401 - the API's grid helpers
from replay.core.sweep import sweep as _sweep

open_db = db.connect


def ingest(con, paths, format=None, fields=None, time_unit=None, progress=False, tokenizer=None):
    """Load logs; with ``tokenizer`` (a ``Tok``) its encoder process is handed the
    new content as it is found, to encode ahead for the tokenize stage."""
    from replay.readers.ingest import ingest as _ingest

    return _ingest(con, list(paths), format=format, fields=fields, time_unit=time_unit,
                   progress=progress, warm=tokenizer.warm if tokenizer is not None else None)


def load_tokenizer(path: str | None = None):
    """The tokenizer the stages use (a local directory, or DeepSeek-V4's by default).

    Its encoder process starts loading at once; handed to ``ingest`` too, it
    prepares the new content on the other core (what ``replay run`` does)."""
    from replay.text import tokenize

    return tokenize.load_tokenizer(path)


def _tok(tok):
    """A tokenizer from a ``Tok``, a path or None."""
    from replay.text.tokenize import Tok

    return tok if isinstance(tok, Tok) else load_tokenizer(tok)


def tokenize(con, tokenizer=None, progress=False):
    """Render and tokenize pending requests; ``tokenizer``: a ``Tok``, a path or None."""
    from replay.text.tokenize import tokenize_stage

    return tokenize_stage(con, _tok(tokenizer), progress=progress)


def prepare(con, modes=MODES, variants=("prompt",), horizon: float = math.inf,
            tokenizer=None, progress=False) -> dict:
    """Make sure prompts are tokenized and walks are current for these modes
    (``tokenizer``: a ``Tok``, a path, or None for the default)."""
    from replay.text.tokenize import confirm_tokens, tokenize_needed, tokenize_stage

    def replay():
        return replay_stage(con, modes=tuple(modes), variants=tuple(variants), horizon=horizon,
                            progress=progress)

    done = {}
    pending = tokenize_needed(con)
    tok = _tok(tokenizer) if (pending or tokenizer) else None
    if tok is not None and (pending or db.get_meta(con, "tokenizer") not in (None, tok.name)):
        # the encoder's late checks run beside the replay; its rows are trusted only after them
        done["tokenize"] = tokenize_stage(con, tok, progress=progress, check=False)
    if not walks_current(con, modes, variants, horizon):
        done["replay"] = replay()
    if "tokenize" in done and not confirm_tokens(con, tok):
        done["tokenize"] = tokenize_stage(con, tok.exact(), progress=progress)
        done["replay"] = replay()
    return done


def sweep(con, grid: Grid | None = None, by_stream=False, tokenizer=None, progress=False,
          horizon: float | None = None) -> pl.DataFrame:
    """The ideal-contract sweep, replaying first if needed."""
    grid = grid or Grid()
    if horizon is None:
        horizon = max(grid.ttls)
    prepare(con, modes=MODES if set(grid.streams) <= set(MODES) else grid.streams,
            horizon=horizon, tokenizer=tokenizer, progress=progress)
    return _sweep(con, grid, by_stream=by_stream)


def profile_sweep(con, profiles, grid: Grid | None = None, by_stream=False, tokenizer=None,
                  progress=False) -> pl.DataFrame:
    """Sweep under provider/engine profiles (``replay.profiles``), with realised usage columns."""
    from replay.providers import profiles as prof

    grid = grid or Grid()
    prepare(con, modes=MODES, variants=("prompt", "prompt+output"), horizon=max(grid.ttls),
            tokenizer=tokenizer, progress=progress)
    return prof.profile_sweep(con, list(profiles), grid, by_stream=by_stream)


def idle_gaps(con, mode: str = "tenant") -> pl.DataFrame:
    """Gap between each request and the previous request of its stream (first ones: null)."""
    return pl.from_arrow(db.arrow(con, """
        SELECT request_id, stream, ts,
               ts - lag(ts) OVER (PARTITION BY stream ORDER BY ts, request_id) AS gap_s
        FROM walks WHERE variant = 'prompt' AND mode = ?""", [mode]))


def overview(con) -> dict:
    r = con.execute("""SELECT count(*), count(DISTINCT tenant), count(DISTINCT prompt_cache_key),
                              count(DISTINCT session), min(ts), max(ts) FROM requests""").fetchall()[0]
    rej = con.execute("SELECT count(*) FROM rejects").fetchall()[0][0]
    tok = con.execute("SELECT coalesce(sum(n_tokens), 0) FROM prompts").fetchall()[0][0]
    seg = con.execute("SELECT count(*), coalesce(sum(n_tokens), 0) FROM segments").fetchall()[0]
    return {"requests": r[0], "tenants": r[1], "keys": r[2], "sessions": r[3],
            "first_ts": r[4], "last_ts": r[5], "rejected": rej, "logical_prompt_tokens": int(tok),
            "unique_segments": seg[0], "unique_content_tokens": int(seg[1]),
            "tokenizer": db.get_meta(con, "tokenizer")}
