"""Provider and engine profiles: each a small, documented set of rules layered on
the semantics contract (``docs/semantics.md``), never a change to it.
This module is the table of profiles; ``replay.providers.profiles`` computes
with them (``profile_sweep(con, ["ideal", "deepseek", "anthropic-sonnet-4-5"], Grid())``).

Every profile says which grid dimensions (TTL × block × minimum prefix × stream
mode) it *honours* and which it *overrides* (fixes to the provider's value); the
rows it returns carry the values actually used, so a fixed dimension shows up
as a single value instead of a silent change.

Options may be appended to a profile name, ``name:key=value[,key=value]``, e.g.
``mlx-lm:cache_size=20``, ``openai-gpt-5:replicas=4``, ``anthropic-sonnet-4-5:auto=0``,
``anthropic-sonnet-4-5:lookback=20``.

Two implementations:

* **walk profiles** (``ideal``, ``vllm``, ``sglang``, ``mooncake``, ``deepseek``)
  are arithmetic on the stored walks: ``L_τ`` per request
  (``replay.core.hits``), then the profile's rounding, cap and minimum.
  ``prompt+output`` walks are used where the engine keeps generated tokens.
* **simulated profiles** (``mlx-lm``, ``anthropic-*``, ``openai-*`` — the latter
  because its partition, organisation + key, is no stored stream mode)
  materialise the prompts (``replay.core.prompts.iter_prompts``) and run a small
  simulator of the provider's cache in processing order
  (``replay.providers.simulators``). Each simulator's pure core is tested
  against a brute-force reading of the same rules (``tests/providers/test_profiles.py``).

Every profile keeps the contract's split of caches by model.

Facts and their sources (looked up 2026; re-check before relying on them):

* vLLM v1 prefix caching: full 16-token blocks, parent-chained block hashes, a
  fully cached prompt still recomputes its last token (``num_computed_tokens``
  capped at ``len − 1``, block-aligned), generated tokens are hashed into blocks
  as they fill, so a finished request's output blocks are reusable.
  ``cache_salt`` / LoRA / multimodal ids partition the chain.
  https://docs.vllm.ai/en/latest/design/prefix_caching.html (v0.8+ docs).
* SGLang RadixAttention: token-level radix tree (``page_size=1`` default), the
  finished request's prompt + output inserted, at least one token always
  computed (``max_prefix_len = len(input_ids) − 1``).
  https://docs.sglang.ai, ``python/sglang/srt/mem_cache/radix_cache.py``.
* Mooncake traces: 512-token blocks, ``hash_ids`` already chained.
  https://github.com/kvcache-ai/Mooncake (FAST'25 trace README).
* mlx-lm server: see :mod:`replay.providers.mlx_cache` (read from mlx-lm 0.32.2).
* DeepSeek API context caching: on by default, shared across the account, hits
  counted in 64-token units, prompt + output both persisted ("each request
  produces cache prefix units at the end of the user input and at the end of the
  model output"), kept "from hours to days".
  https://api-docs.deepseek.com/guides/kv_cache (read 2026).
* Anthropic prompt caching: prefix tools → system → messages up to a
  ``cache_control`` breakpoint (≤ 4 explicit; a top-level ``cache_control`` is the
  automatic breakpoint on the last cacheable block), lookback of about 20
  content blocks before each breakpoint, minimum cacheable length per model
  (table :data:`ANTHROPIC_MIN_TOKENS`), TTL 5 min refreshed on every hit or
  1 h (``"ttl": "1h"``); writes 1.25× / 2×, reads 0.1× of base input.
  https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching (2025–26);
  the minimum table as republished by https://docs.orq.ai/docs/proxy/prompt-caching
  and https://docs.litellm.ai/docs/completion/prompt_caching (2026; they differ
  for Sonnet 4.6: 2048 vs 1024 — we use 2048).
* OpenAI prompt caching: automatic for prompts ≥ 1024 tokens, hits in 128-token
  increments, routed by a hash of the first ~256 tokens (+ ``prompt_cache_key``),
  more than ~15 requests/min per prefix + key overflow to other machines,
  in-memory retention 5–10 min idle (≤ 1 h) or 24 h extended; caches are not
  shared between organisations.
  https://platform.openai.com/docs/guides/prompt-caching (2025–26).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

# ----------------------------------------------------------------------------- profile table

#: Anthropic minimum cacheable prompt length (tokens) by model family.
ANTHROPIC_MIN_TOKENS: dict[str, int] = {
    "opus-4-6": 4096,
    "opus-4-5": 4096,
    "sonnet-4-6": 2048,
    "haiku-4-5": 4096,
    "sonnet-4-5": 1024,
    "opus-4-1": 1024,
    "opus-4": 1024,
    "sonnet-4": 1024,
    "sonnet-3-7": 1024,
    "haiku-3-5": 2048,
    "haiku-3": 2048,
}

#: Gemini implicit caching: minimum input tokens by model (ai.google.dev/gemini-api/docs/caching:
#: the page of 2026-10 for the models it lists, else that of 2026-05; the figures changed between
#: them — 2.5 Pro 4096 → 2048, 2.5 Flash 1024 → 2048 — so keep it a table and date it).
GEMINI_MIN_TOKENS: dict[str, int] = {
    "3-pro": 4096,
    "3-1-pro": 4096,
    "3-flash": 1024,
    "2-5-pro": 2048,
    "2-5-flash": 2048,
}

#: OpenAI models given a profile (all share the same caching rules).
OPENAI_MODELS = ("gpt-5", "gpt-5-mini", "gpt-4.1", "gpt-4.1-mini", "gpt-4o")


@dataclass(frozen=True)
class Profile:
    """A named set of caching rules. ``None`` for a dimension = the grid's values."""

    name: str
    kind: str                        # "walk" | "mlx" | "anthropic" | "openai" | "client" | "gemini"
    summary: str
    variant: str = "prompt"          # walks variant: "prompt" or "prompt+output"
    block: int | None = None         # fixed block size, or None = grid
    min_prefix: int | None = None    # fixed minimum, or None = grid
    cap_last: bool = False           # hit ≤ len − 1 (block-aligned)
    step: int | None = None          # openai: increments after the first min_prefix tokens
    ttl_fixed: bool = False          # the TTL is the provider's, not the grid's
    streams: tuple[str, ...] | None = None  # fixed stream modes, or None = grid
    honours: str = ""
    overrides: str = ""
    sources: str = ""
    params: dict = field(default_factory=dict)

    @property
    def canonical_json(self) -> bool:
        """Hosted APIs parse the request JSON before building the prompt, so key order
        and separators cannot cause a miss there (diagnose/whatif work on the canonical view)."""
        return self.kind in ("anthropic", "openai", "client", "gemini") or self.name.split(":")[0] == "deepseek"

    @property
    def family(self) -> str:
        """The provider whose rules a ``client`` or ``gemini`` profile applies (``client_rules.RULES``)."""
        return "google" if self.name.startswith("gemini-") else self.name.split("-")[0]

    def describe(self) -> str:
        return (f"{self.name}: {self.summary}\n  honours: {self.honours or '-'}\n"
                f"  overrides: {self.overrides or '-'}\n  sources: {self.sources or '-'}")


