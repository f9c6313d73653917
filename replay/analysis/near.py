"""Near duplicates: the raw ceiling of a semantic cache, before any labels.

A request is a near duplicate under (τ, θ) when the embedding of its last user
turn has cosine ≥ θ with that of an earlier request of the same cache (stream
key and model) at most τ before it (integer µs; a gap of exactly τ counts;
processing order). Exact duplicates count too (cosine 1). The last user turn
is its text parts (tool results' text when it has nothing else), its first
2,000 characters: a query, not a tool's whole output. Requests whose last user
turn has no text (block traces) are counted, never near.

The embedding model ships inside a package and runs offline on CPU (the
``semantic`` extra): WordLlama's ``l2_supercat`` (256-dimensional static token
embeddings, mean-pooled; weights and tokenizer inside the wheel). It is
English-centric (trained on English text with Llama 2's tokenizer): other
languages embed poorly. Static embeddings score a negation or a changed entity
close to the original — raw near rates overstate what a semantic cache could
safely answer, which is why they are only ever shown beside that warning, and
adjusted once labels exist.

The search is exact: for each request, the largest cosine over the earlier
requests of its cache within τ, by blocks of matrix products.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from replay.core.prompts import time_ordered_chunks
from replay.core.streams import check_modes, stream_key
from replay.times import ttl_us
from replay.prepare import prepare
from replay.store import db
from replay.store.jsontext import loads

THRESHOLDS = (0.80, 0.85, 0.90, 0.95, 0.99)
MODEL_NAME = "wordllama l2_supercat_256 (static token embeddings, English-centric)"
ROWS_PER_BLOCK = 256  # rows of the similarity matrix computed at once
BODIES_PER_QUERY = 200
TEXT_CHARS = 2_000  # of the last user turn embedded: a query, not a tool's whole output
WARNING = ("raw embedding similarity: published audits found only a small fraction of such 'hits' reusable "
           "when judged (about 2 % at 0.90 on LMSYS-Chat, Quora and MOSS); label a sample before trusting it")

SCHEMA = {"stream": pl.Utf8, "ttl_s": pl.Float64, "threshold": pl.Float64, "requests": pl.Int64,
          "near_requests": pl.Int64, "near_share": pl.Float64, "labelled_precision": pl.Float64,
          "adjusted_share": pl.Float64}


class SemanticMissing(RuntimeError):
    """The embedding model's package is not installed."""


