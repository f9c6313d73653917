"""Ingest by units (``replay.readers.units``) against the single process: every
table ingest writes, every column, row by row; logs whose lines end anyhow."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

from replay.readers.ingest import ingest
from replay.readers.parsed import parse_unit
from replay.store import db
from support.conversations import conversations_log
from support.logs import anthropic_wrapped

#: what ingest writes: each table whole (sources without its clock)
TABLES = ("requests", "rejects", "blobs", "sources")


def full_dump(con) -> dict:
    out = {}
    for t in TABLES:
        cols = [r[0] for r in con.execute(f"DESCRIBE {t}").fetchall() if r[0] != "ingested_at"]
        out[t] = con.execute(f"SELECT {', '.join(cols)} FROM {t} ORDER BY ALL").fetchall()
    return out


class InProcess:
    """An engine that parses each unit here, in order (the pools' contract, without processes)."""

    def __init__(self):
        self.items: list = []

    def map_ordered(self, fn, items, *args):
        for item in items:
            self.items.append(item)
            yield item, fn(item, *args)


def ingest_runs(db_path: Path, runs: list[list[str]], engine=None, **kw):
    """Each run's paths ingested into one database: (summaries, full dump)."""
    con = db.connect(str(db_path))
    try:
        summaries = [ingest(con, paths, engine=engine, **kw) for paths in runs]
        return summaries, full_dump(con)
    finally:
        con.close()


BAD_LINES = [b"", b"   ", b'{"timestamp": 1, "req', b"[1]", b'"text"', b"\xff\xfe not utf-8",
             json.dumps({**anthropic_wrapped(), "timestamp": "next tuesday"}).encode()]


def messy_lines(seed: int, tmp: Path) -> list[bytes]:
    """The lines of a generated log (chat conversations sharing their messages, or
    token lists), with rejects planted among them, in time order, reversed or shuffled."""
    rng = random.Random(seed)
    if rng.random() < 0.6:
        recs = conversations_log((seed, seed + 1), rng.choice(["anthropic", "openai"]), tmp / f"c{seed}.jsonl",
                                 n_conv=rng.randint(1, 3), turns=rng.randint(2, 5))
        lines = [json.dumps(r).encode() for r in recs]
    else:
        unit = rng.choice([1, 1000, 1_000_000])  # (a file's first number decides its unit)
        lines = [json.dumps({"ts": 1_700_000_000 * unit + i * rng.randint(0, 3 * unit), "tenant": rng.choice("ab"),
                             "tokens": [rng.randrange(9) for _ in range(rng.randrange(12))]}).encode()
                 for i in range(rng.randint(5, 40))]
    order = rng.random()
    if order < 0.2:
        lines.reverse()
    elif order < 0.35:
        rng.shuffle(lines)
    for _ in range(rng.randint(0, 6)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(BAD_LINES))
    if rng.random() < 0.2:
        lines[0] = b"\xef\xbb\xbf" + lines[0]  # a byte-order mark
    return lines


def write_lines(path: Path, lines: list[bytes], rng: random.Random, final_newline: bool | None = None) -> Path:
    """``lines`` joined by LF or CRLF (each chosen at random), the last one with or
    without its newline."""
    ends = [rng.choice([b"\n", b"\n", b"\r\n"]) for _ in lines]
    if final_newline is None:
        final_newline = rng.random() < 0.7
    if not final_newline and ends:
        ends[-1] = b""
    path.write_bytes(b"".join(x + e for x, e in zip(lines, ends)))
    return path


def slow_parse(unit, *args):
    """``parse_unit`` that first leaves a marker (``REPLAY_TEST_MARKER``) and sleeps:
    time for a test to interrupt the command in the middle of a parse."""
    marker = os.environ.get("REPLAY_TEST_MARKER")
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("REPLAY_TEST_SLEEP", "30")))
    return parse_unit(unit, *args)


def dying_parse(unit, *args):
    """``parse_unit``, except that the worker parsing a file named ``die*`` dies."""
    if os.path.basename(getattr(unit, "path", unit)).startswith("die"):
        os.kill(os.getpid(), signal.SIGKILL)
    return parse_unit(unit, *args)


def dying_render(items, name):
    """``blob_cache.render_items``, except that in a worker process (``python -c``) it dies."""
    assert sys.argv[:1] == ["-c"], "meant for a worker process, not this one"
    os.kill(os.getpid(), signal.SIGKILL)


def arrow_result(n: int):
    """A result with large buffers, as a parsed unit's: Arrow tables (one sliced, one
    empty) and bytes — what a pool's worker sends out of band."""
    import pyarrow as pa

    t = pa.table({"s": ["x" * (i % 50) + "é" for i in range(n)], "i": list(range(n))})
    return t, t.slice(n // 3), bytes(range(256)) * n, pa.table({"e": pa.array([], pa.string())})


def unpicklable_result(n: int):
    """A result that cannot be pickled (a lock)."""
    import threading

    return threading.Lock()
