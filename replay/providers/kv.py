"""KV-cache bytes per token, and capacities as block counts or sizes.

A pool of C blocks of B tokens holds C · B · (bytes per token) of KV cache
(semantics.md, "Capacity"), per replica; divided by the tensor-parallel
degree for one GPU's share. Bytes per token come from a small table of common
open models (:data:`MODELS`: facts read from each model's ``config.json``,
2026-12), from a local ``config.json`` (:func:`from_config`), or are given.

Standard attention keeps a key and a value per layer and KV head:
``2 × layers × kv_heads × head_dim × bytes``. DeepSeek-style multi-head latent
attention (MLA) keeps one compressed latent and the rotary part per layer:
``layers × (kv_lora_rank + qk_rope_head_dim) × bytes``. Sliding-window and
hybrid layers are counted as full layers: an upper bound, noted per model.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


@dataclass(frozen=True)
class KvShape:
    """What sets a model's KV bytes per token. ``latent`` (MLA): the per-layer
    latent width (kv_lora_rank + qk_rope_head_dim); then heads and head_dim are
    not used."""
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    latent: int = 0
    note: str = ""

    def bytes_per_token(self, dtype_bytes: int = 2) -> int:
        if self.latent:
            return self.layers * self.latent * dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


#: Common open models (from each model's Hugging Face config.json; 2026-12).
MODELS: dict[str, KvShape] = {
    "llama-3.1-8b": KvShape(32, 8, 128),
    "llama-3.1-70b": KvShape(80, 8, 128),
    "llama-3.1-405b": KvShape(126, 8, 128),
    "llama-3.3-70b": KvShape(80, 8, 128),
    "qwen2.5-7b": KvShape(28, 4, 128),
    "qwen2.5-32b": KvShape(64, 8, 128),
    "qwen2.5-72b": KvShape(80, 8, 128),
    "qwen3-8b": KvShape(36, 8, 128),
    "qwen3-32b": KvShape(64, 8, 128),
    "mistral-7b": KvShape(32, 8, 128),
    "mixtral-8x7b": KvShape(32, 8, 128),
    "gemma-2-9b": KvShape(42, 8, 256, note="half the layers use a 4,096-token sliding window: an upper bound"),
    "gpt-oss-20b": KvShape(24, 8, 64, note="alternate layers use a 128-token sliding window: an upper bound"),
    "gpt-oss-120b": KvShape(36, 8, 64, note="alternate layers use a 128-token sliding window: an upper bound"),
    "deepseek-v3": KvShape(61, latent=512 + 64, note="MLA: one latent per layer (kv_lora_rank 512 + rope 64)"),
    "deepseek-r1": KvShape(61, latent=512 + 64, note="MLA: one latent per layer (kv_lora_rank 512 + rope 64)"),
    "deepseek-v2-lite": KvShape(27, latent=512 + 64, note="MLA: one latent per layer (kv_lora_rank 512 + rope 64)"),
}


def model_shape(name: str) -> KvShape:
    key = name.lower().removeprefix("meta-").split("/")[-1]
    key = re.sub(r"-instruct.*$|-chat.*$|-base$", "", key)
    if key in MODELS:
        return MODELS[key]
    raise ValueError(f"no KV shape known for model {name!r}; known: {', '.join(MODELS)} "
                     "(or pass --model-config PATH/config.json, or --kv-bytes-per-token N)")


def from_config(path: str | Path) -> tuple[KvShape, int]:
    """The KV shape and the bytes per element of a Hugging Face ``config.json``
    (a file, or a model directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = json.loads(p.read_text())
    cfg = cfg.get("text_config", cfg)
    layers = int(cfg["num_hidden_layers"])
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    size = 4 if "32" in dtype else 1 if "8" in dtype else 2
    if cfg.get("kv_lora_rank"):
        return KvShape(layers, latent=int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0),
                       note="MLA"), size
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    return KvShape(layers, kv_heads, head_dim), size


def kv_bytes_per_token(model: str | None = None, model_config: str | Path | None = None,
                       kv_bytes: int | None = None, kv_dtype: str | None = None) -> int | None:
    """Bytes of KV cache per token from whichever is given (None when none is):
    an explicit count, a config.json, or a model of :data:`MODELS`. ``kv_dtype``
    (bf16, fp16, fp8, fp32) overrides the element size (default: the config's,
    else bf16)."""
    if kv_bytes is not None:
        if kv_bytes <= 0:
            raise ValueError("--kv-bytes-per-token must be positive")
        return int(kv_bytes)
    if kv_dtype is not None and kv_dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; choose from {', '.join(DTYPE_BYTES)}")
    if model_config is not None:
        shape, size = from_config(model_config)
    elif model is not None:
        shape, size = model_shape(model), 2
    else:
        return None
    return shape.bytes_per_token(DTYPE_BYTES[kv_dtype] if kv_dtype else size)


_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> tuple[str, float]:
    """A capacity as written: ``('blocks', n)`` for a plain count, ``('bytes', n)``
    for a size with a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB), ``('auto', 0)``."""
    s = text.strip().lower()
    if s == "auto":
        return "auto", 0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?", s)
    if not m:
        raise ValueError(f"bad capacity {text!r}: a block count (4096), a size (512MiB, 40GiB, 1TiB) or 'auto'")
    if not m.group(2):
        if "." in m.group(1):
            raise ValueError(f"bad capacity {text!r}: a block count is a whole number")
        return "blocks", int(m.group(1))
    return "bytes", float(m.group(1)) * _UNITS[m.group(2)]


def blocks_for(kind: str, value: float, block: int, bytes_per_token: int | None) -> int:
    """A parsed capacity as a count of ``block``-token blocks (a size rounds down)."""
    if kind == "blocks":
        return int(value)
    if bytes_per_token is None:
        raise ValueError("a capacity in bytes needs the KV size per token: pass --model, --model-config "
                         "or --kv-bytes-per-token")
    return int(value // (block * bytes_per_token))


def auto_capacities(working_set: int, points: int = 16) -> list[int]:
    """A log-spaced grid of block counts from one block to the working set."""
    if working_set <= 1:
        return [1]
    grid = {max(1, round(math.exp(math.log(working_set) * i / (points - 1)))) for i in range(points)}
    return sorted(grid | {working_set})
