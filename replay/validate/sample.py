"""Which logged requests `replay validate` replays, and their tokens.

:func:`choose_sample` takes whole streams (sessions) of text requests in a
seeded random order until the sample is full, skipping requests with images,
non-text formats or prompts over the token budget.

Each request carries the tokens the server must see. For the default
random-weight model these are replay's DeepSeek-V4 tokens (the tokenize
stage's, else the neutral rendering tokenized here). For a user's model
(``model=DIR``) they are the neutral rendering's text tokenized by that
model's own tokenizer, computed with mlx-lm's ``load_tokenizer`` (the server's
code path), so replay's DeepSeek-V4 counts do not apply
(:func:`sample_for_model`). With a chat template (``--chat-template``) each
request is that template's rendering at the request's time, sent as text
through ``/v1/completions``; the server must then see the tokens the tokenize
stage stored (the default model), or that text tokenized by the user's model.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replay.text import render
from replay.text.tokenize import load_prompt_tokens
from replay.validate.mlx_model import tokenizer_files

# (the gateway / tracing exports hold chat bodies too: replay.readers.exported)
TEXT_FORMATS = ("anthropic", "openai", "trajectory", "otel", "litellm", "langfuse")


@dataclass
class Item:
    request_id: int
    ts: int  # µs
    stream: str
    fmt: str
    body: dict
    tokens: np.ndarray | None = None   # what the server must see
    replay_n_tokens: int | None = None
    text: str | None = None            # the chat template's rendering, sent as is (``--chat-template``)


def _stream(tenant, key, session) -> str:
    if session is not None:
        return f"session:{session}"
    if key is not None:
        return f"key:{key}"
    return f"tenant:{tenant}"


def _replay_tokens(con, ids: list[int]) -> tuple[dict[int, np.ndarray], str]:
    """Replay's token arrays for ``ids``: the tokenize stage's (``prompts`` /
    ``segments`` via :func:`replay.text.tokenize.load_prompt_tokens`) when present,
    else rendered and tokenized here with the default tokenizer."""
    if ids:
        have = con.execute(
            "SELECT count(*) FROM prompts WHERE request_id IN (SELECT unnest(?::BIGINT[]))",
            [ids]).fetchone()[0]
        if have == len(ids):
            toks = load_prompt_tokens(con, ids)
            return {int(k): np.asarray(v, dtype=np.int64) for k, v in toks.items()}, "prompts table"
    return {}, "rendered here"


_FALLBACK_TOK = None


def fallback_tokenize(pieces) -> np.ndarray:
    """Tokenize the neutral rendering with the DeepSeek-V4 tokenizer.json (used
    only when the tokenize stage has not run)."""
    global _FALLBACK_TOK
    if _FALLBACK_TOK is None:
        from tokenizers import Tokenizer

        _FALLBACK_TOK = Tokenizer.from_file(str(tokenizer_files() / "tokenizer.json"))
    ids = _FALLBACK_TOK.encode(render.render_text(pieces), add_special_tokens=False).ids
    return np.asarray(ids, dtype=np.int64)


def choose_sample(con, sample: int, max_prompt_tokens: int, seed: int = 0,
                  tokens_for=None) -> tuple[list[Item], dict]:
    """Whole streams, in random order (``seed``), until ``sample`` requests; the
    last stream taken is cut to its first requests in time order. Requests with
    images, non-text formats or prompts over ``max_prompt_tokens`` are skipped
    (counted in the returned info). The sample comes back in time order."""
    rows = con.execute(f"""
        SELECT r.request_id, r.ts_us, r.tenant, r.prompt_cache_key, r.session, r.format, b.body
        FROM requests r JOIN request_bodies b USING (request_id)
        WHERE b.body IS NOT NULL AND r.format IN ({','.join("'" + f + "'" for f in TEXT_FORMATS)})
        ORDER BY r.ts_us, r.request_id""").fetchall()
    by_stream: dict[str, list] = {}
    for r in rows:
        by_stream.setdefault(_stream(r[2], r[3], r[4]), []).append(r)
    names = sorted(by_stream)
    random.Random(seed).shuffle(names)
    skipped = {"over_budget": 0, "image": 0, "unrenderable": 0}
    chosen: list[Item] = []
    streams_taken: list[str] = []
    cut = None
    for name in names:
        if len(chosen) >= sample:
            break
        cand = []
        for rid, ts, _t, _k, _s, fmt, body in by_stream[name]:
            try:
                b = json.loads(body)
                pieces = render.render_request(b, fmt)
            except Exception:
                skipped["unrenderable"] += 1
                continue
            if any(p[0] == "image" for p in pieces):
                skipped["image"] += 1
                continue
            cand.append(Item(int(rid), int(ts), name, fmt, b))
        if not cand:
            continue
        toks = tokens_for(cand) if tokens_for else {}
        kept = []
        for it in cand:
            t = toks.get(it.request_id)
            if t is None:
                t = fallback_tokenize(render.render_request(it.body, it.fmt))
            it.tokens = t
            it.replay_n_tokens = len(t)
            if len(t) > max_prompt_tokens:
                skipped["over_budget"] += 1
                continue
            kept.append(it)
        if not kept:
            continue
        room = sample - len(chosen)
        if len(kept) > room:
            cut = {"stream": name, "kept": room, "of": len(kept)}
            kept = kept[:room]
        chosen.extend(kept)
        streams_taken.append(name)
    chosen.sort(key=lambda it: (it.ts, it.request_id))
    info = {"streams": len(streams_taken), "stream_names": streams_taken,
            "requests": len(chosen), "requested": sample,
            "max_prompt_tokens": max_prompt_tokens, "seed": seed,
            "skipped": skipped, "last_stream_cut": cut,
            "prompt_tokens": int(sum(len(it.tokens) for it in chosen)),
            "max_request_tokens": int(max((len(it.tokens) for it in chosen), default=0))}
    return chosen, info


def sample_for_model(con, sample: int, max_prompt_tokens: int, seed: int, model_dir: Path,
                     user_model: bool, template=None) -> tuple[list[Item], dict]:
    """:func:`choose_sample` with the tokens the server will see for
    ``model_dir``; the info says where they came from. ``template``: a
    ``render_template.ChatTemplate`` the requests are rendered with."""
    user_tok = None
    if user_model:
        from mlx_lm.utils import load_tokenizer
        user_tok = load_tokenizer(model_dir)

    def tokens_for(cand: list[Item]) -> dict[int, np.ndarray]:
        if template is not None:
            from replay.text.render_template import render_text

            for it in cand:
                it.text = render_text(template, it.body, it.fmt, it.ts)
            if user_tok is not None:
                return {it.request_id: np.asarray(user_tok.encode(it.text), dtype=np.int64) for it in cand}
        if user_tok is not None:
            return {it.request_id: np.asarray(user_tok.encode(
                render.render_text(render.render_request(it.body, it.fmt))), dtype=np.int64)
                for it in cand}
        toks, _src = _replay_tokens(con, [it.request_id for it in cand])
        return toks

    items, info = choose_sample(con, sample, max_prompt_tokens, seed, tokens_for)
    if template is not None:
        info["tokens"] = (f"the chat template {template.origin} rendered here, "
                          + ("the model's own tokenizer" if user_model else "replay's stored tokens")
                          + ", /v1/completions")
    elif user_model:
        info["tokens"] = "the model's own tokenizer (mlx-lm load_tokenizer), /v1/completions"
    else:
        src = _replay_tokens(con, [it.request_id for it in items[:1]])[1] if items else "-"
        info["tokens"] = f"replay's DeepSeek-V4 tokens ({src}); chat endpoint, replay:<marker> pieces"
    return items, info
