"""Tokenize stage: ``requests`` → content-addressed ``segments`` + ``prompts``.

Every request body is rendered into pieces (``replay.text.renderers``: the
neutral template, DeepSeek's encoding or a model's chat template); each piece
is a segment keyed by a tokenizer-independent content id
(``replay.text.segids``), and unique texts are tokenized once, in batches, by
the tokenizer (``replay.text.tok``). Bodies stored as content-addressed parts
are rendered a part at a time (``replay.text.blob_cache``); a request that
cannot be rendered is set aside with the reason. The ``segments`` table
belongs to one tokenizer and rendering (``meta['tokenizer']``): another one
clears it first. The contract — segment ids, formats, renderings — is
``docs/rendering.md``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from replay.store import db
from replay.store.failpoints import failpoint
from replay.store.jsontext import loads
from replay.text.blob_cache import (BlobCache, Unrenderable, blob_prompts, list_array, rendered_rows, rows_with,
                                    take_rows, with_whole_bodies)
from replay.text.segids import MARKER_SEG, image_seg_id, text_seg_id, tokens_seg_id
from replay.text import render_template
from replay.text.render_template import WHOLE_TEXT_ENV
from replay.text.template_bodies import TemplateBodies
from replay.text.renderers import TEMPLATE
from replay.text.tok import Tok, load_tokenizer

CHUNK_REQUESTS = (2_000, 10_000)  # requests per transaction: at least, at most (about 25 transactions)
BATCH_CHARS = 4_000_000
TEXT_MEMO_ENTRIES = 500_000  # texts NewSegments.add_texts remembers (then it forgets them all)

# the requests this stage has still to do (db.untokenized counts them)
_WAITING = ("r.block_ids IS NULL AND NOT EXISTS (SELECT 1 FROM prompts p WHERE p.request_id = r.request_id) "
            "AND NOT EXISTS (SELECT 1 FROM set_aside s WHERE s.request_id = r.request_id)")

@dataclass
class TokenizeSummary:
    requests: int          # requests examined in this run (no prompt row yet)
    new_prompts: int       # prompt rows written
    unique_segments: int   # segments written (new unique content)
    unique_tokens: int     # tokens in those segments (what was actually tokenized)
    logical_tokens: int    # Σ prompt n_tokens of the new prompts
    seconds: float
    skipped: int = 0       # block traces (no prompt row by design)
    failed: int = 0        # requests that could not be rendered: set aside (table set_aside)
    cleared: bool = False  # old segments/prompts of another tokenizer were dropped
    rendered_ahead: int = 0  # requests a chat template's encoder process rendered (``replay.text.template_ahead``)


class NewSegments:
    """In-memory seg_id → n_tokens of what the table holds, plus this chunk's new rows."""

    def __init__(self, con, tok: Tok, batch_chars: int):
        self.tok = tok
        self.batch_chars = batch_chars
        ids, ns = _fetch_known(con)
        self.known: dict[int, int] = dict(zip(ids, ns))
        self.text_ids: dict[str, int] = {}  # text → seg_id, for add_texts (every id in known or new_texts)
        self._reset()

    def _reset(self) -> None:
        self.new_texts: dict[int, str] = {}
        self.new_arrays: dict[int, np.ndarray] = {}

    def add_piece(self, piece: tuple, sid: int | None = None) -> int:
        """``piece``'s segment id (``sid``: computed elsewhere), noting it if new."""
        kind, payload, _ = piece
        if kind == "text":
            sid = text_seg_id(payload) if sid is None else sid
            if sid not in self.known and sid not in self.new_texts and sid not in self.new_arrays:
                self.new_texts[sid] = payload  # (new_arrays: tokens prepared by the encoder process)
            return sid
        if kind == "marker":
            sid = MARKER_SEG[payload]
            if sid not in self.known and sid not in self.new_arrays:
                self.new_arrays[sid] = np.array([self.tok.marker_id(payload)], dtype=np.int32)
            return sid
        if kind == "image":
            sid = image_seg_id(payload[0], payload[1]) if sid is None else sid
            if sid not in self.known and sid not in self.new_arrays:
                self.new_arrays[sid] = self.tok.image_tokens(payload[0], payload[1])
            return sid
        raise ValueError(f"unknown piece kind {kind!r}")

    def add_texts(self, pieces: list) -> list[int]:
        """``add_piece`` of text pieces (a chat template's), a text seen in this
        run found by one dict lookup (its content) instead of being hashed again."""
        memo = self.text_ids
        out = []
        for piece in pieces:
            sid = memo.get(piece[1]) if piece[0] == "text" else None
            if sid is None:
                sid = self.add_piece(piece)
                if piece[0] == "text":
                    if len(memo) >= TEXT_MEMO_ENTRIES:
                        memo.clear()
                    memo[piece[1]] = sid
            out.append(sid)
        return out

    def has(self, sid: int) -> bool:
        return sid in self.known or sid in self.new_arrays or sid in self.new_texts

    def add_arrays(self, tokens: dict[int, np.ndarray]) -> None:
        """Segments encoded elsewhere (seg id → tokens) that are not here yet, or
        wait to be encoded here."""
        for sid, arr in tokens.items():
            if sid not in self.known and sid not in self.new_arrays:
                self.new_texts.pop(sid, None)
                self.new_arrays[sid] = np.asarray(arr, dtype=np.int32)

    def add_tokens(self, tokens: np.ndarray) -> int:
        arr = np.asarray(tokens, dtype=np.int32)
        sid = tokens_seg_id(arr)
        if sid not in self.known and sid not in self.new_arrays:
            self.new_arrays[sid] = arr
        return sid

    def flush(self, con) -> tuple[int, int]:
        """Tokenize pending texts and insert every new segment. Returns (segments, tokens)."""
        ids: list[int] = []
        arrays: list[np.ndarray] = []
        for sid, arr in self.new_arrays.items():
            ids.append(sid)
            arrays.append(arr)
        items = list(self.new_texts.items())
        for (sid, _), toks in zip(items, _encode_batches(self.tok, [t for _, t in items], self.batch_chars)):
            ids.append(sid)
            arrays.append(toks)
        if not ids:
            self._reset()
            return 0, 0
        lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        tbl = pa.table({
            "seg_id": pa.array(np.array(ids, dtype=np.uint64), pa.uint64()),
            "n_tokens": pa.array(lengths.astype(np.int32), pa.int32()),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int32())),
        })
        _insert(con, "segments", tbl, "seg_id, n_tokens, tokens")
        for sid, n in zip(ids, lengths.tolist()):
            self.known[sid] = n
        self._reset()
        return len(ids), int(lengths.sum())


