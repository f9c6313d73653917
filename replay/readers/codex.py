"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) → one
`requests` row per API call.

Every line is ``{"timestamp", "type", "payload"}`` and ends up as exactly one of:

* **a request** — an ``event_msg`` of type ``token_count`` whose
  ``info.last_token_usage`` is new (Codex can write the same event twice: one
  whose ``total_token_usage`` equals the previous event's is that repeat, and
  is context). Usage: ``input_tokens`` (all prompt tokens),
  ``cached_input_tokens``, ``output_tokens``. Its prompt is the session's
  ``base_instructions`` (``session_meta``: the system prompt, as
  ``instructions``) and the ``response_item``\\ s written before the call's own
  output — the run of model output items (reasoning, assistant messages,
  function and tool calls) just before the event is what the call returned.
  A ``compacted`` line replaces the history with its ``replacement_history``.
* **context** — every other line (``session_meta``, ``turn_context``,
  ``response_item``, other ``event_msg``\\ s, a repeated or empty
  ``token_count``): counted in ``sources.context``.
* **a reject** — a line that is not a JSON object of that shape.

Not in the file: the tool definitions Codex sent, and the content of reasoning
(``encrypted_content``). Reasoning is kept in the prompt as an opaque run
(``{"type": "opaque"}``, ``replay.text.render``) whose length is the producing
call's ``reasoning_output_tokens``, and only within its own turn (the API drops
the reasoning items that precede the last user message); the tools are the hidden prefix of
``hidden_key`` = ``codex <cli_version> <model>``, its length inferred from the
provider's usage later (``replay.providers.hidden``).

Streams: tenant ``default`` (one ingest = one organisation), ``session`` the
session id, ``prompt_cache_key`` the session id too (Codex sends the
conversation id as ``prompt_cache_key``), ``client`` ``codex``.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from replay.readers.fields import CONTEXT, Reject, as_objects, as_str, int_or_none, type_name
from replay.readers.timestamps import parse_ts
from replay.store.jsontext import dumps

CLIENT = "codex"
LINE_TYPES = frozenset(("session_meta", "turn_context", "response_item", "event_msg", "compacted"))
#: response items a model call returns (the rest are inputs: user/developer messages, tool outputs)
OUTPUT_ITEMS = frozenset(("reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call",
                          "tool_search_call", "image_generation_call"))


def is_codex(rec: dict) -> bool:
    typ = rec.get("type")
    return isinstance(typ, str) and typ in LINE_TYPES and isinstance(rec.get("payload"), dict) and "timestamp" in rec


def _is_output(item: dict) -> bool:
    typ = item.get("type")
    return (isinstance(typ, str) and typ in OUTPUT_ITEMS) or (typ == "message" and item.get("role") == "assistant")


def _text_of(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("text"), str):
        return v["text"]
    return ""


class _Rollout:
    def __init__(self) -> None:
        self.instructions = ""
        self.session: str | None = None
        self.cwd: str | None = None
        self.version: str | None = None
        self.model: str | None = None
        self.items: list[dict] = []        # the history as the renderer reads it
        self.reasoning: list[bool] = []    # whether items[i] is a reasoning item
        self.turn_start = 0                # index of the last user message: a turn's start
        self.outputs = 0                   # how many items at the end the last model call returned
        self.pending_reasoning: list[dict] = []  # opaque runs waiting for their call's reasoning tokens
        self.last_total: Any = None
        self.calls = 0

    def add(self, item: dict) -> None:
        conv = _convert_item(item)
        if item.get("type") == "reasoning":
            self.pending_reasoning.append(conv["content"][-1])
        if _is_output(item):
            self.outputs += 1
        else:
            self.outputs = 0
        if item.get("type") == "message" and item.get("role") == "user":
            self.turn_start = len(self.items)
        self.items.append(conv)
        self.reasoning.append(item.get("type") == "reasoning")

    def prompt(self) -> list[dict]:
        """The items a call sends: the history before its own output, without the
        reasoning of earlier turns (the API drops reasoning items that precede the
        last user message: they are in a prompt only within their own turn)."""
        end = len(self.items) - self.outputs
        return [it for i, it in enumerate(self.items[:end]) if not (self.reasoning[i] and i < self.turn_start)]


