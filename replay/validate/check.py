"""Check the cache predictions against a real engine: mlx-lm's server.

:func:`validate` samples whole streams (sessions) of logged requests
(:mod:`replay.validate.sample`), starts ``python -m mlx_lm.server`` on
127.0.0.1 (:mod:`replay.validate.server`), replays the sample one request at a
time in time order with ``max_tokens=1`` and temperature 0
(:mod:`replay.validate.passes`), and compares (:mod:`replay.validate.summary`)

* the server's ``usage.prompt_tokens`` with replay's token count (the server
  must see exactly the tokens replay counted);
* its ``usage.prompt_tokens_details.cached_tokens`` with the ``mlx-lm``
  profile's prediction (:func:`replay.providers.mlx_cache.simulate_mlx`, fed
  the token the server generated for each earlier request — mlx-lm keys an
  entry on prompt + generated tokens);
* the request times with a prefill-time model (:mod:`replay.validate.timing`)
  fitted by least squares on half of the observations and checked on the other
  half;
* seconds saved: predicted (the fitted model at zero reuse minus at the
  predicted reuse) against measured (a second, cold pass of the same sample on
  a server with ``--prompt-cache-size 0``, minus the warm pass);
* the ``ideal`` ceiling (longest common prefix with any earlier sampled prompt,
  infinite cache) for the same sample.

The default model is a random-weight one (:mod:`replay.validate.mlx_model`);
with ``model=DIR`` the requests are tokenized by that model's own tokenizer,
so replay's DeepSeek-V4 counts do not apply and the timing coefficients belong
to that model.

The server is always stopped (its whole process group), also on errors and
Ctrl-C; failures come back in the result's ``error`` with ``partial=True`` and
whatever was measured so far.

This module is where validation is imported from: :func:`validate`,
:func:`summary_lines`, and :func:`store_result` / :func:`validation_section`
(:mod:`replay.validate.report`) for `replay report`; the pieces' public names
are re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from replay.prepare import as_tokenizer, prepare
from replay.validate.mlx_model import build_random_model, kv_bytes_per_token
# the names marked noqa are re-exported: replay.api and the tests import from this module
from replay.validate.passes import WARMUP_TEXT, replay_pass  # noqa: F401
from replay.validate.report import load_result, store_result, validation_section, verdict  # noqa: F401
from replay.validate.sample import TEXT_FORMATS, Item, choose_sample, sample_for_model  # noqa: F401
from replay.validate.server import (INSTALL_HINT, MlxServer, ValidationError, free_port,  # noqa: F401
                                    mlx_available, port_is_free)
from replay.validate.summary import bpt_or0, summarise, summary_lines  # noqa: F401
from replay.validate.timing import attention_work, fit_time_model, predict_time  # noqa: F401


def _empty_result(model, model_kind, sampled=None, error=None) -> dict:
    return {"model": model, "model_kind": model_kind, "requests": 0, "cached_exact": 0,
            "cached_exact_share": None, "cached_predicted_tokens": 0, "cached_reported_tokens": 0,
            "prompt_tokens": 0, "prompt_tokens_match": None, "time_median_abs_err": None,
            "time_median_abs_err_warm": None,
            "saved_s_predicted": None, "saved_s_measured": None, "ideal_ceiling_tokens": 0,
            "fit": None, "per_request": [], "sampled": sampled, "partial": error is not None,
            "error": error, "prompt_cache_size": None, "prompt_cache_bytes": None,
            "cold_pass": None, "evictions_predicted": None, "notes": []}


def _model_dir(model: str | None, model_cache_dir: str | None) -> Path:
    """The user's model directory, else the random-weight model (built once
    into ``model_cache_dir``)."""
    if model is None:
        return build_random_model(model_cache_dir)
    model_dir = Path(model)
    if not model_dir.exists():
        raise ValidationError(f"model directory {model} does not exist")
    return model_dir


def _check_cache_bytes(model_dir: Path, prompt_cache_bytes: int | None) -> None:
    """A byte budget is predicted from the model's KV size per token, so that
    size must be readable."""
    try:
        bpt = kv_bytes_per_token(model_dir)
    except Exception:
        bpt = 0
    if prompt_cache_bytes is not None and bpt <= 0:
        raise ValidationError("--prompt-cache-bytes needs the model's KV size per token "
                              "(config.json could not be read)")


def validate(con, sample: int, model: str | None = None, prompt_cache_size: int | None = 10,
             prompt_cache_bytes: int | None = None, max_prompt_tokens: int = 8000, seed: int = 0,
             timeout_s: float = 300.0, progress: bool = False, port: int | None = None,
             cold_pass: bool = True, startup_timeout_s: float = 180.0,
             model_cache_dir: str | None = None, tokenizer=None) -> dict:
    """Replay a sample through mlx-lm's server; compare with the mlx-lm profile.

    The requests are tokenized first when they are not (``replay.prepare``).
    Returns a dict (see the module docstring and ``docs``); ``error`` is None
    on success, else a message, with ``partial=True`` and what was measured.
    """
    tok = as_tokenizer(tokenizer)
    prepare(con, modes=(), tokenizer=tok, progress=progress)
    model_kind = "user" if model else "random-weights"
    res = _empty_result(model, model_kind)
    res["prompt_cache_size"] = prompt_cache_size
    res["prompt_cache_bytes"] = prompt_cache_bytes
    msg = mlx_available()
    if msg:
        res["error"] = msg
        res["partial"] = True
        return res
    server: MlxServer | None = None
    items: list[Item] = []
    warm: list[dict] = []
    cold: list[dict] = []
    try:
        model_dir = _model_dir(model, model_cache_dir)
        res["model"] = str(model_dir)
        _check_cache_bytes(model_dir, prompt_cache_bytes)
        items, info = sample_for_model(con, sample, max_prompt_tokens, seed, model_dir,
                                       model_kind == "user", tok.template)
        res["sampled"] = info
        if not items:
            raise ValidationError(
                f"nothing to validate: no text request within {max_prompt_tokens} tokens "
                f"(skipped: {info['skipped']})")

        # the warm pass is the cache under test; the cold pass (same requests, no
        # cache) measures what the cache saved
        passes = [("warm", {"prompt_cache_size": prompt_cache_size, "prompt_cache_bytes": prompt_cache_bytes},
                   warm)]
        if cold_pass:
            passes.append(("cold", {"prompt_cache_size": 0}, cold))
        for label, cache, sink in passes:
            server = MlxServer(str(model_dir), port=port, startup_timeout_s=startup_timeout_s, **cache)
            server.start()
            replay_pass(server, items, model_kind == "user", timeout_s, progress, label, sink)
            server.stop()
            server.cleanup_log()
            server = None
    except ValidationError as e:
        res["error"] = str(e)
    except KeyboardInterrupt:
        res["error"] = "interrupted (Ctrl-C); the server was stopped"
    except Exception as e:  # keep partial results whatever happened
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        if server is not None:
            server.stop()
            if server.log_path and res.get("error") is None:
                server.cleanup_log()
            elif server.log_path:
                res["server_log"] = server.log_path
    summarise(res, items, warm, cold, prompt_cache_size, prompt_cache_bytes, bpt_or0(res, model))
    res["partial"] = res["error"] is not None
    return res
