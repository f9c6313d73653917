"""Failpoints: named places where a test may kill the process.

The tests prove that a run killed anywhere and run again gives exactly an
uninterrupted run's results (each stage commits all or nothing and records
what is current last). A timed kill lands somewhere at random; a failpoint
lands at a chosen place — between two files of ingest, inside a chunk's open
transaction, between the walks and their record — every time.

``REPLAY_FAILPOINT=name`` (or ``name:n``: the n-th time the place is passed;
``name:n:INT``: Ctrl-C's signal instead) makes the process SIGKILL itself
there. Unset — always, outside the tests — a failpoint costs one environment
lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "REPLAY_FAILPOINT"
_passed: dict[str, int] = {}


def failpoint(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    want, nth, sig = (spec.split(":") + ["", ""])[:3]
    if want != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGINT if sig == "INT" else signal.SIGKILL)
