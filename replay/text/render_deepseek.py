"""Render a request body the way DeepSeek's chat API does (``--render deepseek``).

Written from public facts: the DeepSeek-V3.2 prompt encoding published with the
model (``encoding/encoding_dsv32.py`` in the DeepSeek-V3.2 repository on Hugging
Face; tool calls in DSML, tool results in ``<function_results>``, reasoning kept
only after the last user message) — not from the earlier V3/V3.1 templates
(``<｜tool▁calls▁begin｜>`` … , ``<｜tool▁output▁begin｜>`` …, a "## Tools" block
naming ``Description:``/``Parameters:``), which were read and measured first
and do not give the API's counts (the V3.1 rules leave a shared run's first
request 152 tokens short, 1,884 for 2,036, and each tool turn ~40 more). Measured on
``../shared/data/mini-swe-agent-deepseek`` (every request of the three runs),
the encoding below gives the provider's ``prompt_tokens`` exactly on 98.6 %
of the 4,359 requests, +59 tokens in all — no constant, no fitted factor (the
rest: one session where a user message follows tool results, from where each
request is one token over; the API's wrapping there is not the published one).

Pieces are those of :mod:`replay.text.render` (``(kind, payload, part)``), so
the tokenize stage and the content-addressed segments work unchanged. Text the
format puts directly side by side (a message's content and the wrapper around
it) is one text piece; every boundary between two pieces is a special token of
the DeepSeek tokenizer (``<｜User｜>``, ``<｜Assistant｜>``, ``<think>``,
``</think>``, ``｜DSML｜``, BOS, EOS: added tokens, which no merge crosses), so
tokenizing each piece alone equals tokenizing the whole text. Images (not
accepted by the DeepSeek API) keep the neutral template's placeholder run, the
only boundary that is not a special token.

The encoding (``D`` = the ``｜DSML｜`` token, ``TS``/``TE`` = ``<think>`` /
``</think>``):

* ``BOS``, then each message in order;
* ``system`` (and anthropic ``system`` / responses ``instructions``, first; and
  ``developer`` messages, taken as system): its text. The tool definitions are
  appended to the first system message as ``"\\n\\n"`` + the tools block (the
  fixed text of :data:`TOOLS_BLOCK`, each tool's function object as
  ``json.dumps(..., ensure_ascii=False)`` one a line, key order kept); with
  tools and no system message, an empty system message is assumed first;
* ``user``: ``<｜User｜>`` + text + ``<｜Assistant｜>`` + ``TS`` when it is the
  last user message and the request is in thinking mode, else ``TE`` (the
  generation prompt is part of the user message: nothing follows the last one);
* ``assistant``: in thinking mode and after the last user message, its
  reasoning + ``TE`` (earlier reasoning is dropped); then its text; then, with
  tool calls, ``"\\n\\n<" D "function_calls>\\n"`` + the calls joined by
  ``"\\n"`` + ``"\\n</" D "function_calls>"``, each call ``"<" D 'invoke
  name="NAME">\\n'`` + its arguments + ``"\\n</" D "invoke>"``, the arguments one
  ``"<" D 'parameter name="KEY" string="true|false">VALUE</' D "parameter>"``
  per key joined by ``"\\n"`` (a string value as is, ``string="true"``; any
  other as ``json.dumps``, ``string="false"``); then ``EOS``;
* ``tool``: the first of a run of results opens ``"\\n\\n<function_results>"``,
  each is ``"\\n<result>" + text + "</result>"``, the last (as many as the
  assistant's calls, or the run's end) closes ``"\\n</function_results>\\n\\n"``
  + ``TS`` (thinking mode) or ``TE``.

Thinking mode: the body's ``model`` names a reasoner, or its ``thinking`` is
enabled, or an assistant message after the last user message carries
reasoning (``reasoning_content`` or a thinking block). A request with no such
message and no such field (a reasoner session's first turn) renders in chat
mode: the same token count, one id different (``TE`` for ``TS``) at its very end.

Not measured (no such request in the shared runs), so choices of this module,
not facts: several text blocks of one message are joined with ``"\\n"``;
anthropic ``tool_use`` / ``tool_result`` blocks and responses-API
``function_call`` / ``function_call_output`` items are rendered as the
equivalent openai tool calls and tool messages (anthropic tools as
``{"name", "description", "parameters": input_schema}``); arguments that are
not a JSON object are rendered as they are, in place of the parameters; other
non-text blocks as their compact JSON (``cache_control`` left out).

Parts (``prompts.seg_parts``): ``0`` the tools block after its first piece, ``1``
a top-level system, ``2 + k`` message ``k`` (the first tool definition's text
shares the system's first piece, which keeps the system's part; a piece that
spans two messages — adjacent tool results — keeps the part where it starts).
"""

