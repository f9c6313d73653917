"""Log formats understood by ingest: detection and record → `requests` row.

Pure functions over already-parsed JSON records; no I/O and no database here
(see `replay/readers/ingest.py`). A record that cannot be loaded raises `Reject`
with a short reason code and a detail message that names fields and JSON types
only — never a value that could be prompt text.

This module is the dispatcher (which format a record is, which converter
loads it); the formats themselves live beside it: `fields` (field lookup,
`Options`, `Reject`), `timestamps`, `chat` (anthropic, openai), `traces`
(tokens, mooncake) and `trajectory` (mini-swe-agent).
"""

from __future__ import annotations

from typing import Any

from replay.readers.chat import chat_parts, usage_of, chat_scores, convert_chat, usage_row
from replay.readers.fields import (FIELD_ALIASES, FIELD_KEYS, INT32, INT64, KEY_NAMES, SESSION_NAMES, TENANT_NAMES,
                                   TS_NAMES, Options, Reject, get_path, normalize_fields, type_name)
from replay.readers.timestamps import TIME_UNITS, guess_unit, parse_ts
from replay.readers.traces import convert_mooncake, convert_tokens
from replay.readers.trajectory import BASH_TOOL, convert_trajectory

__all__ = [
    "FORMATS", "TIME_UNITS", "CONVERTERS", "BASH_TOOL",
    "TS_NAMES", "TENANT_NAMES", "KEY_NAMES", "SESSION_NAMES", "FIELD_KEYS", "FIELD_ALIASES", "INT32", "INT64",
    "Options", "Reject", "normalize_fields", "type_name", "get_path", "guess_unit", "parse_ts", "chat_scores",
    "usage_row", "detect_record", "convert_record", "convert_chat", "convert_tokens", "convert_mooncake",
    "convert_trajectory",
]

FORMATS = ("anthropic", "openai", "tokens", "mooncake", "trajectory")


def detect_record(rec: Any, whole_document: bool = False) -> tuple[str | None, bool]:
    """(format, confident) of one parsed record; (None, False) when undetectable.

    `confident` is False for a chat body that fits both APIs equally (plain
    string messages): ingest then looks at a few more records before settling
    on `openai`.
    """
    if not isinstance(rec, dict):
        return None, False
    if whole_document and isinstance(rec.get("messages"), list) and (
        "trajectory_format" in rec or ("info" in rec and "instance_id" in rec)
    ):
        return "trajectory", True
    if isinstance(rec.get("hash_ids"), list) and "input_length" in rec:
        return "mooncake", True
    if isinstance(rec.get("tokens"), list):
        return "tokens", True
    body, response, _ = chat_parts(rec)
    if not isinstance(body, dict):
        return None, False
    if not any(k in body for k in ("messages", "system")):
        return None, False
    a, o = chat_scores(body, response, usage_of(rec, response))
    if a > o:
        return "anthropic", True
    if o > a:
        return "openai", True
    return "openai", False


CONVERTERS = {
    "anthropic": lambda rec, opts: convert_chat(rec, "anthropic", opts),
    "openai": lambda rec, opts: convert_chat(rec, "openai", opts),
    "tokens": convert_tokens,
    "mooncake": convert_mooncake,
}


def convert_record(rec: Any, fmt: str | None, opts: Options) -> dict:
    """One parsed line/record of a line-based file → row dict (raises Reject)."""
    if not isinstance(rec, dict):
        raise Reject("wrong_type", f"the record is {type_name(rec)}, expected a JSON object")
    if fmt is None:
        raise Reject("unknown_format", "could not detect the log format of this file from its records "
                                       f"(record has {len(rec)} top-level keys{_key_hint(rec)}); "
                                       "pass format= to force one")
    if fmt == "trajectory":
        raise Reject("wrong_type", "a trajectory record must be a whole JSON document, not one line of a file")
    return CONVERTERS[fmt](rec, opts)


def _key_hint(rec: dict) -> str:
    names = [k for k in list(rec)[:8] if isinstance(k, str) and k.isidentifier() and len(k) <= 40]
    return f": {', '.join(names)}" if names else ""
