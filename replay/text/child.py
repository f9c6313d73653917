"""Helper processes: how the package starts one and talks to it.

A helper is ``python -m replay.<module>`` with this package on its path (so a
source checkout works as well as an install); parent and child exchange
pickled frames (8-byte length, then the pickle) over the child's stdin and
stdout. The child moves its stdout aside first (:func:`protocol_streams`), so
a stray print cannot corrupt the stream. A child reads until its stdin closes,
then exits: a parent that dies takes its helpers with it.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path


def spawn(module: str, *args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """``python -m module args`` running this copy of the package (``pass_fds``:
    descriptors it inherits). ``-P``: without it, ``-m`` puts the working
    directory first on the path, and a run started in another checkout of the
    project would talk to that checkout's helper."""
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen([sys.executable, "-P", "-m", module, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, pass_fds=pass_fds)


def write_frame(fh, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(struct.pack("<Q", len(data)))
    fh.write(data)
    fh.flush()


def read_frame(fh):
    head = fh.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = fh.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def protocol_streams():
    """In the child: (frames in, frames out); fd 1 then points at stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return sys.stdin.buffer, out


def stop(proc: subprocess.Popen, timeout: float = 5) -> None:
    """Close the child's input and wait for it (killing it if it lingers)."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
