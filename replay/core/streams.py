"""Streams: which requests may share a cache (semantics.md, "Streams").

A stream mode picks the key; whatever the mode, a cache belongs to one model,
so the cache a request can hit is the pair (stream key, model). A log without
a model field is one model (``None``).
"""

from __future__ import annotations

MODES = ("tenant", "key", "session", "global")
VARIANTS = ("prompt", "prompt+output")  # what a walk inserts: the prompt, or the prompt and its output
# where a hit token's prefix was last written (docs/origin.md), by code 0, 1, 2:
# the walking request's own session, another session (or none) of its tenant, another tenant
ORIGINS = ("same_session", "other_session", "other_tenant")


def stream_key(mode: str, tenant: str, key: str | None, session: str | None) -> str:
    """The stream a request belongs to under ``mode``; ``key`` and ``session``
    fall back to the tenant's stream, never to another key or session."""
    if mode == "tenant":
        return f"tenant:{tenant}"
    if mode == "key":
        return f"key:{key}" if key is not None else f"tenant:{tenant}"
    if mode == "session":
        return f"session:{session}" if session is not None else f"tenant:{tenant}"
    if mode == "global":
        return "global"
    raise ValueError(f"unknown stream mode {mode!r}; choose from {', '.join(MODES)}")


def check_modes(modes) -> tuple[str, ...]:
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown stream mode(s) {bad}; choose from {', '.join(MODES)}")
    return tuple(modes)
