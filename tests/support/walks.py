"""The replay's input and output for generated requests (``support.gen``): their
prompts in processing order, their walks stored, the streamed replay beside the
plain one."""

from __future__ import annotations

import itertools

import numpy as np

from replay.core import streamed
from support import oracle
from replay.core.prompts import Prompt
from replay.core.replay import replay_prompts, store_walks
from replay.core.streams import MODES
from replay.times import INF_US


def prompts(reqs, output: bool = True):
    """The requests as the replay's prompts, in processing order (with their
    outputs, or none with ``output=False``)."""
    return [Prompt(i, reqs[i].ts, reqs[i].tenant, reqs[i].key, reqs[i].session,
                   np.array(reqs[i].tokens, dtype=np.int32), None,
                   np.array(reqs[i].output, dtype=np.int32) if output else None, len(reqs[i].tokens),
                   reqs[i].model)
            for i in oracle.time_order(reqs)]


def store(con, reqs, modes=MODES, horizon_us=INF_US):
    """The walks of ``reqs`` replayed and stored in ``con``."""
    res = replay_prompts(prompts(reqs), modes, horizon_us=horizon_us)
    store_walks(con, {k: v for k, v in res.items() if k != "_nodes"}, horizon_us)


def rounded(rows):
    return [{**r, "hit_ratio": round(r["hit_ratio"], 12)} for r in rows]


VARIANTS = ("prompt", "prompt+output")


def prompts_of(reqs, ms: bool = False):
    """The requests as ``iter_prompts`` yields them: processing order, and each
    text prompt's ``shared`` count with its conversation's previous prompt (the
    ``_known`` shortcut). ``ms``: times on a millisecond grid."""
    out, last = [], {}
    for i in oracle.time_order(reqs):
        r = reqs[i]
        toks = np.array(r.tokens, dtype=np.int32)
        conv = (r.tenant, r.session or r.key)
        shared, previous = 0, None
        if conv in last:
            ptoks, prev = last[conv]
            n = min(len(ptoks), len(toks))
            diff = np.flatnonzero(ptoks[:n] != toks[:n])
            shared = int(diff[0]) if len(diff) else n
            previous = prev if shared else None
        last[conv] = (toks, (r.ts, r.key, r.session, r.model))
        ts = r.ts * 1000 if ms else r.ts
        out.append(Prompt(i, ts, r.tenant, r.key, r.session, toks, None,
                          np.array(r.output, dtype=np.int32), len(toks), r.model, shared,
                          None if previous is None else ((previous[0] * 1000 if ms else previous[0]),
                                                         *previous[1:])))
    return out


def partitioned(prompts, modes, variants, horizon, parts, depth, segments=None, size=2, batch=64):
    """The streamed replay's rows, by walkers in this process (sorted into
    processing order), and its pool."""
    rows: dict = {key: [] for key in itertools.product(variants, modes)}

    def sink(part):
        for key, rs in part.items():
            rows[key].extend(rs)

    pool = streamed.LocalPool(size, variants, horizon)
    streamed.replay_streamed(prompts, pool, sink, modes, variants, parts, depth, segments, batch=batch)
    order = {p.request_id: i for i, p in enumerate(prompts)}
    return {key: sorted(rs, key=lambda r: order[r[0]]) for key, rs in rows.items()}, pool


def same(prompts, modes, variants, horizon, parts, depth, segments=None, size=2, batch=64):
    want = replay_prompts(prompts, modes, variants, horizon)
    got, pool = partitioned(prompts, modes, variants, horizon, parts, depth, segments, size, batch)
    for key in want:
        if key != "_nodes":
            assert got[key] == want[key], (key, parts, depth, horizon, size, batch)
    assert pool.most_busy <= streamed.CALLS_PER_WALKER
    return got


WALK_ROWS = """SELECT variant, mode, request_id, stream, model, ts_us, prompt_tokens, gaps, depths, origins
               FROM walks ORDER BY variant, mode, request_id"""


def engine_rows(con, engine, horizon_us=INF_US, modes=MODES, variants=VARIANTS) -> list:
    """Every `walks` row after ``prepare`` replays ``modes`` × ``variants`` on ``engine``
    (None: the single pass, the oracle), the sets forgotten first and current after."""
    from replay import api
    from replay.store import walksets

    keys = [(v, m) for v in variants for m in modes]
    walksets.forget(con, keys)
    api.prepare(con, modes=modes, variants=variants, horizon_us=horizon_us, engine=engine)
    assert not walksets.stale(con, keys, horizon_us)
    return con.execute(WALK_ROWS).fetchall()
