"""The streamed replay's bookkeeping (replay.core.streamed), with walkers in
this process (``LocalPool``: each call walked when its result is asked for,
oldest first). That its rows are the single pass's is tested with the
partition argument (tests/core/test_partition.py); the Ray actors run the same
walkers (tests/distributed/test_ray.py).
"""

import itertools

import numpy as np
import pytest

from replay import api
from replay.core import partition, streamed
from replay.core.prompts import SegmentStore, iter_prompts
from replay.core.replay import replay_prompts
from replay.core.segment_window import SegmentWindow
from replay.core.streams import MODES
from replay.times import INF_US

from support.gen import random_requests
from support.logs import generated_db
from support.walks import VARIANTS, partitioned, prompts_of, same


def test_the_driver_holds_a_window_of_the_log_not_the_log(monkeypatch):
    """Global rows wait for their other half for about a window of prompts
    (``EVERY``) plus the batches in flight, however long the log; each
    request's bookkeeping goes once its rows are final."""
    monkeypatch.setattr(streamed, "EVERY", 40)
    prompts = prompts_of(random_requests(3, n=900, alphabet=4, max_len=20, gaps=(0, 1, 2)))
    same(prompts, ("global",), VARIANTS, INF_US, 4, 2, size=2, batch=16)
    router = partition.Router(("global",), 4, 2)
    driver = streamed._Driver(streamed.LocalPool(2, VARIANTS), router, None, VARIANTS, lambda rows: None, None, 16)
    driver.run(prompts)
    assert 0 < driver.most_waiting <= len(VARIANTS) * (40 + 2 * streamed.CALLS_PER_WALKER * 16) < len(prompts)
    assert not driver.boundary


@pytest.mark.parametrize("parts,depth,size", [(2, 1, 2), (4, 64, 3), (3, 4096, 1)])
def test_each_walker_is_sent_each_segment_it_needs_once(sample_con, parts, depth, size):
    """Text prompts travel as segment ids: a walker is sent exactly the segments
    of the light prompts routed to it, each once, and its rows are exact."""
    segments = SegmentStore(sample_con)
    prompts = list(iter_prompts(sample_con, with_output=True))
    _, pool = partitioned(prompts, MODES, VARIANTS, INF_US, parts, depth, segments, size, batch=64)
    same(prompts, MODES, VARIANTS, 300_000_000, parts, depth, segments, size, batch=64)
    router = partition.Router(MODES, parts, depth, travel_light=True)
    home = {name: i % size for i, name in enumerate(router.names)}
    need = [set() for _ in range(size)]
    for p in prompts:
        for name, q in router.route(p)[0]:
            if q.symbols is None:  # (light: the shallow prompts carry their first K tokens)
                for ids in (q.seg_ids, q.output_seg_ids):
                    need[home[name]].update(int(s) for s in ([] if ids is None else ids))
    for w in range(size):
        assert len(pool.shipped[w]) == len(set(pool.shipped[w])), "a segment sent twice"
        assert set(pool.shipped[w]) == need[w]
    assert min(map(len, need)) > 0


def test_a_failing_walker_is_named_with_its_partitions(monkeypatch):
    prompts = prompts_of(random_requests(1, n=30, alphabet=3, max_len=10))
    real = streamed.Walker.feed

    def feed(self, batch, segments=None):
        if any(name == f"global/{partition.SHALLOW}" for name, _ in batch):
            raise OSError("disk gone")
        return real(self, batch, segments)

    monkeypatch.setattr(streamed.Walker, "feed", feed)
    with pytest.raises(streamed.WalkerFailed, match="global/shallow") as e:
        partitioned(prompts, MODES, ("prompt",), INF_US, 2, 2, size=2, batch=8)
    assert isinstance(e.value.cause, OSError)


@pytest.mark.parametrize("with_output", [False, True])
def test_a_window_of_the_segments_gives_the_same_prompts_and_rows(sample_con, monkeypatch, with_output):
    """The driver's ``SegmentWindow``: the same prompts as the whole segment
    store, read a stretch at a time; the rows exact; and it holds fewer tokens
    than the log's unique tokens, nothing once every prompt was sent."""
    monkeypatch.setattr(streamed, "EVERY", 7)
    everything = SegmentStore(sample_con)
    want = list(iter_prompts(sample_con, with_output=with_output, chunk=16))
    window = SegmentWindow(sample_con, with_output)
    got = list(iter_prompts(sample_con, with_output=with_output, chunk=16, segs=window))
    assert [(p.request_id, p.symbols.tolist(), None if p.output is None else p.output.tolist(), p.shared)
            for p in got] == \
        [(p.request_id, p.symbols.tolist(), None if p.output is None else p.output.tolist(), p.shared) for p in want]
    variants = VARIANTS if with_output else ("prompt",)
    window = SegmentWindow(sample_con, with_output)
    rows: dict = {}

    def sink(part):
        for key, rs in part.items():
            rows.setdefault(key, []).extend(rs)

    streamed.replay_streamed(iter_prompts(sample_con, with_output=with_output, chunk=16, segs=window),
                             streamed.LocalPool(2, variants), sink, MODES, variants, 3, 8, window, batch=8)
    single = replay_prompts(want, MODES, variants, INF_US)
    order = {p.request_id: i for i, p in enumerate(want)}
    for key in single:
        if key != "_nodes":
            assert sorted(rows[key], key=lambda r: order[r[0]]) == single[key], key
    total = sum(len(everything.tokens(s)) for s in everything.lengths())
    assert 0 < window.most_tokens < total
    assert window.held == 0 and not window._tokens


