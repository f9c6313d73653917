"""The naive baseline: what a straightforward implementation does.

Every request is parsed, its FULL prompt rendered and tokenized (one
``encode`` of the whole rendered text by Hugging Face ``tokenizers``, the
reference the pipeline's encoder must agree with; nothing shared between
requests, no line-piece cache, no fastokens), and
then, for every block size of the grid, every block of every prompt is walked
through a plain dict of (stream, chained block hash) → last-used time (the
stream seeds the chain, so one dict per stream mode holds every stream). The
sweep is computed from those walks. No trie, no segments, no SQL, no pruning.

Its results must equal the pipeline's (``results_identical`` in
``bench/pipeline.py``), which makes it a second, independent check of the
pipeline on realistic traffic.
"""

from __future__ import annotations

import json
import math
import os
import time
from bisect import bisect_right

from replay.readers.formats import Options, Reject, convert_record, detect_record
from replay.readers.ingest import expand_paths
from replay.text.render import render_request, render_text
from replay.core.replay import stream_key
from replay.text.tokenize import load_tokenizer


def _records(paths):
    """(ts, input order, tenant, key, session, body dict) of every loadable JSONL record."""
    opts = Options()
    order = 0
    for path in expand_paths(paths):
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
            yield (row["ts"], order, row["tenant"], row.get("prompt_cache_key"),
                   row.get("session"), json.loads(row["body"]), fmt)


def run(paths, ttls, blocks, min_prefixes, streams, tokenizer=None) -> dict:
    """Naive sweep over the logs at ``paths``; returns {"rows": [...], "seconds": {...}}."""
    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer)
    tok.close()  # no encoder process: the plain reference tokenizer, as a straightforward job would use it
    reference = tok.tokenizer
    reqs = []
    for ts, order, tenant, key, session, body, fmt in _records(paths):
        text = render_text(render_request(body, fmt), tok)
        toks = reference.encode(text, add_special_tokens=False).ids  # the whole prompt, every time
        reqs.append((ts, order, tenant, key, session, toks))
    reqs.sort(key=lambda r: (r[0], r[1]))  # time, ties in input order
    t1 = time.perf_counter()

    ttls = sorted(ttls)
    acc = {}  # (mode, ttl, block, min_prefix) -> [requests, prompt_tokens, hit_tokens, requests_hit]
    for mode in streams:
        for B in blocks:
            last_used: dict[int, float] = {}
            cells = {(ttl, m): [0, 0, 0, 0] for ttl in ttls for m in min_prefixes}
            for ts, _o, tenant, key, session, toks in reqs:
                h = hash(stream_key(mode, tenant, key, session))
                n_blocks = len(toks) // B
                chain = []
                gaps = []
                matching = True
                for i in range(n_blocks):
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
                for ttl in ttls:
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
    rows = []
    for (mode, ttl, B, m), (n, pt, ht, rh) in acc.items():
        rows.append({"stream": mode, "ttl_s": None if ttl == math.inf else float(ttl), "block": B,
                     "min_prefix": m, "requests": n, "prompt_tokens": pt, "hit_tokens": ht,
                     "requests_hit": rh})
    t2 = time.perf_counter()
    return {"rows": rows, "seconds": {"parse_render_tokenize": t1 - t0, "walk_sweep": t2 - t1,
                                      "total": t2 - t0},
            "logical_prompt_tokens": sum(len(r[5]) for r in reqs), "requests": len(reqs),
            "pid": os.getpid()}
