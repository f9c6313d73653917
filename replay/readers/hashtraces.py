"""Hash-id traces beside Mooncake's → `requests` rows: `bailian`, `ragpulse`, `kv-cache-tester`.

Each gives, per request, block ids with each block's token length
(`requests.block_lengths`); the replay walks them as it walks Mooncake's
(`replay.core.prompts`). Tokens beyond the blocks' sum (`input_length` is
larger) are prompt tokens that never hit.

Ids are stored re-chained (:func:`chain_ids`): the id of a block identifies
its own id *and* every id before it, salted — as Mooncake's ids already are —
so an id means one prefix whichever trace it came from:

* ``bailian`` — Qwen's Bailian traces (github.com/alibaba-edu/qwen-bailian-usagetraces-anon,
  README "Data Specification"): one JSON object a line with ``chat_id``,
  ``parent_chat_id`` (-1 for a root), ``timestamp`` (seconds from the trace's
  start), ``input_length``, ``output_length``, ``type``, ``turn`` and
  ``hash_ids``: salted SipHash ids of each 16-token block of the prompt, hashed
  block by block (the same block at another place has the same id: not unique
  per prefix). The session is the chain of chats (a chat's root). The last
  block may be partial (as Mooncake's). An optional ``block_size`` (ours, as
  ``replay export`` writes it) overrides the 16.
* ``ragpulse`` — RAGPulse (github.com/flashserve/RAGPulse, README
  "Components"): ``timestamp`` (seconds, a string), ``input_length``,
  ``output_length``, ``session_id`` and ``hash_ids`` as an object of prompt
  components, each a list of content-chunk ids whose token lengths are in the
  side files ``1_sys_prompt.jsonl`` … ``5_web_search.jsonl`` beside the trace
  (``{"<kind>_id": id, "token_length": n}``). The prompt is the chunks in the
  documented order sys_prompt → passages → history → web_search → user_input
  (the order of the upstream replayer, ``example/*/preprocess_data.py``, which
  reads the components in the file's key order: this one). ``input_length``
  exceeds the chunks' sum by the template's tokens (6–12 in the published
  trace): the tail.
* ``kv-cache-tester`` — the Claude Code traces of github.com/callanjfox/kv-cache-tester
  (``docs/trace_replay_tester.md``, "Trace Format"; ``trace_replay_tester.py``,
  ``normalize_request``/``flatten_requests``): one JSON document per
  conversation, ``id``, ``block_size`` (64), ``hash_id_scope`` ("local": ids
  mean nothing outside the file), ``requests``: ``t`` (seconds from the
  conversation's start), ``in``, ``out``, ``model``, ``hash_ids`` (whole
  blocks only: ``len(hash_ids) == in // block_size``); an entry of ``type``
  "subagent" holds its own ``requests`` timed from its own ``t``. A file is
  one session; its ids are salted with a digest of the file's bytes, so they
  never meet another file's.

The side files of RAGPulse hold no requests: ingest records them as sources of
format ``ragpulse-lengths`` with no units (:func:`is_lengths_record`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

import numpy as np

from replay.readers.fields import (INT64, MISSING, Options, Reject, as_str, common_attrs, document_list, get_path,
                                   int_or_none, type_name)
from replay.readers.files import beside, is_file, open_binary, trajectory_stem
from replay.readers.timestamps import parse_ts, record_ts
from replay.readers.traces import block_size, int_list, length, uniform_lengths

BAILIAN_BLOCK = 16
KV_TESTER_BLOCK = 64
#: RAGPulse's prompt components in prompt order, with the side file of each one's chunk lengths
RAGPULSE_PARTS = (("sys_prompt", "1_sys_prompt.jsonl"), ("passages_ids", "2_passages.jsonl"),
                  ("history", "3_history.jsonl"), ("web_search", "5_web_search.jsonl"),
                  ("user_input", "4_user_input.jsonl"))
LENGTHS_FORMAT = "ragpulse-lengths"


# ----------------------------------------------------------------- chained ids

_U = np.uint64
_P1, _P2 = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03  # odd: invertible modulo 2**64
_Q1, _Q2 = pow(_P1, -1, 1 << 64), pow(_P2, -1, 1 << 64)
_powers: dict[int, np.ndarray] = {}


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on uint64 (wrapping)."""
    x = x ^ (x >> _U(30))
    x = x * _U(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U(27))
    x = x * _U(0x94D049BB133111EB)
    return x ^ (x >> _U(31))


def _pow(base: int, n: int) -> np.ndarray:
    """base**0 … base**(n-1) modulo 2**64 (kept, grown by doubling)."""
    have = _powers.get(base)
    if have is None or len(have) < n:
        size = max(n, 2 * len(have) if have is not None else 1024)
        arr = np.empty(size, dtype=np.uint64)
        arr[0] = 1
        np.cumprod(np.full(size - 1, base, dtype=np.uint64), out=arr[1:])
        _powers[base] = have = arr
    return have[:n]


