"""Requests as segment lists, and the search for a request's closest earlier request.

The diagnosis compares each request with the earlier request that held the
most of its content (``replay.analysis.diagnose``): these are the request's
segments, parts and messages, and a small index of candidates — the most
recent requests sharing the longest segment prefix, the latest whose
conversation is the longest prefix of this one's, the previous request of the
same session, user and stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

@dataclass
class SegRequest:
    rid: int
    ts: int
    session: str | None
    user: str
    stream: str
    segs: np.ndarray           # uint64 seg ids
    parts: np.ndarray          # int32 part per segment
    cum: np.ndarray            # token offset of each segment (len + 1)
    msgs: list = field(default_factory=list)   # (start idx, end idx, is_system, key tuple)
    conv: set = field(default_factory=set)     # keys of non-system messages
    gen_start: int = 0         # index of the first segment of the generation-marker part
    tenant: str | None = None  # (the previous request of the same tenant is a candidate too)


def build_request(rid, ts, session, user, stream, segs, parts, ntok, sys_marker) -> SegRequest:
    segs = np.asarray(segs, dtype=np.uint64)
    parts = np.asarray(parts, dtype=np.int32)
    sizes = np.fromiter((ntok[s] for s in segs.tolist()), dtype=np.int64, count=len(segs))
    cum = np.zeros(len(segs) + 1, dtype=np.int64)
    np.cumsum(sizes, out=cum[1:])
    r = SegRequest(rid, ts, session, user, stream, segs, parts, cum)
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
        if r.msgs and not r.msgs[-1][2] and len(r.msgs[-1][3]) > 1 and r.gen_start == len(segs):
            # a chat template writes the generation prompt into the last message's part:
            # the message without it is held too
            r.conv.add(r.msgs[-1][3][:-1])
    return r


def chain(keys) -> list[int]:
    out, h = [], 0
    for k in keys:
        h = hash((h, k))
        out.append(h)
    return out


class CandidateIndex:
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

    def candidates(self, r: SegRequest, hs: list[int], mh: list[int]) -> list[int]:
        out: list[int] = []
        j = self._longest(hs, self.prefix)
        if j:
            out.extend(reversed(self.prefix[hs[j - 1]]))
        k = self._longest(mh, self.msgpre)
        if k:
            out.append(self.msgpre[mh[k - 1]])
        for kind, val in (("session", r.session), ("user", r.user), ("stream", r.stream), ("tenant", r.tenant)):
            if val is not None and (kind, val) in self.last:
                out.append(self.last[(kind, val)])
        seen, uniq = set(), []
        for c in out:
            if c not in seen:
                seen.add(c)
                uniq.append(c)
        return uniq

    def add(self, r: SegRequest, hs: list[int], mh: list[int]) -> None:
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
        for kind, val in (("session", r.session), ("user", r.user), ("stream", r.stream), ("tenant", r.tenant)):
            if val is not None:
                self.last[(kind, val)] = r.rid


def new_start(r: SegRequest, c: SegRequest) -> int:
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


def token_lcp(r: SegRequest, c: SegRequest, tokens) -> tuple[int, int]:
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


def system_span(r: SegRequest) -> tuple[int, int]:
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


def span_text(pieces, s0: int, s1: int) -> str:
    return "\n".join(p[1] for p in pieces[s0:s1] if p[0] == "text")


def part_label(r: SegRequest, i: int) -> tuple[str, str]:
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
