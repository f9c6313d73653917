"""The prompt parts a log does not hold, as opaque runs of tokens.

Claude Code transcripts omit the system prompt and the tool definitions; Codex
rollouts omit the tool definitions (its encrypted reasoning is handled by the
reader: ``replay.readers.codex``). Each such request carries ``hidden_key``,
the identity of its hidden prefix (``claude-code <version> <model> <cwd>``,
``codex <cli_version> <model>``).

The rule, stated once and never fitted to the realised hits:

* **Length.** A stream (the request's ``session``: a Claude Code sidechain is a
  stream of its own) has one hidden prefix, its length inferred from its first
  request's usage: the provider's prompt tokens minus our visible tokens of
  that request (0 when the visible part is the larger). It stays that length for
  the stream's later requests.
* **Identity.** The hidden prefix is the same text for requests with the same
  ``hidden_key``: its tokens are a deterministic run seeded by the key, so two
  streams of one key share it up to the shorter of their two lengths (the
  client's fixed text first, what varies — the environment block — last) on a
  token-level cache (OpenAI's, Gemini's walk); Anthropic's reads only at a
  breakpoint an earlier request wrote, so there it is shared between streams of
  one key and one length.
* **Position.** It leads the prompt (tools → system → messages).

Figures that use it report its share of our prompt tokens (``inferred_share``).
"""

from __future__ import annotations

import hashlib

import numpy as np

#: hidden ids are negative: never a real token id, so they match only each other
_SPAN = 1 << 32


def hidden_tokens(key: str, n: int) -> np.ndarray:
    """The opaque run of ``n`` ids for ``key``; a prefix of the run for any larger ``n``."""
    seed = int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=3).digest(), "little")
    return -(seed * _SPAN + np.arange(1, n + 1, dtype=np.int64))


def infer_lengths(first_of_stream: dict[str, tuple[int | None, int]]) -> dict[str, int]:
    """Stream → hidden length, from its first request's (provider prompt tokens, our visible tokens)."""
    return {s: max(0, int(prov) - int(ours)) if prov is not None else 0
            for s, (prov, ours) in first_of_stream.items()}