def salt_of(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def chain_ids(ids, salt: int) -> list[int]:
    """The chained id of every prefix of ``ids``: element i identifies (salt,
    ids[0..i]) — two lists get equal ids at i exactly when they agree up to i
    (up to the collisions of a 62-bit hash). Non-negative, below 2**62.

    Two polynomial prefix hashes modulo 2**64 of the salted, mixed ids (with
    different odd bases), mixed with the prefix length: vectorised, so a trace
    of millions of ids is re-chained in numpy, not a Python loop."""
    x = np.asarray(ids, dtype=np.int64).view(np.uint64)
    n = len(x)
    if n == 0:
        return []
    m = _mix(x ^ _U(salt))
    a = _pow(_P1, n) * np.cumsum(m * _pow(_Q1, n))
    b = _pow(_P2, n) * np.cumsum(_mix(m + _U(0x632BE59BD9B4E019)) * _pow(_Q2, n))
    depth = np.arange(1, n + 1, dtype=np.uint64) * _U(0xA24BAED4963EE407)
    return (_mix(a ^ _mix(b ^ depth)) >> _U(2)).astype(np.int64).tolist()


# ----------------------------------------------------------------- helpers

def _stem(opts: Options) -> str:
    path = opts.file_state.get("path")
    return trajectory_stem(path) if path else "trace"


# ----------------------------------------------------------------- bailian

def convert_bailian(rec: dict, opts: Options) -> dict:
    ts = record_ts(rec, opts, default_unit="s")
    if rec.get("hash_ids") is None:
        raise Reject("no_prompt", "no 'hash_ids' field in the record")
    ids = int_list(rec["hash_ids"], "hash_ids", INT64)
    n_in = length(rec, "input_length", True)
    block = block_size(rec, BAILIAN_BLOCK)
    row = common_attrs(rec, opts)
    if "session" not in opts.fields:
        root = _chat_root(rec, opts)
        if root is not None:
            row["session"] = f"{_stem(opts)}:{root}"
    row.update(ts_us=ts, input_length=n_in, output_length=length(rec, "output_length", False),
               block_lengths=uniform_lengths(len(ids), block, n_in, "hash_ids"),
               block_ids=chain_ids(ids, salt_of("bailian")),
               model=as_str(get_path(rec, opts.fields["model"]) if "model" in opts.fields else rec.get("model"),
                            opts.fields.get("model", "model")))
    return row


def _chat_root(rec: dict, opts: Options) -> int | None:
    """The root chat of the record's conversation (its session): a chat's parent's
    root, the parent itself when that was not seen, the chat when it is a root."""
    chat, parent = rec.get("chat_id"), rec.get("parent_chat_id", -1)
    if chat is None:
        return None
    cid, pid = int_or_none(chat), int_or_none(parent) if parent is not None else -1
    if cid is None:
        raise Reject("wrong_type", f"field 'chat_id' is {type_name(chat)}, expected an integer")
    if pid is None:
        raise Reject("wrong_type", f"field 'parent_chat_id' is {type_name(parent)}, expected an integer")
    roots = opts.file_state.setdefault("chat_roots", {})
    root = cid if pid < 0 else roots.get(pid, pid)
    roots[cid] = root
    return root


# ----------------------------------------------------------------- ragpulse

def is_lengths_record(rec: Any) -> bool:
    """A line of RAGPulse's side files: ``{"<kind>_id": id, "token_length": n}``."""
    return (isinstance(rec, dict) and len(rec) == 2 and "token_length" in rec
            and any(isinstance(k, str) and k.endswith("_id") for k in rec))


def _ragpulse_lengths(opts: Options) -> dict[int, int]:
    """Chunk id → token length, from the side files beside the trace (read once a file)."""
    got = opts.file_state.get("chunk_lengths")
    if got is not None:
        return got
    lengths: dict[int, int] = {}
    path = opts.file_state.get("path")
    for _, name in RAGPULSE_PARTS:
        for cand in ((name, name + ".gz", name + ".zst") if path else ()):
            p = beside(path, cand)  # (a URI's side files are beside it in its bucket)
            if is_file(p):
                _read_lengths(p, lengths)
                break
    opts.file_state["chunk_lengths"] = lengths
    return lengths


def _read_lengths(path: str, into: dict[int, int]) -> None:
    with open_binary(path) as fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # a malformed side line: the chunks it names are rejected where used
            if not is_lengths_record(rec):
                continue
            key = next(k for k in rec if k != "token_length")
            cid, n = int_or_none(rec[key]), int_or_none(rec["token_length"])
            if cid is not None and n is not None and n >= 0:
                into[cid] = n


def convert_ragpulse(rec: dict, opts: Options) -> dict:
    ts = record_ts(rec, opts, default_unit="s")
    parts = rec.get("hash_ids")
    if parts is None:
        raise Reject("no_prompt", "no 'hash_ids' field in the record")
    if not isinstance(parts, dict):
        raise Reject("wrong_type", f"field 'hash_ids' is {type_name(parts)}, expected an object of prompt components")
    known = {name for name, _ in RAGPULSE_PARTS}
    extra = sum(1 for k in parts if k not in known)
    if extra:
        raise Reject("wrong_type", f"field 'hash_ids' has {extra} component(s) beyond "
                                   f"{', '.join(name for name, _ in RAGPULSE_PARTS)}")
    n_in = length(rec, "input_length", True)
    table = _ragpulse_lengths(opts)
    ids: list[int] = []
    lengths: list[int] = []
    for name, side in RAGPULSE_PARTS:
        v = parts.get(name)
        if v is None:
            continue
        for i, cid in enumerate(int_list(v, f"hash_ids.{name}", INT64)):
            n = table.get(cid)
            if n is None:
                raise Reject("unknown_chunk", f"hash_ids.{name}[{i}] has no token length in {side} beside the trace")
            ids.append(cid)
            lengths.append(n)
    if sum(lengths) > n_in:
        raise Reject("bad_length", "field 'input_length' is less than the token lengths of the "
                                             "chunks of 'hash_ids'")
    row = common_attrs(rec, opts)
    row.update(ts_us=ts, input_length=n_in, output_length=length(rec, "output_length", False),
               block_ids=chain_ids(ids, salt_of("ragpulse")), block_lengths=lengths,
               model=as_str(rec.get("model"), "model"))
    return row


# ----------------------------------------------------------------- kv-cache-tester

def is_kv_trace(doc: Any) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("requests"), list)
            and ("block_size" in doc or "hash_id_scope" in doc) and "messages" not in doc)


