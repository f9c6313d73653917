"""Why requests miss: an exact, additive split of every missed prompt token.

For one configuration (TTL τ, block B, minimum prefix m, stream mode, profile)
every request's prompt splits into parts that add up *exactly* to its length:

    prompt_tokens = hit + block_rounding + below_minimum + ttl_expired
                    + stream_split + premature + new_content

from the walks the replay already keeps (``walks``; see ``replay.py``):

* ``L_τ``   = deepest step of the request's walk in its stream with gap ≤ τ,
* ``L_∞``   = deepest step in its stream whatever the gap,
* ``L_g``   = deepest step in the ``global`` walk (every earlier request),
* ``hit``   = floor(L_τ/B)·B, zeroed when < m (semantics.md);
* ``block_rounding`` = L_τ − floor(L_τ/B)·B; ``below_minimum`` = the floored hit
  when it is < m; ``ttl_expired`` = L_∞ − L_τ (with the idle gap that made the
  prefix go cold: the gap of the first walk step beyond τ); ``stream_split`` =
  L_g − L_∞ (the prefix lived in another tenant's / key's / session's stream);
* the unshared remainder ``prompt_tokens − L_g`` is split by looking at where the
  prompt diverged from its *closest earlier request* ``c``: ``premature`` tokens
  are those between the divergence point ``L_g`` and the start of the content
  that is genuinely new in this turn (the trailing run of messages that ``c``
  does not hold); everything else is ``new_content``.

The closest earlier request is searched among a small candidate set: the most
recent requests sharing the longest segment prefix (the ones realising ``L_g``),
the previous request of the same session, stream and user, and the latest
request whose conversation messages are the longest prefix of this one's. The
candidate that held the most of this request's content (largest new-content
start, then longest shared prefix, then same session/user, then most recent) is
``c``; its divergence point is classified by rules on the rendered pieces and
the request bodies (never on any ground-truth file):

``rotating_header``  the first differing line is a header line (``x-…:`` or
                     ``…-header:``), e.g. ``x-anthropic-billing-header: … cch=…``;
``tool_order``       same tool names, other order;
``json_key_order``   same JSON value, other key order / separators / escaping
                     (tool definitions, or any piece that parses as JSON);
``tool_schema_change`` same tool name, other definition (e.g. description);
``timestamp``        the differing bytes are part of a date / time / epoch;
``volatile_id``      … of a UUID, long hex id, prefixed id (``req_…``) or a long
                     random-looking token;
``per_user_data``    the same position differs and the two requests belong to
                     different users (``user_id``: Anthropic ``metadata.user_id``,
                     OpenAI ``user``, or a mapped field; else the tenant);
``history_rewrite``  an earlier message of the conversation was edited,
                     truncated or summarised;
``other``            anything else before the new content.

A divergence is *not* premature (its tokens are ``new_content``) when ``c``
held nothing of this request beyond the divergence point, when the two
requests are different conversations (different non-null sessions, for a
divergence inside the messages), or when the differing tools/system are not
similar at all (a different application).

Text is never shown unless asked: examples carry lengths, character classes
and short hashes of the differing bytes (``show_text=True`` shows them).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from replay.store import db
from replay.text.render import tool_name

__all__ = ["CAUSES", "PARTS", "miss_parts", "diagnose", "diff_view", "why_miss_section",
           "register", "format_text", "classify_pieces", "mask"]

#: premature-divergence causes, in the order ties are listed
CAUSES = ("rotating_header", "timestamp", "volatile_id", "per_user_data", "tool_order",
          "tool_schema_change", "json_key_order", "history_rewrite", "other")
#: the additive parts of a request, in order
PARTS = ("hit", "block_rounding", "below_minimum", "ttl_expired", "stream_split", "premature",
         "new_content")
#: parts that are losses (reported as causes next to the premature-divergence causes)
STRUCTURAL = ("block_rounding", "below_minimum", "ttl_expired", "stream_split")

# --------------------------------------------------------------------------- byte rules

HEADER_RE = re.compile(r"^\s*(?:x-[\w.-]+|[\w.-]*-header)\s*:", re.I)
TIMESTAMP_RES = (
    re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
               r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?)?"),
    re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"),
    re.compile(r"\b\d{1,2}:\d{2}\s?(?:[AaPp][Mm])\b"),
    re.compile(r"\b1[5-9]\d{8}(?:\.\d+)?\b|\b1[5-9]\d{11}\b"),  # epoch s / ms
    re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? \d{1,2} "
               r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{4}"),
    re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2},? \d{4}\b"),
)
ID_RES = (
    re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"),
    re.compile(r"\b[A-Za-z]{2,12}[_-](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{8,}\b"),
    re.compile(r"\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{20,}\b"),
    re.compile(r"\bcch=[0-9a-fA-F]+"),
)


def _overlaps(regexes, text: str, lo: int, hi: int) -> bool:
    """Does a match of one of ``regexes`` in ``text`` overlap [lo, hi)?"""
    if hi <= lo:
        hi = lo + 1
    for rx in regexes:
        for m in rx.finditer(text):
            if m.start() < hi and m.end() > lo:
                return True
            if m.start() >= hi:
                break
    return False


def _line_window(a: str, b: str) -> tuple[int, int, int, int, str, str]:
    """The first differing line of ``a``/``b`` and the differing window inside it.

    Returns (offset of the line in a, window start, window end in a, window end
    in b, line of a, line of b); window offsets are relative to the line.
    """
    cp = 0
    n = min(len(a), len(b))
    while cp < n and a[cp] == b[cp]:
        cp += 1
    ls = a.rfind("\n", 0, cp) + 1
    ea, eb = a.find("\n", cp), b.find("\n", cp)
    la = a[ls:len(a) if ea < 0 else ea]
    lb = b[ls:len(b) if eb < 0 else eb]
    w0 = cp - ls
    cs = 0
    while cs < min(len(la), len(lb)) - w0 and la[len(la) - 1 - cs] == lb[len(lb) - 1 - cs]:
        cs += 1
    return ls, w0, len(la) - cs, len(lb) - cs, la, lb


def _json_equal(a: str, b: str) -> bool:
    if a[:1] not in "{[" or b[:1] not in "{[":
        return False
    try:
        return json.loads(a) == json.loads(b)
    except (ValueError, RecursionError):
        return False


def _similar(a: str, b: str, threshold: float = 0.5) -> bool:
    """Cheap similarity: shared prefix + suffix, or overlap of the word sets."""
    if not a or not b:
        return False
    cp = _common_prefix(a, b)
    n = min(len(a), len(b)) - cp
    cs = 0
    while cs < n and a[len(a) - 1 - cs] == b[len(b) - 1 - cs]:
        cs += 1
    if (cp + cs) >= threshold * max(len(a), len(b)):
        return True
    wa, wb = a.split(), b.split()
    ga, gb = set(zip(wa, wa[1:], wa[2:])), set(zip(wb, wb[1:], wb[2:]))  # word trigrams
    return len(ga & gb) >= threshold * max(len(ga | gb), 1)


def _strip_cc(t: Any) -> Any:
    return {k: v for k, v in t.items() if k != "cache_control"} if isinstance(t, dict) else t


def classify_text(a: str, b: str, same_user: bool, is_message: bool) -> tuple[str, dict]:
    """Cause of a divergence between two text pieces (a: this request, b: the earlier)."""
    if _json_equal(a, b):
        return "json_key_order", {"char_offset": _common_prefix(a, b)}
    ls, w0, wa, wb, la, lb = _line_window(a, b)
    info = {"char_offset": ls + w0, "line_a": la, "line_b": lb, "w0": w0, "wa": wa, "wb": wb}
    if HEADER_RE.match(la) or HEADER_RE.match(lb):
        return "rotating_header", info
    if _overlaps(TIMESTAMP_RES, la, w0, wa) or _overlaps(TIMESTAMP_RES, lb, w0, wb):
        return "timestamp", info
    if _overlaps(ID_RES, la, w0, wa) or _overlaps(ID_RES, lb, w0, wb):
        return "volatile_id", info
    if not same_user:
        return "per_user_data", info
    if is_message:
        return "history_rewrite", info
    return "other", info


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def line_causes(a: str, b: str, same_user: bool, is_message: bool) -> set[str]:
    """Causes of *every* changed line between two versions of a text piece — not
    only the first, which the divergence point is charged to: a chat app's user
    line and its timestamp line can both differ from the previous request."""
    import difflib

    la, lb = a.split("\n"), b.split("\n")
    out: set[str] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes():
        if tag == "replace":
            for x, y in zip(la[i1:i2], lb[j1:j2]):
                out.add(classify_text(x, y, same_user, is_message)[0])
    out.discard("other")
    return out


def classify_pieces(pieces_r: list, pieces_c: list, i: int, body_r: dict, body_c: dict,
                    same_user: bool, msg_kind: str) -> tuple[str | None, dict]:
    """Cause of the divergence at piece ``i`` (None: not premature — new content).

    ``msg_kind``: ``tools``, ``system`` (incl. a leading system-role message) or
    ``message``.
    """
    pr = pieces_r[i] if i < len(pieces_r) else None
    pc = pieces_c[i] if i < len(pieces_c) else None
    if pr is None or pc is None:
        return None, {}
    if msg_kind == "tools":
        tr = [t for t in (body_r.get("tools") or [])]
        tc = [t for t in (body_c.get("tools") or [])]
        # index of the tool the divergence falls in
        j = sum(1 for p in pieces_r[:i + 1] if p[0] == "marker" and p[1] == "tool_def") - 1
        nr, nc = [tool_name(t) for t in tr], [tool_name(t) for t in tc]
        info = {"tool_index": j, "char_offset": 0}
        if pr[0] == "text" and pc[0] == "text":
            info["char_offset"] = _common_prefix(pr[1], pc[1])
        if nr != nc and sorted(map(str, nr)) == sorted(map(str, nc)):
            return "tool_order", info
        if 0 <= j < min(len(tr), len(tc)) and nr[j] == nc[j] and nr[j] is not None:
            if _strip_cc(tr[j]) == _strip_cc(tc[j]):
                return "json_key_order", info
            return "tool_schema_change", info
        common = set(map(str, nr)) & set(map(str, nc))
        if len(common) * 2 < max(len(nr), len(nc), 1):
            return None, info  # another tool set altogether: another application
        return "other", info
    if pr[0] != "text" or pc[0] != "text":
        # structure differs (an extra block, a marker against text)
        if msg_kind == "message":
            return "history_rewrite", {"char_offset": 0}
        return ("other" if same_user else "per_user_data"), {"char_offset": 0}
    a, b = pr[1], pc[1]
    if msg_kind == "system" and not _json_equal(a, b):
        # a different application's system prompt is new content, not a miss cause
        ls, w0, wa, wb, la, lb = _line_window(a, b)
        rest_a, rest_b = a[ls + wa:], b[ls + wb:]
        if not (_similar(a, b, 0.5) or (len(rest_a) > 40 and rest_a[-200:] == rest_b[-200:])
                or len(la) < 400 and a[ls + len(la):] == b[ls + len(lb):]):
            return None, {"char_offset": ls + w0}
    return classify_text(a, b, same_user, msg_kind == "message")


# --------------------------------------------------------------------------- masking

def mask(s: str) -> str:
    """A stand-in for text: its length, character classes and a short hash."""
    if not s:
        return "⟨empty⟩"
    cls = []
    if any(c.isalpha() for c in s):
        cls.append("letters")
    if any(c.isdigit() for c in s):
        cls.append("digits")
    if any(c.isspace() for c in s):
        cls.append("space")
    if any(not (c.isalnum() or c.isspace()) for c in s):
        cls.append("punct")
    h = hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=3).hexdigest()
    return f"⟨{len(s)} chars: {'+'.join(cls)} #{h}⟩"


def _shown(s: str, show_text: bool, limit: int = 160) -> str:
    if show_text:
        return s if len(s) <= limit else s[:limit] + "…"
    return mask(s)


# --------------------------------------------------------------------------- profiles

def resolve_profile(name: str | None) -> dict:
    """The profile's diagnosis settings: ``canonical_json`` is True when the engine
    parses the JSON before hashing (a hosted API), so JSON key order cannot cause a
    miss and the diagnosis runs on the canonical-JSON view of the log."""
    if name in (None, "", "ideal"):
        return {"name": "ideal", "canonical_json": False}
    from replay.providers import profiles

    obj = profiles.get_profile(name)  # ValueError names the known profiles
    return {"name": name, "canonical_json": obj.canonical_json, "obj": obj}


# --------------------------------------------------------------------------- walks

def _walk_figures(con, stream: str, ttl: float) -> dict[int, tuple]:
    """request_id → (stream key, ts, prompt_tokens, L_τ, L_∞, idle gap) for mode ``stream``,
    plus L_g from the global walk."""
    rows = con.execute("""
        SELECT request_id, stream, ts, prompt_tokens, gaps, depths FROM walks
        WHERE variant = 'prompt' AND mode = ?""", [stream]).fetchall()
    glob = dict(con.execute("""
        SELECT request_id, coalesce(list_max(depths), 0) FROM walks
        WHERE variant = 'prompt' AND mode = 'global'""").fetchall())
    out = {}
    for rid, skey, ts, n, gaps, depths in rows:
        lt, li, gap = 0, 0, None
        for g, d in zip(gaps, depths):
            if g <= ttl:
                lt = d
            elif gap is None:
                gap = g
            li = d
        out[rid] = (skey, ts, int(n), int(lt), int(li), int(glob.get(rid, li)), gap)
    return out


def ensure_walks(con, stream: str, tokenizer=None) -> None:
    from replay import api as pipeline

    modes = (stream,) if stream == "global" else (stream, "global")
    pipeline.prepare(con, modes=modes, tokenizer=tokenizer)


# --------------------------------------------------------------------------- requests as segments

@dataclass
class _R:
    rid: int
    ts: float
    session: str | None
    user: str
    stream: str
    segs: np.ndarray           # uint64 seg ids
    parts: np.ndarray          # int32 part per segment
    cum: np.ndarray            # token offset of each segment (len + 1)
    msgs: list = field(default_factory=list)   # (start idx, end idx, is_system, key tuple)
    conv: set = field(default_factory=set)     # keys of non-system messages
    gen_start: int = 0         # index of the first segment of the generation-marker part


def _build(rid, ts, session, user, stream, segs, parts, ntok, sys_marker) -> _R:
    segs = np.asarray(segs, dtype=np.uint64)
    parts = np.asarray(parts, dtype=np.int32)
    sizes = np.fromiter((ntok[s] for s in segs.tolist()), dtype=np.int64, count=len(segs))
    cum = np.zeros(len(segs) + 1, dtype=np.int64)
    np.cumsum(sizes, out=cum[1:])
    r = _R(rid, ts, session, user, stream, segs, parts, cum)
    if len(parts):
        top = int(parts[-1])
        bounds = np.flatnonzero(np.diff(parts)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(parts)]])
        leading_system = True
        r.gen_start = len(segs)
        for s, e in zip(starts.tolist(), ends.tolist()):
            p = int(parts[s])
            if p < 2:
                continue
            if p == top and e == len(segs) and e - s == 1 and top >= 2 and len(starts) > 1:
                r.gen_start = s
                continue
            key = tuple(segs[s:e].tolist())
            is_sys = leading_system and int(segs[s]) == sys_marker
            leading_system = leading_system and is_sys
            r.msgs.append((s, e, is_sys, key))
            if not is_sys:
                r.conv.add(key)
    return r


def _chain(keys) -> list[int]:
    out, h = [], 0
    for k in keys:
        h = hash((h, k))
        out.append(h)
    return out


class _Index:
    """Candidate closest-earlier requests (see module docstring)."""

    KEEP = 4

    def __init__(self):
        self.prefix: dict[int, list[int]] = {}
        self.msgpre: dict[int, int] = {}
        self.last: dict[tuple[str, str], int] = {}

    @staticmethod
    def _longest(hs: list[int], table: dict) -> int:
        lo, hi = 0, len(hs)  # number of leading hashes present: binary search (prefix-closed)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hs[mid - 1] in table:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def candidates(self, r: _R, hs: list[int], mh: list[int]) -> list[int]:
        out: list[int] = []
        j = self._longest(hs, self.prefix)
        if j:
            out.extend(reversed(self.prefix[hs[j - 1]]))
        k = self._longest(mh, self.msgpre)
        if k:
            out.append(self.msgpre[mh[k - 1]])
        for kind, val in (("session", r.session), ("user", r.user), ("stream", r.stream)):
            if val is not None and (kind, val) in self.last:
                out.append(self.last[(kind, val)])
        seen, uniq = set(), []
        for c in out:
            if c not in seen:
                seen.add(c)
                uniq.append(c)
        return uniq

    def add(self, r: _R, hs: list[int], mh: list[int]) -> None:
        for h in hs:
            lst = self.prefix.get(h)
            if lst is None:
                self.prefix[h] = [r.rid]
            else:
                lst.append(r.rid)
                if len(lst) > self.KEEP:
                    del lst[0]
        for h in mh:
            self.msgpre[h] = r.rid
        for kind, val in (("session", r.session), ("user", r.user), ("stream", r.stream)):
            if val is not None:
                self.last[(kind, val)] = r.rid


def _new_start(r: _R, c: _R) -> int:
    """Token offset where this request's genuinely new content starts, relative to ``c``:
    the trailing run of conversation messages that ``c`` does not hold."""
    idx = len(r.msgs)
    while idx > 0:
        s, e, is_sys, key = r.msgs[idx - 1]
        if is_sys or key in c.conv:
            break
        idx -= 1
    start = r.gen_start if idx == len(r.msgs) else r.msgs[idx][0]
    return int(r.cum[start])


def _lcp(r: _R, c: _R, tokens) -> tuple[int, int]:
    """(token LCP, index of the first differing segment)."""
    n = min(len(r.segs), len(c.segs))
    if n == 0:
        return 0, 0
    diff = r.segs[:n] != c.segs[:n]
    i = int(diff.argmax()) if diff.any() else n
    L = int(r.cum[i])
    if i < n:
        a, b = tokens(int(r.segs[i])), tokens(int(c.segs[i]))
        k = min(len(a), len(b))
        if k:
            d = a[:k] != b[:k]
            L += int(d.argmax()) if d.any() else k
    return L, i


def _system_span(r: _R) -> tuple[int, int]:
    """Segment index range of the system prompt: part 1 and leading system-role messages."""
    idx = np.flatnonzero(r.parts >= 1)
    if not len(idx):
        return 0, 0
    s0 = int(idx[0])
    s1 = s0
    while s1 < len(r.parts) and r.parts[s1] == 1:
        s1 += 1
    for s, e, is_sys, _ in r.msgs:
        if is_sys and s == s1:
            s1 = e
    return s0, s1


def _span_text(pieces, s0: int, s1: int) -> str:
    return "\n".join(p[1] for p in pieces[s0:s1] if p[0] == "text")


def _part_label(r: _R, i: int) -> tuple[str, str]:
    """(kind, label) of segment ``i``: tools / system / message k of n."""
    if i >= len(r.parts):
        return "end", "end"
    p = int(r.parts[i])
    if p == 0:
        return "tools", "tools"
    if p == 1:
        return "system", "system"
    n_msgs = len(r.msgs)
    for s, e, is_sys, _ in r.msgs:
        if s <= i < e:
            k = p - 2
            if is_sys:
                return "system", f"system (message {k})"
            return "message", f"message {k} of {n_msgs}"
    return "message", "generation prompt"


# --------------------------------------------------------------------------- the per-request split

def _load(con):
    from replay.text.render import render_request  # noqa: F401  (import check)
    from replay.core.replay import SegmentStore
    from replay.text.tokenize import marker_seg_id

    store = SegmentStore(con)
    ntok = {s: len(a) for s, a in store._tokens.items()}
    return store, ntok, marker_seg_id("system")


def _analyse(con, stream: str, ttl: float, block: int, min_prefix: int):
    """Per-request rows (dicts) plus the divergence details for examples."""
    figs = _walk_figures(con, stream, ttl)
    store, ntok, sys_marker = _load(con)
    tokens = store._tokens.__getitem__
    from replay.core.replay import stream_key, time_ordered_chunks

    names = ("request_id", "ts", "tenant", "prompt_cache_key", "session", "user_id", "format",
             "seg_ids", "seg_parts")
    reqs = (row for tbl in time_ordered_chunks(con, ", ".join(
                ("p." if c.startswith("seg_") else "r.") + c for c in names))
            for row in zip(*(tbl.column(c).to_pylist() for c in names)))
    index = _Index()
    by_id: dict[int, _R] = {}
    rows: list[dict] = []
    pending: list[tuple[dict, _R, _R, int, int]] = []
    also: list[tuple[dict, _R, _R, int, int]] = []
    for rid, ts, tenant, key, session, user_id, fmt, seg_ids, seg_parts in reqs:
        if rid not in figs:
            continue
        skey, _ts, n, lt, li, lg, gap = figs[rid]
        floored = (lt // block) * block
        hit = 0 if floored < min_prefix else floored
        row = {"request_id": rid, "stream": skey, "ts": ts, "prompt_tokens": n, "hit": hit,
               "block_rounding": lt - floored, "below_minimum": floored - hit,
               "ttl_expired": li - lt, "stream_split": lg - li, "premature": 0,
               "new_content": n - lg, "cause": None, "where": None, "compared_with": None,
               "idle_gap_s": gap if li > lt else None, "L_global": lg}
        rows.append(row)
        if seg_ids is None or fmt in ("tokens", "mooncake"):
            continue
        user = user_id if user_id is not None else f"tenant:{tenant}"
        r = _build(rid, ts, session, user, stream_key(stream, tenant, key, session),
                   seg_ids, seg_parts, ntok, sys_marker)
        hs = _chain(r.segs.tolist())
        mh = _chain([m[3] for m in r.msgs if not m[2]])
        best = None
        seen = {}
        if n > lg:
            for cid in index.candidates(r, hs, mh):
                c = by_id[cid]
                L_c, i_c = _lcp(r, c, tokens)
                pot = _new_start(r, c)
                seen[cid] = (c, L_c, i_c, pot)
                score = (pot, L_c, c.session is not None and c.session == r.session,
                         c.user == r.user, c.ts, c.rid)
                if best is None or score > best[0]:
                    best = (score, c, L_c, i_c, pot)
        if best is not None:
            _, c, L_c, i_c, pot = best
            row["compared_with"] = c.rid
            if pot > lg and i_c < len(r.segs) and i_c < len(c.segs):
                pending.append((row, r, c, i_c, pot))
            # secondary causes: how this request differs from the previous one of its
            # stream / session (no tokens attributed; see the `also` column)
            for kind in ("stream", "session"):
                val = r.stream if kind == "stream" else r.session
                pid = index.last.get((kind, val)) if val is not None else None
                if pid is None or pid == c.rid or pid not in seen:
                    continue
                pc, L_p, i_p, pot_p = seen[pid]
                if pot_p > L_p and i_p < len(r.segs) and i_p < len(pc.segs):
                    also.append((row, r, pc, i_p, pot_p))
        index.add(r, hs, mh)
        by_id[rid] = r
    _classify(con, pending, also)
    for row in rows:
        extra = sorted(set(row.pop("_also", ())) - {row["cause"]}, key=CAUSES.index)
        row["also"] = ",".join(extra) if extra else None
    return rows, pending


def _classify(con, pending, also=()) -> None:
    from replay.text.render import render_request

    if not pending and not also:
        return
    ids = sorted({x for row, r, c, i, pot in list(pending) + list(also) for x in (r.rid, c.rid)})
    bodies: dict[int, tuple[dict, str]] = {}
    for start in range(0, len(ids), 2000):
        chunk = ids[start:start + 2000]
        q = ",".join(str(int(x)) for x in chunk)
        for rid, body, fmt in con.execute(
                f"SELECT r.request_id, b.body, r.format FROM requests r JOIN request_bodies b USING (request_id) "
                f"WHERE r.request_id IN ({q})").fetchall():
            try:
                bodies[rid] = (json.loads(body), fmt)
            except (TypeError, ValueError):
                bodies[rid] = ({}, fmt)
    rendered: dict[int, list] = {}

    def pieces(rid):
        if rid not in rendered:
            b, fmt = bodies.get(rid, ({}, "anthropic"))
            try:
                rendered[rid] = render_request(b, fmt)
            except Exception:  # noqa: BLE001 - an unrenderable body is classified 'other'
                rendered[rid] = []
            if len(rendered) > 4096:
                rendered.pop(next(iter(rendered)))
        return rendered[rid]

    def judge(r, c, i):
        kind, label = _part_label(r, i)
        if kind == "message" and r.session is not None and c.session is not None \
                and r.session != c.session:
            return label, None, {}
        pr, pc = pieces(r.rid), pieces(c.rid)
        if len(pr) != len(r.segs) or len(pc) != len(c.segs):
            return label, "other", {}
        cause, info = classify_pieces(pr, pc, i, bodies[r.rid][0], bodies[c.rid][0],
                                      r.user == c.user, kind)
        return label, cause, info

    for row, r, c, i, pot in pending:
        label, cause, info = judge(r, c, i)
        row["where"] = label
        if cause is None:
            continue
        if label == "tools":
            # the tools diverged; if the system prompts are another application's
            # altogether, only the rest of the tools was lost, not the system
            s0, s1 = _system_span(r)
            if s1 > s0:
                c0, c1 = _system_span(c)
                ta = _span_text(pieces(r.rid), s0, s1)
                tb = _span_text(pieces(c.rid), c0, c1)
                if ta != tb and not _similar(ta, tb):
                    pot = min(pot, int(r.cum[s0]))
                    if pot <= row["L_global"]:
                        continue
        lost = pot - row["L_global"]
        row["premature"] = lost
        row["new_content"] -= lost
        row["cause"] = cause
        row["_detail"] = (i, info)
    for row, r, c, i, pot in also:
        _, cause, _ = judge(r, c, i)
        if cause is not None:
            row.setdefault("_also", []).append(cause)
    # further changed lines in the diverging system piece (secondary causes, no tokens)
    for row, r, c, i, pot in list(pending) + list(also):
        kind, _ = _part_label(r, i)
        pr, pc = pieces(r.rid), pieces(c.rid)
        if kind == "system" and i < len(pr) and i < len(pc) and pr[i][0] == pc[i][0] == "text" \
                and row.get("cause") is not None:
            row.setdefault("_also", []).extend(line_causes(pr[i][1], pc[i][1], r.user == c.user, False))


def miss_parts(con, ttl: float | str = 300, block: int = 16, min_prefix: int = 0,
               stream: str = "tenant", profile: str = "ideal", tokenizer=None) -> pl.DataFrame:
    """One row per request: its prompt split into additive parts (see module docstring).

    Columns: request_id, stream, ts, prompt_tokens, hit, block_rounding,
    below_minimum, ttl_expired, stream_split, premature, new_content, cause
    (of the premature tokens; null when none), where (tools / system / message k
    of n: where the prompt diverged from its closest earlier request),
    compared_with (that request), idle_gap_s (the idle gap that expired the
    prefix, when ttl_expired > 0), L_global, also (other causes by which the
    request differs from the previous request of its stream / session, comma-separated;
    no tokens attributed to them). For every row
    hit + block_rounding + below_minimum + ttl_expired + stream_split + premature
    + new_content == prompt_tokens.
    """
    rows, _ = _miss_rows(con, ttl, block, min_prefix, stream, profile, tokenizer)
    return _frame(rows)


def _frame(rows) -> pl.DataFrame:
    cols = ["request_id", "stream", "ts", "prompt_tokens", *PARTS, "cause", "also", "where",
            "compared_with", "idle_gap_s", "L_global"]
    schema = {"request_id": pl.Int64, "stream": pl.Utf8, "ts": pl.Float64, "prompt_tokens": pl.Int64,
              **{p: pl.Int64 for p in PARTS}, "cause": pl.Utf8, "also": pl.Utf8, "where": pl.Utf8,
              "compared_with": pl.Int64, "idle_gap_s": pl.Float64, "L_global": pl.Int64}
    return pl.DataFrame([{k: r.get(k) for k in cols} for r in rows], schema=schema, orient="row")


def _miss_rows(con, ttl, block, min_prefix, stream, profile, tokenizer=None):
    from replay.core.sweep import parse_ttl

    ttl = parse_ttl(ttl) if isinstance(ttl, str) else float(ttl)
    if block < 1:
        raise ValueError("block must be ≥ 1")
    prof = resolve_profile(profile)
    work = con
    if prof["canonical_json"]:
        from replay.analysis.whatif import normalized_copy

        work = normalized_copy(con, ["canonical-json"], tokenizer=tokenizer)
    ensure_walks(work, stream, tokenizer)
    rows, pending = _analyse(work, stream, ttl, int(block), int(min_prefix))
    return rows, (work, pending)


# --------------------------------------------------------------------------- the report object

def diagnose(con, ttl: float | str = 300, block: int = 16, min_prefix: int = 0,
             stream: str = "tenant", profile: str = "ideal", show_text: bool = False,
             examples: int = 5, tokenizer=None) -> dict:
    """``{"causes": [...], "by_stream": [...], "examples": [...]}`` for one configuration.

    ``causes``: every loss — the structural ones (block_rounding, below_minimum,
    ttl_expired — with the idle gaps that caused it —, stream_split) and the
    premature-divergence causes — as ``{"cause", "requests", "tokens_lost",
    "share_of_prompt_tokens"}``, ranked by tokens lost. For a divergence cause,
    ``requests`` counts every request that differs from its predecessor by it and
    ``requests_charged`` those whose lost tokens are charged to it (the first
    divergence), so ``tokens_lost`` stays an exact, additive split. ``by_stream``: per
    stream, the additive parts (``hit`` … ``new_content``) and tokens per cause.
    ``examples``: up to ``examples`` requests per premature cause showing where
    and what differs (masked unless ``show_text``).
    """
    rows, (work, pending) = _miss_rows(con, ttl, block, min_prefix, stream, profile, tokenizer)
    df = _frame(rows)
    total = int(df["prompt_tokens"].sum()) if len(df) else 0
    causes = []
    for part in STRUCTURAL:
        sub = df.filter(pl.col(part) > 0)
        entry = {"cause": part, "requests": len(sub), "tokens_lost": int(sub[part].sum()) if len(sub) else 0,
                 "share_of_prompt_tokens": (int(sub[part].sum()) / total) if total and len(sub) else 0.0}
        if part == "ttl_expired":
            gaps = sub["idle_gap_s"].drop_nulls()
            entry["idle_gap_s"] = None if not len(gaps) else {
                "median": float(gaps.median()), "p90": float(gaps.quantile(0.9)),
                "min": float(gaps.min()), "max": float(gaps.max())}
        causes.append(entry)
    prem = df.filter(pl.col("cause").is_not_null())
    present = (df.with_columns(pl.col("also").fill_null("").str.split(",").alias("_a"))
               .select("cause", "_a").to_dicts())
    for cause in CAUSES:
        sub = prem.filter(pl.col("cause") == cause)
        # a request can differ from its predecessor by several causes; its tokens go to
        # the first divergence (``requests_charged``), ``requests`` counts them all
        affected = sum(1 for r in present if r["cause"] == cause or cause in r["_a"])
        if not affected:
            continue
        lost = int(sub["premature"].sum()) if len(sub) else 0
        causes.append({"cause": cause, "requests": affected, "requests_charged": len(sub),
                       "tokens_lost": lost, "share_of_prompt_tokens": lost / total if total else 0.0})
    causes = [c for c in causes if c["tokens_lost"] > 0 or c.get("requests_charged") is not None]
    causes.sort(key=lambda c: -c["tokens_lost"])

    by_stream = []
    if len(df):
        agg = df.group_by("stream").agg(
            pl.len().alias("requests"), pl.col("prompt_tokens").sum(),
            *[pl.col(p).sum() for p in PARTS]).sort("prompt_tokens", descending=True)
        per_cause = (prem.group_by(["stream", "cause"]).agg(pl.col("premature").sum())
                     if len(prem) else None)
        for s in agg.to_dicts():
            entry = {"stream": s["stream"], "requests": s["requests"],
                     "prompt_tokens": s["prompt_tokens"],
                     "hit_ratio": s["hit"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0}
            entry.update({p: int(s[p]) for p in PARTS})
            pc = {}
            if per_cause is not None:
                for x in per_cause.filter(pl.col("stream") == s["stream"]).to_dicts():
                    pc[x["cause"]] = int(x["premature"])
            entry["causes"] = dict(sorted(pc.items(), key=lambda kv: -kv[1]))
            by_stream.append(entry)

    ex = _examples(work, pending, show_text, examples)
    return {"causes": causes, "by_stream": by_stream, "examples": ex}


def _examples(con, pending, show_text: bool, per_cause: int) -> list[dict]:
    out: list[dict] = []
    count: dict[str, int] = {}
    chosen = sorted((x for x in pending if x[0].get("cause")), key=lambda x: -x[0]["premature"])
    for row, r, c, i, pot in chosen:
        cause = row["cause"]
        if count.get(cause, 0) >= per_cause:
            continue
        count[cause] = count.get(cause, 0) + 1
        _i, info = row.get("_detail", (i, {}))
        ex = {"cause": cause, "request_id": row["request_id"], "compared_with": c.rid,
              "stream": row["stream"], "where": row["where"], "tokens_lost": row["premature"],
              "token_offset": row["L_global"], "char_offset": info.get("char_offset")}
        if "tool_index" in info:
            ex["tool_index"] = info["tool_index"]
        if "line_a" in info:
            la, lb, w0, wa, wb = info["line_a"], info["line_b"], info["w0"], info["wa"], info["wb"]
            ex["before"] = _shown(lb[w0:wb], show_text)
            ex["after"] = _shown(la[w0:wa], show_text)
            ex["line"] = _shown(la, show_text)
        out.append(ex)
    out.sort(key=lambda e: (CAUSES.index(e["cause"]), -e["tokens_lost"]))
    return out


def format_text(result: dict, ttl=None) -> str:
    """The diagnosis as a short human-readable table."""
    lines = []
    total = sum(s["prompt_tokens"] for s in result["by_stream"])
    hit = sum(s["hit"] for s in result["by_stream"])
    new = sum(s["new_content"] for s in result["by_stream"])
    lines.append(f"prompt tokens {total:,}   hit {hit:,} ({100 * hit / total if total else 0:.1f} %)   "
                 f"new content {new:,} ({100 * new / total if total else 0:.1f} %)")
    lines.append("")
    lines.append(f"{'cause':<20} {'requests':>9} {'tokens lost':>13} {'share':>7}")
    for c in result["causes"]:
        lines.append(f"{c['cause']:<20} {c['requests']:>9,} {c['tokens_lost']:>13,} "
                     f"{100 * c['share_of_prompt_tokens']:>6.1f}%")
        if c["cause"] == "ttl_expired" and c.get("idle_gap_s"):
            g = c["idle_gap_s"]
            lines.append(f"{'':<20} idle gaps: median {g['median']:.0f} s, p90 {g['p90']:.0f} s, "
                         f"max {g['max']:.0f} s")
    if result["examples"]:
        lines.append("")
        lines.append("examples:")
        for e in result["examples"]:
            what = ""
            if "before" in e:
                what = f": {e['before']} → {e['after']}"
            lines.append(f"  {e['cause']:<18} request {e['request_id']} vs {e['compared_with']} "
                         f"in {e['where']} at char {e['char_offset']} "
                         f"({e['tokens_lost']:,} tokens){what}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- diff view

def diff_view(con, stream_or_session: str, index: int | None = None, show_text: bool = False) -> str:
    """Two consecutive requests of a stream (or session) and where their rendered
    bytes first differ: part, piece, character offset. Text is masked unless
    ``show_text``. ``index`` picks the pair (request ``index`` against
    ``index − 1`` of the stream, 0-based); default: the first pair where the later
    request does not extend the earlier one, else the last pair."""
    from replay.text.render import render_request

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
    rows = con.execute(f"""SELECT r.request_id, r.ts, r.format, b.body
                           FROM requests r JOIN request_bodies b USING (request_id)
                           WHERE {' AND '.join(where)} AND b.body IS NOT NULL
                           ORDER BY ts, request_id""", params).fetchall()
    if len(rows) < 2:
        return f"{s}: fewer than two requests with a body"
    rendered = []

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
        ls, w0, wa, wb, la, lb = _line_window(pb_[1], pa_[1])
        off = ls + w0
        out.append(f"  at char {off:,} of the piece (line {pb_[1].count(chr(10), 0, off) + 1})")
        out.append(f"  earlier: …{_shown(lb[w0:wb], show_text)}…   in line {_shown(lb, show_text)}")
        out.append(f"  later:   …{_shown(la[w0:wa], show_text)}…   in line {_shown(la, show_text)}")
        cause, _ = classify_text(pb_[1], pa_[1], True, part >= 2)
        out.append(f"  looks like: {cause}")
    else:
        out.append(f"  earlier piece: {pa_[0]} {pa_[1] if pa_[0] == 'marker' else _shown(str(pa_[1]), show_text)}")
        out.append(f"  later piece:   {pb_[0]} {pb_[1] if pb_[0] == 'marker' else _shown(str(pb_[1]), show_text)}")
    return "\n".join(out)


def _chars(pieces) -> int:
    return sum(len(p[1]) for p in pieces if p[0] == "text")


# --------------------------------------------------------------------------- report section

#: the report's why-miss section runs the diagnosis / the what-ifs only up to these sizes
REPORT_DIAGNOSE_MAX = 50_000
REPORT_WHATIF_MAX = 20_000


def why_miss_section(con, out_dir=None, ttl: float = 300, block: int = 16, min_prefix: int = 0,
                     stream: str = "tenant", fixes: tuple[str, ...] | None = None) -> str:
    """Markdown for the report: causes ranked by tokens lost, and the ceiling after each fix."""
    from replay.core.sweep import format_ttl
    from replay.analysis.whatif import FIXES, whatif

    n_requests = con.execute("SELECT count(*) FROM requests").fetchall()[0][0]
    if n_requests > REPORT_DIAGNOSE_MAX:
        # the diagnosis keeps every request's segment list in memory, and each what-if
        # re-tokenizes and replays the whole log: too much to add to a batch report
        return ("## Why requests miss\n\nNot computed in the report for a log of "
                f"{n_requests:,} requests (over {REPORT_DIAGNOSE_MAX:,}): run `replay diagnose` and "
                "`replay whatif --fix all` on it (or on a part of it) separately.\n")
    res = diagnose(con, ttl=ttl, block=block, min_prefix=min_prefix, stream=stream, examples=2)
    total = sum(s["prompt_tokens"] for s in res["by_stream"])
    hit = sum(s["hit"] for s in res["by_stream"])
    new = sum(s["new_content"] for s in res["by_stream"])
    lines = ["## Why requests miss", "",
             f"Configuration: TTL {format_ttl(ttl)}, block {block}, minimum prefix {min_prefix}, "
             f"stream `{stream}`. Every prompt token is either a hit, genuinely new content, or lost "
             "to exactly one of the causes below (the parts add up to the prompt length).", "",
             f"Hit {hit:,} of {total:,} prompt tokens ({100 * hit / total if total else 0:.1f} %); "
             f"genuinely new content {new:,} ({100 * new / total if total else 0:.1f} %).", "",
             "| cause | requests | tokens lost | share of prompt tokens |", "|---|---:|---:|---:|"]
    for c in res["causes"]:
        extra = ""
        if c["cause"] == "ttl_expired" and c.get("idle_gap_s"):
            g = c["idle_gap_s"]
            extra = f" (idle gaps: median {g['median']:.0f} s, p90 {g['p90']:.0f} s)"
        lines.append(f"| {c['cause']}{extra} | {c['requests']:,} | {c['tokens_lost']:,} | "
                     f"{100 * c['share_of_prompt_tokens']:.2f} % |")
    if not res["causes"]:
        lines.append("| (none) | 0 | 0 | 0 % |")
    if n_requests > REPORT_WHATIF_MAX:
        lines += ["", f"(The ceiling after each fix is not computed in the report above "
                      f"{REPORT_WHATIF_MAX:,} requests: `replay whatif --fix all`.)"]
        return "\n".join(lines) + "\n"
    try:
        w = whatif(con, list(fixes or FIXES), ttl=ttl, block=block, min_prefix=min_prefix, stream=stream)
    except Exception as exc:  # noqa: BLE001 - the section still reports the diagnosis
        lines += ["", f"(what-if not computed: {type(exc).__name__})"]
        return "\n".join(lines) + "\n"
    lines += ["", "### The ceiling after each fix", "",
              "Each normalizer is applied to the request bodies and the log replayed from scratch.", "",
              "| fix | hit ratio | gain (points) | hit tokens |", "|---|---:|---:|---:|",
              f"| (as logged) | {100 * w['before']['hit_ratio']:.2f} % | — | {w['before']['hit_tokens']:,} |"]
    for f in w["fixes"] + [w["all"]]:
        lines.append(f"| {f['fix']} | {100 * f['after']['hit_ratio']:.2f} % | "
                     f"{100 * f['gain_hit_ratio']:+.2f} | {f['after']['hit_tokens']:,} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI

def register(cli_group) -> None:
    """Add the ``diagnose``, ``whatif`` and ``diff`` commands to the main click group."""
    import click

    from replay.cli import main as _cli
    from replay.core.sweep import format_ttl, parse_ttl

    def one_config(f):
        f = click.option("--ttl", default="5m", show_default=True,
                         help="TTL: seconds, or with s/m/h/d; 'inf' = no expiry.")(f)
        f = click.option("--block", default=16, show_default=True, type=int,
                         help="Block size in tokens (1 = token-level).")(f)
        f = click.option("--min-prefix", "min_prefix", default=0, show_default=True, type=int,
                         help="Minimum cacheable prefix in tokens.")(f)
        f = click.option("--stream", default="tenant", show_default=True,
                         type=click.Choice(["tenant", "key", "session", "global"]),
                         help="Stream mode.")(f)
        f = click.option("--profile", default="ideal", show_default=True,
                         help="Profile (ideal, or one of `replay profiles`).")(f)
        return f

    def load(con, logs, fmt, fields, time_unit, quiet):
        if logs:
            _cli._ingest(con, logs, fmt, fields, time_unit, quiet=quiet)
        elif con.execute("SELECT count(*) FROM requests").fetchone()[0] == 0:
            raise click.ClickException("the database holds no requests: give log files to ingest")

    def ttl_of(text):
        try:
            return parse_ttl(text)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--ttl") from None

    @cli_group.command("diagnose")
    @click.argument("logs", nargs=-1)
    @_cli.db_option
    @_cli.ingest_options
    @one_config
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    @click.option("--show-text", is_flag=True, help="Show the differing text (masked by default).")
    @click.option("--examples", default=5, show_default=True, help="Examples per cause.")
    @click.option("--parquet", type=click.Path(dir_okay=False), default=None,
                  help="Also write the per-request split as Parquet.")
    def diagnose_cmd(logs, db_path, fmt, fields, time_unit, tokenizer, ttl, block, min_prefix, stream,
                     profile, as_json, show_text, examples, parquet):
        """Why requests miss: every missed prompt token attributed to one cause.

        Given LOGS, they are ingested first (into --db).
        """
        con = db.connect(db_path)
        load(con, logs, fmt, fields, time_unit, as_json)
        t = ttl_of(ttl)
        try:
            res = diagnose(con, ttl=t, block=block, min_prefix=min_prefix, stream=stream,
                           profile=profile, show_text=show_text, examples=examples, tokenizer=tokenizer)
            if parquet:
                miss_parts(con, t, block, min_prefix, stream, profile, tokenizer).write_parquet(parquet)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        if as_json:
            click.echo(json.dumps(res, ensure_ascii=False))
        else:
            click.echo(f"ttl {format_ttl(t)}, block {block}, min prefix {min_prefix}, stream {stream}, "
                       f"profile {profile}")
            click.echo(format_text(res))

    @cli_group.command("whatif")
    @click.argument("logs", nargs=-1)
    @_cli.db_option
    @_cli.ingest_options
    @one_config
    @click.option("--fix", "fixes", required=True,
                  help="Normalizers, comma-separated: strip-rotating-header, sort-tools, canonical-json, "
                       "bucket-timestamps=5m, move-volatile-after-breakpoint (or 'all').")
    @click.option("--prices", type=click.Path(exists=True, dir_okay=False), default=None,
                  help="A TOML price table overriding the shipped defaults (replay/prices.toml).")
    @click.option("--price-model", default=None,
                  help="Price the fixes as this model (default: the logged model, when the table has it).")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    def whatif_cmd(logs, db_path, fmt, fields, time_unit, tokenizer, ttl, block, min_prefix, stream,
                   profile, fixes, prices, price_model, as_json):
        """What each fix is worth: the ceiling recomputed on normalized request bodies."""
        from replay.providers import economics
        from replay.analysis.whatif import FIXES, whatif, format_whatif

        con = db.connect(db_path)
        load(con, logs, fmt, fields, time_unit, as_json)
        names = [f.strip() for f in fixes.split(",") if f.strip()]
        if names == ["all"]:
            names = list(FIXES)
        try:
            model = price_model or economics.logged_price_model(con, prices)
            price = economics.get_price(model, prices) if model else None
            res = whatif(con, names, ttl=ttl_of(ttl), block=block, min_prefix=min_prefix, stream=stream,
                         prices=price, tokenizer=tokenizer, profile=profile)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        click.echo(json.dumps(res) if as_json else format_whatif(res))

    @cli_group.command("diff")
    @click.argument("stream")
    @_cli.db_option
    @click.option("--index", type=int, default=None,
                  help="Compare request INDEX of the stream with the one before (default: the first "
                       "that does not extend its predecessor).")
    @click.option("--show-text", is_flag=True, help="Show the differing text (masked by default).")
    def diff_cmd(stream, db_path, index, show_text):
        """Where two consecutive requests of STREAM (a session, tenant or key; or
        tenant:X / key:X / session:X) first differ."""
        con = db.connect(db_path)
        try:
            click.echo(diff_view(con, stream, index=index, show_text=show_text))
        except ValueError as e:
            raise click.ClickException(str(e)) from None
