"""The agents' tool catalogs and system prompts (one :class:`Flavor` per agent product).

Tool descriptions and schemas are generated once per seed; MCP tools can be
re-described (``tool_schema_change``) and any tool re-serialized with another key
order (``json_key_order``) per request.
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.synth.text import Text


def _catalog() -> dict[str, list[tuple[str, str, str, list[tuple[str, str, bool]]]]]:
    """tools.toml: per agent, (name, kind, first sentence, [(param, type, required)])."""
    with (Path(__file__).parent / "tools.toml").open("rb") as f:
        data = tomllib.load(f)
    return {group: [(t["name"], t["kind"], t["first"],
                     [(p.rstrip("!").split(":")[0], p.rstrip("!").split(":")[1], p.endswith("!"))
                      for p in t["params"]]) for t in tools]
            for group, tools in data.items()}


_TOOLS = _catalog()

# rewordings of the MCP descriptions' opening sentence (one per MCP server restart)
_MCP_REWORD = (
    "", "[server v{v}] ", "(MCP server restarted; build {v}) ", "Tool provided by MCP server (revision {v}). ",
    "Updated {v}: ",
)
_SUB_SUBSET = {"claude": ("Bash", "Grep", "Read"), "codex": ("shell", "read_file", "grep_files")}


@dataclass
class ToolDef:
    name: str
    kind: str
    desc_body: str  # description after the (possibly reworded) first sentence
    first: str
    schema: dict
    mcp: bool = False

    def description(self, version: int) -> str:
        pre = _MCP_REWORD[version % len(_MCP_REWORD)].format(v=f"{2 + version}.{(7 * version) % 10}.{version}")
        if self.mcp and version:
            # reword the opening sentence as well, not only a prefix
            first = self.first.replace("the ", "the configured ", 1) if version % 2 else self.first.rstrip(".") + " (read-only)."
            return pre + first + "\n\n" + self.desc_body
        return self.first + "\n\n" + self.desc_body


def _make_tool(tx: Text, spec, desc_chars: int) -> ToolDef:
    name, kind, first, params = spec
    body = tx.prose(desc_chars)
    if kind in ("bash", "grep", "edit", "read"):
        body += "\n\nUsage notes:\n" + tx.bullets(4, 8)
        if tx.r.random() < 0.6:
            body += "\n\nExample:\n" + tx.code(tx.r.randint(4, 9))
    props: dict[str, Any] = {}
    for pname, ptype, _req in params:
        p: dict[str, Any] = {"type": ptype, "description": tx.sentence() + " " + tx.sentence()}
        if ptype == "array":
            p["items"] = {"type": "object", "properties": {
                "content": {"type": "string", "minLength": 1},
                "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                "id": {"type": "string"}}, "required": ["content", "status", "id"],
                "additionalProperties": False} if kind == "todo" else {"type": "string"}
        if pname == "output_mode":
            p["enum"] = ["content", "files_with_matches", "count"]
        props[pname] = p
    schema = {"type": "object", "properties": props,
              "required": [p for p, _t, req in params if req],
              "additionalProperties": False,
              "$schema": "http://json-schema.org/draft-07/schema#"}
    return ToolDef(name, kind, body, first, schema, mcp=name.startswith("mcp__"))


_ANTH_KEYS = ("name", "description", "input_schema")
_OAI_KEYS = ("name", "description", "parameters")


def tool_def_json(t: ToolDef, fmt: str, version: int, key_order: tuple[int, int, int]) -> dict:
    desc = t.description(version if t.mcp else 0)
    vals = [t.name, desc, t.schema]
    keys = _ANTH_KEYS if fmt == "anthropic" else _OAI_KEYS
    d = {keys[i]: vals[i] for i in key_order}
    if fmt == "anthropic":
        return d
    return {"type": "function", "function": d}


@dataclass
class Flavor:
    """One agent product: its tool catalog and system prompt."""
    name: str  # claude | codex
    main_tools: list[ToolDef]
    mcp_tools: list[ToolDef]
    sub_tools: list[ToolDef]
    sub_own: list[ToolDef]  # the sub-agents' own tools (listed after the subset)
    intro: str
    system_main: str
    system_sub: str


def make_flavor(seed: int, name: str) -> Flavor:
    tx = Text(random.Random(seed * 7919 + (1 if name == "claude" else 2)))
    specs = _TOOLS[name]
    lo, hi = (330, 650) if name == "claude" else (700, 1150)
    main = [_make_tool(tx, s, tx.r.randint(lo, hi)) for s in specs]
    mcp = [_make_tool(tx, s, tx.r.randint(350, 600)) for s in _TOOLS["mcp"]]
    own = [_make_tool(tx, s, tx.r.randint(500, 800)) for s in _TOOLS["subagent"]]
    by_name = {t.name: t for t in main}
    sub = [by_name[n] for n in _SUB_SUBSET[name]]
    if name == "claude":
        intro = ("You are Claude Code, Anthropic's official CLI for Claude.")
        product = "Claude Code"
    else:
        intro = "You are Forge, a coding agent running in a terminal on the user's computer."
        product = "Forge"
    sections = []
    for title in ("Tone and style", "Proactiveness", "Following conventions", "Code style",
                  "Task management", "Doing tasks", "Tool usage policy", "Security", "Git workflow"):
        sections.append(f"# {title}\n{tx.prose(tx.r.randint(600, 1050))}")
    system_main = ("You are an interactive CLI tool that helps users with software engineering tasks. "
                   "Use the instructions below and the tools available to you to assist the user.\n\n"
                   + "\n\n".join(sections)
                   + f"\n\nIf the user asks for help or wants to give feedback about {product}, "
                   "tell them to open an issue in the project tracker.")
    system_sub = (f"You are a sub-agent of {product}. You are given one focused task by the main agent. "
                  f"Work autonomously and report back with ReportFindings.\n\n"
                  + tx.prose(2400))
    return Flavor(name, main, mcp, sub, own, intro, system_main, system_sub)

