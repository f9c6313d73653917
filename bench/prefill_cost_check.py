"""The prefill cost model (replay/providers/prefill_cost.py) against prefill times
measured on the real mlx-lm engine by `replay validate`: nothing is fitted.

    replay validate data/sample --db /tmp/v.duckdb --json > /tmp/validate.json
    python bench/prefill_cost_check.py /tmp/validate.json

The device's figures are measured here as a datasheet would state them, never
from the prefill times: peak dense FLOP/s of a large matrix product in the
model's dtype (MLX, the device mlx-lm runs on) and memory bandwidth of a large
copy. Each request's predicted time is the cost model's GPU-seconds for its
uncached tokens after the tokens the server reported cached, at utilisation 1
of that measured peak; the measured time is the request's wall time on the
server with max_tokens=1 (prefill, one decoded token, HTTP). Printed: the
median and 90th-percentile relative error, warm and cold passes apart, and the
fitted engine-specific time model's held-out error for comparison.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from replay.providers.gpus import Gpu
from replay.providers.prefill_cost import compute_for, prefill_seconds


def measured_device(dtype: str = "float32") -> Gpu:
    import mlx.core as mx

    n = 2048
    a = mx.random.normal((n, n)).astype(getattr(mx, dtype))
    b = mx.random.normal((n, n)).astype(getattr(mx, dtype))
    mx.eval(a, b)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - t)
    flops = 2 * n**3 / best
    x = np.ones(64 * 2**20, dtype=np.float64)  # 512 MiB
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        y = x.copy()
        best = min(best, time.perf_counter() - t)
    del y
    bandwidth = 2 * x.nbytes / best  # read and write
    return Gpu("this-cpu", "this machine's CPU (measured)", flops, bandwidth, bandwidth, "measured")


def main(path: str) -> None:
    res = json.loads(Path(path).read_text())
    model = compute_for(model_config=res["model"])
    device = measured_device()
    print(f"model {Path(res['model']).name}: {model.dense_flops_per_token / 1e6:.2f} MFLOP/token dense, "
          f"{model.attention_flops_per_pair:.0f} FLOP/pair, {model.weight_bytes / 1e6:.1f} MB of weights")
    print(f"device: {device.flops / 1e9:.1f} GFLOP/s (float32 matmul), {device.hbm_bytes_s / 1e9:.1f} GB/s (copy)")
    for label, t_key, c_key in (("warm", "time_s", "cached_reported"), ("cold", "cold_time_s", "cold_cached_reported")):
        rows = [q for q in res["per_request"] if q.get(t_key)]
        if not rows:
            continue
        n = np.array([q["n_tokens"] for q in rows], dtype=float)
        k = np.array([q[c_key] or 0 for q in rows], dtype=float)
        t = np.array([q[t_key] for q in rows])
        print(f"{label}: {len(rows)} requests, {int(n.sum())} prompt tokens, {int(k.sum())} cached, "
              f"measured {t.sum():.2f} s")
        for u in (1.0, 0.5):  # (0.5: replay capacity's default --mfu)
            pred = prefill_seconds(model, device, n - k, k, u)
            rel = (pred - t) / t
            print(f"  utilisation {u}: median |error| {100 * np.median(np.abs(rel)):.0f} %, "
                  f"p90 {100 * np.quantile(np.abs(rel), 0.9):.0f} %, median predicted/measured "
                  f"{np.median(pred / t):.2f}; total predicted {pred.sum():.2f} s")
    if res.get("time_median_abs_err") is not None:
        print(f"fitted engine time model (replay validate, held out): median |error| "
              f"{100 * res['time_median_abs_err']:.0f} %")


if __name__ == "__main__":
    main(sys.argv[1])
