"""A Mooncake hash-id trace read whole, without a database — or not at all.

``replay capacity TRACE`` without a database (``replay.cli.analysis``) walks
the trace's blocks straight from this read. It takes a file only when ingest
would load every one of its lines as it is and reject none: each line one JSON
object of exactly Mooncake's fields (``timestamp``, ``input_length``,
``hash_ids``, optionally ``output_length`` and ``block_size``), integers where
ingest wants them and within its bounds. Anything else — a blank or damaged
line, another field (a tenant, a session, a model), a float, an id beyond 64
bits, a prompt shorter than its blocks — returns None, and the caller takes
the database path, whose rejects and rules then apply as always. So whatever
this reads, ingest would have loaded the same values (``readers.traces``:
``convert_mooncake``), which ``replay.core.prompt.trace_prompts`` turns into
the prompts ``iter_prompts`` would have read back.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import msgspec
import numpy as np

from replay.readers.fields import MAX_LIST_ITEMS
from replay.readers.timeorder import TimeOrder
from replay.times import UNIT_US

MOONCAKE_BLOCK = 512  # (replay.readers.traces.MOONCAKE_BLOCK)
# a larger trace goes through the database, whose memory stays bounded (here every id is a
# Python int for a moment: ~40 bytes an id, 64 MiB of JSON ≈ 0.4 GB); the shared one is 3 MB
MAX_BYTES = 64 << 20
_MAX_LINE_BYTES = 32 << 20  # (replay.readers.files.MAX_LINE_BYTES: a longer line is a reject)
_TS_LIMIT_US = 2**62  # (replay.readers.timestamps.TS_LIMIT_US)


class _Record(msgspec.Struct, forbid_unknown_fields=True):
    timestamp: int
    input_length: int
    hash_ids: list[int]
    output_length: int | None = None
    block_size: int | None = None


_DECODE = msgspec.json.Decoder(list[_Record]).decode
_DECODE_ONE = msgspec.json.Decoder(_Record).decode


@dataclass
class HashTrace:
    """One file's requests in file order (int64 arrays): time (µs), prompt tokens,
    the tokens of a block (512 unless the line says ``block_size``), and their
    block ids, flat (request i's are ``ids[offsets[i]:offsets[i + 1]]``); and
    the time order of the file (``replay.readers.timeorder``)."""
    path: str
    ts_us: np.ndarray
    input_length: np.ndarray
    block: np.ndarray
    ids: np.ndarray
    offsets: np.ndarray
    time_order: str | None

    def __len__(self) -> int:
        return len(self.ts_us)


def read_mooncake(path: str, time_unit: str | None = None) -> HashTrace | None:
    """The requests of the plain (uncompressed) JSON Lines file ``path`` when
    ingest would load each of its lines, as they are, as Mooncake's format
    (timestamps in ``time_unit``, else Mooncake's ms); None when any line
    would be rejected or read otherwise, or the file is empty or too large."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as fh:
            try:  # (another format is told by its first line, before the whole file is read)
                _DECODE_ONE(fh.readline(_MAX_LINE_BYTES))
            except msgspec.DecodeError:
                return None
            fh.seek(0)
            data = fh.read()
    except OSError:
        return None
    body = data[:-1] if data.endswith(b"\n") else data  # (the newline that ends the last line ends no other)
    if not body:
        return None
    n = body.count(b"\n") + 1
    if len(body) >= _MAX_LINE_BYTES and max(map(len, body.split(b"\n"))) + 1 > _MAX_LINE_BYTES:
        return None
    try:  # every line at once: a blank or damaged line, another field or type fails the whole array
        recs = _DECODE(b"[" + body.replace(b"\n", b",") + b"]")
    except msgspec.DecodeError:  # ingest decides
        return None
    if len(recs) != n:  # (a line holding two objects, comma-separated)
        return None
    scale = UNIT_US[time_unit or "ms"]
    ts, n_in, block, counts = [0] * n, [0] * n, [0] * n, [0] * n
    order = TimeOrder()
    for i, rec in enumerate(recs):
        t, k = rec.timestamp * scale, len(rec.hash_ids)
        b = MOONCAKE_BLOCK if rec.block_size is None else rec.block_size
        if not (-_TS_LIMIT_US < t < _TS_LIMIT_US and rec.input_length >= 0 and b > 0 and k <= MAX_LIST_ITEMS
                and (rec.output_length is None or rec.output_length >= 0)):
            return None
        if k > 1 and rec.input_length <= b * (k - 1):  # (ingest: `bad_length`)
            return None
        ts[i], n_in[i], block[i], counts[i] = t, rec.input_length, b, k
        order.add(t)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    try:  # (an id beyond 64 bits: ingest's `wrong_type`)
        ids = np.fromiter(itertools.chain.from_iterable(r.hash_ids for r in recs), dtype=np.int64,
                          count=int(offsets[-1]))
    except (OverflowError, ValueError):
        return None
    return HashTrace(path, np.array(ts, dtype=np.int64), np.array(n_in, dtype=np.int64),
                     np.array(block, dtype=np.int64), ids, offsets, order.order())
