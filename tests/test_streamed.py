"""The streamed replay's bookkeeping (replay.core.streamed), with walkers in
this process (``LocalPool``: each call walked when its result is asked for,
oldest first). That its rows are the single pass's is tested with the
partition argument (tests/test_partition.py); the Ray actors run the same
walkers (tests/test_ray.py).
"""

import pytest

from replay.core import partition, streamed
from replay.core.prompts import SegmentStore, iter_prompts
from replay.core.streams import MODES
from replay.core.times import INF_US

from gen import random_requests
from test_partition import VARIANTS, partitioned, prompts_of, same


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
