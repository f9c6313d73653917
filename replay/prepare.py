"""The one `prepare`: tokenized prompts and current walks, for whoever needs them.

Every consumer of walks (sweep, profiles, economics, diagnose, whatif,
validate, report, bench) says which walk sets it needs — (variant, stream
mode) pairs and the horizon its TTLs need — and gets them current: the
requests are tokenized when some are not, and every set that
``replay.store.walksets`` does not list as current for this data and horizon
is replayed. Nothing else replays, so no consumer can read walks that are
stale or short (the readers refuse them too).
"""

from __future__ import annotations

from replay import distributed
from replay.distributed.file_pool import local_pool
from replay.core.replay import replay_stage
from replay.core.streams import MODES, VARIANTS, check_modes
from replay.times import INF_US
from replay.store import db, walksets
from replay.store.failpoints import failpoint
from replay.text.tok import Tok, load_tokenizer
from replay.text.tokenize import tokenize_needed, tokenize_stage

# A command's default local engine (all cores) renders and replays in workers
# only a log at least this large (requests): below it, starting them costs more
# than they save.
TOKENIZE_WORKERS_FROM = 20_000
REPLAY_WORKERS_FROM = 20_000
#: what a rendering worker's failure leaves (``local_pool``'s ``then``)
RENDER_THEN = "Nothing of that chunk was stored: the next command redoes it, or run without --workers"


def as_tokenizer(tokenizer) -> Tok:
    """A ``Tok`` from a ``Tok``, a local tokenizer directory, or None (the default)."""
    return tokenizer if isinstance(tokenizer, Tok) else load_tokenizer(tokenizer)


def decoding_tokenizer(con, tokenizer) -> Tok:
    """The tokenizer to decode the stored prompts with (for ``--show-text``):
    ``tokenizer`` as a ``Tok``; with none named, the default — refused
    (ValueError) when the prompts were tokenized by another one, since decoding
    with a tokenizer other than the one that encoded gives wrong text."""
    tok = as_tokenizer(tokenizer)
    used = db.get_meta(con, "tokenizer")
    if tokenizer is None and used not in (None, tok.name):
        raise ValueError(f"the prompts were tokenized with {used}: give its directory (--tokenizer) "
                         "and rendering (--render, or --chat-template) to decode them")
    return tok


def prepare(con, modes=MODES, variants=("prompt",), horizon_us: int = INF_US,
            tokenizer=None, progress: bool = False, engine=None, address: str | None = None) -> dict:
    """Make sure prompts are tokenized and the walks of every (variant, mode) are
    current for ``horizon_us`` (exact for every TTL up to it). ``tokenizer``: a
    ``Tok``, a directory, a ``TokenizerSpec`` (directory and rendering:
    ``--render``; the rendering is part of the tokenizer's name, so a change of
    either re-tokenizes), or None (what the database holds). Returns what ran
    (``tokenize``, ``replay``: the stages' summaries).

    ``engine`` computes the walk sets found stale (``replay.distributed``):
    None — the enclosing ``engine_context``'s, else this process; ``"local"``;
    ``"ray"`` (with ``address``: that cluster's, else a local cluster started
    for this call and shut down after it); or an engine object. The engine
    changes how the rows are computed, never which sets are current."""
    modes = check_modes(modes)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown walk variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    keys = [(v, m) for v in variants for m in modes]
    done: dict = {}
    with distributed.using(engine, address) as eng:
        local = getattr(eng, "name", None) == "local"
        # (the default engine of a command, all cores, works only where that pays;
        # an engine asked for by name or object always does)
        when_worth = getattr(eng, "when_worth", False)
        pending = tokenize_needed(con)
        tok = as_tokenizer(tokenizer) if (pending or tokenizer is not None) else None
        if tok is not None and (pending or db.get_meta(con, "tokenizer") not in (None, tok.name)):
            # (the neutral rendering's parts are rendered by the encoder process while
            # ingest runs, as are a chat template's requests ahead: a pool of renderers
            # costs CPU there and saves nothing; DeepSeek's encoding renders here)
            workers = eng.workers if local and tok.render not in ("neutral", "template") and not (
                when_worth and db.untokenized(con) < TOKENIZE_WORKERS_FROM) else None
            with local_pool(workers, failed=distributed.WorkerFailed, then=RENDER_THEN) as pool:
                done["tokenize"] = tokenize_stage(con, tok, progress=progress, pool=pool)
            failpoint("prepare.tokenized")
        todo = walksets.stale(con, keys, horizon_us)
        if todo:
            if when_worth and con.execute("SELECT count(*) FROM requests").fetchone()[0] < REPLAY_WORKERS_FROM:
                eng = None  # (a small log: the single pass is done before the workers would start)
            if local and eng is not None and tok is not None:
                tok.close()  # (its encoder process is done: its memory goes to the replay's workers)
            done["replay"] = _replay(con, todo, horizon_us, progress, eng)
            failpoint("prepare.replayed")
    return done


def _replay(con, keys, horizon_us: int, progress: bool, engine=None):
    """One replay pass over the modes and variants of ``keys`` (a pass walks
    every mode of every variant it is given; sets it redoes are recorded anew)."""
    modes = tuple(m for m in MODES if any(k[1] == m for k in keys))
    variants = tuple(v for v in VARIANTS if any(k[0] == v for k in keys))
    return replay_stage(con, modes=modes, variants=variants, horizon_us=horizon_us, progress=progress,
                        engine=engine)
