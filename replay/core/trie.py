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

* edges are compared vectorised (one numpy comparison per edge; in C in the
  compiled trie, ``replay/_trie.pyx``, the class ``Trie`` names when it is
  built), and
* after a walk every node on the path has last-used == t, so a path node with
  a single child is merged with that child. A conversation that grows turn
  after turn therefore stays one long edge instead of a chain of one node per
  turn.

Memory: an edge is a view of an array the trie holds. A new leaf or a merged
edge is the request's symbols from the edge's start to its end, copied once
per request and shared by every trie that walks it (``held``, see
:class:`PythonTails`: the four stream modes hold one copy, not four); the two
parts of a split edge stay views of the array they were part of.

Symbols are int64. Text prompts use token ids; block traces (Mooncake) use block
ids (made negative so they never meet token ids) and carry the token length of
each block in ``cum`` (cumulative token counts), so depths are always tokens.
"""

from __future__ import annotations

import os

import numpy as np

from replay.core.times import INF_US

__all__ = ["Trie", "PythonTrie", "PythonTails", "COMPILED", "common_prefix_len"]


class PythonTails:
    """The part of each walked sequence the tries hold, copied once and shared by
    every trie that walks it (kept in the request's ``held``: ``Trie.walk(..., held=)``).

    A new leaf or a merged edge is a part of the walked sequence, most of which
    (the conversation so far) the trie holds already: holding the whole sequence
    for it would keep all of that twice, so the part from the edge's start to
    the end is copied — once per request, however many tries (stream modes,
    variants, replicas) walk it; their edges are views of that copy. A split
    edge's two parts stay views of the array it was part of."""

    def __init__(self):
        self._held: dict[int, list] = {}  # id(seq) -> [seq, lo, seq[lo:] (seq itself when lo == 0)]

    def take(self, seq: np.ndarray, start: int, end: int) -> np.ndarray:
        """``seq[start:end]``, as a view of the shared copy."""
        got = self._held.get(id(seq))
        if got is None or got[0] is not seq or start < got[1]:
            got = [seq, start, seq if start == 0 else seq[start:].copy()]
            self._held[id(seq)] = got
        lo = got[1]
        return got[2][start - lo:end - lo]


class _Node:
    __slots__ = ("edge", "children", "last_used", "owner")

    def __init__(self, edge: np.ndarray, last_used: int, owner: int = -1):
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.last_used = last_used
        self.owner = owner  # the last request that walked through it (walks with an owner)


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two arrays (vectorised)."""
    k = min(len(a), len(b))
    if k == 0:
        return 0
    diff = a[:k] != b[:k]
    i = int(diff.argmax())
    return k if not diff[i] else i


class PythonTrie:
    """A per-stream radix trie whose nodes carry last-used timestamps.

    ``horizon`` (µs): when finite (below ``INF_US``), nodes idle for longer than
    the horizon are pruned from time to time, so memory follows the TTL window.
    Gaps larger than the horizon are then not reported; walks stay exact for
    every ``τ <= horizon``. Prune (``last_used < now − horizon``) and walk
    (``t − last_used > horizon``) drop exactly the same nodes.
    """

    def __init__(self, horizon: int = INF_US):
        self.root = _Node(np.empty(0, dtype=np.int64), 0)  # (the root's time is never read)
        self.horizon = int(horizon)
        self._last_prune: int | None = None
        self.nodes = 1

    # ---- the walk -------------------------------------------------------
    def walk(self, seq: np.ndarray, t: int, insert: np.ndarray | None = None,
             cum: np.ndarray | None = None, known: int = 0, owner: int | None = None,
             held: dict | None = None) -> list[tuple]:
        """Walk ``seq`` at time ``t``; return its steps and insert it.

        ``insert`` (a sequence starting with ``seq``, e.g. prompt + output) is
        what gets inserted instead of ``seq`` when the engine also keeps the
        generated tokens. ``cum`` maps symbol depth to token depth. ``known``:
        the caller's guarantee that ``seq[:known]`` is a path of this trie
        already (an earlier sequence it walked, not pruned since), so edges
        within it match whole without being compared.

        ``owner`` (an int: the request's place in the caller's order): every node
        on the path records it, and each step is (gap, depth, owner of that part
        of the path), parts with another owner kept apart even at the same gap —
        what the capacity pass needs (``replay.core.capacity``).

        ``held``: a dict per request, shared by every trie that walks it, in
        which they keep the one copy of its symbols they all hold (its
        :class:`PythonTails`; None: a copy for this walk alone).
        """
        if self.horizon < INF_US and (self._last_prune is None or t - self._last_prune > self.horizon // 2):
            self.prune(t)
        tails = PythonTails() if held is None else held.setdefault(PythonTails, PythonTails())
        steps = self._descend(seq, t, tails, record=True, known=known, owner=owner)
        if insert is not None and len(insert) > len(seq):
            # seq is a path now
            self._descend(insert, t, tails, record=False, known=len(seq), owner=owner)
        if cum is not None:
            steps = [(s[0], int(cum[s[1]]), *s[2:]) for s in steps]
        return steps

    def _descend(self, seq: np.ndarray, t: int, tails: PythonTails, record: bool, known: int = 0,
                 owner: int | None = None) -> list[tuple]:
        steps: list[tuple] = []
        path: list[tuple[_Node, int, int]] = []  # (node, start depth, end depth) below root
        node, pos, n = self.root, 0, len(seq)
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                break
            edge = child.edge
            if pos + len(edge) <= known:
                matched = len(edge)
            elif pos < known:  # the edge's part up to ``known`` matches: compare the rest
                matched = known - pos + common_prefix_len(edge[known - pos:], seq[known:])
            else:
                matched = common_prefix_len(edge, seq[pos:])
            if record:
                gap = t - child.last_used
                if gap > self.horizon:
                    # idle past the horizon: as good as pruned (exact for τ <= horizon)
                    break
                if owner is not None:
                    if steps and steps[-1][0] == gap and steps[-1][2] == child.owner:
                        steps[-1] = (gap, pos + matched, child.owner)
                    else:
                        steps.append((gap, pos + matched, child.owner))
                elif steps and steps[-1][0] == gap:
                    steps[-1] = (gap, pos + matched)
                else:
                    steps.append((gap, pos + matched))
            if matched < len(edge):
                # the match ends inside the edge: split it (both parts views of its array)
                mid = _Node(edge[:matched], child.last_used, child.owner)
                child.edge = edge[matched:]
                mid.children[int(child.edge[0])] = child
                node.children[int(seq[pos])] = mid
                self.nodes += 1
                path.append((mid, pos, pos + matched))
                pos += matched
                node = mid
                break
            path.append((child, pos, pos + len(edge)))
            node, pos = child, pos + len(edge)
        if pos < n:
            stale = node.children.get(int(seq[pos]))
            if stale is not None:  # idle past the horizon, not yet pruned
                self.nodes -= _count(stale)
            leaf = _Node(seq[pos:], t)  # (a view for now: owned once the merge has decided its extent)
            node.children[int(seq[pos])] = leaf
            self.nodes += 1
            path.append((leaf, pos, n))
        else:
            leaf = None
        self._refresh_and_merge(path, seq, tails, t, -1 if owner is None else owner, leaf)
        return steps

    def _refresh_and_merge(self, path, seq: np.ndarray, tails: PythonTails, t: int, owner: int,
                           leaf: _Node | None) -> None:
        """Set last-used = t (and the owner) along the path, merging single-child
        chains; a merged edge, or the new ``leaf`` left alone, takes its symbols
        from ``tails`` (one copy, made once)."""
        i = 0
        while i < len(path):
            head, start, end = path[i]
            head.last_used = t
            head.owner = owner
            j = i
            # absorb following path nodes while head has exactly that one child
            while j + 1 < len(path) and len(head.children) == 1:
                nxt, _, nxt_end = path[j + 1]
                head.children = nxt.children
                end = nxt_end
                self.nodes -= 1
                j += 1
            if j > i or head is leaf:
                head.edge = tails.take(seq, start, end)
            i = j + 1

    # ---- memory ---------------------------------------------------------
    def prune(self, now: int) -> None:
        """Drop subtrees idle for longer than the horizon (last-used shrinks with depth)."""
        self._last_prune = now
        cutoff = now - self.horizon
        stack = [self.root]
        while stack:
            node = stack.pop()
            dead = [k for k, c in node.children.items() if c.last_used < cutoff]
            for k in dead:
                self.nodes -= _count(node.children.pop(k))
            stack.extend(node.children.values())


def _count(node: _Node) -> int:
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        n += 1
        stack.extend(x.children.values())
    return n


# The same class compiled (replay/_trie.pyx, built by `pip install` with Cython):
# the walks are identical, node for node (the tests run both against the oracle).
# REPLAY_PURE_TRIE=1 keeps this module's Python one.
Trie = PythonTrie
COMPILED = False
if os.environ.get("REPLAY_PURE_TRIE", "") != "1":
    try:
        from replay.core._trie import Trie  # noqa: F811
        COMPILED = True
    except ImportError:  # not built here (no compiler at install): the Python trie
        pass
