"""Claude Code session transcripts (``~/.claude/projects/<project>/<session>.jsonl``
and ``<session>/subagents/agent-*.jsonl``) → one `requests` row per API call.

A transcript is a tree of events linked by ``parentUuid``. Every line is one
input unit and ends up as exactly one of:

* **a request** — the first ``assistant`` line of an API call. The lines of one
  call share ``message.id`` (Claude Code writes each content block of a reply
  on its own line); the call's usage is taken once, from that first line.
  Its prompt is the conversation along ``parentUuid`` from the line's parent
  back to the root (or to a compaction boundary, whose parent is null): the
  ``user`` and ``assistant`` lines on that path, in order, consecutive lines of
  one role merged into one message (user text, tool_result, assistant text,
  thinking and tool_use blocks as the client sends them back).
* **context** — every other line: the other lines of a call already counted,
  the user's messages and tool results (they enter later prompts),
  ``progress``, ``system``, ``summary``, ``file-history-snapshot``,
  ``queue-operation`` events, and ``<synthetic>`` replies the client made up
  without calling the API. Counted in ``sources.context``, so
  ``lines = loaded + context + rejected``.
* **a reject** — a line that is not a JSON object or not a Claude Code event
  (no known ``type``, no ``sessionId`` nor ``uuid``), or an ``assistant`` line
  without a usable message, model or timestamp.

Not in the file: the system prompt and the tool definitions Claude Code sent.
Each request carries ``hidden_key`` — the identity of that hidden prefix,
``claude-code <version> <model> <cwd>`` (``+ agent`` for a sidechain): requests
with the same key are taken to send the same hidden text. Its length is
inferred later from the provider's usage (``replay.providers.hidden``), never
here.

Streams: tenant ``default`` (one ingest = one account: the provider's cache is
shared across the account's sessions and projects), ``session`` the
``sessionId`` (a sidechain or subagent file: ``<sessionId>/<agentId>``, its own
stream of the same session), ``prompt_cache_key`` the project (``cwd``: ``--stream
key`` replays per project), ``client`` ``claude-code``.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from replay.readers.chat import usage_row
from replay.readers.fields import CONTEXT, Reject, as_objects, as_str, int_or_none, type_name
from replay.readers.timestamps import parse_ts
from replay.store.jsontext import dumps

CLIENT = "claude-code"
#: event types Claude Code writes (detection): a line with one of these, a ``sessionId`` and a ``uuid``
EVENT_TYPES = frozenset(("user", "assistant", "system", "summary", "progress", "file-history-snapshot",
                         "queue-operation", "attachment"))
MAX_CHAIN = 1 << 20  # lines followed back along parentUuid before a chain is called broken (a cycle)


def is_claude_code(rec: dict) -> bool:
    typ = rec.get("type")
    return (isinstance(typ, str) and typ in EVENT_TYPES and isinstance(rec.get("sessionId"), str)
            and ("uuid" in rec or rec.get("type") in ("file-history-snapshot", "queue-operation", "summary")))


def _content_blocks(content: Any) -> list:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return list(content)
    return []


class _Session:
    """The lines of one file seen so far, and the messages built from them."""

    def __init__(self) -> None:
        self.by_uuid: dict[str, dict] = {}
        self.calls: set[str] = set()
        # merged messages by the uuids they hold: the same object for every later prompt,
        # so ingest stores each message once (its blobs are keyed by object identity)
        self.merged: dict[tuple, dict] = {}

    def chain(self, start: Any) -> list[dict]:
        """The user/assistant lines from the root to ``start`` (inclusive), in order."""
        out: list[dict] = []
        seen: set[str] = set()
        cur = start
        while isinstance(cur, str) and cur not in seen and len(seen) < MAX_CHAIN:
            seen.add(cur)
            rec = self.by_uuid.get(cur)
            if rec is None:
                break
            if rec.get("type") in ("user", "assistant") and isinstance(rec.get("message"), dict):
                out.append(rec)
            cur = rec.get("parentUuid")
        out.reverse()
        return out

    def messages(self, lines: list[dict]) -> list[dict]:
        """Consecutive lines of one role merged into one API message."""
        groups: list[list[dict]] = []
        for rec in lines:
            role = rec["message"].get("role") or rec.get("type")
            if groups and (groups[-1][0]["message"].get("role") or groups[-1][0].get("type")) == role:
                groups[-1].append(rec)
            else:
                groups.append([rec])
        out = []
        for g in groups:
            key = tuple(r.get("uuid") for r in g)
            msg = self.merged.get(key)
            if msg is None:
                role = g[0]["message"].get("role") or g[0].get("type")
                blocks: list = []
                for r in g:
                    blocks += _content_blocks(r["message"].get("content"))
                msg = self.merged[key] = {"role": role, "content": blocks}
            out.append(msg)
        return out


def convert_claude_code(units: Iterable[tuple[int, Any]], opts) -> Iterator[tuple[int, Any]]:
    """(line, row | Reject | CONTEXT) for every unit of a transcript, in file order."""
    s = _Session()
    for ln, rec in as_objects(units):
        if isinstance(rec, Reject):
            yield ln, rec
            continue
        if not isinstance(rec.get("type"), str) or not (
                rec["type"] in EVENT_TYPES or "sessionId" in rec or "uuid" in rec):
            yield ln, Reject("wrong_type", "the line is not a Claude Code event (no known 'type', 'sessionId' "
                                           "or 'uuid')")
            continue
        uuid = rec.get("uuid")
        if isinstance(uuid, str):
            s.by_uuid[uuid] = rec
        if rec.get("type") != "assistant":
            yield ln, CONTEXT
            continue
        try:
            yield ln, _call(rec, s, opts)
        except Reject as r:
            yield ln, r


def _call(rec: dict, s: _Session, opts) -> Any:
    msg = rec.get("message")
    if not isinstance(msg, dict):
        raise Reject("wrong_type", f"field 'message' of an assistant line is {type_name(msg)}, expected an object")
    model = msg.get("model")
    if model == "<synthetic>":  # a reply the client made up (an error, an interruption): no API call
        return CONTEXT
    mid = msg.get("id") if isinstance(msg.get("id"), str) else rec.get("requestId")
    if not isinstance(mid, str):
        mid = rec.get("uuid") if isinstance(rec.get("uuid"), str) else None
    if mid is not None and mid in s.calls:
        return CONTEXT  # another content block of a call already counted
    usage = msg.get("usage")
    if not isinstance(usage, dict):
        raise Reject("no_usage", "an assistant line without 'message.usage': not an API call the log can count")
    ts = parse_ts(rec.get("timestamp"), "timestamp", opts)
    model_s = as_str(model, "message.model")
    if model_s is None:
        raise Reject("no_model", "an assistant line without 'message.model'")
    if mid is not None:
        s.calls.add(mid)
    lines = s.chain(rec.get("parentUuid"))
    if not lines:
        raise Reject("no_prompt", "no user or assistant line before this call along parentUuid")
    session = as_str(rec.get("sessionId"), "sessionId") or "?"
    side = bool(rec.get("isSidechain")) or isinstance(rec.get("agentId"), str)
    if side:
        session += "/" + (as_str(rec.get("agentId"), "agentId") or "sidechain")
    cwd = as_str(rec.get("cwd"), "cwd")
    version = as_str(rec.get("version"), "version")
    row = {
        "ts_us": ts,
        "tenant": "default",
        "prompt_cache_key": cwd,
        "session": session,
        "user_id": None,
        "model": model_s,
        "output": dumps(msg.get("content")) if msg.get("content") is not None else None,
        "client": CLIENT,
        "hidden_key": f"{CLIENT} {version} {model_s} {cwd}" + (" agent" if side else ""),
    }
    body = {"messages": s.messages(lines)}
    if opts.split_body:
        row["body_obj"] = body
    else:
        row["body"] = dumps(body)
    row.update(usage_row(usage))
    cc = usage.get("cache_creation")
    if isinstance(cc, dict):
        row["usage_write_1h_tokens"] = int_or_none(cc.get("ephemeral_1h_input_tokens"))
    return row
