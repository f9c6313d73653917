"""Agents' conversations as logged request bodies (Anthropic or OpenAI shape),
growing turn by turn across a UTC midnight, and the chat templates of
tests/fixtures/templates they are rendered with."""

from __future__ import annotations

import base64
import copy
import json
import random
import struct
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

from support.paths import FIXTURES

TEMPLATES = FIXTURES / "templates"

CHATML, DATED, STRIPS = (TEMPLATES / n for n in ("chatml_tools.jinja", "dated.jinja", "strips_reasoning.jinja"))

MIDNIGHT = datetime(2026, 11, 17, tzinfo=timezone.utc)

MIDNIGHT_US = int(MIDNIGHT.timestamp()) * 1_000_000


WORDS = ("the quick brown fox jumps over lazy dog cache prefix token tool result file read write "
         "ünïcödé naïve café 日本語 中文 😀 🚀 x=1; {\"a\": [1, 2]} <tag> 12345 3.14 \t tabs  two  spaces").split(" ")


def png_b64(w: int = 4, h: int = 3) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes((x * 7 + y) % 256 for x in range(w)) for y in range(h))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


TOOL_SPECS = [
    ("bash", "Run a shell command.", {"type": "object", "properties": {"command": {"type": "string"},
                                                                       "timeout": {"type": "integer"}},
                                      "required": ["command"]}),
    ("read_file", "Read a file — ünïcödé", {"type": "object", "properties": {"path": {"type": "string"}}}),
]


#: special tokens' text written in messages: cut at by tokenizers like the template's own
LITERAL_SPECIALS = ("<think>", "<｜User｜>", "<|im_end|>", "<｜tool▁call▁begin｜>")


def _text(rng: random.Random, lo: int = 1, hi: int = 12, literal: bool = False) -> str:
    words = WORDS + list(LITERAL_SPECIALS) if literal else WORDS
    s = " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))
    return s + rng.choice(["", "\n", "\n\n", "  "])


def _args(rng: random.Random, name: str) -> dict:
    if name == "bash":
        out = {"command": "ls " + rng.choice(WORDS)}
        if rng.random() < 0.5:
            out["timeout"] = rng.randint(1, 99)
        return out
    return {"path": "/tmp/" + rng.choice(["a.py", "b.txt", "ü.md"])}


class Conversation:
    """An agent's conversation in one format, growing turn by turn: ``step()``
    returns the next request body (all previous messages + new ones)."""

    def __init__(self, rng: random.Random, fmt: str, tools: bool, literal: bool = True):
        self.rng, self.fmt, self.tools, self.n, self.literal = rng, fmt, tools, 0, literal
        self.messages: list[dict] = []
        self.system = self._text(3, 20) if rng.random() < 0.8 else None
        self.pending_call: str | None = None

    def _text(self, lo: int = 1, hi: int = 12) -> str:
        return _text(self.rng, lo, hi, self.literal)

    def _user_content(self):
        rng = self.rng
        r = rng.random()
        if r < 0.4:
            return self._text()
        blocks = [{"type": "text", "text": self._text()} for _ in range(rng.randint(1, 3))]
        if r < 0.7:
            image = ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png_b64()}}
                     if self.fmt == "anthropic" else
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png_b64()}})
            blocks.insert(rng.randrange(len(blocks) + 1), image)
        return blocks

    def _assistant(self, reasoning: bool, call: bool) -> list[dict]:
        rng = self.rng
        thought, text = self._text(2, 8), self._text() if rng.random() < 0.7 or not call else None
        name = rng.choice(TOOL_SPECS)[0]
        args = _args(rng, name)
        cid = f"call_{self.n}_{rng.randrange(1000)}"
        self.n += 1
        self.pending_call = cid if call else None
        if self.fmt == "anthropic":
            blocks = []
            if reasoning:
                blocks.append({"type": "thinking", "thinking": thought, "signature": "c2ln"})
            if text is not None:
                blocks.append({"type": "text", "text": text})
            if call:
                blocks.append({"type": "tool_use", "id": cid, "name": name, "input": args})
            return [{"role": "assistant", "content": blocks}]
        msg: dict = {"role": "assistant", "content": text}
        if reasoning:
            msg["reasoning_content"] = thought
        if call:
            msg["tool_calls"] = [{"id": cid, "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(args)}}]
        return [msg]

    def _tool_result(self, cid: str) -> list[dict]:
        rng = self.rng
        if self.fmt == "anthropic":
            res = self._text() if rng.random() < 0.5 else [{"type": "text", "text": self._text()} for _ in range(2)]
            blocks = [{"type": "tool_result", "tool_use_id": cid, "content": res}]
            if rng.random() < 0.3:
                blocks.append({"type": "text", "text": self._text()})
            return [{"role": "user", "content": blocks}]
        return [{"role": "tool", "tool_call_id": cid, "content": self._text()}]

    def body(self) -> dict:
        body: dict = {"model": "m", "max_tokens": 1024}
        msgs = copy.deepcopy(self.messages)
        if self.system is not None:
            if self.fmt == "anthropic":
                body["system"] = (self.system if self.rng.random() < 0.5 else
                                  [{"type": "text", "text": self.system}, {"type": "text", "text": "more rules"}])
            else:
                msgs.insert(0, {"role": "system", "content": self.system})
        body["messages"] = msgs
        if self.tools:
            body["tools"] = ([{"name": n, "description": d, "input_schema": s} for n, d, s in TOOL_SPECS]
                             if self.fmt == "anthropic" else
                             [{"type": "function", "function": {"name": n, "description": d, "parameters": s}}
                              for n, d, s in TOOL_SPECS])
        return body

    def step(self) -> dict:
        """The next request: a first user message, or the model's last reply
        followed by a tool result or a new user message."""
        rng = self.rng
        if self.messages:
            call = self.tools and rng.random() < 0.5
            self.messages += self._assistant(rng.random() < 0.5, call)
            if call:
                self.messages += self._tool_result(self.pending_call)
            else:
                self.messages.append({"role": "user", "content": self._user_content()})
        else:
            self.messages.append({"role": "user", "content": self._user_content()})
        return self.body()


def conversations_log(seeds, fmt: str, path: Path, n_conv: int = 3, turns: int = 5,
                      literal: bool = True) -> list[dict]:
    """A JSONL log, per seed, of ``n_conv`` interleaved growing conversations
    whose times cross a UTC midnight; returns its records in line order."""
    records = []
    for seed in seeds:
        rng = random.Random(seed)
        mine = []
        for c in range(n_conv):
            conv = Conversation(rng, fmt, tools=c % 3 != 2, literal=literal)
            t = MIDNIGHT - timedelta(seconds=4 - c, microseconds=rng.randrange(1000))
            for _ in range(turns):
                mine.append({"timestamp": t.isoformat(), "session": f"s{seed}-{c}", "request": conv.step()})
                t += timedelta(seconds=rng.choice([0.5, 1, 2]), microseconds=rng.randrange(10))
        rng.shuffle(mine)
        records += mine
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return records
