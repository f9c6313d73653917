"""Memory tiers: what GPU memory, host DRAM and a shared store each serve (semantics.md, "Capacity").

Tiers are listed fastest first. A replica's own tiers of C_1, …, C_k blocks
form one LRU hierarchy on that replica's stack (a block evicted from one tier
moves down to the next, a hit moves it back to the top), so tiers 1..j hold
the replica's S_j = C_1 + … + C_j most recently used blocks and tier j serves
depth(S_j) − depth(S_{j−1}) of a request's hit. A pooled tier after them is one
LRU of P blocks over every request of every replica: its depth comes from the
stack of the whole log (one replica), and it serves what it reaches beyond the
replica's own tiers, max(0, depth_pool(P) − depth(S_k)).

Both depths come from the one-pass kernel (``replay.core.capacity``): each is a
capacity on a stack the pass already records, so tiers cost a few more
per-request lookups, never another pass per tier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from replay.core.capacity import Segments, hit_blocks


@dataclass(frozen=True)
class TierSpec:
    """One tier as written: its name, its size (a block count or a size with a unit,
    per replica unless ``pooled``), and the bandwidth its hits load at (as
    written, e.g. ``25GB/s``; None: the default for its name)."""
    name: str
    size: str
    pooled: bool = False
    bandwidth: str | None = None


_BANDWIDTH = re.compile(r"\d+(?:\.\d+)?\s*[kmgt]?i?b/s", re.IGNORECASE)


def parse_tiers(text: str) -> tuple[TierSpec, ...]:
    """``NAME:SIZE[:pooled][:BANDWIDTH],…`` fastest first, e.g.
    ``hbm:40GiB,dram:256GiB,store:4TiB:pooled:25GB/s``. The first tier is a
    replica's own (its GPU memory); a pooled tier, at most one, comes last."""
    tiers = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        fields = [f.strip() for f in part.split(":")]
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise ValueError(f"bad tier {part!r}: NAME:SIZE[:pooled][:BANDWIDTH], e.g. dram:256GiB")
        pooled, bandwidth = False, None
        for extra in fields[2:]:
            if extra.lower() == "pooled" and not pooled:
                pooled = True
            elif _BANDWIDTH.fullmatch(extra) and bandwidth is None:
                bandwidth = extra
            else:
                raise ValueError(f"bad tier {part!r}: after the size only 'pooled' and a bandwidth "
                                 "such as 25GB/s")
        tiers.append(TierSpec(fields[0], fields[1], pooled, bandwidth))
    check_tiers(tiers)
    return tuple(tiers)


def check_tiers(tiers) -> None:
    if not tiers:
        raise ValueError("a tier list needs at least one tier")
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ValueError(f"tier names must differ: {', '.join(names)}")
    if tiers[0].pooled:
        raise ValueError("the first tier is a replica's own memory (its GPUs'); a pooled tier comes after it")
    if any(t.pooled for t in tiers[:-1]):
        raise ValueError("a pooled tier comes last (and there is at most one)")


def format_tiers(tiers) -> str:
    """The tiers as written on the command line."""
    return ",".join(":".join([t.name, t.size] + (["pooled"] if t.pooled else []) +
                             ([t.bandwidth] if t.bandwidth else [])) for t in tiers)


def tier_depths(replica: Segments, pool: Segments | None, ttl_us: int, sizes: list[int],
                pooled_size: int | None = None) -> np.ndarray:
    """Blocks each tier serves of each request's hit, int64 [tier, request]:
    ``sizes`` the replica tiers' blocks (per replica, fastest first) on the
    ``replica`` segments; ``pooled_size`` the pooled tier's blocks on ``pool``,
    the segments of the same requests on one stack (one replica). A request's
    hit in blocks is the column's sum."""
    n = len(replica)
    out = np.zeros((len(sizes) + (pooled_size is not None), n), dtype=np.int64)
    reached = np.zeros(n, dtype=np.int64)
    total = 0
    for j, c in enumerate(sizes):
        total += int(c)
        depth = hit_blocks(replica, ttl_us, total)
        out[j] = depth - reached  # (depths never fall as the capacity grows: inclusion)
        reached = depth
    if pooled_size is not None:
        if pool is None or len(pool) != n:
            raise ValueError("a pooled tier needs the same requests' segments on one stack")
        out[-1] = np.maximum(0, hit_blocks(pool, ttl_us, int(pooled_size)) - reached)
    return out
