"""`replay show`: how one request was rendered and tokenized.

For one ``request_id``, after ``prepare`` (the prompts current for the
tokenizer), a dict with:

* the request's attributes that are not prompt text — ``ts_us`` and ``time``
  (UTC, ISO 8601; a log of relative times reads as 1970), ``tenant``,
  ``session``, ``key`` (``prompt_cache_key``), ``user_id``, ``model``,
  ``format``, ``source`` (the file's path) and ``line``, and the provider's
  ``usage`` where the log holds it;
* ``n_tokens`` and ``tokens``: the stored prompt's ids in order (the replay's
  input, ``prompts.seg_ids`` concatenated);
* ``segments``: the stored segments in order, each with its ``part`` — from
  ``prompts.seg_parts`` (0 tools, 1 system, 2+k message k, 2+n the generation
  marker): ``"bos"`` (the leading BOS marker, stored with part 0),
  ``"tools"``, ``"system"``, ``"message k"``, ``"generation"`` (a last lone
  ``assistant`` marker, as ``replay.analysis.prefixes.part_labels`` decides), a
  pre-tokenized log's one ``"tokens"`` — its ``marker`` (the marker's name
  for a marker segment, else None), ``start`` (tokens before it) and
  ``n_tokens``. Their counts sum to ``n_tokens`` and
  ``tokens[start:start + n_tokens]`` concatenated are ``tokens``. A block trace
  has no token ids: ``tokens`` is None, ``blocks`` its ids' count, and its
  segments are ``"blocks"`` (the tokens its ids cover) and ``"tail"`` (its
  ``input_length`` beyond them, when there is some);
* ``set_aside``: the reason (and the error's type) when the request was loaded
  but could not be rendered — then ``tokens`` is None and ``segments`` empty;
* ``text`` only with ``show_text``: the ids decoded with the tokenizer that
  encoded them (the neutral template's markers included). Decoding with
  another tokenizer would give wrong text, so a database tokenized with one
  other than the default is refused (:class:`TextRefused`) unless its directory
  is given.

No prompt text without ``show_text``: segment ids are content hashes of the
text (unkeyed, so a short text could be guessed from one) and are not shown.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np

from replay.prepare import decoding_tokenizer, prepare
from replay.store import db
from replay.text.segids import MARKER_SEG

KEYS = ("request_id", "ts_us", "time", "tenant", "session", "key", "user_id", "model", "format", "source", "line",
        "usage", "n_tokens", "tokens", "segments", "set_aside")
_MARKER_NAME = {sid: name for name, sid in MARKER_SEG.items()}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class RequestNotFound(LookupError):
    """No request with that id in the database."""


class TextRefused(ValueError):
    """The text asked for cannot be decoded faithfully (a usage error)."""


def show_request(con, request_id: int, show_text: bool = False, tokenizer=None, progress: bool = False) -> dict:
    """How request ``request_id`` was rendered (module doc). Raises
    :class:`RequestNotFound` for an id the database does not hold (before any
    tokenizing) and :class:`TextRefused` when ``show_text`` would decode with
    another tokenizer than the one that encoded the prompts."""
    rid = int(request_id)
    row = con.execute(
        "SELECT r.request_id, r.ts_us, r.tenant, r.session, r.prompt_cache_key, r.user_id, r.model, r.format, "
        "s.path, r.line_no, r.usage_prompt_tokens, r.usage_cached_tokens, r.usage_cache_write_tokens, "
        "r.usage_output_tokens, r.block_ids IS NOT NULL FROM requests r LEFT JOIN sources s USING (source_id) "
        "WHERE r.request_id = ?", [rid]).fetchone()
    if row is None:
        lo, hi = con.execute("SELECT min(request_id), max(request_id) FROM requests").fetchone()
        held = "the database holds no requests" if lo is None else f"ids run from {lo} to {hi}"
        raise RequestNotFound(f"no request {rid} in the database ({held})")
    tok = None
    if show_text:
        try:
            tok = decoding_tokenizer(con, tokenizer)
        except ValueError as e:
            raise TextRefused(str(e)) from None
    prepare(con, modes=(), tokenizer=tok or tokenizer, progress=progress)
    (_, ts, tenant, session, key, user_id, model, fmt, path, line, up, uc, uw, uo, is_trace) = row
    usage = {k: v for k, v in (("prompt_tokens", up), ("cached_tokens", uc), ("cache_write_tokens", uw),
                               ("output_tokens", uo)) if v is not None}
    out = {"request_id": rid, "ts_us": ts, "time": _iso(ts), "tenant": tenant, "session": session, "key": key,
           "user_id": user_id, "model": model, "format": fmt, "source": path, "line": line, "usage": usage or None,
           "n_tokens": None, "tokens": None, "segments": [], "set_aside": None}
    if is_trace:
        _trace(con, rid, out)
    else:
        _prompt(con, rid, fmt, out)
    if show_text:
        out["text"] = (None if out["tokens"] is None
                       else tok.tokenizer.decode(out["tokens"], skip_special_tokens=False))
    return out


def _iso(ts_us: int) -> str:
    try:
        return (_EPOCH + timedelta(microseconds=int(ts_us))).isoformat().replace("+00:00", "Z")
    except OverflowError:  # beyond datetime's years 1-9999
        return str(ts_us)


def _prompt(con, rid: int, fmt: str, out: dict) -> None:
    got = con.execute("SELECT n_tokens, seg_ids, seg_parts FROM prompts WHERE request_id = ?", [rid]).fetchone()
    if got is None:
        aside = con.execute("SELECT reason, detail FROM set_aside WHERE request_id = ? LIMIT 1", [rid]).fetchone()
        out["set_aside"] = ({"reason": aside[0], "detail": aside[1]} if aside is not None
                            else {"reason": "not tokenized", "detail": None})
        return
    n, seg_ids, seg_parts = got
    wanted = sorted(set(seg_ids))
    tokens_of: dict[int, np.ndarray] = {}
    for start in range(0, len(wanted), 5000):
        chunk = ",".join(str(int(s)) for s in wanted[start:start + 5000])
        tbl = db.arrow(con, f"SELECT seg_id, tokens FROM segments WHERE seg_id IN ({chunk})")
        for sid, toks in zip(tbl.column("seg_id").to_pylist(), db.list_rows(tbl.column("tokens"))):
            tokens_of[sid] = np.asarray(toks, dtype=np.int64)
    missing = [s for s in wanted if s not in tokens_of]
    if missing:  # prepare made the prompts current: a missing segment is a broken store
        raise RuntimeError(f"request {rid}: {len(missing)} of its segments are not in the segments table")
    labels = segment_parts(seg_ids, seg_parts, fmt)
    tokens: list[int] = []
    for sid, label in zip(seg_ids, labels):
        t = tokens_of[sid]
        out["segments"].append({"part": label, "marker": _MARKER_NAME.get(sid), "start": len(tokens),
                                "n_tokens": len(t)})
        tokens.extend(t.tolist())
    if len(tokens) != n:
        raise RuntimeError(f"request {rid}: its segments hold {len(tokens)} tokens, its prompt row says {n}")
    out["n_tokens"], out["tokens"] = int(n), tokens


def segment_parts(seg_ids, seg_parts, fmt: str | None = None) -> list[str]:
    """Each stored segment's part (module doc): the rule of ``part_labels`` for
    the BOS marker and the generation prompt, one label per segment."""
    if fmt == "tokens":
        return ["tokens"] * len(seg_ids)
    bos, gen = MARKER_SEG["bos"], MARKER_SEG["assistant"]
    top = max(seg_parts) if len(seg_parts) else 0
    last = len(seg_ids) - 1
    labels = []
    for i, (sid, part) in enumerate(zip(seg_ids, seg_parts)):
        if i == 0 and sid == bos and part == 0:
            labels.append("bos")
        elif part == top >= 2 and i == last and sid == gen and (i == 0 or seg_parts[i - 1] != part):
            labels.append("generation")
        else:
            labels.append({0: "tools", 1: "system"}.get(part) or f"message {part - 2}")
    return labels


def _trace(con, rid: int, out: dict) -> None:
    """A block trace: its ids' count and the tokens they cover (``core.prompts.block_symbols``' rule)."""
    ids_n, lengths_sum, input_length = con.execute(
        "SELECT len(block_ids), list_sum(block_lengths), input_length FROM requests WHERE request_id = ?",
        [rid]).fetchone()
    input_length = int(input_length or 0)
    if lengths_sum is None:  # Mooncake's rule: 512-token blocks, the last one what is left
        covered = input_length if ids_n else 0
    else:
        covered = int(lengths_sum)
    n = max(covered, input_length)
    out["blocks"] = int(ids_n)
    out["n_tokens"] = n
    out["segments"] = [{"part": "blocks", "marker": None, "start": 0, "n_tokens": covered}]
    if n > covered:
        out["segments"].append({"part": "tail", "marker": None, "start": covered, "n_tokens": n - covered})
