"""Accelerators and tier bandwidths for the prefill cost model: a small dated table
(``gpus.toml``: vendor datasheet figures, each with its source) or figures given
explicitly (``--gpu-tflops``, ``--gpu-hbm``, ``--gpu-host-link``)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).with_name("gpus.toml")


@dataclass(frozen=True)
class Gpu:
    """One accelerator: peak dense BF16 FLOP/s, memory bandwidth and host-link
    bandwidth (bytes/s, one direction), and where the figures come from."""
    key: str
    name: str
    flops: float
    hbm_bytes_s: float
    host_bytes_s: float
    source: str = "given"
    memory_bytes: float | None = None  # (table GPUs: what the report sizes GPU memory by)


@lru_cache(maxsize=None)
def _table() -> dict:
    return tomllib.loads(TABLE.read_text())


def known_gpus() -> list[str]:
    return sorted(_table()["gpus"])


def get_gpu(name: str | None, tflops: float | None = None, hbm_gb_s: float | None = None,
            host_gb_s: float | None = None) -> Gpu | None:
    """A GPU of the table by name (case-insensitive; ``h100``, ``mi300x`` …), its
    figures overridden by any given; or, without a name, the given figures
    (all three needed). None when neither is given."""
    if name is None and tflops is None and hbm_gb_s is None and host_gb_s is None:
        return None
    base = {}
    if name is not None:
        key = name.strip().lower()
        gpus = _table()["gpus"]
        if key not in gpus:
            raise ValueError(f"unknown GPU {name!r}; known: {', '.join(known_gpus())} (or give --gpu-tflops, "
                             "--gpu-hbm and --gpu-host-link)")
        base = gpus[key]
    figures = {"dense_bf16_tflops": tflops, "hbm_gb_s": hbm_gb_s, "host_link_gb_s": host_gb_s}
    merged = {k: (v if v is not None else base.get(k)) for k, v in figures.items()}
    missing = [k for k, v in merged.items() if v is None]
    if missing:
        raise ValueError("a GPU given by its figures needs --gpu-tflops, --gpu-hbm and --gpu-host-link")
    if any(v <= 0 for v in merged.values()):
        raise ValueError("GPU figures must be positive")
    overridden = name is None or any(v is not None for v in figures.values())
    return Gpu(key=name.lower() if name else "custom", name=base.get("name", "custom"),
               flops=float(merged["dense_bf16_tflops"]) * 1e12, hbm_bytes_s=float(merged["hbm_gb_s"]) * 1e9,
               host_bytes_s=float(merged["host_link_gb_s"]) * 1e9,
               memory_bytes=float(base["memory_gb"]) * 1e9 if "memory_gb" in base else None,
               source=("given" if name is None else base["source"] + ("; figures overridden" if overridden else "")))


_RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_bandwidth(text: str) -> float:
    """``25GB/s``, ``64GiB/s``, ``800MB/s`` → bytes per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]i?)?b/s", text.strip().lower())
    if not m:
        raise ValueError(f"bad bandwidth {text!r}: e.g. 25GB/s, 64GiB/s")
    return float(m.group(1)) * _RATE_UNITS[m.group(2) or ""]


def tier_bandwidth(name: str, written: str | None, gpu: Gpu, first: bool) -> float:
    """Bytes/s a tier's hits load at: none for the first tier (the GPU's own memory:
    ``inf``), the written bandwidth, else the table's default for the tier's
    name (``host``: the GPU's host link)."""
    if first:
        return float("inf")
    if written is not None:
        return parse_bandwidth(written)
    default = _table()["tiers"].get(name.lower())
    if default is None:
        raise ValueError(f"no default bandwidth for tier {name!r} (known: {', '.join(sorted(_table()['tiers']))}): "
                         f"write it, e.g. {name}:SIZE:25GB/s")
    return gpu.host_bytes_s if default == "host" else float(default) * 1e9
