"""The segments a stretch of the log uses, instead of every segment of the log.

A segment is used by the requests between its first and its last use in
processing order; on agent logs that span is short (a conversation's own
messages), so the segments alive at any point are a sliver of the log's
unique tokens (the week-like log: 0.6 M of 103 M). The streamed Ray replay's
driver reads the prompts through a :class:`SegmentWindow`: ``iter_prompts``
tells it how far the requests were read (:meth:`reach`: the segments first used
up to there are read from DuckDB), and the driver tells it when the prompts
before a point were all sent (:meth:`forget_before`: segments last used
before it are dropped). So the driver's memory follows the live segments, not
the log's unique tokens.

The first and last uses come from one query over the ``prompts`` table's
segment ids; the tokens of a stretch's new segments are read with a ``rowid``
range (DuckDB skips the row groups outside it) and the ids themselves.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa

from replay.core.prompts import MemoryRoom, SegmentStore, processing_order
from replay.store import db

_VIEWS = itertools.count()


class SegmentWindow(SegmentStore):
    """A :class:`SegmentStore` holding only the segments between their first and
    last use around the requests being read (see the module docstring)."""

    def __init__(self, con, with_output: bool = False):
        self._tokens = {}
        self.con = con
        order, _ = processing_order(con)
        name = f"__replay_window_{next(_VIEWS)}"
        con.register(name, pa.table({"request_id": pa.array(order, pa.int64()),
                                     "pos": pa.array(np.arange(len(order), dtype=np.int64))}))
        used = "p.seg_ids || coalesce(p.output_seg_ids, [])" if with_output else "p.seg_ids"
        # a segment is still needed at the next request of its conversation: iter_prompts
        # builds that prompt from this one's (``Conversations``), looking up its segments
        conversation = ("r.tenant, CASE WHEN r.session IS NULL OR r.session = '' THEN r.prompt_cache_key "
                        "ELSE r.session END")
        room = MemoryRoom(con)  # (a week's 33 M segment uses may not fit DuckDB's cap: it is raised, then put back)
        try:
            got = room.run(lambda: db.arrow(con, f"""
                WITH c AS (SELECT q.request_id, q.pos,
                                  coalesce(lead(q.pos) OVER (PARTITION BY {conversation} ORDER BY q.pos), q.pos) AS until
                           FROM {name} q JOIN requests r USING (request_id)
                           WHERE q.request_id IN (SELECT request_id FROM prompts)),
                     u AS (SELECT u.seg_id, min(u.pos) AS first, max(u.until) AS last
                           FROM (SELECT c.pos, c.until, unnest({used}) AS seg_id FROM prompts p JOIN c USING (request_id)) u
                           GROUP BY u.seg_id)
                SELECT u.seg_id, u.first, u.last, s.rowid AS row FROM u JOIN segments s ON s.seg_id = u.seg_id"""))
        finally:
            room.restore()
            con.unregister(name)
        seg, first, last, row = (got.column(c).to_numpy() for c in ("seg_id", "first", "last", "row"))
        by_first = np.argsort(first, kind="stable")
        self._seg, self._first, self._row = seg[by_first], first[by_first], row[by_first]
        by_last = np.argsort(last, kind="stable")
        self._seg_by_last, self._last = seg[by_last], last[by_last]
        self._loaded = 0   # segments (in order of first use) read so far
        self._dropped = 0  # segments (in order of last use) dropped so far
        self.held = 0         # tokens held now
        self.most_tokens = 0  # the most tokens held at once

    def reach(self, stop: int) -> None:
        """Read the segments first used by the requests before position ``stop``."""
        end = int(np.searchsorted(self._first, stop, side="left"))
        if end <= self._loaded:
            return
        seg, row = self._seg[self._loaded:end], self._row[self._loaded:end]
        name = f"__replay_window_ids_{next(_VIEWS)}"
        self.con.register(name, pa.table({"seg_id": pa.array(seg, pa.uint64())}))
        try:
            tbl = db.arrow(self.con, f"SELECT s.seg_id, s.tokens FROM segments s SEMI JOIN {name} USING (seg_id) "
                                     f"WHERE s.rowid BETWEEN {int(row.min())} AND {int(row.max())}")
        finally:
            self.con.unregister(name)
        # copies: a view would keep the whole stretch's buffer alive as long as any of its segments
        self.held += self.add(tbl, copy=True)  # (each segment once: it is first used in one stretch only)
        self._loaded = end
        self.most_tokens = max(self.most_tokens, self.held)

    def forget_before(self, pos: int) -> list[int]:
        """Drop the segments last used before position ``pos`` (the requests before
        it are done with); returns their ids."""
        end = int(np.searchsorted(self._last, pos, side="left"))
        gone = self._seg_by_last[self._dropped:end].tolist()
        for s in gone:
            toks = self._tokens.pop(s, None)
            if toks is not None:
                self.held -= len(toks)
        self._dropped = max(self._dropped, end)
        return gone
