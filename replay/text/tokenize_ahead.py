"""The tokenize stage's side of a chat template's requests rendered ahead.

The encoder process renders requests while ingest runs and while the stage
works (``replay.text.template_ahead``). The stage asks for its rows
:data:`AHEAD_ASK` at a time, as its loop reaches them, and renders those not
ready itself; from an ask on, the encoder process leaves the rows asked for
to the stage. A row is taken only when it was rendered from what the stage
reads (its time, format and body parts: a request id is used again after a
rolled-back file) and every one of its segments' tokens is here.
"""

from __future__ import annotations

import numpy as np

#: rows asked for at a time: small enough that the two sides share the tail of a chunk
AHEAD_ASK = 64


class AheadRows:
    """A chunk's rows rendered ahead, asked for as the stage's loop reaches them."""

    def __init__(self, tok, store, rids: np.ndarray, times: list, fmts: list, part_ids: list, rows: list[int]):
        """``rows``: the chunk's rows (indices) a template renders from parts,
        in order, ``part_ids`` each row's part ids (None for others). The first
        row is always rendered by the stage (its cuts are checked there:
        ``tokenize.check_cuts``)."""
        self.tok, self.store = tok, store
        self.rids, self.times, self.fmts, self.part_ids = rids, times, fmts, part_ids
        self.rows = rows[1:]
        self.asked = 0  # rows[:asked] have been asked for
        self.ready: dict[int, tuple[list, list]] = {}
        self.taken = 0

    def get(self, i: int) -> tuple[list, list] | None:
        """Row ``i``'s (segment ids, parts) when rendered ahead, else None (the stage renders it)."""
        while self.asked < len(self.rows) and self.rows[self.asked] <= i:
            self._ask(self.rows[self.asked:self.asked + AHEAD_ASK])
            self.asked += AHEAD_ASK
        return self.ready.pop(i, None)

    def _ask(self, rows: list[int]) -> None:
        got, tokens = self.tok.take_requests([int(self.rids[i]) for i in rows])
        if not got:
            return
        store = self.store
        store.add_arrays(tokens)
        known = store.known
        for i in rows:
            g = got.get(int(self.rids[i]))
            if g is None or g[0] != self.times[i] or g[1] != self.fmts[i] or list(g[2]) != self.part_ids[i]:
                continue
            sids = g[3].tolist()
            # (a segment missing: handed over to a chunk that was rolled back since)
            if all(store.has(s) for s in set(sids).difference(known)):
                self.ready[i] = (sids, g[4].tolist())
                self.taken += 1
