"""The prefill-time model `replay validate` fits to the measured request times.

``t ≈ a + b·uncached + c·attention``, where attention is the query·key pairs
computed for the uncached tokens, ``Σ_{i=hit}^{n-1} (i+1)`` (causal). It is
fitted by least squares on half of the observations and checked on the other
half (see :mod:`replay.validate.summary`); the coefficients belong to the model
and machine they were measured on.
"""

from __future__ import annotations

import numpy as np


def attention_work(n: int, hit: int) -> float:
    """Query·key pairs computed for positions hit..n-1 (causal): Σ (i+1)."""
    return (n * (n + 1) - hit * (hit + 1)) / 2.0


def fit_time_model(n: np.ndarray, hit: np.ndarray, t: np.ndarray) -> dict:
    """Least squares on *relative* residuals (rows divided by the measured
    time): the check is a relative error, and cold requests would otherwise
    dominate the fit by their size."""
    n = np.asarray(n, dtype=float)
    hit = np.asarray(hit, dtype=float)
    t = np.asarray(t, dtype=float)
    X = np.column_stack([np.ones(len(n)), n - hit, (n * (n + 1) - hit * (hit + 1)) / 2.0])
    w = 1.0 / np.maximum(t, 1e-9)
    coef, *_ = np.linalg.lstsq(X * w[:, None], t * w, rcond=None)
    return {"a": float(coef[0]), "b": float(coef[1]), "c": float(coef[2])}


def predict_time(fit: dict, n, hit) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    hit = np.asarray(hit, dtype=float)
    return fit["a"] + fit["b"] * (n - hit) + fit["c"] * (n * (n + 1) - hit * (hit + 1)) / 2.0
