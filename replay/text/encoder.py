"""Text → token ids for the tokenize stage: fast, and exactly what ``tokenizers`` gives.

The reference is Hugging Face ``tokenizers`` (the tokenizer.json as shipped).
:class:`Engine` gets the same ids for less work in two ways:

* **Line pieces** (tokenizers whose pre-tokenizer is known to allow it — the
  default DeepSeek-V4 one): a text is cut after a line break when the next line
  starts (after spaces/tabs) with a character no definition counts as
  whitespace. The pre-tokenizer never joins text across such a point — its
  matches are found left to right and none reaches past the line break — so the
  ids of the pieces, concatenated, are the ids of the text. Pieces are cached:
  an agent's new messages repeat lines of earlier ones (a system prompt whose
  date line changed, a file read twice), so the reference encodes only the
  unique lines.
* **tiktoken** (for the same pre-tokenizer): the unique pieces are encoded by a
  tiktoken encoding of the same vocabulary, 2-3x faster than the reference
  here and built in ~0.5 s, ~0.2 s once its ranks are in the cache (the argument
  that its ids are the reference's is in :mod:`replay.text.tiktoken_bpe`).
* **fastokens** (when installed): a Rust BPE encoder for the same tokenizer.json,
  16-40x faster than the reference here but ~2 s and ~150 MB to build. It is built once the text
  encoded otherwise passes ``FASTOKENS_AFTER_CHARS`` (or at once with
  backend ``fastokens``), and takes over when ready.

The shortcuts are checked on every batch: every ``VERIFY_EVERY``-th text
(at least one) is encoded whole by the reference and compared; a difference
turns that shortcut off for good (a warning on stderr) and the batch is
encoded again without it. So a disagreement can cost speed, never a count that
goes unnoticed in the sample.

The checks can also wait (:func:`json_facts`, :meth:`Engine.settle`). Loading
the reference takes ~0.7 s of the encoder process's core, before it could
encode anything, and at a day of traffic that core is the one the pipeline
waits for. When the tokenizer.json alone says everything encoding needs (the
markers' ids, the vocabulary size, the added tokens, and the line-piece and
tiktoken conditions, on the JSON's own words), the process starts without the
reference and keeps each batch's sample. The parent calls ``settle`` once the
tokenize stage is done with it, and the reference is loaded and the samples
checked beside the replay; ``verdict`` waits for the outcome. A late
disagreement cannot be undone by encoding the batch again, since its ids are
stored already: the verdict names the shortcut, and the caller tokenizes again
with the reference alone (:func:`replay.text.tokenize.confirm_tokens`; the
pipeline does, then replays again). So it still costs speed only.

:class:`EncoderProcess` runs an Engine in a child process (``python -m
replay.text.encoder``): building a ``tokenizers.Tokenizer`` holds the interpreter
lock for ~0.6 s, and there it costs the caller nothing; ``warm()`` hands it
body parts the ingest stage has just stored (blob id, kind, JSON text), which it
renders and encodes on the other core while ingest goes on (:class:`Prepared`):
the tokenize stage then takes each part's segment ids and the new segments'
tokens from it instead of rendering and encoding them itself. Rendering is
:func:`replay.text.render.render_part` and the ids :mod:`replay.text.segids` in both
processes, so the rows are the same either way. The protocol is pickled frames
on the child's stdin/stdout.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import pickle
import queue
import re
import sys
import threading
from pathlib import Path
from typing import Sequence

import msgspec
import numpy as np

from replay.text import child
from replay.text import segids
from replay.text import tiktoken_bpe
from replay.store.jsontext import loads
from replay.text.render import MARKERS, render_part

BACKEND_ENV = "REPLAY_TOKENIZER_BACKEND"
BACKENDS = ("auto", "tokenizers", "tiktoken", "fastokens")
VERIFY_EVERY = 50                  # every 50th text of a batch is checked against the reference
FASTOKENS_AFTER_CHARS = 16_000_000  # ~7 s of the reference's work here (~3 s of tiktoken's), mostly hidden beside ingest; fastokens costs ~2 s and ~150 MB to build
PIECE_CACHE_TOKENS = 8_000_000     # line pieces kept (ids); cleared when full
# Tokens of body parts prepared ahead, waiting for the tokenize stage (which only
# starts when ingest ends); past it, the tokenize stage renders and encodes the
# rest itself. A week of the bench's agent traffic holds 96 M unique tokens: at
# 16 M only its first day was prepared (tokenize 88-92 s in the week; 64 s with
# all prepared), and this process then peaks at 1.1 GB instead of 0.5 GB.
PREPARED_TOKENS = 128_000_000
WARM_BACKLOG_CHARS = 64_000_000    # body parts waiting to be warmed; more are dropped (they are only hints)
WARM_SEND_CHARS = 6 * PREPARED_TOKENS  # body-part text sent in all (text runs ~3-4 characters a token)

# After a line break, spaces/tabs, then a character that is not whitespace in any
# definition (ASCII printable, or a letter/digit/underscore).
_LINE_CUT = re.compile(r"[\r\n](?=[ \t]*[!-~\w])")  # a text is cut just after each match

# The pre-tokenizer the line-piece argument was made (and is tested) for:
# DeepSeek-V3/V4's digits / CJK / main-regex splits, then byte-level.
_SAFE_PRE_TOKENIZER = {
    "type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
         "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                                               "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
                                               "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def line_pieces(text: str) -> list[str]:
    """``text`` cut after line breaks where the tokenizer cannot join across (module docstring)."""
    # (finding the line breaks is faster than splitting at a lookbehind tried at every character)
    cuts = [m.end() for m in _LINE_CUT.finditer(text)]
    if not cuts:
        return [text]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _sanitize(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def prepare_tokenizer(tokenizer, name: str = "") -> dict:
    """Make every neutral-template marker a special token of ``tokenizer`` (a
    ``tokenizers.Tokenizer``, changed in place). Returns what callers need:
    ``vocab_size`` (base vocabulary), ``marker_ids``, ``markers_added``."""
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
    return {"vocab_size": vocab_size, "marker_ids": marker_ids, "markers_added": bool(missing)}


def line_pieces_safe(tokenizer) -> bool:
    """True when ``tokenizer`` is one the line-piece argument holds for: the known
    pre-tokenizer, no normalizer, and no added token holding a line break."""
    import json

    try:
        pre = tokenizer.pre_tokenizer
        pre_state = json.loads(pre.__getstate__()) if pre is not None else None
        norm = tokenizer.normalizer
        norm_state = json.loads(norm.__getstate__()) if norm is not None else None
    except Exception:  # noqa: BLE001 - anything unexpected: no shortcut
        return False
    return _pieces_safe(pre_state, norm_state, [t.content for t in tokenizer.get_added_tokens_decoder().values()])


def _pieces_safe(pre_state, norm_state, added_contents) -> bool:
    """The line-piece conditions on a tokenizer's pre-tokenizer and normalizer (as
    JSON values) and its added tokens' contents."""
    return (pre_state == _SAFE_PRE_TOKENIZER
            and norm_state in (None, {"type": "Sequence", "normalizers": []})
            and not any("\n" in c or "\r" in c for c in added_contents))


