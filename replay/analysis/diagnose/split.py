"""The per-request split: every prompt token a hit, new content, or lost to one cause.

For one configuration (TTL τ, block B, minimum prefix m, stream mode) every
request's prompt splits into parts that add up *exactly* to its length (see
``replay.analysis.diagnose``):

    prompt_tokens = hit + block_rounding + below_minimum + ttl_expired
                    + stream_split + premature + new_content

``L_τ``, ``L_∞`` (the request's walk in its cache) and ``L_g`` (its walk in the
model's global cache) come from the walks through ``replay.core.hits``; the
unshared remainder is split by comparing the request with its closest earlier
request of the same model (``segments.CandidateIndex``) and naming the
divergence (``rules.classify_pieces``).
"""

from __future__ import annotations

import json

import polars as pl

from replay.analysis.diagnose.rules import classify_pieces, first_changed_tool, line_causes, similar, tools_cause
from replay.analysis.diagnose.segments import (CandidateIndex, build_request, chain, new_start, part_label,
                                                   span_text, system_span, token_lcp)
from replay.core import hits
from replay.core.prompts import SegmentStore, time_ordered_chunks
from replay.core.streams import stream_key
from replay.times import INF_US, seconds, ttl_us
from replay.core.walks import read_walks
from replay.store import db
from replay.text.renderers import TEMPLATE, render_of, request_renderer
from replay.text.render_template import Splitter, pieces_of, render_chunks, render_text
from replay.text.template_fixes import TEMPLATE_CAUSES, common_prefix, template_cause
from replay.text.segids import marker_seg_id

#: premature-divergence causes, in the order ties are listed
CAUSES = ("rotating_header", "timestamp", "volatile_id", "per_user_data", "tool_order",
          "tool_schema_change", "json_key_order", "history_rewrite", "template_date",
          "template_history_rewrite", "other")
#: the additive parts of a request, in order
PARTS = ("hit", "block_rounding", "below_minimum", "ttl_expired", "stream_split", "premature",
         "new_content")
#: parts that are losses (reported as causes next to the premature-divergence causes)
STRUCTURAL = ("block_rounding", "below_minimum", "ttl_expired", "stream_split")

FRAME_SCHEMA = {"request_id": pl.Int64, "stream": pl.Utf8, "model": pl.Utf8, "ts": pl.Float64,
                "prompt_tokens": pl.Int64, **{p: pl.Int64 for p in PARTS}, "cause": pl.Utf8, "also": pl.Utf8,
                "where": pl.Utf8, "compared_with": pl.Int64, "idle_gap_s": pl.Float64, "L_global": pl.Int64}


def walk_figures(con, stream: str, ttl: int) -> dict[int, tuple]:
    """request_id → (stream key, model, prompt_tokens, L_τ, L_∞, idle gap µs or None, L_g)
    for mode ``stream`` (the walks must be current for an infinite horizon)."""
    w = read_walks(con, (stream,), horizon_us=INF_US)
    L = hits.depths_under(w.offsets, w.gaps, w.depths, [ttl, INF_US])
    beyond = hits.first_gap_beyond(w.offsets, w.gaps, ttl)
    g = read_walks(con, ("global",), horizon_us=INF_US, with_streams=False)
    glob = dict(zip(g.request_id.tolist(), hits.depths_under(g.offsets, g.gaps, g.depths, [INF_US])[:, 0].tolist()))
    out = {}
    for k, rid in enumerate(w.request_id.tolist()):
        lt, li = int(L[k, 0]), int(L[k, 1])
        gap = int(beyond[k]) if beyond[k] >= 0 else None
        out[rid] = (w.stream[k], w.model[k], int(w.prompt_tokens[k]), lt, li, gap, int(glob.get(rid, li)))
    return out


