"""Log formats understood by ingest: detection and record → `requests` row.

Pure functions over already-parsed JSON records; no I/O and no database here
(see `replay/readers/ingest.py`). A record that cannot be loaded raises `Reject`
with a short reason code and a detail message that names fields and JSON types
only — never a value that could be prompt text.

This module is the dispatcher (which format a record is, which converter
loads it); the formats themselves live beside it: `fields` (field lookup,
`Options`, `Reject`), `timestamps`, `chat` (anthropic, openai), `traces`
(tokens, mooncake), `hashtraces` (bailian, ragpulse, kv-cache-tester) and
`trajectory` (mini-swe-agent); the gateway and tracing exports in `otel` and
`gateways` (litellm, langfuse), what they share in `exported`.
"""

from __future__ import annotations

from typing import Any, Iterable

from replay.readers.chat import chat_parts, usage_of, chat_scores, convert_chat, usage_row
from replay.readers.hashtraces import (LENGTHS_FORMAT, convert_bailian, convert_kv_trace, convert_ragpulse,
                                       is_kv_trace, is_lengths_record)
from replay.readers.fields import (FIELD_ALIASES, FIELD_KEYS, INT32, INT64, KEY_NAMES, SESSION_NAMES, TENANT_NAMES,
                                   TS_NAMES, Options, Reject, get_path, normalize_fields, type_name)
from replay.readers.timestamps import TIME_UNITS, guess_unit, parse_ts
from replay.readers.traces import convert_mooncake, convert_tokens
from replay.readers.trajectory import BASH_TOOL, convert_trajectory
from replay.readers.gateways import convert_langfuse, convert_litellm, expand_langfuse, is_langfuse, is_litellm
from replay.readers.otel import convert_otel, expand_otel, is_otel
from replay.readers.claude_code import convert_claude_code, is_claude_code
from replay.readers.codex import convert_codex, is_codex

__all__ = [
    "FORMATS", "TIME_UNITS", "CONVERTERS", "BASH_TOOL",
    "TS_NAMES", "TENANT_NAMES", "KEY_NAMES", "SESSION_NAMES", "FIELD_KEYS", "FIELD_ALIASES", "INT32", "INT64",
    "Options", "Reject", "normalize_fields", "type_name", "get_path", "guess_unit", "parse_ts", "chat_scores",
    "usage_row", "detect_record", "convert_record", "convert_chat", "convert_tokens", "convert_mooncake",
    "convert_trajectory",
]

FORMATS = ("anthropic", "openai", "tokens", "mooncake", "trajectory", "bailian", "ragpulse", "kv-cache-tester")
#: formats whose file is one JSON document of many requests (converted by DOCUMENT_CONVERTERS)
DOCUMENT_FORMATS = ("trajectory", "kv-cache-tester")
#: gateway and tracing exports (`otel`, `gateways`); a record of `otel` or `langfuse`
#: may hold many requests (an OTLP export's spans, an API page): EXPANDERS make each a unit
GATEWAY_FORMATS = ("otel", "litellm", "langfuse")
FORMATS = FORMATS + GATEWAY_FORMATS
#: coding agents' session files: JSON Lines whose requests depend on the lines before
#: them (a conversation tree, a history); SESSION_CONVERTERS read a whole file's units
SESSION_FORMATS = ("claude-code", "codex")
FORMATS = FORMATS + SESSION_FORMATS
SESSION_CONVERTERS = {"claude-code": convert_claude_code, "codex": convert_codex}


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
    if whole_document and is_kv_trace(rec):
        return "kv-cache-tester", True
    if is_claude_code(rec):
        return "claude-code", True
    if is_codex(rec):
        return "codex", True
    if isinstance(rec.get("hash_ids"), list) and "input_length" in rec:
        return ("bailian" if "chat_id" in rec or "parent_chat_id" in rec else "mooncake"), True
    if isinstance(rec.get("hash_ids"), dict) and "input_length" in rec:
        return "ragpulse", True
    if is_lengths_record(rec):
        return LENGTHS_FORMAT, True
    gateway = _gateway(rec)
    if gateway is not None:
        return gateway, True
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
    "bailian": convert_bailian,
    "ragpulse": convert_ragpulse,
}

CONVERTERS.update({"otel": convert_otel, "litellm": convert_litellm, "langfuse": convert_langfuse})

#: formats whose one record may hold several units: record → units (records or Rejects)
EXPANDERS = {"otel": expand_otel, "langfuse": expand_langfuse}

DOCUMENT_CONVERTERS = {
    "trajectory": convert_trajectory,
    "kv-cache-tester": convert_kv_trace,
}


def convert_record(rec: Any, fmt: str | None, opts: Options) -> dict:
    """One parsed line/record of a line-based file → row dict (raises Reject)."""
    if not isinstance(rec, dict):
        raise Reject("wrong_type", f"the record is {type_name(rec)}, expected a JSON object")
    if fmt is None:
        raise Reject("unknown_format", "could not detect the log format of this file from its records "
                                       f"(record has {len(rec)} top-level keys{_key_hint(rec)}); "
                                       "pass format= to force one")
    if fmt == LENGTHS_FORMAT:
        raise Reject("wrong_type", "a line of RAGPulse's chunk lengths is side data of a trace, not a request")
    if fmt in DOCUMENT_FORMATS:
        raise Reject("wrong_type", f"a {fmt} record must be a whole JSON document, not one line of a file")
    if fmt in SESSION_FORMATS:
        raise Reject("wrong_type", f"a {fmt} line is read with the rest of its session file, not on its own")
    return CONVERTERS[fmt](rec, opts)


def expand_units(records: Iterable[tuple[Any, Any]], fmt: str | None) -> Iterable[tuple[Any, Any]]:
    """The (line, unit) pairs of a file's (line, record) pairs: a record of an
    EXPANDERS format gives one pair per request it holds (each loaded or
    rejected on its own, with the record's line number); others are units as is."""
    expand = EXPANDERS.get(fmt) if fmt is not None else None
    if expand is None:
        return records
    return ((ln, unit) for ln, item in records
            for unit in (expand(item) if isinstance(item, dict) else (item,)))


def _gateway(rec: dict) -> str | None:
    """A gateway or tracing export's record (before the chat formats: a LiteLLM
    record has top-level `messages` too)."""
    if is_otel(rec):
        return "otel"
    if is_litellm(rec):
        return "litellm"
    if is_langfuse(rec):
        return "langfuse"
    return None


def _key_hint(rec: dict) -> str:
    names = [k for k in list(rec)[:8] if isinstance(k, str) and k.isidentifier() and len(k) <= 40]
    return f": {', '.join(names)}" if names else ""
