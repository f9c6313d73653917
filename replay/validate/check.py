"""Check the cache predictions against a real engine: mlx-lm's server.

:func:`validate` samples whole streams (sessions) of logged requests, starts
``python -m mlx_lm.server`` on 127.0.0.1, replays the sample one request at a
time in time order with ``max_tokens=1`` and temperature 0, and compares

* the server's ``usage.prompt_tokens`` with replay's token count (the server
  must see exactly the tokens replay counted);
* its ``usage.prompt_tokens_details.cached_tokens`` with the ``mlx-lm``
  profile's prediction (:func:`replay.profiles_mlx.simulate_mlx`, fed the token
  the server generated for each earlier request — mlx-lm keys an entry on
  prompt + generated tokens);
* the request times with a prefill-time model
  ``t ≈ a + b·uncached + c·attention`` (attention = query·key pairs computed
  for the uncached tokens, ``Σ_{i=hit}^{n-1} (i+1)``) fitted by least squares on
  half of the observations and checked on the other half;
* seconds saved: predicted (the fitted model at zero reuse minus at the
  predicted reuse) against measured (a second, cold pass of the same sample on
  a server with ``--prompt-cache-size 0``, minus the warm pass);
* the ``ideal`` ceiling (longest common prefix with any earlier sampled prompt,
  infinite cache) for the same sample.

Requests are sent as described in :mod:`replay.mlx_model`: to the default
random-weight model as ``replay:<marker>`` pieces through the chat endpoint
(its chat template renders the neutral template exactly); to a user's model
(``model=DIR``) as the neutral rendering's text through ``/v1/completions``,
tokenized by that model's own tokenizer (computed here with mlx-lm's
``load_tokenizer``, the server's code path), so replay's DeepSeek-V4 counts do
not apply and the timing coefficients belong to that model.

The server is always stopped (its whole process group), also on errors and
Ctrl-C; failures come back in the result's ``error`` with ``partial=True`` and
whatever was measured so far.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replay.core.times import seconds
from replay.prepare import prepare
from replay.providers.mlx_cache import ideal_lcp, simulate_mlx
from replay.store import db
from replay.text import render
from replay.text.tokenize import load_prompt_tokens
from replay.validate.mlx_model import build_random_model, kv_bytes_per_token, raw_messages, tokenizer_files

INSTALL_HINT = "pip install 'prefix-replay[mlx]'"
TEXT_FORMATS = ("anthropic", "openai", "trajectory")
WARMUP_TEXT = "warm-up request sent by replay validate"


class ValidationError(RuntimeError):
    """A failure with a message meant for the user."""


# ------------------------------------------------------------------ availability

def mlx_available() -> str | None:
    """None when mlx and mlx-lm import, else the message to show."""
    missing = [m for m in ("mlx", "mlx_lm") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"{' and '.join(missing)} not installed; install the extra: {INSTALL_HINT}")
    return None


# ------------------------------------------------------------------ ports and server

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class MlxServer:
    """``python -m mlx_lm.server`` as a child process in its own process group."""
    model: str
    port: int | None = None
    host: str = "127.0.0.1"
    prompt_cache_size: int | None = 10
    prompt_cache_bytes: int | None = None
    startup_timeout_s: float = 180.0
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "mlx_lm.server", "--model", str(self.model),
               "--host", self.host, "--port", str(self.port), "--log-level", "WARNING"]
        if self.prompt_cache_size is not None:
            cmd += ["--prompt-cache-size", str(self.prompt_cache_size)]
        if self.prompt_cache_bytes is not None:
            cmd += ["--prompt-cache-bytes", str(self.prompt_cache_bytes)]
        return cmd + list(self.extra_args)

    def log_tail(self, n: int = 15) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 20000))
            lines = f.read().decode("utf-8", "replace").splitlines()
        lines = [ln for ln in lines if "UserWarning" not in ln and "warnings.warn" not in ln
                 and "is deprecated" not in ln]
        return "\n".join(lines[-n:])

    def start(self) -> "MlxServer":
        if self.port is None:
            self.port = free_port(self.host)
        elif not port_is_free(self.port, self.host):
            raise ValidationError(f"port {self.port} on {self.host} is already in use; "
                                  "pass another port or none to pick a free one")
        fd, self.log_path = tempfile.mkstemp(prefix="replay-mlx-server-", suffix=".log")
        log = os.fdopen(fd, "w")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ValidationError(f"mlx_lm.server exited with code {code} while starting "
                                      f"(model {self.model}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()).get("status") == "ok":
                        return self
            except urllib.error.HTTPError as e:
                if e.code == 503:  # the generation thread died: the model failed to load
                    time.sleep(0.5)
                    raise ValidationError(
                        f"mlx_lm.server started but its model failed to load "
                        f"(model {self.model}):\n{self.log_tail()}") from None
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ValidationError(f"mlx_lm.server did not become ready within "
                                      f"{self.startup_timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.25)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after 5 s."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # whatever happened to the leader, make sure nothing of its group is left
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.poll() is None:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def cleanup_log(self) -> None:
        if self.log_path and os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    # -------------------------------------------------------------- requests
    def post(self, path: str, body: dict, timeout_s: float) -> tuple[dict, float]:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                payload = r.read()
        except (TimeoutError, socket.timeout):
            raise ValidationError(f"request timed out after {timeout_s:g} s") from None
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:500]
            raise ValidationError(f"mlx_lm.server answered HTTP {e.code}: {detail}\n"
                                  f"{self.log_tail()}") from None
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise ValidationError(f"request timed out after {timeout_s:g} s") from None
            time.sleep(0.2)
            if not self.alive():
                code = self.proc.poll() if self.proc else None
                raise ValidationError(f"mlx_lm.server died mid-run (exit code {code}):\n"
                                      f"{self.log_tail()}") from None
            raise ValidationError(f"request failed: {reason}") from None
        dt = time.perf_counter() - t0
        return json.loads(payload), dt


# ------------------------------------------------------------------ sampling

@dataclass
class Item:
    request_id: int
    ts: int  # µs
    stream: str
    fmt: str
    body: dict
    tokens: np.ndarray | None = None   # what the server must see
    replay_n_tokens: int | None = None


def _stream(tenant, key, session) -> str:
    if session is not None:
        return f"session:{session}"
    if key is not None:
        return f"key:{key}"
    return f"tenant:{tenant}"


def _replay_tokens(con, ids: list[int]) -> tuple[dict[int, np.ndarray], str]:
    """Replay's token arrays for ``ids``: the tokenize stage's (``prompts`` /
    ``segments`` via :func:`replay.tokenize.load_prompt_tokens`) when present,
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


