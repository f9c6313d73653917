"""One pass of `replay validate`: the sample sent to mlx-lm's server.

A pass sends a warm-up request, then every sampled request one at a time in
time order, with ``max_tokens=1``, temperature 0 and logprobs (for the token
the server generated: mlx-lm keys a cache entry on prompt + generated tokens),
and records the time and the server's ``usage`` for each answer.

Requests are sent as described in :mod:`replay.validate.mlx_model`: to the
default random-weight model as ``replay:<marker>`` pieces through the chat
endpoint (its chat template renders the neutral template exactly); to a user's
model (``model=DIR``) as the neutral rendering's text through
``/v1/completions``, so the timing coefficients belong to that model. With a
chat template, every request goes as that template's text through
``/v1/completions``.
"""

from __future__ import annotations

import sys

from replay.text import render
from replay.validate.mlx_model import raw_messages
from replay.validate.sample import Item
from replay.validate.server import MlxServer

WARMUP_TEXT = "warm-up request sent by replay validate"


def _request_body(item: Item, user_model: bool) -> tuple[str, dict]:
    common = {"max_tokens": 1, "temperature": 0.0, "logprobs": True}
    if item.text is not None:  # a chat template's rendering, as is
        return "/v1/completions", {"prompt": item.text, **common}
    pieces = render.render_request(item.body, item.fmt)
    if user_model:
        return "/v1/completions", {"prompt": render.render_text(pieces), **common}
    return "/v1/chat/completions", {"messages": raw_messages(pieces), **common}


def warmup_body(user_model: bool) -> tuple[str, dict, list]:
    pieces = [("marker", "bos", 0), ("marker", "user", 2), ("text", WARMUP_TEXT, 2),
              ("marker", "assistant", 3)]
    common = {"max_tokens": 1, "temperature": 0.0, "logprobs": True}
    if user_model:
        return "/v1/completions", {"prompt": render.render_text(pieces), **common}, pieces
    return "/v1/chat/completions", {"messages": raw_messages(pieces), **common}, pieces


def _parse(resp: dict) -> tuple[int, int | None, list[int]]:
    usage = resp.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    gen = []
    lp = (resp.get("choices") or [{}])[0].get("logprobs") or {}
    for c in lp.get("content") or []:
        if "id" in c:
            gen.append(int(c["id"]))
    return int(usage.get("prompt_tokens", -1)), (None if cached is None else int(cached)), gen


def replay_pass(server: MlxServer, items: list[Item], user_model: bool, timeout_s: float,
                progress: bool, label: str, records: list[dict]) -> None:
    """Send the warm-up, then every item; append one record per answered request."""
    path, body, _ = warmup_body(user_model)
    resp, dt = server.post(path, body, timeout_s)
    records.append({"warmup": True, "time_s": dt, **dict(zip(("prompt_tokens", "cached", "gen"), _parse(resp)))})
    for i, it in enumerate(items):
        path, body = _request_body(it, user_model)
        resp, dt = server.post(path, body, timeout_s)
        n, cached, gen = _parse(resp)
        records.append({"warmup": False, "index": i, "time_s": dt, "prompt_tokens": n,
                        "cached": cached, "gen": gen})
        if progress:
            print(f"[validate {label}] {i + 1}/{len(items)} n={n} cached={cached} {dt:.2f}s",
                  file=sys.stderr, flush=True)