class _JsonModel(msgspec.Struct):
    type: str = ""


class _JsonDoc(msgspec.Struct):  # what json_facts reads of a tokenizer.json; the rest is skipped unread
    added_tokens: list[dict] = []
    normalizer: object = None
    pre_tokenizer: object = None
    model: _JsonModel | None = None


class _JsonVocab(msgspec.Struct):
    vocab: dict[str, int] = {}


class _JsonVocabDoc(msgspec.Struct):
    model: _JsonVocab | None = None


def _vocab_size(tokenizer_json: bytes) -> int:
    """The model's vocabulary size. Reading the vocabulary costs ~0.12 s (all
    else json_facts needs, ~0.01 s), so the count is kept in the cache beside
    tiktoken's ranks (a wrong one is caught by Engine.settle)."""
    path = tiktoken_bpe.cache_file("vocab-size", 1, tokenizer_json, ".txt")
    if path is not None:
        try:
            return int(path.read_bytes())
        except (OSError, ValueError):
            pass
    model = msgspec.json.decode(tokenizer_json, type=_JsonVocabDoc).model
    n = len(model.vocab) if model is not None else 0
    tiktoken_bpe.write_cache(path, str(n).encode())
    return n


@dataclasses.dataclass
class JsonFacts:
    """What a tokenizer.json says on its own about the reference it makes, when
    that is enough to encode before the reference is loaded: ``info`` (as
    :func:`prepare_tokenizer` gives it, no marker missing), its added tokens, and
    the JSON itself (for tiktoken's ranks). Checked against the reference once
    it is loaded (:meth:`Engine.settle`)."""
    info: dict
    added: list
    tokenizer_json: bytes


