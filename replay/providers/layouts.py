"""Where a request's content blocks end and where its cache breakpoints sit, in
token positions: what Anthropic's rules need of each prompt (the simulators in
``replay.providers.request_hits`` and ``client_rules``).

Under the neutral template every rendered piece is one stored segment, so the
block ends are the ends of the segments that are not markers, read from the
stored prompts without rendering anything. Only a body that names a
``cache_control`` breakpoint (or prompts tokenized under another rendering) is
rendered again, its bodies assembled a bounded stretch at a time: an agent's
log resends its conversation on every call, so its bodies together are many
times its text.
"""

from __future__ import annotations

import json

import pyarrow as pa

from replay.providers.simulators import anthropic_layout
from replay.store import db
from replay.text.renderers import NEUTRAL, render_of
from replay.text.segids import MARKER_SEG

DEFAULT_TTL = -1  # a breakpoint that names no ttl: the run's default, filled in per default
CHUNK_CHARS = 32 << 20  # body text assembled at a time


def one_block(n: int, auto: bool) -> tuple[list, list]:
    """The layout of a prompt without blocks (a tokens log): one block, its end the automatic breakpoint."""
    return ([(n, DEFAULT_TTL)] if auto and n else []), ([n] if n else [])


def block_ends(con, request_ids=None) -> dict[int, list[int]]:
    """request_id → the token positions where its rendered non-marker pieces end (a
    tool, a system block, a content block), from the stored segments."""
    markers = {int(v) for v in MARKER_SEG.values()}
    n_of = dict(con.execute("SELECT seg_id, n_tokens FROM segments").fetchall())
    if request_ids is None:
        rows = con.execute("SELECT request_id, seg_ids FROM prompts").fetchall()
    else:
        con.register("_ends_wanted", pa.table({"request_id": pa.array(list(request_ids), pa.int64())}))
        try:
            rows = con.execute("SELECT request_id, seg_ids FROM prompts JOIN _ends_wanted USING (request_id)"
                               ).fetchall()
        finally:
            con.unregister("_ends_wanted")
    out = {}
    for rid, segs in rows:
        pos, ends = 0, []
        for s in segs:
            pos += n_of[s]
            if s not in markers:
                ends.append(pos)
        out[rid] = ends
    return out


def _with_breakpoints(con) -> set[int]:
    """Requests whose body names a ``cache_control`` (in its inline text or one of its blobs)."""
    return {r[0] for r in con.execute("""
        SELECT request_id FROM requests WHERE body LIKE '%"cache_control"%'
        UNION
        SELECT u.request_id FROM (SELECT request_id, unnest(body_blobs) AS blob_id FROM requests) u
        JOIN blobs b USING (blob_id) WHERE b.text LIKE '%"cache_control"%'""").fetchall()}


def anthropic_layouts(con, auto: bool) -> dict[int, tuple[list, list]]:
    """request_id → (breakpoints ``(pos, ttl µs or DEFAULT_TTL)``, block ends) of every
    tokenized request (``simulators.anthropic_layout``'s rules)."""
    neutral = render_of(db.get_meta(con, "tokenizer")) == NEUTRAL
    render = _with_breakpoints(con) if neutral else None
    out: dict[int, tuple[list, list]] = {}
    if neutral:
        fmts = dict(con.execute("SELECT request_id, format FROM requests").fetchall())
        for rid, ends in block_ends(con).items():
            if rid not in render and fmts.get(rid) != "tokens":
                out[rid] = ([(ends[-1], DEFAULT_TTL)] if auto and ends else []), ends
    tokenized = {r[0] for r in con.execute("SELECT request_id FROM prompts").fetchall()}
    if tokenized <= out.keys():  # (every layout read from the segments: no body to assemble)
        return out
    todo = [(rid, n) for rid, n in db.body_sizes(con) if rid in tokenized and rid not in out]
    seg_n = dict(con.execute("SELECT seg_id, n_tokens FROM segments").fetchall())
    blob_texts: dict = {}
    for ids in db.chunks_by_size(todo, CHUNK_CHARS):
        _rendered_layouts(con, ids, seg_n, auto, out, blob_texts)
    return out


def _rendered_layouts(con, ids: list[int], seg_n: dict, auto: bool, out: dict, blob_texts: dict) -> None:
    con.register("_layout_ids", pa.table({"request_id": pa.array(ids, pa.int64())}))
    try:
        rows = con.execute("""SELECT r.request_id, r.format, p.seg_ids FROM _layout_ids
                              JOIN requests r USING (request_id) JOIN prompts p USING (request_id)""").fetchall()
    finally:
        con.unregister("_layout_ids")
    bodies = db.fetch_bodies(con, ids, blob_texts)
    for rid, fmt, seg_ids in rows:
        text = bodies.get(rid)
        body = None
        if text is not None and fmt != "tokens":
            try:
                body = json.loads(text)
            except ValueError:
                body = None
        segs = [seg_n[s] for s in seg_ids]
        out[rid] = anthropic_layout(body if isinstance(body, dict) else None, segs, fmt, DEFAULT_TTL, auto)