def _fallback_tokenize(pieces) -> np.ndarray:
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
                t = _fallback_tokenize(render.render_request(it.body, it.fmt))
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


# ------------------------------------------------------------------ time model

def attention_work(n: int, hit: int) -> float:
    """Query·key pairs computed for positions hit..n-1 (causal): Σ (i+1)."""
    return (n * (n + 1) - hit * (hit + 1)) / 2.0


def fit_time_model(n: np.ndarray, hit: np.ndarray, t: np.ndarray) -> dict:
    """Least squares on *relative* residuals (rows divided by the measured
    time): the check is a relative error, and cold requests would otherwise
    dominate the fit by their size."""
    n = np.asarray(n, dtype=float)
    hit = np.asarray(hit, dtype=float)
    t = np.asarray(t, dtype=float)
    X = np.column_stack([np.ones(len(n)), n - hit, (n * (n + 1) - hit * (hit + 1)) / 2.0])
    w = 1.0 / np.maximum(t, 1e-9)
    coef, *_ = np.linalg.lstsq(X * w[:, None], t * w, rcond=None)
    return {"a": float(coef[0]), "b": float(coef[1]), "c": float(coef[2])}


def predict_time(fit: dict, n, hit) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    hit = np.asarray(hit, dtype=float)
    return fit["a"] + fit["b"] * (n - hit) + fit["c"] * (n * (n + 1) - hit * (hit + 1)) / 2.0


# ------------------------------------------------------------------ the run

def _request_body(item: Item, user_model: bool) -> tuple[str, dict]:
    pieces = render.render_request(item.body, item.fmt)
    common = {"max_tokens": 1, "temperature": 0.0, "logprobs": True}
    if user_model:
        return "/v1/completions", {"prompt": render.render_text(pieces), **common}
    return "/v1/chat/completions", {"messages": raw_messages(pieces), **common}


def _warmup_body(user_model: bool) -> tuple[str, dict, list]:
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