def json_facts(tokenizer_json: bytes) -> JsonFacts | None:
    """The :class:`JsonFacts` of a tokenizer.json, or None unless every marker is
    an added token already, the model a BPE, and the line-piece argument's
    conditions hold on the JSON's own words (:func:`line_pieces_safe`): the
    known pre-tokenizer, no normalizer, no added token holding a line break.
    (A JSON that says them differently from the reference's own view only
    loses the early start.)"""
    try:
        doc = msgspec.json.decode(tokenizer_json, type=_JsonDoc)
        added = [tiktoken_bpe.AddedToken(int(t["id"]), t["content"], bool(t.get("lstrip")),
                                         bool(t.get("rstrip")), bool(t.get("single_word")))
                 for t in doc.added_tokens]
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, ValueError):
        return None
    if (doc.model is None or doc.model.type != "BPE"
            or not _pieces_safe(doc.pre_tokenizer, doc.normalizer, [t.content for t in added])):
        return None
    ids = {t.content: t.id for t in added}
    if any(m not in ids for m in MARKERS.values()) or len(ids) != len(added):
        return None
    info = {"vocab_size": _vocab_size(tokenizer_json) or 1,
            "marker_ids": {name: ids[m] for name, m in MARKERS.items()}, "markers_added": False}
    return JsonFacts(info, added, tokenizer_json)


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


