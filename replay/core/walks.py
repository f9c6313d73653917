"""The `walks` table: one row per (variant, mode, request), written by the replay, read flat.

A row holds the request's stream and model (together, the cache it could hit),
its time (µs), its prompt length and its steps: ``gaps`` (µs, non-decreasing),
``depths`` (tokens, ascending), from which ``replay.core.hits`` reads ``L_τ``,
and ``origins`` (who last wrote each step's part of the prefix, codes of
``replay.core.streams.ORIGINS``; steps split where it changes, so two steps
may share a gap).
Reading checks `walk_sets` first (``replay.store.walksets``): a set that is not
current for the data and the horizon asked for is refused, never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from replay.store import db, walksets


@dataclass
class Walks:
    """The walks of some stream modes, flat: request ``r``'s steps are
    ``gaps[offsets[r]:offsets[r + 1]]`` (non-decreasing) and the depths (and origins)
    beside them."""
    mode: np.ndarray           # the request's stream mode, as its place in the modes asked for
    request_id: np.ndarray     # int64
    ts_us: np.ndarray          # int64
    stream: np.ndarray | None  # its stream key (when asked for)
    model: np.ndarray | None   # its model (None where the log has none; when asked for)
    prompt_tokens: np.ndarray  # int64
    offsets: np.ndarray        # int64, n + 1, from 0
    gaps: np.ndarray           # int64 µs
    depths: np.ndarray         # int64 tokens
    origins: np.ndarray | None = None  # int8 origin codes (replay.core.streams.ORIGINS), when asked for

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def read_walks(con, modes, variant: str = "prompt", horizon_us: int = 0,
               with_streams: bool = True, with_origins: bool = False) -> Walks:
    """The walks of ``modes`` (in that order of mode codes), refused unless current
    for ``horizon_us`` (:class:`replay.store.walksets.StaleWalks`); with their
    steps' origins when ``with_origins``."""
    modes = tuple(modes)
    walksets.require_current(con, [(variant, m) for m in modes], horizon_us)
    names = ", ".join(repr(m) for m in modes)
    streams = "stream, model, " if with_streams else ""
    origins = ", origins" if with_origins else ""
    tbl = db.arrow(con, f"""SELECT list_position([{names}], mode)::INTEGER - 1 AS mode_code, request_id, ts_us,
                                   {streams}prompt_tokens, gaps, depths{origins}
                            FROM walks WHERE variant = {variant!r} AND mode IN ({names})""")
    gaps = tbl.column("gaps").combine_chunks()
    offsets = gaps.offsets.to_numpy().astype(np.int64)
    orig = None
    if with_origins:
        col = tbl.column("origins").combine_chunks()
        if col.null_count:  # (rows of a replay before origins were kept: never current, never read)
            raise walksets.StaleWalks("walks without their origins: prepare them again (replay.prepare.prepare)")
        orig = col.flatten().to_numpy(zero_copy_only=False).astype(np.int8, copy=False)
    return Walks(
        mode=tbl.column("mode_code").to_numpy(),
        request_id=tbl.column("request_id").to_numpy(),
        ts_us=tbl.column("ts_us").to_numpy(),
        stream=tbl.column("stream").to_numpy(zero_copy_only=False) if with_streams else None,
        model=tbl.column("model").to_numpy(zero_copy_only=False) if with_streams else None,
        prompt_tokens=tbl.column("prompt_tokens").to_numpy().astype(np.int64),
        offsets=offsets - offsets[0] if len(offsets) else np.zeros(1, dtype=np.int64),
        gaps=gaps.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
        depths=tbl.column("depths").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64),
        origins=orig)


def delete_walks(con, keys) -> None:
    """Forget and delete the rows of these (variant, mode) sets."""
    walksets.forget(con, keys)
    for v, m in keys:
        con.execute("DELETE FROM walks WHERE variant = ? AND mode = ?", [v, m])


WALK_COLUMNS = ("request_id", "stream", "model", "ts_us", "prompt_tokens", "gaps", "depths", "origins")


def walks_table(result: dict) -> pa.Table | None:
    """The rows of every (variant, mode) in ``result`` — lists of tuples in
    :data:`WALK_COLUMNS` order — as one Arrow table of `walks` columns (None: no rows)."""
    parts = []
    for (v, m), rows in result.items():
        if not rows:
            continue
        rid, stream, model, ts, ntok, gaps, depths, origins = zip(*rows)
        parts.append(pa.table({
            "variant": pa.array([v] * len(rows)), "mode": pa.array([m] * len(rows)),
            "request_id": pa.array(rid, pa.int64()), "stream": pa.array(stream, pa.string()),
            "model": pa.array(model, pa.string()), "ts_us": pa.array(ts, pa.int64()),
            "prompt_tokens": pa.array(ntok, pa.int64()),
            "gaps": pa.array(gaps, pa.list_(pa.int64())),
            "depths": pa.array(depths, pa.list_(pa.int64())),
            "origins": pa.array(origins, pa.list_(pa.int8())),
        }))
    return pa.concat_tables(parts) if parts else None


def insert_walks(con, result) -> None:
    """Add rows to `walks`, in one insert: those of every (variant, mode) in
    ``result`` (lists of tuples in :data:`WALK_COLUMNS` order), or ``result``
    itself when it is a table of :func:`walks_table` (rows made in another process)."""
    tbl = result if isinstance(result, pa.Table) else walks_table(result)  # noqa: F841 - read by DuckDB by name
    if tbl is not None and tbl.num_rows:
        con.execute("INSERT INTO walks BY NAME SELECT * FROM tbl")