def load_embedder() -> Callable[[list[str]], np.ndarray]:
    """The packaged model as a function: texts → unit vectors (float32 [n, 256]).
    Loads the weights and tokenizer from the installed wheel, never the network
    (WordLlama's own loader looks for the tokenizer where its wheel does not put
    it, then downloads)."""
    try:
        import wordllama
        from safetensors import safe_open
        from tokenizers import Tokenizer
        from wordllama import WordLlamaInference
    except ImportError:
        raise SemanticMissing("near duplicates need the embedding model: pip install 'prefix-replay[semantic]'") \
            from None
    pkg = Path(wordllama.__file__).parent
    tok = Tokenizer.from_file(str(pkg / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    with safe_open(str(pkg / "weights" / "l2_supercat_256.safetensors"), framework="np") as f:
        weights = f.get_tensor("embedding.weight")
    model = WordLlamaInference(weights, tok, binary=False)
    return lambda texts: np.asarray(model.embed(list(texts), norm=True), dtype=np.float32).reshape(len(texts), -1)


def last_user_text(body: dict) -> str:
    """The text of the last user message (text parts, and tool results' text
    where the turn has nothing else), '' when there is none."""
    msgs = body.get("messages") or []
    for m in reversed(msgs):
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            return content
        texts, results = [], []
        for part in content or []:
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "tool_result":
                inner = part.get("content")
                results += [inner] if isinstance(inner, str) else \
                    [p.get("text", "") for p in inner or [] if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(texts or results)
    return ""


def turns(con, tokenizer=None) -> pl.DataFrame:
    """One row per replayable request in processing order: request_id, ts,
    tenant, key, session, model and the last user turn's text."""
    prepare(con, modes=(), tokenizer=tokenizer)
    rows = []
    blob_texts: dict = {}  # (a conversation's calls share most of their blobs)
    # (small chunks: an agent's body can be 100 KB, and DuckDB's memory is capped)
    for tbl in time_ordered_chunks(con, "r.request_id, r.ts_us, r.tenant, r.prompt_cache_key, r.session, r.model",
                                   chunk=BODIES_PER_QUERY):
        ids = tbl.column("request_id").to_pylist()
        bodies = db.fetch_bodies(con, ids, blob_texts) if ids else {}
        meta = [tbl.column(c).to_pylist() for c in ("ts_us", "tenant", "prompt_cache_key", "session", "model")]
        for k, rid in enumerate(ids):
            try:
                body = loads(bodies.get(rid) or "null")  # (the stored bodies' own parser: msgspec first)
            except ValueError:
                body = None
            text = last_user_text(body)[:TEXT_CHARS] if isinstance(body, dict) else ""
            rows.append((rid,) + tuple(col[k] for col in meta) + (text,))
    return pl.DataFrame(rows, schema={"request_id": pl.Int64, "ts": pl.Int64, "tenant": pl.Utf8, "key": pl.Utf8,
                                      "session": pl.Utf8, "model": pl.Utf8, "text": pl.Utf8}, orient="row")


def best_earlier(vectors: np.ndarray, ts: np.ndarray, groups: np.ndarray, ttls_us, partners: bool = False):
    """For each row i (processing order) and each TTL, the largest cosine with an
    earlier row of the same group at most the TTL before; -inf where there is
    none. float32 [TTL, n]. Rows of zero vectors (no text) neither match nor are
    matched. With ``partners``, also that earlier row (int64 [TTL, n], -1: none)."""
    n = len(ts)
    best = np.full((len(ttls_us), n), -np.inf, dtype=np.float32)
    partner = np.full((len(ttls_us), n), -1, dtype=np.int64)
    has_text = np.linalg.norm(vectors, axis=1) > 0 if n else np.zeros(0, dtype=bool)
    for g in np.unique(groups):
        rows = np.flatnonzero((groups == g) & has_text)  # (processing order: times ascending)
        v, t = vectors[rows], ts[rows]
        for start in range(0, len(rows), ROWS_PER_BLOCK):
            end = min(start + ROWS_PER_BLOCK, len(rows))
            b, arg = _block_best(v, t, start, end, ttls_us)
            best[:, rows[start:end]] = b
            partner[:, rows[start:end]] = np.where(arg >= 0, rows[np.maximum(arg, 0)], -1)
    return (best, partner) if partners else best


def _block_best(v: np.ndarray, t: np.ndarray, start: int, end: int, ttls_us) -> np.ndarray:
    """Rows start..end-1 of one group against their earlier rows: only the
    columns some TTL's window can reach are multiplied (a row's window starts no
    earlier than the block's first row's), and a gap is checked only where a
    TTL's window does not hold it whole."""
    lows = [0 if ttl >= t[end - 1] - t[0] else int(np.searchsorted(t, t[start] - ttl, side="left"))
            for ttl in ttls_us]
    lo = min(lows)
    sims = v[start:end] @ v[lo:end].T  # [block, columns lo..end-1]
    diag = sims[:, start - lo:]
    diag[np.arange(end - start)[:, None] <= np.arange(end - start)[None, :]] = -np.inf  # (only earlier rows)
    out = np.full((len(ttls_us), end - start), -np.inf, dtype=np.float32)
    arg = np.full((len(ttls_us), end - start), -1, dtype=np.int64)
    for ti, (ttl, low) in enumerate(zip(ttls_us, lows)):
        part = sims[:, low - lo:]
        if part.shape[1] == 0:
            continue
        if t[end - 1] - t[low] > ttl:  # some pair in the window is too far apart
            part = np.where(t[start:end, None] - t[None, low:end] <= ttl, part, -np.inf)
        k = part.argmax(axis=1)
        out[ti] = part[np.arange(len(k)), k]
        arg[ti] = np.where(np.isfinite(out[ti]), low + k, -1)
    return out, arg


def embed_turns(df: pl.DataFrame, embed) -> np.ndarray:
    """Each turn's unit vector (each distinct text embedded once; zeros: no text)."""
    texts = df["text"].to_list()
    unique = sorted({t for t in texts if t})
    index = {t: i for i, t in enumerate(unique)}
    vecs = embed(unique) if unique else np.zeros((0, 1), dtype=np.float32)
    vectors = np.zeros((len(texts), vecs.shape[1] if len(vecs) else 1), dtype=np.float32)
    for i, t in enumerate(texts):
        if t:
            vectors[i] = vecs[index[t]]
    return vectors


def stream_keys(df: pl.DataFrame, mode: str) -> pl.Series:
    """Each row's stream key under ``mode``, from its tenant, key and session columns."""
    return pl.Series("stream", [stream_key(mode, a, b, c) for a, b, c in
                                df.select(["tenant", "key", "session"]).iter_rows()], dtype=pl.Utf8)


def cache_groups(df: pl.DataFrame, mode: str) -> np.ndarray:
    """Each turn's cache (stream key under ``mode``, and model) as an integer."""
    if not len(df):
        return np.zeros(0, dtype=np.int64)
    keys = [f"{k}\x00{m}" for k, m in zip(stream_keys(df, mode), df["model"])]
    return np.unique(np.array(keys, dtype=object), return_inverse=True)[1]


def near_duplicates(con, ttls=(math.inf,), streams=("tenant",), thresholds=THRESHOLDS, embed=None,
                    tokenizer=None, adjust=None) -> pl.DataFrame:
    """Near-duplicate rows (:data:`SCHEMA`) per stream mode, TTL and threshold;
    ``embed`` (texts → unit vectors) defaults to :func:`load_embedder`'s model.
    ``adjust(mode, ttl_s, best, n)``, when given, returns for a (mode, TTL) the
    labelled figures per threshold, {threshold: (labelled_precision,
    adjusted_share)}, or None (``best``: each request's best similarity)."""
    df = turns(con, tokenizer)
    n = len(df)
    vectors = embed_turns(df, embed or load_embedder())
    ts = df["ts"].to_numpy()
    ttl_list = [ttl_us(t) for t in ttls]
    rows = []
    for mode in check_modes(streams):
        best = best_earlier(vectors, ts, cache_groups(df, mode), ttl_list)
        for ti, t in enumerate(ttls):
            ttl_s = None if t == math.inf else float(t)
            labelled = (adjust(mode, ttl_s, best[ti], n) if adjust else None) or {}
            for th in thresholds:
                near = int((best[ti] >= np.float32(th) - 1e-6).sum())
                rows.append((mode, ttl_s, float(th), n, near, near / n if n else 0.0,
                             *labelled.get(float(th), (None, None))))
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")
