"""The tokenize stage with its rendering shared by worker processes (a
``FilePool``, ``blob_cache.render_shared``): the same tables as one process
(the oracle), no worker left behind, a dead worker a clear error."""

from __future__ import annotations

import pytest

from replay import api
from replay.distributed import WorkerFailed
from replay.distributed.file_pool import FilePool, local_pool
from replay.prepare import RENDER_THEN
from replay.text import blob_cache, tokenize
from replay.text.tok import load_tokenizer
from support.logs import mixed_logs, planted_logs
from support.ranges import dying_render

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


def render_pool(workers: int):
    """The pool ``prepare`` gives the stage (``local_pool`` with the rendering's wording)."""
    return local_pool(workers, failed=WorkerFailed, then=RENDER_THEN)


def _procs(pool: FilePool) -> list:
    return [w.proc for w in pool._procs]


def test_shares_come_back_in_order_as_rendered_here():
    items = [("part", "message", '{"role": "user", "content": "hello %d"}' % i) for i in range(7)]
    items += [("part", "message", "{not json"), ("body", "openai", None, None)]
    with FilePool(3) as pool:
        assert blob_cache.render_shared(pool, "neutral", items) == blob_cache.render_items(items, "neutral")
        assert pool.started == 3
    assert blob_cache.render_items(items, "neutral")[-2][0] == "error"


@pytest.mark.parametrize("how", ["neutral-inline", "deepseek"])
def test_two_workers_give_the_same_tables_as_one(logs, tmp_path, monkeypatch, how):
    if how == "neutral-inline":  # no encoder process: every body part is rendered by the stage
        monkeypatch.setenv("REPLAY_ENCODER", "inline")
    got, used = [], []
    for workers in (1, 2):
        tok = load_tokenizer(render="deepseek" if how == "deepseek" else None)
        try:
            con = _prepared(logs, tmp_path, tok, f"w{workers}")
            with render_pool(workers) as pool:
                s = tokenize.tokenize_stage(con, tok, chunk_requests=40, pool=pool)
                if pool is not None:
                    used, procs = pool.mapped, _procs(pool)
            assert s.new_prompts > 100
            got.append(_tables(con))
            con.close()
        finally:
            tok.close()
    assert got[0] == got[1]
    assert used > 0 and procs and all(p.poll() is not None for p in procs)  # none outlives the stage


def test_ctrl_c_leaves_no_worker_and_the_next_run_completes(logs, tmp_path, monkeypatch):
    tok = load_tokenizer(render="deepseek")
    try:
        oracle = _prepared(logs, tmp_path, tok, "oracle")
        tokenize.tokenize_stage(oracle, tok, chunk_requests=40)
        con = _prepared(logs, tmp_path, tok, "stopped")
        real, calls = tokenize._Run._store, []

        def interrupted(self, *a):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real(self, *a)

        monkeypatch.setattr(tokenize._Run, "_store", interrupted)
        with pytest.raises(KeyboardInterrupt):
            with render_pool(2) as pool:
                try:
                    tokenize.tokenize_stage(con, tok, chunk_requests=40, pool=pool)
                finally:
                    procs = _procs(pool)
        assert len(calls) == 3 and procs and all(p.poll() is not None for p in procs)
        monkeypatch.setattr(tokenize._Run, "_store", real)
        with render_pool(2) as pool:
            tokenize.tokenize_stage(con, tok, chunk_requests=40, pool=pool)
        assert _tables(con) == _tables(oracle)
    finally:
        tok.close()


def test_a_dead_worker_is_a_clear_error_and_the_next_run_redoes_it(logs, tmp_path, monkeypatch):
    tok = load_tokenizer(render="deepseek")  # (every body rendered by the stage: the workers have work)
    try:
        oracle = _prepared(logs, tmp_path, tok, "oracle")
        tokenize.tokenize_stage(oracle, tok, chunk_requests=40)
        con = _prepared(logs, tmp_path, tok, "crashed")
        real, chunks = blob_cache.render_items, []

        def shared(pool, name, items):  # (the second chunk's shares go to a worker that dies)
            chunks.append(1)
            monkeypatch.setattr(blob_cache, "render_items", dying_render if len(chunks) == 2 else real)
            try:
                return real_shared(pool, name, items)
            finally:
                monkeypatch.setattr(blob_cache, "render_items", real)

        real_shared = blob_cache.render_shared
        monkeypatch.setattr(blob_cache, "render_shared", shared)
        with pytest.raises(WorkerFailed, match=r"of a share of \d+ bodies failed: its worker process "
                                               r"died \(killed by SIGKILL\)\. Nothing of that chunk was stored"):
            with render_pool(2) as pool:
                tokenize.tokenize_stage(con, tok, chunk_requests=40, pool=pool)
        monkeypatch.setattr(blob_cache, "render_shared", real_shared)
        assert len(chunks) == 2 and tokenize.tokenize_needed(con)
        with render_pool(2) as pool:
            tokenize.tokenize_stage(con, tok, chunk_requests=40, pool=pool)
        assert _tables(con) == _tables(oracle)
    finally:
        tok.close()
