"""Compute and money for a capacity row: prefill GPU-hours per week without a cache
and with it, the GPUs the log's busiest hour needs, and dollars.

Per request (``replay.providers.prefill_cost``): without a cache the whole prompt
is prefilled; with it the hit is cached — the first tier's part in GPU memory,
a lower tier's part loaded at that tier's bandwidth — and the rest prefilled
after it. Sums over the measured requests, scaled from the log's span to a week
(``× 7 days / span``); the busiest hour is the clock hour (from the first
request) holding the most GPU-seconds, and it needs ⌈GPU-seconds / 3600 /
target utilisation⌉ GPUs (a log shorter than an hour is that hour). Dollars:
``prefill_dollars_week`` = prefill GPU-hours × price (what prefill consumes),
``fleet_dollars_week`` = GPUs at the busiest hour × 168 h × price (a fleet
sized for it, for prefill alone; decode is not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replay.providers.gpus import Gpu, tier_bandwidth
from replay.providers.prefill_cost import ModelCompute, load_seconds, prefill_seconds

WEEK_S = 7 * 24 * 3600
HOUR_US = 3600 * 10**6
#: the keys a row gains with a cost model (``replay capacity --gpu … --json``)
COST_KEYS = ["gpu", "prefill_gpu_hours_week_uncached", "prefill_gpu_hours_week", "load_gpu_hours_week",
             "gpu_hours_saved_week", "gpus_peak_hour_uncached", "gpus_peak_hour", "prefill_dollars_week_uncached",
             "prefill_dollars_week", "fleet_dollars_week_uncached", "fleet_dollars_week"]


@dataclass(frozen=True)
class CostModel:
    """A model's cost figures on a GPU: ``utilisation`` the share of peak FLOP/s
    prefill reaches (MFU), ``target`` the busy share a GPU is sized to at the
    busiest hour, ``price`` dollars per GPU-hour (None: no dollars)."""
    model: ModelCompute
    gpu: Gpu
    utilisation: float = 0.5
    target: float = 0.7
    price: float | None = None

    def __post_init__(self):
        if not 0 < self.utilisation <= 1 or not 0 < self.target <= 1:
            raise ValueError("--mfu and --target-utilisation must be in (0, 1]")
        if self.price is not None and self.price < 0:
            raise ValueError("--gpu-price must be ≥ 0")

    def bandwidths(self, tiers) -> list[float]:
        """Bytes/s each tier's hits load at (the first: free)."""
        return [tier_bandwidth(t.name, t.bandwidth, self.gpu, i == 0) for i, t in enumerate(tiers)]


def cost_figures(cost: CostModel, prompt_tokens: np.ndarray, ts_us: np.ndarray, measured: np.ndarray,
                 tier_tokens: np.ndarray, bandwidths: list[float]) -> dict:
    """The :data:`COST_KEYS` of one row: ``tier_tokens`` [tier, request] the hit
    tokens each tier serves (a single row without tiers: the GPU's own)."""
    p = prompt_tokens[measured].astype(np.float64)
    tiers = tier_tokens[:, measured].astype(np.float64)
    ts = ts_us[measured]
    hit = tiers.sum(axis=0)
    cold = prefill_seconds(cost.model, cost.gpu, p, np.zeros_like(p), cost.utilisation)
    warm = prefill_seconds(cost.model, cost.gpu, p - hit, hit, cost.utilisation)
    load = sum((load_seconds(cost.model, tiers[j], bw) for j, bw in enumerate(bandwidths)), np.zeros_like(p))
    span_s = (int(ts.max()) - int(ts.min())) / 1e6 if len(ts) else 0.0
    week = WEEK_S / span_s if span_s > 0 else None  # (a log without a span has no weekly rate)

    def per_week(seconds: np.ndarray):
        return None if week is None else float(seconds.sum()) / 3600 * week

    def peak_gpus(seconds: np.ndarray) -> int:
        if not len(ts):
            return 0
        hours = (ts - ts.min()) // HOUR_US
        busiest = np.bincount(hours, weights=seconds).max()
        return math.ceil(busiest / 3600 / cost.target - 1e-9)

    out = {"gpu": cost.gpu.key, "prefill_gpu_hours_week_uncached": per_week(cold),
           "prefill_gpu_hours_week": per_week(warm + load), "load_gpu_hours_week": per_week(load),
           "gpus_peak_hour_uncached": peak_gpus(cold), "gpus_peak_hour": peak_gpus(warm + load)}
    out["gpu_hours_saved_week"] = (None if week is None else
                                   out["prefill_gpu_hours_week_uncached"] - out["prefill_gpu_hours_week"])
    price = cost.price
    for suffix in ("_uncached", ""):
        hours = out["prefill_gpu_hours_week" + suffix]
        out["prefill_dollars_week" + suffix] = None if price is None or hours is None else hours * price
        out["fleet_dollars_week" + suffix] = None if price is None else out["gpus_peak_hour" + suffix] * 168 * price
    return {k: out[k] for k in COST_KEYS}
