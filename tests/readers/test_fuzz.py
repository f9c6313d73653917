"""Seeded fuzz suite: malformed input of every format never stops ingest.

For each input format (anthropic, openai, tokens, mooncake: JSONL, plain, .gz
and .zst; trajectory: whole documents) at least REPLAY_FUZZ_LINES (default
10,000) generated malformed lines, drawn from REPLAY_FUZZ_SEED. The contract
checked on every file: no exception, each line number loaded or rejected
exactly once (`loaded + rejected = lines`, the lines being those written),
every reject with a known reason and a detail free of prompt text (a canary
planted in every prompt and in the wrong values), the lines whose outcome is
known (intact lines, BOM, CRLF: loaded; truncated, invalid UTF-8, trailing
garbage, not an object, blank: rejected for that reason) as expected, a second
ingest adding nothing, and the sweep running on what loaded.

Slow mode: ``REPLAY_FUZZ_LINES=100000 pytest tests/readers/test_fuzz.py``.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from replay import api
from replay.core.grid import Grid
from replay.readers import chat, files, traces
from replay.readers.formats import FORMATS
from replay.readers.ingest import ingest
from replay.store import db

from support.paths import ROOT, SHARED
from support.gen import random_requests

N_LINES = int(os.environ.get("REPLAY_FUZZ_LINES", "10000"))
SEED = int(os.environ.get("REPLAY_FUZZ_SEED", "8191"))
CANARY = "FUZZ-CANARY-PROMPT-TEXT"
REASONS = frozenset({"blank_line", "malformed_json", "missing_timestamp", "bad_timestamp", "no_prompt", "wrong_type",
                     "unknown_format", "missing_tenant", "missing_field", "unreadable_file", "too_large", "bad_length"})
GRID = Grid(ttls=(300.0, math.inf), blocks=(16,), min_prefixes=(0,), streams=("global", "tenant"))
TS_KEY = {"anthropic": "timestamp", "openai": "timestamp", "tokens": "ts", "mooncake": "timestamp"}
LOAD = frozenset({"load"})

# ----------------------------------------------------------------- seeds: valid records of each format


def _shrink(v, max_str: int = 160, max_list: int = 6):
    """Small copies of real records: every string cut short, every list to a few items."""
    if isinstance(v, str):
        return v[:max_str]
    if isinstance(v, list):
        return [_shrink(x, max_str, max_list) for x in v[:max_list]]
    if isinstance(v, dict):
        return {k: _shrink(x, max_str, max_list) for k, x in v.items()}
    return v


def _plant(body: dict) -> None:
    """The canary in every prompt text: it must never reach a reject's detail."""
    for m in body.get("messages") or ():
        if isinstance(m.get("content"), str):
            m["content"] += " " + CANARY
        for b in m.get("content") if isinstance(m.get("content"), list) else ():
            if isinstance(b, dict) and isinstance(b.get("text"), str):
                b["text"] += " " + CANARY
    if isinstance(body.get("system"), str):
        body["system"] += " " + CANARY


def _chat_seeds(fmt: str) -> list[dict]:
    names = {"anthropic": ["agent-anthropic.jsonl"], "openai": ["agent-openai.jsonl", "chat-openai.jsonl"]}[fmt]
    recs = []
    for name in names:
        for line in (ROOT / "data" / "sample" / name).read_text().splitlines():
            rec = _shrink(json.loads(line))
            _plant(rec["request"])
            recs.append(rec)
    flat = [{**r["request"], "timestamp": r["timestamp"], "tenant": r["tenant"], "session": r["session"]}
            for r in recs[::5]]  # the flat form: the body itself plus log metadata
    return recs + flat


def _seeds(fmt: str) -> list[dict]:
    if fmt in ("anthropic", "openai"):
        return _chat_seeds(fmt)
    if fmt == "tokens":
        return [{k: v for k, v in {"ts": r.ts, "tenant": r.tenant, "session": r.session, "prompt_cache_key": r.key,
                                   "tokens": r.tokens, "output_tokens": r.output}.items() if v is not None}
                for r in random_requests(SEED, 300)]
    path = SHARED / "mooncake" / "conversation_trace.jsonl"
    if path.exists():
        with path.open() as fh:
            return [json.loads(next(fh)) for _ in range(300)]
    return [{"timestamp": 10 * i, "input_length": 1100 + i, "output_length": 9, "hash_ids": [0, i % 7, i]}
            for i in range(300)]


def _trajectory_seeds() -> list[dict]:
    docs = []
    for path in sorted((SHARED / "mini-swe-agent-deepseek").glob("*/*.traj.json.gz"))[:12]:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        msgs = [_shrink(m, 60) for m in doc["messages"][:80]]
        if any(m.get("role") == "assistant" for m in msgs):
            docs.append({**doc, "info": {}, "messages": msgs})
    if not docs:  # the shared data absent: the same shape, made up
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "task " + CANARY}]
        for i in range(60):
            msgs.append({"role": "assistant", "content": f"step {i}", "extra": {"response": {
                "created": 1775784986 + i, "model": "deepseek-chat",
                "usage": {"prompt_tokens": 100 + i, "completion_tokens": 5, "prompt_cache_hit_tokens": 64}}}})
            msgs.append({"role": "tool", "content": f"output {i} {CANARY}", "tool_call_id": f"c{i}"})
        docs.append({"info": {}, "trajectory_format": "mini-swe-agent-1.1", "instance_id": "made-up", "messages": msgs})
    for doc in docs:
        _plant(doc)
    return docs


# ----------------------------------------------------------------- mutations

WEIRD = [None, True, False, 0, -1, 1.5, -0.0, 10**30, -(2**63) - 1, 2**63, 2**64 + 1, 10**400, 1e308, -5e-324,
         math.nan, math.inf, -math.inf, "", " ", CANARY, "\ud800" + CANARY, "\x00" + CANARY, "1e20",
         "9999-12-31T23:59:59Z", [], [CANARY], [None], [[[]]], {}, {"x": CANARY}, {"messages": CANARY}]
# timestamps and whether a line holding one loads in any time unit ("load"), never ("reject"), or either
TIMES = [(0, "load"), (-1, "load"), (-1.5, "load"), (1, "load"), (-10**12, "load"), (253402300800, "load"),
         ("9999-12-31T23:59:59.999999Z", "load"), ("0001-01-01T00:00:00", "load"), ("-1", "load"),
         ("1970-01-01T00:00:00+14:00", "load"), (4e18, "any"), (253402300800000, "any"),
         (1e20, "reject"), (1e300, "reject"), (10**30, "reject"), (-(2**63) - 1, "reject"), (2**62, "reject"),
         (10**400, "reject"), (math.nan, "reject"), (math.inf, "reject"), (-math.inf, "reject"),
         ("10000-01-01T00:00:00Z", "reject"), ("1e20", "reject"), ("nan", "reject"), ("", "reject"),
         ("  ", "reject"), ("2025-13-45T99:00:00Z", "reject"), (True, "reject"), (None, "reject"), ([0], "reject"),
         ({"s": 1}, "reject")]
