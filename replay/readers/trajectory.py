"""mini-swe-agent trajectories (one JSON document per session) → one `requests`
row per assistant turn, its body the conversation so far plus the agent's one tool."""

from __future__ import annotations

from typing import Any, Iterator

from replay.readers.chat import usage_row
from replay.readers.fields import Options, Reject, as_str, document_list, too_deep
from replay.readers.timestamps import parse_ts
from replay.store.jsontext import dumps

# The one tool of the mini-swe-agent runs (its bash_tool_schema.py), as sent to the API.
BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The bash command to execute",
                }
            },
            "required": ["command"],
        },
    },
}


def _strip_extra(m: Any) -> Any:
    return {k: v for k, v in m.items() if k != "extra"} if isinstance(m, dict) else m


def convert_trajectory(doc: Any, stem: str, opts: Options) -> Iterator[tuple[int, dict | Reject]]:
    """A mini-swe-agent trajectory → one row (or Reject) per assistant turn, numbered from 1.

    Raises Reject for the whole file when the document is not a trajectory.
    """
    msgs = document_list(doc, "messages", "a trajectory object")
    session = as_str(doc.get("instance_id"), "instance_id") or stem
    prefix = '{"tools":' + dumps([BASH_TOOL]) + ',"messages":['
    ser: list[str] = []
    objs: list[Any] = []
    turn = 0
    for i, m in enumerate(msgs):
        if isinstance(m, dict) and m.get("role") == "assistant":
            turn += 1
            try:
                yield turn, _trajectory_row(m, prefix, ser, session, opts, objs)
            except Reject as r:
                yield turn, r
            except RecursionError:
                yield turn, too_deep(f"assistant turn {turn}")
        if opts.split_body:
            objs.append(_strip_extra(m))
        else:
            try:
                ser.append(dumps(_strip_extra(m)))
            except RecursionError:  # in every later turn's body: the whole document is refused
                raise too_deep(f"messages[{i}]") from None


def _trajectory_row(m: dict, prefix: str, ser: list[str], session: str, opts: Options,
                    objs: list | None = None) -> dict:
    extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
    resp = extra.get("response") if isinstance(extra.get("response"), dict) else {}
    if resp.get("created") is not None:
        ts = parse_ts(resp["created"], "extra.response.created", opts)
    elif extra.get("timestamp") is not None:
        ts = parse_ts(extra["timestamp"], "extra.timestamp", opts)
    else:
        raise Reject("missing_timestamp", "assistant turn has neither extra.response.created nor extra.timestamp")
    row = {
        "ts_us": ts,
        "tenant": "default",
        "session": session,
        "model": as_str(resp.get("model"), "extra.response.model"),
        "output": dumps(_strip_extra(m)),
        # the serving backend a gateway names (OpenRouter's `provider`): a backend has a cache of its own
        "backend": as_str(resp.get("provider"), "extra.response.provider"),
    }
    if opts.split_body:
        row["body_obj"] = {"tools": [BASH_TOOL], "messages": list(objs or ())}
    else:
        row["body"] = prefix + ",".join(ser) + "]}"
    row.update(usage_row(resp.get("usage"), prefer_deepseek=True))
    return row
