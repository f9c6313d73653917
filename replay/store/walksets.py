"""Which walks are current: one row of `walk_sets` per (variant, mode).

A walk set is the `walks` rows of one (variant, mode), replayed from the
requests and prompts the database held at that moment, with trie state kept
for ``horizon_us`` (exact for every TTL up to it). It is *current* for a
consumer that needs horizon ``h`` when its fingerprint is the data's
fingerprint now and its horizon is at least ``h``. ``replay.prepare`` decides
from this table alone what to replay; readers of walks refuse a set that is not
current, so a stale set is never read silently.

The fingerprint changes when requests are added or removed, when a request's
time, stream attributes or model change, when prompts are added, removed or
change length, when the tokenizer (with its rendering) changes, and when what a
walk row holds changes (:data:`WALKS_LAYOUT`: sets replayed by an earlier
version are stale, and replayed again by ``prepare``).
"""

from __future__ import annotations

from replay.store import db


#: what a walk row holds; changed whenever a replay writes rows an earlier one did
#: not ("origins": each step's origin), so walk sets of earlier rows are stale
WALKS_LAYOUT = "origins"


class StaleWalks(RuntimeError):
    """Walks asked for are missing, or were replayed from other data or for a shorter horizon."""


def data_fingerprint(con) -> str:
    r = con.execute("""SELECT count(*), coalesce(max(request_id), -1),
                              coalesce(sum(hash(request_id, ts_us, tenant, prompt_cache_key, session, model,
                                                format, input_length)), 0)
                       FROM requests""").fetchone()
    p = con.execute("""SELECT count(*), coalesce(sum(hash(request_id, n_tokens, output_n_tokens)), 0)
                       FROM prompts""").fetchone()
    return ":".join(str(x) for x in (*r, *p, db.get_meta(con, "tokenizer", ""), WALKS_LAYOUT))


def status(con) -> dict[tuple[str, str], tuple[int, str]]:
    """(variant, mode) → (horizon in µs, fingerprint) of every recorded set."""
    return {(v, m): (int(h), fp) for v, m, h, fp in
            con.execute("SELECT variant, mode, horizon_us, fingerprint FROM walk_sets").fetchall()}


def stale(con, keys, horizon_us: int, fingerprint: str | None = None) -> list[tuple[str, str]]:
    """The (variant, mode) pairs of ``keys`` that are not current for ``horizon_us``."""
    fingerprint = fingerprint if fingerprint is not None else data_fingerprint(con)
    have = status(con)
    return [k for k in keys if k not in have or have[k][1] != fingerprint or have[k][0] < horizon_us]


def require_current(con, keys, horizon_us: int) -> None:
    """Raise :class:`StaleWalks` unless every set of ``keys`` is current for ``horizon_us``."""
    bad = stale(con, keys, horizon_us)
    if bad:
        raise StaleWalks(f"walks {bad} are missing or stale for this data and horizon: "
                         "prepare them first (replay.prepare.prepare)")


def forget(con, keys) -> None:
    """Drop the records of these sets (before their rows are replaced)."""
    for v, m in keys:
        con.execute("DELETE FROM walk_sets WHERE variant = ? AND mode = ?", [v, m])


def record(con, keys, horizon_us: int, fingerprint: str, requests: int) -> None:
    """Mark these sets current: replayed from data with ``fingerprint``, exact up to ``horizon_us``."""
    for v, m in keys:
        con.execute("INSERT OR REPLACE INTO walk_sets VALUES (?, ?, ?, ?, ?)",
                    [v, m, int(horizon_us), fingerprint, int(requests)])
