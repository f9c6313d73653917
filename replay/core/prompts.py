"""The replay's input: every replayable request, in processing order, as a symbol array.

Text requests are their prompt's tokens (the concatenation of its segments);
block traces (Mooncake, Bailian, RAGPulse, kv-cache-tester: requests with
``block_ids``) are their block ids, made negative so they never meet token ids,
with each block's token depth in ``cum`` (``block_lengths``, or Mooncake's
512-token rule); tokens beyond the blocks are prompt tokens no walk reaches. Requests are read in
time order, ties in input order (semantics.md), a chunk at a time. Requests
set aside by the tokenize stage (unrenderable) are not replayed.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from operator import itemgetter
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa

from replay.core._trie import extend as _extend
from replay.store import db

# (the type and the block rules live in replay.core.prompt, which imports no database)
from replay.core.prompt import (MOONCAKE_BLOCK, RECENT_CONVERSATIONS, Prompt, altered, block_symbols,  # noqa: F401
                                light, mooncake_symbols, trace_blocks)

#: the requests the replay walks: those with a prompt row, and block traces (which need none)
REPLAYABLE = "(r.block_ids IS NOT NULL OR p.request_id IS NOT NULL)"


class SegmentStore:
    """seg_id -> token array, loaded once from the `segments` table (or from
    ``table``, rows of it: :meth:`read_table`)."""

    def __init__(self, con=None, table: pa.Table | None = None):
        self._tokens: dict[int, np.ndarray] = {}
        self.add(self.read_table(con) if table is None else table)

    def add(self, tbl: pa.Table, copy: bool = False) -> int:
        """Take the segments of ``tbl`` (rows of the `segments` table) too, as
        views of its buffer (``copy``: arrays of their own, so that dropping some
        frees them); returns how many tokens they hold."""
        if not tbl.num_rows:
            return 0
        toks = tbl.column("tokens").combine_chunks()
        offsets = toks.offsets.to_numpy()
        values = toks.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        cut = (lambda a, b: values[a:b].copy()) if copy else (lambda a, b: values[a:b])
        self._tokens.update(
            (sid, cut(offsets[i], offsets[i + 1])) for i, sid in enumerate(tbl.column("seg_id").to_numpy().tolist()))
        return int(offsets[-1] - offsets[0])

    def reach(self, stop: int) -> None:
        """``iter_prompts`` has read the requests before position ``stop`` (this
        store holds every segment already; a window reads them as they come)."""

    def forget_before(self, pos: int) -> list[int]:
        """The requests before position ``pos`` are done with: the segments no
        later one uses, dropped (here: none; a window drops them)."""
        return []

    def table(self, seg_ids) -> pa.Table:
        """The rows of the `segments` table for ``seg_ids`` (what :meth:`add` takes)."""
        ids = [int(s) for s in seg_ids]
        parts = [self._tokens[s] for s in ids]
        offsets = np.zeros(len(parts) + 1, dtype=np.int32)
        np.cumsum([len(x) for x in parts], out=offsets[1:])
        values = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
        return pa.table({"seg_id": pa.array(ids, pa.uint64()),
                         "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))})

    @staticmethod
    def read_table(con) -> pa.Table:
        return db.arrow(con, "SELECT seg_id, tokens FROM segments")

    def tokens(self, seg_id: int) -> np.ndarray:
        return self._tokens[seg_id]

    def lengths(self) -> dict[int, int]:
        return {s: len(a) for s, a in self._tokens.items()}

    def concat(self, seg_ids) -> np.ndarray:
        """The tokens of ``seg_ids`` in order (a new array)."""
        if not len(seg_ids):
            return np.empty(0, dtype=np.int32)
        if len(seg_ids) == 1:
            return self._tokens[seg_ids[0]].copy()
        return np.concatenate(itemgetter(*seg_ids)(self._tokens))

    def extend(self, seg_ids: list[int], prev: tuple[list[int], np.ndarray] | None) -> tuple[np.ndarray, int]:
        """``concat(seg_ids)``, and how many leading tokens are ``prev``'s (an
        earlier prompt's segment ids and tokens), copied from prev in one piece
        (compiled beside the trie: ``replay.core._trie.extend``)."""
        return _extend(self._tokens, seg_ids, prev)

    def __len__(self) -> int:
        return len(self._tokens)


class Conversations:
    """Each conversation's latest prompt (of the ``RECENT_CONVERSATIONS`` latest
    conversations), to build its next prompt from: an agent resends the whole
    conversation each turn, and copying the part shared with the previous
    prompt in one piece is most of the saving (``SegmentStore.extend``)."""

    def __init__(self, segs: SegmentStore):
        self.segs = segs
        self._last: OrderedDict = OrderedDict()  # conversation -> (seg ids, symbols, its caller's note)

    def assemble(self, conv, ids: list[int], note=None) -> tuple[np.ndarray, int, object]:
        """The symbols of ``ids``, the conversation's next prompt; how many leading
        symbols are its previous prompt's; and the ``note`` that one was given."""
        before = self._last.get(conv)
        symbols, shared = self.segs.extend(ids, before and before[:2])
        self._last[conv] = (ids, symbols, note)
        self._last.move_to_end(conv)
        if len(self._last) > RECENT_CONVERSATIONS:
            self._last.popitem(last=False)
        return symbols, shared, before and before[2]