def _commit(con) -> None:
    """A chunk's COMMIT, on the stage's thread: DuckDB's commit and the checkpoint
    it makes then run beside the next chunk's reads and its encoding."""
    con.execute("COMMIT")


def check_cuts(tok: Tok, rid: int, pieces: list) -> None:
    """A chat template's pieces (``replay.text.render_template``), encoded one by
    one, must give the ids of the whole text: checked on one request of each
    chunk, so a tokenizer that breaks the argument for cutting at added tokens
    stops the stage instead of storing other ids."""
    texts = [p[1] for p in pieces if p[0] == "text"]
    if len(texts) != len(pieces) or len(texts) < 2:
        return
    got = tok.encode_arrays(texts + ["".join(texts)])
    if not np.array_equal(np.concatenate(got[:-1]), got[-1]):
        raise RuntimeError(
            f"request {rid}: the chat template's text cut at the tokenizer's added tokens does not encode as "
            f"the whole text does with {tok.base_name}; set {WHOLE_TEXT_ENV}=1 to encode each request's whole "
            "text (exact, slower), and please report the tokenizer")


def _encode_batches(tok: "Tok", texts: list[str], batch_chars: int) -> list[np.ndarray]:
    """Token arrays for ``texts`` (in order), encoded in batches of about
    ``batch_chars`` (each batch one request to the encoder process)."""
    out: list[np.ndarray] = []
    start = 0
    while start < len(texts):
        end, chars = start, 0
        while end < len(texts) and (end == start or chars + len(texts[end]) <= batch_chars):
            chars += len(texts[end])
            end += 1
        out.extend(tok.encode_arrays(texts[start:end]))
        start = end
    return out


def _fetch_known(con) -> tuple[list[int], list[int]]:
    res = con.execute("SELECT seg_id, n_tokens FROM segments").fetchnumpy()
    return res["seg_id"].tolist(), res["n_tokens"].tolist()


def _insert(con, table: str, tbl: pa.Table, cols: str) -> None:
    """Bulk insert an Arrow table (DuckDB replacement scan of a local variable:
    unlike ``register`` it works while the caller holds an unfinished result)."""
    _replay_new_rows = tbl  # noqa: F841 - read by DuckDB by name
    con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _replay_new_rows")


