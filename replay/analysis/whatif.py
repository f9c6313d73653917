"""What each fix is worth: normalizers applied to the request bodies, ceiling recomputed.

``whatif(con, fixes, ttl, block, min_prefix, stream)`` copies ``requests`` into a
fresh in-memory DuckDB with every body normalized, tokenizes (reusing the
``segments`` already known: the table is copied across, so only text the fix
changed is tokenized again), replays and sweeps from scratch — exactly the
ceiling of the normalized log — once per fix and once for all fixes together.

Normalizers (:data:`FIXES`), each a pure function ``body → body``:

``strip-rotating-header``  drop header lines (``x-…: …`` / ``…-header: …``) from the
                           system prompt (system blocks, or leading system/developer
                           messages); a block left empty is dropped;
``sort-tools``             tools sorted by name (stable);
``canonical-json``         every JSON object in the body with sorted keys, and JSON
                           held in strings (tool-call arguments, JSON tool results)
                           re-serialized canonically (sorted keys, fixed separators);
``bucket-timestamps=5m``   dates-with-times in the system prompt and tools floored to
                           the bucket (``=DURATION``, default 5m), keeping their layout;
``move-volatile-after-breakpoint``  lines of the system prompt holding a timestamp or
                           a volatile id (UUID, long hex, prefixed id) moved out of the
                           prefix into an extra text block at the end of the last
                           message — after the last breakpoint, where a per-request
                           value belongs.

Fixes of a chat template's rendering (``--chat-template``; refused on another
tokenization; ``replay.text.template_fixes``), which change no body:

``fixed-template-date``    every request rendered with the template's "now" pinned
                           to the log's first request's timestamp (a template that
                           prints a constant date);
``keep-history-as-rendered``  every assistant message keeps the rendering it had
                           when it was the newest message (a template that never
                           drops earlier turns' reasoning or re-serializes them).
"""

from __future__ import annotations

import copy
import json
import math
import re
from datetime import datetime, timezone
from typing import Any, Callable

import pyarrow as pa

from replay.analysis.volatile import ID_RES, TIMESTAMP_RES
from replay.core.grid import Grid
from replay.core.sweep import sweep
from replay.times import format_ttl, parse_ttl
from replay.prepare import as_tokenizer, prepare
from replay.providers.auto import parses_json
from replay.store import db
from replay.store.jsontext import dumps
from replay.text.render import tool_name
from replay.text.renderers import TEMPLATE, render_of
from replay.text.template_fixes import TEMPLATE_FIXES, fixed_tok
from replay.text.tok import Tok
from replay.text.tokenize import tokenize_stage

__all__ = ["FIXES", "TEMPLATE_FIXES", "normalize_body", "normalized_copy", "ceiling", "whatif", "format_whatif",
           "parse_fix"]

FIXES = ("strip-rotating-header", "sort-tools", "canonical-json", "bucket-timestamps=5m",
         "move-volatile-after-breakpoint")

HEADER_LINE = re.compile(r"^\s*(?:x-[\w.-]+|[\w.-]*-header)\s*:.*$", re.I)
_ISO = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})(?P<sep>[T ])(?P<h>\d{1,2}):(?P<m>\d{2})"
                  r"(?::(?P<s>\d{2})(?P<frac>[.,]\d+)?)?(?P<tz>\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?")


# --------------------------------------------------------------------------- helpers on bodies

def _map_blocks(blocks: list, fn: Callable[[str], str | None]) -> list:
    """``fn`` over the text of each block (text blocks or bare strings); a block whose
    new text is empty is dropped, other blocks are kept as they are."""
    out = []
    for blk in blocks:
        if isinstance(blk, dict) and isinstance(blk.get("text"), str):
            t = fn(blk["text"])
            if t:
                out.append(dict(blk, text=t))
        elif isinstance(blk, str):
            t = fn(blk)
            if t:
                out.append(t)
        else:
            out.append(blk)
    return out


def _system_texts(body: dict, fn: Callable[[str], str | None]) -> dict:
    """Apply ``fn`` to every system text (blocks, string, or leading system messages).
    ``fn`` returning None or '' drops a block (a string system becomes '')."""
    sysv = body.get("system")
    if isinstance(sysv, str):
        body["system"] = fn(sysv) or ""
    elif isinstance(sysv, list):
        body["system"] = _map_blocks(sysv, fn)
    if isinstance(body.get("instructions"), str):
        body["instructions"] = fn(body["instructions"]) or ""
    msgs = body.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            if not (isinstance(m, dict) and m.get("role") in ("system", "developer")):
                break
            c = m.get("content")
            if isinstance(c, str):
                m["content"] = fn(c) or ""
            elif isinstance(c, list):
                m["content"] = _map_blocks(c, fn)
    return body


