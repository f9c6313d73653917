"""The chat-template causes of ``replay diagnose`` and the template fixes of ``replay whatif``.

A seeded multi-day log (µs timestamps, sessions crossing midnight, agent
conversations with reasoning and tool calls, plus body-level causes) is
tokenized under a template that prints the request's date at the top and drops
the reasoning of assistant turns before the last user message (DeepSeek's
tokens, so the default tokenizer cuts it). Its twins are hand-fixed templates:
one printing a constant date (the first request's), one never dropping
reasoning. A request's true loss to a template cause is
``L_global,∞(twin) − L_global,∞(template)``; the diagnosis must name it, and
``whatif``'s template fixes must equal the twins' figures exactly.
"""

from __future__ import annotations

import json
import math
import random
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay import api as pipeline
from replay.analysis.diagnose import CAUSES, diagnose, miss_parts
from replay.analysis.whatif import whatif
from replay.core.sweep import Grid
from replay.store import db
from replay.text.tok import load_tokenizer

HEAD = "{{ bos_token }}"
DATE = "Today is {{ strftime_now('%d %B %Y') }}.\n"
SCAN = ("{%- set ns = namespace(last_user=-1) -%}"
        "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
        "{%- endif -%}{%- endfor -%}")
LOOP = ("{%- for m in messages -%}"
        "{%- if m.role == 'system' -%}{{ m.content }}\n"
        "{%- elif m.role == 'user' -%}<｜User｜>{{ m.content }}"
        "{%- elif m.role == 'tool' -%}<｜User｜>[result] {{ m.content }}"
        "{%- elif m.role == 'assistant' -%}<｜Assistant｜>"
        "{%- if m.reasoning_content KEEP -%}<think>{{ m.reasoning_content }}</think>{%- endif -%}"
        "{{ m.content }}"
        "{%- for tc in (m.tool_calls or []) -%}<call>{{ tc.function.name }} "
        "{{ tc.function.arguments | tojson }}</call>{%- endfor -%}"
        "<｜end▁of▁sentence｜>"
        "{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}<｜Assistant｜>{%- endif -%}")
STRIP = "and loop.index0 > ns.last_user"


def _template(date: str | None, strip: bool) -> str:
    """The template: the request's date (or the constant ``date``), reasoning dropped or kept."""
    line = DATE if date is None else f"Today is {date}.\n"
    return HEAD + line + SCAN + LOOP.replace("KEEP", STRIP if strip else "")


WORDS = ("the cache prefix token request stream tenant session model agent tool result file "
         "function value error build test deploy query table index branch commit review plan "
         "memory budget latency window header schema order json key user system message turn").split()


def _text(r: random.Random, n: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(n)).capitalize() + "."


T0 = 1_764_800_000.0  # 2025-12-03 22:13:20 UTC
MIDNIGHT = 6400.0  # T0 + MIDNIGHT: 2025-12-04 00:00 UTC


def _us(t: float) -> int:
    return int(round(t * 1e6))