@pytest.fixture(scope="module")
def generated_con(tmp_path_factory):
    con = generated_db(tmp_path_factory.mktemp("window"), seed=11, scale=0.1)
    yield con
    con.close()


def test_a_window_keeps_a_prompt_s_segments_until_its_conversation_s_next(generated_con):
    """``iter_prompts`` builds a prompt from its conversation's previous one,
    looking up that one's segments: dropped as early as allowed (after every
    prompt), the window still holds them when the next prompt comes, and the
    prompts equal those of the whole store."""
    window = SegmentWindow(generated_con)
    want = iter_prompts(generated_con, chunk=4)
    previous: dict = {}
    seen = 0
    for i, (p, q) in enumerate(zip(iter_prompts(generated_con, chunk=4, segs=window), want)):
        assert p.request_id == q.request_id and np.array_equal(p.symbols, q.symbols) and p.shared == q.shared
        conv = (p.tenant, p.session or p.key)
        if conv in previous:
            assert all(s in window._tokens for s in previous[conv]), p.request_id
            seen += 1
        previous[conv] = p.seg_ids.tolist()
        window.forget_before(i + 1)
    assert seen and window.most_tokens < sum(SegmentStore(generated_con).lengths().values())


def _spans_by_brute_force(prompts, with_output):
    """Each segment's (first use, last use): the latest of its users' positions, or
    of the conversation's next *text* prompt after a user (which is built from it)."""
    text = [(i, p) for i, p in enumerate(prompts) if p.cum is None]
    following: dict[int, int] = {}
    last_of: dict = {}
    for i, p in reversed(text):
        conv = (p.tenant, p.session or p.key)
        following[i] = last_of.get(conv, i)
        last_of[conv] = i
    spans: dict[int, list[int]] = {}
    for i, p in text:
        used = list(p.seg_ids) + (list(p.output_seg_ids) if with_output and p.output_seg_ids is not None else [])
        for s in used:
            span = spans.setdefault(int(s), [i, following[i]])
            span[1] = max(span[1], following[i])
    return spans


@pytest.mark.parametrize("with_output", [False, True])
def test_the_window_s_spans_equal_brute_force_with_block_requests_in_a_conversation(tmp_path, shared_data,
                                                                                    with_output):
    """First and last use of every segment, against a brute force over the
    prompts; block-trace requests join a text conversation, between and after
    its prompts: only a text prompt is built from the previous one, so they
    must not count as "the next prompt"."""
    src = shared_data / "mooncake" / "conversation_trace.jsonl"
    path = tmp_path / "mooncake.jsonl"
    with open(src) as f, open(path, "w") as g:
        g.writelines(itertools.islice(f, 200))
    con = api.open_db(tmp_path / "mixed.duckdb")
    api.ingest(con, ["data/sample", str(path)])
    api.prepare(con, modes=())  # tokenize
    tenant, session = con.execute("""
        SELECT tenant, session FROM requests WHERE block_ids IS NULL AND session IS NOT NULL
        GROUP BY ALL ORDER BY count(*) DESC LIMIT 1""").fetchone()
    times = [t for (t,) in con.execute("SELECT ts_us FROM requests WHERE tenant = ? AND session = ? ORDER BY ts_us",
                                       [tenant, session]).fetchall()]
    blocks = [r for (r,) in con.execute("SELECT request_id FROM requests WHERE block_ids IS NOT NULL").fetchall()]
    # a block request 1 µs after each of the conversation's prompts, the last one included
    con.executemany("UPDATE requests SET tenant = ?, session = ?, ts_us = ? WHERE request_id = ?",
                    [[tenant, session, times[k % len(times)] + 1, r] for k, r in enumerate(blocks)])
    want = _spans_by_brute_force(list(iter_prompts(con, with_output=with_output)), with_output)
    window = SegmentWindow(con, with_output)
    got = {int(s): [int(f), None] for s, f in zip(window._seg, window._first)}
    for s, last in zip(window._seg_by_last, window._last):
        got[int(s)][1] = int(last)
    assert got == want
    con.close()


def test_a_window_whose_query_runs_out_of_duckdb_memory_raises_the_cap_and_puts_it_back(sample_con, monkeypatch):
    """The spans' query over every segment use may not fit DuckDB's cap (its first
    form did not on the week-like log): the cap is raised until it fits, then restored."""
    import duckdb

    from replay.core import segment_window

    want = SegmentWindow(sample_con)
    before = sample_con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    real, calls, limits = segment_window.db.arrow, [], []

    def arrow(con, query):
        if "lead(" in query:  # (the spans' query)
            calls.append(query)
            limits.append(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])
            if len(calls) == 1:
                raise duckdb.OutOfMemoryException("out of memory (a stand-in)")
        return real(con, query)

    monkeypatch.setattr(segment_window.db, "arrow", arrow)
    got = SegmentWindow(sample_con)
    assert len(calls) == 2 and limits[1] != limits[0]  # (run again with more room)
    assert sample_con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == before
    assert np.array_equal(got._seg, want._seg) and np.array_equal(got._last, want._last)