def convert_kv_trace(doc: Any, stem: str, opts: Options) -> Iterator[tuple[int, dict | Reject]]:
    """A kv-cache-tester conversation → one row (or Reject) per request, sub-agents'
    requests included (numbered from 1 in the document's order, a sub-agent's
    where its entry stands). Raises Reject for the whole file when the document
    is not such a trace."""
    reqs = document_list(doc, "requests", "a kv-cache-tester trace object")
    block = block_size(doc, KV_TESTER_BLOCK)
    salt = opts.file_state.get("salt")
    ctx = {
        "block": block,
        "salt": salt if salt is not None else salt_of(f"kv-cache-tester:{stem}"),
        "session": as_str(doc.get("id"), "id") if isinstance(doc.get("id"), (str, int)) else None,
        "n": 0,
    }
    ctx["session"] = ctx["session"] or stem
    yield from _kv_entries(reqs, 0, "requests", ctx, opts)


def _kv_entries(entries: list, base_us: int, where: str, ctx: dict, opts: Options):
    for i, e in enumerate(entries):
        if isinstance(e, dict) and e.get("type") == "subagent":
            try:
                start = base_us + _kv_time(e, f"{where}[{i}].t")
                sub = e.get("requests")
                if not isinstance(sub, list):
                    raise Reject("wrong_type", f"field '{where}[{i}].requests' of a sub-agent is {type_name(sub)}, "
                                               "expected an array")
            except Reject as r:
                ctx["n"] += 1
                yield ctx["n"], r
                continue
            yield from _kv_entries(sub, start, f"{where}[{i}].requests", ctx, opts)
            continue
        ctx["n"] += 1
        try:
            yield ctx["n"], _kv_row(e, base_us, f"{where}[{i}]", ctx)
        except Reject as r:
            yield ctx["n"], r


def _kv_time(e: dict, fname: str) -> int:
    v = e.get("t", MISSING)
    return parse_ts(v, fname, "s")


def _kv_row(e: Any, base_us: int, where: str, ctx: dict) -> dict:
    if not isinstance(e, dict):
        raise Reject("wrong_type", f"{where} is {type_name(e)}, expected a request object")
    ts = base_us + _kv_time(e, f"{where}.t")
    if e.get("hash_ids") is None:
        raise Reject("no_prompt", f"no 'hash_ids' field in {where}")
    ids = int_list(e["hash_ids"], f"{where}.hash_ids", INT64)
    n_in = length(e, "in", True)
    block = ctx["block"]
    if len(ids) * block > n_in:
        raise Reject("bad_length", f"field '{where}.in' is less than its {len(ids)} whole blocks of "
                                             f"{block} tokens")
    return {
        "ts_us": ts,
        "tenant": "default",
        "session": ctx["session"],
        "model": as_str(e.get("model"), f"{where}.model"),
        "input_length": n_in,
        "output_length": length(e, "out", False),
        "block_ids": chain_ids(ids, ctx["salt"]),
        "block_lengths": [block] * len(ids),
    }
