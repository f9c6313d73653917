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

import os
from dataclasses import dataclass

import msgspec

from replay.readers.fields import INT64, MAX_LIST_ITEMS
from replay.readers.timeorder import TimeOrder
from replay.times import UNIT_US

MOONCAKE_BLOCK = 512  # (replay.readers.traces.MOONCAKE_BLOCK)
MAX_BYTES = 1 << 30  # a larger trace goes through the database (its memory stays bounded there)
_MAX_LINE_BYTES = 32 << 20  # (replay.readers.files.MAX_LINE_BYTES: a longer line is a reject)
_TS_LIMIT_US = 2**62  # (replay.readers.timestamps.TS_LIMIT_US)


class _Record(msgspec.Struct, forbid_unknown_fields=True):
    timestamp: int
    input_length: int
    hash_ids: list[int]
    output_length: int | None = None
    block_size: int | None = None


_DECODE = msgspec.json.Decoder(_Record).decode


@dataclass
class HashTrace:
    """One file's requests in file order: time (µs), prompt tokens, block ids and
    the tokens of a block (512 unless the line says ``block_size``); and the
    time order of the file (``replay.readers.timeorder``)."""
    path: str
    ts_us: list[int]
    input_length: list[int]
    hash_ids: list[list[int]]
    block: list[int]
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
            data = fh.read()
    except OSError:
        return None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # (the newline that ends the last line ends no other)
    if not lines:
        return None
    scale = UNIT_US[time_unit or "ms"]
    lo, hi = INT64
    out = HashTrace(path, [], [], [], [], None)
    order = TimeOrder()
    for raw in lines:
        if len(raw) + 1 > _MAX_LINE_BYTES:
            return None
        try:
            rec = _DECODE(raw)
        except msgspec.DecodeError:  # blank, damaged, another field or type: ingest decides
            return None
        ids, n_in = rec.hash_ids, rec.input_length
        ts = rec.timestamp * scale
        block = MOONCAKE_BLOCK if rec.block_size is None else rec.block_size
        if not (-_TS_LIMIT_US < ts < _TS_LIMIT_US and n_in >= 0 and block > 0
                and (rec.output_length is None or rec.output_length >= 0) and len(ids) <= MAX_LIST_ITEMS):
            return None
        if ids and (min(ids) < lo or max(ids) > hi):
            return None
        if len(ids) > 1 and n_in <= block * (len(ids) - 1):  # (ingest: `bad_length`)
            return None
        out.ts_us.append(ts)
        out.input_length.append(n_in)
        out.hash_ids.append(ids)
        out.block.append(block)
        order.add(ts)
    out.time_order = order.order()
    return out
