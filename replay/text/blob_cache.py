"""Body parts rendered once: the tokenize stage's cache of content-addressed parts.

Ingest stores chat bodies as content-addressed parts (``replay.readers.blobs``):
each tool definition, system value and message once. A conversation resent
every turn is then rendered once per message, not once per request, and a
chunk's prompts are assembled from the parts' segments with array operations.
Parts the encoder process prepared while ingest ran are taken as they are (the
same rendering and ids).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from replay.store.jsontext import loads
from replay.text import encoder
from replay.text.render import render_part
from replay.text.renderers import output_renderer, request_renderer
from replay.text.segids import MARKER_SEG, piece_seg_id


class Grow:
    """A numpy array that grows by appending (amortised doubling)."""

    def __init__(self, dtype):
        self.a = np.zeros(1024, dtype=dtype)
        self.n = 0

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=self.a.dtype)
        need = self.n + len(values)
        if need > len(self.a):
            grown = np.zeros(max(need, 2 * len(self.a)), dtype=self.a.dtype)
            grown[:self.n] = self.a[:self.n]
            self.a = grown
        self.a[self.n:need] = values
        self.n = need

    @property
    def view(self) -> np.ndarray:
        return self.a[:self.n]


_TOOL, _SYSTEM, _MESSAGE, _GLUE = 0, 1, 2, 3
_KIND_CODES = {"tool": _TOOL, "system": _SYSTEM, "message": _MESSAGE, "glue": _GLUE}


class BlobCache:
    """blob_id → its rendered segments, so a conversation resent every turn is
    rendered once per message, not once per request (see ingest's body blobs),
    and a chunk's prompts are assembled with array operations.

    Blob ``i`` (dense index) has a kind code, its segments
    ``pool_seg[start[i]:end[i]]`` with their parts ``pool_part`` (tools 0, system
    1; a message's part is its position in the request) and, once its segments
    are tokenized, its token count ``ntok[i]``.
    """

    _BOS = MARKER_SEG["bos"]
    _ASSISTANT = MARKER_SEG["assistant"]

    def __init__(self, store, pool=None):  # (replay.text.tokenize.NewSegments, a pool: render_shared)
        self.store = store
        self.pool = pool
        self.index: dict[int, int] = {}
        self.kind = Grow(np.int8)
        self.start = Grow(np.int64)
        self.end = Grow(np.int64)
        self.ntok = Grow(np.int64)  # -1 until known
        self.pool_seg = Grow(np.uint64)
        self.pool_part = Grow(np.int32)
        self._pending_ntok: list[int] = []  # blobs whose token count is not known yet
        self.failed: dict[int, str] = {}  # blob id -> why it could not be rendered

    def load(self, con, blob_ids: np.ndarray, first_request: tuple[int, int] | None = None) -> None:
        """Render every blob of ``blob_ids`` not seen yet — or take it from what the
        encoder process prepared while ingest ran (the same rendering and ids).
        ``first_request`` (lo, hi): the requests of the chunk; the blobs they
        introduced are read by that range first."""
        want = [b for b in np.unique(blob_ids).tolist() if b not in self.index]
        if not want:
            return
        store = self.store
        self._take_prepared(store.tok.take_blobs_flat(want))
        rest = [b for b in want if b not in self.index]
        entries = []  # (blob id, kind, seg ids, parts) of the others, rendered here
        if rest:
            rows = _fetch_blobs(con, rest, first_request)
            if len(rows) < len(rest):
                rows += _fetch_blobs(con, list(set(rest) - {r[0] for r in rows}), None)
            if len(rows) < len(rest):
                raise KeyError(f"{len(rest) - len(rows)} body blobs are missing from the blobs table")
            add = store.add_piece
            pooled = iter(()) if self.pool is None else iter(render_shared(
                self.pool, "neutral", [("part", kind, text) for _, kind, text in rows if kind != "glue"]))
            for bid, kind, text in rows:
                if kind == "glue":
                    entries.append((bid, kind, (), ()))
                    continue
                if self.pool is not None:  # (rendered by the pool: pieces with their segment ids)
                    got = next(pooled)
                    if got[0] == "error":
                        self.failed[bid] = got[1]
                        entries.append((bid, "glue", (), ()))
                    else:
                        entries.append((bid, kind, list(map(add, got[1], got[2])), [p[2] for p in got[1]]))
                    continue
                try:
                    pieces = render_part(kind, loads(text))
                except Exception as exc:  # noqa: BLE001 - its requests are set aside, with the reason
                    self.failed[bid] = type(exc).__name__
                    entries.append((bid, "glue", (), ()))  # (a stand-in holding nothing)
                    continue
                entries.append((bid, kind, [add(p) for p in pieces], [p[2] for p in pieces]))
        kinds, starts, ends, segs, parts = [], [], [], [], []
        pos = self.pool_seg.n
        for bid, kind, sids, prt in entries:
            i = self.index[bid] = len(self.index)
            code = _KIND_CODES.get(kind, _SYSTEM)  # (any other kind renders with the system)
            kinds.append(code)
            starts.append(pos)
            if code != _GLUE:
                segs.append(np.asarray(sids, dtype=np.uint64))
                parts.append(np.asarray(prt, dtype=np.int32))
                pos += len(sids)
                self._pending_ntok.append(i)
            ends.append(pos)
        self.kind.extend(kinds)
        self.start.extend(starts)
        self.end.extend(ends)
        self.ntok.extend(np.where(np.array(kinds) == _GLUE, 0, -1))
        if segs:
            self.pool_seg.extend(np.concatenate(segs))
            self.pool_part.extend(np.concatenate(parts))

    def _take_prepared(self, got: "encoder.PreparedBlobs") -> "encoder.PreparedBlobs":
        """Add the parts the encoder process prepared (with the tokens of their new
        segments) to the pools, as whole arrays; a part whose new segments did not
        all come is left out (rendered here instead). Returns what was added."""
        if not len(got):
            return got
        store = self.store
        known, new_arrays, new_texts = store.known, store.new_arrays, store.new_texts
        need = [s for s in np.unique(got.seg_ids).tolist()
                if s not in known and s not in new_arrays and s not in new_texts]
        tokens = store.tok.take_segments(need)
        new_arrays.update(tokens)
        codes = np.array([_KIND_CODES.get(k, _SYSTEM) for k in got.kinds], dtype=np.int8)
        keep = codes != _GLUE  # (never prepared: glue is not handed over)
        if len(tokens) < len(need):
            missing = np.array(sorted(set(need) - tokens.keys()), dtype=np.uint64)
            owner = np.repeat(np.arange(len(got)), got.lengths)
            keep &= np.bincount(owner[np.isin(got.seg_ids, missing)], minlength=len(got)) == 0
        if not keep.all():
            flat, _ = take_rows(np.concatenate([[0], np.cumsum(got.lengths)]), np.flatnonzero(keep))
            got = type(got)([b for b, k in zip(got.ids, keep.tolist()) if k],
                            [c for c, k in zip(got.kinds, keep.tolist()) if k],
                            got.seg_ids[flat], got.lengths[keep], got.parts[flat])
            codes = codes[keep]
        n, base, pos = len(got), len(self.index), self.pool_seg.n
        self.index.update(zip(got.ids, range(base, base + n)))
        ends = pos + np.cumsum(got.lengths)
        self.kind.extend(codes)
        self.start.extend(ends - got.lengths)
        self.end.extend(ends)
        self.ntok.extend(np.full(n, -1, dtype=np.int64))
        self.pool_seg.extend(got.seg_ids)
        self.pool_part.extend(got.parts)
        self._pending_ntok.extend(range(base, base + n))
        return got

    def count_tokens(self, known: dict[int, int]) -> None:
        """Token counts of the blobs rendered since the last call (their segments are stored)."""
        if not self._pending_ntok:
            return
        idx = np.array(self._pending_ntok, dtype=np.int64)
        self._pending_ntok = []
        lengths = self.end.view[idx] - self.start.view[idx]
        segs = self.pool_seg.view
        flat = _ranges(self.start.view[idx], lengths)
        seg_len = np.fromiter(map(known.__getitem__, segs[flat].tolist()), dtype=np.int64, count=len(flat))
        owner = np.repeat(np.arange(len(idx)), lengths)
        self.ntok.view[idx] = np.bincount(owner, weights=seg_len, minlength=len(idx)).astype(np.int64)

    def assemble(self, blob_ids: np.ndarray, offsets: np.ndarray):
        """Prompts of requests whose bodies are ``blob_ids[offsets[r]:offsets[r+1]]``,
        in render order: bos, tools, system, messages (part 2 + k), assistant.
        Returns (seg_ids, seg_parts, prompt offsets into both, blob rows, blob indices):
        the last two list the non-glue blobs used by each request (for token counts)."""
        self.store.add_piece(("marker", "bos", 0))
        self.store.add_piece(("marker", "assistant", 0))
        n_req = len(offsets) - 1
        idx = np.fromiter(map(self.index.__getitem__, blob_ids.tolist()), dtype=np.int64, count=len(blob_ids))
        row = np.repeat(np.arange(n_req), np.diff(offsets))
        kind = self.kind.view[idx]
        keep = kind != _GLUE
        idx, row, kind = idx[keep], row[keep], kind[keep]
        order = np.lexsort((kind, row))  # stable: tools, system, messages, each in body order
        idx, row, kind = idx[order], row[order], kind[order]
        is_msg = kind == _MESSAGE
        # a message's position k in its request: messages before it in the same row
        before = np.cumsum(is_msg) - is_msg
        k = before - before[np.searchsorted(row, row)]  # (rows are sorted: the row's first entry)
        n_msgs = np.bincount(row[is_msg], minlength=n_req)

        lengths = self.end.view[idx] - self.start.view[idx]
        flat = _ranges(self.start.view[idx], lengths)
        seg_row = np.repeat(row, lengths)
        mid_seg = self.pool_seg.view[flat]
        mid_part = np.where(np.repeat(is_msg, lengths), 2 + np.repeat(k, lengths),
                            self.pool_part.view[flat]).astype(np.int32)
        per_row = np.bincount(seg_row, minlength=n_req) + 2
        out_off = np.zeros(n_req + 1, dtype=np.int64)
        np.cumsum(per_row, out=out_off[1:])
        seg_ids = np.empty(out_off[-1], dtype=np.uint64)
        parts = np.empty(out_off[-1], dtype=np.int32)
        pos = np.arange(len(flat)) + 1 + 2 * seg_row
        seg_ids[pos] = mid_seg
        parts[pos] = mid_part
        seg_ids[out_off[:-1]] = self._BOS
        parts[out_off[:-1]] = 0
        seg_ids[out_off[1:] - 1] = self._ASSISTANT
        parts[out_off[1:] - 1] = 2 + n_msgs
        return seg_ids, parts, out_off, row, idx

    def n_tokens(self, row: np.ndarray, idx: np.ndarray, n_req: int, known: dict[int, int]) -> np.ndarray:
        """Each request's prompt length (its blobs' token counts + bos + assistant)."""
        body = np.bincount(row, weights=self.ntok.view[idx], minlength=n_req).astype(np.int64)
        return body + known[self._BOS] + known[self._ASSISTANT]


def _fetch_blobs(con, blob_ids: list[int], first_request: tuple[int, int] | None) -> list[tuple]:
    """(blob_id, kind, text or None for glue) of ``blob_ids`` — among the blobs first
    held by requests lo..hi when ``first_request`` is given (a range the table's
    zone maps narrow down; without it every blob's text would be read)."""
    _replay_blob_ids = pa.table({"blob_id": pa.array(  # noqa: F841 - read by DuckDB by name
        np.array(blob_ids, dtype=np.uint64), pa.uint64())})
    where, params = "", []
    if first_request is not None:
        where, params = " WHERE b.first_request BETWEEN ? AND ?", list(first_request)
    return con.execute(
        "SELECT b.blob_id, b.kind, CASE WHEN b.kind = 'glue' THEN NULL ELSE b.text END "
        f"FROM blobs b SEMI JOIN _replay_blob_ids w USING (blob_id){where}", params).fetchall()


class Unrenderable(Exception):
    """A request whose body holds a part that could not be rendered (the reason)."""


def rows_with(blob_ids: np.ndarray, offsets: np.ndarray, failed: dict[int, str]) -> dict[int, str]:
    """Rows (of a list column: ``blob_ids`` split at ``offsets``) holding a failed blob → its reason."""
    if not failed or not len(blob_ids):
        return {}
    bad = np.isin(blob_ids, np.fromiter(failed, dtype=np.uint64, count=len(failed)))
    if not bad.any():
        return {}
    row = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    out: dict[int, str] = {}
    for r, b in zip(row[bad].tolist(), blob_ids[bad].tolist()):
        out.setdefault(r, failed[b])
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each start ``s`` and length ``n``."""
    total = int(lengths.sum()) if len(lengths) else 0
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def take_rows(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of a list column stored as (values, ``offsets``): the positions
    of their values, in order, and the offsets of the taken rows."""
    starts = offsets[:-1][rows].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1])[rows].astype(np.int64)
    new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    return _ranges(starts, lengths), new_offsets