def _base_profiles() -> dict[str, Profile]:
    p: dict[str, Profile] = {}
    p["ideal"] = Profile(
        "ideal", "walk", "the contract itself: longest common prefix with any earlier prompt of the stream",
        honours="ttl, block, min_prefix, stream", sources="semantics.md")
    p["vllm"] = Profile(
        "vllm", "walk", "vLLM v1: 16-token full blocks, hit capped at len−1 (block-aligned), output kept",
        variant="prompt+output", block=16, min_prefix=0, cap_last=True,
        honours="ttl (stand-in for LRU capacity), stream (= the replicas a router pins a stream to)",
        overrides="block=16, min_prefix=0; cache_salt/LoRA are not in the logs (no partition)",
        sources="docs.vllm.ai design/prefix_caching (v0.8+, read 2026)")
    p["sglang"] = Profile(
        "sglang", "walk", "SGLang radix cache: token level, output kept, hit capped at len−1",
        variant="prompt+output", block=1, min_prefix=0, cap_last=True,
        honours="ttl (stand-in for LRU capacity), stream", overrides="block=1, min_prefix=0",
        sources="sglang radix_cache.py / schedule_batch.py (read 2026)")
    p["mooncake"] = Profile(
        "mooncake", "walk", "Mooncake traces: 512-token blocks (hash_ids already chained)",
        block=512, min_prefix=0, honours="ttl, stream", overrides="block=512, min_prefix=0",
        sources="github.com/kvcache-ai/Mooncake trace README (FAST'25)")
    p["deepseek"] = Profile(
        "deepseek", "walk", "DeepSeek API: 64-token units, prompt + output cached, account-wide",
        variant="prompt+output", block=64, min_prefix=64,
        honours="ttl (disk cache kept hours to days: inf is the faithful value), stream "
                "(tenant = account is the faithful one; global = tenant for a one-account log)",
        overrides="block=64, min_prefix=64", sources="api-docs.deepseek.com/guides/kv_cache (read 2026)")
    p["mlx-lm"] = Profile(
        "mlx-lm", "mlx", "mlx-lm server: token-level nearest prefix over an LRU of 10 stored prompt caches",
        variant="prompt+output", block=1, min_prefix=0, ttl_fixed=True,
        honours="stream", overrides="ttl (none: count-capped LRU, option cache_size=10), block=1, min_prefix=0",
        sources="mlx-lm 0.32.2 models/cache.py, server.py (see replay.providers.mlx_cache)",
        params={"cache_size": 10})
    for fam, m in ANTHROPIC_MIN_TOKENS.items():
        name = f"anthropic-{fam}"
        p[name] = Profile(
            name, "anthropic",
            f"Anthropic claude-{fam}: hits only at cache breakpoints (≤4 explicit or automatic), "
            f"~20-block lookback, minimum {m} tokens, TTL 5m refreshed on hit or 1h",
            block=1, min_prefix=m, ttl_fixed=True,
            honours="stream (tenant = organisation is the faithful one); ttl only as the default TTL of "
                    "breakpoints without an explicit ttl, and only the values 5m and 1h",
            overrides=f"block=1 (hits at breakpoints), min_prefix={m}",
            sources="docs.anthropic.com prompt-caching (2025-26); minimum table via docs.orq.ai (2026)",
            params={"auto": 1, "lookback": 20})
    for model in OPENAI_MODELS:
        name = f"openai-{model}"
        p[name] = Profile(
            name, "openai",
            f"OpenAI {model}: automatic ≥1024 tokens, 128-token increments, partition organisation + "
            "prompt_cache_key; replicas>1 simulates the overflow above 15 req/min per prefix+key",
            block=1, min_prefix=1024, step=128, streams=("org+key",),
            honours="ttl (in-memory 5–10 min idle, ≤1h; extended retention 24h)",
            overrides="block (1024 then 128-token increments), min_prefix=1024, stream=org+key",
            sources="platform.openai.com/docs/guides/prompt-caching (2025-26)",
            params={"replicas": 1, "rpm": 15, "route_tokens": 256})
    p.update(_client_profiles())
    return p


