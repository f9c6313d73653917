"""Chat-template renderings that differ from the template's on purpose, and
where a template's rendering of two requests differs.

Both serve a chat template tokenization (``--chat-template``,
``replay.text.render_template``):

* ``replay whatif`` prices two fixes of the *rendering* (not of the bodies):

  ``fixed-template-date``       every request rendered with the template's "now"
                                (``strftime_now``, ``date_string``) pinned to one
                                instant: the log's first request's timestamp —
                                what a template printing a constant date gives;
  ``keep-history-as-rendered``  every assistant message keeps the rendering it had
                                when it was the newest message: its text is that of
                                the chunks attributed to it (``render_chunks``) when
                                ``messages[:j+1]`` are rendered (no generation
                                prompt) at the time of the first request holding it
                                (same messages up to it, same tools); the other
                                messages and the generation prompt are rendered as
                                in the request — what a template that never
                                rewrites earlier turns (drops their reasoning,
                                re-serializes their tool calls) gives.

  :func:`fixed_tok` wraps a template ``Tok`` so the tokenize stage renders
  with such a fix (its ``name`` says which; its segments are the base ``Tok``'s).

* ``replay diagnose`` names the divergences a template makes
  (:func:`template_cause`): ``template_date`` and ``template_history_rewrite``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from replay.text.render_template import ChatTemplate, Splitter, pieces_of, render_chunks, render_messages
from replay.text.template_messages import template_messages

#: the rendering fixes ``replay whatif`` knows for a template tokenization
TEMPLATE_FIXES = ("fixed-template-date", "keep-history-as-rendered")
#: the diagnose causes only a template tokenization can have
TEMPLATE_CAUSES = ("template_date", "template_history_rewrite")


# --------------------------------------------------------------------------- rendering

class KeepHistory:
    """The ``keep-history-as-rendered`` rendering. Requests must be rendered in
    time order (the tokenize stage renders them in ``request_id`` order, which
    ingest gives in time order; :func:`history_renderings` precomputes them in
    time order whatever the order)."""

    def __init__(self, tpl: ChatTemplate):
        self.tpl = tpl
        self.kept: dict[str, str] = {}  # (messages[:j+1], tools) → message j's text

    def chunks(self, body: dict, fmt: str | None, ts_us: int | None) -> tuple[list[tuple[str, int]], list[int]]:
        messages, tools, origin = template_messages(body, fmt, self.tpl.reads_blocks)
        chunks = render_messages(self.tpl, messages, tools, ts_us)
        tkey = json.dumps(tools, sort_keys=False, ensure_ascii=False, default=str)
        out: list[tuple[str, int]] = []
        done: set[int] = set()
        for c, j in chunks:
            if j >= 0 and isinstance(messages[j], dict) and messages[j].get("role") == "assistant":
                if j in done:
                    continue
                done.add(j)
                key = tkey + "\x00" + json.dumps(messages[:j + 1], ensure_ascii=False, default=str)
                text = self.kept.get(key)
                if text is None:
                    first = render_messages(self.tpl, messages[:j + 1], tools, ts_us, False)
                    text = self.kept[key] = "".join(x for x, i in first if i == j)
                if text:
                    out.append((text, j))
                continue
            out.append((c, j))
        return out, origin


def fixed_tok(tok, fixes, first_ts_us: int | None = None, order: list | None = None):
    """``tok`` (a template ``Tok``) rendering requests with the rendering fixes
    ``fixes`` (names of :data:`TEMPLATE_FIXES`, one or both): a shallow copy
    sharing its encoder, whose ``name`` ends ``+fix=NAMES`` and whose
    ``same_segments_as`` is ``tok.name`` (a text's tokens are the same).
    ``first_ts_us``: the instant ``fixed-template-date`` pins; ``order``:
    ``(ts_us, request_id, body, fmt)`` of every request, for
    ``keep-history-as-rendered`` (rendered in time order up front, so a
    request's rendering does not depend on the order the tokenize stage meets
    them)."""
    fixes = [fixes] if isinstance(fixes, str) else list(fixes)
    for f in fixes:
        if f not in TEMPLATE_FIXES:
            raise ValueError(f"unknown template fix {f!r}; choose from {', '.join(TEMPLATE_FIXES)}")
    if getattr(tok, "template", None) is None:
        raise ValueError(f"the fix {', '.join(fixes)} changes how a chat template renders: it needs the prompts "
                         "tokenized with one (--chat-template)")
    tpl: ChatTemplate = tok.template
    splitter = Splitter.of_file(tok.path)
    pinned = "fixed-template-date" in fixes

    def when(ts_us):
        return first_ts_us if pinned else ts_us

    if "keep-history-as-rendered" in fixes:
        keep = KeepHistory(tpl)
        done: dict[str, list] = {}
        for ts, _rid, body, fmt in sorted(order or [], key=lambda x: (x[0] if x[0] is not None else 0, x[1])):
            if isinstance(body, dict):
                try:
                    done.setdefault(_body_key(body, fmt, ts),
                                    pieces_of(splitter, *keep.chunks(body, fmt, when(ts))))
                except Exception:  # noqa: BLE001 - the tokenize stage sets it aside with its reason
                    pass

        def render(body: dict, fmt: str = "anthropic", ts_us: int | None = None) -> list:
            got = done.get(_body_key(body, fmt, ts_us))
            return got if got is not None else pieces_of(splitter, *keep.chunks(body, fmt, when(ts_us)))
    else:
        def render(body: dict, fmt: str = "anthropic", ts_us: int | None = None) -> list:
            return pieces_of(splitter, *render_chunks(tpl, body, fmt, when(ts_us)))
    out = copy.copy(tok)
    out.owns_process = False  # (it shares tok's encoder process: only tok stops it)
    out.name = f"{tok.name}+fix={','.join(sorted(fixes))}"
    out.same_segments_as = tok.name
    out.render_request = render
    return out


def _body_key(body: dict, fmt, ts) -> str:
    return f"{fmt}\x00{ts}\x00" + json.dumps(body, ensure_ascii=False, default=str)


# --------------------------------------------------------------------------- naming a divergence

def _no_cc(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _no_cc(x) for k, x in v.items() if k != "cache_control"}
    if isinstance(v, list):
        return [_no_cc(x) for x in v]
    return v


def _logged(body: dict) -> tuple[Any, Any, list]:
    """(system, tools, logged messages) of a body, as ``template_messages`` numbers them."""
    system = body.get("system")
    if system is None:
        system = body.get("instructions")
    logged = body.get("messages")
    if logged is None:
        inp = body.get("input", body.get("prompt"))
        logged = [inp] if isinstance(inp, str) else (inp if isinstance(inp, list) else [])
    if isinstance(logged, dict):
        logged = [logged]
    return system, body.get("tools"), list(logged)


def logged_equal_upto(body_r: dict, body_c: dict, part: int) -> bool:
    """Are the two bodies' logged system, tools and messages equal (``cache_control``
    aside) up to and including ``part`` (``1``: system and tools, ``2 + k``: also
    messages ``0..k``)?"""
    sr, tr, mr = _logged(body_r)
    sc, tc, mc = _logged(body_c)
    if part >= 1 and (_same(sr, sc) is False or _same(tr, tc) is False):
        return False
    if part >= 2:
        k = part - 2
        if len(mr) <= k or len(mc) <= k:
            return False
        return _same(mr[:k + 1], mc[:k + 1])
    return True


def _same(a: Any, b: Any) -> bool:
    """Equal as logged: key order counts (a reordered object is the body's change,
    not the template's); ``cache_control`` does not."""
    return json.dumps(_no_cc(a), ensure_ascii=False, default=str) == json.dumps(_no_cc(b), ensure_ascii=False,
                                                                               default=str)


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # (binary search on slices: fast for long texts)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _part_at(chunks: list[tuple[str, int]], origin: list[int], pos: int) -> int:
    at = 0
    last = 0
    for c, j in chunks:
        last = origin[j] if j >= 0 else 0
        if at <= pos < at + len(c):
            return last
        at += len(c)
    return last


def template_cause(rendered_r: tuple, rendered_c: tuple, r_at_c, body_r: dict, body_c: dict
                   ) -> tuple[str | None, dict]:
    """The template cause of the first difference between request ``r``'s and the
    earlier request ``c``'s renderings (``rendered_*``: ``render_chunks``'s
    ``(chunks, origin)``), or None (then the body-level rules name it);
    ``r_at_c()``: ``r``'s chunks rendered at ``c``'s time (None: same time):

    ``template_date``  rendering ``r`` at ``c``'s time agrees with ``c`` beyond
        the divergence point: the differing bytes come from the template's time
        variables (``info['aligned_char']``: where the two then part, which
        bounds what the date cost — ``replay.analysis.diagnose`` charges no more);
    ``template_history_rewrite``  the divergence falls in a message (of both
        renderings) and the logged system, tools and messages up to and
        including it are equal in both bodies — the template rendered the same
        logged message differently (and not because of the time).
    """
    (cr, orig_r), (cc, orig_c) = rendered_r, rendered_c
    a, b = "".join(c for c, _ in cr), "".join(c for c, _ in cc)
    cp = common_prefix(a, b)
    if cp >= min(len(a), len(b)):
        return None, {}
    info = {"char_offset": cp}
    pr, pc = _part_at(cr, orig_r, cp), _part_at(cc, orig_c, cp)
    aligned_chunks = r_at_c()
    if aligned_chunks is not None:
        a2 = "".join(c for c, _ in aligned_chunks)
        aligned = common_prefix(a2, b)
        if a2 != a and aligned > cp:
            return "template_date", {**info, "aligned_char": aligned}
    if pr >= 2 and pc >= 2 and logged_equal_upto(body_r, body_c, max(pr, pc)):
        return "template_history_rewrite", info
    return None, {}