TS_REASONS = frozenset({"bad_timestamp", "missing_timestamp"})
BLANKS = [b"", b" ", b"\t", b"\r", b" \t\r ", b"\t\t  "]
GARBAGE = [b"x", b"}", b"]", b",", b"{}", b"\x00", b" trailing", b"//", b"\xff\xfe", b'"', b"null", b"\x1a"]
BAD_UTF8 = [b"\xff", b"\xfe", b"\xc3\x28", b"\xa0\xa1", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xc0\xaf"]
CLASSES = {"wrong": 24, "delete": 8, "ts": 12, "truncate": 20, "utf8": 6, "bom": 3, "crlf": 3, "blank": 3,
           "garbage": 6, "not_object": 5, "deep": 2, "dupkey": 3, "surrogate": 5}

_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:')
_STR = re.compile(rb'[:,\[]\s*"((?:[^"\\]|\\.)*)"(?!\s*:)')
_COLON = re.compile(rb'":\s*')
_NUM = re.compile(rb'[:,\[]\s*(-?[0-9][0-9.eE+-]*)')


_PATHS: dict[int, tuple[object, list[tuple]]] = {}


def _paths(v) -> list[tuple]:
    """Paths to every value inside ``v`` (not ``v`` itself); remembered for the seeds, which
    are never changed (mutations copy the containers on their path: :func:`_with`)."""
    hit = _PATHS.get(id(v))
    if hit is not None and hit[0] is v:
        return hit[1]
    out, stack = [], [(v, ())]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, x in items:
            out.append(path + (k,))
            stack.append((x, path + (k,)))
    _PATHS[id(v)] = (v, out)
    return out


_DELETE = object()


def _with(v, path: tuple, value=_DELETE):
    """``v`` with the value at ``path`` replaced (or deleted), ``v`` itself unchanged."""
    root = cur = copy.copy(v)
    for k in path[:-1]:
        cur[k] = copy.copy(cur[k])
        cur = cur[k]
    if value is _DELETE:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return root


def _dump(rng: random.Random, rec) -> bytes:
    text = json.dumps(rec, ensure_ascii=rng.random() < 0.5, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate unescaped: invalid UTF-8


def _nested_points(b: bytes) -> list[int]:
    """Offsets just inside an array nested at least two levels in (strings skipped)."""
    out, depth, in_str, esc = [], 0, False, False
    for i, c in enumerate(b[:3000]):
        if in_str:
            esc, in_str = (False, in_str) if esc else (c == 92, c != 34)
        elif c == 34:
            in_str = True
        elif c in (91, 123):
            depth += 1
            if c == 91 and depth >= 3:
                out.append(i + 1)
        elif c in (93, 125):
            depth -= 1
    return out


def _cut(rng: random.Random, b: bytes) -> tuple[int, str]:
    """An offset to truncate at, and its position class."""
    where = rng.choice(["key", "string", "colon", "number", "nested", "random", "random"])
    if where == "key":
        points = [rng.randint(*m.span(1)) for m in _KEY.finditer(b, 0, 4000)]
    elif where == "string":
        points = [rng.randint(*m.span(1)) for m in _STR.finditer(b, 0, 4000)]
    elif where == "colon":
        points = [m.end() for m in _COLON.finditer(b, 0, 4000)]
    elif where == "number":
        points = [rng.randint(m.start(1) + 1, m.end(1)) for m in _NUM.finditer(b, 0, 4000)]
    elif where == "nested":
        points = _nested_points(b)
    else:
        points = []
    points = [p for p in points if p < len(b)]
    return (rng.choice(points), where) if points else (rng.randrange(len(b)), "random")


def mutate(rng: random.Random, rec: dict, ts_key: str | None, cls: str) -> tuple[bytes, frozenset | None]:
    """A line of ``cls`` made from the valid record ``rec``, and its possible outcomes
    ("load" or reject reasons; None: any outcome, as long as it is accounted for)."""
    if cls == "wrong":
        return _dump(rng, _with(rec, rng.choice(_paths(rec)), rng.choice(WEIRD))), None
    if cls == "delete":
        return _dump(rng, _with(rec, rng.choice(_paths(rec)))), None
    if cls == "ts":
        value, outcome = rng.choice(TIMES)
        return _dump(rng, {**rec, ts_key: value}), {"load": LOAD, "reject": TS_REASONS, "any": LOAD | TS_REASONS}[outcome]
    b = _dump(rng, rec)
    if cls == "truncate":
        at, _ = _cut(rng, b)
        return b[:at], frozenset({"malformed_json", "blank_line"})
    if cls == "utf8":
        ascii_at = [i for i in range(1, min(len(b), 2000)) if b[i] < 128 and b[i - 1] < 128]
        at = rng.choice(ascii_at)
        return b[:at] + rng.choice(BAD_UTF8) + b[at:], frozenset({"malformed_json"})
    if cls == "bom":
        return b"\xef\xbb\xbf" + b, LOAD
    if cls == "crlf":
        return b + rng.choice([b"\r", b" \t\r", b"  "]), LOAD
    if cls == "blank":
        return rng.choice(BLANKS), frozenset({"blank_line"})
    if cls == "garbage":
        return b + rng.choice(GARBAGE), frozenset({"malformed_json"})
    if cls == "not_object":
        return rng.choice([b"[" + b + b"]", json.dumps(b.decode("utf-8", "replace")).encode(), b"42", b"-1.5e400",
                           b"null", b"true", b"[]", b'"' + CANARY.encode() + b'"', b"[" + b + b"," + b + b"]",
                           b"1e999999"]), frozenset({"wrong_type"})
    if cls == "deep":
        d = rng.choice([50, 300, 950, 1200, 100_000])
        nest = b"[" * d + b"]" * d if rng.random() < 0.5 else b'{"a":' * d + b"1" + b"}" * d
        at = b.find(b'"request": {')
        if at >= 0:
            at += len(b'"request": {')
            return b[:at] + b'"deep": ' + nest + b", " + b[at:], None
        return b[:-1] + b', "deep": ' + nest + b"}", None
    if cls == "dupkey":
        return b[:-1] + b', "' + ts_key.encode() + b'": "not a time ' + CANARY.encode() + b'"}', \
            frozenset({"bad_timestamp"})
    if cls == "surrogate":  # a lone surrogate escaped: valid JSON, a string Python holds but UTF-8 cannot
        spans = [m.span(1) for m in _STR.finditer(b, 0, 4000) if m.end(1) > m.start(1)]
        if spans:
            s, e = rng.choice(spans)
            at = rng.randint(s, e)
            if b[at - 1:at] != b"\\":
                return b[:at] + rng.choice([b"\\ud800", b"\\udfff", b"\\udbff\\udbff"]) + b[at:], None
        return b, LOAD
    raise AssertionError(cls)


def fuzz_lines(rng: random.Random, seeds: list[dict], ts_key: str, n: int) -> list[tuple[bytes, str, frozenset | None]]:
    """``n`` mutated lines and about n/10 intact ones, shuffled: (line, class, outcomes)."""
    names, weights = zip(*CLASSES.items())
    out = []
    for _ in range(n):
        cls = rng.choices(names, weights)[0]
        line, outcomes = mutate(rng, rng.choice(seeds), ts_key, cls)
        out.append((line, cls, outcomes))
    for _ in range(n // 10):
        out.append((_dump(rng, rng.choice(seeds)), "intact", LOAD))
    rng.shuffle(out)
    return out


def write_lines(path: Path, lines: list[tuple[bytes, str, frozenset | None]]) -> Path:
    data = b"".join(line + b"\n" for line, _, _ in lines)
    assert data.count(b"\n") == len(lines)  # no line holds a newline of its own
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=1)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor(level=1).compress(data)
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------- checks


def outcomes_by_file(con) -> dict[str, dict[int | None, list[tuple[str, str | None]]]]:
    """path → line number → [(outcome, detail)]: "load" or the reject reason."""
    out: dict = {}
    sids = dict(con.execute("SELECT source_id, path FROM sources").fetchall())
    for sid, ln in con.execute("SELECT source_id, line_no FROM requests").fetchall():
        out.setdefault(sids[sid], {}).setdefault(ln, []).append(("load", None))
    for sid, path, ln, reason, detail in con.execute(
            "SELECT source_id, path, line_no, reason, detail FROM rejects").fetchall():
        assert sid is None or sids[sid] == path
        out.setdefault(path, {}).setdefault(ln, []).append((reason, detail))
    return out


def check_accounted(con, written: dict[str, list[tuple[bytes, str, frozenset | None]]]) -> Counter:
    """Every line of every file loaded or rejected exactly once, as expected; the
    outcomes counted by class and outcome."""
    sources = {p: (ln, lo, rj) for p, ln, lo, rj in con.execute("SELECT path, lines, loaded, rejected FROM sources")
               .fetchall()}
    got = outcomes_by_file(con)
    seen: Counter = Counter()
    for path, lines in written.items():
        n, loaded, rejected = sources[path]
        assert n == len(lines) == loaded + rejected, path  # no line lost, none counted twice
        by_line = got.get(path, {})
        assert sorted(by_line) == list(range(1, n + 1)), path
        assert sum(o == "load" for outs in by_line.values() for o, _ in outs) == loaded
        for ln, (line, cls, expected) in enumerate(lines, 1):
            [(outcome, detail)] = by_line[ln]
            seen[cls, outcome] += 1
            if outcome != "load":
                assert outcome in REASONS and detail, (path, ln, outcome)
                assert CANARY not in detail and "not a time" not in detail, (path, ln, detail)
            if expected is not None:
                assert outcome in expected, (path, ln, cls, outcome, detail, line[:300])
    return seen


def check_rerun_and_sweep(con, paths: list[str]) -> None:
    before = con.execute("SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM rejects)").fetchone()
    again = ingest(con, paths)
    assert (again.files, again.skipped_files, again.lines, again.loaded, again.rejected) == (len(paths), len(paths),
                                                                                              0, 0, 0)
    assert con.execute("SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM rejects)").fetchone() == before
    # every body reads back whole: no blob it lists is missing, and its text is JSON
    assert con.execute("SELECT count(*) FROM (SELECT unnest(body_blobs) AS blob_id FROM requests) "
                       "WHERE blob_id NOT IN (SELECT blob_id FROM blobs)").fetchone()[0] == 0
    ids = [i for (i,) in con.execute("SELECT request_id FROM requests ORDER BY request_id").fetchall()]
    for rid in ids[::max(1, len(ids) // 60)]:  # (a sample: trajectories' bodies are large)
        fmt, body = con.execute(
            "SELECT format, coalesce(body, (SELECT string_agg(b.text, '' ORDER BY e.i) FROM "
            "(SELECT unnest(body_blobs) AS blob_id, unnest(generate_series(1, len(body_blobs))) AS i "
            " FROM requests WHERE request_id = $1) e JOIN blobs b USING (blob_id))) "
            "FROM requests WHERE request_id = $1", [rid]).fetchone()
        assert (body is None) == (fmt in ("tokens", "mooncake")), fmt
        try:
            json.loads(body or "null")
        except RecursionError:
            pass  # (nested deeper than this test's stack allows)
    n = before[0]
    rows = api.sweep(con, GRID).to_dicts()
    assert len(rows) == GRID.size
    aside = con.execute("SELECT count(*) FROM set_aside").fetchone()[0]
    for r in rows:
        assert r["requests"] == n - aside > 0, r
        assert 0 <= r["hit_tokens"] <= r["prompt_tokens"]


# ----------------------------------------------------------------- the line formats


@pytest.mark.parametrize("fmt", ["anthropic", "openai", "tokens", "mooncake"])
def test_fuzz_line_format(tmp_path, fmt):
    rng = random.Random(f"{SEED}-{fmt}")
    seeds = _seeds(fmt)
    con = db.connect(tmp_path / "fuzz.duckdb")
    # every seed loads as it is: what the mutations start from is valid
    intact = [(_dump(rng, r), "seed", LOAD) for r in seeds]
    lines = fuzz_lines(rng, seeds, TS_KEY[fmt], N_LINES)
    # four files: plain, gzip, zstd, each opening with intact lines; and JSON Lines named .json
    # opening with whatever came first (its format detected from the records that follow)
    written = {}
    for i, name in enumerate(("a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.json")):
        part = (intact[:3] if i < 3 else []) + lines[i::4]
        written[str(write_lines(tmp_path / name, part))] = part
    written[str(write_lines(tmp_path / "seeds.jsonl", intact))] = intact
    s = ingest(con, list(written))
    assert s.reconciles() and s.lines == sum(map(len, written.values()))
    seen = check_accounted(con, written)
    assert {f for (f,) in con.execute("SELECT DISTINCT format FROM requests").fetchall()} == {fmt}
    tried = sum(n for (cls, _), n in seen.items() if cls not in ("intact", "seed"))
    assert tried >= N_LINES
    # the mutations did what they meant to: each class was drawn, and most rejected where they must be
    assert {cls for cls, _ in seen} >= set(CLASSES)
    assert seen["truncate", "malformed_json"] > N_LINES // 10
    check_rerun_and_sweep(con, list(written))
    print(f"\n{fmt}: {tried} malformed lines tried; outcomes {dict(sorted(seen.items()))}")


def test_fuzz_mixed_formats_in_one_file_and_the_cli(tmp_path):
    """Lines of every format, intact and mutated, in one file; then the command line on it."""
    rng = random.Random(f"{SEED}-mixed")
    lines = []
    for fmt in TS_KEY:
        lines += fuzz_lines(rng, _seeds(fmt), TS_KEY[fmt], max(N_LINES // 20, 200))
    # (not the lines nested nearly as deep as Python's recursion limit: whether they parse
    # depends on how deep in the stack the parser is called, here and in the command)
    lines = [x for x in lines if x[1] != "deep"]
    rng.shuffle(lines)
    mixed = write_lines(tmp_path / "mixed.jsonl", [(b, cls, None) for b, cls, _ in lines])
    con = db.connect(tmp_path / "api.duckdb")
    s = ingest(con, [str(mixed)])
    check_accounted(con, {str(mixed): [(b, cls, None) for b, cls, _ in lines]})
    assert s.loaded > 0
    con.close()

    dead_lines = [(b, cls, None) for b, cls, exp in lines if exp is not None and "load" not in exp][:500]
    dead = write_lines(tmp_path / "dead.jsonl", dead_lines)

    def cli(*paths):
        res = subprocess.run([sys.executable, "-m", "replay.cli.main", "ingest", *map(str, paths),
                              "--db", str(tmp_path / "cli.duckdb"), "--json"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert "Traceback" not in res.stdout + res.stderr, res.stderr
        return res.returncode, json.loads(res.stdout)

    code, got = cli(mixed)
    assert code == 0
    assert (got["files"], got["lines"], got["loaded"], got["rejected"]) == (1, len(lines), s.loaded, s.rejected)
    assert got["by_reason"] == s.rejected_by_reason
    code, got = cli(dead)  # nothing loadable: the job failed, the summary still printed
    assert code == 1
    assert got["loaded"] == 0 and got["lines"] == got["rejected"] == len(dead_lines) > 100


def test_every_format_forced_on_fuzzed_lines(tmp_path):
    """Each format ingest knows (FORMATS, whatever it holds), forced on fuzzed lines of every
    format and on a trajectory: every unit accounted for, no exception, reasons as codes."""
    rng = random.Random(f"{SEED}-forced")
    lines = []
    for fmt in TS_KEY:
        lines += fuzz_lines(rng, _seeds(fmt), TS_KEY[fmt], max(N_LINES // 40, 100))
    rng.shuffle(lines)
    paths = [str(write_lines(tmp_path / "mixed.jsonl", lines))]
    doc = tmp_path / "t.traj.json"
    doc.write_bytes(_dump_doc(_trajectory_seeds()[0]))
    paths.append(str(doc))
    for fmt in FORMATS:
        con = db.connect(None)
        s = ingest(con, paths, format=fmt)
        assert s.reconciles() and s.files == 2, fmt
        src = {p: (n, c) for p, n, c in con.execute("SELECT path, lines, coalesce(context, 0) FROM sources").fetchall()}
        for path, by_line in outcomes_by_file(con).items():
            n, context = src[path]
            # every line loaded or rejected once, but the lines of a session file that are context
            assert (sorted(by_line, key=lambda i: i or 0) == [None]
                    or (set(by_line) <= set(range(1, n + 1)) and len(by_line) == n - context)), (fmt, path)
            for outs in by_line.values():
                [(outcome, detail)] = outs
                assert outcome == "load" or re.fullmatch("[a-z_]+", outcome) and detail, (fmt, outcome)
                assert CANARY not in (detail or ""), (fmt, detail)
        con.close()


# ----------------------------------------------------------------- trajectories (whole documents)


def _assistant_turns(doc) -> list[int]:
    msgs = doc.get("messages") if isinstance(doc, dict) else None
    return [i for i, m in enumerate(msgs or ()) if isinstance(m, dict) and m.get("role") == "assistant"]


def _dump_doc(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()  # (ASCII: a whole document is not valid UTF-8 or is)


def test_fuzz_trajectory(tmp_path):
    """Mutated messages inside trajectory documents (each assistant turn is one unit),
    and whole documents damaged as text."""
    rng = random.Random(f"{SEED}-trajectory")
    seeds = _trajectory_seeds()
    written: dict[str, list] = {}
    tried = 0
    k = 0
    names, weights = zip(*((c, w) for c, w in CLASSES.items() if c in ("wrong", "delete", "ts")))
    while tried < N_LINES:
        doc = rng.choice(seeds)
        doc = {**doc, "messages": list(doc["messages"])}
        mutated = set()
        for j, m in enumerate(doc["messages"]):
            if rng.random() < 0.9:
                cls = rng.choices(names, weights)[0]
                extra = m.get("extra") if isinstance(m, dict) else None
                if cls == "ts" and isinstance(extra, dict):
                    where = ("extra", "response", "created") if isinstance(extra.get("response"), dict) \
                        else ("extra", "timestamp")
                    doc["messages"][j] = _with(m, where, rng.choice(TIMES)[0])
                else:
                    path = rng.choice([()] + _paths(m))
                    if not path:
                        doc["messages"][j] = rng.choice(WEIRD)
                    elif cls == "delete":  # (inside a message: whole ones stay, the turns keep their places)
                        doc["messages"][j] = _with(m, path)
                    else:
                        doc["messages"][j] = _with(m, path, rng.choice(WEIRD))
                mutated.add(j)
        turns = _assistant_turns(doc)
        tried += sum(j in mutated for j in turns)
        name = rng.choice(["t{}.traj.json", "t{}.traj.json.gz", "t{}.traj.json.zst", "t{}.json"]).format(k)
        k += 1
        units = [(b"", "wrong" if j in mutated else "intact", None if j in mutated else LOAD) for j in turns]
        data = _dump_doc(doc)
        path = tmp_path / name
        path.write_bytes(gzip.compress(data, 1) if name.endswith(".gz") else
                         zstandard.ZstdCompressor(level=1).compress(data) if name.endswith(".zst") else data)
        written[str(path)] = units
    # whole documents damaged as text: one unit, rejected for the reason given (None: as intact)
    docs: dict[str, tuple[bytes, str | None]] = {}
    contents: set[bytes] = set()
    for i in range(max(40, N_LINES // 250)):
        doc = rng.choice(seeds)
        b = _dump_doc(doc)
        cls = rng.choice(["truncate", "utf8", "bom", "crlf", "garbage", "not_object", "deep", "empty"])
        if cls == "truncate":
            b, reason = b[:_cut(rng, b)[0]], "malformed_json"
        elif cls == "utf8":
            b, reason = b[:40] + rng.choice(BAD_UTF8) + b[40:], "malformed_json"
        elif cls == "bom":
            b, reason = b"\xef\xbb\xbf" + b, None
        elif cls == "crlf":
            b, reason = json.dumps(doc, indent=1).replace("\n", "\r\n").encode(), None
        elif cls == "garbage":
            b, reason = b + rng.choice(GARBAGE), "malformed_json"
        elif cls == "not_object":
            b, reason = rng.choice([b"[" + b + b"]", json.dumps(b.decode()).encode(), b"42", b"null"]), "wrong_type"
        elif cls == "deep":
            b, reason = rng.choice([b"[" * 100_000, b'{"a":' * 100_000, b"[" * 100_000 + b"]" * 100_000]), \
                "malformed_json"
        else:
            b, reason = rng.choice([b"", b" \r\n\t"]), "malformed_json"
        if b in contents:
            continue  # the same bytes again would be skipped as ingested already
        contents.add(b)
        path = tmp_path / f"d{i}-{cls}.traj.json"
        path.write_bytes(b)
        docs[str(path)] = (b, reason)
        if reason is None:
            written[str(path)] = [(b"", cls, LOAD) for _ in _assistant_turns(doc)]
        else:
            tried += 1
    con = db.connect(None)  # (in memory: one commit a file, hundreds of files)
    s = ingest(con, [str(tmp_path)])
    assert s.reconciles() and s.files == len(written) + sum(r is not None for _, r in docs.values())
    check_accounted(con, written)
    got = outcomes_by_file(con)
    for path, (b, reason) in docs.items():
        if reason is not None:
            assert got[path] == {None: [(reason, got[path][None][0][1])]}, (path, got[path])
            assert CANARY not in got[path][None][0][1]
    assert con.execute("SELECT count(DISTINCT format) FROM sources WHERE lines > 0").fetchone()[0] == 1
    check_rerun_and_sweep(con, files.expand_paths([tmp_path]))
    print(f"\ntrajectory: {tried} malformed turns and documents tried in {len(written) + len(docs)} files")


# ----------------------------------------------------------------- special cases


def _ingest_one(tmp_path, name: str, data: bytes, **kw):
    path = tmp_path / name
    path.write_bytes(data)
    con = db.connect(None)
    s = ingest(con, [str(path)], **kw)
    assert s.reconciles()
    got = outcomes_by_file(con).get(str(path), {})
    return s, got, con


def test_deeply_nested_json(tmp_path):
    """10^5 levels of `[` and of `{"a":`, in a line, as a trajectory and as a .json document:
    rejected, never a RecursionError; nesting within reach of the stack loads and replays."""
    deep = 100_000
    chat_rec = json.dumps({"timestamp": 1, "tenant": "t", "request": {"model": "m", "messages": [
        {"role": "user", "content": "hello " + CANARY}]}}).encode()
    lines = [b"[" * deep, b"[" * deep + b"]" * deep, b'{"a":' * deep, b'{"a":' * deep + b"1" + b"}" * deep,
             chat_rec[:-2] + b', "x": ' + b"[" * deep + b"]" * deep + b"}}",
             chat_rec.replace(b'"hello ', b'[' * deep + b'"hello ')]
    s, got, _ = _ingest_one(tmp_path, "deep.jsonl", b"\n".join([chat_rec] + lines) + b"\n")
    assert (s.lines, s.loaded) == (7, 1)
    assert all(got[i][0][0] == "malformed_json" for i in range(2, 8)), got
    for name in ("deep.traj.json", "deep.json", "deep.traj.json.gz"):
        for doc in (b"[" * deep + b"]" * deep, b'{"messages": ' + b'{"a":' * deep + b"1" + b"}" * deep + b"}",
                    b'{"trajectory_format": "x", "messages": [' + b"[" * deep + b"]" * deep + b"]}"):
            s, got, _ = _ingest_one(tmp_path, name, gzip.compress(doc) if name.endswith(".gz") else doc)
            assert (s.lines, s.rejected, list(got)) == (1, 1, [None])
            assert got[None][0][0] == "malformed_json"
    # nested as deep as the stack allows: loaded or refused as too deep, and the rest replays
    con = db.connect(tmp_path / "x.duckdb")
    recs = [chat_rec[:-4] + b', "x": ' + b"[" * d + b'"' + CANARY.encode() + b'"' + b"]" * d + b"}]}}"
            for d in (10, 100, 400, 700, 900, 960, 990, 1000, 1100)]
    path = tmp_path / "nearly.jsonl"
    path.write_bytes(b"\n".join([chat_rec] + recs) + b"\n")
    s = ingest(con, [str(path)])
    assert s.lines == 10 and s.reconciles() and s.loaded >= 4  # (the first ones are shallow)
    assert set(s.rejected_by_reason) <= {"malformed_json", "too_large"}
    for (detail,) in con.execute("SELECT detail FROM rejects").fetchall():
        assert CANARY not in detail
    assert api.sweep(con, GRID).height == GRID.size


def test_nested_just_too_deep_to_store_is_a_reject_not_a_crash(tmp_path):
    """Nesting the parser takes but the serializer, deeper in the stack, refuses
    (RecursionError): that line or turn is rejected as too large. Depths are tried
    one by one across the limit, so some land in between."""
    limit = sys.getrecursionlimit()  # (the parser and the serializer share it)
    depths = range(limit - 300, limit)
    lines = [json.dumps({"timestamp": d, "tenant": "t", "request": {"messages": [
        {"role": "user", "content": "x"}]}}).encode()[:-4] + b', "x": ' + b"[" * d + b"]" * d + b"}]}}"
        for d in depths]
    s, got, con = _ingest_one(tmp_path, "d.jsonl", b"\n".join(lines))
    outcomes = [got[i][0][0] for i in range(1, len(lines) + 1)]
    assert s.lines == len(lines) and set(outcomes) == {"load", "too_large", "malformed_json"}, Counter(outcomes)
    # deeper never does better: loaded, then too deep to store, then too deep to parse
    assert outcomes == sorted(outcomes, key=["load", "too_large", "malformed_json"].index)
    assert con.execute("SELECT list(request_id ORDER BY request_id) = range(1, count(*) + 1) FROM requests"
                       ).fetchone()[0]  # (ids stay dense: a refused row takes none)
    # a trajectory whose assistant turn nests so: that turn or the later ones (their bodies hold it)
    paths = {}
    for d in range(limit - 300, limit, 3):
        doc = {"trajectory_format": "x", "messages": [
            {"role": "user", "content": "task"}, {"role": "assistant", "content": "a", "extra": {"timestamp": 1}},
            {"role": "assistant", "content": "DEEP", "extra": {"timestamp": 2}},
            {"role": "assistant", "content": "b", "extra": {"timestamp": 3}}]}
        paths[d] = tmp_path / f"t{d}.traj.json"
        paths[d].write_text(json.dumps(doc).replace('"DEEP"', "[" * d + "]" * d))
    con = db.connect(None)
    assert ingest(con, [str(p) for p in paths.values()]).reconciles()
    by_file = outcomes_by_file(con)
    found = set()
    for d, path in paths.items():
        got = by_file[str(path)]
        turns = tuple(got[i][0][0] for i in sorted(got, key=lambda i: i or 0))
        assert turns in (("load",) * 3, ("load", "load", "too_large"), ("load", "too_large", "too_large"),
                         ("malformed_json",)), (d, turns)
        found.add(turns)
    assert any("too_large" in t for t in found), found


GIANT = 100 << 20


def test_a_100_mb_line_is_rejected_in_bounded_memory(tmp_path):
    """One line of 100 MB between two good ones (plain and zstd): rejected as too large, the
    other lines loaded, and the Python heap's peak grows by less than half the line — the
    reader never holds it whole, let alone parses it (which takes several times its size)."""
    import tracemalloc

    good = [json.dumps({"ts": i, "tenant": "t", "tokens": [1, 2, 3]}).encode() for i in range(4)]
    head = b'{"timestamp": 1, "tenant": "t", "request": {"messages": [{"role": "user", "content": "'
    giant = tmp_path / "giant.jsonl"
    chunk = (CANARY.encode() + b" ") * (1 << 16)
    with giant.open("wb") as fh:
        fh.write(good[0] + b"\n" + head)
        for _ in range(GIANT // len(chunk)):
            fh.write(chunk)
        fh.write(b'"}]}}\n' + good[1] + b"\n")
    line_size = giant.stat().st_size - len(good[0]) - len(good[1]) - 2
    assert line_size > GIANT - len(chunk)
    zst = tmp_path / "giant.jsonl.zst"  # the same, compressed: a bomb of a few hundred KB
    with giant.open("rb") as src, zst.open("wb") as dst:
        zstandard.ZstdCompressor(level=1).copy_stream(src, dst)
    assert zst.stat().st_size < GIANT // 50
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"\n".join(good[2:]) + b"\n")

    peaks = {}
    tracemalloc.start()
    try:
        for path in (small, giant, zst):
            con = db.connect(None)
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            s = ingest(con, [str(path)])
            peaks[path.name] = tracemalloc.get_traced_memory()[1] - base
            assert s.reconciles() and s.loaded == 2
            assert s.lines == 2 or (s.lines, s.rejected_by_reason) == (3, {"too_large": 1})
            con.close()
    finally:
        tracemalloc.stop()
    print(f"\nheap peak while ingesting: {peaks['small.jsonl'] >> 20} MB for a small file, "
          f"{peaks['giant.jsonl'] >> 20} MB with a line of {line_size >> 20} MB (zstd: "
          f"{peaks['giant.jsonl.zst'] >> 20} MB; the cap on a line: {files.MAX_LINE_BYTES >> 20} MB)")
    for name in ("giant.jsonl", "giant.jsonl.zst"):
        assert peaks[name] - peaks["small.jsonl"] < line_size // 2, name

    # the command line on it: success, the summary, no traceback; the later stages run on what loaded
    res = subprocess.run([sys.executable, "-m", "replay.cli.main", "ingest", str(giant), "--db",
                          str(tmp_path / "g.duckdb"), "--json"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=600)
    assert res.returncode == 0 and "Traceback" not in res.stdout + res.stderr, res.stderr
    got = json.loads(res.stdout)
    assert (got["lines"], got["loaded"], got["rejected"], got["by_reason"]) == (3, 2, 1, {"too_large": 1})
    con = db.connect(tmp_path / "g.duckdb")
    (detail,) = con.execute("SELECT detail FROM rejects").fetchone()
    assert CANARY not in detail and "longer than" in detail
    assert api.sweep(con, GRID).height == GRID.size


def test_the_caps_on_lines_and_lists(tmp_path, monkeypatch):
    """Just under a cap loads; just over is rejected as too large (caps made small here)."""
    monkeypatch.setattr(files, "MAX_LINE_BYTES", 200)
    pad = lambda n: json.dumps({"ts": 1, "tenant": "t", "tokens": [1], "p": "x" * n}).encode()  # noqa: E731
    n0 = 200 - len(pad(0)) - 1  # a line of exactly 200 bytes with its newline
    lines = [pad(n0), pad(n0 + 1), pad(n0 - 1), pad(5000), pad(3 << 20), pad(0)]
    data = b"\n".join(lines)  # (the last line without a newline: 199 bytes, loads)
    for name in ("cap.jsonl", "cap.jsonl.gz", "cap.jsonl.zst"):
        raw = data + (b"x" if "gz" in name else b"")  # (other content: not skipped as ingested)
        blob = gzip.compress(raw) if name.endswith(".gz") else \
            zstandard.ZstdCompressor().compress(raw) if name.endswith(".zst") else raw
        s, got, _ = _ingest_one(tmp_path, name, blob)
        outcomes = [got[i][0][0] for i in range(1, 7)]
        assert outcomes[:5] == ["load", "too_large", "load", "too_large", "too_large"], (name, outcomes)
        assert got[5][0][1].startswith(f"line of {len(lines[4]) + 1:,} bytes")
    monkeypatch.setattr(traces, "MAX_LIST_ITEMS", 8)
    monkeypatch.setattr(chat, "MAX_LIST_ITEMS", 8)
    msg = {"role": "user", "content": "x"}
    recs = [{"ts": 1, "tenant": "t", "tokens": list(range(8))}, {"ts": 1, "tenant": "t", "tokens": list(range(9))},
            {"ts": 1, "tenant": "t", "tokens": [1], "output_tokens": list(range(9))},
            {"timestamp": 1, "hash_ids": list(range(9)), "input_length": 9}]
    s, got, _ = _ingest_one(tmp_path, "lists.jsonl", "\n".join(map(json.dumps, recs)).encode(), format="tokens")
    assert [got[i][0][0] for i in range(1, 5)] == ["load", "too_large", "too_large", "no_prompt"]
    s, got, _ = _ingest_one(tmp_path, "moon.jsonl", json.dumps(recs[3]).encode())
    assert got[1][0][0] == "too_large"
    chats = [{"timestamp": 1, "request": {"messages": [msg] * 4}},
             {"timestamp": 1, "request": {"messages": [msg] * 3, "tools": [{"name": "t"}, {"name": "u"}]}}]
    s, got, _ = _ingest_one(tmp_path, "chat.jsonl", "\n".join(map(json.dumps, chats)).encode())
    assert [got[1][0][0], got[2][0][0]] == ["load", "too_large"]


def test_mooncake_lengths_that_contradict_the_blocks(tmp_path):
    """An input_length the blocks before the last already exceed is rejected: the replay
    would count more hit tokens than the prompt has."""
    recs = [(1, [7], "load"), (513, [7, 8], "load"), (512, [7, 8], "bad_length"), (0, [7, 8, 9], "bad_length"),
            (5000, [7, 8], "load"), (0, [], "load"), (0, [7], "load")]
    lines = [json.dumps({"timestamp": i, "input_length": n, "hash_ids": ids}) for i, (n, ids, _) in enumerate(recs)]
    s, got, con = _ingest_one(tmp_path, "m.jsonl", "\n".join(lines).encode())
    assert [got[i][0][0] for i in range(1, len(recs) + 1)] == [e for _, _, e in recs]
    for r in api.sweep(con, Grid(ttls=(math.inf,), blocks=(512,), min_prefixes=(0,), streams=("global",))).to_dicts():
        assert r["hit_tokens"] <= r["prompt_tokens"], r


def test_long_lists_count_toward_a_batch(tmp_path, monkeypatch):
    """A batch of rows is inserted once its lists (not only its texts) reach the batch size."""
    from replay.readers import writer

    monkeypatch.setattr(writer, "BATCH_BYTES", 8 * 1000)
    sizes = []
    real = writer.Writer._flush_requests

    def flush(self):
        sizes.append(self.n_req)
        real(self)

    monkeypatch.setattr(writer.Writer, "_flush_requests", flush)
    recs = [{"ts": i, "tenant": "t", "tokens": list(range(500))} for i in range(10)]
    s, _, con = _ingest_one(tmp_path, "l.jsonl", "\n".join(map(json.dumps, recs)).encode())
    assert s.loaded == 10 and 0 < max(sizes) <= 2, sizes
    assert con.execute("SELECT sum(len(tokens)) FROM requests").fetchone()[0] == 5000


def test_timestamp_extremes_load_or_reject_and_replay(tmp_path):
    """Negative, zero, far-future and out-of-range timestamps: each loaded or rejected as a bad
    timestamp, never an overflow; the sweep then runs on times ±2**62 µs apart."""
    vals = [(0, "load"), (-1, "load"), (2**62 - 1, "load"), (-(2**62 - 1), "load"),
            ("9999-12-31T23:59:59.999999Z", "load"), ("0001-01-01T00:00:00Z", "load"), (2**62, "bad_timestamp"),
            (-(2**62), "bad_timestamp"), (2**63, "bad_timestamp"), (-(2**63) - 1, "bad_timestamp"),
            (10**30, "bad_timestamp"), (10**400, "bad_timestamp"), (1e20, "bad_timestamp"), (-1e300, "bad_timestamp"),
            ("1e400", "bad_timestamp"), ("-9" * 2000, "bad_timestamp")]
    lines = [json.dumps({"ts": v, "tenant": "t", "tokens": [1, 2, 3]}) for v, _ in vals]
    lines.append('{"ts": ' + "9" * 4200 + ', "tenant": "t", "tokens": [1]}')  # (an integer of 4,200 digits)
    s, got, con = _ingest_one(tmp_path, "ts.jsonl", "\n".join(lines).encode(), time_unit="us")
    assert [got[i][0][0] for i in range(1, len(lines) + 1)] == [e for _, e in vals] + ["bad_timestamp"]
    rows = api.sweep(con, GRID).to_dicts()
    assert [r["requests"] for r in rows] == [6] * GRID.size
    # mooncake (ms) and trajectories (s), with the unit of their own
    moon = [json.dumps({"timestamp": v, "hash_ids": [1], "input_length": 5}) for v in (0, -5, 4e15, 1e16, 10**30)]
    s, got, _ = _ingest_one(tmp_path, "m.jsonl", "\n".join(moon).encode())
    assert [got[i][0][0] for i in range(1, 6)] == ["load", "load", "load", "bad_timestamp", "bad_timestamp"]
    doc = {"trajectory_format": "x", "messages": [{"role": "user", "content": "u"}] + [
        {"role": "assistant", "content": "a", "extra": {"response": {"created": v}}}
        for v in (1775784986, 0, -1, 1e20, 10**400, float("nan"))]}
    s, got, _ = _ingest_one(tmp_path, "t.traj.json", json.dumps(doc).encode())
    assert [got[i][0][0] for i in range(1, 7)] == ["load"] * 3 + ["bad_timestamp"] * 3


def _flip(data: bytes, at: int, n: int = 8) -> bytes:
    b = bytearray(data)
    for i in range(at, min(at + n, len(b))):
        b[i] ^= 0x5A
    return bytes(b)


def test_corrupt_and_truncated_compressed_files(tmp_path):
    """Damaged .gz/.zst: the whole file one `unreadable_file` reject with a clear detail (what
    was read of it dropped), or — a zstd frame without checksum, damaged inside — each line it
    decodes to accounted for; never a traceback, never lines silently missing at a cut."""
    lines = b"".join(json.dumps({"ts": i, "tenant": "t", "tokens": [i % 7, 2, 3]}).encode() + b"\n"
                     for i in range(10_000))
    gz = gzip.compress(lines)
    zs = zstandard.ZstdCompressor(write_checksum=True).compress(lines)
    # (no checksum: damage may decode to other bytes; other content, so not taken for the file above)
    zs_plain = zstandard.ZstdCompressor().compress(lines + b"\n")
    two = zstandard.ZstdCompressor().compress(lines[:1000]) + zstandard.ZstdCompressor().compress(lines[1000:])
    whole = {"gz-half.jsonl.gz": gz[: len(gz) // 2], "zst-half.jsonl.zst": zs[: len(zs) // 2],
             "zst-nochecksum-half.jsonl.zst": zs_plain[: len(zs_plain) // 2], "gz-flip.jsonl.gz": _flip(gz, len(gz) // 2),
             "zst-flip.jsonl.zst": _flip(zs, len(zs) // 2), "gz-header.jsonl.gz": gz[:12],
             "zst-header.jsonl.zst": zs[:7], "zst-magic.jsonl.zst": zs[:4], "gz-magic.jsonl.gz": gz[:2],
             "gz-garbage-after.jsonl.gz": gz + b"garbage", "zst-garbage-after.jsonl.zst": zs + b"garbage",
             "zst-two-frames-cut.jsonl.zst": two[:-5], "gz-cut.traj.json.gz": gzip.compress(b'{"messages": []}')[:-3],
             "zst-cut.json.zst": zs[: len(zs) // 3], "gz-cut.parquet.gz": gz[:100]}
    # (a cut exactly between two frames, or after a gzip member, is a shorter file that reads whole)
    fine = {"zst-two-frames.jsonl.zst": (two, 10_000), "gz-two-members.jsonl.gz": (gz + gzip.compress(b"\n"), 10_001)}
    for name, data in {**whole, **{k: v for k, (v, _) in fine.items()}}.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "zst-nochecksum-flip.jsonl.zst").write_bytes(_flip(zs_plain, len(zs_plain) // 2))
    con = db.connect(tmp_path / "c.duckdb")
    s = ingest(con, [str(tmp_path)])
    assert s.reconciles()
    src = {Path(p).name: (ln, lo, rj) for p, ln, lo, rj in
           con.execute("SELECT path, lines, loaded, rejected FROM sources").fetchall()}
    got = outcomes_by_file(con)
    for name in whole:
        assert src.get(name) == (1, 0, 1), name  # (None: skipped, as if the same as another file)
        [(reason, detail)] = got[str(tmp_path / name)][None]
        assert reason == "unreadable_file" and detail.startswith("cannot read or decompress the file"), name
    for name, (_, n) in fine.items():
        assert src[name] == (n, 10_000, n - 10_000), name
    n, loaded, rejected = src["zst-nochecksum-flip.jsonl.zst"]
    assert n == loaded + rejected and n >= 1
    assert sorted(got[str(tmp_path / "zst-nochecksum-flip.jsonl.zst")]) in ([None], list(range(1, n + 1)))
    assert api.sweep(con, GRID).height == GRID.size


def test_empty_files(tmp_path):
    """Empty files, plain and compressed, in every kind: nothing loaded, nothing lost."""
    kinds = {"e.jsonl": b"", "e.json": b"", "e.traj.json": b"", "e.parquet": b"", "e0.jsonl.gz": b"",
             "e1.jsonl.gz": gzip.compress(b""), "e2.jsonl.zst": zstandard.ZstdCompressor().compress(b""),
             "e3.json.gz": gzip.compress(b" "), "e4.jsonl": b"\n\n  \n"}
    want = {"e.jsonl": (0, 0, 0), "e.json": (1, 0, 1), "e.traj.json": (1, 0, 1), "e.parquet": (1, 0, 1),
            "e0.jsonl.gz": (0, 0, 0), "e1.jsonl.gz": (0, 0, 0), "e2.jsonl.zst": (0, 0, 0),
            "e3.json.gz": (1, 0, 1), "e4.jsonl": (3, 0, 3)}
    reasons = set()
    for name, data in kinds.items():  # (each alone: empty content is one file, however compressed or named)
        s, got, _ = _ingest_one(tmp_path, name, data)
        assert (s.lines, s.loaded, s.rejected) == want[name], name
        reasons |= {outs[0][0] for outs in got.values()}
    assert reasons == {"malformed_json", "unreadable_file", "blank_line"}
    s = ingest(db.connect(None), [str(tmp_path / k) for k in kinds])
    assert (s.files, s.skipped_files, s.loaded) == (len(kinds), len(kinds) - 3, 0)  # b"", b" ", b"\n\n  \n"
    res = subprocess.run([sys.executable, "-m", "replay.cli.main", "ingest", str(tmp_path / "e1.jsonl.gz"),
                          "--db", str(tmp_path / "cli.duckdb"), "--json"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr  # nothing could be loaded: the job failed
    assert json.loads(res.stdout)["lines"] == 0


def test_parquet_with_wrong_column_types(tmp_path):
    """Columns of the wrong type: each row loaded or rejected for its field, none lost."""
    tables = {
        "strings.parquet": pa.table({"ts": ["abc", "2025-01-01T00:00:00Z", "1e400"], "tenant": ["a", "b", "c"],
                                     "tokens": [["1", "2"], ["x"], None]}),
        "ints.parquet": pa.table({"ts": pa.array([1, -1, 2**62], pa.int64()), "tenant": [1, 2, 3],
                                  "tokens": pa.array([[1, 2**40], [3], []], pa.list_(pa.int64()))}),
        "floats.parquet": pa.table({"ts": [math.nan, math.inf, 1.5], "tenant": ["a", "b", "c"],
                                    "tokens": [[1.0, 2.5], [math.nan], [3.0]]}),
        "structs.parquet": pa.table({"ts": pa.array([1, 2], pa.timestamp("us")), "tenant": [{"x": 1}, {"x": 2}],
                                     "tokens": [{"a": [1]}, None]}),
        "binary.parquet": pa.table({"timestamp": [1, 2], "hash_ids": pa.array([b"\xff\x00", b"ok"], pa.binary()),
                                    "input_length": [1, 2]}),
        "overflow.parquet": pa.table({"ts": pa.array([10**15, 1], pa.int64()).cast(pa.timestamp("s")),
                                      "tenant": ["a", "b"], "tokens": [[1], [2]]}),  # (the year 31 million)
        "chat.parquet": pa.table({"timestamp": [1, 2, 3], "request": [
            json.dumps({"messages": [{"role": "user", "content": CANARY}]}), "not json " + CANARY, None]}),
    }
    for name, t in tables.items():
        pq.write_table(t, tmp_path / name)
    con = db.connect(tmp_path / "p.duckdb")
    s = ingest(con, [str(tmp_path)])
    assert s.reconciles() and s.loaded > 0
    src = {Path(p).name: (ln, lo, rj) for p, ln, lo, rj in
           con.execute("SELECT path, lines, loaded, rejected FROM sources").fetchall()}
    assert {k: v[0] for k, v in src.items()} == {k: t.num_rows for k, t in tables.items()}
    got = outcomes_by_file(con)
    for name, t in tables.items():
        by_line = got[str(tmp_path / name)]
        assert sorted(by_line) == list(range(1, t.num_rows + 1)), name
        for outs in by_line.values():
            assert outs[0][0] in REASONS | LOAD and CANARY not in (outs[0][1] or "")
    assert {name: [got[str(tmp_path / name)][i][0][0] for i in range(1, t.num_rows + 1)]
            for name, t in tables.items()} == {
        "strings.parquet": ["bad_timestamp", "wrong_type", "bad_timestamp"],
        "ints.parquet": ["wrong_type", "load", "bad_timestamp"],
        "floats.parquet": ["bad_timestamp", "bad_timestamp", "load"],
        "structs.parquet": ["unknown_format", "unknown_format"],
        "binary.parquet": ["unknown_format", "unknown_format"],
        "overflow.parquet": ["wrong_type", "load"],
        "chat.parquet": ["load", "wrong_type", "no_prompt"]}
    assert api.sweep(con, GRID).height == GRID.size


def test_a_json_document_that_is_an_array_of_junk(tmp_path):
    """A .json array of mixed junk: each element one unit, in order, the valid ones loaded."""
    good = {"timestamp": 1, "tenant": "t", "request": {"messages": [{"role": "user", "content": "hi " + CANARY}]}}
    junk = [good, 1, "x " + CANARY, None, [], {}, [good], {"tokens": CANARY}, math.nan, 10**400, True,
            {**good, "timestamp": "soon"}, {**good, "request": CANARY}, {**good, "timestamp": 2}, -0.0, {"a": {}}]
    text = json.dumps(junk, allow_nan=True)
    for name, data in (("junk.json", text.encode()), ("junk-bom.json.gz", gzip.compress(b"\xef\xbb\xbf" + text.encode()
                                                                                          + b"\r\n"))):
        s, got, con = _ingest_one(tmp_path, name, data)
        assert (s.lines, s.loaded) == (len(junk), 2), name
        assert sorted(got) == list(range(1, len(junk) + 1))
        assert [got[1][0][0], got[14][0][0]] == ["load", "load"]
        assert all(o[0][0] in REASONS and CANARY not in o[0][1] for i, o in got.items() if i not in (1, 14))
    s, got, _ = _ingest_one(tmp_path, "trail.json", text.encode() + b" ]")
    assert (s.lines, list(got), got[None][0][0]) == (1, [None], "malformed_json")
    # JSON Lines named .json, damaged from its first line on: read line by line all the same
    jl = b"not json\n" + json.dumps(good).encode() + b"\n\xff\xfe{}\n" + json.dumps({**good, "timestamp": 2}).encode()
    s, got, _ = _ingest_one(tmp_path, "lines.json", jl)
    assert [got[i][0][0] for i in range(1, 5)] == ["malformed_json", "load", "malformed_json", "load"]
    # but a pretty-printed document cut short is one damaged document
    pretty = json.dumps({"timestamp": 1, "request": {"messages": [{"role": "user", "content": "x"}, {}]}}, indent=2)
    s, got, _ = _ingest_one(tmp_path, "pretty.json", pretty.encode()[:-12])
    assert (s.lines, list(got), got[None][0][0]) == (1, [None], "malformed_json")
