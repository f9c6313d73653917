"""The agents' tool catalogs and system prompts (one :class:`Flavor` per agent product).

Tool descriptions and schemas are generated once per seed; MCP tools can be
re-described (``tool_schema_change``) and any tool re-serialized with another key
order (``json_key_order``) per request.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from replay.synth.text import Text

# (name, kind, first sentence, [(param, type, required)])
_CLAUDE_TOOLS = [
    ("Task", "task", "Launch a new agent to handle complex, multi-step tasks autonomously.",
     [("description", "string", True), ("prompt", "string", True), ("subagent_type", "string", True)]),
    ("Bash", "bash", "Executes a given bash command in a persistent shell session with optional timeout.",
     [("command", "string", True), ("timeout", "number", False), ("description", "string", False),
      ("run_in_background", "boolean", False)]),
    ("Glob", "glob", "Fast file pattern matching tool that works with any codebase size.",
     [("pattern", "string", True), ("path", "string", False)]),
    ("Grep", "grep", "A powerful search tool built on ripgrep.",
     [("pattern", "string", True), ("path", "string", False), ("glob", "string", False),
      ("output_mode", "string", False), ("-n", "boolean", False), ("head_limit", "number", False)]),
    ("LS", "ls", "Lists files and directories in a given path.",
     [("path", "string", True), ("ignore", "array", False)]),
    ("ExitPlanMode", "other", "Use this tool when you are in plan mode and have finished presenting your plan.",
     [("plan", "string", True)]),
    ("Read", "read", "Reads a file from the local filesystem.",
     [("file_path", "string", True), ("offset", "number", False), ("limit", "number", False)]),
    ("Edit", "edit", "Performs exact string replacements in files.",
     [("file_path", "string", True), ("old_string", "string", True), ("new_string", "string", True),
      ("replace_all", "boolean", False)]),
    ("MultiEdit", "edit", "This is a tool for making multiple edits to a single file in one operation.",
     [("file_path", "string", True), ("edits", "array", True)]),
    ("Write", "write", "Writes a file to the local filesystem.",
     [("file_path", "string", True), ("content", "string", True)]),
    ("NotebookEdit", "other", "Completely replaces the contents of a specific cell in a Jupyter notebook.",
     [("notebook_path", "string", True), ("cell_id", "string", False), ("new_source", "string", True)]),
    ("WebFetch", "web", "Fetches content from a specified URL and processes it using an AI model.",
     [("url", "string", True), ("prompt", "string", True)]),
    ("TodoWrite", "todo", "Use this tool to create and manage a structured task list for your current coding session.",
     [("todos", "array", True)]),
    ("WebSearch", "web", "Allows the agent to search the web and use the results to inform responses.",
     [("query", "string", True), ("allowed_domains", "array", False)]),
    ("BashOutput", "other", "Retrieves output from a running or completed background bash shell.",
     [("bash_id", "string", True), ("filter", "string", False)]),
]
_CODEX_TOOLS = [
    ("shell", "bash", "Runs a shell command and returns its output.",
     [("command", "array", True), ("workdir", "string", False), ("timeout_ms", "number", False)]),
    ("apply_patch", "edit", "Use the apply_patch tool to edit files.", [("input", "string", True)]),
    ("read_file", "read", "Reads a local file with 1-indexed line numbers.",
     [("path", "string", True), ("offset", "number", False), ("limit", "number", False)]),
    ("list_dir", "ls", "Lists entries in a local directory with 1-indexed entry numbers.",
     [("dir_path", "string", True), ("depth", "number", False)]),
    ("grep_files", "grep", "Finds files whose contents match the pattern and lists them by modification time.",
     [("pattern", "string", True), ("include", "string", False), ("path", "string", False)]),
    ("update_plan", "todo", "Updates the task plan.", [("explanation", "string", False), ("plan", "array", True)]),
    ("spawn_agent", "task", "Starts a helper agent with its own context for an isolated sub-task.",
     [("task", "string", True), ("agent", "string", True)]),
    ("view_image", "other", "Attach a local image to the conversation context.", [("path", "string", True)]),
    ("web_search", "web", "Searches the web for up-to-date information.", [("query", "string", True)]),
    ("write_file", "write", "Creates or overwrites a file.", [("path", "string", True), ("content", "string", True)]),
    ("run_tests", "bash", "Runs the project's test suite or a subset of it.",
     [("selector", "string", False), ("timeout_ms", "number", False)]),
]
# MCP / plugin tools: listed after the built-ins, in discovery order
_MCP_TOOLS = [
    ("mcp__postgres__query", "mcp", "Run a read-only SQL query against the connected database.",
     [("sql", "string", True), ("max_rows", "number", False)]),
    ("mcp__postgres__describe_table", "mcp", "Describe the columns, indexes and constraints of a table.",
     [("table", "string", True), ("schema", "string", False)]),
    ("mcp__github__search_issues", "mcp", "Search issues and pull requests in the configured GitHub repositories.",
     [("query", "string", True), ("state", "string", False), ("per_page", "number", False)]),
    ("mcp__github__get_pull_request", "mcp", "Get a pull request with its review comments and checks.",
     [("owner", "string", True), ("repo", "string", True), ("number", "number", True)]),
    ("mcp__linear__create_issue", "mcp", "Create an issue in the team's Linear workspace.",
     [("title", "string", True), ("description", "string", False), ("team", "string", True)]),
]
# rewordings of the MCP descriptions' opening sentence (one per MCP server restart)
_MCP_REWORD = (
    "", "[server v{v}] ", "(MCP server restarted; build {v}) ", "Tool provided by MCP server (revision {v}). ",
    "Updated {v}: ",
)
_SUB_OWN_TOOLS = [
    ("ReportFindings", "other", "Report the findings of this sub-task back to the main agent.",
     [("summary", "string", True), ("files", "array", False), ("confidence", "string", False)]),
    ("mcp__docs__search", "mcp", "Search the internal documentation index and return the best passages.",
     [("query", "string", True), ("top_k", "number", False)]),
]
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
    specs = _CLAUDE_TOOLS if name == "claude" else _CODEX_TOOLS
    lo, hi = (330, 650) if name == "claude" else (700, 1150)
    main = [_make_tool(tx, s, tx.r.randint(lo, hi)) for s in specs]
    mcp = [_make_tool(tx, s, tx.r.randint(350, 600)) for s in _MCP_TOOLS]
    own = [_make_tool(tx, s, tx.r.randint(500, 800)) for s in _SUB_OWN_TOOLS]
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

