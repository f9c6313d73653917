"""The capacity pass driven directly (no database): what the capacity and tier
tests compare with the contract's brute force."""

from __future__ import annotations

import numpy as np

from replay.core import capacity as cap
from support import oracle
from replay.core.prompts import Prompt
from replay.core.streams import stream_key
from replay.times import INF_US


def prompts_of(reqs):
    """Generated requests as the pass's prompts, in processing order."""
    return [Prompt(i, reqs[i].ts, reqs[i].tenant, reqs[i].key, reqs[i].session,
                   np.array(reqs[i].tokens, dtype=np.int32), None, None, len(reqs[i].tokens), reqs[i].model)
            for i in oracle.time_order(reqs)]


def run_pass(reqs, mode, blocks, replicas=1, routing="round-robin", seed=0, horizon=INF_US):
    """Segments per block size, and each request's replica (input order)."""
    ps = prompts_of(reqs)
    router = cap.Router(replicas, routing, seed, len(ps))
    cp = cap.CapacityPass(mode, blocks, replicas, horizon)
    replica_of = [0] * len(reqs)
    for i, p in enumerate(ps):
        r = router(i, stream_key(mode, p.tenant, p.key, p.session))
        replica_of[p.request_id] = r
        cp.add(p, r)
    return cp.result(), replica_of
