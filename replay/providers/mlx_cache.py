"""The ``mlx-lm`` profile: a simulator of mlx-lm's server prompt cache.

Read from the installed mlx-lm (0.32.2) source, ``mlx_lm/models/cache.py``
(``PromptTrie``, ``LRUPromptCache``) and ``mlx_lm/server.py``
(``ResponseGenerator._generate``), and confirmed against the running server by
``replay validate`` and ``tests/validate/test_validate.py``:

* **Lookup** (``LRUPromptCache.fetch_nearest_cache`` / ``PromptTrie.search``):
  token level, no blocks. If a stored entry equals the prompt exactly, all of
  it is reused. Otherwise the reuse is the longest common token prefix with any
  stored entry, capped at ``len(prompt) - 1`` (a longer entry is trimmed to
  ``min(len - 1, common_prefix)``; an entry that is a strict prefix of the
  prompt is reused whole, which never exceeds that cap).
* **Insert** (``insert_cache``, called when a request finishes): one entry per
  request keyed on ``prompt + generated tokens`` (``BatchGenerator`` keeps the
  tokens fed back; with ``max_tokens=1`` the key is the prompt plus the one
  sampled token). A key
  already present is replaced and becomes newest; every entry whose key is a
  strict prefix of the new key is dropped (``pop_prefixes``).
* **Count cap** ``--prompt-cache-size`` (default 10): after an insert, if more
  than K entries remain the oldest-*inserted* one goes (``CacheOrder.pop``; a
  hit never refreshes an entry). All entries here are of type ``assistant``:
  the ``system``/``user`` segment entries of chat requests are avoided by the
  way :mod:`replay.validate` sends requests (see :mod:`replay.validate.mlx_model`).
* **Byte cap** ``--prompt-cache-bytes``: enforced only when a request arrives,
  *after* its lookup (``prompt_cache.trim_to(n_bytes=total - active)``), where
  ``active`` is the size of the KV cache the request just copied out of the
  store (its source entry, whole — trimming only moves an offset). Oldest
  entries are evicted until the stored bytes fit. An entry's size is
  ``bytes_per_token × len(key)``: ``BatchGenerator._step`` feeds each sampled
  token back through the model before returning it, so the KV cache holds
  exactly the key's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from replay.core.trie import common_prefix_len


lcp = common_prefix_len  # longest common prefix of two token arrays


@dataclass
class _Entry:
    key: np.ndarray
    nbytes: int


class MlxPromptCache:
    """State of mlx-lm's ``LRUPromptCache`` reduced to what decides reuse:
    the stored keys in insertion order and their sizes."""

    def __init__(self, cache_size: int | None = 10, cache_bytes: int | None = None,
                 bytes_per_token: int = 0):
        self.cache_size = cache_size
        self.cache_bytes = cache_bytes
        self.bytes_per_token = bytes_per_token
        self.entries: list[_Entry] = []  # oldest inserted first
        self.evictions = 0  # entries dropped by a cap (not by the prefix rule)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def lookup(self, prompt: np.ndarray) -> tuple[int, _Entry | None]:
        """(reused tokens, source entry) for ``prompt``; nothing is changed."""
        n = len(prompt)
        best = 0
        for e in self.entries:
            if len(e.key) == n and lcp(e.key, prompt) == n:
                return n, e
        # longest common prefix, and the entries realising it
        lens = [lcp(e.key, prompt) for e in self.entries]
        best = max(lens, default=0)
        if best == 0:
            return 0, None
        # an entry that is exactly prompt[:best] is the trie's `shorter`
        cands = [e for e, L in zip(self.entries, lens) if L == best]
        for e in cands:
            if len(e.key) == best:
                return best, e
        src = min(cands, key=lambda e: len(e.key))
        return min(n - 1, best), src

    def arrive(self, prompt: np.ndarray) -> int:
        """A request arrives: look up, then apply the byte cap. Returns reuse."""
        hit, src = self.lookup(prompt)
        if self.cache_bytes is not None:
            active = src.nbytes if src is not None else 0
            limit = max(0, self.cache_bytes - active)
            while self.entries and self.nbytes > limit:
                self.entries.pop(0)
                self.evictions += 1
        return hit

    def finish(self, prompt: np.ndarray, output: np.ndarray | None) -> None:
        """A request finished: insert ``prompt + output``."""
        out = output if output is not None else np.zeros(0, dtype=prompt.dtype)
        key = np.concatenate([np.asarray(prompt), np.asarray(out, dtype=prompt.dtype)])
        new = _Entry(key, self.bytes_per_token * len(key))
        kept = []
        for e in self.entries:
            if len(e.key) <= len(key) and lcp(e.key, key) == len(e.key):
                continue  # the same key (replaced) or a strict prefix (popped)
            kept.append(e)
        kept.append(new)
        self.entries = kept
        if self.cache_size is not None and len(self.entries) > self.cache_size:
            self.entries.pop(0)
            self.evictions += 1


def simulate_mlx(prompts: Sequence[np.ndarray], outputs: Sequence[np.ndarray] | None = None,
                 cache_size: int | None = 10, cache_bytes: int | None = None,
                 bytes_per_token: int = 0, stats: dict | None = None) -> list[int]:
    """Predicted cached tokens per request, in order, under mlx-lm's server cache.

    ``outputs[i]`` are the tokens generated for request ``i`` (the key of its
    entry is ``prompts[i] + outputs[i]``); ``None`` (or a ``None`` item) keys on
    the prompt alone. Requests are served one at a time in the given order.
    ``cache_size=None`` means no count cap; ``cache_bytes`` needs
    ``bytes_per_token`` (see :func:`replay.validate.mlx_model.kv_bytes_per_token`).
    ``stats``, if given, receives ``evictions`` (entries dropped by a cap).
    """
    if cache_bytes is not None and bytes_per_token <= 0:
        raise ValueError("cache_bytes needs bytes_per_token > 0")
    cache = MlxPromptCache(cache_size, cache_bytes, bytes_per_token)
    hits: list[int] = []
    for i, p in enumerate(prompts):
        p = np.asarray(p)
        hits.append(cache.arrive(p))
        cache.finish(p, None if outputs is None else outputs[i])
    if stats is not None:
        stats["evictions"] = cache.evictions
        stats["entries"] = len(cache.entries)
    return hits


def ideal_lcp(prompts: Sequence[np.ndarray]) -> list[int]:
    """The ``ideal`` ceiling for the same order: longest common prefix with any
    earlier prompt (infinite cache, no TTL, token level, no cap)."""
    out = []
    seen: list[np.ndarray] = []
    for p in prompts:
        p = np.asarray(p)
        out.append(max((lcp(p, q) for q in seen), default=0))
        seen.append(p)
    return out
