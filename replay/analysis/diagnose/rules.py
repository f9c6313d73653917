"""Naming a divergence: rules on the rendered pieces and the request bodies.

Given two requests' rendered pieces and the index where they first differ,
:func:`classify_pieces` names the cause (``replay.analysis.diagnose`` lists
them) by looking at the differing bytes only: a header line, a date or time, an
id, JSON key order, tool order or definition, another user's data, an edited
history. Text is never shown unless asked: :func:`mask` stands in for it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import secrets
from typing import Any

from replay.analysis.volatile import HEADER_RE, ID_RES, TIMESTAMP_RES
from replay.text.render import tool_name

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


def line_window(a: str, b: str) -> tuple[int, int, int, int, str, str]:
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


def similar(a: str, b: str, threshold: float = 0.5) -> bool:
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
    ls, w0, wa, wb, la, lb = line_window(a, b)
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
    la, lb = a.split("\n"), b.split("\n")
    out: set[str] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes():
        if tag == "replace":
            for x, y in zip(la[i1:i2], lb[j1:j2]):
                out.add(classify_text(x, y, same_user, is_message)[0])
    out.discard("other")
    return out


def tools_cause(tr: list, tc: list, j: int) -> str | None:
    """Cause of a divergence in the tool definitions ``tr`` (this request) against
    ``tc`` (the earlier), ``j`` the tool it falls in; None: another tool set
    altogether (another application: new content)."""
    nr, nc = [tool_name(t) for t in tr], [tool_name(t) for t in tc]
    if nr != nc and sorted(map(str, nr)) == sorted(map(str, nc)):
        return "tool_order"
    if 0 <= j < min(len(tr), len(tc)) and nr[j] == nc[j] and nr[j] is not None:
        if _strip_cc(tr[j]) == _strip_cc(tc[j]):
            return "json_key_order"
        return "tool_schema_change"
    common = set(map(str, nr)) & set(map(str, nc))
    if len(common) * 2 < max(len(nr), len(nc), 1):
        return None
    return "other"


def first_changed_tool(tr: list, tc: list) -> int | None:
    """Index of the first tool definition that differs as logged (key order
    counts; ``cache_control`` does not), or None when the lists are the same."""
    for j in range(max(len(tr), len(tc))):
        a = json.dumps(_strip_cc(tr[j]), ensure_ascii=False) if j < len(tr) else None
        b = json.dumps(_strip_cc(tc[j]), ensure_ascii=False) if j < len(tc) else None
        if a != b:
            return j
    return None


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
        info = {"tool_index": j, "char_offset": 0}
        if pr[0] == "text" and pc[0] == "text":
            info["char_offset"] = _common_prefix(pr[1], pc[1])
        return tools_cause(tr, tc, j), info
    if pr[0] != "text" or pc[0] != "text":
        # structure differs (an extra block, a marker against text)
        if msg_kind == "message":
            return "history_rewrite", {"char_offset": 0}
        return ("other" if same_user else "per_user_data"), {"char_offset": 0}
    a, b = pr[1], pc[1]
    if msg_kind == "system" and not _json_equal(a, b):
        # a different application's system prompt is new content, not a miss cause
        ls, w0, wa, wb, la, lb = line_window(a, b)
        rest_a, rest_b = a[ls + wa:], b[ls + wb:]
        if not (similar(a, b, 0.5) or (len(rest_a) > 40 and rest_a[-200:] == rest_b[-200:])
                or len(la) < 400 and a[ls + len(la):] == b[ls + len(lb):]):
            return None, {"char_offset": ls + w0}
    return classify_text(a, b, same_user, msg_kind == "message")


# --------------------------------------------------------------------------- masking

# The short hash of a masked text is keyed with a key drawn per process: equal
# texts show the same hash within one output, but a short text (a digit, a
# five-letter id) cannot be recovered by hashing guesses until one matches.
_MASK_KEY = secrets.token_bytes(16)


def mask(s: str) -> str:
    """A stand-in for text: its length, character classes and a short (keyed) hash."""
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
    h = hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=3, key=_MASK_KEY).hexdigest()
    return f"⟨{len(s)} chars: {'+'.join(cls)} #{h}⟩"


def shown(s: str, show_text: bool, limit: int = 160) -> str:
    if show_text:
        return s if len(s) <= limit else s[:limit] + "…"
    return mask(s)
