"""The radix trie with last-used timestamps (semantics.md, "the trie walk").

One ``Trie`` is one stream's cache. ``walk(seq, t)`` (``t`` in integer
microseconds) returns the *steps* of the request: ``[(gap, depth), ...]`` with
gap strictly increasing and depth strictly increasing, such that for every TTL
``τ``

    L_τ = max(depth for gap, depth in steps if gap <= τ)   (0 if none)

(``replay.core.hits`` reads it so; gaps are integer microseconds, so a gap of
exactly τ compares equal to τ.)

Why this works: a node's last-used time is the latest time any earlier request
passed through it, last-used never grows going deeper, so the gap ``t - last_used``
is non-decreasing along the path and one walk answers every TTL at once.

Layout (after SGLang's ``radix_cache.py``): children keyed by their first
symbol, edges holding runs of symbols as numpy views, a node split where a
match ends inside an edge. Two things keep the work proportional to branch
points rather than prompt length:

* edges are compared in C, element by element (whole chunks by ``memcmp``
  first), and
* after a walk every node on the path has last-used == t, so a path node with
  a single child is merged with that child. A conversation that grows turn
  after turn therefore stays one long edge instead of a chain of one node per
  turn.

Memory: an edge is a view of an array the trie holds. A new leaf or a merged
edge is the request's symbols from the edge's start to its end, copied once
per request and shared by every trie that walks it (``held``: the four stream
modes hold one copy, not four); the two parts of a split edge stay views of the
array they were part of.

Symbols are int32 or int64 (even within one trie). Text prompts use token ids; block traces (Mooncake) use block
ids (made negative so they never meet token ids) and carry the token length of
each block in ``cum`` (cumulative token counts), so depths are always tokens.

The trie is compiled (``replay/core/_trie.pyx``, built by ``pip install``; a C
compiler is required): there is one implementation, tested against the
brute-force definition of a walk (``tests/support/kernels.py``).

``Trie(horizon=INF_US)``: when ``horizon`` (µs) is finite, nodes idle for longer
than the horizon are pruned from time to time, so memory follows the TTL window.
Gaps larger than the horizon are then not reported; walks stay exact for every
``τ <= horizon``. Prune (``last_used < now − horizon``) and walk
(``t − last_used > horizon``) drop exactly the same nodes.

``Trie.walk(seq, t, insert=None, cum=None, known=0, owner=None, held=None)``
walks ``seq`` at time ``t``, returns its steps and inserts it. ``insert`` (a
sequence starting with ``seq``, e.g. prompt + output) is inserted instead of
``seq`` when the engine also keeps the generated tokens. ``cum`` maps symbol
depth to token depth. ``known``: the caller's guarantee that ``seq[:known]`` is
a path of this trie already (an earlier sequence it walked, not pruned since),
so edges within it match whole without being compared. ``owner`` (an int: the
request's place in the caller's order): every node on the path records it, and
each step is (gap, depth, owner of that part of the path), parts with another
owner kept apart even at the same gap (``replay.core.replay``). ``held``: a dict
per request, shared by every trie that walks it, in which they keep the one
copy of its symbols they all hold (None: a copy for this walk alone).
"""

from __future__ import annotations

import numpy as np

from replay.core._trie import Trie

__all__ = ["Trie", "common_prefix_len"]


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two arrays (vectorised)."""
    k = min(len(a), len(b))
    if k == 0:
        return 0
    diff = a[:k] != b[:k]
    i = int(diff.argmax())
    return k if not diff[i] else i
