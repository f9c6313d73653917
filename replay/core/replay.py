"""Replay: every prompt through its cache's trie, steps stored in `walks`.

One pass over the requests in time order (ties in input order) walks each
prompt through one trie per (variant, stream mode) and cache — the pair
(stream key, model), since a cache belongs to one model. The result per
(variant, mode, request) is the step function "matched depth as a function of
idle gap" from which ``L_τ`` follows for every TTL (``replay.core.hits``):
everything later (sweep, profiles, diagnosis) is derived from that small table
without replaying again. Each step also carries the *origin* of that part of
the prefix: whether its last writer was the walking request's own session,
another session of its tenant, or another tenant (``streams.ORIGINS``; the hit origin
of docs/origin.md), split where the origin changes. Which sets are current is
recorded in `walk_sets` (``replay.store.walksets``); ``replay.prepare``
decides what to replay.
"""

from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb
import numpy as np

from replay.core.prompts import iter_prompts
from replay.core.streams import MODES, stream_key
from replay.core._trie import Writers
from replay.times import INF_US
from replay.core.trie import Trie
from replay.core.walks import delete_walks, insert_walks
from replay.store import walksets
from replay.store.failpoints import failpoint

WALKS_PER_INSERT = 2_000  # requests whose walks the replay stage holds before it stores them


@dataclass
class ReplaySummary:
    requests: int
    modes: tuple[str, ...]
    variants: tuple[str, ...]
    prompt_tokens: int
    seconds: float
    trie_nodes: dict[str, int]


def replay_prompts(prompts, modes=MODES, variants=("prompt",), horizon_us: int = INF_US,
                   progress=None, sink=None, flush_every: int = WALKS_PER_INSERT) -> dict[tuple[str, str], list]:
    """Pure core: walk prompts (already in processing order) and return, per
    (variant, mode), the list of rows (request_id, stream, model, ts_us,
    n_tokens, gaps, depths).

    With ``sink``, those rows go to ``sink(rows)`` instead (the same dict, a part
    of the log at a time: every ``flush_every`` requests and at the end), so
    memory holds a part's rows rather than the whole log's; only ``_nodes`` is
    returned then."""
    with _collector_paused():
        return _replay_prompts(prompts, modes, variants, int(horizon_us), progress, sink, flush_every)


