"""Token-level traces → `requests` row: `tokens` (token ids per request) and
`mooncake` (Mooncake's block hash ids with input/output lengths, timestamps in ms)."""

from __future__ import annotations

from typing import Any

from replay.readers.fields import (INT32, INT64, MAX_LIST_ITEMS, MISSING, TENANT_NAMES, Options, Reject, as_str,
                                   common_attrs, int_or_none, lookup_field, get_path, type_name)
from replay.readers.timestamps import record_ts


MOONCAKE_BLOCK = 512  # tokens of a Mooncake block (replay.core.prompts.MOONCAKE_BLOCK)


def int_list(v: Any, fname: str, bounds: tuple[int, int]) -> list[int]:
    if not isinstance(v, list):
        raise Reject("wrong_type", f"field '{fname}' is {type_name(v)}, expected an array of integers")
    if len(v) > MAX_LIST_ITEMS:
        raise Reject("too_large", f"field '{fname}' has {len(v):,} items, more than the {MAX_LIST_ITEMS:,} allowed")
    lo, hi = bounds
    for i, x in enumerate(v):
        if type(x) is not int:
            if isinstance(x, float) and x.is_integer():
                v = [int(y) if isinstance(y, float) and y.is_integer() else y for y in v]
                return int_list(v, fname, bounds)
            raise Reject("wrong_type", f"{fname}[{i}] is {type_name(x)}, expected an integer")
        if not lo <= x <= hi:
            raise Reject("wrong_type", f"{fname}[{i}] is out of range for a {'32' if hi < 2**32 else '64'}-bit integer")
    return v


def convert_tokens(rec: dict, opts: Options) -> dict:
    ts = record_ts(rec, opts)
    if "tokens" not in rec or rec["tokens"] is None:
        raise Reject("no_prompt", "no 'tokens' field in the record")
    toks = int_list(rec["tokens"], "tokens", INT32)
    row = common_attrs(rec, opts)
    tname, tenant = lookup_field(rec, opts, "tenant", TENANT_NAMES)
    if tenant is MISSING:
        raise Reject("missing_tenant", f"no tenant field ({opts.fields.get('tenant') or '/'.join(TENANT_NAMES)}) "
                                       f"in the record; the tokens format requires one")
    row["ts_us"] = ts
    row["tokens"] = toks
    if rec.get("output_tokens") is not None:
        row["output_tokens"] = int_list(rec["output_tokens"], "output_tokens", INT32)
    if "model" in opts.fields:
        row["model"] = as_str(get_path(rec, opts.fields["model"]), opts.fields["model"])
    else:
        row["model"] = as_str(rec.get("model"), "model")
    if "user_id" in opts.fields:
        row["user_id"] = as_str(get_path(rec, opts.fields["user_id"]), opts.fields["user_id"])
    return row


def length(rec: dict, name: str, required: bool) -> int | None:
    v = rec.get(name)
    if v is None:
        if required:
            raise Reject("missing_field", f"no '{name}' field in the record")
        return None
    n = int_or_none(v)
    if n is None or n < 0:
        raise Reject("wrong_type", f"field '{name}' is {type_name(v)}, expected a non-negative integer")
    return n


def block_size(rec: dict, default: int) -> int:
    v = rec.get("block_size")
    if v is None:
        return default
    n = int_or_none(v)
    if n is None or n <= 0:
        raise Reject("wrong_type", f"field 'block_size' is {type_name(v)}, expected a positive integer")
    return n


def uniform_lengths(n_ids: int, block: int, input_length: int, fname: str) -> list[int]:
    """Mooncake's rule at ``block`` tokens: every block whole but the last, which
    holds the rest of ``input_length`` (tokens beyond the ids never hit)."""
    if n_ids == 0:
        return []
    if input_length <= block * (n_ids - 1):
        raise Reject("bad_length", f"field 'input_length' is at most {n_ids - 1} blocks of {block} "
                                   f"tokens, but '{fname}' has {n_ids} blocks")
    return [block] * (n_ids - 1) + [min(block, input_length - block * (n_ids - 1))]


def convert_mooncake(rec: dict, opts: Options) -> dict:
    ts = record_ts(rec, opts, default_unit="ms")
    if rec.get("hash_ids") is None:
        raise Reject("no_prompt", "no 'hash_ids' field in the record")
    blocks = int_list(rec["hash_ids"], "hash_ids", INT64)
    row = common_attrs(rec, opts)
    row["ts_us"] = ts
    row["block_ids"] = blocks
    row["input_length"] = length(rec, "input_length", True)
    # an optional `block_size` (ours: `replay export --block B` writes it when B is not
    # 512) sets the blocks' tokens; the rule stays Mooncake's otherwise: every block
    # whole but the last, which holds the rest of input_length (fewer tokens than the
    # blocks before it hold would let the replay count hits beyond the prompt)
    block = block_size(rec, MOONCAKE_BLOCK)
    n_in = row["input_length"]
    # (a single block holds whatever input_length says, up to a block)
    lengths = (uniform_lengths(len(blocks), block, n_in, "hash_ids") if len(blocks) > 1
               else [min(block, n_in)] * len(blocks))
    if block != MOONCAKE_BLOCK and blocks:
        row["block_lengths"] = lengths
    row["output_length"] = length(rec, "output_length", False)
    row["model"] = as_str(rec.get("model"), "model")
    return row