def make_log(path: Path, seed: int = 3) -> None:
    """Write the log: tenant ``t_date`` (text chats crossing midnight, several days),
    ``t_agent`` (agent loops with reasoning and tool calls, several user turns),
    ``t_ts`` (a body timestamp in the system prompt), ``t_hr`` (an edited message),
    ``t_ok`` (short chats within one day)."""
    r = random.Random(seed)
    rows = []

    def add(t, tenant, session, system, messages, tools=None):
        body = {"model": "m", "system": system, "messages": [dict(m) for m in messages],
                "max_tokens": 512, "metadata": {"user_id": session}}
        if tools:
            body["tools"] = tools
        rows.append({"timestamp": _us(t), "tenant": tenant, "session": session, "request": body})

    tools = [{"name": n, "description": _text(r, 20),
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
             for n in ("read_file", "run_shell")]
    systems = {t: "\n".join(_text(r, 40) for _ in range(3)) for t in ("t_date", "t_agent", "t_ts", "t_hr", "t_ok")}
    for day in range(3):
        base = T0 + day * 86400.0
        # chats that cross midnight (from 23:40 on, turns every few minutes)
        for s in range(3):
            t = base + MIDNIGHT - 1200 + s * 400 + r.uniform(0, 60)
            hist = [{"role": "user", "content": _text(r, 30)}]
            for _turn in range(6):
                add(t, "t_date", f"d{day}-s{s}", systems["t_date"], hist)
                hist += [{"role": "assistant", "content": _text(r, 40)}, {"role": "user", "content": _text(r, 15)}]
                t += r.uniform(120, 400)
        # agent conversations with reasoning (midday)
        for s in range(2):
            t = base + 36000 + s * 3000 + r.uniform(0, 60)
            hist = [{"role": "user", "content": _text(r, 25)}]
            for _user_turn in range(3):
                for step in range(r.randint(2, 3)):
                    add(t, "t_agent", f"a{day}-s{s}", systems["t_agent"], hist, tools)
                    t += r.uniform(5, 30)
                    cid = f"toolu_{day}{s}{len(hist):03d}"
                    hist.append({"role": "assistant", "content": [
                        {"type": "thinking", "thinking": _text(r, 30), "signature": "sig"},
                        {"type": "text", "text": _text(r, 8)},
                        {"type": "tool_use", "id": cid, "name": "read_file", "input": {"path": f"src/{step}.py"}}]})
                    hist.append({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": cid, "content": _text(r, 40)}]})
                add(t, "t_agent", f"a{day}-s{s}", systems["t_agent"], hist, tools)
                t += r.uniform(5, 30)
                hist.append({"role": "assistant", "content": [
                    {"type": "thinking", "thinking": _text(r, 30), "signature": "sig"},
                    {"type": "text", "text": _text(r, 30)}]})
                hist.append({"role": "user", "content": _text(r, 12)})
                t += r.uniform(60, 200)
            add(t, "t_agent", f"a{day}-s{s}", systems["t_agent"], hist, tools)
        # body-level causes and clean chats (afternoon)
        for tenant in ("t_ts", "t_hr", "t_ok"):
            t = base + 50000 + r.uniform(0, 600)
            hist = [{"role": "user", "content": _text(r, 30)}]
            for turn in range(5):
                system = systems[tenant]
                if tenant == "t_ts":
                    iso = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                    system = f"Current time: {iso}\n" + system
                if tenant == "t_hr" and turn == 3:
                    hist[1] = dict(hist[1], content="[truncated]")
                add(t, tenant, f"{tenant}{day}", system, hist)
                hist += [{"role": "assistant", "content": _text(r, 40)}, {"role": "user", "content": _text(r, 15)}]
                t += r.uniform(30, 90)
    rows.sort(key=lambda x: x["timestamp"])
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in rows) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("tplcauses")
    log = d / "log.jsonl"
    make_log(log)
    first = min(json.loads(x)["timestamp"] for x in log.read_text().splitlines())
    fixed_date = datetime.fromtimestamp(first / 1e6, tz=timezone.utc).strftime("%d %B %Y")
    paths = {}
    for name, src in (("orig", _template(None, True)), ("fixdate", _template(fixed_date, True)),
                      ("keep", _template(None, False))):
        paths[name] = d / f"{name}.jinja"
        paths[name].write_text(src, encoding="utf-8")
    toks = {k: load_tokenizer(template=p) for k, p in paths.items()}
    cons = {}
    for k, tok in toks.items():
        con = db.connect(None)
        pipeline.ingest(con, [log])
        pipeline.prepare(con, modes=("global",), tokenizer=tok)
        cons[k] = con
    return d, log, paths, toks, cons


def _global_miss(con) -> dict[int, int]:
    """line → prompt tokens not shared with any earlier request (L_global,∞ aside)."""
    pipeline.prepare(con, modes=("global",))
    rows = con.execute("""SELECT r.line_no, p.n_tokens - coalesce(list_max(w.depths), 0) FROM walks w
                          JOIN requests r USING (request_id) JOIN prompts p USING (request_id)
                          WHERE w.mode = 'global' AND w.variant = 'prompt'""").fetchall()
    return dict(rows)


def test_log_is_in_microseconds_and_crosses_midnight(world):
    _, _, _, _, cons = world
    ts = [t for (t,) in cons["orig"].execute("SELECT ts_us FROM requests").fetchall()]
    days = {datetime.fromtimestamp(t / 1e6, tz=timezone.utc).date() for t in ts}
    assert len(days) >= 4
    assert min(ts) == _us(min(t / 1e6 for t in ts))


def test_template_causes_found(world):
    _, _, _, toks, cons = world
    assert "template_date" in CAUSES and "template_history_rewrite" in CAUSES
    # the twins' prompts are not as long (kept reasoning): a loss is the extra unshared tokens
    M = {k: _global_miss(c) for k, c in cons.items()}
    df = miss_parts(cons["orig"], ttl=math.inf, block=1, min_prefix=0, stream="global", tokenizer=toks["orig"])
    lines = dict(cons["orig"].execute("SELECT request_id, line_no FROM requests").fetchall())
    diag = {lines[r["request_id"]]: r for r in df.to_dicts()}
    stats = {}
    clean = blamed = 0
    for ln, row in diag.items():
        date_loss = M["orig"][ln] - M["fixdate"][ln]
        hist_loss = M["orig"][ln] - M["keep"][ln]
        if date_loss > 0 and hist_loss <= 0:
            cause, loss = "template_date", date_loss
        elif hist_loss > 0 and date_loss <= 0:
            cause, loss = "template_history_rewrite", hist_loss
        elif date_loss <= 0 and hist_loss <= 0:
            clean += 1
            blamed += row["cause"] in ("template_date", "template_history_rewrite")
            continue
        else:
            continue
        s = stats.setdefault(cause, [0, 0, 0, 0])
        s[0] += 1
        s[1] += row["cause"] == cause
        s[2] += loss
        s[3] += min(loss, row["premature"]) if row["cause"] == cause else 0
    print({c: (f"{s[1]}/{s[0]} requests", f"{s[3]}/{s[2]} tokens") for c, s in stats.items()},
          f"clean blamed {blamed}/{clean}")
    for cause in ("template_date", "template_history_rewrite"):
        n, found, tokens, named = stats[cause]
        assert n >= 5, (cause, n)
        assert found >= 0.9 * n, (cause, found, n)
        assert named >= 0.9 * tokens, (cause, named, tokens)
    assert clean >= 50
    assert blamed < 0.05 * clean, (blamed, clean)
    # a body-level cause is still named as before
    assert "history_rewrite" in {r["cause"] for r in diag.values()}


def test_diagnose_summary_lists_template_causes(world):
    _, _, _, toks, cons = world
    res = diagnose(cons["orig"], ttl=math.inf, block=1, stream="global", tokenizer=toks["orig"], examples=1)
    names = {c["cause"] for c in res["causes"]}
    assert {"template_date", "template_history_rewrite"} <= names
    assert {e["cause"] for e in res["examples"]} >= {"template_date", "template_history_rewrite"}
    text = pipeline.format_text(res) if hasattr(pipeline, "format_text") else ""
    assert not text or "template_history_rewrite" in text


def test_template_tokenization_needs_its_template(world):
    _, _, _, _, cons = world
    with pytest.raises(ValueError, match="--chat-template"):
        miss_parts(cons["orig"], ttl=math.inf, block=1, stream="global")
    with pytest.raises(ValueError, match="--chat-template"):
        whatif(cons["orig"], ["sort-tools"], ttl=300, block=16, stream="tenant")


@pytest.mark.parametrize("ttl,block,stream", [(math.inf, 1, "global"), (300, 16, "tenant")])
def test_whatif_template_fixes_equal_the_fixed_templates(world, ttl, block, stream):
    _, _, _, toks, cons = world
    res = whatif(cons["orig"], ["fixed-template-date", "keep-history-as-rendered", "sort-tools"], ttl=ttl,
                 block=block, stream=stream, tokenizer=toks["orig"])
    grid = Grid(ttls=(ttl,), blocks=(block,), min_prefixes=(0,), streams=(stream,))

    def hits(k):
        return int(pipeline.sweep(cons[k], grid, tokenizer=toks[k])["hit_tokens"][0])

    after = {f["fix"]: f["after"]["hit_tokens"] for f in res["fixes"]}
    assert res["before"]["hit_tokens"] == hits("orig")
    assert after["fixed-template-date"] == hits("fixdate")
    assert after["keep-history-as-rendered"] == hits("keep")
    assert after["fixed-template-date"] > res["before"]["hit_tokens"]
    assert after["keep-history-as-rendered"] > res["before"]["hit_tokens"]


def test_template_fixes_refused_without_a_template(tmp_path):
    log = tmp_path / "log.jsonl"
    make_log(log, seed=5)
    con = db.connect(None)
    pipeline.ingest(con, [log])
    with pytest.raises(ValueError, match="chat template"):
        whatif(con, ["fixed-template-date"], ttl=300, block=16)


def test_cli_smoke(world):
    from replay.cli.main import main

    d, log, paths, _, _ = world
    runner = CliRunner()
    dbp = str(d / "cli.duckdb")
    res = runner.invoke(main, ["diagnose", str(log), "--db", dbp, "--chat-template", str(paths["orig"]),
                               "--ttl", "inf", "--block", "1", "--stream", "global", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output.strip().splitlines()[-1])
    assert "template_history_rewrite" in {c["cause"] for c in got["causes"]}
    res = runner.invoke(main, ["diagnose", "--db", dbp, "--ttl", "inf", "--block", "1", "--stream", "global"])
    assert res.exit_code != 0 and "--chat-template" in res.output
    res = runner.invoke(main, ["whatif", "--db", dbp, "--fix", "fixed-template-date",
                               "--chat-template", str(paths["orig"]), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output.strip().splitlines()[-1])
    assert got["fixes"][0]["fix"] == "fixed-template-date"