@contextmanager
def _collector_paused():
    """The tries are millions of small objects without reference cycles (a node
    points only at its children), freed by reference counting as they are
    pruned; Python's cycle collector would still traverse them all again and
    again as they grow. (The walks' rows, tuples of lists, likewise.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _replay_prompts(prompts, modes, variants, horizon: int, progress, sink, flush_every: int) -> dict:
    walker = Replayer(modes, variants, horizon)
    for walked, p in enumerate(prompts, 1):
        walker.walk(p)
        if progress is not None:
            progress.update(1)
        if sink is not None and walked % flush_every == 0:
            sink(walker.take())
    out = walker.take()
    if sink is not None:
        if any(out.values()):
            sink(out)
        out = {}
    out["_nodes"] = walker.nodes()
    return out


class Replayer:
    """The replay's state between prompts: one trie per (variant, mode) and cache,
    and who wrote what. :meth:`walk` takes the prompts one at a time in
    processing order (``replay_prompts`` over a whole log; a streamed partition
    a batch at a time, ``replay.core.streamed``)."""

    def __init__(self, modes, variants, horizon: int = INF_US):
        self.modes, self.variants, self.horizon = tuple(modes), tuple(variants), int(horizon)
        self.tries: dict[tuple[str, str], dict[tuple[str, str | None], Trie]] = {
            (v, m): {} for v in self.variants for m in self.modes}
        self.out: dict[tuple[str, str], list] = {vm: [] for vm in self.tries}
        self.writers = Writers()
        self._last_sweep = None

    def walk(self, p) -> None:
        """Walk ``p`` through its cache's trie of every (variant, mode); its rows
        wait in :meth:`take`."""
        horizon, tries, writers = self.horizon, self.tries, self.writers
        if horizon < INF_US and (self._last_sweep is None or p.ts - self._last_sweep > horizon // 2):
            # A trie prunes itself when walked; caches that went quiet (a finished
            # session) are never walked again, so sweep them all now and then:
            # memory then follows the TTL window, not the number of caches seen.
            self._last_sweep = p.ts
            _prune_all(tries, p.ts)
        me = writers.code(p.tenant, p.session)
        held: dict = {}  # (the request's new symbols, copied once for all its tries)
        for v in self.variants:
            insert = None
            if v == "prompt+output" and p.output is not None and len(p.output):
                insert = np.concatenate([p.symbols, p.output.astype(p.symbols.dtype, copy=False)])
            for m in self.modes:
                s = stream_key(m, p.tenant, p.key, p.session)
                caches = tries[(v, m)]
                trie = caches.get((s, p.model))
                if trie is None:
                    trie = caches[(s, p.model)] = Trie(horizon)
                steps = trie.walk(p.symbols, p.ts, insert=insert, cum=p.cum, known=_known(p, m, s, horizon),
                                  owner=me, held=held)
                self.out[(v, m)].append((p.request_id, s, p.model, p.ts, p.n_tokens, *writers.split(steps, me)))

    def take(self) -> dict[tuple[str, str], list]:
        """The rows walked since the last call, per (variant, mode)."""
        out, self.out = self.out, {vm: [] for vm in self.tries}
        return out

    def nodes(self) -> dict[str, int]:
        return {f"{v}/{m}": sum(t.nodes for t in st.values()) for (v, m), st in self.tries.items()}


def _known(p, mode: str, stream: str, horizon: int) -> int:
    """How many leading symbols are a path of this trie already: those shared with
    the conversation's previous prompt, when that one was walked into the same
    cache (same stream and model) within the horizon — nothing of its path has
    been pruned since (prune and walk drop only nodes idle past the horizon)."""
    if not p.shared:
        return 0
    prev_ts, prev_key, prev_session, prev_model = p.previous
    if p.ts - prev_ts > horizon or prev_model != p.model:
        return 0
    return p.shared if stream_key(mode, p.tenant, prev_key, prev_session) == stream else 0


def _prune_all(tries: dict, now: int) -> None:
    for caches in tries.values():
        for c in list(caches):
            caches[c].prune(now)
            if not caches[c].root.children:
                del caches[c]


def replay_stage(con, modes=MODES, variants=("prompt",), horizon_us: int = INF_US,
                 progress: bool = False, engine=None) -> ReplaySummary:
    """Recompute the `walks` of these (variant, mode) sets from `requests` +
    `prompts` and record them current (``walk_sets``) for ``horizon_us``.

    ``engine`` (None: this process, one pass) computes the same rows elsewhere
    (``replay.distributed``: ``engine.replay(con, modes, variants, horizon_us,
    sink, bar)`` hands every row to ``sink`` and returns ``{"_nodes": ...}``, or
    raises); the rows are stored and the sets recorded here either way.

    The walks are stored as they come (a part of the log at a time, so memory
    does not hold a week's rows); the sets are recorded only once the last part
    is in, so a failed or stopped replay leaves them stale, not half-current."""
    t0 = time.perf_counter()
    keys = [(v, m) for v in variants for m in modes]
    fingerprint = walksets.data_fingerprint(con)
    delete_walks(con, keys)
    checkpoint = _background_checkpoint(con)
    try:
        n = con.execute("SELECT count(*) FROM requests").fetchone()[0]
        bar = None
        if progress:
            from tqdm.auto import tqdm  # (imported only when shown)

            bar = tqdm(total=n, desc="replay", unit="req", leave=False)
        if engine is None:
            result = replay_prompts(iter_prompts(con, with_output="prompt+output" in variants), modes, variants,
                                    horizon_us, bar, sink=lambda rows: _insert(con, rows),
                                    flush_every=WALKS_PER_INSERT)
        else:
            result = engine.replay(con, modes, variants, horizon_us, lambda rows: _insert(con, rows), bar,
                                   reset=lambda: delete_walks(con, keys))
        if bar is not None:
            bar.close()
    finally:
        checkpoint.join()  # (also on an error: the caller may close the connection next)
    nodes = result.pop("_nodes")
    replayed, prompt_tokens = con.execute(
        "SELECT count(*), coalesce(sum(prompt_tokens), 0) FROM walks WHERE mode = ? AND variant = ?",
        [modes[0], variants[0]]).fetchone()
    walksets.record(con, keys, horizon_us, fingerprint, replayed)
    return ReplaySummary(int(replayed), tuple(modes), tuple(variants), int(prompt_tokens),
                         time.perf_counter() - t0, nodes)


def _insert(con, rows) -> None:
    insert_walks(con, rows)
    failpoint("replay.walks_inserted")  # (the sets are not recorded yet)


def _background_checkpoint(con) -> threading.Thread:
    """Start a CHECKPOINT on a second connection to the database, in a thread.

    What the tokenize stage wrote is still in the write-ahead log, and the first
    commit of this stage past DuckDB's threshold would checkpoint it on this
    core; DuckDB does it without the interpreter lock, so in a thread it runs on
    the other core while the walks run on this one. When it cannot run now (a
    transaction is open), DuckDB checkpoints later, as it would have."""
    cur = con.cursor()  # (made here: the thread touches only its own connection)

    def run() -> None:
        try:
            cur.execute("CHECKPOINT")
        except duckdb.Error:
            pass
        finally:
            cur.close()

    thread = threading.Thread(target=run, name="replay-checkpoint", daemon=True)
    thread.start()
    return thread


def store_walks(con, result: dict, horizon_us: int = INF_US) -> None:
    """Replace the `walks` rows of each (variant, mode) in ``result`` (from
    :func:`replay_prompts` without a sink) and record them current."""
    keys = [k for k in result if k != "_nodes"]
    fingerprint = walksets.data_fingerprint(con)
    with _collector_paused():  # a week's rows are millions of tuples and lists
        delete_walks(con, keys)
        insert_walks(con, {k: result[k] for k in keys})
    for k in keys:
        walksets.record(con, [k], horizon_us, fingerprint, len(result[k]))
