"""The labelling protocol that turns raw near-duplicate rates into trustworthy ones.

1. **Export** (:func:`candidate_pairs`, :func:`stratified_sample`): every
   request whose best earlier match (``near.best_earlier``, one stream mode
   and TTL) falls in a similarity band of :data:`BANDS` gives a candidate
   pair (it, its match); a seeded sample with an equal quota per band goes to
   three labellers, who answer "can the earlier answer replace this one?"
   (1/0, yes/no) and may fill an intent (FAQ, support, …). Texts are in the
   file only when asked for.
2. **Import** (:func:`read_labels`, :func:`summarize`): a pair is reusable
   when a strict majority of its labels say so (a tie is not). Per band: the
   precision with a Wilson 95 % interval; Fleiss' κ over the pairs all three
   labellers answered; per intent, the smallest similarity ``s`` such that the
   labelled pairs at or above it reach the target precision; and for each
   threshold the adjusted near share = Σ over bands of (requests whose best
   match is in the band and at or above the threshold) × the band's precision,
   over all requests (null when a band it needs has no labels).
3. **Audit** (:func:`audit_sample`): a seeded share of the would-be hits at a
   threshold, in the same format, to label every week.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import polars as pl

from replay.analysis.near import (THRESHOLDS, best_earlier, cache_groups, embed_turns, load_embedder,
                                  near_duplicates, stream_keys, turns)
from replay.core.streams import MODES
from replay.times import ttl_us
from replay.store import db

BANDS = (0.80, 0.85, 0.90, 0.95, 0.99)  # lower edges; the last band runs to 1
LABELS = ("label_1", "label_2", "label_3")
EXPORT_COLUMNS = ("pair_id", "mode", "ttl_s", "band", "similarity", "stream", "request_id", "earlier_request_id",
                  "intent", "text", "earlier_text") + LABELS
_YES, _NO = {"1", "yes", "y", "true"}, {"0", "no", "n", "false"}


def band_of(similarity: float) -> str | None:
    """The band's name (``0.80-0.85`` … ``0.99-1.00``), None below the first."""
    for lo, hi in zip(BANDS, BANDS[1:] + (1.0,)):
        if lo - 1e-6 <= similarity < hi - 1e-6 or (hi == 1.0 and similarity >= lo - 1e-6):
            return f"{lo:.2f}-{hi:.2f}"
    return None


def candidate_pairs(con, ttl: float = math.inf, mode: str = "tenant", embed=None, tokenizer=None) -> pl.DataFrame:
    """Every request with its best earlier match (same cache, within ``ttl``):
    request_id, earlier_request_id (null: none), similarity, band, stream, the
    two texts."""
    df = turns(con, tokenizer)
    vectors = embed_turns(df, embed or load_embedder())
    best, partner = best_earlier(vectors, df["ts"].to_numpy(), cache_groups(df, mode), [ttl_us(ttl)], partners=True)
    ids, texts = df["request_id"].to_numpy(), df["text"].to_list()
    p = partner[0]
    return pl.DataFrame({
        "mode": [mode] * len(df), "ttl_s": [None if ttl == math.inf else float(ttl)] * len(df),
        "request_id": ids, "earlier_request_id": [int(ids[j]) if j >= 0 else None for j in p],
        "similarity": [float(s) if np.isfinite(s) else None for s in best[0]],
        "band": [band_of(float(s)) if np.isfinite(s) else None for s in best[0]],
        "stream": stream_keys(df, mode),
        "text": texts, "earlier_text": [texts[j] if j >= 0 else "" for j in p]},
        schema_overrides={"ttl_s": pl.Float64, "earlier_request_id": pl.Int64, "similarity": pl.Float64})


def _export_rows(pairs: pl.DataFrame, show_text: bool) -> pl.DataFrame:
    out = pairs.with_columns(
        pl.format("{}-{}", "request_id", "earlier_request_id").alias("pair_id"), pl.lit("").alias("intent"),
        *[pl.lit("").alias(c) for c in LABELS])
    if not show_text:
        out = out.with_columns(pl.lit("").alias("text"), pl.lit("").alias("earlier_text"))
    return out.select(EXPORT_COLUMNS)


def stratified_sample(pairs: pl.DataFrame, n: int = 5000, seed: int = 0, show_text: bool = False) -> pl.DataFrame:
    """Up to ``n`` candidate pairs, an equal quota per band (a band with fewer
    gives all it has), seeded; ordered by band, then similarity."""
    cand = pairs.filter(pl.col("band").is_not_null())
    bands = sorted(set(cand["band"].to_list()))
    quota = math.ceil(n / len(BANDS)) if n > 0 else 0
    parts = []
    for i, b in enumerate(bands):
        part = cand.filter(pl.col("band") == b)
        parts.append(part.sample(min(quota, len(part)), seed=seed + i, shuffle=True))
    out = pl.concat(parts) if parts else cand.head(0)
    return _export_rows(out.sort(["band", "similarity", "request_id"]), show_text)