from __future__ import annotations

import json
import re
from typing import Any

from replay.text.render import OUTPUT_PART, Piece, compact_json, image_payload, render_text as _render_text

NAME = "deepseek"

#: marker name → the special token (the neutral names where the token is the same).
SPECIALS: dict[str, str] = {
    "bos": "<｜begin▁of▁sentence｜>",
    "eos": "<｜end▁of▁sentence｜>",
    "user": "<｜User｜>",
    "assistant": "<｜Assistant｜>",
    "think": "<think>",
    "think_end": "</think>",
    "dsml": "｜DSML｜",
}
_BY_TOKEN = {v: k for k, v in SPECIALS.items()}
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS.values()) + ")")

#: The tools block's fixed text (DeepSeek-V3.2's tool prompt), ``{tool_schemas}``
#: standing for the tools' JSON, one a line; its special tokens are written out.
TOOLS_BLOCK = """## Tools

You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<｜DSML｜function_calls>" block like the following as part of your reply to the user:
<｜DSML｜function_calls>
<｜DSML｜invoke name="$FUNCTION_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$FUNCTION_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜function_calls>

String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects \
should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for \
other types (numbers, booleans, arrays, objects).

If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking \
block. Here is an example:

<｜DSML｜function_calls>
...
</｜DSML｜function_calls>

<function_results>
...
</function_results>

<think>...thinking about results</think>

Here are the functions available in JSONSchema format:
<functions>
{tool_schemas}
</functions>
"""


def _dumps(obj: Any) -> str:
    """``json.dumps`` as the encoding writes it (default separators, non-ASCII kept)."""
    try:
        return json.dumps(obj, ensure_ascii=False)
    except (TypeError, ValueError):
        return json.dumps(obj, ensure_ascii=True, default=str)


class _Pieces:
    """Pieces with adjacent texts merged into one (so every boundary is a special token)."""

    __slots__ = ("pieces", "_buf", "_part")

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self._buf: list[str] = []
        self._part = 0

    def text(self, s: str, part: int) -> None:
        if s:
            if not self._buf:
                self._part = part
            self._buf.append(s)

    def flush(self) -> None:
        if self._buf:
            self.pieces.append(("text", "".join(self._buf), self._part))
            self._buf = []

    def marker(self, name: str, part: int) -> None:
        self.flush()
        self.pieces.append(("marker", name, part))

    def image(self, payload, part: int) -> None:
        self.flush()
        self.pieces.append(("image", payload, part))

    def runs(self, runs: list, part: int) -> None:
        for r in runs:
            if isinstance(r, str):
                self.text(r, part)
            else:
                self.image(r[1], part)

    def done(self) -> list[Piece]:
        self.flush()
        return self.pieces


# --------------------------------------------------------------------------- the body as openai-shaped messages

class _Msg:
    __slots__ = ("role", "runs", "reasoning", "calls", "part", "tools")

    def __init__(self, role: str, part: int, runs=None, reasoning: str | None = None, calls=None):
        self.role = role
        self.part = part
        self.runs: list = runs if runs is not None else []  # str | ("image", payload)
        self.reasoning = reasoning
        self.calls: list = calls if calls is not None else []  # (name, arguments: str | dict)
        self.tools: list | None = None


def _strip_cc(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "cache_control"} if "cache_control" in d else d


def _join(runs: list) -> list:
    """Text blocks of one message joined with a line break (images kept apart)."""
    out: list = []
    for r in runs:
        if isinstance(r, str) and out and isinstance(out[-1], str):
            out[-1] = out[-1] + "\n" + r
        else:
            out.append(r)
    return out


def _content_runs(content: Any) -> tuple[list, str | None, list, list]:
    """(runs, reasoning, tool calls, tool results) of a message's content."""
    if content is None:
        return [], None, [], []
    if isinstance(content, str):
        return [content], None, [], []
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return [compact_json(content)], None, [], []
    runs: list = []
    reasoning: list[str] = []
    calls: list = []
    results: list = []
    for block in content:
        if isinstance(block, str):
            runs.append(block)
            continue
        if not isinstance(block, dict):
            runs.append(compact_json(block))
            continue
        typ = block.get("type")
        if typ in ("text", "input_text", "output_text") or (typ is None and "text" in block):
            t = block.get("text", "")
            runs.append(t if isinstance(t, str) else compact_json(t))
        elif typ in ("image", "image_url", "input_image"):
            runs.append(("image", image_payload(block)))
        elif typ == "thinking":
            reasoning.append(block.get("thinking") or "")
        elif typ == "redacted_thinking":
            reasoning.append(block.get("data") or "")
        elif typ in ("tool_use", "server_tool_use"):
            calls.append((block.get("name") or "", block.get("input") if block.get("input") is not None else {}))
        elif typ == "tool_result" or (isinstance(typ, str) and typ.endswith("_tool_result")):
            sub, _, _, _ = _content_runs(block.get("content"))
            results.append(_join(sub))
        else:
            runs.append(compact_json(_strip_cc(block)))
    return _join(runs), ("\n".join(reasoning) if reasoning else None), calls, results