def blob_prompts(assembled, blob_cache: "BlobCache", keep: list[int], outputs: list,
                  rids: np.ndarray, known: dict[int, int]) -> pa.Table:
    """The ``prompts`` rows of the blob-bodied requests ``keep`` (positions in the
    assembled chunk), with their output segment ids."""
    seg_ids, parts, off, row, idx = assembled
    n_req = len(off) - 1
    n_tokens = blob_cache.n_tokens(row, idx, n_req, known)
    keep_a = np.asarray(keep, dtype=np.int64)
    if len(keep_a) < n_req:  # some failed (their output did not render): take the others' slices
        flat, off = take_rows(off, keep_a)
        seg_ids, parts = seg_ids[flat], parts[flat]
    off32 = pa.array(off.astype(np.int32))
    out_n = [None if o is None else sum(known[s] for s in o) for o in outputs]
    return pa.table({
        "request_id": pa.array(rids[keep_a], pa.int64()),
        "n_tokens": pa.array(n_tokens[keep_a], pa.int64()),
        "seg_ids": pa.ListArray.from_arrays(off32, pa.array(seg_ids, pa.uint64())),
        "seg_parts": pa.ListArray.from_arrays(off32, pa.array(parts, pa.int32())),
        "output_seg_ids": list_array(outputs, pa.uint64()),
        "output_n_tokens": pa.array(out_n, pa.int64()),
    })


