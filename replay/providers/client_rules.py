"""Each provider's cache as its client uses it, judged request by request
(``replay.providers.realised`` sums them; the rules and their sources are the
profiles ``anthropic-claude-code``, ``openai-responses`` and ``gemini-*`` in
``replay.providers.catalog``).

* **Anthropic**: the prompt is the hidden prefix (tools + system, inferred:
  ``replay.providers.hidden``) then the messages. Breakpoints as Claude Code
  places them: the end of the hidden prefix and the end of the last content
  block (the automatic breakpoint); the simulator is
  ``simulators.simulate_anthropic`` (20-block lookback, the model's minimum, a
  hit refreshes its entry). The TTL of a request's breakpoints is the one its
  usage shows it wrote (1 h when ``ephemeral_1h_input_tokens`` > 0, 5 min when
  it wrote only 5-minute entries), else its stream's last one (5 min at first).
  The cache is the organisation's (tenant) and the model's.
* **OpenAI**: the longest common prefix with an earlier prompt of the same
  organisation + ``prompt_cache_key`` + model, alive within 10 minutes (the
  upper end of in-memory retention; a hit refreshes it), rounded down to 1,024
  + 128·k tokens, 0 below 1,024 provider tokens.
* **Gemini** (implicit caching): the same walk, per organisation + model +
  serving backend (a backend named by the gateway — OpenRouter's
  ``provider`` — has a cache of its own), in blocks of 2,048 of the provider's
  tokens (scaled to ours by the request's own ratio of our prompt tokens to
  the provider's), 0 below the model's minimum in provider tokens; TTL 1 hour
  (none documented: minutes to hours). ``docs/realised.md`` has the evidence.
* DeepSeek (its ``deepseek`` walk profile) and anything else (the ideal
  contract) are judged by the caller (``replay.providers.realised``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.core import hits
from replay.core.prompts import Prompt, iter_prompts
from replay.core.replay import replay_prompts
from replay.times import US_PER_S
from replay.providers.catalog import ANTHROPIC_MIN_TOKENS, GEMINI_MIN_TOKENS, model_family
from replay.providers.hidden import hidden_tokens, infer_lengths
from replay.providers.layouts import block_ends
from replay.providers.simulators import (ANTHROPIC_1H_US, ANTHROPIC_5M_US, AnthropicRequest, openai_round,
                                         simulate_anthropic)

PARTS = ("hidden-part inference", "minimum", "TTL expiry", "backend split", "breakpoints", "unexplained")
OPENAI_TTL_US = 600 * US_PER_S
GEMINI_TTL_US = 3600 * US_PER_S
GEMINI_BLOCK = 2048
LOOKBACK = 20


@dataclass
class RequestRow:
    """A request as the rules see it: its prompt (``request_id``, ``ts``, ``tenant``,
    ``key``, ``session``, ``model``, ``n_tokens`` are the prompt's) and what the log
    says of it beside."""
    prompt: Prompt
    client: str | None
    hidden_key: str | None
    backend: str | None
    usage_prompt: int | None
    usage_cached: int
    usage_write: int | None
    usage_write_1h: int | None

    def __getattr__(self, name: str):
        return getattr(self.prompt, name)

    @property
    def tokens(self) -> np.ndarray:
        return self.prompt.symbols

    @property
    def stream(self) -> str:
        return f"{self.tenant}|{self.session}" if self.session is not None else f"{self.tenant}|-"


def _full(r: RequestRow, hidden: dict[str, int]) -> tuple[np.ndarray, int]:
    """The request's tokens with its hidden prefix in front, and that prefix's length."""
    h = hidden.get(r.stream, 0) if r.hidden_key else 0
    if not h:
        return np.asarray(r.tokens, dtype=np.int64), 0
    return np.concatenate([hidden_tokens(r.hidden_key, h), np.asarray(r.tokens, dtype=np.int64)]), h


def hidden_lengths(reqs: list[RequestRow]) -> dict[str, int]:
    """Stream → the inferred length of its hidden prefix (``replay.providers.hidden``):
    from the first of its requests (processing order) that carries usage."""
    first: dict[str, tuple[int | None, int]] = {}
    for r in reqs:
        if r.hidden_key and r.stream not in first and r.usage_prompt is not None:
            first[r.stream] = (r.usage_prompt, r.n_tokens)
    return infer_lengths(first)


def load_rows(con, with_usage_only: bool = True) -> list[RequestRow]:
    """The tokenized requests (with the provider's usage only, by default), in processing order."""
    meta = {r[0]: r[1:] for r in con.execute(f"""
        SELECT request_id, client, hidden_key, backend, usage_prompt_tokens, usage_cached_tokens,
               usage_cache_write_tokens, usage_write_1h_tokens
        FROM requests {'WHERE usage_prompt_tokens IS NOT NULL' if with_usage_only else ''}""").fetchall()}
    out = []
    for p in iter_prompts(con):
        m = meta.get(p.request_id)
        if m is None:
            continue
        client, hkey, backend, up, uc, uw, u1h = m
        out.append(RequestRow(p, client, hkey, backend, up, int(uc or 0), uw, u1h))
    return out




def judge(con, reqs: list[RequestRow], family: str) -> list[tuple]:
    """(prompt tokens, hidden tokens, predicted, part) per request of ``reqs`` (processing
    order) under ``family``'s rules (:data:`RULES`); a stream's first request whose
    hidden prefix was inferred is marked ``hidden-part inference``."""
    hidden = hidden_lengths(reqs)
    seen: set[str] = set()
    out = []
    for r, (n, h, pred, part) in zip(reqs, RULES[family](con, reqs, hidden)):
        if h and r.stream not in seen:
            part = "hidden-part inference"
        seen.add(r.stream)
        out.append((n, h, int(pred), part))
    return out


def _gap_part(prev_ts: int | None, ts: int, ttl_us: int) -> str | None:
    return "TTL expiry" if prev_ts is not None and ts - prev_ts > ttl_us else None


# ----------------------------------------------------------------------------- Anthropic

def _anthropic(con, rs: list[RequestRow], hidden: dict[str, int]) -> list[tuple]:
    return anthropic_predictions(rs, hidden, block_ends(con, [r.request_id for r in rs]))


def anthropic_predictions(rs: list[RequestRow], hidden: dict[str, int], ends: dict[int, list[int]]) -> list[tuple]:
    """(full length, hidden length, predicted read, part) per request; ``ends``: each
    request's content-block end positions in its visible tokens."""
    ttl_of_stream: dict[str, int] = {}
    prev: dict[str, tuple[int, int]] = {}  # stream → (ts, full length) of its last request
    by_model: dict[Any, list[int]] = {}
    areqs, meta = [], []
    for i, r in enumerate(rs):
        if r.usage_write_1h:
            ttl = ANTHROPIC_1H_US
        elif r.usage_write:
            ttl = ANTHROPIC_5M_US
        else:
            ttl = ttl_of_stream.get(r.stream, ANTHROPIC_5M_US)
        ttl_of_stream[r.stream] = ttl
        full, h = _full(r, hidden)
        vis = ends.get(r.request_id) or [r.n_tokens]
        # Claude Code's breakpoints: the end of tools + system (hidden), the end of the last content block
        bps = ([(h, ttl)] if h else []) + [(vis[-1] + h, ttl)]
        bounds = ([h] if h else []) + [b + h for b in vis]
        areqs.append(AnthropicRequest(r.ts, f"{r.tenant}\0{r.model}", full, bps, bounds))
        part = _gap_part(prev.get(r.stream, (None,))[0], r.ts, ttl)
        if part is None and r.stream in prev and bps:
            last_bp = max(p for p, _ in bps)
            if sum(1 for b in bounds if prev[r.stream][1] < b < last_bp) > LOOKBACK:
                part = "breakpoints"
        prev[r.stream] = (r.ts, len(full))
        meta.append((len(full), h, part))
        by_model.setdefault(r.model, []).append(i)
    pred = [0] * len(rs)
    for model, idx in by_model.items():
        fam = model_family(model)
        minimum = ANTHROPIC_MIN_TOKENS.get(fam.profile.removeprefix("anthropic-"), 1024)
        for i, (read, _w5, _w1) in zip(idx, simulate_anthropic([areqs[i] for i in idx], minimum, LOOKBACK)):
            pred[i] = read
            if read == 0 and meta[i][0] < minimum:
                meta[i] = (meta[i][0], meta[i][1], "minimum")
    return [(n, h, pred[i], part or "unexplained") for i, (n, h, part) in enumerate(meta)]


# ----------------------------------------------------------------------------- OpenAI and Gemini: walks

def _walk(rs: list[RequestRow], hidden: dict[str, int], partition, ttl_us: int) -> tuple[list[int], list]:
    """Each request's ``L_τ`` under ``ttl_us`` in its partition's trie, and its (full length, hidden length)."""
    prompts, lens = [], []
    for r in rs:
        full, h = _full(r, hidden)
        prompts.append(Prompt(r.request_id, r.ts, partition(r), None, None, full, None, None, len(full), r.model))
        lens.append((len(full), h))
    walks = replay_prompts(prompts, modes=("tenant",), variants=("prompt",))[("prompt", "tenant")]
    offsets = np.cumsum([0] + [len(w[5]) for w in walks], dtype=np.int64)
    L = hits.depths_under(offsets, [g for w in walks for g in w[5]], [d for w in walks for d in w[6]], [ttl_us])
    return [int(x) for x in L[:, 0]], lens


def _openai(con, rs: list[RequestRow], hidden: dict[str, int]) -> list[tuple]:
    depths, lens = _walk(rs, hidden, lambda r: f"org:{r.tenant}|key:{r.key}", OPENAI_TTL_US)
    prev: dict[str, int] = {}
    out = []
    for r, L, (n, h) in zip(rs, depths, lens):
        size = r.usage_prompt if r.usage_prompt is not None else n
        pred = openai_round(L) if size >= 1024 else 0
        part = "minimum" if size < 1024 else _gap_part(prev.get(r.stream), r.ts, OPENAI_TTL_US)
        prev[r.stream] = r.ts
        out.append((n, h, pred, part or "unexplained"))
    return out


def _gemini(con, rs: list[RequestRow], hidden: dict[str, int]) -> list[tuple]:
    depths, lens = _walk(rs, hidden, lambda r: f"org:{r.tenant}|backend:{r.backend}", GEMINI_TTL_US)
    prev: dict[str, tuple[int, str | None]] = {}
    out = []
    for r, L, (n, h) in zip(rs, depths, lens):
        minimum = GEMINI_MIN_TOKENS.get(model_family(r.model).profile.removeprefix("gemini-"), 4096)
        size = r.usage_prompt if r.usage_prompt is not None else n
        block = GEMINI_BLOCK * n / size if size else float(GEMINI_BLOCK)
        pred = int(math.floor(L / block) * block) if size >= minimum else 0
        before = prev.get(r.stream)
        part = "minimum" if size < minimum else _gap_part(before and before[0], r.ts, GEMINI_TTL_US)
        if part is None and before is not None and before[1] != r.backend:
            part = "backend split"
        prev[r.stream] = (r.ts, r.backend)
        out.append((n, h, min(pred, n), part or "unexplained"))
    return out


#: the providers whose rules are judged here, by model family: (con, rows, hidden lengths) →
#: (prompt tokens, hidden tokens, predicted, part) per row
RULES = {"anthropic": _anthropic, "openai": _openai, "google": _gemini}
