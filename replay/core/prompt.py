"""One request as the replay sees it (:class:`Prompt`), and a block trace's symbols.

Kept apart from ``replay.core.prompts`` (which reads them from the database) so
that what needs only the type — the capacity pass, the direct read of a hash-id
trace (``replay capacity`` without a database) — imports no DuckDB or Arrow.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

import numpy as np

MOONCAKE_BLOCK = 512
RECENT_CONVERSATIONS = 512  # latest prompt kept per (tenant, session or key), to build the next one from


@dataclass
class Prompt:
    """One request as the replay sees it (``ts`` in integer microseconds)."""
    request_id: int
    ts: int
    tenant: str
    key: str | None
    session: str | None
    symbols: np.ndarray            # token ids, or negative block ids for block traces
    cum: np.ndarray | None         # symbol depth -> token depth (block traces only)
    output: np.ndarray | None      # generated symbols, when the log has them
    n_tokens: int
    model: str | None = None
    # the first ``shared`` symbols are those of the conversation's previous prompt,
    # which had (ts, key, session, model) = ``previous``: where that one was walked,
    # they are a path of the trie already (replay_prompts)
    shared: int = 0
    previous: tuple[int, str | None, str | None, str | None] | None = None
    # block traces: the tokens of each whole block (None: chunks of varying length)
    block: int | None = None
    # text prompts: the segments the symbols (and output) are made of, in order —
    # what a prompt sent to another process carries instead of its tokens (light)
    seg_ids: np.ndarray | None = None
    output_seg_ids: np.ndarray | None = None


def light(p: Prompt) -> Prompt:
    """``p`` without its tokens when its segments give them back (a walker of
    ``replay.core.streamed`` assembles them again): a prompt shipped to a worker
    carries segment ids, a few bytes a segment, instead of its whole conversation
    again."""
    if p.seg_ids is None:
        return p
    return altered(p, symbols=None, output=None)


def altered(p: Prompt, **changes) -> Prompt:
    """``dataclasses.replace(p, **changes)`` without its per-field checks (a
    tenth of the cost; the streamed replay's driver makes a few per prompt)."""
    q = object.__new__(type(p))
    q.__dict__ = {**p.__dict__, **changes}
    return q


def mooncake_symbols(block_ids, input_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Block ids as negative symbols, with cumulative token depths (last block partial)."""
    ids = np.asarray(block_ids, dtype=np.int64)
    sizes = np.full(len(ids), MOONCAKE_BLOCK, dtype=np.int64)
    if len(ids):
        sizes[-1] = input_length - MOONCAKE_BLOCK * (len(ids) - 1)
    cum = np.concatenate([[0], np.cumsum(sizes)])
    return -(ids + 1), cum


def block_symbols(block_ids, block_lengths, input_length: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """A block trace's symbols and cumulative token depths, from its ids and their
    token lengths (None: Mooncake's rule), and its blocks' size (None when they
    vary: RAGPulse's chunks)."""
    if block_lengths is None:
        symbols, cum = mooncake_symbols(block_ids, input_length)
        return symbols, cum, MOONCAKE_BLOCK
    ids = np.asarray(block_ids, dtype=np.int64)
    sizes = np.asarray(block_lengths, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(sizes)])
    block = int(sizes[0]) if len(sizes) else None
    if block is not None and not (np.all(sizes[:-1] == block) and sizes[-1] <= block):
        block = None
    return -(ids + 1), cum, block


def trace_blocks(p: "Prompt", b: int) -> tuple[int, int]:
    """(trace blocks per block of ``b`` tokens, whole ``b``-token blocks) of a
    block trace: only blocks its ids cover count, and ``b`` must be a multiple
    of the trace's block."""
    n_blocks = int(p.cum[-1]) // b
    if n_blocks == 0:
        return 1, 0
    if p.block is None:
        raise ValueError("a trace of chunks of varying length (RAGPulse) has no whole blocks of a fixed size")
    if b % p.block:
        raise ValueError(f"a block trace has {p.block}-token blocks: choose a multiple of it")
    return b // p.block, n_blocks


def trace_prompts(trace, tenant: str = "default") -> list[Prompt]:
    """The prompts ``iter_prompts`` reads back after ingest loaded a Mooncake
    trace (``replay.readers.direct.HashTrace``: per request, in file order,
    time in µs, prompt tokens, tokens of a block, block ids), in processing
    order: time, then file order. Each request's symbols and depths are what
    :func:`mooncake_symbols` makes (views of one array made for all of them);
    a block of another size than 512 has its lengths stored by ingest
    (``readers.traces.convert_mooncake``), and so here."""
    off, n_in, block = trace.offsets, trace.input_length, trace.block
    k = np.diff(off)
    symbols = -(trace.ids + 1)
    # depths: request i's k_i + 1 entries are 0, 512, …, 512·(k_i − 1), then its input_length
    starts = off + np.arange(len(off))  # (where request i's depths start: its ids before, plus one each)
    within = np.arange(int(starts[-1]), dtype=np.int64) - np.repeat(starts[:-1], k + 1)
    cum = MOONCAKE_BLOCK * within
    last = starts[:-1] + k
    cum[last[k > 0]] = n_in[k > 0]
    # (each Prompt made as ``altered`` makes one: its defaults, then this request's fields)
    base = {f.name: f.default for f in fields(Prompt) if f.default is not MISSING}
    ts, offs, firsts, n_ins, blocks = (a.tolist() for a in (trace.ts_us, off, starts, n_in, block))
    out = []
    for i in np.argsort(trace.ts_us, kind="stable").tolist():  # (stable: ties keep the file's order)
        a, b, n = offs[i], offs[i + 1], n_ins[i]
        if blocks[i] != MOONCAKE_BLOCK and b > a:
            size = blocks[i]
            lengths = [size] * (b - a - 1) + [min(size, n - size * (b - a - 1))]
            sym, depths, size = block_symbols(trace.ids[a:b], lengths, n)
        else:
            sym, depths, size = symbols[a:b], cum[firsts[i]:firsts[i] + b - a + 1], MOONCAKE_BLOCK
        q = object.__new__(Prompt)
        q.__dict__ = {**base, "request_id": i, "ts": ts[i], "tenant": tenant, "key": None, "session": None,
                      "symbols": sym, "cum": depths, "output": None, "n_tokens": max(int(depths[-1]), n),
                      "block": size}
        out.append(q)
    return out