def _openai_calls(msg: dict) -> list:
    calls = []
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            calls.append((fn.get("name") or "", fn.get("arguments") if fn.get("arguments") is not None else "{}"))
        elif isinstance(call, dict):
            calls.append((call.get("name") or "", call.get("arguments", call.get("input", "{}"))))
    fc = msg.get("function_call")  # legacy openai
    if isinstance(fc, dict):
        calls.append((fc.get("name") or "", fc.get("arguments") if fc.get("arguments") is not None else "{}"))
    return calls


def _messages(body: dict) -> list:
    msgs = body.get("messages")
    if msgs is None:
        inp = body.get("input", body.get("prompt"))
        msgs = [{"role": "user", "content": inp}] if isinstance(inp, str) else inp if isinstance(inp, list) else []
    if isinstance(msgs, dict):
        msgs = [msgs]
    return msgs


def _normalize(body: dict) -> list[_Msg]:
    out: list[_Msg] = []
    system = body.get("system")
    if system is None:
        system = body.get("instructions")
    if system is not None:
        runs, _, _, _ = _content_runs(system)
        out.append(_Msg("system", 1, runs))
    for k, msg in enumerate(_messages(body)):
        part = 2 + k
        if not isinstance(msg, dict):
            runs, _, _, _ = _content_runs(msg)
            out.append(_Msg("user", part, runs))
            continue
        role = msg.get("role")
        typ = msg.get("type")
        if role is None and typ == "function_call":  # responses API items
            call = (msg.get("name") or "", msg.get("arguments") if msg.get("arguments") is not None else "{}")
            if out and out[-1].role == "assistant" and out[-1].calls:
                out[-1].calls.append(call)
            else:
                out.append(_Msg("assistant", part, calls=[call]))
            continue
        if role is None and typ == "function_call_output":
            runs, _, _, _ = _content_runs(msg.get("output"))
            out.append(_Msg("tool", part, runs))
            continue
        runs, reasoning, calls, results = _content_runs(msg.get("content"))
        if role in ("system", "developer"):
            out.append(_Msg("system", part, runs))
        elif role in ("assistant", "model"):
            rc = msg.get("reasoning_content")
            if isinstance(rc, str) and rc:
                reasoning = rc if reasoning is None else rc + "\n" + reasoning
            out.append(_Msg("assistant", part, runs, reasoning, calls + _openai_calls(msg)))
        elif role in ("tool", "function"):
            out.append(_Msg("tool", part, runs))
        else:  # user (and anything else); anthropic tool results first, as tool messages
            for res in results:
                out.append(_Msg("tool", part, res))
            if runs or not results:
                out.append(_Msg("user", part, runs))
    tools = [_tool_function(t) for t in body.get("tools") or ()]
    if tools:
        first = next((m for m in out if m.role == "system"), None)
        if first is None:
            first = _Msg("system", 0)
            out.insert(0, first)
        first.tools = tools
    return out


