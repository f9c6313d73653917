"""Partitioned replay: the walks of ``replay_prompts``, computed part by part.

The prompts (as ``iter_prompts`` yields them, in processing order) are routed
to partitions (:class:`Router`) each of which is replayed on its own with the
ordinary machinery (``replay.core.replay.Replayer``, one trie per cache), and
the partitions' rows are merged (:func:`merged_row`) into exactly the rows the
single-process replay writes (the oracle: ``tests/core/test_partition.py``). Pure
Python + numpy; ``replay.core.streamed`` feeds the partitions to walkers, in
this process or as Ray actors (``replay.distributed``).

Stream modes (tenant, key, session)
-----------------------------------
A cache is (stream key, model) and caches never share, so a partition that
holds whole streams — stream key hashed mod N — replays each of its caches
exactly as the single pass does: same requests, same order (a subsequence of
the processing order keeps every cache's own order), same trie. The ``_known``
shortcut of ``replay_prompts`` (a conversation's previous prompt was walked into
this trie) only fires when the previous prompt had the same stream and model,
hence the same partition. The origin of a step depends only on the tenant and
session of the walking request and of the step's last writer, both of which are
in the cache, hence in the partition (writer *codes* differ between processes;
origins do not).

Global mode (one cache per model): partition by the first K symbols
---------------------------------------------------------------------
Write ``I_r`` for what request ``r`` inserts (its prompt ``P_r``, or
``P_r + output_r`` for the ``prompt+output`` variant) and ``X_K(r) = I_r[:K]``
(K symbols: tokens, or blocks of a block trace). ``r`` goes to partition
``hash(model, X_K(r)) mod N``. A *shallow* task replays every request with
``P_r[:K]`` walked and ``I_r[:K]`` inserted.

The single trie's answer for ``r`` is intrinsic to the log: for every depth ``d``
of its walk, the prefix ``x = P_r[:d]`` has last-used ``T(x)`` = the latest time
of an earlier request whose walked prompt or inserted sequence starts with ``x``,
and an owner = the (tenant, session) of the last such request (processing order);
the step function is the run-length encoding of ``d ↦ (t − T(x), origin(owner))``
cut where ``t − T(x)`` exceeds the horizon (``replay.core.trie``: node splits and merges
preserve this function; a node idle past the horizon counts as absent, in walk and
prune alike, and since last-used never grows with depth the cut is the same
however the trie is shaped). So a trie that has seen *every* request passing
through ``x`` gives ``x``'s exact gap and origin.

* ``d ≤ K`` (in symbols): every request's ``P[:K]`` / ``I[:K]`` went through the
  shallow trie, and a sequence passes through ``x`` (``|x| ≤ K``) iff its
  truncation to K does. So the shallow trie is exact there.
* ``d > K``: a request passing through ``x`` (``|x| > K``) has ``I[:K] = x[:K]``
  (walking: ``|P| ≥ d > K`` so ``I[:K] = P[:K]``; inserting: directly), hence the
  same key as ``r`` — the same partition. Its partition's trie saw all of them,
  in order, so it is exact there. (Other keys hashed into the same partition only
  add prefixes of depth ≤ K that diverge from ``x``, i.e. other nodes.)

Hence the merged row: the shallow row's steps (all of depth ≤ ``cum[K]`` tokens)
followed by the partition row's steps deeper than ``cum[K]``, re-merged where the
two meet with the same (gap, origin) — the run-length encoding again, which is
what ``Writers.split`` emits. Equivalently ``L_τ = max(L_τ(partition),
L_τ(shallow))`` for every TTL, with origins. A partition reaching past depth K
implies the shallow walk reached K (the deeper node's earlier request also
inserted ``P_r[:K]`` into the shallow trie, and last-used only shrinks with depth,
so within the horizon there too); :func:`splice` checks it.

Details the argument needs, handled here:

* The key is taken from ``I`` (``P + output``), not ``P``: a prompt shorter than K
  whose output is inserted makes nodes deeper than K under ``I[:K]``. One
  partitioning by ``I`` serves both variants: where ``|P| ≥ K`` the two keys are
  equal, and a prompt of at most K symbols walks only depths ≤ K (shallow rows)
  and, for the ``prompt`` variant, inserts only such depths.
* ``_known``: the conversation's previous prompt is in the same cache (same
  model) but maybe in another partition; a partition's prompt keeps its
  ``shared`` count only when the previous prompt of its conversation
  (``iter_prompts``' ``(tenant, session or key)``) is in the same partition, else
  0. The shallow prompts keep ``min(shared, K)``: the previous prompt's first K
  symbols were walked into the shallow trie.
* Horizon pruning removes only nodes idle past the horizon, whatever the pass
  sees (see above); walks stay exact for every ``τ ≤ horizon``.
* Skew: requests whose first K symbols are equal (a long system prompt shared by
  everything) share one partition; a larger K splits them at the cost of a
  deeper shallow trie (its work follows branch points, not K).
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from replay.core.prompts import altered, light
from replay.core.streams import MODES, check_modes, stream_key

DEFAULT_PARTITIONS = 8
DEFAULT_DEPTH = 256  # K: symbols (tokens, or blocks of a block trace) of the global partition key
SHALLOW = "shallow"


def _digest(*parts) -> int:
    h = hashlib.blake2b(digest_size=8)
    for x in parts:
        if isinstance(x, np.ndarray):
            h.update(np.ascontiguousarray(x, dtype=np.int64).tobytes())
        else:
            h.update(repr(x).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little")


@functools.lru_cache(maxsize=1 << 16)
def _stream_task(mode: str, stream: str, parts: int) -> str:
    """The task of a stream (a conversation's requests come back to it again and again)."""
    return f"{mode}/{_digest(stream) % parts}"


def global_key_symbols(p, depth: int) -> np.ndarray:
    """``I[:K]``: the first ``depth`` symbols of what ``p`` inserts (prompt + output when it has one)."""
    s = p.symbols
    if len(s) >= depth or p.output is None or not len(p.output):
        return s[:depth]
    return np.concatenate([s, p.output[:depth - len(s)].astype(s.dtype, copy=False)])


def shallow_prompt(p, depth: int, own: bool = False):
    """``p`` cut to its first ``depth`` symbols: walks ``P[:K]``, inserts ``I[:K]``
    (``own``: copies of them, not views that keep the whole prompt alive)."""
    s = p.symbols
    if len(s) >= depth:
        out = None
    elif p.output is None or not len(p.output):
        out = p.output
    else:
        out = p.output[:depth - len(s)]
    cut, cum = s[:depth], None if p.cum is None else p.cum[:depth + 1]
    if own:
        cut, cum, out = (None if x is None else x.copy() for x in (cut, cum, out))
    return altered(p, symbols=cut, cum=cum, output=out, shared=min(p.shared, depth), seg_ids=None,
                   output_seg_ids=None)


class Router:
    """Where each prompt goes, one prompt at a time (processing order): the
    partition of each mode and, for the global mode, the shallow task too
    (``replay.core.streamed`` hands them to the walkers of those partitions).

    ``travel_light``: text prompts go without their tokens
    (``replay.core.prompts.light``: the walker assembles them again from the
    segments it was sent), a few bytes a segment instead of a whole
    conversation again and again."""

    def __init__(self, modes=MODES, parts: int = DEFAULT_PARTITIONS, depth: int = DEFAULT_DEPTH,
                 travel_light: bool = False):
        self.modes = check_modes(modes)
        if parts < 1 or depth < 1:
            raise ValueError("partitions and partition depth must be at least 1")
        self.parts, self.depth = int(parts), int(depth)
        self.keep = light if travel_light else (lambda p: p)
        self.travel_light = travel_light
        self._last_part: dict[tuple, int] = {}  # global: (tenant, session or key) -> partition of its latest text prompt

    @property
    def names(self) -> list[str]:
        """Every task's name: the shallow task's first, then mode by mode."""
        return ([f"global/{SHALLOW}"] if "global" in self.modes else []) + \
            [f"{m}/{i}" for m in self.modes for i in range(self.parts)]

    def route(self, p) -> tuple[list[tuple[str, object]], int | None]:
        """``[(task name, the prompt as that task walks it)]`` for ``p``, and (global
        mode, a prompt longer than K symbols) the token depth of its first K symbols."""
        kept = self.keep(p)
        out, boundary = [], None
        for m in self.modes:
            if m != "global":
                out.append((_stream_task(m, stream_key(m, p.tenant, p.key, p.session), self.parts), kept))
                continue
            k = _digest(p.model, global_key_symbols(p, self.depth)) % self.parts
            q = kept
            if p.cum is None:  # a text prompt: iter_prompts' conversation bookkeeping
                conv = (p.tenant, p.session or p.key)
                if p.shared and self._last_part.get(conv) != k:
                    q = altered(kept, shared=0)  # its previous prompt went to another trie
                self._last_part[conv] = k
            out.append((f"global/{k}", q))
            out.append((f"global/{SHALLOW}", shallow_prompt(p, self.depth, own=self.travel_light)))
            if len(p.symbols) > self.depth:
                boundary = int(p.cum[self.depth]) if p.cum is not None else self.depth
        return out, boundary


def splice(shallow_row, part_row, kt: int):
    """The row of the single trie from the shallow row (exact to depth ``kt``
    tokens) and the partition row (exact beyond it); see the module docstring."""
    gaps, depths, origins = (list(x) for x in shallow_row[5:8])
    pg, pd, po = part_row[5:8]
    i = int(np.searchsorted(np.asarray(pd, dtype=np.int64), kt, side="right")) if len(pd) else 0
    if i < len(pd) and (not depths or depths[-1] != kt):
        raise AssertionError(f"request {part_row[0]}: its partition matched past depth {kt} "
                             f"but the shallow trie did not reach it")
    for g, d, o in zip(pg[i:], pd[i:], po[i:]):
        if gaps and gaps[-1] == g and origins[-1] == o:
            depths[-1] = d
        else:
            gaps.append(g)
            depths.append(d)
            origins.append(o)
    return (*part_row[:5], gaps, depths, origins)


def merged_row(shallow_row, part_row, boundary: int | None):
    """A global request's final row: the shallow row alone for a prompt of at most
    K symbols (``boundary`` None), else :func:`splice` at its first K symbols' depth."""
    return (*part_row[:5], *shallow_row[5:8]) if boundary is None else splice(shallow_row, part_row, boundary)