def analyse(con, stream: str, ttl: float, block: int, min_prefix: int, tok=None):
    """Per-request rows (dicts) plus the divergences to classify (for examples).
    ``tok``: the ``Tok`` the prompts were tokenized with (needed, and checked,
    when that was a chat template: ``check_renderable``)."""
    tok = check_renderable(con, tok)
    figs = walk_figures(con, stream, ttl_us(ttl))
    store = SegmentStore(con)
    ntok, sys_marker = store.lengths(), marker_seg_id("system")
    names = ("request_id", "ts_us", "tenant", "prompt_cache_key", "session", "user_id", "model", "format",
             "seg_ids", "seg_parts")
    reqs = (row for tbl in time_ordered_chunks(con, ", ".join(
                ("p." if c.startswith("seg_") else "r.") + c for c in names))
            for row in zip(*(tbl.column(c).to_pylist() for c in names)))
    indexes: dict[str | None, CandidateIndex] = {}  # one per model: no other model's cache can serve
    # a template that prints the time: requests as rendered at one instant, to find
    # the earlier request of another day that shares the most but for the time
    pinned_chains = _pinned_chains(con, tok) if tok is not None else {}
    pinned_indexes: dict[str | None, dict] = {}
    by_id: dict = {}
    rows: list[dict] = []
    pending: list[tuple] = []
    also: list[tuple] = []
    for rid, ts, tenant, key, session, user_id, model, fmt, seg_ids, seg_parts in reqs:
        if rid not in figs:
            continue
        row = _row(rid, ts, figs[rid], block, min_prefix)
        rows.append(row)
        if seg_ids is None or fmt in ("tokens", "mooncake"):
            continue
        user = user_id if user_id is not None else f"tenant:{tenant}"
        r = build_request(rid, ts, session, user, stream_key(stream, tenant, key, session),
                          seg_ids, seg_parts, ntok, sys_marker)
        r.tenant = tenant
        index = indexes.setdefault(model, CandidateIndex())
        hs, mh = chain(r.segs.tolist()), chain([m[3] for m in r.msgs if not m[2]])
        ph = pinned_chains.get(rid, [])
        pidx = pinned_indexes.setdefault(model, {})
        j = CandidateIndex._longest(ph, pidx)
        _compare(row, r, hs, mh, index, by_id, store.tokens, pending, also, tok is not None,
                 (pidx[ph[j - 1]],) if j else ())
        index.add(r, hs, mh)
        for h in ph:
            pidx[h] = rid
        by_id[rid] = r
    _classify(con, pending, also, tok, rows)
    for row in rows:
        extra = sorted(set(row.pop("_also", ())) - {row["cause"]}, key=CAUSES.index)
        row["also"] = ",".join(extra) if extra else None
    return rows, pending


