"""The engines' test hook: a worker told to fail (``REPLAY_RAY_FAULT``,
``REPLAY_LOCAL_FAULT``) fails where the tests need it to.

A fault is ``KIND:NAME[:REST]``, read in the driver and handed to the workers;
it applies to the worker walking ``NAME`` (a partition, or a walk set):
``exit-once:NAME:MARKER`` (dies at its first batch — ``os._exit`` — unless
MARKER exists, which it creates first), ``exit:NAME`` (dies every time),
``raise:NAME`` (raises) or ``sleep:NAME:SECONDS[:MARKER]`` (time to interrupt
the command; MARKER, when given, is created as the sleep starts).
"""

from __future__ import annotations

import os
import time


def inject(fault: str, name: str) -> None:
    kind, _, rest = fault.partition(":")
    target, _, marker = rest.partition(":")
    if target != name:
        return
    if kind == "exit-once":
        if os.path.exists(marker):
            return
        with open(marker, "w") as f:
            f.write(name)
        os._exit(1)
    if kind == "exit":
        os._exit(1)
    if kind == "raise":
        raise RuntimeError(f"injected failure in task {name}")
    if kind == "sleep":  # (time to interrupt the command)
        seconds, _, started = marker.partition(":")
        if started:
            with open(started, "w") as f:
                f.write(name)
        time.sleep(float(seconds))