def list_array(lists: list[list[int] | None], value_type) -> pa.Array:
    """An Arrow list column of ``lists`` (None for a null row)."""
    return pa.array(lists, pa.list_(value_type))


def with_whole_bodies(con, tbl: pa.Table, by_blobs: np.ndarray, blobs_col) -> pa.Table:
    """``tbl`` with the ``body`` of its rows stored as parts (``by_blobs``) filled
    in: their parts' texts joined (the body's compact JSON, as the
    ``request_bodies`` view gives it), each distinct part read once."""
    rows = [blobs_col[i].values.to_numpy(zero_copy_only=False) if by_blobs[i] else None
            for i in range(len(by_blobs))]
    wanted = np.unique(np.concatenate([r for r in rows if r is not None]))
    _replay_blob_ids = pa.table({"blob_id": pa.array(wanted.astype(np.uint64), pa.uint64())})  # noqa: F841
    texts = dict(con.execute("SELECT b.blob_id, b.text FROM blobs b SEMI JOIN _replay_blob_ids w USING (blob_id)")
                 .fetchall())
    bodies = tbl.column("body").to_pylist()
    for i, r in enumerate(rows):
        if r is not None:
            bodies[i] = "".join(texts[b] for b in r.tolist())
    return tbl.set_column(tbl.schema.get_field_index("body"), "body", pa.array(bodies, pa.string()))


