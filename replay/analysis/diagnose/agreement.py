"""The provider's own diagnostics as ground truth: how often ``diagnose`` agrees.

Where the log holds the provider's cache verdict for a request (Anthropic's
``diagnostics.cache_miss_reason``, OpenAI's ``prompt_cache_diagnostics``: see
``replay.readers.diagnostics``), it is set beside our cause for the same
request. Both name *where* the prompt diverged from an earlier request, so the
comparison is by region:

=================  ============================================================
region             provider reasons → our side
=================  ============================================================
``tools``          ``tools_changed`` → a premature cause whose divergence is in
                   the tools (tool_order, tool_schema_change, json_key_order…)
``system``         ``system_changed`` → a premature cause in the system prompt
                   (rotating_header, timestamp, volatile_id, per_user_data…)
``messages``       ``messages_changed``, ``context_compacted`` → a premature
                   cause in the messages (history_rewrite…)
``input``          OpenAI's ``input_changed`` (instructions and input alike) →
                   ``system`` or ``messages``
``key``            ``prompt_cache_key_changed`` → stream_split (the prefix lived
                   in another stream)
``none``           Anthropic ``cache_miss_reason: null``, OpenAI ``cache_hit`` →
                   no premature cause (a hit, new content, or a loss that is not
                   a divergence: TTL, blocks, minimum prefix)
``model``,         ``model_changed``; OpenAI's setting changes (text format,
``settings``       reasoning effort, verbosity, service tier) → nothing of ours
                   (a cache is per model, and settings are not prompt text): always
                   counted as disagreement
no verdict         ``previous_message_not_found``, ``unavailable``,
                   ``comparison_response_not_found``, unknown codes → listed, not
                   counted in the agreement share
=================  ============================================================

Our cause of a request is its premature cause when it has one, else its
largest structural loss (ttl_expired, stream_split, below_minimum,
block_rounding), else ``none``. The providers compare with the request named
by the caller (the previous turn), ours with the closest earlier request of
the same model: the two usually coincide in agent traffic.
"""

from __future__ import annotations

import polars as pl

from replay.analysis.diagnose.split import STRUCTURAL

#: provider reason → region (None: no verdict)
REGION_OF_REASON: dict[str, str | None] = {
    "anthropic:none": "none", "anthropic:model_changed": "model", "anthropic:system_changed": "system",
    "anthropic:tools_changed": "tools", "anthropic:messages_changed": "messages",
    "anthropic:previous_message_not_found": None, "anthropic:unavailable": None,
    "openai:cache_hit": "none", "openai:model_changed": "model", "openai:prompt_cache_key_changed": "key",
    "openai:tools_changed": "tools", "openai:input_changed": "input", "openai:context_compacted": "messages",
    "openai:text_format_changed": "settings", "openai:reasoning_effort_changed": "settings",
    "openai:verbosity_changed": "settings", "openai:service_tier_changed": "settings",
    "openai:comparison_response_not_found": None, "openai:unavailable": None,
}


def our_label(row: dict) -> str:
    """Our cause of one request (a row of ``miss_parts``)."""
    if row.get("cause"):
        return row["cause"]
    losses = [(row[p], -i, p) for i, p in enumerate(STRUCTURAL) if row[p] > 0]
    return max(losses)[2] if losses else "none"


def our_region(row: dict) -> str:
    """Where our diagnosis says the request diverged (see the module's table)."""
    if row.get("cause"):
        where = row.get("where") or ""
        return "tools" if where.startswith("tools") else "system" if where.startswith("system") else "messages"
    return "key" if row["stream_split"] > 0 else "none"


def agrees(provider_region: str | None, ours: str) -> bool:
    return provider_region == ours or (provider_region == "input" and ours in ("system", "messages"))


