"""Replay stage: every prompt through its stream's trie, steps stored in `walks`.

One pass over the requests in time order (ties in input order) walks each
prompt through one trie per stream mode. The result per (variant, mode,
request) is the step function "matched depth as a function of idle gap" from
which `L_τ` follows for every TTL (see ``trie.py``) — everything later (sweep,
profiles, diagnosis) is derived from that small table without replaying again.
"""

from __future__ import annotations

import gc
import itertools
import math
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa

from replay.store import db
from replay.core.trie import COMPILED, Trie

if COMPILED:  # the same prompt assembly, compiled beside the trie
    from replay.core._trie import extend as _compiled_extend
else:
    _compiled_extend = None

MODES = ("tenant", "key", "session", "global")
VARIANTS = ("prompt", "prompt+output")
MOONCAKE_BLOCK = 512
RECENT_CONVERSATIONS = 512  # latest prompt kept per (tenant, session or key), to build the next one from
WALKS_PER_INSERT = 2_000  # requests whose walks the replay stage holds before it stores them


def stream_key(mode: str, tenant: str, key: str | None, session: str | None) -> str:
    """The stream a request belongs to under ``mode`` (semantics.md, "Streams")."""
    if mode == "tenant":
        return f"tenant:{tenant}"
    if mode == "key":
        return f"key:{key}" if key is not None else f"tenant:{tenant}"
    if mode == "session":
        return f"session:{session}" if session is not None else f"tenant:{tenant}"
    if mode == "global":
        return "global"
    raise ValueError(f"unknown stream mode {mode!r}; choose from {', '.join(MODES)}")


@dataclass
class Prompt:
    """One request as the replay sees it."""
    request_id: int
    ts: float
    tenant: str
    key: str | None
    session: str | None
    symbols: np.ndarray            # token ids, or negative block ids for block traces
    cum: np.ndarray | None         # symbol depth -> token depth (block traces only)
    output: np.ndarray | None      # generated symbols, when the log has them
    n_tokens: int
    # the first ``shared`` symbols are those of the conversation's previous prompt,
    # which had (ts, key, session) = ``previous``: where that one was walked, they
    # are a path of the trie already (replay_prompts)
    shared: int = 0
    previous: tuple[float, str | None, str | None] | None = None


