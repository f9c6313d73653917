"""Warm-up: measure on the last part of the log, with caches filled by the first.

Peers often report a *warm* hit ratio: the first requests of a log find every
cache empty, so they measure only the requests after a warm-up share of the
log. ``--warmup f`` does the same here: the replay still sees every request
(the caches are warm), but the figures (requests, prompt tokens, hit tokens,
requests hit) count only the *measured* requests — the last ``1 − f`` of the
replayed requests in processing order (by time, ties in input order: the
first ``floor(f · n)`` are the warm-up). ``f = 0`` (the default) measures the
whole log, first requests included (semantics.md, "Figures").

``f`` is read through its decimal digits (``0.3`` is 3/10, not the float just
under it), so ``floor(f · n)`` is exact.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def parse_warmup(value) -> float:
    """A warm-up share in [0, 1): a number, or a string such as ``0.5`` or ``50%``."""
    text = str(value).strip()
    try:
        f = Fraction(text[:-1]) / 100 if text.endswith("%") else Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"warm-up {value!r} is not a number: give a share of the log in [0, 1), e.g. 0.5") from None
    if not 0 <= f < 1:
        raise ValueError(f"warm-up {value!r} is outside [0, 1): it is the share of the log not measured")
    return float(f)


def warmup_count(n: int, fraction: float) -> int:
    """How many of ``n`` requests (in processing order) are the warm-up: floor(f · n)."""
    if not fraction:
        return 0
    return int(Fraction(repr(float(fraction))) * n)


def measured_mask(ts_us, request_id, fraction: float) -> np.ndarray:
    """Which requests are measured: all but the first ``floor(f · n)`` by
    (time, request id) — the processing order — as a bool array beside the inputs."""
    ts = np.asarray(ts_us, dtype=np.int64)
    rid = np.asarray(request_id, dtype=np.int64)
    keep = np.ones(len(ts), dtype=bool)
    k = warmup_count(len(ts), fraction)
    if k:
        keep[np.lexsort((rid, ts))[:k]] = False
    return keep


def describe(fraction: float) -> str:
    """How the figures were measured, for reports and tables."""
    if not fraction:
        return "the whole log (no warm-up: the first requests, which find every cache empty, are counted)"
    return (f"the last {100 * (1 - fraction):g} % of the requests by time (warm-up {fraction:g}: the first "
            f"{100 * fraction:g} % fill the caches but are not counted)")


def measured_walks(w, fraction: float):
    """``w`` (``replay.core.walks.Walks``) restricted to each mode's measured
    requests; ``w`` itself when nothing is left out."""
    if not fraction or not len(w):
        return w
    keep = np.zeros(len(w), dtype=bool)
    for k in np.unique(w.mode):
        rows = np.flatnonzero(w.mode == k)
        keep[rows] = measured_mask(w.ts_us[rows], w.request_id[rows], fraction)
    return subset_walks(w, keep)


def subset_walks(w, keep: np.ndarray):
    """The walks of the requests where ``keep`` is true (their steps with them)."""
    from dataclasses import replace

    lengths = np.diff(w.offsets)
    step_keep = np.repeat(keep, lengths)
    offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(lengths[keep], out=offsets[1:])
    pick = (lambda a: None if a is None else a[keep])
    return replace(w, mode=w.mode[keep], request_id=w.request_id[keep], ts_us=w.ts_us[keep],
                   stream=pick(w.stream), model=pick(w.model), prompt_tokens=w.prompt_tokens[keep],
                   offsets=offsets, gaps=w.gaps[step_keep], depths=w.depths[step_keep],
                   origins=None if w.origins is None else w.origins[step_keep])