def _client_profiles() -> dict[str, Profile]:
    """The providers as coding agents use them: what ``replay realised`` judges by
    (``replay.providers.client_rules``; the evidence in docs/realised.md)."""
    p: dict[str, Profile] = {}
    p["anthropic-claude-code"] = Profile(
        "anthropic-claude-code", "client",
        "Anthropic as Claude Code uses it: breakpoints at the end of the tools + system prefix (hidden in "
        "transcripts: an opaque run, its length inferred from the first call's usage) and at the last content "
        "block; 20-block lookback; the model's minimum; 5 min refreshed on hit or 1 h, as each call's usage "
        "split shows it wrote",
        block=1, ttl_fixed=True, streams=("tenant",), honours="-",
        overrides="block=1 (hits at breakpoints), min_prefix=the model's, ttl=from the usage split, "
                  "stream=tenant (the account)",
        sources="docs.anthropic.com prompt-caching (read 2026-12); 98 Claude Code transcripts (docs/realised.md)")
    p["openai-responses"] = Profile(
        "openai-responses", "client",
        "OpenAI automatic caching as the Responses API applies it (Codex CLI): ≥1024 tokens, 128-token "
        "increments, routed by prefix + prompt_cache_key (Codex: the conversation id), in-memory retention "
        "(10 min idle, refreshed on hit; extended 24 h not assumed); tool definitions hidden in rollouts: an "
        "opaque run inferred from the first call's usage; encrypted reasoning an opaque run of the call's "
        "reasoning tokens",
        block=1, min_prefix=1024, step=128, ttl_fixed=True, streams=("org+key",), honours="-",
        overrides="block (1024 then 128-token increments), min_prefix=1024, ttl=10 min, stream=org+key",
        sources="platform.openai.com/docs/guides/prompt-caching (read 2026-12); 10 Codex rollouts")
    for fam, m in GEMINI_MIN_TOKENS.items():
        name = f"gemini-{fam}"
        p[name] = Profile(
            name, "gemini",
            f"Gemini {fam} implicit caching: minimum {m} tokens, hits in 2048-token blocks, "
            "a separate cache per serving backend (OpenRouter's provider), TTL 1 h (none documented)",
            block=1, min_prefix=m, ttl_fixed=True, streams=("tenant",), honours="-",
            overrides=f"min_prefix={m}, block=2048 provider tokens, ttl=1h, stream=tenant and backend",
            sources="ai.google.dev/gemini-api/docs/caching (2026-05, 2026-10); the 2048-token blocks from 100 "
                    "mini-swe-agent runs through OpenRouter (docs/realised.md)")
    return p


