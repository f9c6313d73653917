"""`replay export`: the loaded requests as a trace other tools replay.

Requests are written in processing order (time, ties in input order), the
replayable ones only (a request set aside as unrenderable is left out, as the
sweep leaves it out). Two text-free layouts, whose ids stand for blocks of
``block`` tokens:

* ``mooncake`` — JSON Lines in Mooncake's layout (github.com/kvcache-ai/Mooncake,
  FAST25-release/traces): ``timestamp`` (milliseconds from the first request;
  decimals where the log has finer times, so gaps stay exact), ``input_length``,
  ``output_length`` (left out when the log has none) and ``hash_ids``: one id
  per block, the last one partial (``len(hash_ids) == ceil(input_length /
  block)``). An id stands for its block's whole prefix — parent-chained, as
  vLLM's block hashes — salted with the request's model (a cache belongs to one
  model) and, with a stream mode, its stream key; ids count from 0 in order of
  first use, as Mooncake's remapped ids. A block other than Mooncake's 512 is
  written as ``block_size`` (ours: ``replay`` reads it back; readers that do not
  know it read the ids alone). SGLang's ``bench_serving --dataset-name
  mooncake`` (python/sglang/benchmark/datasets/mooncake.py, ``MooncakeDataset``
  and ``build_mooncake_session_requests``) reads ``record["timestamp"]``
  (sorted, in ms), ``record.get("hash_ids", [])`` and
  ``record.get("output_length", 256)``, its block size from
  ``--mooncake-block-size``; AIPerf's ``mooncake_trace`` reads the same four
  fields.
* ``bailian`` — the layout of Qwen's Bailian traces
  (github.com/alibaba-edu/qwen-bailian-usagetraces-anon, README "Data
  Specification"): ``chat_id``, ``parent_chat_id`` (the session's previous
  request, -1 for its first), ``timestamp`` (seconds), ``input_length``,
  ``output_length``, ``type`` ("text"), ``turn`` and ``hash_ids``: an id per
  block (16 tokens unless ``block``), of the block's own tokens salted with the
  request's cache (equal blocks have equal ids wherever they stand, as
  Bailian's SipHash ids; a reader re-chains them). From a block trace, whose
  blocks' tokens are unknown, the ids are chained as Mooncake's.

Two layouts hold prompt text, written only when asked (``show_text``): the text
is the tokenized prompt decoded with the tokenizer that encoded it (the neutral
template's markers included, so the roles stay apart):

* ``vllm-custom`` — ``vllm bench serve --dataset-name custom``
  (vllm/benchmarks/datasets: ``CustomDataset.load_data`` reads a ``.jsonl`` file
  with a ``prompt`` column; the output length is ``--custom-output-len``):
  ``{"prompt": text}``.
* ``sglang`` — ``python -m sglang.bench_serving --dataset-name custom``
  (``sample_custom_requests``: the first two turns of ``conversations``, their
  ``content``): ``{"conversations": [{"role": "user", "content": prompt},
  {"role": "assistant", "content": output}]}`` — the logged output when there
  is one, else empty (then give ``--sharegpt-output-len``).

Exact by construction: exporting at ``block`` B and sweeping the export as a
Mooncake trace gives the source's ceiling at B in global mode for every TTL
(``tests/analysis/test_export.py``): block k of two requests has one id exactly when
their tokens agree up to the block's end, and the times are the source's.
From a block trace, a block holding tokens the trace has no ids for (beyond
the ids' sum: the tail) gets an id of its own, never shared.
"""

from __future__ import annotations

import json
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from replay.core.prompts import RECENT_CONVERSATIONS, iter_prompts
from replay.core.streams import check_modes, stream_key
from replay.prepare import decoding_tokenizer, prepare

TARGETS = ("mooncake", "bailian", "vllm-custom", "sglang")
TEXT_TARGETS = ("vllm-custom", "sglang")
DEFAULT_BLOCK = {"mooncake": 512, "bailian": 16}


class ExportRefused(ValueError):
    """An export that cannot be made as asked (a usage error)."""


class TextRefused(ExportRefused):
    """A text layout asked for without ``show_text``."""


@dataclass
class ExportSummary:
    target: str
    path: str
    block: int | None
    requests: int = 0        # written
    skipped: int = 0         # block traces left out of a text layout (they hold no text)
    blocks: int = 0          # ids written
    distinct_blocks: int = 0  # distinct ids


