"""The time order of one file's loaded units, as they come in the file.

Requests are replayed in time order whatever the order of the file (the stable
time sort of `requests`), so this changes no result: it is said so that a user
whose log came newest-first, or shuffled, trusts the input. One of

* ``sorted`` — non-decreasing (ties allowed); a file of 0 or 1 units, or all
  at one time, is sorted;
* ``jittered`` — nearly sorted: at most ``max(1, 1 % of the adjacent pairs)``
  pairs descend, and none by more than a minute (what concurrent writers to one
  log leave behind). Not flagged;
* ``reversed`` — non-increasing with at least two distinct times, or nearly so
  (the same tolerance, for the ascending pairs);
* ``shuffled`` — anything else.

``reversed`` and ``shuffled`` are the orders the ingest summary, ``ingest
--json`` (``unordered_files``) and the report name (:data:`FLAGGED`).
"""

from __future__ import annotations

from replay.times import US_PER_S

SORTED, JITTERED, REVERSED, SHUFFLED = "sorted", "jittered", "reversed", "shuffled"
ORDERS = (SORTED, JITTERED, REVERSED, SHUFFLED)
FLAGGED = (REVERSED, SHUFFLED)

MAX_SHARE = 0.01            # of the adjacent pairs that may go the wrong way
MAX_STEP_US = 60 * US_PER_S  # and by how much, at most


class TimeOrder:
    """Counts, one timestamp (µs) at a time, the pairs of consecutive units that
    go up and down, and the largest step each way."""

    __slots__ = ("first", "prev", "pairs", "down", "up", "max_down", "max_up")

    def __init__(self) -> None:
        self.first: int | None = None
        self.prev: int | None = None
        self.pairs = self.down = self.up = 0
        self.max_down = self.max_up = 0

    def add(self, ts_us: int) -> None:
        prev, self.prev = self.prev, ts_us
        if prev is None:
            self.first = ts_us
            return
        self.pairs += 1
        if ts_us < prev:
            self.down += 1
            self.max_down = max(self.max_down, prev - ts_us)
        elif ts_us > prev:
            self.up += 1
            self.max_up = max(self.max_up, ts_us - prev)

    def extend(self, later: "TimeOrder") -> None:
        """Counts ``later``'s units as if they had been added here after these (a
        file read in byte ranges: each range counted apart, merged in order)."""
        if later.first is None:
            return
        if self.prev is None:
            self.first = later.first
        else:
            self.add(later.first)  # (the pair across the cut)
        self.prev = later.prev
        self.pairs += later.pairs
        self.down += later.down
        self.up += later.up
        self.max_down = max(self.max_down, later.max_down)
        self.max_up = max(self.max_up, later.max_up)

    def order(self) -> str:
        if self.down == 0:
            return SORTED
        if self.up == 0:
            return REVERSED
        if _few(self.down, self.max_down, self.pairs):
            return JITTERED
        if _few(self.up, self.max_up, self.pairs):
            return REVERSED
        return SHUFFLED


def _few(wrong: int, largest: int, pairs: int) -> bool:
    """Within the tolerance: few pairs the wrong way, none by much."""
    return wrong <= max(1, MAX_SHARE * pairs) and largest <= MAX_STEP_US


def classify(ts_us) -> str:
    """The order of a sequence of timestamps (µs), in the order given."""
    t = TimeOrder()
    for x in ts_us:
        t.add(int(x))
    return t.order()