PROFILES: dict[str, Profile] = _base_profiles()


def list_profiles() -> list[Profile]:
    """Every registered profile (``name:opt=value`` variants are not listed)."""
    return list(PROFILES.values())


def get_profile(spec: str) -> Profile:
    """A profile from ``name`` or ``name:key=value,key=value``.

    ``anthropic-<model>`` / ``openai-<model>`` also accept full model ids
    (``anthropic-claude-sonnet-4-5-20250929`` → ``anthropic-sonnet-4-5``).
    """
    name, _, opts = spec.partition(":")
    prof = PROFILES.get(name) or _fuzzy(name)
    if prof is None:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    if opts:
        params = dict(prof.params)
        for kv in opts.split(","):
            k, _, v = kv.partition("=")
            k = k.strip()
            if k not in params:
                raise ValueError(f"profile {prof.name} has no option {k!r} (options: {sorted(params)})")
            params[k] = int(v) if v.strip().lstrip("-").isdigit() else v.strip()
        prof = replace(prof, name=spec, params=params)
    return prof


def _fuzzy(name: str) -> Profile | None:
    n = name.lower().replace("claude-", "").replace(".", "-") if name.startswith("anthropic-") else name.lower()
    if n.startswith("anthropic-"):
        rest = n[len("anthropic-"):]
        for fam in sorted(ANTHROPIC_MIN_TOKENS, key=len, reverse=True):
            if rest.startswith(fam):
                return PROFILES[f"anthropic-{fam}"]
    if n.startswith("openai-"):
        # any OpenAI model gets the common rules
        base = PROFILES["openai-gpt-5"]
        return replace(base, name=name, summary=base.summary.replace("gpt-5", name[7:]))
    return None


def profile_for_model(model: str | None) -> str | None:
    """The profile that models a logged ``model`` name (None when unknown; see :func:`model_family`)."""
    fam = model_family(model)
    return fam.profile if fam.known else None


def judging_config(prof: Profile) -> tuple[float, int, int]:
    """(ttl, block, min_prefix) a profile is judged at when none is given: its fixed
    block and minimum, else token level with no minimum; the provider's TTL
    (OpenAI's guaranteed in-memory 5 min, Anthropic's default 5 min), else no expiry."""
    ttl = 300.0 if prof.kind in ("openai", "anthropic") else math.inf  # (client, gemini: the TTL is the rules')
    return ttl, prof.block or 1, prof.min_prefix or 0


# ----------------------------------------------------------------------------- logged model → profile

@dataclass(frozen=True)
class ModelFamily:
    """What a logged model name is judged by (``--profile auto``).

    ``name``: the name without a gateway prefix and a date / version suffix;
    ``family``: anthropic, openai, deepseek or unknown; ``profile``: the profile
    that judges its requests (``ideal`` when no provider profile fits);
    ``known``: whether that profile is the provider's own; ``note``: why, in words.
    """
    model: str | None
    name: str
    family: str
    profile: str
    known: bool
    note: str


_GATEWAY = re.compile(r"^(?:[a-z]{2,4}\.)?(?:anthropic|openai|deepseek|azure|bedrock|vertex_ai|openrouter|litellm|google)"
                      r"[./]")
_SUFFIX = re.compile(r"(?:@.*|-v\d+:\d+|-\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")  # Vertex, Bedrock, dates
_CLAUDE_OLD = re.compile(r"^claude-(\d+)(?:[-.](\d+))?-(haiku|sonnet|opus)$")  # claude-3-5-haiku
_CLAUDE_NEW = re.compile(r"^claude-(haiku|sonnet|opus)-(\d+)(?:[-.](\d+))?$")  # claude-haiku-4-5
_OPENAI = re.compile(r"^(?:gpt-|chatgpt-|codex-|o\d)")
_OPENAI_UNCACHED = re.compile(r"^gpt-(?:3\.5|4)(?:$|-)")  # gpt-3.5-turbo, gpt-4, gpt-4-turbo (before gpt-4o)


