"""Partitioned replay: the walks of ``replay_prompts``, computed part by part.

The prompts (as ``iter_prompts`` yields them, in processing order) are split
into partitions each of which is replayed on its own with the ordinary
machinery (:func:`replay.core.replay.replay_prompts`, one trie per cache), and
the partitions' rows are merged into exactly the rows the single-process
replay writes (the oracle: ``tests/test_partition.py``). Pure Python + numpy;
``replay.distributed`` runs the same tasks elsewhere (Ray).

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
cut where ``t − T(x)`` exceeds the horizon (``PythonTrie``: node splits and merges
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

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np

from replay.core.prompts import SegmentStore, light, restored
from replay.core.replay import replay_prompts
from replay.core.streams import MODES, check_modes, stream_key
from replay.core.times import INF_US

DEFAULT_PARTITIONS = 8
DEFAULT_DEPTH = 256  # K: symbols (tokens, or blocks of a block trace) of the global partition key
SHALLOW = "shallow"


@dataclass
class Task:
    """One independent replay: ``prompts`` (in processing order) walked for ``mode``."""
    name: str                # "<mode>/<partition>", or "global/shallow"
    mode: str
    prompts: list = field(default_factory=list)


@dataclass
class Plan:
    modes: tuple[str, ...]
    parts: int
    depth: int
    tasks: list[Task]
    order: dict[int, int]     # request id -> place in processing order
    boundary: dict[int, int]  # global: request id -> token depth of its first K symbols (prompts longer than K)


def _digest(*parts) -> int:
    h = hashlib.blake2b(digest_size=8)
    for x in parts:
        if isinstance(x, np.ndarray):
            h.update(np.ascontiguousarray(x, dtype=np.int64).tobytes())
        else:
            h.update(repr(x).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little")


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
    return dataclasses.replace(p, symbols=cut, cum=cum, output=out, shared=min(p.shared, depth),
                               seg_ids=None, output_seg_ids=None)


def plan(prompts, modes=MODES, parts: int = DEFAULT_PARTITIONS, depth: int = DEFAULT_DEPTH,
         travel_light: bool = False) -> Plan:
    """Split ``prompts`` (processing order) into the tasks of ``modes``: ``parts``
    partitions per mode, plus the shallow task of the global mode.

    ``travel_light``: the tasks hold text prompts without their tokens
    (``replay.core.prompts.light``: :func:`run_task` assembles them again from
    the segments), so the plan of a week holds segment ids, not the week's
    tokens, and a task ships a few bytes a segment."""
    modes = check_modes(modes)
    if parts < 1 or depth < 1:
        raise ValueError("partitions and partition depth must be at least 1")
    tasks = {m: [Task(f"{m}/{i}", m) for i in range(parts)] for m in modes}
    shallow = Task(f"global/{SHALLOW}", "global") if "global" in modes else None
    order: dict[int, int] = {}
    boundary: dict[int, int] = {}
    last_part: dict[tuple, int] = {}  # global: (tenant, session or key) -> partition of its latest text prompt
    keep = light if travel_light else (lambda p: p)
    for i, p in enumerate(prompts):
        order[p.request_id] = i
        kept = keep(p)
        for m in modes:
            if m != "global":
                tasks[m][_digest(stream_key(m, p.tenant, p.key, p.session)) % parts].prompts.append(kept)
                continue
            k = _digest(p.model, global_key_symbols(p, depth)) % parts
            q = kept
            if p.cum is None:  # a text prompt: iter_prompts' conversation bookkeeping
                conv = (p.tenant, p.session or p.key)
                if p.shared and last_part.get(conv) != k:
                    q = dataclasses.replace(kept, shared=0)  # its previous prompt went to another trie
                last_part[conv] = k
            tasks[m][k].prompts.append(q)
            shallow.prompts.append(shallow_prompt(p, depth, own=travel_light))
            if len(p.symbols) > depth:
                boundary[p.request_id] = int(p.cum[depth]) if p.cum is not None else depth
    flat = [t for m in modes for t in tasks[m] if t.prompts]
    if shallow is not None:
        flat.append(shallow)
    return Plan(modes, parts, depth, flat, order, boundary)


def run_task(task: Task, variants=("prompt",), horizon_us: int = INF_US, segments: SegmentStore | None = None) -> dict:
    """One task's rows per (variant, mode) (``replay_prompts``' result, ``_nodes``
    included); ``segments`` give back the tokens of a light plan's prompts."""
    prompts = task.prompts if segments is None else restored(task.prompts, segments)
    return replay_prompts(prompts, (task.mode,), tuple(variants), int(horizon_us))


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


def shallow_rows(result: dict) -> dict:
    """The shallow task's rows by variant, then request id."""
    return {key[0]: {r[0]: r for r in rows} for key, rows in result.items() if key != "_nodes"}


def finish(plan_: Plan, task: Task, result: dict, shallow: dict | None) -> dict:
    """A partition task's result as final rows per (variant, mode): as they are
    for a stream mode; spliced with the shallow rows (:func:`shallow_rows`) for
    the global mode. (The shallow task itself yields no rows of its own.)"""
    if task.name == f"global/{SHALLOW}":
        return {}
    out = {}
    for key, rows in result.items():
        if key == "_nodes":
            continue
        if task.mode != "global":
            out[key] = rows
            continue
        sh = shallow[key[0]]
        b = plan_.boundary
        out[key] = [splice(sh[r[0]], r, b[r[0]]) if r[0] in b else (*r[:5], *sh[r[0]][5:8]) for r in rows]
    return out


def replay_partitioned(prompts, modes=MODES, variants=("prompt",), horizon_us: int = INF_US,
                       parts: int = DEFAULT_PARTITIONS, depth: int = DEFAULT_DEPTH,
                       segments: SegmentStore | None = None) -> dict:
    """:func:`replay.core.replay.replay_prompts`' result (without a sink), computed
    partition by partition in this process: the same rows in the same order
    (processing order); ``_nodes`` sums the partitions' tries (the shallow one
    included), so it is not the single pass's count. ``segments``: plan light
    and assemble each task's prompts from them, as the Ray engine does."""
    pl = plan(prompts, modes, parts, depth, travel_light=segments is not None)
    results = {t.name: run_task(t, variants, horizon_us, segments) for t in pl.tasks}
    shallow = shallow_rows(results[f"global/{SHALLOW}"]) if "global" in pl.modes else None
    merged: dict = {(v, m): [] for v in variants for m in pl.modes}
    nodes: dict[str, int] = {}
    for t in pl.tasks:
        for k, n in results[t.name]["_nodes"].items():
            nodes[k] = nodes.get(k, 0) + n
        for key, rows in finish(pl, t, results[t.name], shallow).items():
            merged[key].extend(rows)
    for rows in merged.values():
        rows.sort(key=lambda r: pl.order[r[0]])
    merged["_nodes"] = nodes
    return merged
