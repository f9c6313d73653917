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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# the package's modules, each importing only modules listed before it:
# text, tools, plans, wire, agent, driver, truth, then this one
from replay.synth.agent import AgentSession
from replay.synth.driver import Synth
from replay.synth.plans import CAUSES, GAP_BUCKETS, Plan, Req
from replay.synth.text import Text
from replay.synth.tools import Flavor, ToolDef
from replay.synth.truth import finish_truth, log_line

__all__ = ["CAUSES", "FILES", "GAP_BUCKETS", "AgentSession", "Flavor", "Plan", "Req", "Synth", "SynthResult",
           "Text", "ToolDef", "generate", "synth_main"]

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
    finish_truth(reqs, int(seed))

    files: dict[str, Path] = {}
    counts: dict[str, int] = {}
    total_bytes = 0
    by_file: dict[str, list[Req]] = {}
    for q in reqs:
        by_file.setdefault(q.file, []).append(q)
    ext = {None: "", "gzip": ".gz", "gz": ".gz", "zstd": ".zst", "zst": ".zst"}[compress]
    truth_name = {}
    for name in sorted(by_file):
        data = ("\n".join(log_line(q) for q in by_file[name]) + "\n").encode("utf-8")
        path = out / f"{name}.jsonl{ext}"
        data = _compress(data, ext)
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


def _compress(data: bytes, ext: str) -> bytes:
    """``data`` compressed for a file ending in ``ext`` (gzip with mtime 0: reproducible bytes)."""
    if ext == ".gz":
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
            gz.write(data)
        data = buf.getvalue()
    elif ext == ".zst":
        import zstandard

        data = zstandard.ZstdCompressor(level=10).compress(data)
    return data


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