def _ensure_tokenizer(con, tok: Tok) -> bool:
    """Make ``segments``/``prompts`` belong to ``tok``; True when old rows were cleared."""
    current = db.get_meta(con, "tokenizer")
    cleared = False
    if current != tok.name or _left_unchecked(con):
        has_rows = con.execute(
            "SELECT (SELECT count(*) FROM segments) + (SELECT count(*) FROM prompts)").fetchone()[0]
        if has_rows:
            con.execute("DELETE FROM prompts")
            con.execute("DELETE FROM segments")
            cleared = True
        con.execute("DELETE FROM set_aside WHERE stage = 'tokenize'")  # another tokenizer may render them
        db.set_meta(con, "tokenizer", tok.name)
        con.execute("DELETE FROM meta WHERE key = 'tokens_checked'")  # (an older version's state)
    return cleared

def _set_aside(con, aside: list[tuple[int, str]], tokenizer: str) -> None:
    """Record requests the stage cannot render: they stay loaded, out of the replay."""
    _replay_aside = pa.table({  # noqa: F841 - read by DuckDB by name
        "request_id": pa.array([r for r, _ in aside], pa.int64()),
        "detail": pa.array([f"cannot render the request body ({why})" for _, why in aside], pa.string())})
    con.execute("INSERT OR REPLACE INTO set_aside SELECT request_id, 'tokenize', 'unrenderable', detail, ? "
                "FROM _replay_aside", [tokenizer])

def _left_unchecked(con) -> bool:
    """Rows an older version stored before checking them against the reference
    (its ``tokens_checked`` meta still ``pending``: a run stopped in between):
    tokenized again."""
    return db.get_meta(con, "tokens_checked") == "pending"


def tokenize_needed(con) -> bool:
    """Requests are not tokenized yet (or an older version left them unchecked)."""
    return db.untokenized(con) > 0 or _left_unchecked(con)


