"""Commands as real processes, and the helpers they leave behind.

Each command runs tagged with an environment variable its helpers inherit, so
leftovers are found in /proc whoever their parent is now.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

from support.paths import ROOT

TAG = "REPLAY_TEST_PROCESS_TAG"
MAIN = "from replay.cli.main import main; main()"


def start(args, tag: str, failpoint: str | None = None, **env) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if k != "REPLAY_FAILPOINT"}
    full.update({TAG: tag, **env})
    if failpoint:
        full["REPLAY_FAILPOINT"] = failpoint
    return subprocess.Popen([sys.executable, "-c", MAIN, *map(str, args)], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def replay(args, failpoint: str | None = None, tag: str | None = None, **env):
    """(exit code, stdout, stderr, tag) of one finished command."""
    tag = tag or uuid.uuid4().hex
    p = start(args, tag, failpoint, **env)
    out, err = p.communicate(timeout=600)
    return p.returncode, out, err, tag


def tagged(tag: str) -> list[int]:
    """Live processes carrying ``tag`` in their environment (zombies excluded)."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(d))
        except OSError:
            continue
    return found


def assert_no_leftovers(tag: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes outlived their command: {left}"


@contextmanager
def database_held(db, sql: str | None = None):
    """Another process holding ``db`` open (DuckDB's lock; ``sql`` run first) for as
    long as the block runs: it says "held" once it has the lock, which is awaited,
    and keeps it until its input closes."""
    code = (f"import duckdb, sys; c = duckdb.connect({str(db)!r}); " + (f"c.execute({sql!r}); " if sql else "")
            + "print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.communicate()
