"""One simulated coding-agent session (main agent or sub-agent), turn by turn.

Each turn applies the session's planted change (if any), builds the tools and
system prompt, draws the model's answer and tool calls, records the request and
runs the calls (a ``Task`` call runs a whole sub-agent session first). All draws
come from the :class:`~replay.synth.driver.Synth` random streams, in a fixed
order, so a seed always gives the same sessions.
"""

from __future__ import annotations

import math
import random
from itertools import permutations
from typing import Any

from replay.synth.plans import MODELS, Plan, Req
from replay.synth.text import ADJS, NOUNS, VERB_IMP, base62, compact, hex_id, iso_seconds, uuid4_like
from replay.synth.tools import ToolDef, tool_def_json
from replay.synth.wire import render_agent


class AgentSession:
    """The state of one agent session while it is simulated.

    ``synth`` is the :class:`~replay.synth.driver.Synth` that owns the random
    streams, the flavors and projects, and collects the requests; sub-agents are
    started through its ``agent_session``.
    """

    def __init__(self, synth, plan: Plan, kind: str, t_start: float, n_turns: int,
                 cause: str | None, parent_tenant: str | None = None,
                 sub_causes: list[str | None] | None = None):
        self.s = synth
        self.r, self.tx, self.np = synth.r, synth.tx, synth.np
        self.plan, self.kind, self.t_start, self.n_turns, self.cause = plan, kind, t_start, n_turns, cause
        r = self.r
        fmt = self.fmt = plan.fmt
        fl = self.fl = synth.flavors["claude" if fmt == "anthropic" else "codex"]
        self.file = f"agent-{fmt}"
        tenant = self.tenant = parent_tenant or plan.tenant
        session = self.session = uuid4_like(r)
        synth.n_sessions += 1
        self.proj = synth.projects[plan.project % len(synth.projects)]
        self.user_hash = hex_id(random.Random(synth.seed * 97 + plan.project * 13 + len(tenant)), 64)
        if kind == "agent":
            self.tools = list(fl.main_tools)
            self.mcp = list(fl.mcp_tools)
            self.sys_main = fl.system_main
        else:
            self.tools = list(fl.sub_tools)
            self.mcp = list(fl.sub_own)
            self.sys_main = fl.system_sub
        if fmt == "openai":
            self.key = {"session": session, "tenant": f"{tenant}-forge", "none": None}[plan.key_mode]
        else:
            self.key = None
        self.model = MODELS[(fmt, kind)]
        self.sub_queue = list(sub_causes or [])
        self._plant()
        self.env_lines = [f"Working directory: {self.proj['dir']}", "Is directory a git repo: Yes",
                          "Platform: linux", "OS Version: Linux 6.8.0-45-generic"]
        # conversation state (neutral form)
        self.conv: list[dict] = []
        self._schedule()
        self.today = iso_seconds(t_start)[:10]  # fixed at session start, like the real CLIs
        self.conv.append({"role": "user", "text": self._task_prompt()})
        self.prev_len = 0
        self.cc_version = f"1.0.{r.randint(80, 99)}"  # CLI version: fixed per session; cch changes per request

    def _plant(self) -> None:
        """Per-session planted state: the turns with an event, the first key and tool order."""
        r, cause = self.r, self.cause
        self.mcp_version = 0
        self.key_order = (0, 1, 2)
        self.mcp_order = list(range(len(self.mcp)))
        self.rewrites = 0
        self.events: set[int] = set()
        if cause in ("tool_schema_change", "history_rewrite"):
            n_ev = max(2, min(4, self.n_turns // 3))
            cands = list(range(3 if cause == "history_rewrite" else 2, self.n_turns))
            r.shuffle(cands)
            self.events = set(cands[:n_ev])
        if cause == "json_key_order":
            self.key_order = r.choice([p for p in permutations(range(3)) if p != (0, 1, 2)])
        if cause == "tool_order":
            r.shuffle(self.mcp_order)

    def _schedule(self) -> None:
        """Where the human tasks end and at which turns sub-agents are spawned."""
        r, n_turns = self.r, self.n_turns
        # human tasks (a human think time between two); sub-agents run one task
        n_tasks = 1 if self.kind == "subagent" else 1 + (n_turns >= 5) + (n_turns >= 9) + (n_turns >= 16) + (n_turns >= 30)
        cuts = sorted(r.sample(range(2, n_turns - 1), n_tasks - 1)) if n_tasks > 1 and n_turns > 4 else []
        self.task_ends = set(c - 1 for c in cuts) | {n_turns - 1}
        non_final = [i for i in range(n_turns) if i not in self.task_ends]
        self.spawn_at: set[int] = set()
        sub_queue = self.sub_queue
        if sub_queue and non_final:
            step = max(1, len(non_final) // (len(sub_queue) + 1))
            self.spawn_at = set(non_final[step * (k + 1) - 1] for k in range(len(sub_queue)) if step * (k + 1) - 1 < len(non_final))

    # ------------------------------------------------------------------ turns
    def run(self) -> float:
        """Simulate every turn; returns the time the session's last response ended."""
        t = self.t_start
        for turn in range(self.n_turns):
            sig: dict[str, Any] = {}
            self._planted_changes(turn)
            ordered, tool_json = self._tools(sig)
            blocks = self._system(t, sig)
            final = turn in self.task_ends
            amsg, out_chars = self._answer(turn, ordered, final)
            body, output = render_agent(self.fmt, tool_json, blocks, self.conv, amsg, self.model, self.tenant,
                                        self.session, self.user_hash, self.key)
            user = self.user_hash if self.fmt == "anthropic" else self.tenant
            self.s._add(Req(self.file, self.fmt, self.kind, t, self.tenant, self.session, self.key, user,
                            self.model, body, output, out_chars, sig))
            self.prev_len = len(self.conv)
            t_resp = t + self.s._latency(out_chars)
            self.conv.append(amsg)
            if final and turn == self.n_turns - 1:
                return t_resp
            if final:
                self.conv.append({"role": "user", "text": self._task_prompt()})
                t = t_resp + self.s.gaps.human()
                continue
            t_done = self._run_calls(amsg["calls"], t_resp)
            t = t_done + self.r.uniform(0.05, 0.6)
        return t

    def _planted_changes(self, turn: int) -> None:
        """Apply this request's planted change (before its prompt is built)."""
        r, cause = self.r, self.cause
        if turn > 0 and cause == "json_key_order":
            self.key_order = r.choice([p for p in permutations(range(3)) if p != self.key_order])
        if turn > 0 and cause == "tool_order" and len(self.mcp) > 1:
            prev = list(self.mcp_order)
            while self.mcp_order == prev:
                r.shuffle(self.mcp_order)
        if turn in self.events and cause == "tool_schema_change":
            self.mcp_version += 1
        if turn in self.events and cause == "history_rewrite":
            self._rewrite_history()

    def _rewrite_history(self) -> None:
        """Truncate the long outputs of one old tool result not rewritten yet."""
        for m in self.conv[:self.prev_len]:  # only what the previous request already sent
            if m["role"] == "tool" and not m.get("rewritten") and any(len(x["content"]) > 60 for x in m["results"]):
                for x in m["results"]:
                    if len(x["content"]) > 60:
                        x["content"] = "[output truncated]"
                m["rewritten"] = True
                self.rewrites += 1
                break

    def _tools(self, sig: dict[str, Any]) -> tuple[list[ToolDef], list[dict]]:
        """(tools in listed order, their JSON); records the tool-side signatures in ``sig``."""
        cause = self.cause
        ordered = self.tools + [self.mcp[i] for i in self.mcp_order]
        tool_json = [tool_def_json(td, self.fmt, self.mcp_version, self.key_order) for td in ordered]
        if cause == "tool_order":
            sig["tool_order"] = tuple(self.mcp_order)
        if cause == "json_key_order":
            sig["json_key_order"] = self.key_order
        if cause == "tool_schema_change":
            sig["tool_schema_change"] = self.mcp_version
        if cause == "history_rewrite":
            sig["history_rewrite"] = self.rewrites
        return ordered, tool_json

    def _system(self, t: float, sig: dict[str, Any]) -> list[tuple[str, bool]]:
        """System prompt blocks (text, cache breakpoint); records the system-side signatures."""
        r, cause = self.r, self.cause
        blocks: list[tuple[str, bool]] = []
        if cause == "rotating_header":
            hdr = f"x-anthropic-billing-header: cc_version={self.cc_version}; cch={hex_id(r, 5)};"
            sig["rotating_header"] = hdr
            blocks.append((hdr, False))
        first = self.fl.intro
        if cause == "timestamp":
            line = f"Current time: {iso_seconds(t)}"
            sig["timestamp"] = line
            first = line + "\n" + first
        blocks.append((first, True))
        env = list(self.env_lines) + [f"Today's date: {self.today}"]
        if cause == "volatile_id":
            rid = uuid4_like(r)
            sig["volatile_id"] = rid
            env.insert(1, f"Request-Id: {rid}")
        tail = self.sys_main + "\n\n<env>\n" + "\n".join(env) + "\n</env>"
        if self.kind == "agent":
            tail += (f"\n\nContents of {self.proj['dir']}/AGENTS.md (project instructions, checked into the codebase):\n\n"
                     + self.proj["memo"])
        blocks.append((tail, True))
        return blocks

    def _answer(self, turn: int, ordered: list[ToolDef], final: bool) -> tuple[dict, int]:
        """The model's answer to this call (text and tool calls) and its output characters."""
        r, tx = self.r, self.tx
        text = tx.paragraph(1, 3) if not final else tx.paragraph(2, 5)
        calls = []
        if not final:
            pool = [td for td in ordered if td.kind != "task"]
            weights = [{"read": 5, "bash": 5, "grep": 3, "edit": 3, "glob": 1, "ls": 1, "write": 1,
                        "todo": 1, "mcp": 1, "web": 0.5, "other": 0.3}[td.kind] for td in pool]
            picks = [r.choices(pool, weights)[0] for _ in range(1 if r.random() < 0.8 else 2)]
            if turn in self.spawn_at and self.sub_queue:
                picks = [td for td in ordered if td.kind == "task"][:1] or picks
            for td in picks:
                tid = ("toolu_01" + base62(r, 22)) if self.fmt == "anthropic" else ("call_" + base62(r, 24))
                calls.append({"id": tid, "tool": td, "input": self._call_input(td)})
        amsg = {"role": "assistant", "text": text, "calls": calls}
        out_chars = len(text) + sum(len(compact(c["input"])) for c in calls)
        return amsg, out_chars

    def _run_calls(self, calls: list[dict], t_resp: float) -> float:
        """Run the tool calls after the response at ``t_resp``; returns when the last finished."""
        results, t_done = [], t_resp
        for c in calls:
            if c["tool"].kind == "task":
                t_done, content = self._sub_agent(t_done)
            else:
                t_done += self.s._tool_time()
                content = self._call_result(c["tool"])
            results.append({"id": c["id"], "content": content, "is_error": self.r.random() < 0.05})
        self.conv.append({"role": "tool", "results": results})
        return t_done

    def _sub_agent(self, t_done: float) -> tuple[float, str]:
        """Run the next queued sub-agent from ``t_done``: (time it reported back, its report)."""
        sc = self.sub_queue.pop(0)
        n_sub = max(3, min(60, int(round(self.np.lognormal(math.log(5), 0.35)))))
        if sc in ("tool_schema_change", "history_rewrite"):
            n_sub = max(n_sub, 9)
        elif sc is not None:
            n_sub = max(n_sub, 6)
        plan = self.plan
        sub_plan = Plan(self.fmt, self.tenant, sc, [], key_mode=plan.key_mode, project=plan.project)
        t_done = self.s.agent_session(sub_plan, "subagent", t_done + 0.3, n_sub, sc,
                                      parent_tenant=self.tenant) + 0.2
        content = "Sub-agent report:\n" + self.tx.paragraph(3, 6) + "\n\n" + self.tx.bullets(2, 5)
        return t_done, content

    def _task_prompt(self) -> str:
        tx = self.tx
        if self.kind == "subagent":
            return f"Investigate {tx.np_()} in {tx.path()}. {tx.sentence()} {tx.sentence()} Report back with file paths and a short summary."
        return tx.c(("Please ", "Can you ", "", "Now ")) + tx.c(VERB_IMP) + " " + tx.np_() + " in " + tx.path() + ". " + tx.paragraph(1, 3)

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
                out[pname] = f"SELECT {tx.c(NOUNS)}_id, count(*) FROM {tx.c(NOUNS)}s GROUP BY 1 ORDER BY 2 DESC LIMIT 20"
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
            rows = [f"| {tx.c(NOUNS)} | {r.randint(0, 99999)} | {tx.c(ADJS)} |" for _ in range(min(n, 20))]
            return "| name | count | state |\n|---|---|---|\n" + "\n".join(rows)
        if tool.kind == "web":
            return tx.paragraph(3, 8)
        return tx.paragraph(1, 3)