# ------------------------------------------------------------ a chunk's rendering, shared by processes

def render_items(items: list, name: str) -> list:
    """Each of ``items`` rendered with the rendering ``name``, in order: an item is
    ("part", kind, JSON text) or ("body", format, JSON body or None, JSON output
    or None); its result ("ok", pieces, seg ids, output pieces, output seg ids)
    or ("error", why)."""
    request, output = request_renderer(name), output_renderer(name)
    out = []
    for item in items:
        try:
            if item[0] == "part":
                pieces, opieces = render_part(item[1], loads(item[2])), None
            else:
                pieces = None if item[2] is None else request(loads(item[2]), item[1])
                o = None if item[3] is None else loads(item[3])
                opieces = None if o is None else output(o, item[1])
        except Exception as exc:  # noqa: BLE001 - the stage sets the request aside, with the reason
            out.append(("error", type(exc).__name__))
            continue
        out.append(("ok", pieces, _ids(pieces), opieces, _ids(opieces)))
    return out


def _ids(pieces: list | None) -> list | None:
    return None if pieces is None else [piece_seg_id(p) for p in pieces]


def render_shared(pool, name: str, items: list) -> list:
    """:func:`render_items` of ``items``, split in contiguous shares, one per
    worker of ``pool`` (``replay.distributed.file_pool``: a share rendered is
    pure Python and holds a core; None: here). The results come back in the
    items' order, so the stage goes on exactly as with one process."""
    n = 1 if pool is None else pool.workers
    if n < 2 or len(items) < 2:
        return render_items(items, name)
    bounds = [len(items) * k // n for k in range(n + 1)]
    shares = [items[bounds[k]:bounds[k + 1]] for k in range(n)]
    out = []
    for _, got in pool.map_ordered(render_items, [s for s in shares if s], name,
                                   label=lambda share: f"a share of {len(share)} bodies"):
        out.extend(got)
    return out


def rendered_rows(pool, name: str, fmts: list, bodies: list, outputs: list, by_blobs,
                  ahead: dict | None) -> dict[int, tuple]:
    """Row → :func:`render_items` result of a chunk's rows the stage renders
    itself: the body (rows not stored as parts, with one) and the output; rows
    of pre-tokenized requests or rendered ahead are left out."""
    rows = [i for i, f in enumerate(fmts)
            if f != "tokens" and not (ahead and i in ahead) and (by_blobs[i] or bodies[i] is not None)]
    items = [("body", fmts[i], None if by_blobs[i] else bodies[i], outputs[i]) for i in rows]
    return dict(zip(rows, render_shared(pool, name, items)))
