"""Secrets: no prompt text leaves `replay` unless `--show-text` is asked for.

A canary (``CANARY-<random hex>``, new each run) is planted at the end of every
line of every prompt-text field of every record of every format: system
(string and blocks), message content (strings, text blocks), tool_use input,
tool_result content (string and blocks), thinking blocks, tool definitions
(names, descriptions, schemas), OpenAI tool_calls arguments (inside their
JSON), function/participant ``name`` fields, image URLs, the responses, the
turns of a mini-swe-agent trajectory, stray text fields of token traces, and
the values of records that get rejected. Every command then runs on it — with
errors forced where possible (rejected records, unreadable files, a broken
tokenizer, a failing report section, a server that echoes the prompt, streams
that do not exist) — and the canary must appear in no stdout, stderr (also of
the helper processes: file descriptors 1 and 2 are captured), exception text,
nor any file the command writes (markdown, JSON, CSV, PNG text chunks, Parquet
read column by column and as raw bytes). The DuckDB database is the store and
may hold the text; the `rejects` table's details may not.

The rule for what may be shown: *identifiers* (tenant, session,
prompt_cache_key, user id, model names, file paths, JSON field names) may
appear in outputs; *prompt text* (everything a model would read) may not. So
identifiers are not planted here.

With `--show-text` (`diff`, `diagnose`, `duplicates label-export`) the canary
does appear: the scan can fail.

Path traversal: `--name` (run, report) must be one plain folder name — no
path separator, not `.` or `..`, not absolute — and is refused with exit 2
otherwise, before anything is written. Paths the user gives explicitly
(`--out DIR`, `--parquet FILE`, `-o`/`--out PREFIX`) are the user's choice.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import http.server
import itertools
import json
import os
import re
import secrets
import string
import threading
import traceback
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from replay.cli.main import main
from replay.store import db
from support.paths import SAMPLE

CANARY = "CANARY-" + secrets.token_hex(8)

# Keys whose values are structure or identifiers, not prompt text: left as they are.
KEEP = frozenset({"type", "role", "id", "tool_use_id", "tool_call_id", "model", "cache_control", "$schema",
                  "required", "media_type", "stop_reason", "finish_reason", "object", "metadata", "user",
                  "prompt_cache_key", "extra", "usage", "index", "is_error"})


# ----------------------------------------------------------------- planting

def plant_text(s: str) -> str:
    """The canary at the end of every line (the diff views show whole lines)."""
    return "\n".join(f"{line} {CANARY}" for line in s.split("\n"))


def plant(v, key=None):
    if isinstance(v, dict):
        return {k: x if k in KEEP else plant(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [plant(x, key) for x in v]
    if isinstance(v, str):
        if key == "arguments":  # OpenAI tool-call arguments: JSON inside a string
            try:
                return json.dumps(plant(json.loads(v)))
            except ValueError:
                pass
        return plant_text(v)
    return v


def plant_record(rec: dict) -> dict:
    out = dict(rec)
    for k in ("request", "response"):
        if k in out:
            out[k] = plant(out[k])
    return out


def _anthropic_session() -> list[dict]:
    """Five turns of one session with every Anthropic prompt field: system as a
    string, thinking, text, tool_use, tool_result (string and blocks), tools;
    each turn differs (a rotating header, tool order, an edited message)."""
    tools = [{"name": "lookup", "description": "Look a symbol up in the code base",
              "input_schema": {"type": "object", "properties": {"q": {"type": "string", "description": "symbol"}},
                               "required": ["q"]}},
             {"name": "run_tests", "description": "Run the test suite\nand report failures",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string",
                                                                          "enum": ["tests/", "src/"]}}}}]
    first = {"role": "user", "content": "Find the bug in parser.py, please."}
    turns = [
        first,
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants the parser checked.\nStart with lookup.",
             "signature": "c2lnbmF0dXJl"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {"q": "parse_header"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01",
             "content": [{"type": "text", "text": "def parse_header(line):\n    return line.split(':')"}]},
            {"type": "text", "text": "Also check the tests."}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_02", "name": "run_tests", "input": {"path": "tests/"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_02", "content": "2 failed, 40 passed"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The split drops everything after a colon."}]},
        {"role": "user", "content": "Thanks. Now fix it and keep the tests green."},
    ]
    recs = []
    for k, n in enumerate((1, 3, 5, 7, 7)):
        msgs = [dict(m) for m in turns[:n]]
        system = f"x-request-header: rid={1000 + min(k, 2)}\nYou are a careful engineer.\nAnswer briefly."
        t = list(tools)
        if k >= 3:
            t = t[::-1]                                   # tool order changes
        if k == 4:
            msgs[0] = {"role": "user", "content": "Find the bugs in parser.py and lexer.py, please."}
        recs.append({"timestamp": f"2026-11-17T10:0{k}:00Z", "tenant": "acme-extra", "session": "s-anthropic-extra",
                     "request": {"model": "claude-sonnet-4-5-20250929", "max_tokens": 512, "system": system,
                                 "metadata": {"user_id": "user-7"}, "tools": t, "messages": msgs},
                     "response": {"type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
                                  "content": [{"type": "text", "text": f"Reply number {k}"}],
                                  "usage": {"input_tokens": 100, "output_tokens": 5}}})
    return [plant_record(r) for r in recs]


def _openai_session() -> list[dict]:
    """Three turns with every OpenAI prompt field: system/developer messages,
    content parts, a participant name, an image URL, tool_calls (arguments),
    a tool message, a legacy function message, function definitions."""
    tools = [{"type": "function", "function": {
        "name": "search", "description": "Search the web for a query",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "the query"}},
                       "required": ["query"]}}}]
    msgs = [
        {"role": "system", "content": "You are a travel assistant.\nBe concise."},
        {"role": "developer", "content": [{"type": "text", "text": "Always cite the source."}]},
        {"role": "user", "name": "alice", "content": [
            {"type": "text", "text": "What is the weather in Paris?"},
            {"type": "image_url", "image_url": {"url": "https://img.example/paris-skyline.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "search", "arguments": json.dumps({"query": "weather in Paris today"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees"},
        {"role": "function", "name": "search", "content": "legacy function output: sunny"},
        {"role": "assistant", "content": "It is sunny and 21 degrees in Paris."},
        {"role": "user", "name": "alice", "content": "And tomorrow?"},
    ]
    recs = []
    for k, n in enumerate((3, 6, 8)):
        recs.append({"timestamp": 1794990000.0 + 60 * k, "tenant": "globex-extra", "session": "s-openai-extra",
                     "request": json.dumps(plant({"model": "gpt-4.1-mini", "tools": tools, "messages": msgs[:n],
                                                  "user": "alice-1"})),
                     "response": json.dumps(plant({"object": "chat.completion", "model": "gpt-4.1-mini",
                                                   "choices": [{"index": 0, "message": {
                                                       "role": "assistant", "content": f"answer {k}"}}],
                                                   "usage": {"prompt_tokens": 90, "completion_tokens": 3}}))})
    return recs


def _trajectory() -> dict:
    def turn(k, text):
        return {"role": "assistant", "content": text,
                "extra": {"response": {"created": 1794995000 + 30 * k, "model": "deepseek-chat",
                                       "usage": {"prompt_tokens": 500, "completion_tokens": 20,
                                                 "prompt_cache_hit_tokens": 0}}}}
    msgs = [{"role": "system", "content": "You are a helpful assistant that can run bash commands."},
            {"role": "user", "content": "<pr_description>\nFix the off-by-one in utils.range_of\n</pr_description>"},
            turn(0, "THOUGHT: look at the file\n```bash\ncat utils.py\n```"),
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\ndef range_of(n):\n"
                                        "    return range(n - 1)\n</output>"},
            turn(1, "THOUGHT: fix it\n```bash\nsed -i 's/n - 1/n/' utils.py\n```"),
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\n</output>"},
            turn(2, "THOUGHT: done\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")]
    return {"trajectory_format": "mini-swe-agent-1", "instance_id": "utils__range-1",
            "info": {"exit_status": "Submitted"},
            "messages": [{k: v if k in KEEP else plant(v, k) for k, v in m.items()} for m in msgs]}


def _bad_lines() -> list[bytes]:
    """Records that are rejected, each carrying the canary in a value (after one
    good record, so the file's format is detected)."""
    c = CANARY
    good = _anthropic_session()[0]
    body = {"messages": [{"role": "user", "content": c}]}
    lines = [json.dumps(good),
             '{"timestamp": 1794990000, "request": {"messages": [{"role": "user", "content": "' + c + '"}]',
             json.dumps({"timestamp": f"{c} yesterday", "request": body}),
             json.dumps({"timestamp": 1794990001, "request": {"messages": c}}),
             json.dumps({"timestamp": 1794990002, "request": {"messages": [{"role": "user", "content": {"t": c}}]}}),
             json.dumps({"timestamp": 1794990003, "request": {"system": {"text": c}, "messages": []}}),
             json.dumps({"timestamp": 1794990004, "request": {"model": {"name": c}, **body}}),
             json.dumps({"timestamp": 1794990005, "tenant": {"name": c}, "request": body}),
             json.dumps({"timestamp": 1794990006, "request": c}),
             json.dumps({"timestamp": 1794990007, "request": "{\"messages\": " + c}),
             json.dumps({"timestamp": 1794990008, "request": {"messages": [c]}}),
             json.dumps({"timestamp": 1794990009, "request": {"tools": {"x": c}, **body}}),
             json.dumps({"timestamp": 1794990010, "request": {"messages": [], "system": ""}, "note": c}),
             json.dumps({"request": body}),
             json.dumps(c), json.dumps([c, c]), "",
             b'{"timestamp": 1794990011, "request": {"messages": [{"role": "user", "content": "\xff\xfe '.decode(
                 "latin-1") + c + '"}]}}']
    return [ln.encode("latin-1") if "\xff" in ln else ln.encode() for ln in lines]


def write_logs(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for f in sorted(SAMPLE.glob("*.jsonl")):
        if f.name.startswith("_"):
            continue
        with open(f) as src, open(d / f.name, "w") as dst:
            for line in src:
                dst.write(json.dumps(plant_record(json.loads(line))) + "\n")
    with open(d / "extra-anthropic.jsonl", "w") as fh:
        for r in _anthropic_session():
            fh.write(json.dumps(r) + "\n")
    recs = _openai_session()
    pq.write_table(pa.Table.from_pylist(recs), d / "extra-openai.parquet")
    (d / "utils__range-1.traj.json").write_text(json.dumps(_trajectory()))
    with open(d / "tokens.jsonl", "w") as fh:
        for k in range(6):
            fh.write(json.dumps({"ts": 1794996000 + 10 * k, "tenant": "tok-tenant", "session": "tok-session",
                                 "tokens": list(range(100 + 20 * k)), "prompt": plant_text("stray text")}) + "\n")
    with open(d / "mooncake.jsonl", "w") as fh:
        for k in range(6):
            fh.write(json.dumps({"timestamp": 1794997000000 + 1000 * k, "input_length": 1024 + 512 * k,
                                 "output_length": 8, "hash_ids": list(range(2 + k)),
                                 "text": plant_text("stray text")}) + "\n")
    (d / "rejects.jsonl").write_bytes(b"\n".join(_bad_lines()) + b"\n")
    (d / "bad.traj.json").write_text(json.dumps({"instance_id": "bad-1", "trajectory_format": "mini-swe-agent-1",
                                                 "messages": [{"role": "assistant", "content": plant_text("x")}]}))
    (d / "broken.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00" + CANARY.encode() * 4)
    (d / "broken.traj.json").write_text('{"messages": [{"role": "user", "content": "' + CANARY)
    return d


# ----------------------------------------------------------------- scanning

def _png_text(data: bytes) -> str:
    """Every text chunk of a PNG (tEXt as is, zTXt and iTXt inflated)."""
    out, i = [], 8
    while i + 8 <= len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        if kind == b"tEXt":
            out.append(body.decode("latin-1"))
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out.append(key.decode("latin-1") + zlib.decompress(rest[1:]).decode("latin-1"))
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            flag, rest = rest[0], rest[2:]
            _lang, _, rest = rest.partition(b"\0")
            _tkey, _, text = rest.partition(b"\0")
            out.append(key.decode("latin-1") + (zlib.decompress(text) if flag else text).decode("utf-8", "replace"))
        i += 12 + n
    return "\n".join(out)


def file_text(p: Path) -> str:
    data = p.read_bytes()
    parts = [data.decode("latin-1")]
    if p.suffix == ".parquet":
        t = pq.read_table(p)
        parts.append(str(t.schema) + repr(t.schema.metadata))
        for col in t.columns:
            parts.append(repr(col.to_pylist()))
    elif p.suffix == ".png":
        parts.append(_png_text(data))
    return "\n".join(parts)


def written_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in (".duckdb", ".wal"))


@contextlib.contextmanager
def fd_capture(tmp: Path):
    """What anything (helper processes too) writes to file descriptors 1 and 2."""
    path = tmp / f".fd-{secrets.token_hex(4)}"
    got = {}
    with open(path, "w+b") as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield got
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        sink.seek(0)
        got["text"] = sink.read().decode("utf-8", "replace")
    path.unlink()


class Run:
    """One command's result and everything it printed."""

    def __init__(self, res, fd_text: str):
        self.res, self.fd = res, fd_text
        self.code = res.exit_code

    def texts(self) -> dict[str, str]:
        r = self.res
        out = {"stdout": r.stdout, "stderr": r.stderr, "fd": self.fd}
        if r.exception is not None:
            out["exception"] = "".join(traceback.format_exception(*r.exc_info)) + repr(r.exception)
        return out

    def leaks(self, *roots: Path) -> list[str]:
        where = [k for k, v in self.texts().items() if CANARY in v]
        for root in roots:
            where += [str(p) for p in written_files(root) if CANARY in file_text(p)]
        return where


def invoke(args, tmp: Path) -> Run:
    with fd_capture(tmp) as got:
        res = CliRunner().invoke(main, [str(a) for a in args])
    return Run(res, got["text"])


# ----------------------------------------------------------------- the world

class World:
    pass


def _fake_embed(texts):
    """A stand-in for the semantic extra: hashed bag of words, unit vectors."""
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in re.findall(r"\w+", t.lower()):
            out[i, int(hashlib.blake2b(w.encode(), digest_size=2).hexdigest(), 16) % 64] += 1
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1
    return out / norms


@pytest.fixture()
def embedder(monkeypatch):
    from replay.analysis import labels, near
    monkeypatch.setattr(near, "load_embedder", lambda: _fake_embed)
    monkeypatch.setattr(labels, "load_embedder", lambda: _fake_embed)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World()
    base = tmp_path_factory.mktemp("secrets")
    w.logs = write_logs(base / "logs")
    w.db = base / "store" / "c.duckdb"
    w.db.parent.mkdir()
    w.ingest = invoke(["ingest", w.logs, "--db", w.db], base)
    w.ingest_json = invoke(["ingest", w.logs, "--db", base / "store" / "j.duckdb", "--json"], base)
    w.tokenize = invoke(["tokenize", "--db", w.db], base)
    con = db.connect(w.db)
    try:
        w.rejects = con.execute("SELECT reason, detail FROM rejects").fetchall()
        w.formats = dict(con.execute("SELECT format, count(*) FROM requests GROUP BY ALL").fetchall())
        w.streams = [f"{kind}:{v}" for kind, col in (("session", "session"), ("tenant", "tenant"),
                                                     ("key", "prompt_cache_key"))
                     for (v,) in con.execute(f"SELECT DISTINCT {col} FROM requests WHERE {col} IS NOT NULL "
                                             f"ORDER BY 1").fetchall()]
        w.stored = con.execute(f"SELECT count(*) FROM request_bodies WHERE contains(body, '{CANARY}')").fetchone()[0]
    finally:
        con.close()
    return w


# ----------------------------------------------------------------- ingest

def test_every_format_is_loaded_with_the_canary_in_the_store(world):
    assert world.ingest.code == 0, world.ingest.texts()
    assert set(world.formats) == {"anthropic", "openai", "trajectory", "tokens", "mooncake"}
    assert world.stored > 250          # the store holds the text: the canary really went in
    reasons = {r for r, _ in world.rejects}
    assert {"malformed_json", "bad_timestamp", "wrong_type", "unreadable_file"} <= reasons, reasons
    assert len(world.rejects) >= 15


def test_ingest_and_tokenize_print_no_prompt_text(world):
    for run in (world.ingest, world.ingest_json, world.tokenize):
        assert run.code == 0, run.texts()
        assert run.leaks() == []
    summary = json.loads(world.ingest_json.res.stdout)
    assert summary["rejected"] == len(world.rejects)


def test_reject_details_hold_no_values(world):
    leaked = [(r, d) for r, d in world.rejects if CANARY in d]
    assert leaked == []


# ----------------------------------------------------------------- every command

COMMANDS = {
    "sweep-json": ["sweep", "--db", "{db}", "--json", "--parquet", "{out}/sweep.parquet"],
    "sweep-table": ["sweep", "--db", "{db}", "--stream", "tenant,session,key,global", "--by-stream"],
    "sweep-profiles": ["sweep", "--db", "{db}", "--profile", "deepseek,anthropic-sonnet-4-5,vllm", "--by-stream",
                       "--json", "--parquet", "{out}/p.parquet"],
    "diagnose-json": ["diagnose", "--db", "{db}", "--json", "--examples", "50", "--parquet", "{out}/miss.parquet"],
    "diagnose-text": ["diagnose", "--db", "{db}", "--examples", "50", "--stream", "session"],
    "diagnose-global": ["diagnose", "--db", "{db}", "--json", "--examples", "50", "--stream", "global",
                        "--block", "1", "--ttl", "inf"],
    "diagnose-bad-profile": ["diagnose", "--db", "{db}", "--profile", "nosuch"],
    "whatif-json": ["whatif", "--db", "{db}", "--fix", "all", "--json"],
    "whatif-text": ["whatif", "--db", "{db}", "--fix", "all", "--stream", "session"],
    "whatif-bad-fix": ["whatif", "--db", "{db}", "--fix", "nosuch"],
    # (--block 512: the Mooncake trace's blocks are 512 tokens)
    "capacity-json": ["capacity", "--db", "{db}", "--json", "--block", "512", "--model", "llama-3.1-8b",
                      "--capacity", "auto,1GiB", "--stream", "global,tenant", "--replicas", "1,2",
                      "--routing", "round-robin,prefix,sticky"],
    "capacity-text": ["capacity", "--db", "{db}", "--policy", "lru,belady", "--block", "512,1024"],
    "capacity-bad": ["capacity", "--db", "{db}", "--capacity", "12XB"],
    "duplicates": ["duplicates", "--db", "{db}", "--json"],
    "duplicates-text": ["duplicates", "--db", "{db}"],
    "label-export-no-semantic": ["duplicates", "label-export", "--db", "{db}", "--out", "{out}/pairs"],
    "report": ["report", "--db", "{db}", "--out", "{out}/reports", "--name", "rep"],
    "profiles": ["profiles"],
    "diff-nonexistent": ["diff", "session:no-such-session", "--db", "{db}"],
    "diff-bad-kind": ["diff", "planet:x", "--db", "{db}"],
    "diff-bad-index": ["diff", "session:s-anthropic-extra", "--index", "99", "--db", "{db}"],
    "validate-no-model": ["validate", "--db", "{db}", "--model", "{out}/nosuch"],
    "ingest-missing": ["ingest", "{out}/nothing-here.jsonl", "--db", "{db}"],
    "export-mooncake": ["export", "--db", "{db}", "--to", "mooncake", "-o", "{out}/trace.jsonl"],
    "export-bailian": ["export", "--db", "{db}", "--to", "bailian", "--stream", "session", "-o", "{out}/b.jsonl"],
    "export-text-refused": ["export", "--db", "{db}", "--to", "vllm-custom", "-o", "{out}/prompts.jsonl"],
    "show": ["show", "1", "--db", "{db}"],
    "show-json": ["show", "2", "--db", "{db}", "--json"],
    "show-unknown": ["show", "999999999", "--db", "{db}"],
}
FAILING = {"diagnose-bad-profile": 1, "whatif-bad-fix": 1, "capacity-bad": 1, "label-export-no-semantic": 1,
           "diff-bad-kind": 1, "diff-bad-index": 1, "validate-no-model": 2, "ingest-missing": 2,
           "export-text-refused": 2, "show-unknown": 1}


def _fill(args, **kw):
    return [a.format(**kw) if isinstance(a, str) else a for a in args]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_command_prints_or_writes_prompt_text(world, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # relative default paths land where they are scanned
    from replay.analysis import labels, near

    def missing():
        raise near.SemanticMissing("near duplicates need the embedding model (test stand-in)")
    monkeypatch.setattr(near, "load_embedder", missing)   # the semantic extra's absence, wherever it is installed
    monkeypatch.setattr(labels, "load_embedder", missing)
    run = invoke(_fill(COMMANDS[name], db=world.db, out=tmp_path), tmp_path)
    assert run.code == FAILING.get(name, 0), run.texts()
    if name not in FAILING:
        assert run.res.stdout.strip() or run.res.stderr.strip()
    assert run.leaks(tmp_path) == []


def test_diff_of_every_stream_is_masked(world, tmp_path):
    assert len(world.streams) > 10
    shown = 0
    for s in world.streams:
        for extra in ([], ["--index", "1"]):
            run = invoke(["diff", s, "--db", world.db, *extra], tmp_path)
            assert run.code in (0, 1), run.texts()
            assert run.leaks(tmp_path) == [], s
            shown += "first difference" in run.res.stdout
    assert shown >= 5   # divergences were found and masked, not skipped


def test_the_whole_job_writes_no_prompt_text(world, tmp_path):
    out = tmp_path / "reports"
    run = invoke(["run", world.logs, "--db", tmp_path / "run.duckdb", "--out", out, "--name", "canary",
                  "--model", "llama-3.1-8b", "--block", "512"], tmp_path)   # (the Mooncake trace's block)
    assert run.code == 0, run.texts()
    rep = out / "canary"
    assert {"report.md", "sweep.json", "sweep.parquet"} <= {p.name for p in rep.iterdir()}
    text = (rep / "report.md").read_text()
    for heading in ("## Why requests miss", "## How much memory", "## Duplicates", "## Savings"):
        assert heading in text                # every section ran (and leaked nothing)
    assert "could not be computed" not in text
    assert run.leaks(tmp_path) == []


def test_duplicates_and_the_labelling_protocol_write_no_prompt_text(world, tmp_path, embedder):
    runs = [invoke(["duplicates", "--db", world.db, "--json"], tmp_path),
            invoke(["duplicates", "rates", "--db", world.db, "--stream", "session,global"], tmp_path),
            invoke(["duplicates", "label-export", "--db", world.db, "--out", tmp_path / "exp" / "pairs",
                    "--pairs", "200", "--ttl", "inf"], tmp_path),
            invoke(["duplicates", "audit", "--db", world.db, "--out", tmp_path / "aud" / "pairs", "--rate", "0.5",
                    "--threshold", "0.5", "--ttl", "inf"], tmp_path)]
    for run in runs:
        assert run.code == 0, run.texts()
    assert json.loads(runs[0].res.stdout)["near"] is not None   # the near search really ran
    rows = list(csv.DictReader(open(tmp_path / "exp" / "pairs.csv")))
    assert rows, "no pairs exported"
    for i, r in enumerate(rows):
        r.update(label_1=str(i % 2), label_2="1", label_3="0", intent="support")
    labelled = tmp_path / "labelled.csv"
    with open(labelled, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    runs.append(invoke(["duplicates", "label-import", labelled, "--db", world.db], tmp_path))
    runs.append(invoke(["duplicates", "label-import", labelled, "--db", world.db, "--json"], tmp_path))
    for run in runs[-2:]:
        assert run.code == 0, run.texts()
    # a labelled file whose columns shifted: prompt text where a label, a number or the mode should be
    for col in ("label_1", "similarity", "ttl_s", "mode"):
        bad = tmp_path / f"bad-{col}.csv"
        with open(bad, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows([{**rows[0], col: plant_text("Paris weather")}] + rows[1:])
        run = invoke(["duplicates", "label-import", bad, "--db", world.db], tmp_path)
        assert run.code == 1 and "row 1" in run.res.stderr, run.texts()
        runs.append(run)
    for run in runs:
        assert run.leaks(tmp_path / "exp", tmp_path / "aud") == []


# ----------------------------------------------------------------- forced errors

def test_a_failing_report_section_does_not_quote_prompt_text(world, tmp_path, monkeypatch):
    """A section that fails on the text itself (e.g. a value that does not parse)
    leaves the report standing and says which section failed, not what it read."""
    from replay import api

    def section(con, out, **_):
        body = con.execute("SELECT body FROM request_bodies WHERE body IS NOT NULL LIMIT 1").fetchone()[0]
        at = body.index(CANARY)
        return int(body[at - 40:at + len(CANARY)])   # ValueError: invalid literal for int() …: '…CANARY-…'

    monkeypatch.setattr(api, "why_miss_section", section)
    run = invoke(["report", "--db", world.db, "--out", tmp_path / "reports", "--name", "failing"], tmp_path)
    assert run.code == 0, run.texts()
    text = (tmp_path / "reports" / "failing" / "report.md").read_text()
    assert "A section could not be computed: ValueError in test_secrets.py" in text
    # replay's own messages (options, fields, never values) are still shown
    assert "A section could not be computed: ValueError: a block trace has 512-token blocks" in text
    assert run.leaks(tmp_path) == []
    con = db.connect(world.db)
    with pytest.raises(ValueError, match=CANARY):  # the section's own error did hold the canary
        section(con, tmp_path)
    con.close()


def test_a_broken_tokenizer_prints_no_prompt_text(world, tmp_path):
    """An unreadable tokenizer.json, and one that loads but cannot encode (no
    unknown token): whatever fails, no text is quoted."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    bad = tmp_path / "tok-bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    odd = tmp_path / "tok-odd"
    odd.mkdir()
    tk = Tokenizer(models.WordLevel({"the": 0, "a": 1}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(odd / "tokenizer.json"))
    logs = tmp_path / "logs"
    logs.mkdir()
    for f in ("extra-anthropic.jsonl", "extra-openai.parquet", "utils__range-1.traj.json"):
        (logs / f).write_bytes((world.logs / f).read_bytes())
    for i, tok in enumerate((bad, odd)):
        for cmd in (["sweep", logs, "--json"], ["run", logs, "--out", tmp_path / "reports", "--name", f"t{i}"],
                    ["diagnose", logs, "--json"]):
            run = invoke(cmd + ["--db", tmp_path / f"t{i}.duckdb", "--tokenizer", tok], tmp_path)
            assert run.code != 2 or "tokenizer" in run.res.output, run.texts()
            assert run.leaks(tmp_path / "reports") == [], (cmd, tok)


class _EchoHandler(http.server.BaseHTTPRequestHandler):
    """A server that refuses every request and quotes it back (as some do)."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if b"warm-up" in body and not self.server.refuse_warmup:
            payload = json.dumps({"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}},
                                  "choices": [{"logprobs": {"content": [{"id": 7}]}}]}).encode()
            self.send_response(200)
        else:
            payload = b'{"error": "invalid request: ' + body[:2000] + b'"}'
            self.send_response(400)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("failure", ["no-mlx", "http-error", "died"])
def test_validate_does_not_quote_what_the_server_said(world, tmp_path, monkeypatch, failure):
    """No mlx needed: the server is a stand-in that answers the warm-up, then
    quotes the prompt back in an HTTP 400 (or dies, its log quoting the prompt);
    or mlx is missing."""
    from replay.validate import check, server as srv

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    httpd.refuse_warmup = False
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log = tmp_path / "server.log"
    log.write_text(f"Traceback (most recent call last):\nValueError: cannot tokenize {plant_text('the prompt')}\n")

    def start(self):
        self.port = httpd.server_address[1] if failure == "http-error" else srv.free_port()
        self.log_path = str(log)
        return self

    monkeypatch.setattr(check, "mlx_available", lambda: "mlx not installed (test stand-in)" if failure == "no-mlx"
                        else None)
    monkeypatch.setattr(check, "build_random_model", lambda d=None: tmp_path)
    monkeypatch.setattr(srv.MlxServer, "start", start)
    if failure == "died":
        monkeypatch.setattr(srv.MlxServer, "alive", lambda self: False)
    try:
        run = invoke(["validate", "--db", world.db, "--sample", "3", "--no-cold-pass", "--timeout", "20"], tmp_path)
        # the report's validation section shows the stored error (once: the sections take a while)
        rep = invoke(["report", "--db", world.db, "--out", tmp_path / "reports", "--name", "v"], tmp_path) \
            if failure == "http-error" else None
    finally:
        httpd.shutdown()
        httpd.server_close()
        con = db.connect(world.db)
        con.execute("DELETE FROM meta WHERE key = 'validation'")   # leave the shared store as it was
        con.close()
    assert run.code == 1, run.texts()
    assert {"no-mlx": "mlx not installed", "http-error": "HTTP 400", "died": "died mid-run"}[failure] \
        in run.res.output
    assert run.leaks() == []
    if rep is not None:
        assert rep.code == 0, rep.texts()
        assert "not validated: mlx_lm.server answered HTTP 400" in (tmp_path / "reports" / "v" / "report.md").read_text()
        assert rep.leaks(tmp_path / "reports") == []


def test_a_short_masked_text_cannot_be_guessed_from_its_hash(world, tmp_path):
    """A mask shows a length, character classes and a short hash, so equal texts
    can be told apart from different ones; but a one- or two-character text (a
    digit of a timestamp) must not be recovered by hashing every guess."""
    run = invoke(["diagnose", "--db", world.db, "--json", "--examples", "50"], tmp_path)
    assert run.code == 0, run.texts()
    shown = re.findall(r"⟨(\d+) chars: [a-z+]+ #([0-9a-f]{6})⟩", run.res.stdout)
    short = {h for n, h in shown if int(n) <= 2}
    assert len(short) >= 5, "too few short masked texts to try"
    alphabet = string.ascii_letters + string.digits + string.punctuation + " "
    guesses = {hashlib.blake2b(g.encode(), digest_size=3).hexdigest()
               for g in itertools.chain(alphabet, (a + b for a in alphabet for b in alphabet))}
    # Unkeyed, every short hash would be among the guesses' hashes. Keyed, one
    # of them is by chance with probability 9,120 / 2**24 (some 1 % of runs
    # over two dozen hashes); three, about once in three million runs.
    assert len(short & guesses) <= 2, (len(short & guesses), len(short))


# ----------------------------------------------------------------- --show-text does show it

def test_show_text_shows_the_text(world, tmp_path, embedder):
    """The scan can fail: asked for, the text is there."""
    runs = [invoke(["diff", "session:s-anthropic-extra", "--db", world.db, "--show-text"], tmp_path),
            invoke(["diagnose", "--db", world.db, "--json", "--show-text", "--examples", "50"], tmp_path)]
    for run in runs:
        assert run.code == 0, run.texts()
        assert "stdout" in run.leaks()
    masked = invoke(["diff", "session:s-anthropic-extra", "--db", world.db], tmp_path)
    assert "first difference" in masked.res.stdout and masked.leaks() == []
    run = invoke(["duplicates", "label-export", "--db", world.db, "--out", tmp_path / "pairs", "--show-text",
                  "--ttl", "inf"], tmp_path)
    assert run.code == 0, run.texts()
    assert str(tmp_path / "pairs.csv") in run.leaks(tmp_path)
    for layout in ("vllm-custom", "sglang"):
        out = tmp_path / f"{layout}.jsonl"
        run = invoke(["export", "--db", world.db, "--to", layout, "--show-text", "-o", out], tmp_path)
        assert run.code == 0, run.texts()
        assert str(out) in run.leaks(tmp_path)


# ----------------------------------------------------------------- path traversal

BAD_NAMES = ["../evil", "{abs}", "a/../../evil", "a/b", "..", ".", "", "a\\..\\evil", "ev\0il"]


@pytest.mark.parametrize("command", ["run", "report"])
@pytest.mark.parametrize("name", BAD_NAMES)
def test_name_must_be_one_plain_folder_name(world, tmp_path, command, name):
    out = tmp_path / "box" / "reports"
    out.mkdir(parents=True)
    name = name.replace("{abs}", str(tmp_path / "evil-abs"))   # absolute, outside --out
    args = [command] + ([world.logs] if command == "run" else []) + [
        "--db", tmp_path / "box" / "x.duckdb", "--out", out, "--name", name]
    before = sorted(tmp_path.rglob("*"))
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == 2, res.output
    assert "--name" in res.output and "Traceback" not in res.output
    assert sorted(tmp_path.rglob("*")) == before          # nothing written, inside or out


def test_a_plain_name_is_accepted_and_stays_inside_out(world, tmp_path):
    out = tmp_path / "reports"
    res = CliRunner().invoke(main, ["run", str(world.logs / "extra-anthropic.jsonl"), "--db", str(tmp_path / "x.duckdb"),
                                    "--out", str(out), "--name", "w47.v2", "--ttl", "5m", "--block", "16",
                                    "--min-prefix", "0", "--stream", "tenant"])
    assert res.exit_code == 0, res.output
    assert (out / "w47.v2" / "report.md").is_file()
    assert {p.parent for p in out.rglob("*") if p.is_file()} == {out / "w47.v2"}


def test_the_plain_name_rule():
    import click

    from replay.cli.options import plain_name

    for good in ("w47", "w47.v2", "report-1", "a b", "..x"):
        assert plain_name(None, None, good) == good
    for bad in [n for n in BAD_NAMES if n != "{abs}"] + ["/abs"]:
        with pytest.raises(click.BadParameter):
            plain_name(None, None, bad)
