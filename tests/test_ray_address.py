"""``--address``: a command runs on a Ray cluster that was already running, gives
the local rows, and leaves the cluster running. The cluster is started here
(``ray.cluster_utils.Cluster``: only its own processes are stopped after, not
another test's cluster) without token authentication. Skipped without Ray."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")


def test_a_command_on_an_existing_cluster_gives_the_local_rows_and_leaves_it_running(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        def sweep(db, *extra):
            res = subprocess.run([sys.executable, "-m", "replay.cli.main", "sweep", "data/sample", "--db",
                                  str(tmp_path / db), "--ttl", "0,5m,inf", "--block", "1,16", "--json", *extra],
                                 capture_output=True, text=True, env=dict(os.environ), timeout=600)
            assert res.returncode == 0, res.stderr[-2000:]
            if extra:  # (joined that cluster: it did not start one of its own)
                assert f"existing Ray cluster at address: {cluster.address}" in res.stderr, res.stderr[-2000:]
            return json.loads(res.stdout)

        on_cluster = sweep("r.duckdb", "--engine", "ray", "--address", cluster.address)
        local = sweep("l.duckdb")
        assert on_cluster == local and len(local) >= 3 * 2 and {r["block"] for r in local} == {1, 16}
        # (the command disconnected; the cluster is still there for the next job)
        status = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "status", "--address",
                                 cluster.address], capture_output=True, text=True, env=dict(os.environ), timeout=120)
        assert status.returncode == 0 and "CPU" in status.stdout, status.stderr[-2000:]
    finally:
        cluster.shutdown()