class NotTokenized(RuntimeError):
    """Requests wait for the tokenize stage."""


def prompt_columns(with_output: bool) -> str:
    """What the replay reads of ``requests r LEFT JOIN prompts p`` per request
    (:func:`time_ordered_chunks`' columns; ``replay.distributed.local_engine``
    exports them for its worker processes)."""
    out_col = "p.output_seg_ids" if with_output else "NULL"
    return f"""
            r.request_id, r.ts_us, r.tenant, r.prompt_cache_key, r.session, r.model, r.format,
            p.seg_ids, {out_col} AS output_seg_ids, r.block_ids, r.block_lengths, r.input_length"""


def iter_prompts(con, with_output: bool = False, chunk: int = 2_000,
                 segs: SegmentStore | None = None) -> Iterator[Prompt]:
    """Every replayable request in processing order (time, then input order), as
    symbol arrays (``segs``: the segments already read, else read here; or a
    ``replay.core.segment_window.SegmentWindow``, which this tells how far the
    requests were read)."""
    missing = db.untokenized(con)
    if missing:
        raise NotTokenized(f"{missing} requests are not tokenized yet: run the tokenize stage first")
    segs = SegmentStore(con) if segs is None else segs
    yield from prompts_of(time_ordered_chunks(con, prompt_columns(with_output), chunk), segs)


def prompts_of(tables, segs: SegmentStore, want=None) -> Iterator[Prompt]:
    """The prompts of ``tables`` (Arrow tables of :func:`prompt_columns`, in
    processing order: :func:`time_ordered_chunks`, or the files a local engine's
    worker reads), assembled from ``segs``; with ``want``, only those of the
    requests for which ``want(tenant, key, session)`` is true (the others are
    not assembled: a conversation's requests share the three)."""
    conversations = Conversations(segs)
    read = 0
    for tbl in tables:
        read += tbl.num_rows
        segs.reach(read)  # (a window of the segments reads those this chunk uses first)
        # Arrow, not Python lists: a chunk's token-id lists stay 8 bytes an id
        cols = {c: db.list_rows(tbl.column(c)) for c in ("seg_ids", "output_seg_ids", "block_ids", "block_lengths")}
        meta = {c: tbl.column(c).to_pylist() for c in
                ("request_id", "ts_us", "tenant", "prompt_cache_key", "session", "model", "format",
                 "input_length")}
        for k, rid in enumerate(meta["request_id"]):
            ts, key, session, model = (meta[c][k] for c in ("ts_us", "prompt_cache_key", "session", "model"))
            if want is not None and not want(meta["tenant"][k], key, session):
                continue
            output, shared, previous, cum, block = None, 0, None, None, None
            seg_row = out_row = None  # (text prompts only)
            if cols["block_ids"][k] is not None:
                symbols, cum, block = block_symbols(cols["block_ids"][k], cols["block_lengths"][k],
                                                    int(meta["input_length"][k] or 0))
                n = max(int(cum[-1]), int(meta["input_length"][k] or 0))
            else:
                seg_row = _or_empty(cols["seg_ids"][k])
                symbols, shared, before = conversations.assemble((meta["tenant"][k], session or key),
                                                                 seg_row.tolist(), (ts, key, session, model))
                if shared:
                    previous = before
                n = len(symbols)
                out_row = cols["output_seg_ids"][k]
                if out_row is not None and len(out_row):
                    output = segs.concat(out_row.tolist())
            yield Prompt(rid, ts, meta["tenant"][k], key, session, symbols, cum, output, n, model,
                         shared, previous, block, seg_row, out_row)


_EMPTY = np.zeros(0, dtype=np.int64)


def _or_empty(row: np.ndarray | None) -> np.ndarray:
    return _EMPTY if row is None else row


