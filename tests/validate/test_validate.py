"""`replay validate` against a real mlx-lm server (skipped when mlx-lm is absent).

A small end-to-end validation (random-weight model, DeepSeek-V4 tokenizer,
~15 requests under 1,000 tokens, a prompt cache small enough to evict), and the
failure modes with a server that is really started and really stopped.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess

import numpy as np
import pytest

pytest.importorskip("mlx_lm")

from replay.store import db  # noqa: E402
from replay.validate import check as V  # noqa: E402
from replay.validate.mlx_model import build_random_model, raw_messages  # noqa: E402
from support.paths import SAMPLE  # noqa: E402

pytestmark = pytest.mark.mlx

VOCAB = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi "
         "omicron pi rho sigma tau upsilon phi chi psi omega").split()


def synthetic_db(n_sessions: int = 3, turns: int = 5, seed: int = 0, words: int = 50):
    """Agent-like anthropic sessions, interleaved in time: shared tools, a
    shared system prompt (a list of two blocks in one session), growing
    conversations with tool calls and tool results."""
    rng = random.Random(seed)
    say = lambda n: " ".join(rng.choice(VOCAB) for _ in range(n))  # noqa: E731
    system = "You are a careful assistant. " + say(120)
    tools = [{"name": "bash", "description": "run a command ü",
              "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
    rows = []
    for s in range(n_sessions):
        msgs: list[dict] = []
        for k in range(turns):
            msgs.append({"role": "user", "content": [{"type": "text", "text": f"task {s}.{k}: " + say(words)}]})
            sys_ = system if s != 2 else [{"type": "text", "text": system}, {"type": "text", "text": "extra"}]
            body = {"model": "m", "tools": tools, "system": sys_, "messages": list(msgs)}
            rows.append((s * 1.5 + 4 * k, f"sess{s}", json.dumps(body, separators=(",", ":"), ensure_ascii=False)))
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": "ok " + say(15)},
                {"type": "tool_use", "id": f"t{k}", "name": "bash", "input": {"cmd": "ls"}}]})
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{k}", "content": "file.txt"},
                {"type": "text", "text": say(5)}]})
    rows.sort()
    con = db.connect(None)
    for i, (ts, sess, body) in enumerate(rows):
        con.execute("INSERT INTO requests (request_id, source_id, line_no, format, ts_us, tenant, session, body) "
                    "VALUES (?,?,?,?,?,?,?,?)", [i, 1, i + 1, "anthropic", int(ts * 1_000_000), "default", sess, body])
    from replay.text.tok import load_tokenizer
    from replay.text.tokenize import tokenize_stage
    tokenize_stage(con, load_tokenizer())
    return con


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_random_model(tmp_path_factory.mktemp("mlx") / "random-model"))


@pytest.fixture()
def servers(monkeypatch):
    """Record every server process group started, and check it is gone after."""
    started: list[int] = []
    orig = V.MlxServer.start

    def start(self):
        try:
            return orig(self)
        finally:
            if self.proc is not None:
                started.append(self.proc.pid)

    monkeypatch.setattr(V.MlxServer, "start", start)
    yield started
    for pgid in started:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def _no_server_for(model_dir: str) -> bool:
    out = subprocess.run(["pgrep", "-f", f"mlx_lm.server --model {model_dir}"],
                         capture_output=True, text=True)
    return out.stdout.strip() == ""


def test_chat_template_renders_the_neutral_template(model_dir):
    from mlx_lm.utils import load_tokenizer

    from replay.text.render import render_request
    from replay.text.tok import load_tokenizer as replay_tok

    tok = load_tokenizer(__import__("pathlib").Path(model_dir))
    rt = replay_tok()
    con = synthetic_db(turns=3)
    for (body,) in con.execute("SELECT body FROM request_bodies").fetchall():
        pieces = render_request(json.loads(body), "anthropic")
        from replay.text.render import render_text
        ours = rt.encode(render_text(pieces))
        theirs = tok.apply_chat_template(raw_messages(pieces), add_generation_prompt=True)
        assert theirs == ours
    # structured simple messages render the neutral template too
    body = {"tools": [{"name": "t", "description": "é", "parameters": {"a": 1}}],
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "yo"}]}
    pieces = render_request(body, "openai")
    assert tok.apply_chat_template(body["messages"], tools=body["tools"], add_generation_prompt=True) \
        == rt.encode(render_text(pieces))


def test_end_to_end_small_validation(model_dir, servers):
    con = synthetic_db()
    res = V.validate(con, sample=15, model=None, model_cache_dir=model_dir, prompt_cache_size=2,
                     max_prompt_tokens=1500, timeout_s=120)
    assert res["error"] is None, res["error"]
    assert res["model_kind"] == "random-weights"
    assert res["requests"] == 15
    assert res["prompt_tokens_match"] == 1.0
    assert res["cached_exact_share"] >= 0.99
    # eviction happened: the engine (and the prediction) got less than the ideal ceiling
    assert res["cached_reported_tokens"] < res["ideal_ceiling_tokens"]
    assert res["fit"] is not None and res["time_median_abs_err"] is not None
    assert res["saved_s_measured"] is not None and res["saved_s_predicted"] is not None
    assert all(q["cold_cached_reported"] == 0 for q in res["per_request"])
    assert res["sampled"]["streams"] == 3
    assert len(servers) == 2  # warm pass + cold pass
    assert _no_server_for(model_dir)


TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{% elif m.role == 'assistant' %}"
            "<｜Assistant｜>{% else %}<｜User｜>[{{ m.role }}] {% endif %}{{ m.content if m.content is string else "
            "m.content | tojson }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}"
            "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")


def test_a_chat_template_is_what_the_server_sees(model_dir, servers, tmp_path):
    """With --chat-template, each request goes as the template's text; the
    server's prompt_tokens equal the stored tokens and its cached tokens the
    prediction."""
    from replay import api

    tpl = tmp_path / "t.jinja"
    tpl.write_text(TEMPLATE)
    con = synthetic_db()
    res = V.validate(con, sample=8, model=None, model_cache_dir=model_dir, prompt_cache_size=2,
                     max_prompt_tokens=1500, timeout_s=120, cold_pass=False,
                     tokenizer=api.tokenizer_spec(None, None, str(tpl)))
    assert res["error"] is None, res["error"]
    assert "chat template" in res["sampled"]["tokens"]
    assert db.get_meta(con, "tokenizer").startswith("deepseek-v4+template=")
    assert res["requests"] == 8 and res["prompt_tokens_match"] == 1.0
    assert res["cached_exact_share"] >= 0.99
    assert _no_server_for(model_dir)


def test_a_byte_budget_is_predicted_exactly_on_the_shipped_sample(model_dir, servers):
    """mlx-lm's --prompt-cache-bytes (the budget holds ~2,900 tokens of this
    model's KV, so it evicts): every request's cached tokens as predicted."""
    from replay import api

    con = db.connect(None)
    api.ingest(con, [str(SAMPLE)])
    bpt = V.kv_bytes_per_token(model_dir)
    res = V.validate(con, sample=30, model_cache_dir=model_dir, prompt_cache_size=None,
                     prompt_cache_bytes=2900 * bpt, max_prompt_tokens=3000, timeout_s=300, cold_pass=False)
    assert res["error"] is None, res["error"]
    assert res["requests"] == 30 and res["prompt_tokens_match"] == 1.0
    assert res["cached_exact"] == 30
    assert res["evictions_predicted"] > 0
    assert 0 < res["cached_reported_tokens"] < res["ideal_ceiling_tokens"]
    assert _no_server_for(model_dir)


def test_mlx_missing_message(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("mlx", "mlx_lm") else real(name, *a))
    res = V.validate(db.connect(None), sample=3)
    assert res["partial"] and "prefix-replay[mlx]" in res["error"]


def test_bad_model_dir_fails_to_start(tmp_path, model_dir, servers):
    """A model directory whose tokenizer loads but whose model does not: the
    server really starts and fails; the error says so, nothing is left."""
    import shutil

    bad = tmp_path / "bad-model"
    bad.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(model_dir, f), bad / f)
    (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    con = synthetic_db(turns=1)
    res = V.validate(con, sample=2, model=str(bad), startup_timeout_s=120)
    assert res["partial"] and res["error"]
    assert "mlx_lm.server" in res["error"]
    assert len(servers) == 1  # it was really started
    assert _no_server_for(str(bad))


def test_port_taken(model_dir, servers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        res = V.validate(synthetic_db(turns=1), sample=2, model_cache_dir=model_dir, port=port)
    assert res["partial"] and "already in use" in res["error"]
    assert servers == []  # nothing was started


def test_server_killed_mid_run(model_dir, servers, monkeypatch):
    orig = V.MlxServer.post
    calls = {"n": 0}

    def post(self, path, body, timeout_s):
        calls["n"] += 1
        if calls["n"] == 5:  # warm-up + 3 requests answered, then the server dies
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        return orig(self, path, body, timeout_s)

    monkeypatch.setattr(V.MlxServer, "post", post)
    res = V.validate(synthetic_db(), sample=10, model_cache_dir=model_dir, prompt_cache_size=2)
    assert res["partial"] and "died mid-run" in res["error"]
    assert res["requests"] == 3  # partial results kept
    assert res["cached_exact"] == 3
    assert _no_server_for(model_dir)


def test_request_timeout(model_dir, servers):
    res = V.validate(synthetic_db(), sample=5, model_cache_dir=model_dir, timeout_s=0.01)
    assert res["partial"] and "timed out" in res["error"]
    assert _no_server_for(model_dir)


def test_prompt_over_budget_skipped(model_dir, servers):
    con = synthetic_db()
    res = V.validate(con, sample=5, model_cache_dir=model_dir, max_prompt_tokens=10)
    assert res["partial"] and "nothing to validate" in res["error"]
    assert res["sampled"]["skipped"]["over_budget"] == 15
    assert servers == []


def test_time_model_fit_recovers_coefficients():
    rng = np.random.default_rng(0)
    n = rng.integers(100, 4000, 50)
    hit = (n * rng.random(50)).astype(int)
    t = V.predict_time({"a": 0.2, "b": 1e-3, "c": 2e-8}, n, hit)
    fit = V.fit_time_model(n, hit, t)
    assert fit["a"] == pytest.approx(0.2, rel=1e-6)
    assert fit["b"] == pytest.approx(1e-3, rel=1e-6)
    assert fit["c"] == pytest.approx(2e-8, rel=1e-4)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_the_server_does_not_outlive_a_validate_command_killed_or_interrupted(tmp_path, model_dir, how):
    """The server runs in its own session (out of the terminal's Ctrl-C), so
    the command stops it on Ctrl-C, and the kernel kills it when the command
    itself is killed and cannot."""
    import time
    import uuid

    from support.procs import assert_no_leftovers, start, tagged

    tag = uuid.uuid4().hex
    p = start(["validate", SAMPLE, "--db", tmp_path / "v.duckdb", "--model", model_dir, "--sample", "30"], tag)
    deadline = time.monotonic() + 300
    server = []
    while not server and p.poll() is None and time.monotonic() < deadline:
        server = [pid for pid in tagged(tag) if b"mlx_lm.server" in open(f"/proc/{pid}/cmdline", "rb").read()]
        time.sleep(0.05)
    assert server, "the server was not seen"
    p.send_signal(getattr(signal, how))
    _, err = p.communicate(timeout=120)
    if how == "SIGINT":
        assert p.returncode != 0 and "Traceback" not in err, err
    assert_no_leftovers(tag, within_s=20)
    assert _no_server_for(model_dir)
