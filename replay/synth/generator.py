"""Synthetic request logs with planted cache-miss causes and their ground truth.

``generate(out_dir, seed=0, scale=1.0, ...)`` writes, deterministically from
``seed`` (same seed → byte-identical files):

* ``agent-anthropic.jsonl`` — coding-agent sessions, Anthropic Messages API
  requests wrapped as ``{"timestamp", "tenant", "session", "request",
  "response"}`` (ISO-8601 timestamps with milliseconds);
* ``agent-openai.jsonl`` — the same kind of traffic as OpenAI chat-completions
  requests (epoch-seconds float timestamps, ``prompt_cache_key`` on some);
* ``chat-openai.jsonl`` — a chat application (OpenAI format) whose system prompt
  starts with a per-user line and a seconds-precision timestamp line; its log
  has no session id (``"session": null``);
* ``_truth.jsonl`` — one line per request (all files, in file then line order):
  ``{"file", "line", "session", "tenant", "causes", "first_in_session", ...}``.

Traffic
-------
Main coding-agent sessions (a large stable tools + system prefix, > 40 KB of
text; conversations of 5–60 model calls grouped in 1–4 human tasks; assistant
turns with text + tool calls, tool results with code and command output),
sub-agent sessions spawned by the main agent's ``Task`` tool (a different tool
set: a subset of the main agent's plus tools of their own, a shorter system
prompt), and the chat application. Agent gaps are seconds (model latency + tool
run time); human think times between tasks are drawn from four buckets spread
across the TTLs one sweeps (1–4 min, 6–25 min, 35–55 min, 1.2–5 h).

Planted causes (:data:`CAUSES`)
------------------------------
``rotating_header``   first system block is ``x-anthropic-billing-header: …;
                      cch=<5 hex>`` and changes on every request;
``timestamp``         chat app's seconds-precision time line; agent sessions with
                      ``Current time: …`` at the top of the system prompt;
``volatile_id``       a per-request UUID in the system prompt's environment block;
``per_user_data``     chat app's first line ``You are talking to <name> (user <id>)``;
``tool_order``        MCP/plugin tools listed in a new (shuffled) order each request;
``tool_schema_change`` MCP tool descriptions reworded at MCP-server restarts
                      (same names), mid-session;
``json_key_order``    tool definitions re-serialized with another key order each
                      request (same JSON value);
``history_rewrite``   an old tool result replaced by ``[output truncated]``
                      mid-session.

Ground truth semantics
----------------------
``causes`` lists the planted causes that change the prompt of *this* request
relative to the previous request of its session stream (time order, ties in
input order); a request without a session (the chat app) belongs to its
tenant's fallback stream ``tenant:<tenant>`` — as in the ``session`` stream mode
of ``docs/semantics.md``. Every listed cause would on its own end the shared
prefix early; the list is ordered by position in the rendered prompt
(tools → system → messages), so ``causes[0]`` is where the shared prefix ends.
The first request of a stream has ``first_in_session: true`` and no causes.
Extra fields: ``stream``, ``prev_line`` (line of the previous request of the
stream in the same file, null for the first), ``kind`` (``agent``, ``subagent``,
``chat``), ``prompt_chars`` / ``shared_chars`` (rendered characters of this
prompt and of the prefix it shares with the previous one, a rough
tokenizer-free measure) and ``cut`` — where the shared prefix ends:
``tools``, ``system``, ``messages`` or ``end`` (the previous prompt is a prefix
of this one).

Usage figures in the responses are estimates (about 4 characters per token),
self-consistent but not meant as a hit oracle.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import permutations
from pathlib import Path
from typing import Any

import numpy as np

CAUSES: tuple[str, ...] = (
    "rotating_header",
    "timestamp",
    "volatile_id",
    "per_user_data",
    "tool_order",
    "tool_schema_change",
    "json_key_order",
    "history_rewrite",
)

# order of causes by position in the rendered prompt (tools → system → messages)
_CAUSE_RANK = {
    "tool_order": 0,
    "json_key_order": 1,
    "tool_schema_change": 2,
    "rotating_header": 3,
    "per_user_data": 4,
    "timestamp": 5,
    "volatile_id": 6,
    "history_rewrite": 7,
}

# human think-time buckets (seconds): spread across the TTLs a sweep covers
GAP_BUCKETS: tuple[tuple[float, float], ...] = (
    (60.0, 240.0),  # 1–4 min (< 5 min)
    (360.0, 1500.0),  # 6–25 min (5–30 min)
    (2100.0, 3300.0),  # 35–55 min (30–60 min)
    (4320.0, 18000.0),  # 1.2–5 h (> 1 h)
)
_GAP_BAG = (0, 0, 0, 0, 1, 1, 1, 2, 2, 3)

FILES = {
    "agent-anthropic": "anthropic",
    "agent-openai": "openai",
    "chat-openai": "openai",
}


@dataclass
class SynthResult:
    out_dir: Path
    files: dict[str, Path]  # name → path of each log file written
    truth: Path
    counts: dict[str, int]  # log file name → requests
    cause_counts: dict[str, int]  # cause → planted requests
    requests: int
    bytes: int  # total size of the files written (logs + truth)
    sessions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


# ============================================================================ text

_NOUNS = (
    "file directory function module test repository branch commit change error warning "
    "output input request response session user token cache prefix schema parameter "
    "argument value field record table query index result command process shell "
    "environment variable path pattern line column range buffer stream message block "
    "section document summary report issue ticket review patch diff dependency package "
    "version release build pipeline job step task agent tool model prompt context window "
    "limit budget timeout retry handler callback interface class method object instance "
    "type signature config migration endpoint service client server worker queue event "
    "log trace metric alert snapshot fixture mock assertion exception stack frame thread "
    "lock transaction connection cursor row key hash checksum archive image layer "
    "container volume secret credential permission role policy account workspace project"
).split()
_ADJS = (
    "relevant existing current previous specific absolute relative optional required "
    "large small temporary persistent local remote new original exact partial complete "
    "empty invalid valid unique duplicate recent stale cached default explicit implicit "
    "nested sorted structured readable concise detailed unrelated failing passing broken "
    "generated deprecated internal external public private shared isolated minimal"
).split()
_VERB3 = (
    "reads writes returns updates creates deletes searches lists runs executes validates "
    "checks compares parses formats renders loads stores fetches sends receives tracks "
    "records reports replaces inserts removes resolves expands collects filters matches "
    "limits truncates preserves describes"
).split()
_VERB_IMP = (
    "read write return update create delete search list run execute validate check compare "
    "parse format render load store fetch send track record report replace insert remove "
    "prefer avoid use include keep verify confirm inspect summarize explain mention quote "
    "batch group split"
).split()
_PREPS = "in from to for with before after inside across within against into over".split()
_SUBJ = ("the agent", "you", "this tool", "the command", "the user", "the harness", "the model", "the caller")
_WHEN = ("When", "If", "Before", "After", "Whenever", "Unless", "Once", "While")
_CONJ = ("and", "but", "so", "because", "while", "although", "unless", "since")
_NAMES = (
    "Alice Chen", "Bruno Silva", "Chiara Rossi", "Dmitri Volkov", "Emeka Obi", "Fatima Zahra",
    "Gao Lei", "Hana Sato", "Ivan Petrov", "Jonas Berg", "Kavya Iyer", "Lena Fischer",
    "Mateo Garcia", "Nadia Haddad", "Oscar Lind", "Priya Nair", "Quentin Roy", "Rosa Diaz",
    "Sven Holm", "Tariq Aziz", "Uma Patel", "Victor Hugo", "Wen Li", "Yara Costa", "Zoe Martin",
)
_CHAT_TOPICS = (
    "planning a trip to Lisbon", "a recipe for vegetable curry", "how compound interest works",
    "writing a cover letter", "the rules of cricket", "learning Spanish verbs",
    "fixing a slow laptop", "a birthday gift idea", "training for a 10k run",
    "understanding a rental contract", "a short poem about autumn", "choosing a houseplant",
    "explaining photosynthesis to a child", "budgeting for a wedding", "a polite email to a landlord",
)


class Text:
    """Prose, code and command output from a vocabulary (deterministic per rng)."""

    def __init__(self, rng: random.Random):
        self.r = rng

    def c(self, seq):
        return seq[self.r.randrange(len(seq))]

    def np_(self) -> str:
        r = self.r.random()
        if r < 0.45:
            return f"the {self.c(_ADJS)} {self.c(_NOUNS)}"
        if r < 0.75:
            return f"the {self.c(_NOUNS)}"
        adj = self.c(_ADJS)
        return f"{'an' if adj[0] in 'aeiou' else 'a'} {adj} {self.c(_NOUNS)}"

    def sentence(self) -> str:
        k = self.r.randrange(7)
        if k == 0:
            s = f"{self.c(_VERB_IMP).capitalize()} {self.np_()} {self.c(_PREPS)} {self.np_()}"
        elif k == 1:
            s = f"This tool {self.c(_VERB3)} {self.np_()} and {self.c(_VERB3)} {self.np_()} {self.c(_PREPS)} {self.np_()}"
        elif k == 2:
            s = (f"{self.c(_WHEN)} {self.np_()} is {self.c(_ADJS)}, {self.c(_VERB_IMP)} "
                 f"{self.np_()} {self.c(_PREPS)} {self.np_()}")
        elif k == 3:
            s = (f"Do not {self.c(_VERB_IMP)} {self.c(_NOUNS)}s {self.c(_PREPS)} {self.np_()} "
                 f"unless the user explicitly asks you to")
        elif k == 4:
            s = (f"{self.c(_SUBJ).capitalize()} {self.c(_VERB3)} {self.np_()}, "
                 f"{self.c(_CONJ)} {self.c(_SUBJ)} {self.c(_VERB3)} {self.np_()}")
        elif k == 5:
            s = (f"It is important to {self.c(_VERB_IMP)} {self.np_()} {self.c(_PREPS)} {self.np_()} "
                 f"so that {self.c(_SUBJ)} {self.c(_VERB3)} {self.np_()}")
        else:
            s = f"{self.np_().capitalize()} {self.c(_VERB3)} {self.np_()}"
        return s + "."

    def paragraph(self, lo=3, hi=6) -> str:
        return " ".join(self.sentence() for _ in range(self.r.randint(lo, hi)))

    def bullets(self, lo=3, hi=6) -> str:
        return "\n".join("- " + self.sentence() for _ in range(self.r.randint(lo, hi)))

    def prose(self, n_chars: int) -> str:
        out, size = [], 0
        while size < n_chars:
            p = self.paragraph() if self.r.random() < 0.65 else self.bullets()
            out.append(p)
            size += len(p) + 2
        return "\n\n".join(out)

    def ident(self) -> str:
        return f"{self.c(_VERB_IMP)}_{self.c(_ADJS)}_{self.c(_NOUNS)}" if self.r.random() < 0.5 \
            else f"{self.c(_VERB_IMP)}_{self.c(_NOUNS)}"

    def path(self) -> str:
        d = self.c(("src", "lib", "app", "pkg", "tests", "services", "internal"))
        sub = self.c(_NOUNS)
        ext = self.c((".py", ".py", ".py", ".ts", ".go", ".rs", ".md", ".toml"))
        return f"{d}/{sub}/{self.c(_ADJS)}_{self.c(_NOUNS)}{ext}"

    def code(self, n_lines: int) -> str:
        lines: list[str] = []
        while len(lines) < n_lines:
            fn = self.ident()
            args = ", ".join(self.c(_NOUNS) for _ in range(self.r.randint(1, 3)))
            lines.append(f"def {fn}({args}, *, strict: bool = False) -> dict:")
            lines.append(f'    """{self.sentence()}"""')
            for _ in range(self.r.randint(2, 6)):
                k = self.r.randrange(5)
                a, b = self.c(_NOUNS), self.c(_NOUNS)
                if k == 0:
                    lines.append(f"    {a} = {self.ident()}({b}, limit={self.r.randint(1, 512)})")
                elif k == 1:
                    lines.append(f"    if not {a}.{self.c(_ADJS)}:")
                    lines.append(f'        raise ValueError("{self.c(_ADJS)} {b}: %r" % {a})')
                elif k == 2:
                    lines.append(f"    for {a} in {b}s:")
                    lines.append(f"        result[{a}.key] = {self.ident()}({a})")
                elif k == 3:
                    lines.append(f"    # {self.sentence()}")
                else:
                    lines.append(f"    {a}.{self.c(_VERB_IMP)}({b}, strict=strict)")
            lines.append(f"    return {{\"{self.c(_NOUNS)}\": {self.c(_NOUNS)}, \"ok\": True}}")
            lines.append("")
        return "\n".join(lines[:n_lines])

    def numbered(self, code: str, start: int) -> str:
        return "\n".join(f"{start + i:6d}\t{ln}" for i, ln in enumerate(code.split("\n")))

    def command(self) -> str:
        k = self.r.randrange(7)
        if k == 0:
            return f"python -m pytest tests/test_{self.c(_NOUNS)}.py -q -x"
        if k == 1:
            return "git status --short && git diff --stat"
        if k == 2:
            return f"grep -rn \"{self.ident()}\" src/ | head -20"
        if k == 3:
            return f"ls -la {self.c(('src', 'tests', 'lib', 'scripts'))}/{self.c(_NOUNS)}"
        if k == 4:
            return f"cargo build --release 2>&1 | tail -30" if self.r.random() < 0.3 else "make lint"
        if k == 5:
            return f"python scripts/{self.ident()}.py --dry-run"
        return f"npm test -- --grep \"{self.c(_NOUNS)}\""

    def command_output(self, n_lines: int) -> str:
        k = self.r.randrange(4)
        out: list[str] = []
        if k == 0:
            n = self.r.randint(4, 60)
            out.append("============================= test session starts ==============================")
            out.append("platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0")
            out.append(f"collected {n} items")
            out.append("")
            while len(out) < n_lines - 2:
                out.append(f"tests/test_{self.c(_NOUNS)}.py {''.join(self.c('....F.s') for _ in range(self.r.randint(3, 20)))}")
            f = self.r.randint(0, 3)
            if f:
                out.append(f"FAILED tests/test_{self.c(_NOUNS)}.py::test_{self.ident()} - AssertionError: assert {self.r.randint(0, 9)} == {self.r.randint(10, 99)}")
            out.append(f"==== {f} failed, {n - f} passed in {self.r.uniform(0.2, 40):.2f}s ====")
        elif k == 1:
            while len(out) < n_lines:
                out.append(f"{self.path()}:{self.r.randint(1, 900)}:    {self.c(_NOUNS)} = {self.ident()}({self.c(_NOUNS)})")
        elif k == 2:
            out.append(f"total {self.r.randint(8, 400)}")
            while len(out) < n_lines:
                out.append(f"-rw-r--r--  1 dev dev {self.r.randint(80, 90000):6d} Nov {self.r.randint(1, 28):2d} "
                           f"{self.r.randint(0, 23):02d}:{self.r.randint(0, 59):02d} {self.c(_ADJS)}_{self.c(_NOUNS)}.py")
        else:
            while len(out) < n_lines:
                out.append(f" {self.path()} | {self.r.randint(1, 80):3d} {'+' * self.r.randint(0, 12)}{'-' * self.r.randint(0, 6)}")
        return "\n".join(out[:max(n_lines, 1)])


def _hex(r: random.Random, n: int) -> str:
    return "".join(r.choice("0123456789abcdef") for _ in range(n))


def _b62(r: random.Random, n: int) -> str:
    a = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return "".join(r.choice(a) for _ in range(n))


def _uuid(r: random.Random) -> str:
    h = _hex(r, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[r.randrange(4)]}{h[17:20]}-{h[20:32]}"


def _iso(t: float) -> str:
    dt = datetime.fromtimestamp(round(t, 3), tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _iso_s(t: float) -> str:
    return datetime.fromtimestamp(int(t), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _compact(o: Any) -> str:
    return json.dumps(o, separators=(",", ":"), ensure_ascii=False)


# ============================================================================ tools

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


def _tool_json(t: ToolDef, fmt: str, version: int, key_order: tuple[int, int, int]) -> dict:
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


def _flavor(seed: int, name: str) -> Flavor:
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
    system_main = (f"You are an interactive CLI tool that helps users with software engineering tasks. "
                   f"Use the instructions below and the tools available to you to assist the user.\n\n"
                   + "\n\n".join(sections)
                   + f"\n\nIf the user asks for help or wants to give feedback about {product}, "
                   "tell them to open an issue in the project tracker.")
    system_sub = (f"You are a sub-agent of {product}. You are given one focused task by the main agent. "
                  f"Work autonomously and report back with ReportFindings.\n\n"
                  + tx.prose(2400))
    return Flavor(name, main, mcp, sub, own, intro, system_main, system_sub)


# ============================================================================ sessions

@dataclass
class Req:
    """One request before serialization."""
    file: str
    fmt: str
    kind: str  # agent | subagent | chat
    ts: float
    tenant: str
    session: str | None
    key: str | None
    user: str | None
    model: str
    body: dict
    output: Any  # anthropic: content block list; openai: assistant message
    out_chars: int
    sig: dict[str, Any]  # cause → signature of the planted element
    seq: int = 0
    # filled after ordering
    line: int = 0
    response: dict | None = None
    truth: dict | None = None


@dataclass
class Plan:
    fmt: str  # anthropic | openai
    tenant: str
    cause: str | None
    subs: list[str | None]  # causes of the sub-agents spawned
    key_mode: str = "session"  # openai: session | tenant | none
    project: int = 0


# the session plan at scale 1; larger scales cycle through it again
_PLANS = [
    Plan("anthropic", "acme", None, [None, "tool_schema_change"], project=0),
    Plan("anthropic", "acme", "rotating_header", ["rotating_header"], project=1),
    Plan("openai", "globex", "history_rewrite", ["tool_order"], key_mode="session", project=3),
    Plan("anthropic", "initech", "timestamp", ["history_rewrite"], project=2),
    Plan("anthropic", "initech", "volatile_id", ["volatile_id"], project=2),
    Plan("openai", "globex", "tool_order", [], key_mode="tenant", project=4),
    Plan("anthropic", "acme", "tool_schema_change", ["json_key_order"], project=0),
    Plan("openai", "initech", "json_key_order", [None], key_mode="none", project=5),
    Plan("openai", "globex", None, [], key_mode="session", project=4),
]

_MODELS = {
    ("anthropic", "agent"): "claude-sonnet-4-5-20250929",
    ("anthropic", "subagent"): "claude-haiku-4-5-20251001",
    ("openai", "agent"): "gpt-5.1-codex",
    ("openai", "subagent"): "gpt-5.1-codex-mini",
    ("openai", "chat"): "gpt-4.1-mini",
}


class _Gaps:
    """Human think times: a shuffled bag so every bucket shows up."""

    def __init__(self, rng: random.Random):
        self.r = rng
        self.bag: list[int] = []

    def human(self) -> float:
        if not self.bag:
            self.bag = list(_GAP_BAG)
            self.r.shuffle(self.bag)
        lo, hi = GAP_BUCKETS[self.bag.pop()]
        return math.exp(self.r.uniform(math.log(lo), math.log(hi)))


class Synth:
    def __init__(self, seed: int, scale: float, t0: float, window: float,
                 turns: float | None = None, chat_share: float = 1.0):
        self.seed = seed
        self.turns_median = 4.5 if turns is None else float(turns)
        self.chat_share = chat_share
        self.scale = scale
        self.t0 = t0
        self.window = window
        self.r = random.Random(seed)
        self.np = np.random.default_rng(seed)
        self.tx = Text(random.Random(seed * 31 + 5))
        self.gaps = _Gaps(random.Random(seed * 31 + 7))
        self.flavors = {"claude": _flavor(seed, "claude"), "codex": _flavor(seed, "codex")}
        self.projects = [self._project(i) for i in range(8)]
        self.reqs: list[Req] = []
        self.seq = 0
        self.n_sessions = 0

    # ------------------------------------------------------------------ helpers
    def _project(self, i: int) -> dict:
        tx = Text(random.Random(self.seed * 101 + i))
        name = f"{tx.c(_ADJS)}-{tx.c(_NOUNS)}"
        return {"name": name, "dir": f"/home/dev/work/{name}",
                "memo": f"# {name}\n\n{tx.prose(900)}\n\n## Commands\n- `make test`\n- `make lint`\n"}

    def _latency(self, out_chars: int) -> float:
        return 1.2 + out_chars / 220.0 * self.r.uniform(0.6, 1.4) + float(self.np.gamma(2.0, 0.8))

    def _tool_time(self) -> float:
        return float(min(90.0, self.np.lognormal(0.3, 1.3)))

    def _add(self, req: Req) -> None:
        req.seq = self.seq
        self.seq += 1
        self.reqs.append(req)

    # ------------------------------------------------------------------ tool calls
    def _call_input(self, tool: ToolDef) -> dict:
        tx, r = self.tx, self.r
        out: dict[str, Any] = {}
        for pname in tool.schema["properties"]:
            if pname not in tool.schema["required"] and r.random() < 0.6:
                continue
            if pname in ("file_path", "path", "notebook_path", "dir_path"):
                out[pname] = tx.path()
            elif pname == "command":
                out[pname] = ["bash", "-lc", tx.command()] if tool.schema["properties"][pname]["type"] == "array" else tx.command()
            elif pname in ("pattern", "glob", "include"):
                out[pname] = tx.ident() if pname == "pattern" else "**/*.py"
            elif pname in ("old_string", "new_string", "content", "input", "new_source"):
                out[pname] = tx.code(r.randint(2, 6))
            elif pname == "sql":
                out[pname] = f"SELECT {tx.c(_NOUNS)}_id, count(*) FROM {tx.c(_NOUNS)}s GROUP BY 1 ORDER BY 2 DESC LIMIT 20"
            elif pname in ("todos", "plan"):
                out[pname] = [{"content": tx.sentence(), "status": r.choice(["pending", "in_progress", "completed"]),
                               "id": str(i + 1)} for i in range(r.randint(2, 5))]
            elif pname == "edits":
                out[pname] = [{"old_string": tx.code(2), "new_string": tx.code(3)}]
            elif pname in ("number", "max_rows", "top_k", "offset", "limit", "timeout", "timeout_ms", "per_page", "depth"):
                out[pname] = r.randint(1, 400)
            elif tool.schema["properties"][pname]["type"] == "boolean":
                out[pname] = r.random() < 0.5
            elif tool.schema["properties"][pname]["type"] == "array":
                out[pname] = [tx.path()]
            else:
                out[pname] = tx.sentence()
        return out

    def _call_result(self, tool: ToolDef) -> str:
        tx, r = self.tx, self.r
        n = max(2, int(self.np.lognormal(1.9, 0.6)))  # ~6-7 lines median
        if tool.kind == "read":
            return tx.numbered(tx.code(min(n + 2, 60)), r.randint(1, 400))
        if tool.kind == "bash":
            return tx.command_output(min(n, 40))
        if tool.kind in ("grep", "glob", "ls"):
            return tx.command_output(min(n, 30)) if tool.kind == "grep" else \
                "\n".join(tx.path() for _ in range(min(n, 25)))
        if tool.kind in ("edit", "write"):
            return f"The file {tx.path()} has been updated. Here's the result of running `cat -n` on a snippet:\n" + \
                tx.numbered(tx.code(min(n, 12)), r.randint(1, 300))
        if tool.kind == "todo":
            return "Todos have been modified successfully. Ensure that you continue to use the todo list to track your progress."
        if tool.kind == "mcp":
            rows = [f"| {tx.c(_NOUNS)} | {r.randint(0, 99999)} | {tx.c(_ADJS)} |" for _ in range(min(n, 20))]
            return "| name | count | state |\n|---|---|---|\n" + "\n".join(rows)
        if tool.kind == "web":
            return tx.paragraph(3, 8)
        return tx.paragraph(1, 3)

    # ------------------------------------------------------------------ agent sessions
    def agent_session(self, plan: Plan, kind: str, t_start: float, n_turns: int,
                      cause: str | None, parent_tenant: str | None = None,
                      sub_causes: list[str | None] | None = None) -> float:
        """Simulate one agent session; returns the time its last response ended."""
        r, tx = self.r, self.tx
        fmt = plan.fmt
        fl = self.flavors["claude" if fmt == "anthropic" else "codex"]
        file = f"agent-{fmt}"
        tenant = parent_tenant or plan.tenant
        session = _uuid(r)
        self.n_sessions += 1
        proj = self.projects[plan.project % len(self.projects)]
        user_hash = _hex(random.Random(self.seed * 97 + plan.project * 13 + len(tenant)), 64)
        if kind == "agent":
            tools = list(fl.main_tools)
            mcp = list(fl.mcp_tools)
            sys_main = fl.system_main
        else:
            tools = list(fl.sub_tools)
            mcp = list(fl.sub_own)
            sys_main = fl.system_sub
        if fmt == "openai":
            key = {"session": session, "tenant": f"{tenant}-forge", "none": None}[plan.key_mode]
        else:
            key = None
        model = _MODELS[(fmt, kind)]
        sub_queue = list(sub_causes or [])
        # per-session planted state
        mcp_version = 0
        key_order = (0, 1, 2)
        mcp_order = list(range(len(mcp)))
        rewrites = 0
        events: set[int] = set()
        if cause in ("tool_schema_change", "history_rewrite"):
            n_ev = max(2, min(4, n_turns // 3))
            cands = list(range(3 if cause == "history_rewrite" else 2, n_turns))
            r.shuffle(cands)
            events = set(cands[:n_ev])
        if cause == "json_key_order":
            key_order = r.choice([p for p in permutations(range(3)) if p != (0, 1, 2)])
        if cause == "tool_order":
            r.shuffle(mcp_order)
        env_lines = [f"Working directory: {proj['dir']}", "Is directory a git repo: Yes",
                     "Platform: linux", "OS Version: Linux 6.8.0-45-generic"]
        # conversation state (neutral form)
        conv: list[dict] = []
        # human tasks (a human think time between two); sub-agents run one task
        n_tasks = 1 if kind == "subagent" else 1 + (n_turns >= 5) + (n_turns >= 9) + (n_turns >= 16) + (n_turns >= 30)
        cuts = sorted(r.sample(range(2, n_turns - 1), n_tasks - 1)) if n_tasks > 1 and n_turns > 4 else []
        task_ends = set(c - 1 for c in cuts) | {n_turns - 1}
        t = t_start
        today = _iso_s(t_start)[:10]  # fixed at session start, like the real CLIs
        non_final = [i for i in range(n_turns) if i not in task_ends]
        spawn_at: set[int] = set()
        if sub_queue and non_final:
            step = max(1, len(non_final) // (len(sub_queue) + 1))
            spawn_at = set(non_final[step * (k + 1) - 1] for k in range(len(sub_queue)) if step * (k + 1) - 1 < len(non_final))
        conv.append({"role": "user", "text": self._task_prompt(kind)})
        prev_len = 0
        cc_version = f"1.0.{r.randint(80, 99)}"  # CLI version: fixed per session; cch changes per request
        for turn in range(n_turns):
            sig: dict[str, Any] = {}
            # -------- planted changes for this request
            if turn > 0 and cause == "json_key_order":
                key_order = r.choice([p for p in permutations(range(3)) if p != key_order])
            if turn > 0 and cause == "tool_order" and len(mcp) > 1:
                prev = list(mcp_order)
                while mcp_order == prev:
                    r.shuffle(mcp_order)
            if turn in events and cause == "tool_schema_change":
                mcp_version += 1
            if turn in events and cause == "history_rewrite":
                for m in conv[:prev_len]:  # only what the previous request already sent
                    if m["role"] == "tool" and not m.get("rewritten") and any(len(x["content"]) > 60 for x in m["results"]):
                        for x in m["results"]:
                            if len(x["content"]) > 60:
                                x["content"] = "[output truncated]"
                        m["rewritten"] = True
                        rewrites += 1
                        break
            # -------- tools
            ordered = tools + [mcp[i] for i in mcp_order]
            tool_json = [_tool_json(td, fmt, mcp_version, key_order) for td in ordered]
            if cause == "tool_order":
                sig["tool_order"] = tuple(mcp_order)
            if cause == "json_key_order":
                sig["json_key_order"] = key_order
            if cause == "tool_schema_change":
                sig["tool_schema_change"] = mcp_version
            if cause == "history_rewrite":
                sig["history_rewrite"] = rewrites
            # -------- system
            blocks: list[tuple[str, bool]] = []
            if cause == "rotating_header":
                hdr = f"x-anthropic-billing-header: cc_version={cc_version}; cch={_hex(r, 5)};"
                sig["rotating_header"] = hdr
                blocks.append((hdr, False))
            first = fl.intro
            if cause == "timestamp":
                line = f"Current time: {_iso_s(t)}"
                sig["timestamp"] = line
                first = line + "\n" + first
            blocks.append((first, True))
            env = list(env_lines) + [f"Today's date: {today}"]
            if cause == "volatile_id":
                rid = _uuid(r)
                sig["volatile_id"] = rid
                env.insert(1, f"Request-Id: {rid}")
            tail = sys_main + "\n\n<env>\n" + "\n".join(env) + "\n</env>"
            if kind == "agent":
                tail += f"\n\nContents of {proj['dir']}/AGENTS.md (project instructions, checked into the codebase):\n\n" + proj["memo"]
            blocks.append((tail, True))
            # -------- output of this call
            final = turn in task_ends
            text = tx.paragraph(1, 3) if not final else tx.paragraph(2, 5)
            calls = []
            if not final:
                pool = [td for td in ordered if td.kind != "task"]
                weights = [{"read": 5, "bash": 5, "grep": 3, "edit": 3, "glob": 1, "ls": 1, "write": 1,
                            "todo": 1, "mcp": 1, "web": 0.5, "other": 0.3}[td.kind] for td in pool]
                picks = [r.choices(pool, weights)[0] for _ in range(1 if r.random() < 0.8 else 2)]
                if turn in spawn_at and sub_queue:
                    picks = [td for td in ordered if td.kind == "task"][:1] or picks
                for td in picks:
                    tid = ("toolu_01" + _b62(r, 22)) if fmt == "anthropic" else ("call_" + _b62(r, 24))
                    calls.append({"id": tid, "tool": td, "input": self._call_input(td)})
            amsg = {"role": "assistant", "text": text, "calls": calls}
            out_chars = len(text) + sum(len(_compact(c["input"])) for c in calls)
            body, output = self._render_agent(fmt, tool_json, blocks, conv, amsg, model, tenant, session,
                                              user_hash, key)
            self._add(Req(file, fmt, kind, t, tenant, session, key, user_hash if fmt == "anthropic" else tenant,
                          model, body, output, out_chars, sig))
            prev_len = len(conv)
            t_resp = t + self._latency(out_chars)
            conv.append(amsg)
            if final and turn == n_turns - 1:
                return t_resp
            if final:
                conv.append({"role": "user", "text": self._task_prompt(kind)})
                t = t_resp + self.gaps.human()
                continue
            results, t_done = [], t_resp
            for c in calls:
                if c["tool"].kind == "task":
                    sc = sub_queue.pop(0)
                    n_sub = max(3, min(60, int(round(self.np.lognormal(math.log(5), 0.35)))))
                    if sc in ("tool_schema_change", "history_rewrite"):
                        n_sub = max(n_sub, 9)
                    elif sc is not None:
                        n_sub = max(n_sub, 6)
                    sub_plan = Plan(fmt, tenant, sc, [], key_mode=plan.key_mode, project=plan.project)
                    t_done = self.agent_session(sub_plan, "subagent", t_done + 0.3, n_sub, sc,
                                                parent_tenant=tenant) + 0.2
                    content = "Sub-agent report:\n" + tx.paragraph(3, 6) + "\n\n" + tx.bullets(2, 5)
                else:
                    t_done += self._tool_time()
                    content = self._call_result(c["tool"])
                results.append({"id": c["id"], "content": content, "is_error": r.random() < 0.05})
            conv.append({"role": "tool", "results": results})
            t = t_done + r.uniform(0.05, 0.6)
        return t

    def _task_prompt(self, kind: str) -> str:
        tx = self.tx
        if kind == "subagent":
            return f"Investigate {tx.np_()} in {tx.path()}. {tx.sentence()} {tx.sentence()} Report back with file paths and a short summary."
        return tx.c(("Please ", "Can you ", "", "Now ")) + tx.c(_VERB_IMP) + " " + tx.np_() + " in " + tx.path() + ". " + tx.paragraph(1, 3)

    def _render_agent(self, fmt, tool_json, blocks, conv, amsg, model, tenant, session, user_hash, key):
        if fmt == "anthropic":
            system = []
            for text, cc in blocks:
                b: dict[str, Any] = {"type": "text", "text": text}
                if cc:
                    b["cache_control"] = {"type": "ephemeral"}
                system.append(b)
            msgs = [self._anth_msg(m) for m in conv]
            # moving breakpoint on the last message (metadata only: not rendered)
            last = msgs[-1]
            if isinstance(last["content"], list) and last["content"]:
                last["content"][-1] = dict(last["content"][-1], cache_control={"type": "ephemeral"})
            body = {"model": model, "max_tokens": 32000, "system": system, "tools": tool_json,
                    "messages": msgs,
                    "metadata": {"user_id": f"user_{user_hash}_account__session_{session}"}}
            output = self._anth_msg(amsg)["content"]
            return body, output
        system_text = "\n\n".join(text for text, _cc in blocks)
        msgs = [{"role": "system", "content": system_text}]
        for m in conv:
            msgs.extend(self._oai_msgs(m))
        body: dict[str, Any] = {"model": model, "messages": msgs, "tools": tool_json}
        if key is not None:
            body["prompt_cache_key"] = key
        body["user"] = tenant
        output = self._oai_msgs(amsg)[0]
        return body, output

    @staticmethod
    def _anth_msg(m: dict) -> dict:
        if m["role"] == "user":
            return {"role": "user", "content": [{"type": "text", "text": m["text"]}]}
        if m["role"] == "assistant":
            content: list[dict] = [{"type": "text", "text": m["text"]}]
            for c in m["calls"]:
                content.append({"type": "tool_use", "id": c["id"], "name": c["tool"].name, "input": c["input"]})
            return {"role": "assistant", "content": content}
        content = []
        for x in m["results"]:
            b = {"type": "tool_result", "tool_use_id": x["id"], "content": x["content"]}
            if x["is_error"]:
                b["is_error"] = True
            content.append(b)
        return {"role": "user", "content": content}

    @staticmethod
    def _oai_msgs(m: dict) -> list[dict]:
        if m["role"] == "user":
            return [{"role": "user", "content": m["text"]}]
        if m["role"] == "assistant":
            d: dict[str, Any] = {"role": "assistant", "content": m["text"]}
            if m["calls"]:
                d["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["tool"].name, "arguments": _compact(c["input"])}}
                                   for c in m["calls"]]
            return [d]
        return [{"role": "tool", "tool_call_id": x["id"], "content": x["content"]} for x in m["results"]]

    # ------------------------------------------------------------------ chat app
    def chat(self, n_users: int) -> None:
        r, tx = self.r, self.tx
        tenant = "hooli"
        itx = Text(random.Random(self.seed * 53 + 11))
        instructions = ("You are Hooli Assistant, a friendly general-purpose assistant inside the Hooli app.\n\n"
                        + "## Guidelines\n" + itx.prose(1000) + "\n\n## Formatting\n" + itx.bullets(6, 9)
                        + "\n\n## Safety\n" + itx.prose(700))
        model = _MODELS[("openai", "chat")]
        for u in range(n_users):
            name = _NAMES[u % len(_NAMES)]
            uid = f"u-{1000 + 37 * u + self.seed % 37}"
            key = None if u % 4 == 3 else "hooli-chat-v3"  # legacy clients send no key
            n_conv = 1 + u % 3 + r.randint(0, 1)
            starts = sorted(self._start_time(0.0) for _ in range(n_conv))
            for t in starts:
                n_msgs = r.randint(2, 4) + (r.random() < 0.3)
                topic = tx.c(_CHAT_TOPICS)
                conv: list[dict] = []
                for k in range(n_msgs):
                    question = (f"I need help with {topic}. " if k == 0 else "") + tx.paragraph(1, 2)
                    conv.append({"role": "user", "content": question})
                    user_line = f"You are talking to {name} (user {uid})."
                    time_line = f"The current date and time is {_iso_s(t).replace('T', ' ').replace('Z', ' UTC')}."
                    system = user_line + "\n" + time_line + "\n\n" + instructions
                    body = {"model": model, "messages": [{"role": "system", "content": system}] + list(conv)}
                    if key is not None:
                        body["prompt_cache_key"] = key
                    body["user"] = uid
                    answer = tx.paragraph(2, 5)
                    output = {"role": "assistant", "content": answer}
                    sig = {"per_user_data": user_line, "timestamp": time_line}
                    self._add(Req("chat-openai", "openai", "chat", t, tenant, None, key, uid, model,
                                  body, output, len(answer), sig))
                    conv.append(output)
                    t += self._latency(len(answer)) + math.exp(r.uniform(math.log(8), math.log(240)))

    def _start_time(self, duration: float) -> float:
        """A start time in the window, weighted to working hours on weekdays."""
        r = self.r
        span = max(60.0, self.window - duration)
        for _ in range(50):
            x = r.uniform(0, span)
            dt = datetime.fromtimestamp(self.t0 + x, tz=timezone.utc)
            w = (1.0 if 7 <= dt.hour < 19 else 0.25) * (1.0 if dt.weekday() < 5 else 0.4)
            if r.random() < w:
                return self.t0 + x
        return self.t0 + r.uniform(0, span)

    # ------------------------------------------------------------------ driver
    def run(self) -> None:
        n_main = max(1, int(round(len(_PLANS) * self.scale)))
        for i in range(n_main):
            plan = _PLANS[i % len(_PLANS)]
            if i >= len(_PLANS):  # later rounds: other tenants' projects, same causes
                plan = Plan(plan.fmt, plan.tenant, plan.cause, list(plan.subs), plan.key_mode,
                            plan.project + (i // len(_PLANS)))
            n = max(5, min(60, int(round(self.np.lognormal(math.log(self.turns_median), 0.3)))))
            if plan.cause in ("tool_schema_change", "history_rewrite"):
                n = max(n, 9)
            n = max(n, 2 + 2 * len(plan.subs))
            # simulate at relative time, then shift into the window
            start = self._start_time(3 * 3600.0)
            self.agent_session(plan, "agent", start, n, plan.cause, sub_causes=plan.subs)
        if self.chat_share > 0:
            self.chat(max(2, int(round(20 * self.scale * self.chat_share))))


# ============================================================================ truth & usage

def _pieces(req: Req) -> list[tuple[int, str]]:
    """(part, text) pieces in rendering order: 0 tools, 1 system, 2 messages."""
    b = req.body
    out: list[tuple[int, str]] = [(0, _compact(t)) for t in b.get("tools") or ()]
    if req.fmt == "anthropic":
        for blk in b.get("system") or ():
            out.append((1, blk["text"]))
        msgs = b["messages"]
    else:
        msgs = b["messages"]
        if msgs and msgs[0]["role"] == "system":
            out.append((1, msgs[0]["content"]))
            msgs = msgs[1:]
    for m in msgs:
        out.append((2, "\x00" + m["role"]))
        c = m.get("content")
        if isinstance(c, str):
            out.append((2, c))
        elif isinstance(c, list):
            for blk in c:
                blk = {k: v for k, v in blk.items() if k != "cache_control"}
                out.append((2, blk["text"] if blk.get("type") == "text" else _compact(blk)))
        for tc in m.get("tool_calls") or ():
            out.append((2, _compact(tc["function"])))
    return out


def _shared(prev: list[tuple[int, str]], cur: list[tuple[int, str]]) -> tuple[int, str]:
    """(shared characters, where the shared prefix ends)."""
    n = 0
    for i, (a, b) in enumerate(zip(prev, cur)):
        if a == b:
            n += len(a[1])
            continue
        sa, sb = a[1], b[1]
        k = 0
        m = min(len(sa), len(sb))
        while k < m and sa[k] == sb[k]:
            k += 1
        return n + k, ("tools", "system", "messages")[min(a[0], b[0])]
    if len(prev) <= len(cur):
        return n, "end"
    return n, ("tools", "system", "messages")[prev[len(cur)][0]]


def _usage(req: Req, prompt_chars: int, shared: int, gap: float | None, rng: random.Random) -> dict:
    total = max(1, prompt_chars // 4)
    out_tok = max(1, req.out_chars // 4)
    read = shared // 4 if gap is not None else 0
    if req.fmt == "anthropic":
        if gap is None or gap > 300 or read < 1024:
            read = 0
        tail = min(total - read, max(1, len(_compact(req.body["messages"][-1])) // 4))
        create = max(0, total - read - tail) if total >= 1024 else 0
        inp = total - read - create
        return {"input_tokens": inp, "cache_creation_input_tokens": create,
                "cache_read_input_tokens": read, "output_tokens": out_tok}
    if gap is None or gap > 600 or total < 1024:
        read = 0
    read = min(read, total - 1) // 128 * 128
    return {"prompt_tokens": total, "completion_tokens": out_tok, "total_tokens": total + out_tok,
            "prompt_tokens_details": {"cached_tokens": read}}


def _finish(reqs: list[Req], seed: int) -> None:
    """Order lines per file, assign line numbers, compute truth and usage."""
    rng = random.Random(seed * 13 + 3)
    by_file: dict[str, list[Req]] = {}
    for q in sorted(reqs, key=lambda q: (round(q.ts, 3), q.seq)):
        by_file.setdefault(q.file, []).append(q)
    for f in sorted(by_file):
        last: dict[str, tuple[Req, list]] = {}
        for i, q in enumerate(by_file[f], 1):
            q.line = i
            stream = q.session if q.session is not None else f"tenant:{q.tenant}"
            pcs = _pieces(q)
            chars = sum(len(p[1]) for p in pcs)
            prev = last.get(stream)
            if prev is None:
                causes, shared, cut, gap, prev_line = [], 0, None, None, None
            else:
                pq, ppcs = prev
                causes = [c for c in q.sig if c in pq.sig and q.sig[c] != pq.sig[c]]
                causes.sort(key=_CAUSE_RANK.__getitem__)
                shared, cut = _shared(ppcs, pcs)
                gap = round(q.ts, 3) - round(pq.ts, 3)
                prev_line = pq.line
            q.truth = {"file": f + ".jsonl", "line": i, "session": q.session, "tenant": q.tenant,
                       "causes": causes, "first_in_session": prev is None, "stream": stream,
                       "prev_line": prev_line, "kind": q.kind, "prompt_chars": chars,
                       "shared_chars": shared, "cut": cut}
            usage = _usage(q, chars, shared, gap, rng)
            if q.fmt == "anthropic":
                q.response = {"id": "msg_01" + _b62(rng, 22), "type": "message", "role": "assistant",
                              "model": q.model, "content": q.output,
                              "stop_reason": "tool_use" if any(b.get("type") == "tool_use" for b in q.output) else "end_turn",
                              "usage": usage}
            else:
                q.response = {"id": "chatcmpl-" + _b62(rng, 29), "object": "chat.completion", "model": q.model,
                              "choices": [{"index": 0, "message": q.output,
                                           "finish_reason": "tool_calls" if q.output.get("tool_calls") else "stop"}],
                              "usage": usage}
            last[stream] = (q, pcs)
        by_file[f] = by_file[f]
    reqs[:] = [q for f in sorted(by_file) for q in by_file[f]]


def _line(q: Req) -> str:
    if q.fmt == "anthropic":
        rec = {"timestamp": _iso(q.ts), "tenant": q.tenant, "session": q.session,
               "request": q.body, "response": q.response}
    else:
        rec = {"timestamp": round(q.ts, 3), "tenant": q.tenant, "session": q.session,
               "request": q.body, "response": q.response}
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"))


# ============================================================================ API

def _parse_start(start: str | float | datetime) -> float:
    if isinstance(start, (int, float)):
        return float(start)
    if isinstance(start, datetime):
        return start.timestamp()
    s = start.replace("Z", "+00:00")
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def generate(out_dir: str | Path, seed: int = 0, scale: float = 1.0,
             formats: tuple[str, ...] | list[str] = ("anthropic", "openai"),
             start: str | float | datetime = "2026-11-16T00:00:00Z", days: float = 7,
             hours: float | None = None, compress: str | None = None,
             turns: float | None = None, chat_share: float = 1.0) -> SynthResult:
    """Write synthetic logs + ``_truth.jsonl`` into ``out_dir``; deterministic by ``seed``.

    ``scale`` multiplies the number of sessions and chat users (1.0 ≈ 400+
    requests, < 5 MB); the stable prefixes keep their size. ``formats`` picks
    the log files: ``anthropic`` → ``agent-anthropic.jsonl``; ``openai`` →
    ``agent-openai.jsonl`` and ``chat-openai.jsonl``. ``hours`` (if given)
    overrides ``days`` as the window length. ``compress``: None, ``"gzip"``
    (``.jsonl.gz``, mtime 0) or ``"zstd"`` (``.jsonl.zst``); ``_truth.jsonl``
    is never compressed.

    Traffic-shape options (defaults reproduce the shipped sample byte for byte):
    ``turns`` — median model calls of a main agent session (default 4.5; capped
    to 5–60; the benchmarks use ~30 for long coding-agent sessions whose prompts
    grow turn after turn); ``chat_share`` — multiplies the number of chat-app
    users (0 drops the chat app).
    """
    if scale <= 0:
        raise ValueError("scale must be > 0")
    fmts = tuple(formats)
    for f in fmts:
        if f not in ("anthropic", "openai"):
            raise ValueError(f"unknown format {f!r} (anthropic, openai)")
    if compress not in (None, "gzip", "gz", "zstd", "zst"):
        raise ValueError(f"unknown compression {compress!r}")
    window = (hours if hours is not None else days * 24.0) * 3600.0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = Synth(int(seed), float(scale), _parse_start(start), window, turns=turns,
              chat_share=float(chat_share))
    s.run()
    reqs = [q for q in s.reqs if FILES[q.file] in fmts]
    _finish(reqs, int(seed))

    files: dict[str, Path] = {}
    counts: dict[str, int] = {}
    total_bytes = 0
    by_file: dict[str, list[Req]] = {}
    for q in reqs:
        by_file.setdefault(q.file, []).append(q)
    ext = {None: "", "gzip": ".gz", "gz": ".gz", "zstd": ".zst", "zst": ".zst"}[compress]
    truth_name = {}
    for name in sorted(by_file):
        data = ("\n".join(_line(q) for q in by_file[name]) + "\n").encode("utf-8")
        path = out / f"{name}.jsonl{ext}"
        if ext == ".gz":
            buf = io.BytesIO()
            with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
                gz.write(data)
            data = buf.getvalue()
        elif ext == ".zst":
            import zstandard

            data = zstandard.ZstdCompressor(level=10).compress(data)
        path.write_bytes(data)
        files[name] = path
        counts[name] = len(by_file[name])
        total_bytes += len(data)
        truth_name[name] = path.name
    truth_path = out / "_truth.jsonl"
    lines = []
    for q in reqs:
        t = dict(q.truth)
        t["file"] = truth_name[q.file]
        lines.append(json.dumps(t, ensure_ascii=False, separators=(",", ":")))
    tdata = ("\n".join(lines) + "\n").encode("utf-8") if lines else b""
    truth_path.write_bytes(tdata)
    total_bytes += len(tdata)
    cause_counts = {c: 0 for c in CAUSES}
    for q in reqs:
        for c in q.truth["causes"]:
            cause_counts[c] += 1
    sessions = len({q.session for q in reqs if q.session is not None})
    return SynthResult(out, files, truth_path, counts, cause_counts, len(reqs), total_bytes, sessions)


def synth_main(out: str | Path, seed: int = 0, scale: float = 1.0, formats=("anthropic", "openai"),
               start: str = "2026-11-16T00:00:00Z", days: float = 7, hours: float | None = None,
               compress: str | None = None, echo=print) -> SynthResult:
    """CLI hook: generate and print a short summary."""
    res = generate(out, seed=seed, scale=scale, formats=formats, start=start, days=days,
                   hours=hours, compress=compress)
    if echo is not None:
        for name, path in res.files.items():
            echo(f"{path}  {res.counts[name]} requests  {path.stat().st_size / 1e6:.2f} MB")
        echo(f"{res.truth}  ground truth")
        echo("planted: " + ", ".join(f"{c}={n}" for c, n in res.cause_counts.items()))
    return res


if __name__ == "__main__":  # pragma: no cover
    import sys

    synth_main(sys.argv[1] if len(sys.argv) > 1 else "data/sample")
