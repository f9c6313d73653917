"""The provider's own cache diagnostics, where a log holds them → two `requests` columns.

Both APIs can compare a request with an earlier one and say where the prompt
prefix diverged; their verdicts are the ground truth ``replay diagnose`` is
compared with (``replay.analysis.diagnose.agreement``).

* **Anthropic** (cache diagnostics, beta header ``cache-diagnosis-2026-04-07``,
  request field ``diagnostics.previous_message_id``): the response carries
  ``diagnostics: {"cache_miss_reason": {"type": …, "cache_missed_input_tokens": N}}``;
  ``type`` is ``model_changed``, ``system_changed``, ``tools_changed``,
  ``messages_changed`` (these four with the token estimate),
  ``previous_message_not_found`` or ``unavailable``; ``cache_miss_reason: null``
  means the comparison found no divergence (stored as ``none``). Loggers also
  put the object at the record's top level or inside ``usage``, or flatten it
  (``cache_miss_reason`` as the type string beside ``cache_missed_input_tokens``):
  all of those are read.
* **OpenAI** (Responses API, request field
  ``prompt_cache_options.comparison_response_id``): the response carries
  ``prompt_cache_diagnostics: {"type": "cache_hit" | "cache_miss" |
  "comparison_response_not_found" | "unavailable", "reason": …,
  "cache_missed_tokens": N, "comparison_reusable_tokens": M}``; ``reason`` (on a
  miss) is one of ``model_changed``, ``prompt_cache_key_changed``,
  ``tools_changed``, ``text_format_changed``, ``reasoning_effort_changed``,
  ``verbosity_changed``, ``context_compacted``, ``input_changed``,
  ``service_tier_changed``. Stored as the reason on a miss, else the type.

Columns: ``diag_reason`` = ``<provider>:<reason>`` and ``diag_missed_tokens``.
A reason is an enumerated code, but it comes from the log: only a short
snake_case word is stored (anything else becomes ``unrecognised``), so no
log text reaches the table. Diagnostics of the wrong shape are ignored, never a
reason to reject the request (they are an optional extra).
"""

from __future__ import annotations

import re
from typing import Any

from replay.readers.fields import int_or_none

_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _code(v: Any) -> str:
    return v if isinstance(v, str) and _CODE.fullmatch(v) else "unrecognised"


def _tokens(v: Any) -> int | None:
    n = int_or_none(v)
    return n if n is not None and n >= 0 else None


def _anthropic(holder: dict) -> dict | None:
    """From an object holding ``diagnostics`` (or the flat fields)."""
    d = holder.get("diagnostics")
    if isinstance(d, dict) and "cache_miss_reason" in d:
        reason = d["cache_miss_reason"]
    elif "cache_miss_reason" in holder:
        reason = holder["cache_miss_reason"]
    else:
        return None
    if reason is None:
        return {"diag_reason": "anthropic:none", "diag_missed_tokens": None}
    if isinstance(reason, dict):
        return {"diag_reason": f"anthropic:{_code(reason.get('type'))}",
                "diag_missed_tokens": _tokens(reason.get("cache_missed_input_tokens",
                                                         holder.get("cache_missed_input_tokens")))}
    if isinstance(reason, str):
        return {"diag_reason": f"anthropic:{_code(reason)}",
                "diag_missed_tokens": _tokens(holder.get("cache_missed_input_tokens"))}
    return None


def _openai(holder: dict) -> dict | None:
    d = holder.get("prompt_cache_diagnostics")
    if not isinstance(d, dict) or not isinstance(d.get("type"), str):
        return None
    if d["type"] == "cache_miss":
        return {"diag_reason": f"openai:{_code(d.get('reason'))}",
                "diag_missed_tokens": _tokens(d.get("cache_missed_tokens"))}
    return {"diag_reason": f"openai:{_code(d['type'])}", "diag_missed_tokens": None}


def diagnostics_row(*holders: Any) -> dict:
    """``{"diag_reason", "diag_missed_tokens"}`` from the first of ``holders``
    (response, usage, the record…) that carries either provider's diagnostics;
    ``{}`` when none does."""
    for h in holders:
        if not isinstance(h, dict):
            continue
        for read in (_anthropic, _openai):
            got = read(h)
            if got is not None:
                return got
    return {}