def _replay_pass(server: MlxServer, items: list[Item], user_model: bool, timeout_s: float,
                 progress: bool, label: str, records: list[dict]) -> None:
    """Send the warm-up, then every item; append one record per answered request."""
    path, body, _ = _warmup_body(user_model)
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


def _empty_result(model, model_kind, sampled=None, error=None) -> dict:
    return {"model": model, "model_kind": model_kind, "requests": 0, "cached_exact": 0,
            "cached_exact_share": None, "cached_predicted_tokens": 0, "cached_reported_tokens": 0,
            "prompt_tokens": 0, "prompt_tokens_match": None, "time_median_abs_err": None,
            "time_median_abs_err_warm": None,
            "saved_s_predicted": None, "saved_s_measured": None, "ideal_ceiling_tokens": 0,
            "fit": None, "per_request": [], "sampled": sampled, "partial": error is not None,
            "error": error, "prompt_cache_size": None, "prompt_cache_bytes": None,
            "cold_pass": None, "evictions_predicted": None, "notes": []}


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
    prepare(con, modes=(), tokenizer=tokenizer, progress=progress)
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
        # --- model
        if model is None:
            model_dir = build_random_model(model_cache_dir)
        else:
            model_dir = Path(model)
            if not model_dir.exists():
                raise ValidationError(f"model directory {model} does not exist")
        res["model"] = str(model_dir)
        try:
            bpt = kv_bytes_per_token(model_dir)
        except Exception:
            bpt = 0
        if prompt_cache_bytes is not None and bpt <= 0:
            raise ValidationError("--prompt-cache-bytes needs the model's KV size per token "
                                  "(config.json could not be read)")

        # --- sample and tokens
        user_tok = None
        if model_kind == "user":
            from mlx_lm.utils import load_tokenizer
            user_tok = load_tokenizer(model_dir)

        def tokens_for(cand: list[Item]) -> dict[int, np.ndarray]:
            if user_tok is not None:
                return {it.request_id: np.asarray(user_tok.encode(
                    render.render_text(render.render_request(it.body, it.fmt))), dtype=np.int64)
                    for it in cand}
            toks, _src = _replay_tokens(con, [it.request_id for it in cand])
            return toks

        items, info = choose_sample(con, sample, max_prompt_tokens, seed, tokens_for)
        if model_kind == "user":
            info["tokens"] = "the model's own tokenizer (mlx-lm load_tokenizer), /v1/completions"
        else:
            src = _replay_tokens(con, [it.request_id for it in items[:1]])[1] if items else "-"
            info["tokens"] = f"replay's DeepSeek-V4 tokens ({src}); chat endpoint, replay:<marker> pieces"
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
            _replay_pass(server, items, model_kind == "user", timeout_s, progress, label, sink)
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
    _summarise(res, items, warm, cold, prompt_cache_size, prompt_cache_bytes, bpt_or0(res, model))
    res["partial"] = res["error"] is not None
    return res


def bpt_or0(res, model) -> int:
    try:
        return kv_bytes_per_token(res["model"]) if res.get("model") else 0
    except Exception:
        return 0


def _summarise(res: dict, items: list[Item], warm: list[dict], cold: list[dict],
               cache_size, cache_bytes, bpt: int) -> None:
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

    # --- time model: observations from both passes, alternate split by request
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
    if all(q["cold_time_s"] is not None for q in per):
        res["saved_s_measured"] = float(sum(q["cold_time_s"] - q["time_s"] for q in per))
        res["time_cold_s"] = float(sum(q["cold_time_s"] for q in per))
        res["time_warm_s"] = float(sum(q["time_s"] for q in per))
    res["notes"] = [
        f"model_kind={res['model_kind']}: timing coefficients belong to {res['model']} on this machine",
        "predictions: mlx-lm profile (replay/profiles_mlx.py) keyed on prompt + the token the "
        "server generated; the warm-up request is part of the simulated cache",
    ]


def _warmup_tokens(res: dict, wu: dict) -> np.ndarray:
    _path, _body, pieces = _warmup_body(res["model_kind"] == "user")
    if res["model_kind"] == "user":
        from mlx_lm.utils import load_tokenizer
        tok = load_tokenizer(Path(res["model"]))
        return np.asarray(tok.encode(render.render_text(pieces)), dtype=np.int64)
    t = _fallback_tokenize(pieces)
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


