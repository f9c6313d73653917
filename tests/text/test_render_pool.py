"""The tokenize stage with its rendering shared by processes (``workers``):
the same tables as one process (the oracle), no helper left behind."""

from __future__ import annotations

import os
import signal

import pytest

from replay import api
from replay.text import render_pool, tokenize
from replay.text.tok import load_tokenizer
from support.logs import mixed_logs, planted_logs
from support.paths import ROOT

V31 = ROOT / "bench" / "templates" / "tool_chat_template_deepseekv31.jinja"
TABLES = {"segments": "seg_id, n_tokens, tokens", "set_aside": "request_id, stage, reason, detail",
          "prompts": "request_id, n_tokens, seg_ids, seg_parts, output_seg_ids, output_n_tokens"}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    d = mixed_logs(tmp_path_factory.mktemp("pool") / "logs")
    planted_logs(d, seed=3, sessions=2, turns=4)
    return d


def _prepared(logs, tmp_path, tok, name: str):
    con = api.open_db(str(tmp_path / f"{name}.duckdb"))
    api.ingest(con, [str(logs)], tokenizer=tok)
    return con


def _tables(con) -> dict:
    return {t: con.execute(f"SELECT {c} FROM {t} ORDER BY ALL").fetchall() for t, c in TABLES.items()}


class _Spy:
    """Every pool made, to look at its helpers afterwards."""

    def __init__(self, monkeypatch):
        self.pools = []
        real = render_pool.RenderPool

        def made(workers):
            pool = real(workers)
            self.pools.append((pool, [p for p, _ in pool.helpers]))
            return pool

        monkeypatch.setattr(render_pool, "RenderPool", made)

    def procs(self):
        return [p for _, procs in self.pools for p in procs]


@pytest.mark.parametrize("how", ["neutral", "neutral-inline", "deepseek", "template"])
def test_two_workers_give_the_same_tables_as_one(logs, tmp_path, monkeypatch, how):
    spy = _Spy(monkeypatch)
    if how == "neutral-inline":  # no encoder process: every body part is rendered by the stage
        monkeypatch.setenv("REPLAY_ENCODER", "inline")
    got = []
    for workers in (1, 2):
        tok = load_tokenizer(render="deepseek" if how == "deepseek" else None,
                             template=V31 if how == "template" else None)
        try:
            con = _prepared(logs, tmp_path, tok, f"w{workers}")
            s = tokenize.tokenize_stage(con, tok, chunk_requests=40, workers=workers)
            assert s.new_prompts > 100
            got.append(_tables(con))
            con.close()
        finally:
            tok.close()
    assert got[0] == got[1]
    assert len(spy.pools) == 1 and len(spy.procs()) == 1
    assert all(p.poll() is not None for p in spy.procs())  # none outlives the stage


def test_ctrl_c_leaves_no_helper_and_the_next_run_completes(logs, tmp_path, monkeypatch):
    tok = load_tokenizer()
    try:
        oracle = _prepared(logs, tmp_path, tok, "oracle")
        tokenize.tokenize_stage(oracle, tok, chunk_requests=40)
        con = _prepared(logs, tmp_path, tok, "stopped")
        spy = _Spy(monkeypatch)
        real, calls = tokenize._Run._store, []

        def interrupted(self, *a):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real(self, *a)

        monkeypatch.setattr(tokenize._Run, "_store", interrupted)
        with pytest.raises(KeyboardInterrupt):
            tokenize.tokenize_stage(con, tok, chunk_requests=40, workers=2)
        assert spy.procs() and all(p.poll() is not None for p in spy.procs())
        monkeypatch.setattr(tokenize._Run, "_store", real)
        tokenize.tokenize_stage(con, tok, chunk_requests=40, workers=2)
        assert _tables(con) == _tables(oracle)
    finally:
        tok.close()


def test_a_crashing_helper_is_a_clear_error_and_the_next_run_redoes_it(logs, tmp_path, monkeypatch):
    tok = load_tokenizer(render="deepseek")  # (every body rendered by the stage: the helpers have work)
    try:
        oracle = _prepared(logs, tmp_path, tok, "oracle")
        tokenize.tokenize_stage(oracle, tok, chunk_requests=40)
        con = _prepared(logs, tmp_path, tok, "crashed")
        real = render_pool.RenderPool.render

        def killed_first(self, render, items):
            for proc, _ in self.helpers:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            return real(self, render, items)

        monkeypatch.setattr(render_pool.RenderPool, "render", killed_first)
        with pytest.raises(render_pool.WorkerFailed, match="rendering helper 1 ended unexpectedly.*redoes it"):
            tokenize.tokenize_stage(con, tok, chunk_requests=40, workers=2)
        monkeypatch.setattr(render_pool.RenderPool, "render", real)
        assert tokenize.tokenize_needed(con)
        tokenize.tokenize_stage(con, tok, chunk_requests=40, workers=2)
        assert _tables(con) == _tables(oracle)
    finally:
        tok.close()