def time_ordered_chunks(con, columns: str, chunk: int = 2_000):
    """Arrow tables of ``requests r LEFT JOIN prompts p`` (``columns`` must start
    with ``r.request_id``) over the replayable requests, in processing order —
    time, then input order.

    Only the keys are sorted; rows are fetched chunk by chunk in that order, so
    memory stays bounded by the chunk (one ORDER BY over a week's token-id lists
    does not fit a capped DuckDB). A chunk's ids, with their places, are handed
    to DuckDB as an Arrow table it joins with inside the chunk's id range (zone
    maps skip the rest) and orders by.
    """
    room = MemoryRoom(con)
    try:
        order, weight = processing_order(con, room)
        name = f"__replay_chunk_ids_{next(_CHUNK_VIEWS)}"  # generators of one connection may interleave
        for start, stop in _chunk_bounds(weight, chunk):
            ids = order[start:stop]
            yield room.run(lambda: _fetch_chunk(con, columns, ids, name))
    finally:
        room.restore()


def processing_order(con, room: "MemoryRoom | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """The replayable requests' ids in processing order (time, then input
    order), and each one's weight in a chunk (:func:`_chunk_bounds`)."""
    query = (f"SELECT r.request_id, r.ts_us, {_WEIGHT} AS w FROM requests r "
             f"LEFT JOIN prompts p USING (request_id) WHERE {REPLAYABLE}")
    got = (room.run if room is not None else (lambda q: q()))(lambda: db.arrow(con, query))
    rid, ts, weight = (got.column(c).to_numpy().astype(np.int64) for c in ("request_id", "ts_us", "w"))
    by_time = np.lexsort((rid, ts))
    return rid[by_time], weight[by_time]


def _fetch_chunk(con, columns: str, ids: np.ndarray, name: str):
    con.register(name, pa.table({"request_id": pa.array(ids, pa.int64()),
                                 "__pos": pa.array(np.arange(len(ids), dtype=np.int64))}))
    try:
        return db.arrow(con, f"SELECT {columns} FROM requests r LEFT JOIN prompts p USING (request_id) "
                             f"JOIN {name} q ON q.request_id = r.request_id "
                             f"WHERE r.request_id BETWEEN {int(ids.min())} AND {int(ids.max())} "
                             f"ORDER BY q.__pos")
    finally:
        con.unregister(name)


_CHUNK_VIEWS = itertools.count()
CHUNK_BLOCK_TOKENS = 1 << 26  # block-trace tokens a chunk holds at most (kv-cache-tester's: ~1M ids, 12 MB)
# a request's weight in a chunk: its tokens when it is a block trace (read without its lists)
_WEIGHT = "CASE WHEN r.block_ids IS NULL THEN 0 ELSE coalesce(r.input_length, 0) END"
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class MemoryRoom:
    """Memory for scans of long lists. DuckDB holds the items of 2,048 rows at
    once in each scanning thread, whatever the chunk: block traces with
    thousands of ids a request (kv-cache-tester's reach 13,000) need more than
    a small cap. A query that runs out is run again with the cap doubled, up to
    half the machine's memory; the cap is put back when the chunks are read."""

    def __init__(self, con):
        self.con = con
        self.before = db.arrow(con, "SELECT current_setting('memory_limit') AS m").column("m")[0].as_py()
        self.now = _bytes(self.before)
        self.raised = False

    def run(self, query):
        while True:
            try:
                return query()
            except duckdb.OutOfMemoryException:
                top = _physical_memory() // 2
                if self.now is None or self.now >= top:
                    raise
                self.now = min(2 * self.now, top)
                self._set(f"{self.now // 2**20}MiB")
                self.raised = True

    def restore(self) -> None:
        if self.raised:
            self._set(self.before)
            self.raised = False

    def _set(self, value: str) -> None:
        self.con.execute(f"SET memory_limit = '{value}'")
        if hasattr(self.con, "complete"):
            self.con.complete()


def _bytes(setting: str) -> int | None:
    num, _, unit = setting.strip().partition(" ")
    try:
        return int(float(num) * _UNITS[unit.upper() or "B"])
    except (ValueError, KeyError):
        return None


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _chunk_bounds(weight: np.ndarray, chunk: int):
    """(start, stop) of each chunk: at most ``chunk`` requests, and at most
    CHUNK_BLOCK_TOKENS tokens of block traces unless one request alone has more
    (their lists are long: kv-cache-tester's hold thousands of ids a request)."""
    start, n = 0, len(weight)
    cum = np.concatenate([[0], np.cumsum(weight)])
    while start < n:
        stop = min(start + chunk, n)
        if cum[stop] - cum[start] > CHUNK_BLOCK_TOKENS:
            stop = max(start + 1, int(np.searchsorted(cum, cum[start] + CHUNK_BLOCK_TOKENS, side="right")) - 1)
        yield start, stop
        start = stop
