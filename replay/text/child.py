"""Helper processes: how the package starts one, and the encoder process's messages.

A helper is ``python -m replay.<module>`` with this package on its path (a
source checkout works as well as an install). The encoder process
(``replay.text.encoder``) and its parent exchange the messages below (msgspec
structs tagged by class name, msgpack, one per ``multiprocessing.connection``
message over a socket pair): the parent sends an :data:`Ask`; the child answers
those marked "→", in order, after a :class:`Ready` or :class:`Failed` once
first, and exits when its end closes (a parent that dies takes it along).
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Union

import msgspec
import numpy as np


def spawn(module: str, *args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """``python -m module args`` running this copy of the package (``pass_fds``:
    descriptors it inherits). ``-P``: without it, ``-m`` puts the working
    directory first on the path, and a run started in another checkout of the
    project would talk to that checkout's helper."""
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen([sys.executable, "-P", "-m", module, *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, env=env, pass_fds=pass_fds)


def stop(proc: subprocess.Popen, timeout: float = 5) -> None:
    """Wait for the child (its connection closed: it leaves), killing it if it lingers."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


Part = tuple[int, str, bytes]  # a body part: blob id, kind, JSON text (:func:`wire_text`)


def wire_text(text: str) -> bytes:
    """A text as it crosses: UTF-8, a lone surrogate kept (msgpack's strings
    cannot hold one; the texts rendered on both sides must be the same)."""
    return text.encode("utf-8", "surrogatepass")


def text_of(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


class _Message(msgspec.Struct, tag=True, array_like=True):
    pass


# ----------------------------------------------------------- parent → child
class Warm(_Message):
    """Body parts to render and encode ahead (no answer)."""
    parts: list[Part]


class Ahead(_Message):
    """Requests (id, ts_us, format, part ids) to render ahead with the template,
    and the parts no earlier request brought (no answer)."""
    parts: list[Part]
    requests: list[tuple[int, Union[int, None], Union[str, None], list[int]]]


class Template(_Message):
    """The chat template requests are rendered ahead with (no answer)."""
    source: str
    origin: str
    specials: dict


class Encode(_Message):
    """→ :class:`Tokens` of the texts (:func:`wire_text`)."""
    texts: list[bytes]


class TakeBlobs(_Message):
    """→ :class:`Blobs`: the prepared parts among ``ids`` (handed over once)."""
    ids: list[int]


class TakeSegments(_Message):
    """→ :class:`Tokens` of the prepared segments among ``ids`` (``ids`` says which)."""
    ids: list[int]


class TakeRequests(_Message):
    """→ :class:`Requests`: those among ``ids`` rendered ahead; the requests up
    to ``through`` are the stage's from now on."""
    ids: list[int]
    through: int


class Release(_Message):
    """The tokenize stage is done: let go of what only it needed (no answer)."""


class Describe(_Message):
    """→ :class:`Text`: what the process did."""


Ask = Union[Warm, Ahead, Template, Encode, TakeBlobs, TakeSegments, TakeRequests, Release, Describe]
_HINTS = (Warm, Ahead)  # hints only: dropped over the backlog, or once the parent closes


# ----------------------------------------------------------- child → parent
class Ready(_Message):
    info: dict  # vocab_size, marker_ids, markers_added


class Failed(_Message):
    message: str


class Tokens(_Message):
    """Arrays of ids (:func:`_pack`); ``ids``: what each is for, when asked by id."""
    flat: bytes
    lengths: bytes
    ids: list[int] = []


class Blobs(_Message):
    """Prepared parts: part ``i`` (``ids[i]``, ``kinds[i]``) has the next ``lengths[i]``
    of ``seg_ids`` (uint64) and of ``parts`` (int32, each segment's part)."""
    ids: list[int]
    kinds: list[str]
    seg_ids: bytes
    lengths: bytes
    parts: bytes


class Requests(_Message):
    """Requests rendered ahead: ``ids[i]`` was rendered from ``rest[i]`` (ts_us,
    format, part ids), with segment ids and parts packed as in :class:`Blobs`;
    ``tokens``: the tokens of their segments not handed over before."""
    ids: list[int]
    rest: list[tuple[Union[int, None], Union[str, None], list[int]]]
    seg_ids: bytes
    lengths: bytes
    parts: bytes
    tokens: Tokens


class Text(_Message):
    text: str


Answer = Union[Ready, Failed, Tokens, Blobs, Requests, Text]


def _pack(arrays: list[np.ndarray], dtype: str = "<i4") -> tuple[bytes, bytes]:
    """Arrays as (their values concatenated, their lengths): one buffer is sent
    far faster than thousands of small arrays."""
    lengths = np.fromiter(map(len, arrays), dtype="<i8", count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    return flat.astype(dtype).tobytes(), lengths.tobytes()


def _unpack(flat: bytes, lengths: bytes, dtype: str = "<i4") -> list[np.ndarray]:
    """The arrays :func:`_pack` packed (views of one buffer)."""
    ends = np.cumsum(np.frombuffer(lengths, dtype="<i8")).tolist()
    values = np.frombuffer(flat, dtype=dtype)
    return [values[a:b] for a, b in zip([0] + ends[:-1], ends)]  # (slices: np.split costs far more)


def _tokens(tokens: dict[int, np.ndarray]) -> Tokens:
    return Tokens(*_pack(list(tokens.values())), ids=list(tokens))


def _plain(value):
    """A numpy integer (ids read from arrays) as the int it is."""
    if isinstance(value, np.integer):
        return int(value)
    raise NotImplementedError(f"cannot send {type(value).__name__}")


class _Wire:
    """One end of the connection: typed messages, msgpack-encoded."""

    def __init__(self, conn: Connection, receives):
        self.conn = conn
        self._encode = msgspec.msgpack.Encoder(enc_hook=_plain).encode
        self._decode = msgspec.msgpack.Decoder(receives).decode

    def send(self, msg: _Message) -> None:
        self.conn.send_bytes(self._encode(msg))

    def recv(self):
        return self._decode(self.conn.recv_bytes())
