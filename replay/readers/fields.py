"""Record attributes shared by every log format: field lookup, `Options`, `Reject`.

A record that cannot be loaded raises `Reject` with a short reason code and a
detail message that names fields and JSON types only — never a value that
could be prompt text (hence `type_name`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Default field names, looked up at the top level of a record, first one wins.
TS_NAMES = ("timestamp", "ts", "created_at", "created")
TENANT_NAMES = ("tenant", "org", "organization", "user")
KEY_NAMES = ("prompt_cache_key",)
SESSION_NAMES = ("session", "session_id", "conversation_id")
# Attributes a `fields` mapping may override with a dotted path into the record.
FIELD_KEYS = ("timestamp", "tenant", "prompt_cache_key", "session", "user_id", "model")
FIELD_ALIASES = {"ts": "timestamp", "key": "prompt_cache_key"}

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
# Most items one list of a row may have (tokens, hash_ids, a body's messages and
# tools): far beyond any real request (a few million tokens of context), and
# small enough for one row's list to fit DuckDB's capped memory (db.connect),
# which a line of 32 MB of "1," (16 million tokens) would not.
MAX_LIST_ITEMS = 1 << 22

MISSING = object()


class Reject(Exception):
    """A record (or file) that is not loaded; `reason` is a short code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class _Context:
    """A unit that is neither a request nor a reject: a line of a session file that
    is context for the requests around it (a user turn, a tool result, a progress
    event). Counted in ``sources.context`` so that lines = loaded + context + rejected."""

    def __repr__(self) -> str:
        return "CONTEXT"


CONTEXT = _Context()


def as_objects(units):
    """A file's ``(line, record)`` units with every unit that is not a JSON object (nor
    already a Reject) made a Reject: what a converter reading a whole file walks."""
    for ln, rec in units:
        if not isinstance(rec, (dict, Reject)):
            rec = Reject("wrong_type", f"the line is {type_name(rec)}, expected a JSON object")
        yield ln, rec


def too_deep(what: str = "the record") -> Reject:
    """A value that parsed, but nests too deeply to be serialized again: the parser
    and the serializer share Python's recursion limit, and the serializer runs
    deeper in the stack (RecursionError there is caught and becomes this)."""
    return Reject("too_large", f"{what} nests too deeply to be stored")


@dataclass
class Options:
    fields: dict[str, str] = field(default_factory=dict)
    time_unit: str | None = None   # forced for every file (--time-unit)
    file_unit: str | None = None   # the unit the current file settled on (reset per file by ingest)
    # ingest stores bodies as content-addressed blobs: converters then hand over
    # the parsed body (row["body_obj"]) instead of serializing it (row["body"])
    split_body: bool = False
    # what the converters of the current file keep between its records (reset per
    # file by ingest): "path" (the file), "salt" (a digest of its bytes, for ids
    # local to the file), a Bailian file's chat chains, RAGPulse's chunk lengths
    file_state: dict = field(default_factory=dict)


def normalize_fields(fields: dict[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (fields or {}).items():
        k2 = FIELD_ALIASES.get(k, k)
        if k2 not in FIELD_KEYS:
            raise ValueError(f"unknown field {k!r} in field mapping; expected one of {', '.join(FIELD_KEYS)}")
        if not isinstance(v, str) or not v:
            raise ValueError(f"field mapping for {k!r} must be a non-empty dotted path")
        out[k2] = v
    return out


# ----------------------------------------------------------------- helpers

def type_name(v: Any) -> str:
    """JSON type of a value, for reject details."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def document_list(doc: Any, key: str, what: str) -> list:
    """The array ``doc[key]`` of a whole-file document (``what``: the kind of document
    expected); Reject for the whole file where the document is not one."""
    if not isinstance(doc, dict):
        raise Reject("wrong_type", f"the document is {type_name(doc)}, expected {what}")
    items = doc.get(key)
    if not isinstance(items, list):
        raise Reject("wrong_type" if key in doc else "no_prompt",
                     f"field '{key}' is {type_name(items) if key in doc else 'absent'}, expected an array")
    return items


def get_path(rec: Any, path: str) -> Any:
    """Value at a dotted path (`request.metadata.user_id`, `a.0.b`), or MISSING."""
    cur = rec
    for part in path.split("."):
        if isinstance(cur, dict):
            if part not in cur:
                return MISSING
            cur = cur[part]
        elif isinstance(cur, list) and part.lstrip("-").isdigit():
            i = int(part)
            if not -len(cur) <= i < len(cur):
                return MISSING
            cur = cur[i]
        else:
            return MISSING
    return cur


def _first(rec: dict, names: tuple[str, ...], skip: frozenset = frozenset()) -> tuple[str | None, Any]:
    for n in names:
        if n in skip:
            continue
        v = rec.get(n)
        if v is not None and v != "":
            return n, v
    return None, MISSING


def lookup_field(rec: dict, opts: Options, key: str, names: tuple[str, ...],
            skip: frozenset = frozenset()) -> tuple[str, Any]:
    """(field name used, value or MISSING) of an attribute: mapping first, then default names."""
    path = opts.fields.get(key)
    if path is not None:
        v = get_path(rec, path)
        return path, (MISSING if v is None or v == "" else v)
    name, v = _first(rec, names, skip)
    return (name or names[0] if names else key), v


def as_str(v: Any, fname: str) -> str | None:
    if v is MISSING or v is None:
        return None
    if isinstance(v, str):
        s = v
    elif isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, int):
        s = str(v)
    elif isinstance(v, float):
        s = str(int(v)) if v.is_integer() else repr(v)
    else:
        raise Reject("wrong_type", f"field '{fname}' is {type_name(v)}, expected a string")
    if s == "":
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if INT64[0] <= v <= INT64[1] else None
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    return None


def common_attrs(rec: dict, opts: Options, tenant_skip: frozenset = frozenset()) -> dict:
    tname, tenant = lookup_field(rec, opts, "tenant", TENANT_NAMES, tenant_skip)
    kname, key = lookup_field(rec, opts, "prompt_cache_key", KEY_NAMES)
    sname, sess = lookup_field(rec, opts, "session", SESSION_NAMES)
    return {
        "tenant": as_str(tenant, tname) or "default",
        "prompt_cache_key": as_str(key, kname),
        "session": as_str(sess, sname),
    }