def export(con, path: str, to: str = "mooncake", block: int | None = None, stream: str | None = None,
           show_text: bool = False, tokenizer=None, progress: bool = False) -> ExportSummary:
    """Write the database's requests to ``path`` in layout ``to`` (``TARGETS``).

    ``block``: tokens per id (default 512 for Mooncake, 16 for Bailian);
    ``stream``: also salt the ids with the request's stream key under this mode
    (a block then never meets another stream's); the model always salts them.
    Text layouts raise :class:`TextRefused` unless ``show_text``. Tokenizes
    what waits for it (``prepare``); the file is written whole or not at all.
    """
    if to not in TARGETS:
        raise ValueError(f"unknown export layout {to!r}; choose from {', '.join(TARGETS)}")
    if to in TEXT_TARGETS and not show_text:
        raise TextRefused(f"--to {to} writes prompt text: pass --show-text to allow it")
    if stream is not None:
        check_modes([stream])
    if to in TEXT_TARGETS:
        block = None
    else:
        block = DEFAULT_BLOCK[to] if block is None else int(block)
        if block < 1:
            raise ValueError("the block size must be at least 1 token")
    tok = None
    if to in TEXT_TARGETS or tokenizer is not None:
        try:
            tok = decoding_tokenizer(con, tokenizer)
        except ValueError as e:
            raise ExportRefused(str(e)) from None
    prepare(con, modes=(), tokenizer=tok, progress=progress)
    summary = ExportSummary(to, str(path), block)
    outputs = _output_lengths(con)
    n_total = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_total, unit="req", desc=f"export {to}", file=sys.stderr)
    tmp = f"{path}.partial"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            if to in TEXT_TARGETS:
                _write_text(con, fh, to, tok, outputs, summary, bar)
            else:
                _write_ids(con, fh, to, block, stream, outputs, summary, bar)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    finally:
        if bar is not None:
            bar.close()
    return summary


def _output_lengths(con) -> dict[int, int]:
    """request id → its output tokens: the trace's own count, the logged usage,
    else the tokens of its rendered output (absent when none is known)."""
    rows = con.execute("""SELECT r.request_id, coalesce(r.output_length, r.usage_output_tokens, p.output_n_tokens)
                          FROM requests r LEFT JOIN prompts p USING (request_id)""").fetchall()
    return {rid: int(n) for rid, n in rows if n is not None}


def _decimal(us: int, scale: int) -> str:
    """``us`` microseconds in units of ``scale`` µs, as exact decimal text."""
    q, r = divmod(us, scale)
    if r == 0:
        return str(q)
    width = len(str(scale)) - 1
    return f"{q}.{r:0{width}d}".rstrip("0")


# ----------------------------------------------------------------- ids

_ROOTS = 1 << 31  # caches are -1, -2, …: shifted to be non-negative in a key
_MASK64 = (1 << 64) - 1


class _Ids:
    """Ids from 0 in order of first use; a key seen before gets its id again."""

    def __init__(self):
        self.known: dict = {}
        self.next = 0
        self.roots: dict = {}

    def fresh(self) -> int:
        self.next += 1
        return self.next - 1

    def of(self, parent: int, digest: int, end: int) -> int:
        """The id of a block: its parent (or cache) id, its tokens' 64-bit digest and
        its end, packed into one int without loss (a third of a tuple's memory)."""
        key = ((((parent + _ROOTS) << 40) | end) << 64) | (digest & _MASK64)
        i = self.known.get(key)
        if i is None:
            i = self.known[key] = self.fresh()
        return i

    def root(self, cache) -> int:
        """A negative stand-in for a cache (model, stream): the parent of its first block."""
        return self.roots.setdefault(cache, -1 - len(self.roots))