def audit_sample(pairs: pl.DataFrame, threshold: float = 0.95, rate: float = 0.02, seed: int = 0,
                 show_text: bool = False) -> pl.DataFrame:
    """A share ``rate`` (at least one, when there is any) of the would-be hits at
    ``threshold``, seeded, to label."""
    hits = pairs.filter(pl.col("similarity") >= threshold - 1e-6)
    k = min(len(hits), max(1, round(rate * len(hits)))) if len(hits) else 0
    return _export_rows(hits.sample(k, seed=seed, shuffle=True).sort(["band", "similarity", "request_id"]),
                        show_text)


def write_export(df: pl.DataFrame, prefix: str | Path) -> tuple[Path, Path]:
    """``prefix.csv`` and ``prefix.jsonl``, the same rows."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    csv_path, jsonl_path = prefix.with_suffix(".csv"), prefix.with_suffix(".jsonl")
    df.write_csv(csv_path)
    with open(jsonl_path, "w") as f:
        for row in df.iter_rows(named=True):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return csv_path, jsonl_path


# (errors name the file, row and column, never the value: a label file exported
# with --show-text holds prompt text, and a shifted column puts it anywhere)
def _label(value, where: str = "") -> int | None:
    v = "" if value is None else str(value).strip().lower()
    if v in _YES:
        return 1
    if v in _NO:
        return 0
    if v == "":
        return None
    raise ValueError(f"{where}a label must be 1/0 or yes/no, not a value of {len(v)} characters")


def _number(value, where: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}is not a number") from None


def read_labels(paths) -> pl.DataFrame:
    """Labelled export files (CSV or JSONL; a pair in several files: the last
    one wins): pair_id, mode, ttl_s, band, similarity, intent and the labels as 1/0/null."""
    rows: dict[str, dict] = {}
    for path in paths:
        path = Path(path)
        with open(path, newline="") as f:
            records = [json.loads(line) for line in f if line.strip()] if path.suffix == ".jsonl" \
                else list(csv.DictReader(f))
        for i, r in enumerate(records, 1):
            missing = [c for c in ("pair_id", "band", "similarity") + LABELS if c not in r]
            if missing:
                raise ValueError(f"{path}: not a label file (missing {', '.join(missing)})")
            similarity = _number(r["similarity"], f"{path}, row {i}: similarity ")
            if similarity is None:
                raise ValueError(f"{path}, row {i}: similarity is empty")
            mode = r.get("mode") or ""
            if mode and mode not in MODES:
                raise ValueError(f"{path}, row {i}: mode is not one of {', '.join(MODES)}")
            rows[str(r["pair_id"])] = {
                "pair_id": str(r["pair_id"]), "mode": mode, "band": r["band"],
                "ttl_s": _number(r.get("ttl_s"), f"{path}, row {i}: ttl_s "), "similarity": similarity,
                "intent": (r.get("intent") or "").strip() or "(none)",
                **{c: _label(r[c], f"{path}, row {i}, {c}: ") for c in LABELS}}
    return pl.DataFrame(list(rows.values()), schema={
        "pair_id": pl.Utf8, "mode": pl.Utf8, "band": pl.Utf8, "ttl_s": pl.Float64, "similarity": pl.Float64,
        "intent": pl.Utf8, **{c: pl.Int64 for c in LABELS}})


def reusable(labels: pl.DataFrame) -> pl.DataFrame:
    """The labelled pairs (one label at least) with ``yes``, ``answered`` and
    ``reusable`` (a strict majority of the labels given say yes)."""
    yes = sum(pl.col(c).fill_null(0) for c in LABELS)
    answered = sum(pl.col(c).is_not_null().cast(pl.Int64) for c in LABELS)
    return labels.with_columns(yes.alias("yes"), answered.alias("answered")).filter(pl.col("answered") > 0) \
        .with_columns((2 * pl.col("yes") > pl.col("answered")).alias("reusable"))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's interval for k successes in n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def fleiss_kappa(labels: pl.DataFrame) -> float | None:
    """Fleiss' κ (two categories) over the pairs every labeller answered."""
    full = labels.filter(pl.all_horizontal([pl.col(c).is_not_null() for c in LABELS]))
    if not len(full):
        return None
    r = len(LABELS)
    yes = full.select(sum(pl.col(c) for c in LABELS)).to_series().to_numpy().astype(float)
    counts = np.stack([yes, r - yes], axis=1)  # [items, categories]
    p_item = ((counts ** 2).sum(axis=1) - r) / (r * (r - 1))
    p_cat = counts.sum(axis=0) / (len(full) * r)
    p_bar, p_e = p_item.mean(), float((p_cat ** 2).sum())
    return 1.0 if p_e == 1 else float((p_bar - p_e) / (1 - p_e))


