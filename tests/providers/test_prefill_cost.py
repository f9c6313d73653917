"""The prefill cost model's arithmetic by hand: FLOPs of known models, bytes of a
known KV shape over a known link, the GPU table, and a row's weekly figures."""

import math

import numpy as np
import pytest

from replay.analysis.buy import COST_KEYS, CostModel, cost_figures
from replay.core.tiers import TierSpec
from replay.providers import gpus
from replay.providers.prefill_cost import CONFIGS, compute_for, load_seconds, model_compute, prefill_seconds

US = 1_000_000


def test_llama_8b_flops_by_hand_and_its_published_size():
    m = compute_for("meta-llama/Llama-3.1-8B-Instruct")
    h, kv, i, layers = 4096, 8 * 128, 14336, 32
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * i  # q, k and v (8 KV heads), o, gated MLP
    assert m.dense_flops_per_token == 2 * layers * per_layer
    # with the (untied) input and output embeddings, the model card's 8.03B parameters
    assert layers * per_layer + 2 * 128256 * h == pytest.approx(8.03e9, rel=2e-3)
    assert m.attention_flops_per_pair == 2 * 32 * (128 + 128) * layers  # Q·Kᵀ and A·V, 32 heads
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 heads, 128 dims, bf16
    assert m.weight_bytes == 2 * layers * per_layer


def test_deepseek_v3_active_and_total_parameters_match_its_card():
    m = compute_for("deepseek-v3")
    embeddings = 2 * 129280 * 7168
    assert m.dense_flops_per_token / 2 + embeddings == pytest.approx(37e9, rel=0.02)   # "37B activated"
    assert m.weight_bytes / 2 + embeddings == pytest.approx(671e9, rel=0.002)          # "671B total"
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 2                                  # MLA latent, bf16


def test_prefill_time_by_hand_compute_bound_memory_bound_and_nothing_new():
    m = compute_for("llama-3.1-8b")
    h100 = gpus.get_gpu("h100")
    dense, pair = m.dense_flops_per_token, m.attention_flops_per_pair
    # 1,000 new tokens after 3,000 cached: 1000·3000 + 1000·1001/2 query·key pairs
    pairs = 1000 * 3000 + 1000 * 1001 // 2
    want = (1000 * dense + pairs * pair) / (989.4e12 * 0.5)
    got = prefill_seconds(m, h100, [1000], [3000], 0.5)
    assert got[0] == pytest.approx(want, rel=1e-12)
    assert want > (m.weight_bytes + 4000 * m.kv_bytes_per_token) / 3350e9  # (it is compute-bound)
    # one new token: the weights' read at 3.35 TB/s outweighs its FLOPs
    one = prefill_seconds(m, h100, [1], [0], 0.5)[0]
    assert one == pytest.approx((m.weight_bytes + m.kv_bytes_per_token) / 3350e9, rel=1e-12)
    assert prefill_seconds(m, h100, [0], [5000], 0.5)[0] == 0.0  # fully cached: nothing to prefill
    with pytest.raises(ValueError):
        prefill_seconds(m, h100, [1], [0], 0)


def test_kv_bytes_over_a_known_link():
    m = compute_for("llama-3.1-8b")  # 131,072 bytes a token
    h100 = gpus.get_gpu("h100")
    dram = gpus.tier_bandwidth("dram", None, h100, first=False)
    assert dram == 64e9  # PCIe Gen5 x16, one direction
    assert load_seconds(m, [10_000], dram)[0] == pytest.approx(10_000 * 131072 / 64e9, rel=1e-12)  # 20.48 ms
    assert gpus.tier_bandwidth("ssd", None, h100, first=False) == 7e9
    assert gpus.tier_bandwidth("anything", "25GB/s", h100, first=False) == 25e9
    assert gpus.tier_bandwidth("x", "1GiB/s", h100, first=False) == 2**30
    assert gpus.tier_bandwidth("hbm", None, h100, first=True) == math.inf
    assert load_seconds(m, [10_000], math.inf)[0] == 0.0
    with pytest.raises(ValueError):
        gpus.tier_bandwidth("mystery", None, h100, first=False)


