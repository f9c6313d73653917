"""Top shared prefixes: the points of the caches' tries that served the most hits.

The contract, for one configuration — stream mode, TTL τ, block B, minimum
prefix m (by default the report's headline: tenant, 5 min, 16, 0):

* each request ``r`` has its hit ``h(r)`` (semantics.md: floor(L_τ/B)·B, 0 if
  < m, read from the walks through ``replay.core.hits``) and its *hit prefix*
  ``H_r = P_r[:h(r)]`` within its cache ``c(r)`` (stream key and model);
* the *candidate* prefixes of a cache are the nodes of the trie of its hit
  prefixes ``{H_r : h(r) > 0}`` that end some ``H_r`` or where it branches
  (two or more children);
* for a prefix ``Q``: ``requests(Q) = #{r : h(r) ≥ |Q| and P_r[:|Q|] = Q}``
  and ``hit_tokens(Q) = requests(Q) × |Q|`` — the tokens of ``Q`` served as
  hits. The same token sequence under the same model in several caches is one
  prefix: its requests are counted over every cache of that model (so the
  sums over caches), ``streams`` = the caches among them, ``sessions`` = the
  distinct session ids of its requests (requests without one not counted);
* ranked by ``hit_tokens`` (``by="requests"``: by requests first), ties by
  requests, then the longer prefix, then the one reused first (processing
  order): a total, reproducible order — two different prefixes of one length
  never share a request.

Each prefix is described without text: its length, the parts of the rendered
prompt it spans (tools, system, message k, the generation prompt — a part it
ends inside is named with ``(partial)``; a ``tokens`` log is one part
``tokens``, a block trace ``blocks``), its model, streams and sessions, the
first request that reused it, and a short hash: 12 hex digits of ``blake2b``
over the model and the token ids, keyed with the masking key of
``replay.analysis.diagnose`` (drawn per process: equal within one output, and a
short prefix cannot be recovered by hashing guesses). The text only with
``show_text`` (decoded with the tokenizer that encoded the prompts).

How: one pass over the prompts in processing order (``replay.core.prompts``)
inserts every ``H_r`` into one compressed trie per model (edges as numpy runs,
split where a match ends; a conversation's next turn starts at the node where
its previous hit prefix ended, so a long conversation is not walked again from
the root). Candidates per cache are found in one bottom-up pass that merges
the sets of caches and sessions small into large: a node is a candidate when
some ``H_r`` ends there or one cache's prefixes continue into two of its
children. Block traces: a hit ending inside a trace block ends on a symbol of
its own (block id and length), so a prefix ending inside a block counts the
requests that end there at that length, not those passing through the block
(only a trace's partial last block can do this when B divides its block).
"""

from __future__ import annotations

import hashlib

import numpy as np

from replay.analysis.diagnose.rules import _MASK_KEY  # the masking key: one per process
from replay.analysis.report import headline_config
from replay.core import hits
from replay.core.grid import Grid
from replay.core.prompts import RECENT_CONVERSATIONS, iter_prompts
from replay.core.streams import check_modes
from replay.times import format_ttl, parse_ttl, ttl_us
from replay.core.trie import common_prefix_len
from replay.core.walks import read_walks
from replay.prepare import decoding_tokenizer, prepare
from replay.text.segids import MARKER_SEG

BY = ("hit_tokens", "requests")
HASH_HEX = 12
_EMPTY = np.zeros(0, dtype=np.int64)
_PSEUDO = 1 << 62  # symbols of a hit ending inside a trace block: above every token id and block symbol