def _tool_function(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    if isinstance(tool.get("function"), dict):
        return tool["function"]
    tool = _strip_cc(tool)
    if "input_schema" in tool:  # anthropic
        out = {"name": tool.get("name")}
        if "description" in tool:
            out["description"] = tool["description"]
        out["parameters"] = tool["input_schema"]
        return out
    return {k: v for k, v in tool.items() if k != "type"} if tool.get("type") == "function" else tool


def thinking_mode(body: dict, msgs: list[_Msg] | None = None) -> bool:
    """Whether the request is rendered in thinking mode (see the module docstring)."""
    model = body.get("model")
    if isinstance(model, str) and "reasoner" in model.lower():
        return True
    th = body.get("thinking")
    if isinstance(th, dict) and th.get("type") == "enabled":
        return True
    msgs = _normalize(body) if msgs is None else msgs
    last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    return any(m.role == "assistant" and m.reasoning for m in msgs[last_user + 1:])


# --------------------------------------------------------------------------- rendering

def _arguments(p: _Pieces, args: Any, part: int) -> None:
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            p.text(args, part)  # not a JSON object: as it is
            return
        args = parsed
    if not isinstance(args, dict):
        p.text(_dumps(args), part)
        return
    for i, (key, value) in enumerate(args.items()):
        if i:
            p.text("\n", part)
        p.text("<", part)
        p.marker("dsml", part)
        is_str = isinstance(value, str)
        p.text(f'parameter name="{key}" string="{"true" if is_str else "false"}">'
               + (value if is_str else _dumps(value)) + "</", part)
        p.marker("dsml", part)
        p.text("parameter>", part)


def _assistant(p: _Pieces, m: _Msg, with_reasoning: bool, part: int) -> None:
    if with_reasoning:
        p.text(m.reasoning or "", part)
        p.marker("think_end", part)
    p.runs(m.runs, part)
    if m.calls:
        p.text("\n\n<", part)
        p.marker("dsml", part)
        p.text("function_calls>\n", part)
        for i, (name, args) in enumerate(m.calls):
            if i:
                p.text("\n", part)
            p.text("<", part)
            p.marker("dsml", part)
            p.text(f'invoke name="{name}">\n', part)
            _arguments(p, args, part)
            p.text("\n</", part)
            p.marker("dsml", part)
            p.text("invoke>", part)
        p.text("\n</", part)
        p.marker("dsml", part)
        p.text("function_calls>", part)
    p.marker("eos", part)


def _tools_block(p: _Pieces, tools: list, part: int) -> None:
    p.text("\n\n", part)
    head, tail = TOOLS_BLOCK.split("{tool_schemas}")
    schemas = "\n".join(_dumps(t) for t in tools)
    for chunk in _SPLIT.split(head + schemas + tail):
        if chunk in _BY_TOKEN:
            p.marker(_BY_TOKEN[chunk], 0)
        else:
            p.text(chunk, 0)  # (joins the system's piece when it follows it directly)


def _render(body: dict) -> list[Piece]:
    msgs = _normalize(body)
    thinking = thinking_mode(body, msgs)
    last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    p = _Pieces()
    p.marker("bos", 0)
    result_no = 0  # position of a tool message in its run of results
    for i, m in enumerate(msgs):
        part = m.part
        if m.role == "system":
            p.runs(m.runs, part)
            if m.tools:
                _tools_block(p, m.tools, part)
        elif m.role == "user":
            p.marker("user", part)
            p.runs(m.runs, part)
            p.marker("assistant", part)
            p.marker("think" if thinking and i == last_user else "think_end", part)
        elif m.role == "assistant":
            _assistant(p, m, thinking and i > last_user, part)
        else:  # tool
            result_no = result_no + 1 if i and msgs[i - 1].role == "tool" else 1
            j = i - result_no
            n_calls = len(msgs[j].calls) if j >= 0 and msgs[j].role == "assistant" else 0
            if result_no == 1:
                p.text("\n\n<function_results>", part)
            p.text("\n<result>", part)
            p.runs(m.runs, part)
            p.text("</result>", part)
            if result_no >= n_calls or i + 1 == len(msgs) or msgs[i + 1].role != "tool":
                p.text("\n</function_results>\n\n", part)
                p.marker("think" if thinking and i >= last_user else "think_end", part)
    return p.done()


def render_request(body: dict, fmt: str = "anthropic", ts_us: int | None = None) -> list[Piece]:
    """The request's pieces under DeepSeek's encoding (see the module docstring);
    ``fmt`` and ``ts_us`` are accepted for the contract (both dialects' shapes
    are recognised; the encoding prints no date)."""
    return _render(body)


def render_output(output: Any, fmt: str = "anthropic") -> list[Piece]:
    """The reply's pieces, as the next request's history holds it in thinking
    mode (reasoning + ``</think>``, when it has reasoning) — text, tool calls,
    ``EOS`` (part -1); the prompt already ends with the generation prompt."""
    if isinstance(output, dict) and ("role" in output or "tool_calls" in output or "reasoning_content" in output):
        msgs = _normalize({"messages": [dict(output, role="assistant")]})
    elif isinstance(output, dict) and "content" in output:
        msgs = _normalize({"messages": [{"role": "assistant", "content": output.get("content")}]})
    else:
        msgs = _normalize({"messages": [{"role": "assistant", "content": output}]})
    m = msgs[0] if msgs else _Msg("assistant", OUTPUT_PART)
    p = _Pieces()
    _assistant(p, m, bool(m.reasoning), OUTPUT_PART)
    return p.done()


def render_text(pieces, tokenizer: Any = None) -> str:
    """The whole prompt as one string (markers as DeepSeek's special tokens)."""
    return _render_text(pieces, tokenizer if tokenizer is not None else _SpecialTokens())


class _SpecialTokens:
    @staticmethod
    def marker_token(name: str) -> str:
        return SPECIALS[name]
