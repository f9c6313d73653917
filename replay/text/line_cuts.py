"""Where a long text between added tokens is cut into line chunks.

With the known pre-tokenizer (DeepSeek-V3/V4's, ``tokenizer_json.KNOWN_PRE_TOKENIZER``,
no normalizer, no added token holding a line break) a long run of text between
two added tokens is also cut after a line break followed by spaces/tabs and a
character no definition counts as whitespace (the pre-tokenizer's matches never
reach across that point), at content-defined places: a hash of the 24 characters before a candidate picks
one in eight, and a chunk is cut once :data:`LINE_CHUNK_MAX` long whatever its
content. So the cuts are a function of the text alone, and a changed line costs
its chunk, not the run.

The same runs come back request after request (a system prompt and its tool
definitions): :class:`LineCuts` remembers the pieces of the runs it cut, by
their text (the very strings: their hashes are computed once).
"""

from __future__ import annotations

import re
import zlib
from itertools import compress

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


class LineCuts:
    """Line chunks of long runs, remembered by their text (module docstring)."""

    def __init__(self):
        self._runs: dict[str, list[str]] = {}  # the run with the window before it → its pieces
        self._chars = 0

    def cut(self, text: str, start: int, end: int, out: list) -> None:
        """Append ``(position, piece)`` for the line chunks of ``text[start:end]``."""
        base = max(0, start - WINDOW)  # (a cut reads the characters before it, maybe before ``start``)
        span = text[base:end]
        pieces = self._runs.get(span)
        if pieces is None:
            if self._chars > REMEMBERED_CHARS:
                self._runs.clear()
                self._chars = 0
            pieces = self._runs[span] = _cut(span, start - base)
            self._chars += len(span)
        pos = start
        for piece in pieces:
            out.append((pos, piece))
            pos += len(piece)


def _cut(span: str, at: int) -> list[str]:
    """The line chunks of ``span[at:]`` (``span[:at]``: the window before it)."""
    rx = _LINE_CUT if "\r" in span else _LINE_CUT_LF
    ends = [m.end() for m in rx.finditer(span, at)]  # (the candidates)
    picked = [zlib.crc32(span[p - WINDOW:p].encode("utf-8", "surrogatepass")) & 7 == 0 for p in ends]
    cuts = list(compress(ends, picked))
    if ends and (ends[-1] - (cuts[-1] if cuts else at) >= LINE_CHUNK_MAX
                 or any(b - a >= LINE_CHUNK_MAX for a, b in zip([at, *cuts], cuts))):
        cuts, last = [], at  # (a chunk may reach the limit: candidates taken in order)
        for p, pick in zip(ends, picked):
            if pick or p - last >= LINE_CHUNK_MAX:
                cuts.append(p)
                last = p
    cuts.append(len(span))
    return [span[a:b] for a, b in zip([at, *cuts[:-1]], cuts)]
