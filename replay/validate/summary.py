"""The result of `replay validate`: the passes' records against the predictions.

:func:`summarise` fills the result dict from the warm pass (the cache under
test) and the cold pass (same requests, no cache): the server's prompt and
cached token counts against replay's count and the ``mlx-lm`` profile's
prediction (:func:`replay.providers.mlx_cache.simulate_mlx`), the ``ideal``
ceiling, the prefill-time model of :mod:`replay.validate.timing` and the
seconds saved. :func:`summary_lines` is the CLI's short text of that dict.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replay.times import seconds
from replay.providers.mlx_cache import ideal_lcp, simulate_mlx
from replay.text import render
from replay.validate.mlx_model import kv_bytes_per_token
from replay.validate.passes import warmup_body
from replay.validate.sample import Item, fallback_tokenize
from replay.validate.timing import fit_time_model, predict_time


def bpt_or0(res, model) -> int:
    try:
        return kv_bytes_per_token(res["model"]) if res.get("model") else 0
    except Exception:
        return 0


def summarise(res: dict, items: list[Item], warm: list[dict], cold: list[dict],
              cache_size, cache_bytes, bpt: int) -> None:
    """Fill ``res`` from the warm and cold passes' records (warm-ups excluded)."""
    done = [r for r in warm if not r["warmup"]]
    res["cold_pass"] = {"requests": len([r for r in cold if not r["warmup"]])} if cold else None
    if not warm:
        return
    # predictions: the warm-up is request 0 of the simulation
    wu = warm[0]
    wu_tokens = _warmup_tokens(res, wu)
    prompts = [wu_tokens] + [items[r["index"]].tokens for r in done]
    outputs = [np.asarray(wu["gen"], dtype=np.int64)] + [np.asarray(r["gen"], dtype=np.int64) for r in done]
    stats: dict = {}
    pred = simulate_mlx(prompts, outputs, cache_size=cache_size, cache_bytes=cache_bytes,
                        bytes_per_token=bpt, stats=stats)[1:]
    res["evictions_predicted"] = stats.get("evictions")
    ideal = ideal_lcp([items[r["index"]].tokens for r in done])
    cold_by_idx = {r["index"]: r for r in cold if not r["warmup"]}
    per = []
    for r, p, idl in zip(done, pred, ideal):
        it = items[r["index"]]
        c = cold_by_idx.get(r["index"])
        per.append({"request_id": it.request_id, "stream": it.stream, "ts": seconds(it.ts),
                    "n_tokens": len(it.tokens), "replay_n_tokens": it.replay_n_tokens,
                    "prompt_tokens": r["prompt_tokens"], "cached_reported": r["cached"],
                    "cached_predicted": int(p), "ideal": int(idl), "time_s": r["time_s"],
                    "cold_time_s": c["time_s"] if c else None,
                    "cold_cached_reported": c["cached"] if c else None,
                    "generated": r["gen"]})
    n = len(per)
    res["requests"] = n
    res["per_request"] = per
    if not n:
        return
    exact = sum(1 for q in per if q["cached_reported"] == q["cached_predicted"])
    res["cached_exact"] = exact
    res["cached_exact_share"] = exact / n
    res["cached_predicted_tokens"] = int(sum(q["cached_predicted"] for q in per))
    res["cached_reported_tokens"] = int(sum(q["cached_reported"] or 0 for q in per))
    res["prompt_tokens"] = int(sum(q["n_tokens"] for q in per))
    res["prompt_tokens_match"] = sum(1 for q in per if q["prompt_tokens"] == q["n_tokens"]) / n
    res["ideal_ceiling_tokens"] = int(sum(q["ideal"] for q in per))
    res["ideal_ceiling_ratio"] = res["ideal_ceiling_tokens"] / max(1, res["prompt_tokens"])
    res["cached_reported_ratio"] = res["cached_reported_tokens"] / max(1, res["prompt_tokens"])

    _summarise_times(res, per)
    if all(q["cold_time_s"] is not None for q in per):
        res["saved_s_measured"] = float(sum(q["cold_time_s"] - q["time_s"] for q in per))
        res["time_cold_s"] = float(sum(q["cold_time_s"] for q in per))
        res["time_warm_s"] = float(sum(q["time_s"] for q in per))
    res["notes"] = [
        f"model_kind={res['model_kind']}: timing coefficients belong to {res['model']} on this machine",
        "predictions: mlx-lm profile (replay/providers/mlx_cache.py) keyed on prompt + the token the "
        "server generated; the warm-up request is part of the simulated cache",
    ]


