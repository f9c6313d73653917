"""The baselines: what a straightforward implementation does, in two steps of cleverness.

Both walk every block of every prompt through a plain dict of (cache, chained
block hash) → last-used time — the cache is the stream key and the model, which
seed the chain, so one dict per stream mode holds every cache — for every block
size of the grid, and sweep from those walks. No trie, no SQL, no pruning.

* ``run`` (**naive**): every request is parsed, its FULL prompt rendered and
  tokenized (one ``encode`` of the whole rendered text by Hugging Face
  ``tokenizers``, the reference the pipeline's encoder must agree with;
  nothing shared between requests), then walked.
* ``run_unique`` (**unique-content tokenization + per-block dict**): the
  pipeline's own ingest and tokenize stages (each unique piece of content
  tokenized once), then the same dict walk instead of the trie and the
  compiled sweep.

naive / unique is what tokenizing unique content once is worth; unique /
pipeline what the trie and the one-pass sweep are worth. Both results must
equal the pipeline's (``results_identical`` in ``bench/pipeline.py``), which
makes them two more independent checks of the pipeline on realistic traffic.
"""

from __future__ import annotations

import json
import os
import time
from bisect import bisect_right

from replay import api
from replay.core.streams import stream_key
from replay.times import INF_US, ttl_us
from replay.readers.formats import Options, Reject, convert_record, detect_record
from replay.readers.ingest import expand_paths
from replay.text.render import render_request, render_text
from replay.text.tok import load_tokenizer
from replay.text.tokenize import load_prompt_tokens


def _records(paths):
    """(ts µs, input order, tenant, key, session, model, body dict, format) of every loadable JSONL record."""
    order = 0
    for path in expand_paths(paths):
        opts = Options()  # a file decides its own time unit
        with open(path, "rb") as fh:
            lines = fh.read().splitlines()
        fmt = None
        for raw in lines:  # detection as ingest does (first confident record, else first guess)
            if raw.strip():
                f, confident = detect_record(json.loads(raw))
                if f is not None and (confident or fmt is None):
                    fmt = f
                if confident:
                    break
        for raw in lines:
            if not raw.strip():
                continue
            try:
                row = convert_record(json.loads(raw), fmt, opts)
            except Reject:
                continue
            order += 1
            yield (row["ts_us"], order, row["tenant"], row.get("prompt_cache_key"),
                   row.get("session"), row.get("model"), json.loads(row["body"]), fmt)


def block_dict_sweep(reqs, ttls, blocks, min_prefixes, streams) -> list[dict]:
    """The sweep rows of ``reqs`` — (ts µs, order, tenant, key, session, model,
    tokens) in processing order — by walking each block through a dict."""
    ttls_us = sorted(ttl_us(t) for t in ttls)
    acc = {}  # (mode, ttl, block, min_prefix) -> [requests, prompt_tokens, hit_tokens, requests_hit]
    for mode in streams:
        for B in blocks:
            last_used: dict[int, int] = {}
            cells = {(ttl, m): [0, 0, 0, 0] for ttl in ttls_us for m in min_prefixes}
            for ts, _o, tenant, key, session, model, toks in reqs:
                h = hash((stream_key(mode, tenant, key, session), model))
                chain, gaps, matching = [], [], True
                for i in range(len(toks) // B):
                    blk = toks[i] if B == 1 else tuple(toks[i * B:(i + 1) * B])
                    h = hash((h, blk))
                    chain.append(h)
                    if matching:
                        lu = last_used.get(h)
                        if lu is None:
                            matching = False
                        else:
                            gaps.append(ts - lu)
                for h in chain:
                    last_used[h] = ts
                # last-used never grows deeper along a chain: gaps are non-decreasing
                for ttl in ttls_us:
                    k = bisect_right(gaps, ttl)
                    for m in min_prefixes:
                        hit = k * B
                        if hit < m:
                            hit = 0
                        c = cells[(ttl, m)]
                        c[0] += 1
                        c[1] += len(toks)
                        c[2] += hit
                        c[3] += hit > 0
            for (ttl, m), c in cells.items():
                acc[(mode, ttl, B, m)] = c
    return [{"stream": mode, "ttl_s": None if ttl == INF_US else ttl / 1e6, "block": B, "min_prefix": m,
             "requests": n, "prompt_tokens": pt, "hit_tokens": ht, "requests_hit": rh}
            for (mode, ttl, B, m), (n, pt, ht, rh) in acc.items()]


def run(paths, ttls, blocks, min_prefixes, streams, tokenizer=None) -> dict:
    """The naive sweep over the logs at ``paths``; returns {"rows": [...], "seconds": {...}}."""
    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer)
    tok.close()  # no encoder process: the plain reference tokenizer, as a straightforward job would use it
    reference = tok.tokenizer
    reqs = []
    for ts, order, tenant, key, session, model, body, fmt in _records(paths):
        text = render_text(render_request(body, fmt), tok)
        toks = reference.encode(text, add_special_tokens=False).ids  # the whole prompt, every time
        reqs.append((ts, order, tenant, key, session, model, toks))
    reqs.sort(key=lambda r: (r[0], r[1]))  # time, ties in input order
    t1 = time.perf_counter()
    rows = block_dict_sweep(reqs, ttls, blocks, min_prefixes, streams)
    t2 = time.perf_counter()
    return {"rows": rows, "seconds": {"parse_render_tokenize": t1 - t0, "walk_sweep": t2 - t1,
                                      "total": t2 - t0},
            "logical_prompt_tokens": sum(len(r[6]) for r in reqs), "requests": len(reqs), "pid": os.getpid()}


def run_unique(paths, dbfile, ttls, blocks, min_prefixes, streams, tokenizer=None) -> dict:
    """The pipeline's ingest and tokenize (unique content once), then the dict walk."""
    t0 = time.perf_counter()
    con = api.open_db(dbfile)
    tok = api.load_tokenizer(tokenizer)
    api.ingest(con, paths, tokenizer=tok)
    api.prepare(con, modes=(), tokenizer=tok)  # tokenize only
    tok.close()
    meta = con.execute("SELECT request_id, ts_us, tenant, prompt_cache_key, session, model FROM requests "
                       "ORDER BY ts_us, request_id").fetchall()
    toks = load_prompt_tokens(con, [m[0] for m in meta])
    reqs = [(ts, rid, tenant, key, session, model, toks[rid].tolist()) for rid, ts, tenant, key, session, model
            in meta if rid in toks]
    con.close()
    t1 = time.perf_counter()
    rows = block_dict_sweep(reqs, ttls, blocks, min_prefixes, streams)
    t2 = time.perf_counter()
    return {"rows": rows, "seconds": {"ingest_tokenize_load": t1 - t0, "walk_sweep": t2 - t1, "total": t2 - t0},
            "logical_prompt_tokens": sum(len(r[6]) for r in reqs), "requests": len(reqs), "pid": os.getpid()}

