"""``--workers N`` on the commands: the same output whatever N, and no helper left.

Each command runs as a real process (``support.procs``): once with ``--workers
1`` (one process, the oracle), once with ``--workers 2`` (given, so the stages
use the workers however small the log), and once with the default (every core
where the log pays for them); the printed JSON must be the same, and no process
the command started may outlive it.
"""

from __future__ import annotations

import json
import re

import pytest

from support import procs


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    from replay.synth.generator import generate

    base = tmp_path_factory.mktemp("workers")
    files = generate(base / "logs", seed=11, scale=1.0).files
    return str(next(iter(files.values())).parent)


COMMANDS = [
    ["sweep", "--json", "--ttl", "5m,1h", "--block", "1,64", "--stream", "tenant,session,global"],
    ["capacity", "--json", "--block", "16", "--capacity", "auto", "--stream", "global"],
    ["diagnose", "--json"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_the_output_is_the_same_for_one_two_and_every_worker(logs, tmp_path, command):
    outs = {}
    for workers in ("1", "2", None):
        db = tmp_path / f"w{workers}.duckdb"
        args = [command[0], logs, "--db", db, *command[1:]] + (["--workers", workers] if workers else [])
        code, out, err, tag = procs.replay(args)
        assert code == 0, err[-2000:]
        assert procs.tagged(tag) == [], f"--workers {workers}: a helper outlived the command"
        # (redacted text carries a hash salted per database: not the rows)
        outs[workers] = json.loads(re.sub(r"#[0-9a-f]{6}⟩", "⟩", out))
    assert outs["2"] == outs["1"]
    assert outs[None] == outs["1"]


def test_workers_below_one_is_a_usage_error(tmp_path):
    code, out, err, _ = procs.replay(["sweep", "--db", tmp_path / "x.duckdb", "--workers", "0"])
    assert code == 2
    assert "--workers" in err
