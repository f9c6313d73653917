"""The Ray engine's own bookkeeping, without Ray: a stand-in ``ray`` module runs
each task in this process when its result is asked for.

* each task is shipped only the segments its prompts use (a worker holds its
  partition's unique tokens, not the log's), and that is enough for the rows
  to equal the single pass's;
* at most CPUs + 1 tasks are in flight, the shallow task first.
"""

import sys
import types

import numpy as np
import pytest

from replay import api
from replay.core import partition
from replay.core.prompts import SegmentStore, iter_prompts
from replay.core.replay import replay_prompts
from replay.core.streams import MODES
from replay.core.times import INF_US
from replay.distributed import ray_engine


@pytest.fixture(scope="module")
def sample_con(tmp_path_factory):
    con = api.open_db(tmp_path_factory.mktemp("sched") / "s.duckdb")
    api.ingest(con, ["data/sample"])
    api.prepare(con, modes=())  # tokenize
    yield con
    con.close()


class _StandInRay:
    """``ray`` as the engine uses it: tasks run lazily, in this process."""

    class exceptions:
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

    def __init__(self, cpus: int):
        self.cpus = cpus
        self.in_flight: dict[int, tuple] = {}
        self.most_in_flight = 0
        self.names: list[str] = []
        self.segment_rows: dict[str, int] = {}
        self._next = 0

    def cluster_resources(self):
        return {"CPU": self.cpus}

    def remote(self, **_):
        stand_in = self

        def wrap(fn):
            def options(name):
                def remote(task, variants, horizon_us, segments, fault):
                    # (copied: the engine lets go of a shipped task's prompts)
                    task = partition.Task(task.name, task.mode, list(task.prompts))
                    stand_in._next += 1
                    ref = stand_in._next
                    stand_in.names.append(name)
                    stand_in.segment_rows[task.name] = segments.num_rows
                    stand_in.in_flight[ref] = (fn, (task, variants, horizon_us, segments, fault))
                    stand_in.most_in_flight = max(stand_in.most_in_flight, len(stand_in.in_flight))
                    return ref

                return types.SimpleNamespace(remote=remote)

            return types.SimpleNamespace(options=options)

        return wrap

    def wait(self, refs, num_returns=1):
        return [refs[0]], refs[1:]

    def get(self, ref):
        fn, args = self.in_flight.pop(ref)
        return fn(*args)

    def cancel(self, ref, force=False):
        self.in_flight.pop(ref, None)


def _run(sample_con, monkeypatch, cpus: int):
    stand_in = _StandInRay(cpus)
    engine = ray_engine.RayEngine(partitions=3)
    monkeypatch.setattr(engine, "start", lambda: stand_in)
    rows: dict = {}

    def sink(part):
        for key, rs in part.items():
            rows.setdefault(key, []).extend(rs)

    engine.replay(sample_con, MODES, ("prompt",), INF_US, sink)
    return stand_in, rows


@pytest.mark.parametrize("cpus", [1, 2])
def test_rows_equal_the_single_pass_with_a_few_tasks_in_flight(sample_con, monkeypatch, cpus):
    stand_in, rows = _run(sample_con, monkeypatch, cpus)
    want = replay_prompts(iter_prompts(sample_con), MODES, ("prompt",), INF_US)
    order = {p.request_id: i for i, p in enumerate(iter_prompts(sample_con))}
    for key in want:
        if key != "_nodes":
            assert sorted(rows[key], key=lambda r: order[r[0]]) == want[key], key
    assert stand_in.names[0] == f"replay:global/{partition.SHALLOW}"
    assert stand_in.most_in_flight <= cpus + 1
    assert len(stand_in.names) == len(set(stand_in.names)) > cpus + 1


def test_each_task_is_shipped_only_the_segments_its_prompts_use(sample_con, monkeypatch):
    stand_in, _ = _run(sample_con, monkeypatch, 2)
    total = len(SegmentStore(sample_con))
    assert stand_in.segment_rows[f"global/{partition.SHALLOW}"] == 0  # (its prompts carry their tokens)
    shipped = [n for name, n in stand_in.segment_rows.items() if not name.endswith(partition.SHALLOW)]
    assert all(0 < n <= total for n in shipped) and min(shipped) < total
    # exactly the union of the task's segment ids
    segments = ray_engine._Segments(sample_con)
    pl = partition.plan(iter_prompts(sample_con), MODES, 3, partition.DEFAULT_DEPTH, travel_light=True)
    for task in pl.tasks:
        got = set(segments.of(task).column("seg_id").to_pylist())
        want = {int(s) for p in task.prompts if p.symbols is None for s in np.asarray(p.seg_ids)}
        assert got == want, task.name


@pytest.mark.parametrize("cause, hint", [
    (ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6379"), "check the address"),
    (RuntimeError("InvalidAuthToken: Authentication token is missing or incorrect"), "token authentication")])
def test_a_cluster_that_cannot_be_joined_is_a_plain_error(monkeypatch, cause, hint):
    """``--address`` naming a cluster this machine cannot join: an error that
    says what to do (the CLI's exit 1), never Ray's traceback."""
    def init(**_):
        try:
            raise cause
        except Exception as inner:  # (Ray wraps the cause: the hint is read from the chain)
            raise ConnectionError("Failed to connect to Ray cluster") from inner

    stand_in = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", stand_in)
    with pytest.raises(api.EngineUnavailable, match=f"cannot join the Ray cluster at 10.0.0.9:6379.*{hint}"):
        ray_engine.RayEngine(address="10.0.0.9:6379").start()


@pytest.mark.parametrize("given, cluster_cpus, want", [
    (None, 0, False), (None, 1, True), (None, 4, True), (True, 0, True), (False, 4, False)])
def test_tasks_prepare_parts_only_on_a_cluster_larger_than_this_machine(monkeypatch, given, cluster_cpus, want):
    """``cluster_cpus``: beyond this machine's CPUs (the encoder process here does it faster on one machine)."""
    import os

    engine = ray_engine.RayEngine(prepare_parts=given)
    stand_in = _StandInRay((os.cpu_count() or 1) + cluster_cpus)
    monkeypatch.setattr(engine, "start", lambda: stand_in)
    assert engine.prepares_parts() is want