def strip_rotating_header(body: dict) -> dict:
    def fn(text: str) -> str:
        lines = text.split("\n")
        kept = [ln for ln in lines if not HEADER_LINE.match(ln)]
        if len(kept) == len(lines):
            return text
        while kept and not kept[0].strip():
            kept.pop(0)
        return "\n".join(kept)
    return _system_texts(body, fn)


def sort_tools(body: dict) -> dict:
    tools = body.get("tools")
    if isinstance(tools, list):
        body["tools"] = sorted(tools, key=lambda t: str(tool_name(t) or ""))
    return body


def _canon(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _canon(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [_canon(x) for x in v]
    if isinstance(v, str) and v[:1] in "{[" and v[-1:] in "}]":
        try:
            parsed = json.loads(v)
        except (ValueError, RecursionError):
            return v
        if isinstance(parsed, (dict, list)):
            return json.dumps(_canon(parsed), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return v


def canonical_json(body: dict) -> dict:
    return _canon(body)


def _bucket_text(text: str, bucket: float) -> str:
    def sub(m: re.Match) -> str:
        try:
            d = datetime.strptime(f"{m['date']} {m['h']}:{m['m']}:{m['s'] or '00'}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return m.group(0)
        t = d.replace(tzinfo=timezone.utc).timestamp()
        f = datetime.fromtimestamp(math.floor(t / bucket) * bucket, tz=timezone.utc)
        out = f"{f:%Y-%m-%d}{m['sep']}{f:%H}:{f:%M}"
        if m["s"] is not None:
            out += f":{f:%S}"
            if m["frac"]:
                out += m["frac"][0] + "0" * (len(m["frac"]) - 1)
        return out + (m["tz"] or "")
    return _ISO.sub(sub, text)


def bucket_timestamps(body: dict, bucket: float = 300.0) -> dict:
    body = _system_texts(body, lambda t: _bucket_text(t, bucket))
    tools = body.get("tools")
    if isinstance(tools, list):
        body["tools"] = [json.loads(_bucket_text(json.dumps(t, ensure_ascii=False), bucket))
                         for t in tools]
    return body


def move_volatile_after_breakpoint(body: dict) -> dict:
    moved: list[str] = []

    def volatile(line: str) -> bool:
        return any(rx.search(line) for rx in TIMESTAMP_RES + ID_RES)

    def fn(text: str) -> str:
        lines = text.split("\n")
        kept = []
        for ln in lines:
            if volatile(ln):
                moved.append(ln)
            else:
                kept.append(ln)
        if len(kept) == len(lines):
            return text
        while kept and not kept[0].strip():
            kept.pop(0)
        return "\n".join(kept)

    body = _system_texts(body, fn)
    if not moved:
        return body
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": "\n".join(moved)}]}]
        return body
    last = msgs[-1]
    if isinstance(last, dict):
        c = last.get("content")
        block = {"type": "text", "text": "\n".join(moved)}
        if isinstance(c, list):
            last["content"] = list(c) + [block]
        elif isinstance(c, str):
            last["content"] = [{"type": "text", "text": c}, block]
        else:
            last["content"] = [block]
    return body


def parse_fix(name: str) -> Callable[[dict], dict]:
    """A normalizer by name (``bucket-timestamps`` takes ``=DURATION``)."""
    base, _, arg = name.strip().partition("=")
    if base == "strip-rotating-header":
        return strip_rotating_header
    if base == "sort-tools":
        return sort_tools
    if base == "canonical-json":
        return canonical_json
    if base == "bucket-timestamps":
        b = parse_ttl(arg or "5m")
        if not (0 < b < math.inf):
            raise ValueError("bucket-timestamps needs a finite bucket, e.g. bucket-timestamps=5m")
        return lambda body: bucket_timestamps(body, b)
    if base == "move-volatile-after-breakpoint":
        return move_volatile_after_breakpoint
    if base in TEMPLATE_FIXES:
        raise ValueError(f"{base} fixes a chat template's rendering, not the bodies: give it to whatif "
                         "(with --chat-template)")
    raise ValueError(f"unknown fix {name!r}; choose from {', '.join(FIXES + TEMPLATE_FIXES)}")


def normalize_body(body: dict, fixes) -> dict:
    """``body`` with every fix applied in order (a deep copy; the input is untouched)."""
    out = copy.deepcopy(body)
    for f in fixes:
        out = (parse_fix(f) if isinstance(f, str) else f)(out)
    return out


# --------------------------------------------------------------------------- the normalized copy

_TOK_CACHE: dict = {}


def _tokenizer(name=None) -> Tok:
    """One ``Tok`` per tokenizer for the copies (its encoder process is reused);
    the two most recent are kept (a dropped one stops its process once unused)."""
    if isinstance(name, Tok):
        return name
    key = str(name)
    tok = _TOK_CACHE.pop(key, None) or as_tokenizer(name)
    _TOK_CACHE[key] = tok  # (most recent last)
    while len(_TOK_CACHE) > 2:
        del _TOK_CACHE[next(iter(_TOK_CACHE))]
    return tok


def _split_fixes(fixes) -> tuple[list, list[str]]:
    """(body fixes, rendering fixes: names of ``TEMPLATE_FIXES``)."""
    body, render = [], []
    for f in fixes:
        if isinstance(f, str) and f.strip().partition("=")[0] in TEMPLATE_FIXES:
            render.append(f.strip().partition("=")[0])
        else:
            body.append(f)
    return body, render


def check_template_tokenizer(con, tok: Tok) -> None:
    """Refuse (ValueError) to re-render a chat template tokenization without its template."""
    used = db.get_meta(con, "tokenizer")
    if render_of(used) == TEMPLATE and getattr(tok, "template", None) is None:
        raise ValueError(f"the prompts were tokenized under a chat template ({used}): pass the template "
                         "(--chat-template) so the bodies are rendered as they were")


def normalized_copy(con, fixes, tokenizer=None):
    """A fresh in-memory database holding ``requests`` with normalized bodies,
    tokenized (known segments copied across, so only changed text is tokenized).
    ``fixes`` may hold rendering fixes (``TEMPLATE_FIXES``): the copy is then
    tokenized with the template's rendering so fixed."""
    return _copy(con, fixes, tokenizer)[0]


def _copy(con, fixes, tokenizer=None):
    """``normalized_copy`` and the ``Tok`` that tokenized it."""
    fixes, render_fixes = _split_fixes(fixes)
    fns = [parse_fix(f) if isinstance(f, str) else f for f in fixes]
    out = db.connect(None)
    # bodies inline in the copy (however the original stored them), normalized below
    req = db.arrow(con, """SELECT r.* REPLACE (b.body AS body, NULL::UBIGINT[] AS body_blobs)
                           FROM requests r LEFT JOIN request_bodies b USING (request_id)
                           ORDER BY r.request_id""")
    bodies = req.column("body").to_pylist()
    new = []
    for b in bodies:
        if b is None:
            new.append(None)
            continue
        try:
            body = json.loads(b)
        except ValueError:
            new.append(b)
            continue
        for fn in fns:
            body = fn(body)
        new.append(dumps(body))
    req = req.set_column(req.schema.get_field_index("body"), "body", pa.array(new, pa.string()))
    _replay_copy = req  # noqa: F841 - read by DuckDB by name
    # by name: columns added by a migration sit in another place in an older file
    out.execute("INSERT INTO requests BY NAME SELECT * FROM _replay_copy")
    tok = _tokenizer(tokenizer)
    if render_fixes:
        ts = req.column("ts_us").to_pylist()
        first = min((t for t in ts if t is not None), default=None)
        order = []
        if "keep-history-as-rendered" in render_fixes:
            fmts, rids = req.column("format").to_pylist(), req.column("request_id").to_pylist()
            for t, rid, b, fmt in zip(ts, rids, new, fmts):
                try:
                    order.append((t, rid, json.loads(b) if b is not None else None, fmt))
                except ValueError:
                    continue
        tok = fixed_tok(tok, render_fixes, first, order)
    if db.get_meta(con, "tokenizer") in (tok.name, getattr(tok, "same_segments_as", None)):
        _replay_segs = db.arrow(con, "SELECT seg_id, n_tokens, tokens FROM segments")  # noqa: F841
        out.execute("INSERT INTO segments SELECT * FROM _replay_segs")
        db.set_meta(out, "tokenizer", tok.name)
    tokenize_stage(out, tok)
    return out, tok


def ceiling(con, ttl: float = 300, block: int = 16, min_prefix: int = 0, stream: str = "tenant",
            tokenizer=None) -> dict:
    """{requests, prompt_tokens, hit_tokens, hit_ratio, requests_hit} of one configuration,
    tokenizing and replaying as needed (the ideal contract)."""
    return _ceiling(con, ttl, block, min_prefix, stream, tokenizer)


def _ceiling(con, ttl, block, min_prefix, stream, tokenizer) -> dict:
    grid = Grid(ttls=(float(ttl),), blocks=(int(block),), min_prefixes=(int(min_prefix),), streams=(stream,))
    prepare(con, modes=(stream,), horizon_us=grid.horizon_us, tokenizer=_tokenizer(tokenizer))
    df = sweep(con, grid, store=False)
    r = df.to_dicts()[0]
    return {k: r[k] for k in ("requests", "prompt_tokens", "hit_tokens", "hit_ratio", "requests_hit")}


def _money(fig: dict, price) -> dict | None:
    """Spend at ``price`` (an ``economics.Price``, USD per million tokens)."""
    if price is None:
        return None
    base = price.input / 1e6
    read = price.cache_read / 1e6
    hit, total = fig["hit_tokens"], fig["prompt_tokens"]
    full = total * base
    spend = (total - hit) * base + hit * read
    return {"full_price": full, "spend": spend, "savings": full - spend}


def whatif(con, fixes, ttl: float | str = 300, block: int = 16, min_prefix: int = 0,
           stream: str = "tenant", prices=None, tokenizer=None,
           profile: str = "ideal") -> dict:
    """The ceiling before any fix, after each fix alone and after all of them together.

    Returns ``{"config", "before", "fixes": [{"fix", "after", "gain_hit_ratio",
    "gain_hit_tokens"[, "money"]}], "all": {...}}``; with ``prices`` (an
    ``economics.Price`` from the price table) each figure also carries spend and savings.
    """
    ttl = parse_ttl(ttl)
    fixes = [f.strip() for f in fixes if f and f.strip()]
    body_fixes, render_fixes = _split_fixes(fixes)
    for f in body_fixes:
        parse_fix(f)  # validate names early
    if not fixes:
        raise ValueError("no fix given")
    if render_fixes or render_of(db.get_meta(con, "tokenizer")) == TEMPLATE:
        tokenizer = _tokenizer(tokenizer)
        check_template_tokenizer(con, tokenizer)
        if render_fixes and tokenizer.template is None:
            raise ValueError(f"{', '.join(render_fixes)}: these fixes change how a chat template renders the "
                             "bodies; the prompts are not tokenized under one (give --chat-template)")
    base_fixes: list[str] = []
    if parses_json(con, profile):
        base_fixes = ["canonical-json"]  # a hosted API parses the JSON: key order cannot miss there
    base_con = normalized_copy(con, base_fixes, tokenizer) if base_fixes else con
    before = _ceiling(base_con, ttl, block, min_prefix, stream, tokenizer)
    if prices:
        before["money"] = _money(before, prices)

    def run(names: list[str], label: str) -> dict:
        c2, tok2 = _copy(con, base_fixes + names, tokenizer)
        after = _ceiling(c2, ttl, block, min_prefix, stream, tok2)
        c2.close()
        out = {"fix": label, "after": after,
               "gain_hit_ratio": after["hit_ratio"] - before["hit_ratio"],
               "gain_hit_tokens": after["hit_tokens"] - before["hit_tokens"]}
        if prices:
            after["money"] = _money(after, prices)
            out["gain_savings"] = after["money"]["savings"] - before["money"]["savings"]
        return out

    per = [run([f], f) for f in fixes]
    together = per[0] if len(fixes) == 1 else run(fixes, "all: " + ",".join(fixes))
    if len(fixes) == 1:
        together = dict(together, fix="all: " + fixes[0])
    return {"config": {"ttl_s": None if ttl == math.inf else ttl, "block": block,
                       "min_prefix": min_prefix, "stream": stream, "profile": profile or "ideal"},
            "before": before, "fixes": per, "all": together}


def format_whatif(res: dict) -> str:
    c = res["config"]
    lines = [f"ttl {format_ttl(c['ttl_s'])}, block {c['block']}, min prefix {c['min_prefix']}, "
             f"stream {c['stream']}, profile {c['profile']}", "",
             f"{'fix':<44} {'hit ratio':>9} {'gain':>8} {'hit tokens':>13}",
             f"{'(as logged)':<44} {100 * res['before']['hit_ratio']:>8.2f}% {'':>8} "
             f"{res['before']['hit_tokens']:>13,}"]
    for f in res["fixes"] + [res["all"]]:
        line = (f"{f['fix']:<44} {100 * f['after']['hit_ratio']:>8.2f}% "
                f"{100 * f['gain_hit_ratio']:>+7.2f} {f['after']['hit_tokens']:>13,}")
        if "gain_savings" in f:
            line += f"   savings {f['gain_savings']:+,.2f}"
        lines.append(line)
    return "\n".join(lines)
