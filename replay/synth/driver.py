"""The traffic driver: the seed's random streams, the session plan run in the time
window, and the chat application; it collects every request (:class:`Synth`)."""

from __future__ import annotations

import math
import random
from datetime import datetime, timezone

import numpy as np

from replay.synth.agent import AgentSession
from replay.synth.plans import MODELS, PLANS, Plan, Req, Gaps
from replay.synth.text import ADJS, CHAT_TOPICS, NAMES, NOUNS, Text, iso_seconds
from replay.synth.tools import make_flavor


class Synth:
    """All the traffic of one seed in a time window, collected in ``reqs`` (in creation order)."""

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
        self.gaps = Gaps(random.Random(seed * 31 + 7))
        self.flavors = {"claude": make_flavor(seed, "claude"), "codex": make_flavor(seed, "codex")}
        self.projects = [self._project(i) for i in range(8)]
        self.reqs: list[Req] = []
        self.seq = 0
        self.n_sessions = 0

    # ------------------------------------------------------------------ helpers
    def _project(self, i: int) -> dict:
        tx = Text(random.Random(self.seed * 101 + i))
        name = f"{tx.c(ADJS)}-{tx.c(NOUNS)}"
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

    # ------------------------------------------------------------------ agent sessions
    def agent_session(self, plan: Plan, kind: str, t_start: float, n_turns: int,
                      cause: str | None, parent_tenant: str | None = None,
                      sub_causes: list[str | None] | None = None) -> float:
        """Simulate one agent session; returns the time its last response ended."""
        return AgentSession(self, plan, kind, t_start, n_turns, cause, parent_tenant, sub_causes).run()

    # ------------------------------------------------------------------ chat app
    def chat(self, n_users: int) -> None:
        r, tx = self.r, self.tx
        tenant = "hooli"
        itx = Text(random.Random(self.seed * 53 + 11))
        instructions = ("You are Hooli Assistant, a friendly general-purpose assistant inside the Hooli app.\n\n"
                        + "## Guidelines\n" + itx.prose(1000) + "\n\n## Formatting\n" + itx.bullets(6, 9)
                        + "\n\n## Safety\n" + itx.prose(700))
        model = MODELS[("openai", "chat")]
        for u in range(n_users):
            name = NAMES[u % len(NAMES)]
            uid = f"u-{1000 + 37 * u + self.seed % 37}"
            key = None if u % 4 == 3 else "hooli-chat-v3"  # legacy clients send no key
            n_conv = 1 + u % 3 + r.randint(0, 1)
            starts = sorted(self._start_time(0.0) for _ in range(n_conv))
            for t in starts:
                n_msgs = r.randint(2, 4) + (r.random() < 0.3)
                topic = tx.c(CHAT_TOPICS)
                conv: list[dict] = []
                for k in range(n_msgs):
                    question = (f"I need help with {topic}. " if k == 0 else "") + tx.paragraph(1, 2)
                    conv.append({"role": "user", "content": question})
                    user_line = f"You are talking to {name} (user {uid})."
                    time_line = f"The current date and time is {iso_seconds(t).replace('T', ' ').replace('Z', ' UTC')}."
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
        n_main = max(1, int(round(len(PLANS) * self.scale)))
        for i in range(n_main):
            plan = PLANS[i % len(PLANS)]
            if i >= len(PLANS):  # later rounds: other tenants' projects, same causes
                plan = Plan(plan.fmt, plan.tenant, plan.cause, list(plan.subs), plan.key_mode,
                            plan.project + (i // len(PLANS)))
            n = max(5, min(60, int(round(self.np.lognormal(math.log(self.turns_median), 0.3)))))
            if plan.cause in ("tool_schema_change", "history_rewrite"):
                n = max(n, 9)
            n = max(n, 2 + 2 * len(plan.subs))
            # simulate at relative time, then shift into the window
            start = self._start_time(3 * 3600.0)
            self.agent_session(plan, "agent", start, n, plan.cause, sub_causes=plan.subs)
        if self.chat_share > 0:
            self.chat(max(2, int(round(20 * self.scale * self.chat_share))))
