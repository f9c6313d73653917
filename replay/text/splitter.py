"""Where a rendered chat-template text is cut into content-addressed pieces.

Hugging Face ``tokenizers`` first cuts a text at its added tokens (leftmost
longest) and encodes the text between them independently; :class:`Splitter`
cuts the same way (and long runs between added tokens at line starts the known
pre-tokenizer cannot join across; see ``replay.text.render_template``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from replay.text.line_cuts import LineCuts
from replay.text.tokenizer_json import _known

#: a text between added tokens this long or longer is also cut into line chunks
LINE_CHUNK_FROM = 2_048
#: set to 1: never cut the rendered text (each request's whole text is one segment)
WHOLE_TEXT_ENV = "REPLAY_TEMPLATE_WHOLE_TEXT"


class Splitter:
    """Cuts a rendered text where ``tokenizers`` cuts it: at its added tokens.

    ``whole``: the tokenizer encodes a piece differently alone than in place
    (see ``replay.text.render_template``), so a text is never cut."""

    def __init__(self, added: list[dict], pre_tokenizer: Any, normalizer: Any):
        self.cut_at = {a["content"] for a in added if a.get("content") and not (
            a.get("lstrip") or a.get("rstrip") or a.get("single_word")
            or (a.get("normalized") and normalizer not in (None, {"type": "Sequence", "normalizers": []})))}
        self.whole = (not self.cut_at or _prefixes_first_word(pre_tokenizer) or _prefixes_first_word(normalizer)
                      or os.environ.get(WHOLE_TEXT_ENV, "") not in ("", "0"))
        # tokenizers matches the added tokens that are not ``normalized`` first, then the
        # normalized ones in the text left between those (two passes, each leftmost longest)
        self._re = _alternation({a["content"] for a in added if a.get("content") and not a.get("normalized")})
        self._re_normalized = _alternation({a["content"] for a in added if a.get("content") and a.get("normalized")})
        self._tries = [rx for group in (self._re, self._re_normalized) if group is not None
                       for rx in (group if isinstance(group, list) else [group])]
        # the pre-tokenizer the line argument holds for (``replay.text.render_template``'s docstring)
        self.lines = _known(pre_tokenizer, normalizer, [a.get("content") or "" for a in added])
        self._lines = LineCuts()  # (remembers the long runs it cut: a splitter belongs to one renderer)

    @classmethod
    def of_file(cls, tokenizer_json: str | Path) -> "Splitter":
        """The splitter of a tokenizer.json."""
        import msgspec

        from replay.text.tokenizer_json import _JsonDoc

        doc = msgspec.json.decode(Path(tokenizer_json).read_bytes(), type=_JsonDoc)
        return cls(doc.added_tokens, doc.pre_tokenizer, doc.normalizer)

    def split(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` of the pieces of ``text`` (none empty), in order."""
        return [(s, s + len(piece)) for s, piece in self.pieces(text)]

    def pieces(self, text: str) -> list[tuple[int, str]]:
        """``(start, piece)`` of the pieces of ``text`` (none empty), in order."""
        if self.whole or (self._re is None and self._re_normalized is None):
            return [(0, text)] if text else []
        out: list[tuple[int, str]] = []
        pos = 0
        between = self._lines.cut if self.lines else _one
        cut_at, append = self.cut_at, out.append
        for s, e in self._matches(text):
            piece = text[s:e]
            if piece not in cut_at:
                continue
            if s > pos:
                if s - pos < LINE_CHUNK_FROM:  # (short: never cut into lines)
                    append((pos, text[pos:s]))
                else:
                    between(text, pos, s, out)
            append((s, piece))
            pos = e
        if pos < len(text):
            if len(text) - pos < LINE_CHUNK_FROM:
                append((pos, text[pos:]))
            else:
                between(text, pos, len(text), out)
        return out

    def _matches(self, text: str) -> list[tuple[int, int]]:
        """The added tokens' matches (``(start, end)``, in order) in ``text`` as
        ``tokenizers`` finds them: those not ``normalized`` first (leftmost
        longest), then the normalized ones in the text left between. Each trie
        scans the whole text first (in C): when no two of all those matches
        overlap, no scan had to skip one for another's sake, so they are the
        answer; otherwise the scans are made in order, as described."""
        spans = [m.span() for rx in self._tries for m in rx.finditer(text)]
        spans.sort()
        if all(b[0] >= a[1] for a, b in zip(spans, spans[1:])):
            return spans
        n = len(text)
        matches: list[tuple[int, int]] = []
        pos = 0
        for s, e in [*_spans(self._re, text, 0, n), (n, n)]:
            matches.extend(_spans(self._re_normalized, text, pos, s))
            if s < e:
                matches.append((s, e))
            pos = e
        return matches


def _one(text: str, start: int, end: int, out: list) -> None:
    out.append((start, text[start:end]))


def _alternation(contents: set[str]):
    """A matcher of any of ``contents`` (``_spans``), the longest at a position
    first (so leftmost longest), or None. Written as a trie of the strings: a
    thousand added tokens sharing ``<｜`` are tried in one pass, not one by one;
    strings starting with different characters get a trie each (a regex starting
    with one literal character is searched for fast; one starting with a choice
    tries every position), merged in ``_spans``."""
    contents = {c for c in contents if c}
    if not contents:
        return None
    firsts: dict[str, list[str]] = {}
    for c in sorted(contents):
        firsts.setdefault(c[0], []).append(c)
    if len(firsts) == 1:
        return re.compile(_trie_pattern(sorted(contents)))
    return [re.compile(_trie_pattern(words)) for words in firsts.values()]


def _trie_pattern(words: list[str]) -> str:
    """A regex for ``words`` (sorted, distinct, none empty) that prefers longer matches."""
    groups: dict[str, list[str]] = {}
    for w in words:
        groups.setdefault(w[0], []).append(w[1:])
    alts = []
    for first, rests in groups.items():
        longer = [r for r in rests if r]
        if not longer:
            alts.append(re.escape(first))
            continue
        inner = _trie_pattern(longer)
        # a word may end here too: try the longer ones first (a greedy optional group)
        alts.append(re.escape(first) + (f"(?:{inner})?" if "" in rests else f"(?:{inner})"))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _spans(rx, text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The matches of ``rx`` (``_alternation``) within ``text[start:end]``: of a
    list of regexes (each for strings of one first character), the leftmost
    match of any from where the last ended, as one regex of them all would
    give (at a position only the one for its character can match)."""
    if rx is None or start >= end:
        return []
    if not isinstance(rx, list):
        return [m.span() for m in rx.finditer(text, start, end)]
    nxt = [r.search(text, start, end) for r in rx]
    out: list[tuple[int, int]] = []
    pos = start
    while True:
        best = None
        for k, m in enumerate(nxt):
            if m is not None and m.start() < pos:  # (overlapped by the last match: look again from its end)
                m = nxt[k] = rx[k].search(text, pos, end)
            if m is not None and (best is None or m.start() < best.start()):
                best = m
        if best is None:
            return out
        out.append(best.span())
        pos = best.end() if best.end() > best.start() else best.end() + 1


def _prefixes_first_word(component: Any) -> bool:
    """A Metaspace (anywhere in a pre-tokenizer/normalizer) that prefixes only
    the text's first word: its encoding of a piece depends on where the piece is."""
    if isinstance(component, dict):
        if component.get("type") == "Metaspace" and component.get("prepend_scheme") == "first":
            return True
        return any(_prefixes_first_word(v) for v in component.values())
    if isinstance(component, list):
        return any(_prefixes_first_word(v) for v in component)
    return False

