"""The tokenize stage's side of a chat template's requests rendered ahead.

The encoder process renders requests forward while ingest runs and while the
stage works (``replay.text.template_ahead``). The stage renders a chunk's rows
backward, from its last, claiming each on the board both processes map
(``replay.text.ahead_board``), until it reaches a request the encoder process
has started; then it takes, in one ask, what that process rendered of the
rows before it. So each side renders without waiting for the other, and they
meet wherever their speeds put them. The stage's loop then goes through the
chunk in order and renders whatever is still missing (a request the encoder
process skipped or could not render, or every row without that process).

A row is taken only when it was rendered from what the stage reads (its time,
format and body parts: a request id is used again after a rolled-back file)
and every one of its segments' tokens is here.
"""

from __future__ import annotations

import itertools

import numpy as np

#: new texts of the stage's renders sent to the encoder process at a time (encoded there as the stage goes on)
ENCODE_TEXTS = 32


class AheadRows:
    """A chunk's rows a template renders from parts: met from both ends (module docstring)."""

    def __init__(self, tok, store, rids: np.ndarray, times: list, fmts: list, bodies, rows: list[int]):
        """``rows``: the chunk's rows (indices) a template renders from parts, in
        order; ``bodies[i]`` row ``i``'s body, and ``bodies.part_ids[i]`` its part
        ids. The first row is always rendered by the stage's loop (its cuts are
        checked there: ``tokenize.check_cuts``)."""
        self.tok, self.store = tok, store
        self.rids, self.times, self.fmts, self.bodies = rids, times, fmts, bodies
        self.rows = rows[1:]
        self.ready: dict[int, tuple[list, list]] = {}
        self.taken = 0  # rows rendered by the encoder process

    def meet(self) -> None:
        """Render rows from the last one backward until the encoder process's
        position, then take what it rendered of the rest."""
        rows, rids = self.rows, self.rids
        if not rows:
            return
        board = self.tok.ahead_board()
        last = int(rids[rows[-1]])
        k = len(rows)
        if board is not None:
            new_texts, sent = self.store.new_texts, len(self.store.new_texts)
            while k:
                rid = int(rids[rows[k - 1]])
                board.claim(rid, last)
                if board.at() >= rid:
                    break
                k -= 1
                if (got := self._render(rows[k])) is not None:
                    self.ready[rows[k]] = got
                if len(new_texts) - sent >= ENCODE_TEXTS or not k:
                    self.tok.encode_for_stage(dict(itertools.islice(new_texts.items(), sent, None)))
                    sent = len(new_texts)
        self._take(rows[:k], last)
        if board is not None:
            board.unclaim()

    def get(self, i: int) -> tuple[list, list] | None:
        """Row ``i``'s (segment ids, parts) when rendered already, else None (the stage renders it)."""
        return self.ready.pop(i, None)

    def _render(self, i: int) -> tuple[list, list] | None:
        body = self.bodies[i]
        if body is None:
            return None
        try:
            pieces = self.tok.render_request(body, self.fmts[i], self.times[i])
        except Exception:  # noqa: BLE001 - rendered again in the stage's loop, which stops or sets it aside
            return None
        return self.store.add_texts(pieces), [p[2] for p in pieces]

    def _take(self, rows: list[int], through: int) -> None:
        got, tokens = self.tok.take_requests([int(self.rids[i]) for i in rows], through)
        store = self.store
        store.add_arrays(tokens)  # (also those of the texts sent ahead: ``meet``)
        if not got:
            return
        known = store.known
        part_ids = self.bodies.part_ids
        for i in rows:
            g = got.get(int(self.rids[i]))
            if g is None or g[0] != self.times[i] or g[1] != self.fmts[i] or list(g[2]) != part_ids[i]:
                continue
            sids = g[3].tolist()
            # (a segment missing: handed over to a chunk that was rolled back since)
            if all(store.has(s) for s in set(sids).difference(known)):
                self.ready[i] = (sids, g[4].tolist())
                self.taken += 1
