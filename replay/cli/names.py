"""The names and defaults the commands' options show, without importing the stages.

Parsing a command line, `replay --help` and `replay COMMAND --help` need these
only; importing the modules that own them would load DuckDB, polars, Arrow,
the tokenizers and the chat-template machinery first (a second or more of
start-up for a command that may not touch them). The constants of heavy
modules are written out here; ``tests/cli/test_startup.py`` checks each one
against its owner, so they cannot drift. Light owners are imported.
"""

from __future__ import annotations

import math

from replay.core.streams import MODES  # noqa: F401
from replay.distributed import ENGINES  # noqa: F401
from replay.providers.gpus import known_gpus  # noqa: F401
from replay.providers.kv import MODELS as KV_MODELS  # noqa: F401
from replay.times import UNIT_US, format_ttl, parse_ttl  # noqa: F401

DEFAULT_DB = "data/replay.duckdb"  # replay.store.db
FORMATS = ("anthropic", "openai", "tokens", "mooncake", "trajectory", "bailian", "ragpulse", "kv-cache-tester",
           "otel", "litellm", "langfuse", "claude-code", "codex")  # replay.readers.formats
TIME_UNITS = tuple(UNIT_US)  # replay.readers.timestamps
RENDERS = ("neutral", "deepseek")  # replay.text.renderers
DEFAULT_TTLS = (300.0, 1800.0, 3600.0, math.inf)  # replay.core.grid
DEFAULT_BLOCKS = (1, 16, 512)
DEFAULT_MIN_PREFIXES = (0, 1024)
DEFAULT_STREAMS = ("tenant", "key", "global")
COST_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.3-70b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b",
               "qwen3-32b", "mistral-7b", "deepseek-v3", "deepseek-r1")  # replay.providers.prefill_cost
EXPORT_TARGETS = ("mooncake", "bailian", "vllm-custom", "sglang")  # replay.analysis.export
EXPORT_TEXT_TARGETS = ("vllm-custom", "sglang")
NEAR_THRESHOLDS = (0.80, 0.85, 0.90, 0.95, 0.99)  # replay.analysis.near
PREFIX_RANKINGS = ("hit_tokens", "requests")  # replay.analysis.prefixes
TREND_THRESHOLD = 5.0  # replay.analysis.trend

#: name here -> (owning module, its name there): what the test compares
OWNERS = {"DEFAULT_DB": ("replay.store.db", "DEFAULT_DB"), "FORMATS": ("replay.readers.formats", "FORMATS"),
          "TIME_UNITS": ("replay.readers.timestamps", "TIME_UNITS"), "RENDERS": ("replay.text.renderers", "RENDERS"),
          "DEFAULT_TTLS": ("replay.core.grid", "DEFAULT_TTLS"), "DEFAULT_BLOCKS": ("replay.core.grid", "DEFAULT_BLOCKS"),
          "DEFAULT_MIN_PREFIXES": ("replay.core.grid", "DEFAULT_MIN_PREFIXES"),
          "DEFAULT_STREAMS": ("replay.core.grid", "DEFAULT_STREAMS"), "COST_MODELS": ("replay.api", "COST_MODELS"),
          "EXPORT_TARGETS": ("replay.analysis.export", "TARGETS"),
          "EXPORT_TEXT_TARGETS": ("replay.analysis.export", "TEXT_TARGETS"),
          "NEAR_THRESHOLDS": ("replay.analysis.near", "THRESHOLDS"), "PREFIX_RANKINGS": ("replay.analysis.prefixes", "BY"),
          "TREND_THRESHOLD": ("replay.analysis.trend", "DEFAULT_THRESHOLD")}
