"""Content ids of segments (pure functions; the scheme is also in ``docs/rendering.md``).

``seg_id`` = first 8 bytes, unsigned big-endian, of ``blake2b`` (64-byte digest) over:

* text:    ``b"text\\0"   + utf-8 text``  (lone surrogates kept via ``surrogatepass``)
* marker:  ``b"marker\\0" + name``
* image:   ``b"image\\0"  + sha256 hex + b"\\0" + decimal token count``
* tokens:  ``b"tokens\\0" + int32 little-endian bytes`` (pre-tokenized logs)

Kept apart from the tokenize stage so the encoder process computes the same ids
without importing the database layer.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from replay.text.renderers import ALL_MARKERS


def h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data).digest()[:8], "big")


def text_seg_id(text: str) -> int:
    return h64(b"text\0" + text.encode("utf-8", "surrogatepass"))


def marker_seg_id(name: str) -> int:
    return h64(b"marker\0" + name.encode("utf-8"))


def image_seg_id(sha_hex: str, n_tokens: int) -> int:
    return h64(b"image\0" + sha_hex.encode("ascii") + b"\0" + str(int(n_tokens)).encode("ascii"))


def tokens_seg_id(tokens: Sequence[int] | np.ndarray) -> int:
    return h64(b"tokens\0" + np.asarray(tokens, dtype="<i4").tobytes())


MARKER_SEG = {name: marker_seg_id(name) for name in ALL_MARKERS}


def piece_seg_id(piece: tuple) -> int:
    kind, payload, _ = piece
    if kind == "text":
        return text_seg_id(payload)
    if kind == "marker":
        return MARKER_SEG[payload]
    if kind == "image":
        return image_seg_id(payload[0], payload[1])
    raise ValueError(f"unknown piece kind {kind!r}")


def image_tokens(sha_hex: str, n_tokens: int, vocab_size: int) -> np.ndarray:
    """Deterministic run of ``n_tokens`` ids in [0, vocab_size) seeded by the image hash."""
    rng = np.random.default_rng(int(sha_hex, 16))
    return rng.integers(0, vocab_size, size=int(n_tokens), dtype=np.int32)
