"""What a prefill costs: GPU-seconds to compute ``n`` new tokens after ``k`` cached
ones, plus the seconds to load the cached part from a slower tier.

From the model's shape (a Hugging Face ``config.json``, or :data:`CONFIGS`):

* dense FLOPs: 2 per weight of every linear layer a token passes through
  (attention projections and the MLP, the routed experts a token uses for MoE),
  per new token; the embedding is a gather and prefill needs the logits of the
  last token only, so neither counts;
* attention FLOPs: each new token at position p attends to p + 1 keys (causal),
  2·H·(d_qk + d_v) FLOPs per query·key pair and layer (Q·Kᵀ and A·V), so
  n new tokens after k cached cost ``pairs = n·k + n(n+1)/2`` pairs (the same
  count as ``replay.validate.timing.attention_work``).

Time on one GPU (``--gpu``): ``max(FLOPs / (peak · utilisation), bytes / HBM
bandwidth)`` — compute-bound unless the weights (read once per request: one
request per forward pass, an upper bound for batched serving) and the KV read
and written outweigh it — zero when nothing is new. A hit from a lower tier
adds ``tokens · KV bytes per token / the tier's bandwidth`` (no overlap with
compute assumed: engines overlap part of it, so this is the conservative end).
GPU-seconds do not depend on the tensor-parallel degree in this model (the
work splits evenly over the GPUs of a replica).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replay.providers.gpus import Gpu
from replay.providers.kv import MODELS, from_config, model_shape

#: Shapes of common open models, read from each model's config.json on Hugging Face (2026-12).
def _dense(vocab: int, layers: int, hidden: int, mlp: int, heads: int, kv_heads: int, head_dim: int) -> dict:
    return dict(vocab_size=vocab, num_hidden_layers=layers, hidden_size=hidden, intermediate_size=mlp,
                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)


CONFIGS: dict[str, dict] = {
    "llama-3.1-8b": _dense(128256, 32, 4096, 14336, 32, 8, 128),
    "llama-3.1-70b": _dense(128256, 80, 8192, 28672, 64, 8, 128),
    "llama-3.3-70b": _dense(128256, 80, 8192, 28672, 64, 8, 128),
    "qwen2.5-7b": _dense(152064, 28, 3584, 18944, 28, 4, 128),
    "qwen2.5-72b": _dense(152064, 80, 8192, 29568, 64, 8, 128),
    "qwen3-8b": _dense(151936, 36, 4096, 12288, 32, 8, 128),
    "qwen3-32b": _dense(151936, 64, 5120, 25600, 64, 8, 128),
    "mistral-7b": _dense(32768, 32, 4096, 14336, 32, 8, 128),
    "deepseek-v3": dict(vocab_size=129280, num_hidden_layers=61, hidden_size=7168, intermediate_size=18432,
                        num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, num_experts_per_tok=8,
                        n_shared_experts=1, moe_intermediate_size=2048, first_k_dense_replace=3),
}
CONFIGS["deepseek-r1"] = CONFIGS["deepseek-v3"]


@dataclass(frozen=True)
class ModelCompute:
    """What a token costs: dense FLOPs per new token, attention FLOPs per
    query·key pair (all layers), bytes of weights read per forward pass, and
    KV bytes per token."""
    name: str
    dense_flops_per_token: float
    attention_flops_per_pair: float
    weight_bytes: float
    kv_bytes_per_token: int
    embedding_bytes: float = 0.0  # (input and output embeddings: memory, not prefill FLOPs)


def _linear_weights(cfg: dict) -> tuple[float, float]:
    """(weights a token passes through, all weights) of the linear layers, per model."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    if cfg.get("kv_lora_rank"):  # MLA: low-rank query and key-value projections
        nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        q_rank, kv_rank = cfg.get("q_lora_rank") or 0, cfg["kv_lora_rank"]
        q = h * q_rank + q_rank * heads * (nope + rope) if q_rank else h * heads * (nope + rope)
        attn = q + h * (kv_rank + rope) + kv_rank * heads * (nope + v) + heads * v * h
    else:
        d = cfg.get("head_dim") or h // heads
        kv = cfg.get("num_key_value_heads") or heads
        attn = h * heads * d + 2 * h * kv * d + heads * d * h
    dense_mlp = 3 * h * cfg["intermediate_size"]  # gated MLP: gate, up, down
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or 0
    if not experts:
        return layers * (attn + dense_mlp), layers * (attn + dense_mlp)
    expert = 3 * h * (cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    dense_layers = min(layers, cfg.get("first_k_dense_replace", 0))
    moe_layers = layers - dense_layers
    shared = cfg.get("n_shared_experts") or 0
    active = cfg["num_experts_per_tok"] + shared
    base = layers * attn + dense_layers * dense_mlp + moe_layers * h * experts  # (+ the router)
    return base + moe_layers * active * expert, base + moe_layers * (experts + shared) * expert


def _attention_per_pair(cfg: dict) -> float:
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    if cfg.get("kv_lora_rank"):
        d_qk, d_v = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    else:
        d_qk = d_v = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2.0 * heads * (d_qk + d_v) * layers


def model_compute(cfg: dict, kv_bytes_per_token: int, name: str = "model", weight_bytes: int = 2) -> ModelCompute:
    """The cost figures of a model given its config.json's fields."""
    cfg = cfg.get("text_config", cfg)
    active, total = _linear_weights(cfg)
    embeddings = cfg.get("vocab_size", 0) * cfg["hidden_size"] * (1 if cfg.get("tie_word_embeddings") else 2)
    return ModelCompute(name, 2.0 * active, _attention_per_pair(cfg), float(total * weight_bytes),
                        int(kv_bytes_per_token), float(embeddings * weight_bytes))


def compute_for(model: str | None = None, model_config: str | Path | None = None,
                kv_bytes_per_token: int | None = None) -> ModelCompute | None:
    """A model's cost figures from ``--model-config`` or a model of :data:`CONFIGS`
    (None when neither is given); KV bytes from ``replay.providers.kv`` unless given."""
    if model_config is not None:
        p = Path(model_config)
        cfg = json.loads((p / "config.json" if p.is_dir() else p).read_text())
        name = model or p.name
    elif model is not None:
        key = model.lower().removeprefix("meta-").split("/")[-1]
        key = next((k for k in CONFIGS if key == k or key.startswith(k + "-")), None)
        if key is None:
            raise ValueError(f"no shape known to cost model {model!r}; known: {', '.join(CONFIGS)} "
                             "(or pass --model-config PATH/config.json)")
        cfg, name = CONFIGS[key], key
    else:
        return None
    size = 2  # bf16 weights unless the config says otherwise
    if model_config is not None:
        shape, size = from_config(model_config)
        kv_bytes_per_token = kv_bytes_per_token or shape.bytes_per_token(size)
    elif kv_bytes_per_token is None:
        kv_bytes_per_token = (MODELS.get(name) or model_shape(name)).bytes_per_token(2)
    return model_compute(cfg, kv_bytes_per_token, name, weight_bytes=size)


def prefill_seconds(m: ModelCompute, gpu: Gpu, new, cached, utilisation: float) -> np.ndarray:
    """GPU-seconds to prefill ``new`` tokens after ``cached`` ones (arrays), the
    cached part already in GPU memory."""
    n = np.asarray(new, dtype=np.float64)
    k = np.asarray(cached, dtype=np.float64)
    if not 0 < utilisation <= 1:
        raise ValueError("the utilisation of peak FLOP/s must be in (0, 1]")
    pairs = n * k + n * (n + 1) / 2
    compute = (n * m.dense_flops_per_token + pairs * m.attention_flops_per_pair) / (gpu.flops * utilisation)
    memory = (m.weight_bytes + (k + n) * m.kv_bytes_per_token) / gpu.hbm_bytes_s
    return np.where(n > 0, np.maximum(compute, memory), 0.0)


def load_seconds(m: ModelCompute, tokens, bandwidth_bytes_s: float) -> np.ndarray:
    """Seconds to load ``tokens`` cached tokens' KV at a tier's bandwidth (0 for GPU memory)."""
    t = np.asarray(tokens, dtype=np.float64)
    if bandwidth_bytes_s == float("inf"):
        return np.zeros_like(t)
    return t * m.kv_bytes_per_token / bandwidth_bytes_s
