"""Where the tokenize stage and the encoder process are in a chunk of a chat
template's requests, in a few bytes of memory both processes map.

The encoder process renders requests forward, in the order ingest wrote them
(``replay.text.template_ahead``); the stage renders a chunk's rows backward,
from its last row (``replay.text.tokenize_ahead``), until it reaches a request
the encoder process has started, then takes what that one rendered in one
ask. Neither waits for the other while both render: each writes its own
position and reads the other's, which no pipe round trip would allow.

``at`` is the last request the encoder process has started (every request it
was handed before that one is done with); ``claim_lo..claim_hi`` are the
requests the stage renders itself. Each side writes its own position before it
reads the other's, so at most the one request both reach at the same moment
is rendered twice (harmless: the stage does not take a request it has).
Correctness never depends on the board: the stage renders every row it did not
take, whatever the board said.
"""

from __future__ import annotations

import mmap
import tempfile

_AT, _CLAIM_LO, _CLAIM_HI = range(3)
_SIZE = 3 * 8
_NONE = -(1 << 62)


class Board:
    """The shared positions (module docstring). ``Board()`` makes a new one in an
    unlinked temporary file, whose descriptor (``fd``) the encoder process is
    given at start-up; ``Board(fd)`` maps that same file there."""

    def __init__(self, fd: int | None = None):
        self._file = None
        if fd is None:
            self._file = tempfile.TemporaryFile()
            self._file.truncate(_SIZE)
            fd = self._file.fileno()
        self.fd = fd
        self._map = mmap.mmap(fd, _SIZE)
        self._cells = memoryview(self._map).cast("q")
        if self._file is not None:
            self._cells[_AT] = _NONE
            self.unclaim()

    # ------------------------------------------------------------ the encoder process's side
    def start(self, request_id: int) -> None:
        """The encoder process starts on ``request_id`` (written before :meth:`claimed` is read)."""
        self._cells[_AT] = request_id

    def claimed(self, request_id: int) -> bool:
        """Does the stage render ``request_id`` itself?"""
        cells = self._cells
        return cells[_CLAIM_LO] <= request_id <= cells[_CLAIM_HI]

    # ------------------------------------------------------------ the stage's side
    def claim(self, lo: int, hi: int) -> None:
        """The stage renders requests ``lo..hi`` itself (written before :meth:`at` is
        read). The low end first: a claim moving on to a later chunk is empty for
        a moment, never wider than either."""
        self._cells[_CLAIM_LO] = lo
        self._cells[_CLAIM_HI] = hi

    def unclaim(self) -> None:
        self._cells[_CLAIM_LO] = -_NONE
        self._cells[_CLAIM_HI] = _NONE

    def at(self) -> int:
        """The last request the encoder process started (a very small number before the first)."""
        return self._cells[_AT]

    def close(self) -> None:
        if self._cells is not None:
            self._cells.release()
            self._map.close()
            self._cells = None
        if self._file is not None:
            self._file.close()
            self._file = None
