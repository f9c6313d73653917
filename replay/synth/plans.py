"""What is simulated: the planted causes, the session plan, models, think times, the request record."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

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

# human think-time buckets (seconds): spread across the TTLs a sweep covers
GAP_BUCKETS: tuple[tuple[float, float], ...] = (
    (60.0, 240.0),  # 1–4 min (< 5 min)
    (360.0, 1500.0),  # 6–25 min (5–30 min)
    (2100.0, 3300.0),  # 35–55 min (30–60 min)
    (4320.0, 18000.0),  # 1.2–5 h (> 1 h)
)
_GAP_BAG = (0, 0, 0, 0, 1, 1, 1, 2, 2, 3)


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
PLANS = [
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

MODELS = {
    ("anthropic", "agent"): "claude-sonnet-4-5-20250929",
    ("anthropic", "subagent"): "claude-haiku-4-5-20251001",
    ("openai", "agent"): "gpt-5.1-codex",
    ("openai", "subagent"): "gpt-5.1-codex-mini",
    ("openai", "chat"): "gpt-4.1-mini",
}


class Gaps:
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

