"""Where a long text between added tokens is cut into line chunks.

With the known pre-tokenizer (``replay.text.render_template``'s docstring) a
long run of text between two added tokens is also cut after a line break
followed by spaces/tabs and a character no definition counts as whitespace,
at content-defined places: a hash of the 24 characters before a candidate picks
one in eight, and a chunk is cut once :data:`LINE_CHUNK_MAX` long whatever its
content. So the cuts are a function of the text alone, and a changed line costs
its chunk, not the run.

The same runs come back request after request (a system prompt and its tool
definitions), each time as a new string, often with one line changed (a
per-request header, the current time). :class:`LineCuts` remembers runs it cut:

* a run seen before gets the cuts and the very piece strings it got then (whose
  hashes Python has already computed);
* a new run is compared with the last run that ended the same way. Where the
  two begin alike, the earlier run's cuts stand up to its last cut but one
  inside the common beginning (the pattern's look-ahead after that cut ends
  at the next line break, still inside it); the scan starts there. Where they
  end alike, the scan stops at the first cut ``p`` that lies 24 characters or
  more inside the common end and at which the earlier run was cut too: from
  ``p`` on, the two texts, the state of the scan (the last cut) and every
  hash window are the same, so the earlier run's later cuts are this one's.

Either way the cuts equal those of scanning the run afresh (tested against it).
"""

from __future__ import annotations

import re
import zlib
from bisect import bisect_right

#: a line chunk is cut once this long whatever its content
LINE_CHUNK_MAX = 16_384
# After a line break, spaces/tabs, then a character that is not whitespace in any
# definition: the known pre-tokenizer never joins text across it
_LINE_CUT = re.compile(r"[\r\n](?=[ \t]*[!-~\w])")
# the same for a text without a carriage return: a literal first character is
# searched for many times faster than a class of two
_LINE_CUT_LF = re.compile(r"\n(?=[ \t]*[!-~\w])")
#: characters before a candidate cut that decide it
WINDOW = 24
#: characters of runs remembered (then all are forgotten)
REMEMBERED_CHARS = 16_000_000
#: characters at each end that, with the length, name a run in the memo
_END = 48


class _Run:
    """A run that was cut: its text (with the window before its start), where
    the scan started, its cuts (positions in ``text``, the last its end) and
    the pieces between them."""
    __slots__ = ("text", "at", "cr", "cuts", "pieces")

    def __init__(self, text: str, at: int, cr: bool, cuts: list[int], pieces: list[str]):
        self.text, self.at, self.cr, self.cuts, self.pieces = text, at, cr, cuts, pieces


class LineCuts:
    """Line chunks of long runs, remembered (module docstring)."""

    def __init__(self):
        self._runs: dict[tuple, _Run] = {}  # (length, start, first and last characters) → run
        self._by_end: dict[str, _Run] = {}  # last characters → the last run that ended so
        self._by_start: dict[str, _Run] = {}  # first characters → the last run that began so
        self._chars = 0

    def cut(self, text: str, start: int, end: int, out: list) -> None:
        """Append ``(position, piece)`` for the line chunks of ``text[start:end]``."""
        base = max(0, start - WINDOW)  # (a cut reads the characters before it, maybe before ``start``)
        span = text[base:end]
        at = start - base
        key = (len(span), at, span[:_END], span[-_END:])
        run = self._runs.get(key)
        if run is None or run.text != span:
            run = self._cut(span, at)
            if self._chars > REMEMBERED_CHARS:
                self._runs.clear()
                self._by_end.clear()
                self._by_start.clear()
                self._chars = 0
            self._runs[key] = self._by_start[key[2]] = self._by_end[key[3]] = run
            self._chars += len(span)
        pos = start
        for piece in run.pieces:
            out.append((pos, piece))
            pos += len(piece)

    def _cut(self, span: str, at: int) -> _Run:
        cr = "\r" in span
        rx = _LINE_CUT if cr else _LINE_CUT_LF
        cuts: list[int] = []
        pos = last = at  # where the scan goes on; the last cut (or the start)
        like = self._by_end.get(span[-_END:]) or self._by_start.get(span[:_END])
        resync, shift, like_cuts, kept = len(span) + 1, 0, None, 0
        if like is not None and like.cr == cr:
            if like.at == at:
                k = bisect_right(like.cuts, common_prefix(span, like.text))
                if k >= 2:  # (the earlier run's cuts before its last one inside the common beginning)
                    kept = k - 1
                    cuts = like.cuts[:kept]
                    pos = last = cuts[-1]
            resync = len(span) - common_suffix(span, like.text) + WINDOW
            shift, like_cuts = len(like.text) - len(span), like.cuts
        for m in rx.finditer(span, pos):
            p = m.end()
            if p - last >= LINE_CHUNK_MAX or zlib.crc32(
                    span[p - WINDOW:p].encode("utf-8", "surrogatepass")) & 7 == 0:
                cuts.append(p)
                last = p
                if p >= resync:
                    k = bisect_right(like_cuts, p + shift) - 1
                    if k >= 0 and like_cuts[k] == p + shift:  # the earlier run was cut here too
                        cuts.extend(c - shift for c in like_cuts[k + 1:])
                        return _Run(span, at, cr, cuts,
                                    _pieces(span, at, cuts, like, kept, len(like_cuts) - k - 1))
        cuts.append(len(span))
        return _Run(span, at, cr, cuts, _pieces(span, at, cuts, like, kept, 0))


def _pieces(span: str, at: int, cuts: list[int], like: _Run | None, first: int, last: int) -> list[str]:
    """The pieces between the cuts: the ``first`` and the ``last`` pieces are
    ``like``'s own strings (the same text), the others sliced from ``span``."""
    out = like.pieces[:first] if first else []
    own_end = len(cuts) - last
    starts = [at, *cuts[:own_end - 1]]
    out.extend(span[a:b] for a, b in zip(starts[first:], cuts[first:own_end]))
    if last:
        out.extend(like.pieces[len(like.pieces) - last:])
    return out


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common beginning of ``a`` and ``b``."""
    return _agreeing(min(len(a), len(b)), lambda lo, hi: a[lo:hi] == b[lo:hi])


def common_suffix(a: str, b: str) -> int:
    """Length of the longest common end of ``a`` and ``b``."""
    la, lb = len(a), len(b)
    return _agreeing(min(la, lb), lambda lo, hi: a[la - hi:la - lo] == b[lb - hi:lb - lo])


def _agreeing(n: int, agree) -> int:
    """The largest ``k <= n`` such that the first ``k`` characters agree, where
    ``agree(lo, hi)`` compares characters ``lo`` to ``hi`` (slices compare in C:
    blocks of doubling size, then halving inside the first that disagrees)."""
    lo, step = 0, 1024
    while lo < n:
        hi = min(n, lo + step)
        if not agree(lo, hi):
            while hi - lo > 1:  # (the first ``lo`` agree, the first ``hi`` do not)
                mid = (lo + hi) // 2
                if agree(lo, mid):
                    lo = mid
                else:
                    hi = mid
            return lo
        lo, step = hi, step * 2
    return n
