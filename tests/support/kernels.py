"""The compiled kernels' contracts written out by brute force: the trie walk
(``replay.core.trie``), the prompt assembly (``replay.core._trie.extend``), the
hit origin of a step (``replay.core._trie.Writers``) and the hit counts
(``replay.core.hits``). Slow and literal on purpose: the package holds one
implementation of each, and the tests hold it to these."""

from __future__ import annotations

import numpy as np

from replay.times import INF_US

SAME_SESSION, OTHER_SESSION, OTHER_TENANT = 0, 1, 2  # replay.core.streams.ORIGINS


def _lcp(a, b) -> int:
    k = min(len(a), len(b))
    if k == 0:
        return 0
    diff = np.asarray(a[:k]) != np.asarray(b[:k])
    return int(diff.argmax()) if diff.any() else k


class BruteTrie:
    """A trie that is no trie: every walk remembered whole, in walk order.

    The part of the path at depth ``d`` was last used by the last remembered
    walk whose common prefix with ``seq`` is ≥ d (its time and owner); a walk's
    steps are (gap, depth[, owner]) along ``seq``, runs of the same gap (and
    owner) merged into their deepest depth. With a finite ``horizon``, a part
    idle for longer is as good as gone: the walk stops there and forgets what
    lay below it, and a prune (at the trie's moments: the first walk, then
    whenever more than half the horizon has passed) forgets every part idle
    longer than the horizon and everything below it."""

    def __init__(self, horizon: int = INF_US):
        self.horizon = int(horizon)
        self.walks: list[list] = []  # [symbols, t, owner]
        self._last_prune: int | None = None

    def _last_users(self, seq) -> list[tuple[int, int]]:
        """For each depth 1..k of ``seq`` that some walk reached: (walk index)."""
        out: list[int] = []
        for i in range(len(self.walks) - 1, -1, -1):
            k = _lcp(seq, self.walks[i][0])
            while len(out) < k:
                out.append(i)
        return out

    def walk(self, seq, t: int, insert=None, cum=None, known: int = 0, owner: int | None = None) -> list[tuple]:
        if self.horizon < INF_US and (self._last_prune is None or t - self._last_prune > self.horizon // 2):
            self.prune(t)
        seq = np.asarray(seq, dtype=np.int64)
        steps: list[tuple] = []
        for d, i in enumerate(self._last_users(seq), start=1):
            _, used, who = self.walks[i]
            gap = t - used
            if gap > self.horizon:  # idle past the horizon: forgotten from here down
                for w in self.walks:
                    if _lcp(seq, w[0]) >= d:
                        w[0] = w[0][:d - 1]
                break
            if steps and steps[-1][0] == gap and (owner is None or steps[-1][2] == who):
                steps[-1] = (gap, d) if owner is None else (gap, d, who)
            else:
                steps.append((gap, d) if owner is None else (gap, d, who))
        kept = np.asarray(insert, dtype=np.int64) if insert is not None and len(insert) > len(seq) else seq
        self.walks.append([kept, int(t), -1 if owner is None else int(owner)])
        if cum is not None:
            steps = [(s[0], int(cum[s[1]]), *s[2:]) for s in steps]
        return steps

    def prune(self, now: int) -> None:
        self._last_prune = now
        cutoff = now - self.horizon
        cuts = []
        for w in self.walks:
            users = self._last_users(w[0])
            cuts.append(next((d for d, i in enumerate(users) if self.walks[i][1] < cutoff), len(w[0])))
        for w, cut in zip(self.walks, cuts):
            w[0] = w[0][:cut]


def count_nodes(trie) -> int:
    """The nodes a trie holds, counted by visiting them (its root included)."""
    n, stack = 0, [trie.root]
    while stack:
        node = stack.pop()
        n += 1
        stack.extend(node.children.values())
    return n


def extend(tokens: dict, seg_ids: list, prev) -> tuple[np.ndarray, int]:
    """``SegmentStore.extend`` by its definition: the segments' tokens concatenated,
    and how many leading ones are ``prev``'s — all of prev's segments but its last
    when ``seg_ids`` repeats them and goes on (an agent's next turn), else the
    segments the two share from the start."""
    out = np.concatenate([np.empty(0, dtype=np.int32)] + [tokens[s] for s in seg_ids]).astype(np.int32)
    if prev is None:
        return out, 0
    psegs = prev[0]
    k = len(psegs) - 1
    if 0 < k < len(seg_ids) and list(seg_ids[:k]) == list(psegs[:k]):
        n = k
    else:
        n = _lcp(list(seg_ids), list(psegs)) if len(seg_ids) and len(psegs) else 0
    return out, sum(len(tokens[s]) for s in psegs[:n])


def split(steps, me: int, pairs: list[tuple[str, str | None]]) -> tuple[list, list, list]:
    """``Writers.split`` by docs/origin.md: a step written by the walking request's
    own session (a session id they share) is ``same_session``, by its tenant
    otherwise ``other_session``, else ``other_tenant``; steps of the same gap and
    origin merged. ``pairs[code]`` = (tenant, session) of writer ``code``."""
    tenant, session = pairs[me]
    gaps, depths, origins = [], [], []
    for g, d, w in steps:
        t_w, s_w = pairs[w]
        o = (SAME_SESSION if session is not None and s_w == session
             else OTHER_SESSION if t_w == tenant else OTHER_TENANT)
        if gaps and gaps[-1] == g and origins[-1] == o:
            depths[-1] = d
        else:
            gaps.append(g)
            depths.append(d)
            origins.append(o)
    return gaps, depths, origins


def depth_under(gaps, depths, ttl_us: int) -> int:
    """``L_τ``: the deepest step whose gap is within τ (0 when there is none)."""
    return max([int(d) for g, d in zip(gaps, depths) if g <= ttl_us], default=0)


def hit_counts(offsets, gaps, depths, group, n_groups: int, ttls_us, blocks, mins, origins=None):
    """``replay.core.hits.hit_counts`` request by request: ``L_τ`` floored to whole
    blocks, nothing below the minimum prefix; by origin, each step's part of the
    hit (``(depth[k−1], depth[k]]`` at or below it) to the step's origin."""
    shape = (n_groups, len(ttls_us), len(mins), len(blocks))
    hits, nhit = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    by_origin = np.zeros((*shape, 3), dtype=np.int64)
    for r in range(len(offsets) - 1):
        lo, hi = int(offsets[r]), int(offsets[r + 1])
        for ti, ttl in enumerate(ttls_us):
            L = depth_under(gaps[lo:hi], depths[lo:hi], int(ttl))
            for bi, b in enumerate(blocks):
                h = (L // int(b)) * int(b)
                for mi, m in enumerate(mins):
                    h_m = h if h >= m else 0
                    hits[group[r], ti, mi, bi] += h_m
                    nhit[group[r], ti, mi, bi] += h_m > 0
                    if origins is not None:
                        prev = 0
                        for k in range(lo, hi):
                            by_origin[group[r], ti, mi, bi, origins[k]] += max(0, min(int(depths[k]), h_m) - prev)
                            prev = int(depths[k])
    return (hits, nhit) if origins is None else (hits, nhit, by_origin)


def mlx_cache_hits(prompts, outputs, cache_size, cache_bytes=None, bpt=0):
    """mlx-lm's prompt cache (``replay.providers.mlx_cache.simulate_mlx``) by brute
    force: entries as a list of (key tuple, nbytes), oldest inserted first."""
    store: list[tuple[tuple, int]] = []
    hits = []
    for i, p in enumerate(prompts):
        p = tuple(int(x) for x in p)
        out = tuple(int(x) for x in outputs[i]) if outputs is not None and outputs[i] is not None else ()
        # lookup
        hit, src = 0, None
        exact = [e for e in store if e[0] == p]
        if exact:
            hit, src = len(p), exact[0]
        else:
            def common(a, b):
                k = 0
                while k < len(a) and k < len(b) and a[k] == b[k]:
                    k += 1
                return k
            best = max((common(e[0], p) for e in store), default=0)
            if best > 0:
                prefix_entries = [e for e in store if len(e[0]) == best and p[:best] == e[0]]
                if prefix_entries:
                    hit, src = best, prefix_entries[0]
                else:
                    ext = [e for e in store if common(e[0], p) == best]
                    src = sorted(ext, key=lambda e: len(e[0]))[0]
                    hit = min(len(p) - 1, best)
        hits.append(hit)
        if cache_bytes is not None:
            active = src[1] if src is not None else 0
            while store and sum(e[1] for e in store) > max(0, cache_bytes - active):
                store.pop(0)
        # insert
        key = p + out
        nbytes = bpt * len(key)
        store = [e for e in store if not (len(e[0]) <= len(key) and key[:len(e[0])] == e[0])]
        store.append((key, nbytes))
        if cache_size is not None and len(store) > cache_size:
            store.pop(0)
    return hits