# --------------------------------------------------------------------------- report

def store_result(con, res: dict) -> None:
    """Keep the last validation in the database so `replay report` can show it."""

    db.set_meta(con, "validation", json.dumps(res, default=float))


def load_result(con) -> dict | None:

    raw = db.get_meta(con, "validation")
    return json.loads(raw) if raw else None


def verdict(res: dict) -> str:
    if res.get("error") and not res.get("requests"):
        return f"not validated: {res['error']}"
    exact, err = res.get("cached_exact_share"), res.get("time_median_abs_err")
    parts = []
    if exact is not None:
        parts.append(("the cache prediction holds" if exact >= 0.99 else "the cache prediction is off")
                     + f" ({100 * exact:.1f} % of requests exact)")
    if err is not None:
        parts.append(("the prefill-time model holds" if err <= 0.10 else "the prefill-time model is off")
                     + f" (held-out median error {100 * err:.1f} %)")
    return "; ".join(parts) + ("" if not res.get("error") else f"; partial run: {res['error']}")


def validation_section(con, out_dir) -> str:
    """Markdown + a scatter plot: predicted against measured cached tokens and times."""
    res = load_result(con)
    if not res:
        return ("## Validation against a real engine\n\nNot run for this database: "
                "`replay validate --sample 40` replays a sample through mlx-lm's server "
                "(needs the `mlx` extra).\n")
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = [r for r in res.get("per_request") or [] if r.get("cached_reported") is not None]
    img = ""
    if per:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
        pc = [r["cached_predicted"] for r in per]
        rc = [r["cached_reported"] for r in per]
        axes[0].scatter(pc, rc, s=12)
        hi = max(pc + rc + [1])
        axes[0].plot([0, hi], [0, hi], color="grey", lw=0.8)
        axes[0].set_xlabel("predicted cached tokens (mlx-lm profile)")
        axes[0].set_ylabel("reported cached tokens")
        tp = [(r.get("time_predicted_s"), r.get("time_s")) for r in per
              if r.get("time_predicted_s") is not None and r.get("time_s") is not None]
        if tp:
            x, y = zip(*tp)
            axes[1].scatter(x, y, s=12)
            m = max(x + y)
            axes[1].plot([0, m], [0, m], color="grey", lw=0.8)
        axes[1].set_xlabel("predicted prefill time (s)")
        axes[1].set_ylabel("measured time to first token (s)")
        fig.tight_layout()
        fig.savefig(Path(out_dir) / "validation.png", dpi=110)
        plt.close(fig)
        img = "![validation](validation.png)\n"
    fit = res.get("fit") or {}
    lines = ["## Validation against a real engine", "",
             f"**Verdict: {verdict(res)}.**", "",
             f"Model: `{res.get('model')}` ({res.get('model_kind')}); {res.get('requests')} requests sampled "
             f"as whole streams, replayed in time order with `max_tokens=1`; "
             f"prompt cache size {res.get('prompt_cache_size')}.", ""]
    if res.get("requests"):
        lines += [
            f"- Cached tokens: predicted {res['cached_predicted_tokens']:,}, reported "
            f"{res['cached_reported_tokens']:,}; exact for {res['cached_exact']} of {res['requests']} requests.",
            f"- Server prompt tokens equal replay's for {100 * res['prompt_tokens_match']:.1f} % of requests.",
            f"- Ideal ceiling (unbounded cache) for the same sample: {res['ideal_ceiling_tokens']:,} tokens — "
            "what the engine's small cache leaves on the table is the difference.",
        ]
        if fit:
            lines.append(f"- Prefill time ≈ {fit['a']:.3f} s + {fit['b']:.2e} s·uncached + "
                         f"{fit['c']:.2e} s·attention work (fitted on half, checked on the other half: median "
                         f"error {100 * (res.get('time_median_abs_err') or 0):.1f} %). "
                         f"{fit.get('belongs_to', 'The coefficients belong to this model on this machine.')}")
        if res.get("saved_s_measured") is not None:
            lines.append(f"- Prefill seconds saved by the cache: predicted {res['saved_s_predicted']:.1f} s, "
                         f"measured {res['saved_s_measured']:.1f} s.")
    return "\n".join(lines + ["", img])