def test_the_gpu_table_has_every_asked_gpu_with_a_source_and_figures_can_be_given():
    for key in ("h100", "h200", "b200", "a100", "l40s", "mi300x", "m2-ultra", "m4-max"):
        g = gpus.get_gpu(key.upper())
        assert g.flops > 0 and g.hbm_bytes_s > 0 and g.host_bytes_s > 0, key
        assert any(w in g.source.lower() for w in ("datasheet", "data sheet", "apple")), key
    assert gpus.get_gpu("h100").flops == 989.4e12 and gpus.get_gpu("mi300x").hbm_bytes_s == 5300e9
    assert gpus.get_gpu(None) is None
    custom = gpus.get_gpu(None, 100, 200, 10)
    assert (custom.flops, custom.hbm_bytes_s, custom.host_bytes_s) == (100e12, 200e9, 10e9)
    assert gpus.get_gpu("h100", tflops=500).flops == 500e12
    for bad in (lambda: gpus.get_gpu("h900"), lambda: gpus.get_gpu(None, 100), lambda: gpus.get_gpu(None, -1, 1, 1)):
        with pytest.raises(ValueError):
            bad()


def test_a_rows_weekly_figures_by_hand():
    """Three requests over two hours of a two-hour log, one tier in GPU memory and one
    in DRAM. Made-up model figures so every number is a round one."""
    m = model_compute(CONFIGS["llama-3.1-8b"], 1000)
    m = type(m)("toy", 1e9, 0.0, 0.0, 1000)  # 1 GFLOP a token, no attention, no weights, 1 kB KV a token
    gpu = gpus.Gpu("toy", "toy", 1e12, 1e15, 1e9)  # 1 TFLOP/s; DRAM at 1 GB/s
    cost = CostModel(m, gpu, utilisation=0.5, target=0.5, price=2.0)
    prompt = np.array([1000, 2000, 4000])
    ts = np.array([0, 30 * 60 * US, 2 * 3600 * US])  # span: two hours
    tiers = np.array([[0, 1000, 0], [0, 0, 2000]])  # hbm serves 1,000 of request 1, DRAM 2,000 of request 2
    bw = cost.bandwidths([TierSpec("hbm", "1"), TierSpec("dram", "1")])
    f = cost_figures(cost, prompt, ts, np.ones(3, bool), tiers, bw)
    assert list(f) == COST_KEYS
    week = 7 * 24 / 2
    # uncached: 1, 2 and 4 s (tokens × 1 GFLOP / 0.5 TFLOP/s)... × 2 = 2, 4, 8 s
    assert f["prefill_gpu_hours_week_uncached"] == pytest.approx(14 / 3600 * week)
    # cached: 2 s; 1,000 new = 2 s; 2,000 new = 4 s + 2,000 kB at 1 GB/s = 2 ms
    assert f["load_gpu_hours_week"] == pytest.approx(0.002 / 3600 * week)
    assert f["prefill_gpu_hours_week"] == pytest.approx(8.002 / 3600 * week)
    assert f["gpu_hours_saved_week"] == pytest.approx(5.998 / 3600 * week)
    # busiest hour: hour 0 (2 + 4 s uncached; 2 + 2 s cached) or hour 2 (8 s; 4.002 s): ⌈s / 3600 / 0.5⌉ = 1
    assert f["gpus_peak_hour_uncached"] == f["gpus_peak_hour"] == 1
    assert f["prefill_dollars_week"] == pytest.approx(8.002 / 3600 * week * 2.0)
    assert f["fleet_dollars_week"] == 1 * 168 * 2.0
    # the busiest hour needing more than one GPU: scale the work 1,000 times
    big = cost_figures(cost, prompt * 1000, ts, np.ones(3, bool), tiers * 1000, bw)
    assert big["gpus_peak_hour_uncached"] == math.ceil(8000 / 3600 / 0.5)  # hour 2: 8,000 s
    assert big["gpus_peak_hour"] == math.ceil(4002 / 3600 / 0.5)  # hour 2: 4,000 s + 2 s of loads (hour 0: 4,000)