def mooncake_symbols(block_ids, input_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Block ids as negative symbols, with cumulative token depths (last block partial)."""
    ids = np.asarray(block_ids, dtype=np.int64)
    sizes = np.full(len(ids), MOONCAKE_BLOCK, dtype=np.int64)
    if len(ids):
        sizes[-1] = input_length - MOONCAKE_BLOCK * (len(ids) - 1)
    cum = np.concatenate([[0], np.cumsum(sizes)])
    return -(ids + 1), cum


class SegmentStore:
    """seg_id -> token array, loaded once from the `segments` table."""

    def __init__(self, con):
        tbl = db.arrow(con, "SELECT seg_id, tokens FROM segments")
        toks = tbl.column("tokens").combine_chunks()
        offsets = toks.offsets.to_numpy()
        values = toks.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        self._tokens: dict[int, np.ndarray] = {
            sid: values[offsets[i]:offsets[i + 1]] for i, sid in enumerate(tbl.column("seg_id").to_numpy().tolist())}

    def concat(self, seg_ids) -> np.ndarray:
        """The tokens of ``seg_ids`` in order (a new array: measured faster here than
        gathering from one flat array by index)."""
        if not len(seg_ids):
            return np.empty(0, dtype=np.int32)
        if len(seg_ids) == 1:
            return self._tokens[seg_ids[0]].copy()
        return np.concatenate(itemgetter(*seg_ids)(self._tokens))

    def extend(self, seg_ids: list[int], prev: tuple[list[int], np.ndarray] | None) -> tuple[np.ndarray, int]:
        """:meth:`extend_py`, compiled when the trie is: one allocation filled by
        memcpy (a day's 3,227 prompts: 0.21-0.22 s -> 0.13-0.15 s, most of what is
        left the first touch of 130 MB of new arrays)."""
        if _compiled_extend is not None:
            return _compiled_extend(self._tokens, seg_ids, prev)
        return self.extend_py(seg_ids, prev)

    def extend_py(self, seg_ids: list[int], prev: tuple[list[int], np.ndarray] | None) -> tuple[np.ndarray, int]:
        """``concat(seg_ids)``, copying the part shared with ``prev`` (an earlier
        prompt's segment ids and tokens) in one piece when ``seg_ids`` repeats all
        of prev's segments but its last (an agent's next turn: the same
        conversation, then the reply and new messages instead of the generation
        marker) — joining hundreds of segments again is most of the cost. Otherwise
        the segments it shares with prev from the start are copied in one piece.
        Also returns how many leading tokens are prev's."""
        if prev is not None:
            psegs, ptoks = prev
            n = len(psegs) - 1
            if 0 < n < len(seg_ids) and seg_ids[:n] == psegs[:n]:
                cut = len(ptoks) - len(self._tokens[psegs[-1]])
            else:  # an earlier message changed (an agent trimming old tool output, say)
                n = next((i for i, (a, b) in enumerate(zip(seg_ids, psegs)) if a != b), min(len(seg_ids), len(psegs)))
                if n == 0:
                    return self.concat(seg_ids), 0
                cut = sum(map(len, itemgetter(*psegs[:n])(self._tokens))) if n > 1 else len(self._tokens[psegs[0]])
            rest = seg_ids[n:]
            if not rest:
                return ptoks[:cut].copy(), cut
            return np.concatenate([ptoks[:cut], *itemgetter(*rest)(self._tokens)] if len(rest) > 1
                                  else [ptoks[:cut], self._tokens[rest[0]]]), cut
        return self.concat(seg_ids), 0

    def __len__(self) -> int:
        return len(self._tokens)


def iter_prompts(con, with_output: bool = False, chunk: int = 2_000) -> Iterator[Prompt]:
    """All requests in processing order (time, then input order), as symbol arrays."""
    segs = SegmentStore(con)
    missing = db.untokenized(con)
    if missing:
        raise RuntimeError(f"{missing} requests are not tokenized yet: run the tokenize stage first")
    out_col = "p.output_seg_ids" if with_output else "NULL"
    last: OrderedDict = OrderedDict()
    for tbl in time_ordered_chunks(con, f"""
            r.request_id, r.ts, r.tenant, r.prompt_cache_key, r.session, r.format,
            p.seg_ids, {out_col} AS output_seg_ids, r.block_ids, r.input_length""", chunk):
        # Arrow, not Python lists: a chunk's token-id lists stay 8 bytes an id
        cols = {c: db.list_rows(tbl.column(c)) for c in ("seg_ids", "output_seg_ids", "block_ids")}
        meta = {c: tbl.column(c).to_pylist() for c in
                ("request_id", "ts", "tenant", "prompt_cache_key", "session", "format", "input_length")}
        seg_ids, out_seg_ids, block_ids = cols["seg_ids"], cols["output_seg_ids"], cols["block_ids"]
        for k, rid in enumerate(meta["request_id"]):
            output, shared, previous = None, 0, None
            if meta["format"][k] == "mooncake":
                symbols, cum = mooncake_symbols(_or_empty(block_ids[k]), int(meta["input_length"][k] or 0))
                n = int(cum[-1])
            else:
                ids = _or_empty(seg_ids[k]).tolist()
                conv = (meta["tenant"][k], meta["session"][k] or meta["prompt_cache_key"][k])
                before = last.get(conv)
                (symbols, shared), cum = segs.extend(ids, before and before[:2]), None
                if shared:
                    previous = before[2]
                # the conversation's latest prompt, for its next turn
                last[conv] = (ids, symbols, (meta["ts"][k], meta["prompt_cache_key"][k], meta["session"][k]))
                last.move_to_end(conv)
                if len(last) > RECENT_CONVERSATIONS:
                    last.popitem(last=False)
                n = len(symbols)
                out_ids = _or_empty(out_seg_ids[k]).tolist()
                if len(out_ids):
                    output = segs.concat(out_ids)
            yield Prompt(rid, meta["ts"][k], meta["tenant"][k], meta["prompt_cache_key"][k],
                         meta["session"][k], symbols, cum, output, n, shared, previous)


_EMPTY = np.zeros(0, dtype=np.int64)


def _or_empty(row: np.ndarray | None) -> np.ndarray:
    return _EMPTY if row is None else row


def time_ordered_chunks(con, columns: str, chunk: int = 2_000):
    """Arrow tables of ``requests r LEFT JOIN prompts p`` (``columns`` must start
    with ``r.request_id``) in processing order — time, then input order.

    Only the keys are sorted; rows are fetched chunk by chunk in that order, so
    memory stays bounded by the chunk — one ORDER BY over a week's token-id lists
    does not fit a capped DuckDB. A chunk's ids, with their places, are handed
    to DuckDB as an Arrow table it joins with inside the chunk's id range (zone
    maps skip the rest) and orders by: at a week's 109 chunks, each spanning ~10×
    as many ids as it holds (a day's files interleave in time), 0.015 s a chunk,
    against 0.2 s for the same ids written out as ``IN (…)`` and 0.1 s for the
    whole range.
    """
    order = con.execute("SELECT request_id FROM requests ORDER BY ts, request_id").fetchnumpy()["request_id"]
    name = f"__replay_chunk_ids_{next(_CHUNK_VIEWS)}"  # generators of one connection may interleave
    for start in range(0, len(order), chunk):
        ids = order[start:start + chunk]
        con.register(name, pa.table({"request_id": pa.array(ids, pa.int64()),
                                     "__pos": pa.array(np.arange(len(ids), dtype=np.int64))}))
        try:
            # DuckDB puts the rows in order (Arrow's take on the fetched table's
            # list columns cost ~0.07 s a chunk)
            tbl = db.arrow(con, f"SELECT {columns} FROM requests r LEFT JOIN prompts p USING (request_id) "
                                f"JOIN {name} q ON q.request_id = r.request_id "
                                f"WHERE r.request_id BETWEEN {int(ids.min())} AND {int(ids.max())} "
                                f"ORDER BY q.__pos")
        finally:
            con.unregister(name)
        yield tbl


_CHUNK_VIEWS = itertools.count()


@dataclass
class ReplaySummary:
    requests: int
    modes: tuple[str, ...]
    variants: tuple[str, ...]
    prompt_tokens: int
    seconds: float
    trie_nodes: dict[str, int]


def replay_prompts(prompts, modes=MODES, variants=("prompt",), horizon: float = math.inf,
                   progress=None, sink=None, flush_every: int = WALKS_PER_INSERT) -> dict[tuple[str, str], list]:
    """Pure core: walk prompts (already in processing order) and return, per
    (variant, mode), the list of (request_id, stream, ts, n_tokens, gaps, depths).

    With ``sink``, those rows go to ``sink(rows)`` instead (the same dict, a part
    of the log at a time: every ``flush_every`` requests and at the end), so
    memory holds a part's rows rather than the whole log's; only ``_nodes`` is
    returned then."""
    with _collector_paused():
        return _replay_prompts(prompts, modes, variants, horizon, progress, sink, flush_every)


@contextmanager
def _collector_paused():
    """The tries are millions of small objects without reference cycles (a node
    points only at its children), freed by reference counting as they are pruned;
    Python's cycle collector would still traverse them all again and again as
    they grow: a week's replay took 70 s with it running, 58 s without. (The
    walks' rows, tuples of lists, likewise.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _replay_prompts(prompts, modes, variants, horizon: float, progress, sink, flush_every: int) -> dict:
    tries: dict[tuple[str, str], dict[str, Trie]] = {(v, m): {} for v in variants for m in modes}
    out: dict[tuple[str, str], list] = {vm: [] for vm in tries}
    last_sweep = -math.inf
    for walked, p in enumerate(prompts, 1):
        if horizon != math.inf and p.ts - last_sweep > horizon / 2:
            # A trie prunes itself when walked; streams that went quiet (a finished
            # session) are never walked again, so sweep them all now and then:
            # memory then follows the TTL window, not the number of streams seen.
            last_sweep = p.ts
            for streams in tries.values():
                for s in list(streams):
                    streams[s].prune(p.ts)
                    if not streams[s].root.children:
                        del streams[s]
        for v in variants:
            insert = None
            if v == "prompt+output" and p.output is not None and len(p.output):
                insert = np.concatenate([p.symbols, p.output.astype(p.symbols.dtype, copy=False)])
            for m in modes:
                s = stream_key(m, p.tenant, p.key, p.session)
                streams = tries[(v, m)]
                trie = streams.get(s)
                if trie is None:
                    trie = streams[s] = Trie(horizon)
                # The previous prompt of the conversation was walked into this trie
                # when it went to the same stream; within the horizon nothing of its
                # path has been pruned since, so the symbols it shares are a path here.
                known = (p.shared if p.shared and p.ts - p.previous[0] <= horizon
                         and stream_key(m, p.tenant, p.previous[1], p.previous[2]) == s else 0)
                steps = trie.walk(p.symbols, p.ts, insert=insert, cum=p.cum, known=known)
                out[(v, m)].append((p.request_id, s, p.ts, p.n_tokens,
                                    [g for g, _ in steps], [d for _, d in steps]))
        if progress is not None:
            progress.update(1)
        if sink is not None and walked % flush_every == 0:
            sink(out)
            out = {vm: [] for vm in tries}
    if sink is not None:
        if any(out.values()):
            sink(out)
        out = {}
    out["_nodes"] = {f"{v}/{m}": sum(t.nodes for t in st.values()) for (v, m), st in tries.items()}
    return out


def replay_stage(con, modes=MODES, variants=("prompt",), horizon: float = math.inf,
                 progress: bool = False) -> ReplaySummary:
    """Recompute `walks` for the given modes/variants from `requests` + `prompts`."""
    t0 = time.perf_counter()
    # the walks are stored as they come (a part of the log at a time, so memory
    # does not hold a week's rows): until the last part is in, the fingerprint
    # says they are not current, so a failed or stopped replay is done again
    con.execute("DELETE FROM meta WHERE key = 'replay_fingerprint'")
    _delete_walks(con, [(v, m) for v in variants for m in modes])
    checkpoint = _background_checkpoint(con)
    try:
        n = con.execute("SELECT count(*) FROM requests").fetchall()[0][0]
        bar = None
        if progress:
            from tqdm.auto import tqdm  # (~0.04 s to import: only when shown)

            bar = tqdm(total=n, desc="replay", unit="req", leave=False)
        with_output = "prompt+output" in variants
        result = replay_prompts(iter_prompts(con, with_output=with_output), modes, variants, horizon, bar,
                                sink=lambda rows: _insert_walks(con, rows), flush_every=WALKS_PER_INSERT)
        if bar is not None:
            bar.close()
    finally:
        checkpoint.join()  # (also on an error: the caller may close the connection next)
    nodes = result.pop("_nodes")
    db.set_meta(con, "replay_horizon", "inf" if horizon == math.inf else repr(horizon))
    db.set_meta(con, "replay_fingerprint", fingerprint(con))
    prompt_tokens = con.execute(
        "SELECT coalesce(sum(prompt_tokens),0) FROM walks WHERE mode = ? AND variant = ?",
        [modes[0], variants[0]]).fetchall()[0][0]
    return ReplaySummary(n, tuple(modes), tuple(variants), int(prompt_tokens),
                         time.perf_counter() - t0, nodes)


def _background_checkpoint(con) -> threading.Thread:
    """Start a CHECKPOINT on a second connection to the database, in a thread.

    What the tokenize stage wrote is still in the write-ahead log, and the first
    commit of this stage past DuckDB's threshold would checkpoint it on this core
    (a day's: ~0.11 s, a sixth of the replay). DuckDB does it without the
    interpreter lock, so in a thread it runs on the other core while the walks
    run on this one. When it cannot run now (a transaction is open), DuckDB
    checkpoints later, as it would have."""
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


def store_walks(con, result: dict) -> None:
    """Replace the `walks` rows of each (variant, mode) in ``result``."""
    with _collector_paused():  # a week's rows are millions of tuples and lists
        _store_walks(con, result)


def _store_walks(con, result: dict) -> None:
    _delete_walks(con, result)
    _insert_walks(con, result)


def _delete_walks(con, keys) -> None:
    for v, m in keys:
        con.execute("DELETE FROM walks WHERE variant = ? AND mode = ?", [v, m])


def _insert_walks(con, result: dict) -> None:
    """Add the rows of every (variant, mode) in ``result`` to `walks`, in one insert."""
    parts = []
    for (v, m), rows in result.items():
        if not rows:
            continue
        rid, stream, ts, ntok, gaps, depths = zip(*rows)
        parts.append(pa.table({
            "variant": pa.array([v] * len(rows)), "mode": pa.array([m] * len(rows)),
            "request_id": pa.array(rid, pa.int64()), "stream": pa.array(stream),
            "ts": pa.array(ts, pa.float64()), "prompt_tokens": pa.array(ntok, pa.int64()),
            "gaps": pa.array(gaps, pa.list_(pa.float64())),
            "depths": pa.array(depths, pa.list_(pa.int64())),
        }))
    if parts:
        tbl = pa.concat_tables(parts)  # noqa: F841
        con.execute("INSERT INTO walks SELECT * FROM tbl")  # DuckDB reads the Arrow table by name


def fingerprint(con) -> str:
    """Changes whenever the requests or their tokenization change."""
    r = con.execute("SELECT count(*), coalesce(max(request_id), -1) FROM requests").fetchall()[0]
    p = con.execute("SELECT count(*), coalesce(sum(n_tokens), 0) FROM prompts").fetchall()[0]
    return f"{r[0]}:{r[1]}:{p[0]}:{p[1]}:{db.get_meta(con, 'tokenizer', '')}"


def walks_current(con, modes, variants, horizon: float) -> bool:
    """True when `walks` already holds these modes/variants for the current data."""
    if db.get_meta(con, "replay_fingerprint") != fingerprint(con):
        return False
    h = db.get_meta(con, "replay_horizon", "inf")
    if (math.inf if h == "inf" else float(h)) < horizon:
        return False
    have = set(con.execute("SELECT DISTINCT variant, mode FROM walks").fetchall())
    return all((v, m) in have for v in variants for m in modes)