def tokenize_stage(con, tokenizer: Tok | str | None = None, progress: bool = False,
                   batch_chars: int = BATCH_CHARS, chunk_requests: int | None = None,
                   pool=None) -> TokenizeSummary:
    """Fill ``segments`` and ``prompts`` for every request still waiting for them.

    ``tokenizer``: a :class:`Tok`, a local tokenizer path, or None (DeepSeek-V4).
    Requests go in ``request_id`` order, in chunks of ``chunk_requests``
    (default: a 25th of them, within ``CHUNK_REQUESTS``); a chunk's new unique
    texts are tokenized once (encoder batches of about ``batch_chars``
    characters) and its segments and prompts inserted in one transaction: an
    interrupted run resumes cleanly, a rerun adds nothing. The ids are the
    reference's (``replay.text.engine``). ``pool``: a chunk's rendering is
    shared by its worker processes (``replay.text.blob_cache.render_shared``;
    the same rows); the caller closes it.
    """
    t0 = time.perf_counter()
    tok = tokenizer if isinstance(tokenizer, Tok) else load_tokenizer(tokenizer)
    cleared = _ensure_tokenizer(con, tok)
    skipped = con.execute(
        "SELECT count(*) FROM requests r WHERE block_ids IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM prompts p WHERE p.request_id = r.request_id)").fetchone()[0]
    pending = con.execute(
        f"SELECT request_id FROM requests r WHERE {_WAITING} ORDER BY request_id").fetchnumpy()["request_id"]
    if chunk_requests is None:
        chunk_requests = min(max(CHUNK_REQUESTS[0], len(pending) // 25), CHUNK_REQUESTS[1])
    run = _Run(con, tok, batch_chars, progress, len(pending), pool)
    try:
        for start in range(0, len(pending), chunk_requests):
            run.chunk(pending[start:start + chunk_requests])
        run.committed()
    finally:
        run.close()
    if run.aside:
        print(f"tokenize: {run.aside:,} requests cannot be rendered and are set aside (table set_aside, "
              "with the reason); the rest go on", file=sys.stderr)
    tok.release()  # no more prepared parts are taken
    return TokenizeSummary(
        requests=int(len(pending)), new_prompts=run.prompts, unique_segments=run.segments,
        unique_tokens=run.tokens, logical_tokens=run.logical, seconds=time.perf_counter() - t0,
        skipped=int(skipped), failed=run.aside, cleared=cleared, rendered_ahead=run.ahead)


@dataclass
class _Rendered:
    """A chunk's requests as rendered: those rendered one by one (``rows``: request
    id, segment ids, parts, output segment ids), those assembled from their body
    parts (``blob_rows``: positions in the assembled chunk, with ``blob_out``
    their outputs' segment ids) and those set aside (``aside``: request id, why)."""
    rows: list = field(default_factory=list)
    blob_rows: list = field(default_factory=list)
    blob_out: list = field(default_factory=list)
    aside: list = field(default_factory=list)


class _Run:
    """One run of the stage, a chunk at a time: each chunk's reads go beside the
    previous chunk's commit (on a second connection and a thread of its own:
    DuckDB commits, with the checkpoint they make, without the interpreter lock)."""

    def __init__(self, con, tok: Tok, batch_chars: int, progress: bool, total: int, pool=None):
        self.con, self.tok, self.pool = con, tok, pool
        self.store = NewSegments(con, tok, batch_chars)
        self.blob_cache = BlobCache(self.store, pool)
        self.template_bodies = None
        if tok.render == TEMPLATE:
            self.template_bodies = TemplateBodies()
        self.reads = con.cursor()
        self.committer = db.Deferred(depth=1)
        self.prompts = self.segments = self.tokens = self.logical = self.aside = self.ahead = 0
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="req", desc="tokenize", file=sys.stderr)

    def chunk(self, ids: np.ndarray) -> None:
        lo, hi = int(ids[0]), int(ids[-1])
        tbl = self.reads.sql(
            "SELECT request_id, ts_us, format, body, output, tokens, output_tokens, body_blobs FROM requests r "
            f"WHERE request_id BETWEEN ? AND ? AND {_WAITING} ORDER BY request_id",
            params=[lo, hi]).to_arrow_table()
        rids = np.asarray(tbl.column("request_id").to_pylist(), dtype=np.int64)
        blobs_col = tbl.column("body_blobs").combine_chunks()
        bodies, fmts = tbl.column("body").to_pylist(), tbl.column("format").to_pylist()
        blob_valid = blobs_col.is_valid().to_numpy(zero_copy_only=False)
        # requests whose body is stored as parts: assembled together, with arrays
        by_blobs = np.array([blob_valid[i] and bodies[i] is None and fmts[i] != "tokens"
                             for i in range(len(rids))], dtype=bool)
        parsed, ahead = None, None
        if self.tok.render == TEMPLATE and by_blobs.any():
            # a chat template reads each body whole: assembled from its parts when needed
            parsed = self.template_bodies.rows(self.reads, by_blobs, blobs_col, self.tok.recent_parts)
            ahead = _taken_ahead(self.tok, self.store, rids, tbl.column("ts_us").to_pylist(), fmts,
                                 parsed.part_ids, np.flatnonzero(by_blobs).tolist())
            by_blobs[:] = False
        elif self.tok.render != "neutral" and by_blobs.any():
            # parts are rendered neutrally: another rendering renders each body whole
            tbl = with_whole_bodies(self.reads, tbl, by_blobs, blobs_col)
            by_blobs[:] = False
        sel = np.flatnonzero(by_blobs)
        flat, sel_off = take_rows(blobs_col.offsets.to_numpy(), sel)
        sel_ids = blobs_col.values.to_numpy(zero_copy_only=False)[flat]
        self.blob_cache.load(self.reads, sel_ids, (lo, hi))
        assembled = self.blob_cache.assemble(sel_ids, sel_off) if len(sel) else None
        got = self._render(tbl, by_blobs, {int(i): j for j, i in enumerate(sel)},
                           rows_with(sel_ids, sel_off, self.blob_cache.failed), parsed, ahead)
        self.ahead += 0 if ahead is None else len(ahead)
        self.committed()
        self._store(got, assembled, rids[sel])
        if self.bar is not None:
            self.bar.update(len(ids))

    def _render(self, tbl, by_blobs, sel_pos: dict, broken: dict, parsed=None,
                ahead: dict | None = None) -> _Rendered:
        """Render what the chunk's body parts do not already give: bodies stored
        whole, outputs, pre-tokenized requests. ``parsed[i]``: row ``i``'s body
        parsed (None: read from ``tbl``); ``ahead``: rows rendered ahead."""
        store, out = self.store, _Rendered()
        template = self.tok.render == TEMPLATE  # (a chat template's pieces: most texts seen before)
        self.cut_unchecked = self.tok.render == TEMPLATE  # one request a chunk: see check_cuts
        to_check = None
        fmts, bodies = tbl.column("format").to_pylist(), tbl.column("body").to_pylist()
        outputs, times = tbl.column("output").to_pylist(), tbl.column("ts_us").to_pylist()
        toks, out_toks = db.list_rows(tbl.column("tokens")), db.list_rows(tbl.column("output_tokens"))
        pre = {} if self.pool is None or template else rendered_rows(
            self.pool, self.tok.render, fmts, bodies, outputs, by_blobs, ahead)
        for i, rid in enumerate(tbl.column("request_id").to_pylist()):
            try:
                if by_blobs[i] and sel_pos[i] in broken:
                    raise Unrenderable(broken[sel_pos[i]])
                if (got := pre.get(i)) is not None and got[0] == "error":
                    raise Unrenderable(got[1])
                out_ids, seg_ids, parts = None, None, None
                if fmts[i] == "tokens":
                    if toks[i] is None:
                        raise ValueError("tokens format without tokens")
                    seg_ids, parts = [store.add_tokens(toks[i])], [1]
                    out_ids = None if out_toks[i] is None else [store.add_tokens(out_toks[i])]
                else:
                    if ahead is not None and (done := ahead.get(i)) is not None:
                        seg_ids, parts = done
                    elif got is not None and not by_blobs[i]:
                        seg_ids, parts = list(map(store.add_piece, got[1], got[2])), [p[2] for p in got[1]]
                    elif not by_blobs[i]:
                        body = parsed[i] if parsed is not None else None
                        if body is None:
                            if bodies[i] is None:
                                raise ValueError("no body")
                            body = loads(bodies[i])
                        pieces = self.tok.render_request(body, fmts[i], times[i])
                        if self.cut_unchecked:
                            self.cut_unchecked = False
                            to_check = (rid, pieces)
                        seg_ids = store.add_texts(pieces) if template else [store.add_piece(p) for p in pieces]
                        parts = [p[2] for p in pieces]
                    if got is not None:
                        out_ids = None if got[3] is None else list(map(store.add_piece, got[3], got[4]))
                    elif outputs[i] is not None and (o := loads(outputs[i])) is not None:
                        out_ids = [store.add_piece(p) for p in self.tok.render_output(o, fmts[i])]
            except render_template.TemplateError:
                raise  # (the template itself: every request would fail, so the stage stops with what to do)
            except Exception as exc:  # noqa: BLE001 - set aside with its reason, never silent
                out.aside.append((rid, str(exc) if isinstance(exc, Unrenderable) else type(exc).__name__))
                continue
            if by_blobs[i]:
                out.blob_rows.append(sel_pos[i])
                out.blob_out.append(out_ids)
            else:
                out.rows.append((rid, seg_ids, parts, out_ids))
        if to_check is not None:  # (outside the loop's handler: a failed check stops the stage)
            check_cuts(self.tok, *to_check)
        return out

    def _store(self, got: _Rendered, assembled, blob_rids: np.ndarray) -> None:
        """The chunk's new segments, prompts and set-aside requests, in one transaction
        (committed on the thread while the next chunk is read)."""
        con, store = self.con, self.store
        con.execute("BEGIN TRANSACTION")
        try:
            n_seg, n_tok = store.flush(con)
            known = store.known
            self.blob_cache.count_tokens(known)
            tables = []
            if got.rows:
                tables.append(_prompt_rows(got.rows, known))
            if got.blob_rows:
                tables.append(blob_prompts(assembled, self.blob_cache, got.blob_rows, got.blob_out, blob_rids,
                                           known))
            for ptbl in tables:
                _insert(con, "prompts", ptbl,
                        "request_id, n_tokens, seg_ids, seg_parts, output_seg_ids, output_n_tokens")
                self.logical += int(pa.compute.sum(ptbl.column("n_tokens")).as_py() or 0)
            if got.aside:
                _set_aside(con, got.aside, self.tok.name)
            failpoint("tokenize.chunk_written")  # (in the chunk's open transaction)
            self.committer.submit(_commit, con)  # the next chunk's work goes on meanwhile
            self.committer.submit(failpoint, "tokenize.chunk_committed")
        except BaseException:
            con.execute("ROLLBACK")
            # the in-memory index may now list rows that were rolled back
            store.known = dict(zip(*_fetch_known(con)))
            store.text_ids.clear()
            raise
        self.segments += n_seg
        self.tokens += n_tok
        self.prompts += len(got.rows) + len(got.blob_rows)
        self.aside += len(got.aside)

    def committed(self) -> None:
        """Wait for the previous chunk's commit; a failed one is rolled back, and raised."""
        try:
            self.committer.wait()
        except BaseException:
            db.rollback_quietly(self.con)
            raise

    def close(self) -> None:
        try:
            self.committed()  # (after an error elsewhere: that one is raised, a failed commit rolled back)
        except BaseException:
            pass
        self.committer.close()
        self.reads.close()
        if self.bar is not None:
            self.bar.close()


def _taken_ahead(tok: Tok, store: NewSegments, rids: np.ndarray, times: list, fmts: list, part_ids: list,
                 rows: list[int]) -> dict[int, tuple[list, list]]:
    """Row → (segment ids, parts) of the chunk's ``rows`` (rendered from parts)
    that the encoder process rendered ahead, taken in one ask (``template_ahead``;
    the rows up to the chunk's last are the stage's from then on). The first row
    is the stage's (its cuts checked: :func:`check_cuts`). A render is taken only
    when made from what the stage reads (time, format, part ids: an id is used
    again after a rolled-back file) and all its segments' tokens are here."""
    rows = rows[1:]
    if not rows:
        return {}
    got, tokens = tok.take_requests([int(rids[i]) for i in rows], int(rids[rows[-1]]))
    store.add_arrays(tokens)
    out = {}
    for i in rows:
        g = got.get(int(rids[i]))
        if g is None or g[0] != times[i] or g[1] != fmts[i] or list(g[2]) != part_ids[i]:
            continue
        sids = g[3].tolist()
        # (a segment missing: handed over to a chunk that was rolled back since)
        if all(store.has(s) for s in set(sids).difference(store.known)):
            out[i] = (sids, g[4].tolist())
    return out


def _prompt_rows(rows: list[tuple], known: dict[int, int]) -> pa.Table:
    """The ``prompts`` rows of requests rendered one by one."""
    count = known.__getitem__
    n_tokens = [sum(map(count, r[1])) for r in rows]
    out_n = [None if r[3] is None else sum(map(count, r[3])) for r in rows]
    return pa.table({
        "request_id": pa.array([r[0] for r in rows], pa.int64()),
        "n_tokens": pa.array(n_tokens, pa.int64()),
        "seg_ids": list_array([r[1] for r in rows], pa.uint64()),
        "seg_parts": list_array([r[2] for r in rows], pa.int32()),
        "output_seg_ids": list_array([r[3] for r in rows], pa.uint64()),
        "output_n_tokens": pa.array(out_n, pa.int64()),
    })


# --------------------------------------------------------------------------- read back

def load_prompt_tokens(con, request_ids: Iterable[int], with_output: bool = False
                       ) -> dict[int, np.ndarray]:
    """request_id → the prompt's full token array (int32), concatenating its
    segments; with ``with_output`` the output's segments are appended (when the
    prompt has them). Requests without a prompt row are absent from the result."""
    ids = [int(r) for r in request_ids]
    if not ids:
        return {}
    _replay_req_ids = pa.table({"request_id": pa.array(ids, pa.int64())})  # noqa: F841
    rows = con.execute(
        "SELECT p.request_id, p.seg_ids, p.output_seg_ids FROM prompts p "
        "JOIN _replay_req_ids q USING (request_id)").fetchall()
    wanted: set[int] = set()
    for _, segs, outs in rows:
        wanted.update(segs)
        if with_output and outs:
            wanted.update(outs)
    if not wanted:
        return {}
    _replay_seg_ids = pa.table({"seg_id": pa.array(  # noqa: F841
        np.fromiter(wanted, dtype=np.uint64, count=len(wanted)), pa.uint64())})
    tbl = con.sql("SELECT s.seg_id, s.tokens FROM segments s "
                  "JOIN _replay_seg_ids w USING (seg_id)").to_arrow_table()
    seg_ids = tbl.column("seg_id").to_pylist()
    arrays = db.list_rows(tbl.column("tokens"))
    by_id = {s: np.asarray(a, dtype=np.int32) for s, a in zip(seg_ids, arrays)}
    out: dict[int, np.ndarray] = {}
    empty = np.zeros(0, np.int32)
    for rid, segs, outs in rows:
        parts = [by_id[s] for s in segs]
        if with_output and outs:
            parts.extend(by_id[s] for s in outs)
        out[rid] = np.concatenate(parts) if parts else empty
    return out