def agreement(con, df: pl.DataFrame) -> dict | None:
    """The agreement of ``df`` (``miss_parts``'s rows) with the provider
    diagnostics the log holds for the same requests; None when it holds none.

    ``{"requests", "comparable", "agree", "agreement_share", "by_reason": [
    {"provider_reason", "region", "requests", "agree", "agreement_share",
    "ours": {our cause: requests}, "provider_missed_tokens", "our_lost_tokens"}]}``
    — ``agreement_share`` is agree / comparable (requests with a verdict), null
    when there is none; a no-verdict reason has ``region`` and share null.
    """
    diag = dict((rid, (reason, missed)) for rid, reason, missed in con.execute(
        "SELECT request_id, diag_reason, diag_missed_tokens FROM requests WHERE diag_reason IS NOT NULL").fetchall())
    if not diag or not len(df):
        return None
    rows: dict[str, dict] = {}
    for r in df.filter(pl.col("request_id").is_in(list(diag))).to_dicts():
        reason, missed = diag[r["request_id"]]
        region = REGION_OF_REASON.get(reason)
        e = rows.setdefault(reason, {"provider_reason": reason, "region": region, "requests": 0, "agree": 0,
                                     "ours": {}, "provider_missed_tokens": None, "our_lost_tokens": 0})
        e["requests"] += 1
        label = our_label(r)
        e["ours"][label] = e["ours"].get(label, 0) + 1
        e["agree"] += region is not None and agrees(region, our_region(r))
        if missed is not None:
            e["provider_missed_tokens"] = (e["provider_missed_tokens"] or 0) + int(missed)
        e["our_lost_tokens"] += int(r["prompt_tokens"] - r["hit"] - r["new_content"])
    if not rows:
        return None
    out = sorted(rows.values(), key=lambda e: (-e["requests"], e["provider_reason"]))
    for e in out:
        e["ours"] = dict(sorted(e["ours"].items(), key=lambda kv: (-kv[1], kv[0])))
        if e["region"] is None:
            e["agree"] = None
        e["agreement_share"] = None if e["region"] is None else e["agree"] / e["requests"]
    comparable = sum(e["requests"] for e in out if e["region"] is not None)
    agree = sum(e["agree"] for e in out if e["region"] is not None)
    return {"requests": sum(e["requests"] for e in out), "comparable": comparable, "agree": agree,
            "agreement_share": agree / comparable if comparable else None, "by_reason": out}


def agreement_lines(a: dict | None, markdown: bool = False) -> list[str]:
    """The agreement as a table (plain text, or Markdown for the report); [] when None."""
    if not a:
        return []
    share = "—" if a["agreement_share"] is None else f"{100 * a['agreement_share']:.1f} %"
    head = (f"Provider diagnostics for {a['requests']:,} request(s); {a['comparable']:,} with a verdict, "
            f"of which ours agrees on {a['agree']:,} ({share}).")
    if markdown:
        lines = ["### Against the provider's own diagnostics", "",
                 "Where the log holds the provider's cache diagnostics (Anthropic `cache_miss_reason`, OpenAI "
                 "`prompt_cache_diagnostics`), each request's reason is set beside our cause: they agree when "
                 "both place the divergence in the same part of the prompt (tools, system, messages), or both "
                 "find none.", "", head, "",
                 "| provider reason | requests | our causes | agree | share |", "|---|---:|---|---:|---:|"]
        for e in a["by_reason"]:
            ours = ", ".join(f"{k} {v:,}" for k, v in e["ours"].items())
            lines.append(f"| {e['provider_reason']} | {e['requests']:,} | {ours} | "
                         + ("no verdict | — |" if e["region"] is None else
                            f"{e['agree']:,} | {100 * e['agreement_share']:.1f} % |"))
        return lines
    lines = [head, f"{'provider reason':<40} {'requests':>9} {'agree':>7} {'share':>7}  our causes"]
    for e in a["by_reason"]:
        ours = ", ".join(f"{k} {v:,}" for k, v in e["ours"].items())
        agree = "-" if e["region"] is None else f"{e['agree']:,}"
        sh = "-" if e["region"] is None else f"{100 * e['agreement_share']:.1f}%"
        lines.append(f"{e['provider_reason']:<40} {e['requests']:>9,} {agree:>7} {sh:>7}  {ours}")
    return lines
