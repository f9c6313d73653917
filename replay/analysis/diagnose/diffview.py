"""Where two consecutive requests of a stream first differ (``replay diff``), text masked."""

from __future__ import annotations

import json

from replay.analysis.diagnose.rules import classify_text, line_window, shown
from replay.times import US_PER_S
from replay.store import db
from replay.text.renderers import render_of, request_renderer


def diff_view(con, stream_or_session: str, index: int | None = None, show_text: bool = False) -> str:
    """Two consecutive requests of a stream (or session) and where their rendered
    bytes first differ: part, piece, character offset. Text is masked unless
    ``show_text``. ``index`` picks the pair (request ``index`` against
    ``index − 1`` of the stream, 0-based); default: the first pair where the later
    request does not extend the earlier one, else the last pair."""
    s = stream_or_session
    where, params = [], []
    if ":" in s:
        kind, val = s.split(":", 1)
        col = {"tenant": "tenant", "key": "prompt_cache_key", "session": "session"}.get(kind)
        if col is None:
            raise ValueError(f"unknown stream kind {kind!r}: tenant:, key: or session:")
        where.append(f"{col} = ?")
        params.append(val)
    else:
        where.append("(session = ? OR tenant = ? OR prompt_cache_key = ?)")
        params += [s, s, s]
    rows = con.execute(f"""SELECT r.request_id, r.ts_us / {US_PER_S}, r.format, b.body
                           FROM requests r JOIN request_bodies b USING (request_id)
                           WHERE {' AND '.join(where)} AND b.body IS NOT NULL
                           ORDER BY r.ts_us, r.request_id""", params).fetchall()
    if len(rows) < 2:
        return f"{s}: fewer than two requests with a body"
    rendered = []
    render_request = request_renderer(render_of(db.get_meta(con, "tokenizer")))  # as tokenized

    def piece_list(k):
        while len(rendered) <= k:
            rid, ts, fmt, body = rows[len(rendered)]
            rendered.append(render_request(json.loads(body), fmt))
        return rendered[k]

    def first_diff(a, b):
        for j, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return j
        return min(len(a), len(b))

    if index is None:
        index = len(rows) - 1
        for k in range(1, len(rows)):
            a, b = piece_list(k - 1), piece_list(k)
            j = first_diff(a, b)
            if j < len(a) - 1:  # the earlier prompt (but its generation marker) is not kept
                index = k
                break
    if not 1 <= index < len(rows):
        raise ValueError(f"index must be between 1 and {len(rows) - 1}")
    a, b = piece_list(index - 1), piece_list(index)
    j = first_diff(a, b)
    (ra, ta, _, _), (rb, tb, _, _) = rows[index - 1], rows[index]
    out = [f"stream {s}: request {rb} (#{index}, t={tb:.3f}) against request {ra} "
           f"(#{index - 1}, t={ta:.3f}, {tb - ta:.1f} s earlier)",
           f"  earlier: {len(a)} pieces, {_chars(a):,} chars; later: {len(b)} pieces, {_chars(b):,} chars"]
    if j >= len(a):
        out.append("  the earlier prompt is a prefix of the later one: no divergence")
        return "\n".join(out)
    if j >= len(b):
        out.append(f"  the later prompt stops at piece {j} (a prefix of the earlier one)")
        return "\n".join(out)
    pa_, pb_ = a[j], b[j]
    part = pb_[2]
    label = "tools" if part == 0 else "system" if part == 1 else f"message {part - 2}"
    same_chars = _chars(b[:j])
    out.append(f"  first difference: piece {j} ({label}), after {same_chars:,} identical chars")
    if pa_[0] == "text" and pb_[0] == "text":
        ls, w0, wa, wb, la, lb = line_window(pb_[1], pa_[1])
        off = ls + w0
        out.append(f"  at char {off:,} of the piece (line {pb_[1].count(chr(10), 0, off) + 1})")
        out.append(f"  earlier: …{shown(lb[w0:wb], show_text)}…   in line {shown(lb, show_text)}")
        out.append(f"  later:   …{shown(la[w0:wa], show_text)}…   in line {shown(la, show_text)}")
        cause, _ = classify_text(pb_[1], pa_[1], True, part >= 2)
        out.append(f"  looks like: {cause}")
    else:
        out.append(f"  earlier piece: {pa_[0]} {pa_[1] if pa_[0] == 'marker' else shown(str(pa_[1]), show_text)}")
        out.append(f"  later piece:   {pb_[0]} {pb_[1] if pb_[0] == 'marker' else shown(str(pb_[1]), show_text)}")
    return "\n".join(out)


def _chars(pieces) -> int:
    return sum(len(p[1]) for p in pieces if p[0] == "text")
