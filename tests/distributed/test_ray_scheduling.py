"""The Ray engine's own decisions, without Ray (a stand-in ``ray`` module):
joining a cluster that cannot be joined, and when file tasks prepare parts.
(The replay's bookkeeping is tested with walkers in this process:
``tests/core/test_streamed.py``.)"""

import os
import sys
import types

import pytest

from replay import api
from replay.distributed import ray_engine


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
    engine = ray_engine.RayEngine(prepare_parts=given)
    stand_in = types.SimpleNamespace(cluster_resources=lambda: {"CPU": (os.cpu_count() or 1) + cluster_cpus})
    monkeypatch.setattr(engine, "start", lambda: stand_in)
    assert engine.prepares_parts() is want