def prefix_hash(model: str | None, tokens) -> str:
    """The prefix's short keyed digest (``HASH_HEX`` hex digits) of its model and token ids."""
    h = hashlib.blake2b(digest_size=HASH_HEX // 2, key=_MASK_KEY)
    h.update(b"\x00" if model is None else b"\x01" + model.encode("utf-8", "surrogatepass") + b"\x00")
    h.update(np.asarray(tokens, dtype="<i8").tobytes())
    return h.hexdigest()


class PrefixTrie:
    """The compressed trie of one model's hit prefixes. Nodes are ints (0 the
    root); node ``v`` ends at symbol depth ``depth[v]`` (token depth
    ``ntok[v]``), its edge from its parent holds ``edge[v]``, and ``ends[v]``
    lists the rows (hit requests) whose prefix ends there. Nodes are split but
    never merged or removed, so a node stays where it is (a conversation's
    finger)."""

    def __init__(self):
        self.children: list[dict[int, int]] = [{}]
        self.edge: list[np.ndarray] = [_EMPTY]
        self.depth: list[int] = [0]
        self.ntok: list[int] = [0]
        self.parent: list[int] = [-1]
        self.ends: list[list[int] | None] = [None]

    def __len__(self) -> int:
        return len(self.depth)

    def _node(self, edge: np.ndarray, depth: int, ntok: int, parent: int) -> int:
        self.children.append({})
        self.edge.append(edge)
        self.depth.append(depth)
        self.ntok.append(ntok)
        self.parent.append(parent)
        self.ends.append(None)
        return len(self.depth) - 1

    def insert(self, seq: np.ndarray, row: int, node: int = 0, tokd: np.ndarray | None = None) -> int:
        """Add ``seq`` (a hit prefix) as ``row``, starting at ``node`` (a node
        whose path is ``seq[:depth[node]]``); ``tokd[d]`` = the token depth of
        symbol depth ``d`` (None: symbols are tokens). Returns its end node."""
        pos, n = self.depth[node], len(seq)
        while pos < n:
            sym = int(seq[pos])
            child = self.children[node].get(sym)
            if child is None:
                leaf = self._node(seq[pos:].copy(), n, n if tokd is None else int(tokd[n]), node)
                self.children[node][sym] = leaf
                node, pos = leaf, n
                break
            e = self.edge[child]
            m = common_prefix_len(e, seq[pos:pos + len(e)])
            if m < len(e):  # the match ends inside the edge: split it
                d = pos + m
                mid = self._node(e[:m].copy(), d, d if tokd is None else int(tokd[d]), node)
                rest = e[m:].copy()
                self.edge[child] = rest
                self.parent[child] = mid
                self.children[mid][int(rest[0])] = child
                self.children[node][sym] = mid
                node = mid
                pos = d
            else:
                node, pos = child, pos + len(e)
        if self.ends[node] is None:
            self.ends[node] = [row]
        else:
            self.ends[node].append(row)
        return node

    def path(self, node: int) -> np.ndarray:
        """The symbols from the root to ``node``."""
        parts = []
        while node > 0:
            parts.append(self.edge[node])
            node = self.parent[node]
        return np.concatenate(parts[::-1]).astype(np.int64) if parts else _EMPTY

    def candidates(self, cache: np.ndarray, session: list, pos: np.ndarray) -> dict[str, np.ndarray]:
        """The candidate nodes with their figures, as arrays: ``node``,
        ``requests``, ``n_tokens``, ``first`` (the earliest position of a
        request reusing it), ``streams``, ``sessions`` (rows: ``cache[row]``,
        ``session[row]`` (None: none), ``pos[row]``)."""
        order, stack = [], [0]
        while stack:
            v = stack.pop()
            order.append(v)
            stack.extend(self.children[v].values())
        n = len(self.depth)
        cnt = np.zeros(n, dtype=np.int64)
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        caches: list[set | None] = [None] * n
        sessions: list[set | None] = [None] * n
        out: dict[str, list] = {k: [] for k in ("node", "requests", "n_tokens", "first", "streams", "sessions")}
        for v in reversed(order):  # children before their parent
            kids = list(self.children[v].values())
            branch = False
            if kids:
                kids.sort(key=lambda k: len(caches[k]), reverse=True)
                U = caches[kids[0]]
                for k in kids[1:]:  # smaller into larger
                    for x in caches[k]:
                        if x in U:
                            branch = True  # one cache's prefixes continue into two children
                        else:
                            U.add(x)
                S = max((sessions[k] for k in kids), key=len)
                for k in kids:
                    if sessions[k] is not S:
                        S.update(sessions[k])
                    caches[k] = sessions[k] = None
                c = int(cnt[kids].sum())
                f = int(first[kids].min())
            else:
                U, S, c, f = set(), set(), 0, int(first[v])
            ends = self.ends[v]
            if ends:
                for row in ends:
                    U.add(int(cache[row]))
                    if session[row] is not None:
                        S.add(session[row])
                    f = min(f, int(pos[row]))
                c += len(ends)
            caches[v], sessions[v], cnt[v], first[v] = U, S, c, f
            if v and (ends or branch):
                for k, x in (("node", v), ("requests", c), ("n_tokens", self.ntok[v]), ("first", f),
                             ("streams", len(U)), ("sessions", len(S))):
                    out[k].append(x)
        return {k: np.asarray(x, dtype=np.int64) for k, x in out.items()}


def _hit_table(con, stream: str, ttl: float, block: int, min_prefix: int) -> tuple[dict, dict]:
    """request_id → (hit tokens, cache index) of the requests with a hit, and
    cache index → (stream key, model)."""
    w = read_walks(con, (stream,), horizon_us=ttl_us(ttl))
    L = hits.depths_under(w.offsets, w.gaps, w.depths, [ttl_us(ttl)])[:, 0]
    h = hits.block_hit(L, int(block), int(min_prefix))
    caches: dict[tuple, int] = {}
    out = {}
    for k in np.flatnonzero(h > 0).tolist():
        c = caches.setdefault((w.stream[k], w.model[k]), len(caches))
        out[int(w.request_id[k])] = (int(h[k]), c)
    return out, {v: k for k, v in caches.items()}


def _trace_prefix(p, h: int) -> tuple[np.ndarray, np.ndarray]:
    """A block trace's hit prefix of ``h`` tokens as symbols, with the token
    depth of each symbol depth (a block it ends inside: a symbol of its own)."""
    cum = np.asarray(p.cum, dtype=np.int64)
    k = int(np.searchsorted(cum, h, side="left"))  # cum[k] >= h
    seq = np.asarray(p.symbols[:k], dtype=np.int64)
    if cum[k] != h:  # ends inside block k - 1
        pseudo = _PSEUDO + (hash((int(seq[-1]), h)) & ((1 << 61) - 1))
        seq = np.concatenate([seq[:-1], [pseudo]])
    return seq, np.concatenate([cum[:k], [h]])


def compute(con, stream: str = "tenant", ttl: float | str = 300, block: int = 16, min_prefix: int = 0,
            tokenizer=None, progress: bool = False):
    """The tries and the candidate figures of one configuration (see the module doc):
    ``(tries by model, rows, candidates, caches)``; ``rows`` holds per hit request
    its ``request_id``, ``cache``, ``session``, ``pos`` (processing order), ``model``."""
    ttl = parse_ttl(ttl)
    check_modes((stream,))
    if int(block) < 1 or int(min_prefix) < 0:
        raise ValueError("block must be ≥ 1 and the minimum prefix ≥ 0")
    prepare(con, modes=(stream,), horizon_us=ttl_us(ttl), tokenizer=tokenizer, progress=progress)
    table, caches = _hit_table(con, stream, ttl, block, min_prefix)
    tries: dict = {}
    rows = {"request_id": [], "cache": [], "session": [], "pos": [], "model": []}
    finger: dict = {}  # conversation → (model, end node, depth) of its latest prompt's hit prefix
    for pos, p in enumerate(iter_prompts(con)):
        conv = (p.tenant, p.session or p.key)
        got = table.get(p.request_id)
        if got is None:
            if p.cum is None:
                finger.pop(conv, None)
            continue
        h, c = got
        trie = tries.get(p.model)
        if trie is None:
            trie = tries[p.model] = PrefixTrie()
        row = len(rows["pos"])
        for k, v in (("request_id", p.request_id), ("cache", c), ("session", p.session), ("pos", pos),
                     ("model", p.model)):
            rows[k].append(v)
        if p.cum is not None:  # a block trace
            seq, tokd = _trace_prefix(p, h)
            trie.insert(seq, row, 0, tokd)
            continue
        start = 0
        f = finger.get(conv) if p.shared else None
        if f is not None and f[0] == p.model and f[2] <= min(p.shared, h):
            start = f[1]  # the conversation's previous hit prefix is this one's prefix
        end = trie.insert(p.symbols[:h], row, start)
        finger.pop(conv, None)  # (kept in order of use)
        finger[conv] = (p.model, end, h)
        if len(finger) > 2 * RECENT_CONVERSATIONS:  # iter_prompts shares only its recent conversations'
            finger.pop(next(iter(finger)))
    cand = _candidates(tries, rows)
    return tries, rows, cand, caches


def _candidates(tries: dict, rows: dict) -> dict[str, np.ndarray]:
    cache = np.asarray(rows["cache"], dtype=np.int64)
    pos = np.asarray(rows["pos"], dtype=np.int64)
    parts, models = [], list(tries)
    for mi, model in enumerate(models):
        c = tries[model].candidates(cache, rows["session"], pos)
        c["model"] = np.full(len(c["node"]), mi, dtype=np.int64)
        parts.append(c)
    keys = ("node", "requests", "n_tokens", "first", "streams", "sessions", "model")
    out = {k: np.concatenate([c[k] for c in parts]) if parts else _EMPTY for k in keys}
    out["hit_tokens"] = out["requests"] * out["n_tokens"]
    out["models"] = models
    return out


def rank(cand: dict, by: str = "hit_tokens") -> np.ndarray:
    """Candidate indexes best first: by hit tokens (or requests), then requests
    (or hit tokens), then the longer, then the one reused first."""
    if by not in BY:
        raise ValueError(f"unknown ranking {by!r}; choose from {', '.join(BY)}")
    a, b = (cand["hit_tokens"], cand["requests"]) if by == "hit_tokens" else (cand["requests"], cand["hit_tokens"])
    return np.lexsort((cand["first"], -cand["n_tokens"], -b, -a))


def top_prefixes(con, ttl: float | str = 300, block: int = 16, min_prefix: int = 0, stream: str = "tenant",
                 top: int | None = 20, by: str = "hit_tokens", show_text: bool = False, tokenizer=None,
                 progress: bool = False, with_hash: bool = True) -> list[dict]:
    """The top shared prefixes of one configuration, best first (module doc): each a
    dict with ``rank``, ``model``, ``n_tokens``, ``hit_tokens``, ``requests``,
    ``sessions``, ``streams``, ``parts``, ``hash`` (unless ``with_hash`` is
    false), ``first_request``, ``first_stream``, and ``text`` with ``show_text``."""
    if by not in BY:
        raise ValueError(f"unknown ranking {by!r}; choose from {', '.join(BY)}")
    tok = None
    if show_text:
        tok = decoding_tokenizer(con, tokenizer)
    tries, rows, cand, caches = compute(con, stream, ttl, block, min_prefix, tokenizer=tok or tokenizer,
                                        progress=progress)
    order = rank(cand, by)
    if top is not None:
        order = order[:top]
    first_row = {p: r for r, p in enumerate(rows["pos"])}
    out = []
    for i, k in enumerate(order.tolist(), 1):
        model = cand["models"][int(cand["model"][k])]
        row = first_row[int(cand["first"][k])]
        trie = tries[model]
        node = int(cand["node"][k])
        entry = {"rank": i, "model": model, "n_tokens": int(cand["n_tokens"][k]),
                 "hit_tokens": int(cand["hit_tokens"][k]), "requests": int(cand["requests"][k]),
                 "sessions": int(cand["sessions"][k]), "streams": int(cand["streams"][k]),
                 "parts": None, "first_request": int(rows["request_id"][row]),
                 "first_stream": caches[rows["cache"][row]][0]}
        symbols = trie.path(node)
        if with_hash:
            entry["hash"] = prefix_hash(model, symbols)
        if show_text:
            entry["text"] = (None if len(symbols) and symbols.max() >= _PSEUDO or symbols.min(initial=0) < 0
                             else tok.tokenizer.decode(symbols.tolist(), skip_special_tokens=False))
        out.append(entry)
    _add_parts(con, out)
    return out


# --------------------------------------------------------------------------- parts

def _add_parts(con, entries: list[dict]) -> None:
    """Each entry's ``parts``, from its first request's segments and their parts."""
    ids = sorted({e["first_request"] for e in entries})
    if not ids:
        return
    q = ",".join(str(i) for i in ids)
    got = {rid: (fmt, segs, parts) for rid, fmt, segs, parts in con.execute(
        f"SELECT r.request_id, r.format, p.seg_ids, p.seg_parts FROM requests r "
        f"LEFT JOIN prompts p USING (request_id) WHERE r.request_id IN ({q})").fetchall()}
    seg_ids = sorted({s for _, segs, _ in got.values() if segs for s in segs})
    lengths = {}
    for start in range(0, len(seg_ids), 5000):
        chunk = ",".join(str(s) for s in seg_ids[start:start + 5000])
        lengths.update(con.execute(f"SELECT seg_id, n_tokens FROM segments WHERE seg_id IN ({chunk})").fetchall())
    for e in entries:
        fmt, segs, parts = got.get(e["first_request"], (None, None, None))
        if segs is None:
            e["parts"] = ["blocks"]
        elif fmt == "tokens":
            e["parts"] = ["tokens"]
        else:
            e["parts"] = part_labels(segs, parts, [lengths[s] for s in segs], e["n_tokens"])


def part_labels(seg_ids, seg_parts, seg_tokens, n: int) -> list[str]:
    """The parts the first ``n`` tokens of a prompt span (``seg_parts``: 0 tools,
    1 system, 2+k message k, a last lone ``assistant`` marker the generation
    prompt; the BOS marker named only when it is all): whole messages in a row
    as one range, a part the prefix ends inside marked ``(partial)``."""
    bos, gen = MARKER_SEG["bos"], MARKER_SEG["assistant"]
    top = max(seg_parts) if len(seg_parts) else 0
    last = len(seg_ids) - 1
    spans: list[list[int]] = []  # [part code, start, end] in tokens, -1 the generation prompt
    at = 0
    for i, (sid, part, size) in enumerate(zip(seg_ids, seg_parts, seg_tokens)):
        start, at = at, at + size
        if i == 0 and sid == bos and part == 0:
            continue
        code = -1 if (part == top >= 2 and i == last and sid == gen and (i == 0 or seg_parts[i - 1] != part)) else part
        if spans and spans[-1][0] == code:
            spans[-1][2] = at
        else:
            spans.append([code, start, at])
    spans = [s for s in spans if s[1] < n]
    if not spans:
        return ["bos"]
    labels: list[str] = []
    run: list[int] = []  # whole messages in a row

    def flush():
        if run:
            labels.append(f"message {run[0]}" if len(run) == 1 else f"messages {run[0]}-{run[-1]}")
            run.clear()

    for code, _, end in spans:
        whole = end <= n
        name = {0: "tools", 1: "system", -1: "generation prompt"}.get(code)
        if name is None and whole:
            run.append(code - 2)
            continue
        flush()
        name = name or f"message {code - 2}"
        labels.append(name if whole else f"{name} (partial)")
    flush()
    return labels


# --------------------------------------------------------------------------- report

REPORT_TOP = 10


def prefixes_section(con, out_dir=None, grid: Grid | None = None, top: int = REPORT_TOP, tokenizer=None) -> str:
    """Markdown for the report: the top prefixes at the headline configuration
    (no text, and no hash: its key is drawn per process, and two runs over the
    same data write the same report)."""
    h = headline_config(grid or Grid())
    rows = top_prefixes(con, ttl=h["ttl"], block=h["block"], min_prefix=h["min_prefix"], stream=h["stream"],
                        top=top, tokenizer=tokenizer, with_hash=False)
    lines = ["## Top shared prefixes", "",
             f"Where requests branch in the per-{h['stream']} tries of hit prefixes (TTL {format_ttl(h['ttl'])}, "
             f"block {h['block']}, minimum prefix {h['min_prefix']}), ranked by the hit tokens each served: the "
             "requests that reused it × its length. A shared system prompt or tool list shows up here with its "
             "exact size. No text is shown: `replay prefixes --show-text` shows it.", ""]
    if not rows:
        return "\n".join(lines + ["_No prefix is shared at this configuration._", ""])
    lines += ["| rank | tokens | hit tokens | requests | sessions | streams | model | parts |",
              "|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['rank']} | {r['n_tokens']:,} | {r['hit_tokens']:,} | {r['requests']:,} | "
                     f"{r['sessions']:,} | {r['streams']:,} | {r['model'] or '—'} | {', '.join(r['parts'])} |")
    return "\n".join(lines + [""])