def band_precision(labels: pl.DataFrame) -> pl.DataFrame:
    """Per band: labelled pairs, reusable ones, precision and its Wilson interval."""
    rows = []
    for band, part in reusable(labels).group_by("band", maintain_order=True):
        k, n = int(part["reusable"].sum()), len(part)
        lo, hi = wilson(k, n)
        rows.append({"band": band[0] if isinstance(band, tuple) else band, "labelled": n, "reusable": k,
                     "precision": k / n, "ci_low": lo, "ci_high": hi})
    return pl.DataFrame(rows, schema={"band": pl.Utf8, "labelled": pl.Int64, "reusable": pl.Int64,
                                      "precision": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64}
                        ).sort("band")


def intent_thresholds(labels: pl.DataFrame, target: float = 0.99) -> list[dict]:
    """Per intent: the smallest similarity s among its labelled pairs such that
    those at or above s are at least ``target`` reusable (null: none reaches it)."""
    out = []
    for intent, part in reusable(labels).group_by("intent", maintain_order=True):
        part = part.sort("similarity", descending=True)
        sims, ok = part["similarity"].to_list(), part["reusable"].to_list()
        best, k = None, 0
        for i, (s, good) in enumerate(zip(sims, ok)):
            k += bool(good)
            last_of_tie = i + 1 == len(sims) or sims[i + 1] < s
            if last_of_tie and k / (i + 1) >= target:
                best = s
        out.append({"intent": intent[0] if isinstance(intent, tuple) else intent, "labelled": len(part),
                    "threshold": best, "precision": None if best is None else
                    float(np.mean([g for s, g in zip(sims, ok) if s >= best]))})
    return sorted(out, key=lambda r: r["intent"])


def adjusted(similarities: np.ndarray, n_requests: int, thresholds, labels: pl.DataFrame) -> list[dict]:
    """Per threshold: the raw near share, the labelled precision of the pairs at
    or above it, and the adjusted share (band by band)."""
    prec = {r["band"]: r["precision"] for r in band_precision(labels).iter_rows(named=True)}
    lab = reusable(labels)
    sims = similarities[np.isfinite(similarities)]
    bands = np.array([band_of(float(s)) for s in sims], dtype=object)
    out = []
    for th in thresholds:
        above = sims >= th - 1e-6
        at = lab.filter(pl.col("similarity") >= th - 1e-6)
        needed = set(bands[above & (bands != None)])  # noqa: E711 - numpy object comparison
        share = None
        if n_requests and all(b in prec for b in needed):
            share = sum(int((above & (bands == b)).sum()) * prec[b] for b in needed) / n_requests
        out.append({"threshold": float(th), "near_share": int(above.sum()) / n_requests if n_requests else 0.0,
                    "labelled_precision": float(at["reusable"].mean()) if len(at) else None,
                    "adjusted_share": share})
    return out


def summarize(labels: pl.DataFrame, similarities: np.ndarray, n_requests: int, thresholds,
              target: float = 0.99) -> dict:
    """What ``label-import`` prints: bands, κ, per-intent thresholds, and per
    threshold the raw, labelled and adjusted figures."""
    return {"pairs": len(labels), "labelled": len(reusable(labels)), "bands": band_precision(labels).to_dicts(),
            "fleiss_kappa": fleiss_kappa(labels), "target_precision": target,
            "intent_thresholds": intent_thresholds(labels, target),
            "near": adjusted(similarities, n_requests, thresholds, labels)}


def store_labels(con, labels: pl.DataFrame) -> int:
    """Keep imported labels in the database (a pair imported again replaces its
    row: re-importing never double-counts); returns how many pairs it holds."""
    _labels_in = labels  # noqa: F841 - read by DuckDB by name
    con.execute("CREATE TABLE IF NOT EXISTS near_labels AS SELECT * FROM _labels_in WHERE false")
    con.execute("DELETE FROM near_labels WHERE pair_id IN (SELECT pair_id FROM _labels_in)")
    con.execute("INSERT INTO near_labels BY NAME SELECT * FROM _labels_in")
    return con.execute("SELECT count(*) FROM near_labels").fetchone()[0]


def stored_labels(con) -> pl.DataFrame | None:
    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'near_labels'").fetchone()[0]:
        return None
    return pl.from_arrow(db.arrow(con, "SELECT * FROM near_labels"))


def near_rates(con, ttls=(math.inf,), streams=("tenant",), thresholds=THRESHOLDS, embed=None,
               tokenizer=None) -> pl.DataFrame:
    """``near.near_duplicates``'s rows, with ``labelled_precision`` and
    ``adjusted_share`` filled where stored labels were drawn at the row's
    stream mode and TTL (from the same search: nothing is embedded twice)."""
    labels = stored_labels(con)

    def adjust(mode, ttl_s, best, n):
        mine = labels.filter((pl.col("mode") == mode) & pl.col("ttl_s").eq_missing(ttl_s))
        if not len(mine):
            return None
        return {r["threshold"]: (r["labelled_precision"], r["adjusted_share"])
                for r in adjusted(best, n, thresholds, mine)}

    return near_duplicates(con, ttls, streams, thresholds, embed, tokenizer,
                           adjust=adjust if labels is not None and len(labels) else None)
