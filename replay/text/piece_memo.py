"""A rendered text's pieces from those of the texts rendered before it.

A chat template re-renders each request's whole conversation, so most of a
request's text was cut into pieces before (``replay.text.splitter``): the
system prompt and tools (the *head*, often the same text again, sometimes with
a line changed) and the conversation so far (which the previous request of the
same conversation ended with). :class:`PieceMemo` gives the same pieces as
``Splitter.pieces(text)`` with less work:

* The text is divided where the splitter starts afresh anyway
  (``Splitter.starts_afresh``: at a token cut at, which no token that could
  start earlier reaches past), at the first message boundary past
  :data:`HEAD_FROM` characters. The head's pieces are those of the head
  alone, remembered by its text; a new head is scanned for tokens only where
  it differs from the last head that ended alike (``PieceMemo._head``).
* The rest is compared with the last such rest that began with the same
  :data:`KEY` characters (and has the same characters before it, which a line
  cut may read). Up to the end of a token lying :attr:`Splitter.longest`
  characters or more inside their common beginning, every decision the
  splitter made read only common text, so those pieces stand (the very
  strings: their hashes are computed once); the splitter goes on from there.

Tested against ``Splitter.pieces`` on whole texts.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from replay.text.line_cuts import WINDOW, common_prefix, common_suffix

#: a head this long at least is set apart (a shorter one is scanned with the rest)
HEAD_FROM = 2_048
#: characters that name a conversation's text (the first of it)
KEY = 256
#: characters of heads remembered (then all are forgotten)
HEAD_CHARS = 8_000_000
#: characters of conversation texts remembered (then all are forgotten)
REST_CHARS = 8_000_000


class _Rest:
    """A text from its head's end: its pieces (starts relative to it), and
    where it may be taken up again (``before``: the characters before it that
    a line cut may read): ``clean_ends[i]`` is the end of a token, after which
    the scan starts afresh, ``clean_counts[i]`` the number of pieces up to it."""
    __slots__ = ("text", "before", "starts", "pieces", "clean_ends", "clean_counts")

    def __init__(self, text, before, starts, pieces, clean_ends, clean_counts):
        self.text, self.before, self.starts, self.pieces = text, before, starts, pieces
        self.clean_ends, self.clean_counts = clean_ends, clean_counts


class PieceMemo:
    """``pieces(text, boundaries)``: the splitter's pieces of ``text`` (module docstring)."""

    def __init__(self, splitter):
        self.splitter = splitter
        self._heads: dict[tuple, tuple] = {}  # (length, ends) → (head, its pieces, its matches)
        self._heads_by_end: dict[str, tuple] = {}  # last characters → the last head that ended so
        self._rests: dict[str, _Rest] = {}
        self._head_chars = self._chars = 0

    def pieces(self, text: str, boundaries: list[int]) -> tuple[list[int], list[str]]:
        """The starts and the pieces of ``text``; ``boundaries``: where messages
        begin in it (in order), candidates for the head's end."""
        sp = self.splitter
        if sp.whole or not sp.cut_at:
            got = sp.pieces(text)
            return [s for s, _ in got], [p for _, p in got]
        cut = 0
        for b in boundaries:
            if b >= HEAD_FROM and sp.starts_afresh(text, b):
                cut = b
                break
        starts: list[int] = []
        pieces: list[str] = []
        if cut:
            head_text = text[:cut]
            # (named by its length and ends, compared whole: no hash of the whole text)
            key = (cut, text[:KEY], text[cut - KEY:cut])
            got = self._heads.get(key)
            if got is None or got[0] != head_text:
                if self._head_chars > HEAD_CHARS:
                    self._heads.clear()
                    self._heads_by_end.clear()
                    self._head_chars = 0
                got = self._heads[key] = self._heads_by_end[key[2]] = self._head(head_text, key[2])
                self._head_chars += cut
            head = got[1]
            starts = [s for s, _ in head]
            pieces = [p for _, p in head]
        rest = self._rest(text, cut)
        if cut:
            starts.extend([s + cut for s in rest.starts])
        else:
            starts = list(rest.starts)
        pieces.extend(rest.pieces)
        return starts, pieces

    def _head(self, head_text: str, end: str) -> tuple[str, list[tuple[int, str]], list[tuple[int, int]]]:
        """(the head, its pieces, its tokens' matches). Tokens are looked for
        only where it differs from the last head that ended alike: from where
        their common end begins, ``R``, every decision reads common text, so
        when no match reaches over ``R`` in either, the scans agree from ``R``
        on and the earlier head's later matches are this one's."""
        sp = self.splitter
        like = self._heads_by_end.get(end)
        matches = None
        if like is not None:
            same = common_suffix(head_text, like[0])
            r, r_like = len(head_text) - same, len(like[0]) - same
            theirs = like[2]
            k = bisect_left(theirs, (r_like, -1))  # (their first match starting at R or after)
            if k == 0 or theirs[k - 1][1] <= r_like:
                mine = [m for m in sp.matches(head_text, 0, min(len(head_text), r + sp.longest)) if m[0] < r]
                if not mine or mine[-1][1] <= r:
                    shift = r - r_like
                    matches = mine + [(s + shift, e + shift) for s, e in theirs[k:]]
        pieces, matches = sp.scan(head_text, matches=matches)
        return head_text, pieces, matches

    def _rest(self, text: str, cut: int) -> _Rest:
        sp = self.splitter
        key = text[cut:cut + KEY]
        before = text[max(0, cut - WINDOW):cut]  # (a line cut's window may reach back into the head)
        like = self._rests.get(key)
        starts: list[int] = []
        pieces: list[str] = []
        clean_ends: list[int] = []
        clean_counts: list[int] = []
        resume = cut
        if like is not None and like.before == before:
            same = common_prefix(text[cut:cut + len(like.text)], like.text)
            k = bisect_right(like.clean_ends, same - sp.longest) - 1
            if k >= 0:
                n = like.clean_counts[k]
                starts, pieces = like.starts[:n], like.pieces[:n]
                clean_ends, clean_counts = like.clean_ends[:k + 1], like.clean_counts[:k + 1]
                resume = cut + like.clean_ends[k]
        clean: list[int] = []
        more = sp.pieces(text, resume, clean)
        base = len(pieces)
        starts.extend([s - cut for s, _ in more])
        pieces.extend([p for _, p in more])
        for i in clean:
            clean_ends.append(starts[base + i] + len(pieces[base + i]))
            clean_counts.append(base + i + 1)
        rest = _Rest(text[cut:], before, starts, pieces, clean_ends, clean_counts)
        if self._chars > REST_CHARS:
            self._rests.clear()
            self._chars = 0
        self._rests[key] = rest
        self._chars += len(rest.text)
        return rest
