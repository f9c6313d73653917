"""Logs and databases the tests build: a tokens-format log of generated requests,
an Anthropic-shaped log line, a log with every cache-miss cause planted beside
its clean twin, a database filled without the pipeline."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import uuid
from pathlib import Path

import pyarrow as pa

from replay.store import db
from support.conversations import conversations_log
from support.gen import US
from support.paths import ROOT

EPOCH_US = 1_700_000_000 * US


def write_tokens_log(path, reqs, unit="us"):
    """A tokens-format log of ``reqs`` (times in µs) with epoch timestamps in ``unit``:
    integers in µs, numbers of ms or s with as many decimals as the µs need."""
    with open(path, "w") as f:
        for r in reqs:
            t = EPOCH_US + r.ts
            ts = {"us": t, "ms": f"{t // 1000}.{t % 1000:03d}", "s": f"{t // US}.{t % US:06d}"}[unit]
            rec = {"ts": t if unit == "us" else "TS", "tenant": r.tenant, "tokens": list(r.tokens)}
            for k, v in (("prompt_cache_key", r.key), ("session", r.session), ("model", r.model)):
                if v is not None:
                    rec[k] = v
            f.write(json.dumps(rec).replace('"TS"', str(ts)) + "\n")


SECRET = "SECRET-PROMPT-TEXT"  # planted in every prompt: must never reach rejects.detail


def write_jsonl(path: Path, records: list, opener=open) -> Path:
    with opener(path, "wt") as fh:
        for r in records:
            fh.write(r if isinstance(r, str) else json.dumps(r))
            fh.write("\n")
    return path


def anthropic_wrapped(ts=1700000000, **over):
    rec = {
        "timestamp": ts,
        "tenant": "acme",
        "session": "s1",
        "request": {
            "model": "claude-sonnet-4",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": f"You are helpful {SECRET}", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": f"hi {SECRET}"}]}],
            "metadata": {"user_id": "u-42"},
        },
        "response": {
            "type": "message",
            "content": [{"type": "text", "text": "hello"}],
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 100,
                      "cache_creation_input_tokens": 20, "output_tokens": 5},
        },
    }
    rec.update(over)
    return rec


def make_db(reqs, usage=None, bodies=None):
    """requests/prompts/segments for ``reqs`` (``tokens`` format, one segment each)."""
    con = db.connect(None)
    seg_ids, seg_tok = [], []
    rows = []
    for i, r in enumerate(reqs):
        sid, oid = 2 * i + 1, 2 * i + 2
        seg_ids += [sid, oid]
        seg_tok += [list(r.tokens), list(r.output)]
        u = (usage or {}).get(i, (None, None, None))
        rows.append((i, r.ts, r.tenant, r.key, r.session, r.model, sid, oid, len(r.tokens), len(r.output), *u))
    con.register("_s", pa.table({"seg_id": pa.array(seg_ids, pa.uint64()),
                                 "n_tokens": pa.array([len(t) for t in seg_tok], pa.int32()),
                                 "tokens": pa.array(seg_tok, pa.list_(pa.int32()))}))
    con.execute("INSERT INTO segments SELECT * FROM _s")
    for (i, ts, ten, key, ses, model, sid, oid, nt, no, up, uc, uw) in rows:
        fmt, body = ("tokens", None) if not bodies or i not in bodies else bodies[i]
        con.execute("INSERT INTO requests (request_id, source_id, line_no, format, ts_us, tenant, prompt_cache_key, "
                    "session, model, body, usage_prompt_tokens, usage_cached_tokens, usage_cache_write_tokens) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [i, 0, i + 1, fmt, ts, ten, key, ses, model, body, up, uc, uw])
        con.execute("INSERT INTO prompts VALUES (?, ?, ?, ?, ?, ?)", [i, nt, [sid], [1], [oid], no])
    return con


WORDS = ("the cache prefix token request stream tenant session model agent tool result file "
         "function value error build test deploy query table index branch commit review plan "
         "memory budget latency window header schema order json key user system message turn "
         "history summary edit patch config option server client proxy route block batch").split()


CAUSE_OF_TENANT = {
    "t_rh": "rotating_header", "t_ts": "timestamp", "t_id": "volatile_id", "t_pu": "per_user_data",
    "t_to": "tool_order", "t_sc": "tool_schema_change", "t_jk": "json_key_order",
    "t_hr": "history_rewrite", "t_ok": None,
}


def text(r: random.Random, n: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(n)).capitalize() + "."


def tools(r: random.Random) -> list[dict]:
    out = []
    for name in ("read_file", "write_file", "run_shell", "search_code", "list_dir"):
        out.append({"name": name, "description": text(r, 60),
                    "input_schema": {"type": "object",
                                     "properties": {"path": {"type": "string", "description": text(r, 8)},
                                                    "limit": {"type": "integer"}},
                                     "required": ["path"]}})
    return out


def iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def planted_logs(out: Path, seed: int = 0, sessions: int = 3, turns: int = 5) -> dict:
    """Write ``planted.jsonl`` and ``clean.jsonl`` (paired line by line) into ``out``;
    return {line_no: (tenant, turn)}."""
    r = random.Random(seed)
    base_tools = tools(r)
    names = ["Alice Martin", "Bob Okafor", "Chen Wei", "Dana Kowalski"]
    planted, clean, tenants = [], [], {}
    t0 = 1_763_000_000.0
    for ti, tenant in enumerate(CAUSE_OF_TENANT):
        cause = CAUSE_OF_TENANT[tenant]
        t = t_start = t0 + ti * 7200.0
        system_body = "\n\n".join(text(r, 70) for _ in range(4))  # one application per tenant
        for s in range(sessions):
            session = f"{tenant}-s{s}"
            user = f"{tenant}-u{s}"
            hist: list[dict] = [{"role": "user", "content": text(r, r.randint(30, 60))}]
            prev_hist = None
            order = list(range(len(base_tools)))
            for turn in range(turns):
                t += r.uniform(20, 60)
                tools_p = [dict(x) for x in base_tools]
                tools_c = [dict(x) for x in base_tools]
                sys_p = [{"type": "text", "text": system_body}]
                sys_c = [{"type": "text", "text": system_body}]
                hist_c = hist
                if cause == "rotating_header":
                    sys_p.insert(0, {"type": "text", "text": f"x-anthropic-billing-header: cc_version=1.0.9; "
                                                              f"cch={r.getrandbits(20):05x};"})
                    sys_c.insert(0, {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0.9; cch=00000;"})
                elif cause == "timestamp":
                    sys_p[0] = {"type": "text", "text": f"Current time: {iso(t)}\n" + system_body}
                    sys_c[0] = {"type": "text", "text": f"Current time: {iso(t0)}\n" + system_body}
                elif cause == "volatile_id":
                    head, tail = system_body.split("\n\n", 1)
                    sys_p[0] = {"type": "text", "text": f"{head}\n\nRequest-Id: {uuid.UUID(int=r.getrandbits(128))}\n\n{tail}"}
                    sys_c[0] = {"type": "text", "text": f"{head}\n\nRequest-Id: {uuid.UUID(int=0)}\n\n{tail}"}
                elif cause == "per_user_data":
                    sys_p[0] = {"type": "text", "text": f"You are talking to {names[s % 4]} (user u-{1000 + s}).\n" + system_body}
                    sys_c[0] = {"type": "text", "text": "You are talking to the user (user u-0000).\n" + system_body}
                elif cause == "tool_order":
                    r.shuffle(order)
                    tools_p = [tools_p[i] for i in order]
                elif cause == "tool_schema_change":
                    version = int((t - t_start) // 150)  # an MCP server restart every 150 s
                    tools_p[-1] = dict(tools_p[-1], description=f"[server v{version}] " + tools_p[-1]["description"])
                    tools_c[-1] = dict(tools_c[-1], description="[server v0] " + tools_c[-1]["description"])
                elif cause == "json_key_order":
                    keys = ["name", "description", "input_schema"]
                    r.shuffle(keys)
                    tools_p = [{k: x[k] for k in keys} for x in tools_p]
                elif cause == "history_rewrite" and turn == 3:
                    prev_hist = [dict(m) for m in hist]
                    hist[1] = dict(hist[1], content="[truncated]")  # an old assistant reply, persistently
                    hist_c = prev_hist
                body_p = {"model": "m", "system": sys_p, "tools": tools_p, "messages": list(hist),
                          "metadata": {"user_id": user}}
                body_c = {"model": "m", "system": sys_c, "tools": tools_c, "messages": list(hist_c),
                          "metadata": {"user_id": user}}
                for dst, body in ((planted, body_p), (clean, body_c)):
                    dst.append({"timestamp": t, "tenant": tenant, "session": session, "request": body})
                tenants[len(planted)] = (tenant, turn)
                hist = hist + [{"role": "assistant", "content": text(r, r.randint(20, 50))},
                               {"role": "user", "content": text(r, r.randint(10, 40))}]
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("planted", planted), ("clean", clean)):
        (out / f"{name}.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    return tenants


TABLES = {"requests": "*", "rejects": "*", "blobs": "*",
          "sources": "source_id, path, sha256, format, lines, loaded, rejected, time_unit"}


def mixed_logs(d: Path) -> Path:
    """Files of every kind ingest meets: growing conversations sharing messages
    across files, rejects of many reasons, a truncated .gz, the same content
    compressed twice, the shipped sample, a JSON array."""
    d.mkdir(parents=True, exist_ok=True)
    for k, seeds in enumerate([(1, 2), (2, 3), (4,)]):  # (seed 2 in two files: shared blobs across files)
        conversations_log(seeds, "anthropic" if k != 1 else "openai", d / f"conv{k}.jsonl", n_conv=3, turns=4)
    good = anthropic_wrapped()
    (d / "mixed.jsonl").write_text("\n".join([json.dumps(good), "", '{"timestamp": 1, "req', json.dumps(
        {**good, "timestamp": "next tuesday"}), json.dumps([1]), json.dumps(anthropic_wrapped(ts=5))]) + "\n")
    data = gzip.compress(("\n".join(json.dumps(anthropic_wrapped(ts=i)) for i in range(50))).encode())
    (d / "broken.jsonl.gz").write_bytes(data[: len(data) // 2])
    rows = [anthropic_wrapped(ts=100 + i) for i in range(7)]
    write_jsonl(d / "twice.jsonl.gz", rows, opener=gzip.open)
    write_jsonl(d / "twice_copy.jsonl", rows)
    (d / "array.json").write_text(json.dumps([anthropic_wrapped(ts=200 + i) for i in range(3)]))
    for f in sorted((ROOT / "data").rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            shutil.copy(f, d / f"sample_{f.name}")
    return d


def dump(con) -> dict:
    return {t: con.execute(f"SELECT {cols} FROM {t} ORDER BY ALL").fetchall() for t, cols in TABLES.items()}


def generated_db(base: Path, seed: int, scale: float):
    """A database of the sample generator's logs (``seed``, ``scale``) under ``base``,
    ingested and tokenized: what the engines' tests replay."""
    from replay import api
    from replay.synth.generator import generate

    logs = generate(base / "logs", seed=seed, scale=scale)
    con = api.open_db(base / "g.duckdb")
    api.ingest(con, [str(next(iter(logs.files.values())).parent)])
    api.prepare(con, modes=())  # tokenized
    return con
