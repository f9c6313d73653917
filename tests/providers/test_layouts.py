"""Where Anthropic's rules see block ends and breakpoints: read from the stored
segments for bodies without a ``cache_control``, equal to rendering each body
again (``simulators.anthropic_layout``) — and the bodies assembled from their
blobs (``db.fetch_bodies``) equal to the ``request_bodies`` view."""

from __future__ import annotations

import json

import pytest

from replay import api
from replay.providers import layouts
from replay.store import db

from support.agent_logs import claude_transcript, codex_rollout, write_jsonl
from support.paths import SAMPLE


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    d = tmp_path_factory.mktemp("layouts")
    write_jsonl(d / "s1.jsonl", claude_transcript())
    write_jsonl(d / "rollout-1.jsonl", codex_rollout())
    c = api.open_db(str(d / "db.duckdb"))
    api.ingest(c, [str(SAMPLE), str(d / "s1.jsonl"), str(d / "rollout-1.jsonl")])
    api.tokenize(c)
    return c


def test_fetched_bodies_equal_the_view(con):
    ids = [r[0] for r in con.execute("SELECT request_id FROM requests ORDER BY request_id").fetchall()]
    view = dict(con.execute("SELECT request_id, body FROM request_bodies").fetchall())
    cache: dict = {}
    got = {}
    for group in db.chunks_by_size(db.body_sizes(con), 20_000):  # several stretches, one shared cache
        got.update(db.fetch_bodies(con, group, cache))
    assert got == {i: view.get(i) for i in ids}
    assert all(json.loads(b) is not None for b in got.values() if b is not None)


def test_chunks_keep_order_and_hold_a_large_body_alone():
    assert db.chunks_by_size([(1, 5), (2, 5), (3, 50), (4, 1)], 10) == [[1, 2], [3], [4]]
    assert db.chunks_by_size([], 10) == []


@pytest.mark.parametrize("auto", [True, False])
def test_layouts_from_segments_equal_rendering_again(con, auto):
    got = layouts.anthropic_layouts(con, auto)
    seg_n = dict(con.execute("SELECT seg_id, n_tokens FROM segments").fetchall())
    ids = sorted(got)
    rendered: dict = {}
    layouts._rendered_layouts(con, ids, seg_n, auto, rendered, {})
    assert got == rendered
    # (some bodies name a cache_control, some do not: both paths were taken)
    assert 0 < len(layouts._with_breakpoints(con)) < len(ids)