def _row(rid: int, ts: int, fig: tuple, block: int, min_prefix: int) -> dict:
    skey, model, n, lt, li, gap, lg = fig
    floored = (lt // block) * block
    hit = 0 if floored < min_prefix else floored
    return {"request_id": rid, "stream": skey, "model": model, "ts": seconds(ts), "prompt_tokens": n,
            "hit": hit, "block_rounding": lt - floored, "below_minimum": floored - hit,
            "ttl_expired": li - lt, "stream_split": lg - li, "premature": 0, "new_content": n - lg,
            "cause": None, "where": None, "compared_with": None,
            "idle_gap_s": seconds(gap) if li > lt and gap is not None else None, "L_global": lg}


def _compare(row: dict, r, hs, mh, index: CandidateIndex, by_id: dict, tokens, pending: list, also: list,
             template: bool = False, pinned: tuple = ()) -> None:
    """Find ``r``'s closest earlier request among the candidates; queue the divergence
    (and those from the previous request of its stream / session, as secondary causes)."""
    lg = row["L_global"]
    best, seen = None, {}
    if row["prompt_tokens"] > lg:
        for cid in index.candidates(r, hs, mh):
            c = by_id[cid]
            L_c, i_c = token_lcp(r, c, tokens)
            pot = new_start(r, c)
            seen[cid] = (c, L_c, i_c, pot)
            score = (pot, L_c, c.session is not None and c.session == r.session, c.user == r.user,
                     c.tenant is not None and c.tenant == r.tenant, c.ts, c.rid)
            if best is None or score > best[0]:
                best = (score, c, L_c, i_c, pot)
    if best is None:
        return
    _, c, L_c, i_c, pot = best
    if template:
        # under a template that prints the time, the same application's request of
        # another day may be the one this request lost to (template_date), though
        # another's of the same day shares more: _classify weighs those
        for pid in pinned:
            if pid not in seen and pid in by_id:
                a = by_id[pid]
                seen[pid] = (a, *token_lcp(r, a, tokens), new_start(r, a))
        alts = [seen[pid] for pid in [*(index.last.get((kind, val)) for kind, val in (
                    ("session", r.session), ("user", r.user), ("stream", r.stream), ("tenant", r.tenant))
                    if val is not None), *pinned]
                if pid is not None and pid != c.rid and pid in seen and seen[pid][3] > lg]
        if alts:
            row["_alts"] = (r, c, list({a[0].rid: a for a in alts}.values()))
    row["compared_with"] = c.rid
    if pot > lg and i_c < len(r.segs) and i_c < len(c.segs):
        pending.append((row, r, c, i_c, pot))
    for kind in ("stream", "session"):
        val = r.stream if kind == "stream" else r.session
        pid = index.last.get((kind, val)) if val is not None else None
        if pid is None or pid == c.rid or pid not in seen:
            continue
        pc, L_p, i_p, pot_p = seen[pid]
        if pot_p > L_p and i_p < len(r.segs) and i_p < len(pc.segs):
            also.append((row, r, pc, i_p, pot_p))


def check_renderable(con, tok):
    """The ``Tok`` to render the stored prompts' bodies with: ``tok`` when the
    prompts were tokenized under a chat template (refused, ValueError, when
    ``tok`` is not that template's tokenization), else None (the rendering
    the stored tokenization's name says)."""
    used = db.get_meta(con, "tokenizer")
    if render_of(used) != TEMPLATE:
        return None
    if tok is None or getattr(tok, "template", None) is None or tok.name != used:
        raise ValueError(f"the prompts were tokenized under a chat template ({used}): pass the same "
                         "template (--chat-template) so the diagnosis renders the bodies as they were tokenized")
    return tok


BODY_CHUNK_CHARS = 32 << 20  # body text one query fetches


class _Rendered:
    """Bodies and rendered pieces of the requests a classification looks at."""

    def __init__(self, con, ids, tok=None):
        self.bodies: dict[int, tuple[dict, str]] = {}
        self.times: dict[int, int] = {}
        wanted = {int(x) for x in ids}
        sizes = [(rid, n) for rid, n in db.body_sizes(con) if rid in wanted]
        blob_texts: dict = {}
        for group in db.chunks_by_size(sizes, BODY_CHUNK_CHARS):  # (the bodies are assembled a stretch at a time)
            q = ",".join(str(x) for x in group)
            texts = db.fetch_bodies(con, group, blob_texts)
            for rid, fmt, ts in con.execute(
                    f"SELECT r.request_id, r.format, r.ts_us FROM requests r WHERE r.request_id IN ({q})").fetchall():
                body = texts.get(rid)
                self.times[rid] = ts
                try:
                    self.bodies[rid] = (json.loads(body), fmt)
                except (TypeError, ValueError):
                    self.bodies[rid] = ({}, fmt)
        self._pieces: dict[int, list] = {}
        self._chunks: dict[tuple[int, int | None], tuple | None] = {}
        self.template = None if tok is None else tok.template
        self.encode = None if tok is None else tok.encode
        if self.template is not None:  # (the template's now is the request's time)
            splitter = Splitter.of_file(tok.path)
            self._render = lambda rid: pieces_of(splitter, *self.chunks(rid))
        else:
            plain = request_renderer(render_of(db.get_meta(con, "tokenizer")))  # as tokenized
            self._render = lambda rid: plain(*self.bodies.get(rid, ({}, "anthropic")))

    def chunks(self, rid: int, ts_us: int | None = None) -> tuple:
        """A request as the template renders it (``render_chunks``), at its own
        time or at ``ts_us``; raises when the body cannot be rendered."""
        key = (rid, self.times.get(rid) if ts_us is None else ts_us)
        if key not in self._chunks:
            b, fmt = self.bodies.get(rid, ({}, "anthropic"))
            try:
                self._chunks[key] = render_chunks(self.template, b, fmt, key[1])
            except Exception:  # noqa: BLE001 - remembered as unrenderable
                self._chunks[key] = None
            if len(self._chunks) > 4096:
                self._chunks.pop(next(iter(self._chunks)))
        got = self._chunks[key]
        if got is None:
            raise ValueError(f"request {rid} cannot be rendered")
        return got

    def text(self, rid: int) -> str:
        """The rendered text of a request (a template's pieces are all text)."""
        return "".join(p[1] for p in self.pieces(rid) if p[0] == "text")

    def text_at(self, rid: int, ts_us: int) -> str:
        """The rendered text of a request with the template's now at ``ts_us``."""
        try:
            return "".join(c for c, _ in self.chunks(rid, ts_us)[0])
        except ValueError:  # unrenderable: nothing in common
            return ""

    def tokens_before(self, r, char: int) -> int:
        """About how many of ``r``'s tokens its first ``char`` characters make: the
        pieces before the one holding ``char``, and that piece's text up to it
        encoded on its own."""
        pieces = self.pieces(r.rid)
        if len(pieces) != len(r.segs):  # (rendered otherwise than stored: no bound)
            return int(r.cum[-1])
        at = 0
        for k, p in enumerate(pieces):
            if at + len(p[1]) > char:
                part = p[1][:char - at]
                return int(r.cum[k]) + (len(self.encode(part)) if part else 0)
            at += len(p[1])
        return int(r.cum[-1])

    def template_judge(self, rid: int, cid: int) -> tuple[str | None, dict]:
        ts_r, ts_c = self.times.get(rid), self.times.get(cid)
        try:
            return template_cause(self.chunks(rid), self.chunks(cid),
                                  lambda: None if ts_r == ts_c else self.chunks(rid, ts_c)[0],
                                  self.bodies[rid][0], self.bodies[cid][0])
        except Exception:  # noqa: BLE001 - an unrenderable body: the body-level rules decide
            return None, {}

    def pieces(self, rid: int) -> list:
        if rid not in self._pieces:
            try:
                self._pieces[rid] = self._render(rid)
            except Exception:  # noqa: BLE001 - an unrenderable body is classified 'other'
                self._pieces[rid] = []
            if len(self._pieces) > 4096:
                self._pieces.pop(next(iter(self._pieces)))
        return self._pieces[rid]

    def judge(self, r, c, i: int):
        """(where, cause or None when not premature, details) of the divergence at segment ``i``."""
        kind, label = part_label(r, i)
        if kind == "message" and r.session is not None and c.session is not None and r.session != c.session:
            return label, None, {}
        pr, pc = self.pieces(r.rid), self.pieces(c.rid)
        if len(pr) != len(r.segs) or len(pc) != len(c.segs):
            return label, "other", {}
        if self.template is not None:  # what the template did, before what the bodies did
            cause, info = self.template_judge(r.rid, c.rid)
            if cause is not None:
                return label, cause, info
            if kind in ("tools", "system"):
                # a template writes the tools as text inside its preamble: the logged
                # tools say whether they changed; else the preamble's text does
                tr, tc = self.bodies[r.rid][0].get("tools") or [], self.bodies[c.rid][0].get("tools") or []
                j = first_changed_tool(tr, tc) if isinstance(tr, list) and isinstance(tc, list) else None
                if j is not None:
                    return label, tools_cause(tr, tc, j), {"tool_index": j, "char_offset": 0}
                kind = "system"
        cause, info = classify_pieces(pr, pc, i, self.bodies[r.rid][0], self.bodies[c.rid][0],
                                      r.user == c.user, kind)
        return label, cause, info


def _classify(con, pending, also=(), tok=None, rows=None) -> None:
    """Name each queued divergence and move its premature tokens out of new content."""
    if not pending and not also and not any("_alts" in row for row in rows or ()):
        return
    alt_rows = [row for row in rows if "_alts" in row] if rows else []
    ids = {x for _, r, c, _, _ in list(pending) + list(also) for x in (r.rid, c.rid)}
    ids.update(a[0].rid for row in alt_rows for a in row["_alts"][2])
    ids.update(x for row in alt_rows for x in (row["_alts"][0].rid, row["_alts"][1].rid))
    rend = _Rendered(con, sorted(ids), tok)
    for row, r, c, i, pot in pending:
        label, cause, info = rend.judge(r, c, i)
        row["where"] = label
        if cause is None:
            continue
        if label == "tools":
            # the tools diverged; if the system prompts are another application's
            # altogether, only the rest of the tools was lost, not the system
            s0, s1 = system_span(r)
            if s1 > s0:
                c0, c1 = system_span(c)
                ta, tb = span_text(rend.pieces(r.rid), s0, s1), span_text(rend.pieces(c.rid), c0, c1)
                if ta != tb and not similar(ta, tb):
                    pot = min(pot, int(r.cum[s0]))
                    if pot <= row["L_global"]:
                        continue
        if cause == "template_date":
            pot = min(pot, rend.tokens_before(r, info["aligned_char"]))
            if pot <= row["L_global"]:
                continue
        lost = pot - row["L_global"]
        row["premature"] = lost
        row["new_content"] -= lost
        row["cause"] = cause
        row["_detail"] = (i, info)
    for row in alt_rows:
        _another_day(rend, row, *row.pop("_alts"))
    for row, r, c, i, _ in also:
        _, cause, _ = rend.judge(r, c, i)
        if cause is not None:
            row.setdefault("_also", []).append(cause)
    # further changed lines in the diverging system piece (secondary causes, no tokens)
    for row, r, c, i, _ in list(pending) + list(also):
        pr, pc = rend.pieces(r.rid), rend.pieces(c.rid)
        if part_label(r, i)[0] == "system" and i < len(pr) and i < len(pc) and pr[i][0] == pc[i][0] == "text" \
                and row.get("cause") is not None and row["cause"] not in TEMPLATE_CAUSES:
            row.setdefault("_also", []).extend(line_causes(pr[i][1], pc[i][1], r.user == c.user, False))


def _pinned_chains(con, tok) -> dict[int, list[int]]:
    """Request id → prefix hashes of its pieces rendered with the template's now
    at the epoch (``segments.chain``), when the template prints the time; else {}."""
    tpl = tok.template
    splitter = Splitter.of_file(tok.path)
    rows = con.execute("SELECT r.request_id, r.ts_us, r.format, b.body FROM requests r "
                       "JOIN request_bodies b USING (request_id) WHERE b.body IS NOT NULL").fetchall()
    out: dict[int, list[int]] = {}
    probe = None
    for rid, ts, fmt, body in rows:
        try:
            b = json.loads(body)
            if probe is None:  # one request, a day, an hour and a minute apart: is the time printed?
                if render_text(tpl, b, fmt, ts) == render_text(tpl, b, fmt, ts + 90_060_000_000):
                    return {}
                probe = rid
            text = render_text(tpl, b, fmt, 0)
        except Exception:  # noqa: BLE001 - unrenderable: no pinned candidate
            continue
        out[rid] = chain(text[s:e] for s, e in splitter.split(text))
    return out


def _another_day(rend: "_Rendered", row: dict, r, c, alts: list) -> None:
    """Charge ``row`` to ``template_date`` against an earlier request of its own
    session / user / stream / tenant (``alts``: (request, L, i, new start)) when
    the template's time is what parts them and, rendered at that request's time,
    this one shares more text with it than with ``c``, the request that held
    most of its tokens (another application's of the same day, say)."""
    if row.get("cause") in TEMPLATE_CAUSES:
        return
    text_r, text_c = rend.text(r.rid), rend.text(c.rid)
    shared = common_prefix(text_r, text_c)
    for a, _, i, pot in sorted(alts, key=lambda x: -x[3]):
        if a.ts == r.ts:
            continue
        cause, info = rend.template_judge(r.rid, a.rid)
        if cause != "template_date" or common_prefix(rend.text_at(r.rid, a.ts), rend.text(a.rid)) <= shared:
            continue
        pot = min(pot, rend.tokens_before(r, info["aligned_char"]))
        if pot <= row["L_global"]:
            continue
        row["new_content"] += row["premature"]
        row["premature"] = pot - row["L_global"]
        row["new_content"] -= row["premature"]
        row["cause"], row["where"], row["compared_with"] = cause, part_label(r, i)[0], a.rid
        row["_detail"] = (i, info)
        return


def frame(rows) -> pl.DataFrame:
    return pl.DataFrame([{k: r.get(k) for k in FRAME_SCHEMA} for r in rows], schema=FRAME_SCHEMA, orient="row")