def block_ids(p, block: int, root: int, ids: _Ids, chained: bool, reuse: list[int] | None = None) -> list[int]:
    """The ids of a prompt's blocks of ``block`` tokens (the last one partial).

    Chained: a block's key is (its parent's id, its tokens, its end), so equal
    ids mean equal prompts up to the block's end. Not chained (Bailian): (the
    cache, its tokens, its length). ``reuse``: the ids of the conversation's
    previous prompt, whose first ``p.shared`` tokens this one repeats."""
    n = p.n_tokens
    n_blocks = -(-n // block)
    if p.cum is not None:
        return _trace_block_ids(p, block, n_blocks, root, ids)
    toks = np.asarray(p.symbols, dtype=np.int64)  # one width, so equal tokens give equal bytes
    out: list[int] = []
    if reuse is not None:
        out = reuse[:min(p.shared // block, n_blocks)]
    parent = out[-1] if out else root
    for k in range(len(out), n_blocks):
        a, e = k * block, min((k + 1) * block, n)
        h = hash(toks[a:e].tobytes())
        parent = ids.of(parent, h, e) if chained else ids.of(root, h, e - a)
        out.append(parent)
    return out


def _trace_block_ids(p, block: int, n_blocks: int, root: int, ids: _Ids) -> list[int]:
    """A block trace's blocks of ``block`` tokens, always chained: a block is the
    trace's ids up to the one holding its last token, and its end. Blocks with
    tokens beyond the trace's ids get ids of their own."""
    cum, syms = p.cum, p.symbols
    hashed = int(cum[-1])
    ends = np.minimum(np.arange(1, n_blocks + 1, dtype=np.int64) * block, p.n_tokens)
    holder = np.searchsorted(cum, ends, side="left") - 1  # the trace block holding each end's last token
    out: list[int] = []
    parent, done = root, -1
    for k in range(n_blocks):
        e = int(ends[k])
        if e > hashed:
            out.append(ids.fresh())
            continue
        j = int(holder[k])
        parent = ids.of(parent, hash(syms[done + 1:j + 1].tobytes()), e)
        done = j
        out.append(parent)
    return out


def _write_ids(con, fh, to: str, block: int, stream: str | None, outputs: dict, summary: ExportSummary, bar) -> None:
    ids = _Ids()
    chained = to == "mooncake"
    last: OrderedDict = OrderedDict()    # conversation → (cache, its latest prompt's ids)
    chats: dict = {}                     # session → (last chat id, turns) (bailian)
    t0 = None
    extra = f', "block_size": {block}' if block != DEFAULT_BLOCK[to] else ""
    for p in iter_prompts(con):
        t0 = p.ts if t0 is None else t0
        cache = (p.model, stream_key(stream, p.tenant, p.key, p.session) if stream else None)
        root = ids.root(cache)
        conv = (p.tenant, p.session or p.key)
        before = last.get(conv) if p.cum is None and p.shared else None
        reuse = before[1] if before is not None and before[0] == cache else None
        b_ids = block_ids(p, block, root, ids, chained, reuse)
        if p.cum is None:
            last[conv] = (cache, b_ids)
            last.move_to_end(conv)
            if len(last) > RECENT_CONVERSATIONS:
                last.popitem(last=False)
        out_len = outputs.get(p.request_id)
        hash_text = "[" + ",".join(map(str, b_ids)) + "]"
        if to == "mooncake":
            line = (f'{{"timestamp": {_decimal(p.ts - t0, 1000)}, "input_length": {p.n_tokens}'
                    + (f', "output_length": {out_len}' if out_len is not None else "")
                    + f', "hash_ids": {hash_text}{extra}}}')
        else:
            chat = summary.requests
            parent, turn = -1, 1
            if p.session is not None:
                prev = chats.get((p.tenant, p.session))
                if prev is not None:
                    parent, turn = prev[0], prev[1] + 1
                chats[(p.tenant, p.session)] = (chat, turn)
            line = (f'{{"chat_id": {chat}, "parent_chat_id": {parent}, '
                    f'"timestamp": {_decimal(p.ts - t0, 1_000_000)}, "input_length": {p.n_tokens}, '
                    f'"output_length": {out_len if out_len is not None else 0}, "type": "text", '
                    f'"turn": {turn}, "hash_ids": {hash_text}{extra}}}')
        fh.write(line + "\n")
        summary.requests += 1
        summary.blocks += len(b_ids)
        if bar is not None:
            bar.update(1)
    summary.distinct_blocks = ids.next


def _write_text(con, fh, to: str, tok, outputs: dict, summary: ExportSummary, bar) -> None:
    decode = tok.tokenizer.decode
    for p in iter_prompts(con, with_output=(to == "sglang")):
        if bar is not None:
            bar.update(1)
        if p.cum is not None:  # a block trace: no text to write
            summary.skipped += 1
            continue
        text = decode(p.symbols.tolist(), skip_special_tokens=False)
        if to == "vllm-custom":
            rec: dict = {"prompt": text}
        else:
            out = decode(p.output.tolist(), skip_special_tokens=False) if p.output is not None else ""
            rec = {"conversations": [{"role": "user", "content": text}, {"role": "assistant", "content": out}]}
        fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        summary.requests += 1