def _pack(arrays: list[np.ndarray], dtype: str = "<i4") -> tuple[bytes, bytes]:
    """Arrays as (their values concatenated, their lengths): one buffer pickles far
    faster than thousands of small arrays."""
    lengths = np.fromiter(map(len, arrays), dtype="<i8", count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    return flat.astype(dtype).tobytes(), lengths.tobytes()


def _unpack(flat: bytes, lengths: bytes, dtype: str = "<i4") -> list[np.ndarray]:
    """The arrays :func:`_pack` packed (views of one buffer)."""
    ends = np.cumsum(np.frombuffer(lengths, dtype="<i8")).tolist()
    values = np.frombuffer(flat, dtype=dtype)
    return [values[a:b] for a, b in zip([0] + ends[:-1], ends)]  # slices: np.split costs ~10x more


class Engine:
    """Encodes texts exactly as the reference ``tokenizers.Tokenizer`` does (module docstring).

    ``tokenizer``: the reference, markers already added (:func:`prepare_tokenizer`);
    or, with ``facts`` (:func:`json_facts`), a function that loads it: the
    engine then starts without it, and the checks of its sample wait until
    :meth:`settle` (or until the reference is needed for something else).
    ``source``: tokenizer.json path fastokens may be built from, or None to build
    it from the reference's JSON. ``backend``: ``auto``, ``tokenizers`` (the
    reference alone), ``tiktoken`` (no fastokens) or ``fastokens`` (built at
    once, waited for on every batch).
    """

    def __init__(self, tokenizer, source: str | Path | None = None, backend: str = "auto",
                 line_pieces: bool | None = None, facts: JsonFacts | None = None):
        check_backend(backend)
        self.facts = facts
        self._tk, self._load = (None, tokenizer) if facts is not None else (tokenizer, None)
        self._deferred: list | None = [] if facts is not None else None  # checks waiting for settle()
        self.late_failures: list[str] = []  # shortcuts a waiting check found wrong
        self.source = source
        self.backend = backend
        known = True if facts is not None else line_pieces_safe(tokenizer)
        self.split = known if line_pieces is None else line_pieces
        # tiktoken: built at first use (~0.5 s; ~0.2 s with its ranks cached), for the pre-tokenizer it was written for
        self._tik_wanted = backend in ("auto", "tiktoken") and known and tiktoken_bpe.available()
        self._tik = None
        self._fast_wanted = backend in ("auto", "fastokens") and _has_fastokens()
        self._fast: _Background | None = None
        self._pieces: dict[str, np.ndarray] = {}
        self._pieces_tokens = 0
        self._encoded_chars = 0  # encoded by tiktoken or the reference: when fastokens pays
        self.stats = collections.Counter(texts=0, fastokens_texts=0, reference_texts=0, tiktoken_texts=0,
                                         pieces=0, pieces_encoded=0, verified_texts=0, mismatches=0)
        if backend == "fastokens":
            self._start_fast()

    @property
    def tk(self):
        """The reference (loaded now if it was not yet)."""
        if self._tk is None:
            self._tk = self._load()
        return self._tk

    # ------------------------------------------------------------ public
    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids (int32 arrays), in order."""
        texts = list(texts)
        self.stats["texts"] += len(texts)
        return self._encode_new(texts) if texts else []

    def describe(self) -> str:
        st = self.stats
        parts = [f"{st['texts']:,} texts"]
        if st["fastokens_texts"]:
            parts.append(f"fastokens {st['fastokens_texts']:,}")
        if st["reference_texts"]:
            how = (f" as {st['pieces_encoded']:,} unique line pieces of {st['pieces']:,}"
                   if st["pieces"] else "")
            by = " by tiktoken" if st["tiktoken_texts"] else " by tokenizers"
            parts.append(f"{st['reference_texts']:,}{how}{by}")
        parts.append(f"{st['verified_texts']:,} checked against tokenizers, {st['mismatches']} mismatches")
        return "; ".join(parts)

    # ------------------------------------------------------------ encoding
    def _encode_new(self, texts: list[str]) -> list[np.ndarray]:
        fast = None
        if self._fast is not None and (self.backend == "fastokens" or self._fast.done()):
            fast = self._fast.result()
            if fast is None:  # it could not be built
                self._fast = None
                self._fast_wanted = False
        if fast is not None:
            got = self._fastokens(fast, texts)
            if got is not None:
                self.stats["fastokens_texts"] += len(texts)
                return got
        self.stats["reference_texts"] += len(texts)
        got = self._by_pieces(texts) if self.split else None
        if got is None:
            self._encoded_chars += sum(map(len, texts))
            got, by_tiktoken = self._bulk(texts)
            if by_tiktoken and not self._verify(texts, got, "tiktoken"):
                self._drop_tiktoken()
                got = self._reference(texts)
        if self._fast_wanted and self._fast is None and self._encoded_chars >= FASTOKENS_AFTER_CHARS:
            self._start_fast()  # enough text that fastokens pays for its build
        return got

    def _bulk(self, texts: list[str]) -> tuple[list[np.ndarray], bool]:
        """The texts' ids by tiktoken when it is at hand, else by the reference;
        and whether tiktoken gave them (the caller checks its sample)."""
        if self._tik is None and self._tik_wanted:
            self._tik = self._build_tiktoken()
            self._tik_wanted = self._tik is not None
        if self._tik is None:
            return self._reference(texts), False
        self.stats["tiktoken_texts"] += len(texts)
        try:
            "".join(texts).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: replaced as the reference path does
            texts = [_sanitize(t) for t in texts]
        return self._tik.encode(texts), True

    def _build_tiktoken(self):
        if self.facts is not None:
            added, data = self.facts.added, self.facts.tokenizer_json
        else:
            added = tiktoken_bpe.added_tokens_of(self.tk)
            data = Path(self.source).read_bytes() if self.source is not None else self.tk.to_str()
        tik = tiktoken_bpe.build(added, data)
        if tik is not None and not self._verify([tiktoken_bpe.PROBE], tik.encode([tiktoken_bpe.PROBE]), "tiktoken"):
            return None
        return tik

    def _drop_tiktoken(self) -> None:
        self._tik, self._tik_wanted = None, False

    def _clear_pieces(self) -> None:
        self._pieces.clear()
        self._pieces_tokens = 0

    def _stop_using(self, what: str) -> None:
        """Turn a shortcut off for good (its cached pieces go too: they may hold its ids)."""
        self._clear_pieces()
        if what == "tiktoken":
            self._drop_tiktoken()
        elif what == "line pieces":
            self.split = False
        else:
            self._fast, self._fast_wanted = None, False

    def _reference(self, texts: list[str]) -> list[np.ndarray]:
        try:
            encs = self.tk.encode_batch_fast(texts, add_special_tokens=False)
        except (TypeError, UnicodeEncodeError, ValueError):
            # lone surrogates cannot cross into Rust: replace them and retry
            encs = self.tk.encode_batch_fast([_sanitize(t) for t in texts], add_special_tokens=False)
        return [np.array(e.ids, dtype=np.int32) for e in encs]

    def _verify(self, texts: list[str], got: list[np.ndarray], what: str) -> bool:
        """Every ``VERIFY_EVERY``-th text checked against the reference; before
        :meth:`settle`, the sample is kept for it and taken as good for now."""
        sample = list(range(0, len(texts), VERIFY_EVERY))
        if self._deferred is not None:
            self._deferred.append((what, [texts[i] for i in sample], [got[i] for i in sample]))
            return True
        ref = self._reference([texts[i] for i in sample])
        self.stats["verified_texts"] += len(sample)
        if all(np.array_equal(a, got[i]) for a, i in zip(ref, sample)):
            return True
        self._disagreed(what)
        return False

    def _disagreed(self, what: str) -> None:
        self.stats["mismatches"] += 1
        print(f"tokenize: {what} disagreed with tokenizers on a checked text; "
              f"not using {what} from now on", file=sys.stderr)

    def release(self) -> None:
        """Let go of the piece cache and fastokens' tables, which only speed
        encoding up (fastokens is built again once enough more is encoded).
        tiktoken stays: its tables are small, and freeing them took ~0.1 s."""
        self._clear_pieces()
        if self._fast is not None and self._fast.done():
            self._fast = None  # (started again once enough more is encoded)
            self._encoded_chars = 0

    def settle(self) -> list[str]:
        """Load the reference if the engine started without it, and run the checks
        that waited for it. Returns what they found wrong (also kept in
        ``late_failures``): the shortcuts named there are off from now on, and
        ids handed out before may be wrong, so the caller must encode again.
        Cheap once done."""
        if self._deferred is None:
            return self.late_failures
        tk = self.tk
        same = (prepare_tokenizer(tk) == self.facts.info
                and sorted(tiktoken_bpe.added_tokens_of(tk)) == sorted(self.facts.added))
        if not same and "tokenizer.json facts" not in self.late_failures:
            self.late_failures.append("tokenizer.json facts")
            print("tokenize: the tokenizer differs from what its tokenizer.json said", file=sys.stderr)
            for what in ("tiktoken", "line pieces", "fastokens"):
                self._stop_using(what)
        ref = iter(self._reference([t for _, texts, _ in self._deferred for t in texts]))  # one call
        for what, texts, got in self._deferred:
            want = list(itertools.islice(ref, len(texts)))
            self.stats["verified_texts"] += len(texts)
            if what in self.late_failures or all(map(np.array_equal, want, got)):
                continue
            self._disagreed(what)
            self.late_failures.append(what)
            self._stop_using(what)
        self._deferred = None  # (only now: a check that raised is run again by the next call)
        return self.late_failures

    def _by_pieces(self, texts: list[str]) -> list[np.ndarray] | None:
        cut = [line_pieces(t) for t in texts]
        cache = self._pieces
        if self._pieces_tokens >= PIECE_CACHE_TOKENS:
            self._clear_pieces()
        new = [p for p in dict.fromkeys(itertools.chain.from_iterable(cut)) if p not in cache]
        self.stats["pieces"] += sum(map(len, cut))
        self.stats["pieces_encoded"] += len(new)
        self._encoded_chars += sum(map(len, new))
        new_ids, by_tiktoken = self._bulk(new)
        for p, ids in zip(new, new_ids):
            cache[p] = ids
            self._pieces_tokens += len(ids)
        got = [c_ids[0] if len(c_ids) == 1 else np.concatenate(c_ids)
               for c_ids in ([cache[p] for p in c] for c in cut)]
        if not self._verify(texts, got, "tiktoken" if by_tiktoken else "line pieces"):
            if by_tiktoken:  # the newest shortcut goes first; the pieces are checked again without it
                self._stop_using("tiktoken")
                return self._by_pieces(texts)
            self._stop_using("line pieces")
            return None
        return got

    def _fastokens(self, fast, texts: list[str]) -> list[np.ndarray] | None:
        try:
            try:
                ids, offsets = fast.encode_batch_flat(texts)
            except (TypeError, UnicodeEncodeError, ValueError):
                texts = [_sanitize(t) for t in texts]  # as the reference path does
                ids, offsets = fast.encode_batch_flat(texts)
        except Exception as exc:  # noqa: BLE001 - the reference takes over
            print(f"tokenize: fastokens failed ({type(exc).__name__}); using tokenizers", file=sys.stderr)
            self._fast, self._fast_wanted = None, False
            return None
        bounds = np.frombuffer(offsets, dtype="<u8").astype(np.int64)
        flat = np.frombuffer(ids, dtype="<u4").astype(np.int32)
        got = [flat[bounds[i]:bounds[i + 1]] for i in range(len(texts))]
        if not self._verify(texts, got, "fastokens"):
            self._fast, self._fast_wanted = None, False
            return None
        return got

    def _start_fast(self) -> None:
        src, tk = self.source, self.tk
        self._fast = _Background(lambda: _build_fastokens(src, tk), "replay-fastokens-build")


def check_backend(backend: str) -> str:
    """``backend`` when it is one of BACKENDS that can run here, else an error."""
    if backend not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "fastokens" and not _has_fastokens():
        raise RuntimeError(f"{BACKEND_ENV}=fastokens but the fastokens package is not installed")
    return backend


def _has_fastokens() -> bool:
    import importlib.util

    return importlib.util.find_spec("fastokens") is not None


def _build_fastokens(source, reference):
    """fastokens' tokenizer for ``source`` (a tokenizer.json) or the reference's JSON;
    None when it cannot be built (an unsupported tokenizer)."""
    import fastokens

    try:
        enc = (fastokens.Tokenizer.from_file(str(source)) if source is not None
               else fastokens.Tokenizer.from_json_str(reference.to_str()))
        enc.encode_batch_flat(["warm up"])  # its first call builds more tables
    except Exception as exc:  # noqa: BLE001
        print(f"tokenize: fastokens cannot load this tokenizer ({type(exc).__name__}); "
              "using tokenizers", file=sys.stderr)
        return None
    return enc


# ---------------------------------------------------------------- the process

def load_reference(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


class EncoderProcess:
    """An :class:`Engine` in a child process (module docstring).

    ``path``: the tokenizer.json; ``fast_from_file``: fastokens may read that file
    directly (its markers are all there). Construction returns at once; the
    first call that needs the child's answer waits for it to be ready.
    Raises ``EncoderGone`` when the child is not there (the caller falls back).
    """

    def __init__(self, path: str | Path, backend: str, fast_from_file: bool):
        self._proc = child.spawn("replay.text.encoder", str(path), backend, "1" if fast_from_file else "0")
        self._lock = threading.Lock()
        self._info: dict | None = None
        self._warm_sent = 0
        self._closed = False
        # Frames go out through one sender thread, in order: a write blocks while
        # the child cannot read (its first ~0.6 s, loading), and ingest handing
        # over parts must not wait for that.
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._gone = False
        self._sender = threading.Thread(target=self._send_loop, daemon=True, name="replay-encoder-sender")
        self._sender.start()

    def info(self) -> dict:
        """vocab_size, marker_ids, markers_added (waits for the child to be ready)."""
        if self._info is None:
            with self._lock:
                if self._info is None:
                    self._info = self._reply()
        return self._info

    def _reply(self):
        try:
            msg = child.read_frame(self._proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            raise EncoderGone("the encoder process ended") from None
        if msg[0] == "error":
            raise RuntimeError(msg[1])
        return msg[1]

    def _send_loop(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is None:
                return
            if self._gone or (self._closed and msg[0] == "warm"):
                continue  # nobody to send to, or only hints nobody will take
            try:
                child.write_frame(self._proc.stdin, msg)
            except (BrokenPipeError, OSError, ValueError):
                self._gone = True  # a caller waiting for a reply gets EOF: EncoderGone

    def _send(self, msg) -> None:
        if self._gone:
            raise EncoderGone("the encoder process ended")
        self._outbox.put(msg)

    def _ask(self, msg):
        self.info()
        with self._lock:
            self._send(msg)
            return self._reply()

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return _unpack(*self._ask(("encode", texts)))

    def warm(self, parts: list[tuple[int, str, str]]) -> None:
        """Hand over (blob id, kind, JSON text) body parts to prepare ahead; no reply.
        Past ``WARM_SEND_CHARS`` in all, parts are no longer sent: the helper could
        not keep them (``PREPARED_TOKENS``), and sending costs this process time."""
        size = sum(len(t) for _, _, t in parts)
        if self._warm_sent + size > WARM_SEND_CHARS:
            return
        self._warm_sent += size
        with self._lock:
            self._send(("warm", parts))

    def take_blobs_flat(self, blob_ids: list[int]) -> PreparedBlobs:
        """The prepared parts among ``blob_ids``, as flat arrays (no array per part:
        the tokenize stage adds them to its pools as they are)."""
        ids, kinds, (segs, seg_lengths), (parts, _) = self._ask(("blobs", blob_ids))
        return PreparedBlobs(ids, kinds, np.frombuffer(segs, dtype="<u8").astype(np.uint64),
                             np.frombuffer(seg_lengths, dtype="<i8").astype(np.int64),
                             np.frombuffer(parts, dtype="<i4").astype(np.int32))

    def take_segments(self, seg_ids: list[int]) -> dict:
        """seg id → tokens (int32) of the prepared ones among ``seg_ids``."""
        ids, packed = self._ask(("segments", seg_ids))
        return dict(zip(ids, _unpack(*packed)))

    def settle(self) -> None:
        """Start the checks that wait for the reference (no reply; see :meth:`Engine.settle`)."""
        with self._lock:
            self._send(("settle",))

    def verdict(self) -> list[str]:
        """What the waiting checks found wrong (waits for them; see :meth:`Engine.settle`)."""
        return self._ask(("verdict",))

    def describe(self) -> str:
        return self._ask(("describe",))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._outbox.put(None)  # pending warm parts are dropped; a frame being written finishes
            self._sender.join(timeout=5)
            child.stop(self._proc)

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


@dataclasses.dataclass
class PreparedBlobs:
    """Prepared body parts, flat: part ``i`` (blob ``ids[i]``, ``kinds[i]``) has the
    next ``lengths[i]`` of ``seg_ids`` and of ``parts`` (each segment's part)."""
    ids: list[int]
    kinds: list[str]
    seg_ids: np.ndarray   # uint64
    lengths: np.ndarray   # int64, one per part
    parts: np.ndarray     # int32, one per segment

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def empty(cls) -> "PreparedBlobs":
        return cls([], [], np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int32))


class EncoderGone(RuntimeError):
    pass


class Prepared:
    """Body parts rendered and encoded ahead, kept until the tokenize stage takes them.

    ``add`` renders (blob id, kind, JSON text) parts, computes their segment ids
    and encodes their new texts; ``take_blobs`` gives (and forgets) a part's
    (kind, segment ids, segment parts); ``take_segments`` the tokens of
    segments. A part is only offered when every one of its segments' tokens is
    here or was handed over already. At most ``PREPARED_TOKENS`` wait at a time.
    """

    def __init__(self, engine: Engine, info: dict):
        self.engine = engine
        self.marker_ids = info["marker_ids"]
        self.vocab_size = info["vocab_size"]
        self.blobs: dict[int, tuple[str, np.ndarray, np.ndarray]] = {}
        self.tokens: dict[int, np.ndarray] = {}
        self.handed: set[int] = set()  # segment ids whose tokens the caller took
        self.waiting_tokens = 0
        self.stats = collections.Counter()

    def add(self, parts: list[tuple[int, str, str]]) -> None:
        if self.waiting_tokens >= PREPARED_TOKENS:
            self.stats["parts_dropped"] += len(parts)
            return
        rendered, texts = [], {}
        for bid, kind, text in parts:
            try:
                pieces = render_part(kind, loads(text))
            except Exception:  # noqa: BLE001 - left to the tokenize stage, which reports it
                continue
            sids = [segids.piece_seg_id(p) for p in pieces]
            for p, sid in zip(pieces, sids):
                if sid in self.tokens or sid in self.handed or sid in texts:
                    continue
                if p[0] == "text":
                    texts[sid] = p[1]
                elif p[0] == "marker":
                    self.tokens[sid] = np.array([self.marker_ids[p[1]]], dtype=np.int32)
                else:
                    self.tokens[sid] = segids.image_tokens(p[1][0], p[1][1], self.vocab_size)
            rendered.append((bid, kind, np.array(sids, dtype=np.uint64),
                             np.array([p[2] for p in pieces], dtype=np.int32)))
        for sid, ids in zip(texts, self.engine.encode(list(texts.values()))):
            self.tokens[sid] = ids
            self.waiting_tokens += len(ids)
        for bid, kind, sids, prt in rendered:
            self.blobs[bid] = (kind, sids, prt)
        self.stats["parts"] += len(rendered)

    def take_blobs(self, blob_ids) -> dict:
        out = _take(self.blobs, blob_ids)
        self.stats["parts_taken"] += len(out)
        return out

    def take_segments(self, seg_ids) -> dict:
        out = _take(self.tokens, seg_ids)
        self.handed.update(out)
        self.waiting_tokens -= sum(map(len, out.values()))
        return out


def _take(store: dict, keys) -> dict:
    """The entries of ``keys`` that ``store`` holds, removed from it."""
    return {k: v for k, v in ((k, store.pop(k, None)) for k in keys) if v is not None}


class _Inbox:
    """The child's order of work (not thread-safe: the caller holds a lock).

    Warm parts are prepared in arrival order. A request the parent waits for
    goes ahead of them, except a ``blobs`` one naming parts still queued (or
    being prepared): it waits until those are done, so the tokenize stage works
    on its first chunk while the helper prepares the later ones.
    """

    def __init__(self, backlog_chars: int | None = None):
        self.backlog_chars = WARM_BACKLOG_CHARS if backlog_chars is None else backlog_chars
        self.warm: collections.deque = collections.deque()
        self.asks: collections.deque = collections.deque()  # answered in arrival order
        self.pending: set[int] = set()  # blob ids of queued or in-progress warm parts
        self.warm_chars = 0
        self.eof = False

    def put(self, msg) -> None:
        """A message from the parent (None: its end of input)."""
        if msg is None:
            self.eof = True
        elif msg[0] == "warm":
            size = sum(len(t) for _, _, t in msg[1])
            if self.warm_chars + size <= self.backlog_chars:  # else dropped: only a hint
                self.warm.append(msg)
                self.pending.update(bid for bid, _, _ in msg[1])
                self.warm_chars += size
        else:
            self.asks.append(msg)

    def next(self):
        """The message to handle now, or None (nothing to do yet, or end of input)."""
        if self.asks and (self.asks[0][0] != "blobs" or not any(b in self.pending for b in self.asks[0][1])):
            return self.asks.popleft()
        if self.eof:
            return None
        return self.warm.popleft() if self.warm else None

    def waiting(self) -> bool:
        """The parent waits for an answer."""
        return bool(self.asks)

    def done(self, msg) -> None:
        """A warm message has been handled."""
        self.pending.difference_update(bid for bid, _, _ in msg[1])
        self.warm_chars -= sum(len(t) for _, _, t in msg[1])


def _give_back_memory() -> None:
    """Return freed heap memory to the system: after the tokenize stage took (and
    this process freed) what it had prepared, up to ~1.1 GB at a week, glibc
    would keep those pages."""
    import ctypes

    try:
        # the symbols this process already has (libc among them), not
        # ctypes.util.find_library: that runs `ldconfig -p` in a forked child,
        # which for a moment shows this whole process's memory as its own
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _serve(path: str, backend: str, fast_from_file: bool) -> None:
    """The child: protocol on the original stdout; anything printed goes to stderr."""
    # Warming runs beside the parent's ingest: one encoder thread and a lower
    # priority keep the parent's core its own; a request the parent waits for
    # gets both cores (tokenizers reads TOKENIZERS_PARALLELISM on every call).
    try:
        os.nice(5)
    except OSError:  # pragma: no cover
        pass
    proto_in, proto_out = child.protocol_streams()
    try:
        # The reference takes ~0.7 s to load, before anything could be encoded. When
        # the JSON alone says what encoding needs, the engine starts without it;
        # the parent asks for the checks that wait for it (settle) once it is done
        # taking prepared parts, and for their outcome (verdict) before it trusts
        # the stage's rows.
        facts = json_facts(Path(path).read_bytes()) if backend in ("auto", "tiktoken") else None
        if facts is not None:
            info = facts.info
            engine = Engine(lambda: load_reference(path), source=path if fast_from_file else None,
                            backend=backend, facts=facts)
        else:
            tk = load_reference(path)
            info = prepare_tokenizer(tk, path)
            source = path if (fast_from_file and not info["markers_added"]) else None
            engine = Engine(tk, source=source, backend=backend)
        prepared = Prepared(engine, info)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        child.write_frame(proto_out, ("error", f"cannot load the tokenizer: {type(exc).__name__}: {exc}"))
        return
    child.write_frame(proto_out, ("ok", info))

    cond = threading.Condition()
    inbox = _Inbox()

    def reader() -> None:  # reads promptly, so the parent never waits on a full pipe
        while True:
            try:
                msg = child.read_frame(proto_in)
            except (EOFError, OSError):
                msg = None
            with cond:
                inbox.put(msg)
                cond.notify()
            if msg is None:
                return

    threading.Thread(target=reader, daemon=True, name="replay-encoder-reader").start()
    while True:
        with cond:
            while (msg := inbox.next()) is None and not inbox.eof:
                cond.wait()
            if msg is None:
                # The parent is done: nobody will take what is still queued. Exit at
                # once: freeing the engine (tiktoken's tables, the caches) one object
                # at a time took ~0.12 s, which the parent's close() waits for.
                sys.stderr.flush()
                os._exit(0)
            waiting = inbox.waiting()
        if msg[0] == "warm":
            # beside the parent's ingest: one thread; if the parent already waits, both cores
            os.environ["TOKENIZERS_PARALLELISM"] = "true" if waiting else "false"
            try:
                prepared.add(msg[1])  # body parts found by ingest: render, then encode ahead
            finally:
                with cond:
                    inbox.done(msg)
        elif msg[0] == "encode":
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
            try:
                reply = ("ok", _pack(engine.encode(msg[1])))
            except Exception as exc:  # noqa: BLE001
                reply = ("error", f"encoding failed: {type(exc).__name__}: {exc}")
            child.write_frame(proto_out, reply)
        elif msg[0] == "blobs":
            got = prepared.take_blobs(msg[1])
            kinds, segs, parts = zip(*got.values()) if got else ((), (), ())
            child.write_frame(proto_out, ("ok", (list(got), list(kinds), _pack(list(segs), "<u8"),
                                                 _pack(list(parts)))))
        elif msg[0] == "segments":
            got = prepared.take_segments(msg[1])
            child.write_frame(proto_out, ("ok", (list(got), _pack(list(got.values())))))
        elif msg[0] == "settle":
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # beside the parent's next stage
            # this process lives on beside the replay: first it gives back what
            # the stage no longer needs (~0.04 s at a day)
            engine.release()
            _give_back_memory()
            try:
                engine.settle()
            except Exception:  # noqa: BLE001 - raised again, and reported, by the verdict
                pass
        elif msg[0] == "verdict":
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
            try:
                reply = ("ok", engine.settle())
            except Exception as exc:  # noqa: BLE001
                reply = ("error", f"checking failed: {type(exc).__name__}: {exc}")
            child.write_frame(proto_out, reply)
        elif msg[0] == "describe":
            st = prepared.stats
            ahead = (f"; {st['parts_taken']:,} of {st['parts']:,} body parts prepared while ingesting"
                     + (f" ({st['parts_dropped']:,} over the limit)" if st["parts_dropped"] else "")
                     if st["parts"] or st["parts_dropped"] else "")
            child.write_frame(proto_out, ("ok", engine.describe() + ahead))


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2], sys.argv[3] == "1")