def _convert_item(item: dict) -> dict:
    """A Responses API item in a shape the neutral renderer reads (a new dict: the
    history keeps it, so every later prompt shares the same object)."""
    typ = item.get("type")
    if typ == "message":
        role = item.get("role")
        content = item.get("content")
        return {"role": role if isinstance(role, str) else "user",
                "content": content if isinstance(content, (str, list)) else None}
    if typ == "reasoning":
        parts = item.get("summary")
        summary = "".join(_text_of(s) for s in (parts if isinstance(parts, list) else ()))
        blocks: list = [{"type": "thinking", "thinking": summary}] if summary else []
        # the encrypted part: an opaque run of the producing call's reasoning tokens (filled in at its token_count)
        blocks.append({"type": "opaque", "id": "", "tokens": 0})
        return {"role": "assistant", "content": blocks}
    if typ in ("function_call", "custom_tool_call", "local_shell_call"):
        args = item.get("arguments", item.get("input", item.get("action")))
        return {"type": "function_call", "name": item.get("name"), "arguments": args}
    if typ in ("function_call_output", "custom_tool_call_output"):
        return {"type": "function_call_output", "output": item.get("output")}
    rest = {k: v for k, v in item.items() if k not in ("id", "call_id", "status")}
    return {"role": "assistant" if _is_output(item) else "user", "content": [{"type": "json", "item": rest}]}


def convert_codex(units: Iterable[tuple[int, Any]], opts) -> Iterator[tuple[int, Any]]:
    """(line, row | Reject | CONTEXT) for every unit of a rollout, in file order."""
    r = _Rollout()
    for ln, rec in as_objects(units):
        if isinstance(rec, Reject) or not isinstance(rec.get("payload"), dict):
            yield ln, rec if isinstance(rec, Reject) else Reject(
                "wrong_type", f"the line's 'payload' is {type_name(rec.get('payload'))}, expected an object")
            continue
        typ, p = rec.get("type"), rec["payload"]
        try:
            if typ == "session_meta":
                r.session = as_str(p.get("id"), "payload.id") or r.session
                r.cwd = as_str(p.get("cwd"), "payload.cwd") or r.cwd
                r.version = as_str(p.get("cli_version"), "payload.cli_version") or r.version
                r.instructions = _text_of(p.get("base_instructions")) or r.instructions
            elif typ == "turn_context":
                r.model = as_str(p.get("model"), "payload.model") or r.model
                r.cwd = as_str(p.get("cwd"), "payload.cwd") or r.cwd
            elif typ == "response_item":
                r.add(p)
            elif typ == "compacted" and isinstance(p.get("replacement_history"), list):
                r.items, r.reasoning, r.outputs, r.pending_reasoning, r.turn_start = [], [], 0, [], 0
                for item in p["replacement_history"]:
                    if isinstance(item, dict):
                        r.add(item)
                r.outputs = 0
            elif typ == "event_msg" and p.get("type") == "token_count":
                yield ln, _call(rec, p, r, opts)
                continue
        except Reject as e:
            yield ln, e
            continue
        yield ln, CONTEXT


def _call(rec: dict, p: dict, r: _Rollout, opts) -> Any:
    info = p.get("info")
    if not isinstance(info, dict) or not isinstance(info.get("last_token_usage"), dict):
        return CONTEXT  # rate limits only: no call behind it
    total = info.get("total_token_usage")
    if total is not None and total == r.last_total:
        return CONTEXT  # the same event written again
    last = info["last_token_usage"]
    prompt = int_or_none(last.get("input_tokens"))
    if prompt is None:
        raise Reject("no_usage", "token_count without an integer 'info.last_token_usage.input_tokens'")
    ts = parse_ts(rec.get("timestamp"), "timestamp", opts)
    r.last_total = total
    reasoning = int_or_none(last.get("reasoning_output_tokens")) or 0
    r.calls += 1
    for k, block in enumerate(r.pending_reasoning):  # this call produced them
        block["tokens"] = reasoning // len(r.pending_reasoning)
        block["id"] = f"{r.session}:{r.calls}:{k}"
    r.pending_reasoning = []
    inputs = r.prompt()
    r.outputs = 0  # the next call's output starts after this event
    model = r.model
    row = {
        "ts_us": ts,
        "tenant": "default",
        "prompt_cache_key": r.session,
        "session": r.session,
        "user_id": None,
        "model": model,
        "output": None,
        "client": CLIENT,
        "hidden_key": f"{CLIENT} {r.version} {model}",
        "usage_prompt_tokens": prompt,
        "usage_cached_tokens": int_or_none(last.get("cached_input_tokens")) or 0,
        "usage_cache_write_tokens": None,
        "usage_output_tokens": int_or_none(last.get("output_tokens")),
    }
    body = {"system": r.instructions, "messages": inputs}  # (the renderer reads Responses items in messages)
    if opts.split_body:
        row["body_obj"] = body
    else:
        row["body"] = dumps(body)
    return row