def model_name(model: str | None) -> str:
    """A logged model name as the mapping and the price table read it: lower case,
    without a gateway prefix (``anthropic/``, ``us.anthropic.``, ``openai/``…) or a
    date / version suffix (``-20250929``, ``-2025-04-14``, ``@20250929``, ``-v1:0``,
    ``-latest``); Claude names as ``claude-<tier>-<major>-<minor>``."""
    m = (model or "").strip().lower()
    while (g := _GATEWAY.match(m)) is not None:
        m = m[g.end():]
    while (s := _SUFFIX.search(m)) is not None and s.start() > 0:
        m = m[:s.start()]
    if (c := _CLAUDE_OLD.match(m) or _CLAUDE_NEW.match(m)) is not None:
        a, b, c3 = c.groups()
        tier, major, minor = (c3, a, b) if a.isdigit() else (a, b, c3)
        m = f"claude-{tier}-{major}" + (f"-{minor}" if minor else "")
    return m


def model_family(model: str | None) -> ModelFamily:
    """The family and profile a logged model is judged by under ``--profile auto``.

    | logged model (after :func:`model_name`) | family | profile |
    |---|---|---|
    | ``claude-<tier>-<generation>`` in :data:`ANTHROPIC_MIN_TOKENS` | anthropic | ``anthropic-<tier>-<generation>`` |
    | any other ``claude-*`` | anthropic | ``ideal`` (the generation's minimum is not in the table: said so) |
    | ``gpt-4o*``, ``gpt-4.1*``, ``gpt-5*``, ``o1``–``o4*``, ``chatgpt-*``, ``codex-*`` | openai | ``openai-<name>`` |
    | ``gpt-3.5*``, ``gpt-4``, ``gpt-4-*`` | openai | ``ideal`` (no documented prompt caching: said so) |
    | ``gemini-<generation>*`` in :data:`GEMINI_MIN_TOKENS` | google | ``gemini-<generation>`` |
    | ``deepseek*`` | deepseek | ``deepseek`` |
    | anything else, or no model | unknown | ``ideal``, said so — never another provider's rules |
    """
    name = model_name(model)
    ideal = "judged by the ideal contract (TTL ∞, block 1, no minimum)"
    if not name:
        return ModelFamily(model, name, "unknown", "ideal", False, f"no model in the log: {ideal}")
    if name.startswith("claude"):
        c = _CLAUDE_NEW.match(name)
        fam = c and f"{c.group(1)}-{c.group(2)}" + (f"-{c.group(3)}" if c.group(3) else "")
        if fam in ANTHROPIC_MIN_TOKENS:
            return ModelFamily(model, name, "anthropic", f"anthropic-{fam}", True,
                               f"Anthropic, minimum {ANTHROPIC_MIN_TOKENS[fam]} tokens")
        return ModelFamily(model, name, "anthropic", "ideal", False,
                           f"an Anthropic model whose minimum cacheable length is not in the table: {ideal}")
    if _OPENAI_UNCACHED.match(name):
        return ModelFamily(model, name, "openai", "ideal", False,
                           f"an OpenAI model older than gpt-4o, without documented prompt caching: {ideal}")
    if _OPENAI.match(name):
        return ModelFamily(model, name, "openai", f"openai-{name}", True,
                           "OpenAI, automatic ≥1024 tokens, 128-token increments, organisation + key")
    if name.startswith("gemini-"):
        gen = name[len("gemini-"):].replace(".", "-")
        for fam in sorted(GEMINI_MIN_TOKENS, key=len, reverse=True):
            if gen.startswith(fam):
                return ModelFamily(model, name, "google", f"gemini-{fam}", True,
                                   f"Google, implicit caching, minimum {GEMINI_MIN_TOKENS[fam]} tokens, per backend")
        return ModelFamily(model, name, "google", "ideal", False,
                           f"a Gemini model whose minimum is not in the table: {ideal}")
    if name.startswith("deepseek") and "/" not in name:  # the API's names (a Hugging Face id is self-hosted)
        return ModelFamily(model, name, "deepseek", "deepseek", True, "DeepSeek, 64-token units, prompt + output")
    return ModelFamily(model, name, "unknown", "ideal", False, f"unknown model: {ideal}")
