"""Near duplicates (``replay.analysis.near``): the search equals a brute-force
reading of the contract with a stand-in embedding; the packaged model loads and
runs with the network unavailable; no prompt text in any output."""

import json
import math
import random
import socket

import numpy as np
import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis import near as N
from replay.cli.main import main
from replay.core.streams import stream_key

MODES = ("tenant", "key", "session", "global")


def _vector(text: str) -> np.ndarray:
    """A stand-in embedding: texts 'q<k>-<m>' are noisy copies of topic k's vector."""
    k, m = text.split("-")
    base = np.random.default_rng(int(k[1:])).normal(size=16)
    noise = np.random.default_rng(1000 + int(k[1:]) * 100 + int(m)).normal(size=16)
    v = base + 0.25 * int(m) * noise
    return v / np.linalg.norm(v)


def _embed(texts):
    return np.array([_vector(t) for t in texts], dtype=np.float32).reshape(len(texts), -1)


def _log(path, seed, n=70):
    rng = random.Random(seed)
    reqs, t = [], 1_794_000_000_000
    for _ in range(n):
        t += rng.choice([0, 0, 1, 2, 5, 30]) * 1000  # ms
        text = f"q{rng.randrange(6)}-{rng.randrange(4)}" if rng.random() < 0.9 else ""
        reqs.append(dict(ts=t, tenant=rng.choice("ab"), key=rng.choice([None, "k1"]),
                         session=rng.choice([None, "s1", "s2"]), model=rng.choice(["m1", "m2"]), text=text))
    order = list(range(n))
    rng.shuffle(order)  # input order is not time order
    with open(path, "w") as f:
        for i in order:
            r = reqs[i]
            msgs = [{"role": "system", "content": "sys"}] + ([{"role": "user", "content": r["text"]}] if r["text"]
                                                               else [{"role": "assistant", "content": "x"}])
            rec = {"timestamp": r["ts"] / 1000, "tenant": r["tenant"], "session": r["session"],
                   "prompt_cache_key": r["key"], "request": {"model": r["model"], "messages": msgs}}
            f.write(json.dumps(rec) + "\n")
    return [reqs[i] for i in sorted(range(n), key=lambda i: (reqs[i]["ts"], order.index(i)))]


def _oracle(reqs, mode, ttl_us, th):
    near = 0
    for i, r in enumerate(reqs):
        if not r["text"]:
            continue
        me = (stream_key(mode, r["tenant"], r["key"], r["session"]), r["model"])
        for q in reqs[:i]:
            if q["text"] and (stream_key(mode, q["tenant"], q["key"], q["session"]), q["model"]) == me \
                    and (r["ts"] - q["ts"]) * 1000 <= ttl_us \
                    and float(_vector(r["text"]) @ _vector(q["text"])) >= th - 1e-6:
                near += 1
                break
    return near


@pytest.mark.parametrize("seed", range(4))
def test_near_duplicates_equal_the_contract(tmp_path, seed, monkeypatch):
    monkeypatch.setattr(N, "ROWS_PER_BLOCK", 7)  # several blocks per group
    reqs = _log(tmp_path / "log.jsonl", seed)
    con = api.open_db(tmp_path / "n.duckdb")
    api.ingest(con, [str(tmp_path / "log.jsonl")])
    ttls = (0.0, 2.0, 5.0, math.inf)
    df = N.near_duplicates(con, ttls=ttls, streams=MODES, thresholds=(0.5, 0.8, 0.9, 0.99), embed=_embed)
    assert len(df) == 4 * 4 * 4
    for r in df.iter_rows(named=True):
        ttl = 2**63 - 1 if r["ttl_s"] is None else round(r["ttl_s"] * 1e6)
        assert r["near_requests"] == _oracle(reqs, r["stream"], ttl, r["threshold"]), r
        assert r["requests"] == len(reqs) and r["labelled_precision"] is None
    assert df["near_requests"].max() > 0 and df["near_requests"].min() < df["near_requests"].max()


def test_the_last_user_turn():
    assert N.last_user_text({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                          {"role": "user", "content": [{"type": "text", "text": "c"},
                                                                       {"type": "image"}]}]}) == "c"
    tool_only = {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "out"}]}]}]}
    assert N.last_user_text(tool_only) == "out"
    assert N.last_user_text({"messages": [{"role": "system", "content": "s"}]}) == ""
    assert N.last_user_text({}) == ""


def test_the_packaged_model_runs_without_the_network(monkeypatch):
    pytest.importorskip("wordllama")

    def no_network(*a, **k):
        raise OSError("network unavailable in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    embed = N.load_embedder()
    v = embed(["How do I reset my password?", "How can I reset my password?", "What is the weather on Mars?"])
    assert v.shape == (3, 256) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)
    assert v[0] @ v[1] > 0.95 > v[0] @ v[2]


def test_the_cli_gives_near_rows_and_no_text(tmp_path):
    pytest.importorskip("wordllama")
    log = tmp_path / "chat.jsonl"
    with open(log, "w") as f:
        for i, q in enumerate(["How do I reset my password?", "How can I reset my password?",
                               "What is the weather on Mars?"]):
            f.write(json.dumps({"timestamp": 1794813649 + i, "tenant": "t",
                                "request": {"model": "m", "messages": [{"role": "user", "content": q}]}}) + "\n")
    res = CliRunner().invoke(main, ["duplicates", str(log), "--db", str(tmp_path / "c.duckdb"), "--ttl", "inf",
                                    "--stream", "tenant", "--threshold", "0.95", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["model"] == N.MODEL_NAME
    assert out["near"] == [{"stream": "tenant", "ttl_s": None, "threshold": 0.95, "requests": 3, "near_requests": 1,
                            "near_share": pytest.approx(1 / 3), "labelled_precision": None, "adjusted_share": None}]
    assert "password" not in res.output and "Mars" not in res.output
