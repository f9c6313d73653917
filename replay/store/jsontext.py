"""The text of stored bodies: compact JSON, key order kept, and fast exact parsing.

Ingest stores request bodies (and their content-addressed parts) as this text;
the tokenize stage and the analyses parse it back. The fast paths (orjson,
msgspec) are used only where they give exactly what the standard library gives.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any

import msgspec
import orjson


def _json_default(o: Any) -> Any:
    if isinstance(o, (datetime, date)):
        return o.isoformat()
    if isinstance(o, (bytes, bytearray)):
        return o.decode("utf-8", "replace")
    return str(o)


def dumps(obj: Any) -> str:
    """Compact JSON, key order kept, non-ASCII kept (escaped only if not encodable)."""
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_json_default)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: same JSON value, escaped
        s = json.dumps(obj, separators=(",", ":"), ensure_ascii=True, default=_json_default)
    return s


# msgspec parses JSON as fast as orjson and, unlike orjson, reads integer literals
# beyond 64 bits exactly (as the standard parser does); where it refuses what the
# standard parser accepts (NaN, 1e400, lone surrogates) the standard parser reads it.
# (Checked against json.loads on random documents in tests/readers/test_ingest.py.)
_decode_json = msgspec.json.Decoder().decode
JSONDecodeError = msgspec.DecodeError


def loads_fast(data: bytes | str) -> Any:
    """``json.loads``, through msgspec; raises ``JSONDecodeError`` where msgspec
    refuses (the caller then asks the standard parser)."""
    return _decode_json(data)


def loads(text: str) -> Any:
    """``json.loads(text)``, faster."""
    try:
        return _decode_json(text)
    except JSONDecodeError:
        return json.loads(text)


# Digits → "0", ".eE" → ".", anything else → " ": a float in JSON always shows as "0."
_FLOAT_MAP = bytes(48 if 48 <= i <= 57 else 46 if i in b".eE" else 32 for i in range(256))


def _floats_print_alike(obj: Any) -> bool:
    """True when every float in ``obj`` is written alike by orjson and the standard
    library (``repr``: 0.5, 1.5, 100.0 are; 1e16 against 1e+16, or inf, are not)."""
    stack = [obj]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
        elif t is float and orjson.dumps(v) != float.__repr__(v).encode("ascii"):
            return False
    return True


def orjson_agrees(serialized: bytes, obj: Any) -> bool:
    """True when ``serialized`` (orjson's compact JSON of ``obj``, a parsed JSON
    value) is exactly what ``json.dumps(obj, separators=(",", ":"),
    ensure_ascii=False)`` writes: compact, key order kept, the same string escapes
    (every code point checked); they differ only in how some floats are written,
    so a text that may hold a float (a digit before ".", "e" or "E", or a null —
    orjson writes inf and NaN as null — inside strings too) has its floats compared."""
    if b"0." in serialized.translate(_FLOAT_MAP) or b"null" in serialized:
        return _floats_print_alike(obj)
    return True


def compact_dumps(obj: Any) -> str:
    """``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)``, faster."""
    try:
        ser = orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):  # beyond 64 bits, lone surrogates…
        ser = None
    if ser is not None and orjson_agrees(ser, obj):
        return ser.decode("utf-8")
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def strip_nulls(v: Any) -> Any:
    """Drop null-valued keys recursively (parquet structs carry every field of the union schema)."""
    if isinstance(v, dict):
        return {k: strip_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [strip_nulls(x) for x in v]
    return v
