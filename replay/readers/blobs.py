"""Request bodies as content-addressed blobs (`blobs`, `requests.body_blobs`).

`Blobs` splits a chat body into glue text and its parts (each tool
definition, system value and message), stores each part once however many
requests repeat it, and keeps a key memo so a part seen before is found
without serializing it again (see docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

try:  # compiled beside the trie (setup.py); without it, values are serialized to be hashed
    from replay.readers._jsonhash import item_hashes
except ImportError:  # pragma: no cover - an install without a compiler
    item_hashes = None
from replay.store.jsontext import dumps, orjson_agrees

WARM_BATCH_CHARS = 256_000  # new body parts handed to the encoder process at a time
KEY_MEMO_ENTRIES = 500_000  # parts per generation of Blobs' key memo

BLOB_SCHEMA = pa.schema([("blob_id", pa.uint64()), ("kind", pa.string()), ("text", pa.string()),
                         ("first_request", pa.int64())])


class _Unsplittable(Exception):
    pass


def _blob_id(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def part_text(obj: Any) -> str:
    """jsontext.dumps, refusing values whose JSON is not UTF-8 encodable (dumps would
    then escape the *whole* body as ASCII, which parts cannot reproduce)."""
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                   default=dumps.__globals__["_json_default"])
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise _Unsplittable from None
    return s


def part_text_of(serialized: bytes, obj: Any) -> str:
    """``part_text(obj)`` from orjson's serialization of it when the two are bound to be
    equal (``jsontext.orjson_agrees``), else serialized again by the standard library."""
    if orjson_agrees(serialized, obj):
        return serialized.decode("utf-8")
    return part_text(obj)


class Blobs:
    """Splits request bodies into content-addressed blobs (see docs/architecture.md).

    A body ``{"k1": v1, "tools": [t1, t2], "system": s, "messages": [m1, m2], ...}``
    becomes the blob list ``[glue '{"k1":v1,"tools":[', tool t1, glue ',', tool t2,
    glue '],"system":', system s, glue ',"messages":[', message m1, glue ',',
    message m2, glue ']...}']`` whose texts concatenate to exactly ``jsontext.dumps(body)``.
    Each tool definition, system value and message is stored once however many
    requests repeat it (an agent resends its whole conversation every turn).
    Blob ids: first 8 bytes of blake2b over kind + serialization (orjson's for
    records the fast parser read, prefixed ``o``; the standard one's, prefixed ``s``).
    """

    def __init__(self, known: set[int], warm=None):
        self.known = known
        self.request_id: int | None = None  # the request being split (blobs.first_request)
        # new tools/system values/messages are handed to ``warm`` (the encoder
        # process encodes them ahead, on the other core) in batches of WARM_BATCH_CHARS
        self.warm = warm
        self._warm_parts: list[tuple[int, str, str]] = []
        self._warm_chars = 0
        self._glue_ids: dict[str, int] = {}
        self._scalar_text: dict[tuple, str] = {}
        # A 64-bit hash of a part → its blob id, per kind: an agent resends every
        # earlier message each turn, so most parts are found here by one dict
        # lookup instead of being serialized and hashed again with blake2b. The
        # hash is ``_jsonhash.item_hashes`` of the decoded value (no serialization),
        # or, without that extension, Python's hash of orjson's serialization.
        # Two generations bound its memory: a full young one becomes the old one,
        # and what is found in the old one moves back. Every id in it is in
        # ``known``, so it is emptied whenever ids leave ``known``.
        self._young: dict[str, dict[int, int]] = {"tool": {}, "message": {}}
        self._old: dict[str, dict[int, int]] = {"tool": {}, "message": {}}
        self._young_size = 0
        self._reset()
        self.file_flushed: list[int] = []

    def _reset(self) -> None:
        self.ids: list[int] = []
        self.kinds: list[str] = []
        self.texts: list[str] = []
        self.firsts: list[int | None] = []
        self.bytes = 0

    def _add(self, bid: int, kind: str, text: str) -> None:
        if self.warm is not None and kind != "glue":
            self._warm_parts.append((bid, kind, text))
            self._warm_chars += len(text)
            if self._warm_chars >= WARM_BATCH_CHARS:
                self.send_warm()
        self.known.add(bid)
        self.ids.append(bid)
        self.kinds.append(kind)
        self.texts.append(text)
        self.firsts.append(self.request_id)
        self.bytes += len(text)

    def send_warm(self) -> None:
        if self._warm_parts:
            self.warm(self._warm_parts)
            self._warm_parts, self._warm_chars = [], 0

    def _glue(self, text: str) -> int:
        bid = self._glue_ids.get(text)  # the same few separators and key runs, over and over
        if bid is None:
            bid = _blob_id(b"glue\0" + text.encode("utf-8"))
            if len(self._glue_ids) < 100_000:
                self._glue_ids[text] = bid
        if bid not in self.known:
            self._add(bid, "glue", text)
        return bid

    def _part(self, kind: str, obj: Any, fast: bool, memo: dict | None) -> int:
        if memo is not None:
            hit = memo.get(id(obj))
            if hit is not None and hit[0] is obj:
                return hit[1]
        text = None
        if fast:
            try:
                key = b"o" + orjson.dumps(obj)
            except (TypeError, orjson.JSONEncodeError):
                fast = False
        if not fast:
            text = part_text(obj)
            key = b"s" + text.encode("utf-8")
        bid = _blob_id(kind.encode("ascii") + b"\0" + key)
        if bid not in self.known:
            self._add(bid, kind, text if text is not None else part_text_of(key[1:], obj))
        if memo is not None:
            memo[id(obj)] = (obj, bid)
        return bid

    def _forget_keys(self) -> None:
        for gen in (self._young, self._old):
            for d in gen.values():
                d.clear()
        self._young_size = 0

    def _list_parts(self, kind: str, items: list) -> list[int] | None:
        """Blob ids of a tools/messages list's items (the same ids ``_part`` gives:
        blake2b of orjson's serialization); None when orjson cannot serialize one.
        Only the items the key memo does not know are serialized: in agent
        traffic, a small share of them."""
        hashes = item_hashes(items) if item_hashes is not None else None
        keys = None
        if hashes is None:  # no extension, or a value it has no hash for
            try:
                keys = list(map(orjson.dumps, items))
            except (TypeError, orjson.JSONEncodeError):
                return None
            hashes = list(map(hash, keys))
        young = self._young[kind]
        bids = list(map(young.get, hashes))
        if None in bids:
            old = self._old[kind]
            prefix = kind.encode("ascii") + b"\0o"
            for j, bid in enumerate(bids):
                if bid is None:
                    bid = old.get(hashes[j])
                    if bid is None:
                        if keys is None:
                            try:
                                key = orjson.dumps(items[j])
                            except (TypeError, orjson.JSONEncodeError):
                                return None
                        else:
                            key = keys[j]
                        bid = _blob_id(prefix + key)
                        if bid not in self.known:
                            self._add(bid, kind, part_text_of(key, items[j]))
                    young[hashes[j]] = bids[j] = bid
                    self._young_size += 1
            if self._young_size > KEY_MEMO_ENTRIES:
                self._old, self._young = self._young, {"tool": {}, "message": {}}
                self._young_size = 0
        return bids

    def _value_text(self, v: Any) -> str:
        """``part_text`` of a top-level value, remembered for plain scalars (model, max_tokens…)."""
        if v is None or type(v) in (str, int, bool):
            key = (type(v), v)
            t = self._scalar_text.get(key)
            if t is None:
                t = part_text(v)
                if len(self._scalar_text) < 10_000:
                    self._scalar_text[key] = t
            return t
        if type(v) is float and math.isfinite(v):
            return float.__repr__(v)  # what the standard library writes
        if type(v) in (dict, list):
            try:
                return part_text_of(orjson.dumps(v), v)
            except (TypeError, orjson.JSONEncodeError):
                pass  # an integer beyond 64 bits, a lone surrogate: the standard library decides
        return part_text(v)

    def split(self, body: Any, fast: bool, memo: dict | None = None) -> list[int] | None:
        """Blob ids of ``body`` in order, or None when it keeps the inline form."""
        if not isinstance(body, dict):
            return None
        msgs, tools = body.get("messages"), body.get("tools")
        if not isinstance(msgs, list) or not (tools is None or isinstance(tools, list)):
            return None
        if body.get("system") is None and "instructions" in body:
            return None
        n_before = len(self.ids)
        ids: list[int] = []
        glue: list[str] = []
        try:
            for i, (k, v) in enumerate(body.items()):
                if not isinstance(k, str):
                    raise _Unsplittable
                glue.append(("{" if i == 0 else ",") + self._value_text(k) + ":")
                if k in ("tools", "messages") and isinstance(v, list):
                    kind = "tool" if k == "tools" else "message"
                    glue.append("[")
                    parts = self._list_parts(kind, v) if fast and memo is None and v else None
                    if parts is not None:
                        # [first, comma, second, comma, ...] interleaved with the parts
                        seps = [self._glue(",") if len(parts) > 1 else 0] * len(parts)
                        seps[0] = self._glue("".join(glue))
                        glue = []
                        run = [0] * (2 * len(parts))
                        run[0::2] = seps
                        run[1::2] = parts
                        ids.extend(run)
                    else:
                        for j, item in enumerate(v):
                            if j:
                                glue.append(",")
                            ids.append(self._glue("".join(glue)))
                            glue = []
                            ids.append(self._part(kind, item, fast, memo))
                    glue.append("]")
                elif k == "system":
                    ids.append(self._glue("".join(glue)))
                    glue = []
                    ids.append(self._part("system", v, fast, memo))
                else:
                    glue.append(self._value_text(v))
            if not body:
                glue.append("{")
            glue.append("}")
            ids.append(self._glue("".join(glue)))
        except (_Unsplittable, RecursionError):  # (too deep: the caller's dumps raises it again)
            self._forget_keys()  # it may list ids about to leave ``known``
            for bid in self.ids[n_before:]:  # drop what this body added
                self.known.discard(bid)
            del self.ids[n_before:], self.kinds[n_before:], self.texts[n_before:], self.firsts[n_before:]
            return None
        return ids

    def table(self) -> pa.Table:
        return pa.table({"blob_id": pa.array(np.array(self.ids, dtype=np.uint64), pa.uint64()),
                         "kind": pa.array(self.kinds, pa.string()),
                         "text": pa.array(self.texts, pa.string()),
                         "first_request": pa.array(self.firsts, pa.int64())}, schema=BLOB_SCHEMA)

    def flushed(self) -> None:
        self.file_flushed.extend(self.ids)
        self._reset()

    def discard(self, whole_file: bool) -> None:
        """Forget pending blobs (and, after a rollback, this file's flushed ones)."""
        self._forget_keys()
        for bid in self.ids:
            self.known.discard(bid)
        if whole_file:
            for bid in self.file_flushed:
                self.known.discard(bid)
        self._reset()