def _summarise_times(res: dict, per: list[dict]) -> None:
    """Fit the time model on every other request of both passes, check it on
    the rest, and predict each request's time and the seconds saved."""
    # observations from both passes, alternate split by request
    obs = [(q["n_tokens"], q["cached_reported"] or 0, q["time_s"], i, "warm") for i, q in enumerate(per)]
    obs += [(q["n_tokens"], q["cold_cached_reported"] or 0, q["cold_time_s"], i, "cold")
            for i, q in enumerate(per) if q["cold_time_s"] is not None]
    train = [o for o in obs if o[3] % 2 == 0]
    test = [o for o in obs if o[3] % 2 == 1]
    if len(train) >= 3 and test:
        arr = lambda rows, k: np.array([o[k] for o in rows], dtype=float)  # noqa: E731
        fit = fit_time_model(arr(train, 0), arr(train, 1), arr(train, 2))
        res["fit"] = {**fit, "train": len(train), "test": len(test),
                      "formula": "t = a + b*uncached + c*attention_pairs (seconds; least squares on relative error)",
                      "belongs_to": res["model"]}
        pt = predict_time(fit, arr(test, 0), arr(test, 1))
        err = np.abs(pt - arr(test, 2)) / arr(test, 2)
        res["time_median_abs_err"] = float(np.median(err))
        warm_test = [k for k, o in enumerate(test) if o[4] == "warm"]
        if warm_test:
            res["time_median_abs_err_warm"] = float(np.median(err[warm_test]))
        for q in per:
            q["time_predicted_s"] = float(predict_time(fit, [q["n_tokens"]], [q["cached_reported"] or 0])[0])
        nn = np.array([q["n_tokens"] for q in per], dtype=float)
        hp = np.array([q["cached_predicted"] for q in per], dtype=float)
        res["saved_s_predicted"] = float(np.sum(predict_time(fit, nn, 0 * nn) - predict_time(fit, nn, hp)))


def _warmup_tokens(res: dict, wu: dict) -> np.ndarray:
    _path, _body, pieces = warmup_body(res["model_kind"] == "user")
    if res["model_kind"] == "user":
        from mlx_lm.utils import load_tokenizer
        tok = load_tokenizer(Path(res["model"]))
        return np.asarray(tok.encode(render.render_text(pieces)), dtype=np.int64)
    t = fallback_tokenize(pieces)
    return t


def summary_lines(res: dict) -> list[str]:
    """A short human-readable summary (for the CLI without --json)."""
    out = [f"model: {res['model']} ({res['model_kind']})"]
    s = res.get("sampled") or {}
    if s:
        out.append(f"sampled: {s.get('requests')} requests from {s.get('streams')} streams "
                   f"(budget {s.get('max_prompt_tokens')} tokens; skipped {s.get('skipped')})")
    if res["requests"]:
        out.append(f"cached tokens: predicted {res['cached_predicted_tokens']}, reported "
                   f"{res['cached_reported_tokens']}; exact for {res['cached_exact']}/{res['requests']} "
                   f"requests ({100 * res['cached_exact_share']:.1f} %)")
        out.append(f"server prompt_tokens equal replay's for {100 * res['prompt_tokens_match']:.1f} % of requests")
        out.append(f"ideal ceiling: {res['ideal_ceiling_tokens']} tokens vs {res['cached_reported_tokens']} "
                   f"cached by the engine (cache size {res['prompt_cache_size']}, "
                   f"{res.get('evictions_predicted')} evictions)")
        if res.get("fit"):
            f = res["fit"]
            out.append(f"time model: t = {f['a']:.4f} + {f['b']:.3e}·uncached + {f['c']:.3e}·attention; "
                       f"held-out median abs error {100 * res['time_median_abs_err']:.1f} %")
        if res.get("saved_s_measured") is not None:
            out.append(f"seconds saved: predicted {res['saved_s_predicted']:.2f}, measured "
                       f"{res['saved_s_measured']:.2f} (cold {res['time_cold_s']:.2f} s, warm {res['time_warm_s']:.2f} s)")
    if res.get("error"):
        out.append(f"ERROR{' (partial results)' if res['requests'] else ''}: {res['error']}")
    return out

