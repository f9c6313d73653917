"""Text → token ids, exactly what ``tokenizers`` gives, for less work.

The reference is Hugging Face ``tokenizers`` (``replay.text.tokenizer_json``).
:class:`Engine` encodes with it until **fastokens** (a Rust BPE for the same
tokenizer.json, tens of times faster, about a second to build in a thread of
its own: :func:`start_fastokens`) is built, then with fastokens. The build
starts once ``FASTOKENS_FROM_CHARS`` were encoded or ingest hands parts over
(``expect_work``); past ``FASTOKENS_WAIT_CHARS`` the engine waits for it (backend
``fastokens``: always). Every batch fastokens encodes is checked on a sample
(:func:`_sample`) against the reference; a difference turns fastokens off for
good. The details, and which shortcuts are kept and why: ``docs/tokenization.md``.
"""

from __future__ import annotations

import collections
import sys
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from replay.text.render import MARKERS
from replay.text.tokenizer_json import sanitize

BACKEND_ENV = "REPLAY_TOKENIZER_BACKEND"
BACKENDS = ("auto", "tokenizers", "fastokens")
VERIFY_EVERY = 50                   # one text in 50 is checked against the reference
FASTOKENS_FROM_CHARS = 64_000       # text encoded by the reference before fastokens' build starts
FASTOKENS_WAIT_CHARS = 256_000      # ... before the engine waits for it (the reference: ~3 M characters/s)


class Engine:
    """Encodes texts exactly as the reference does (module docstring).

    ``tokenizer``: the reference, markers added (``prepare_tokenizer``, with
    the neutral markers when ``add_markers``); ``source``: its tokenizer.json
    (None: fastokens from the reference's JSON); ``backend``: ``auto``,
    ``tokenizers`` or ``fastokens`` (module docstring); ``fast``: fastokens'
    build, started already (:func:`start_fastokens`)."""

    def __init__(self, tokenizer, source: str | Path | None = None, backend: str = "auto",
                 add_markers: bool = True, fast: Future | None = None):
        check_backend(backend)
        self.tk = tokenizer
        self.source = source
        self.add_markers = add_markers
        self.backend = backend
        self._fast_wanted = backend != "tokenizers" and _has_fastokens()
        self._fast: Future | None = fast if self._fast_wanted else None
        self._encoded_chars = 0  # by the reference
        self.stats = collections.Counter(texts=0, fastokens_texts=0, reference_texts=0, verified_texts=0,
                                         mismatches=0)
        if backend == "fastokens" and self._fast is None:
            self._start_fast()

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids (int32 arrays), in order."""
        texts = list(texts)
        self.stats["texts"] += len(texts)
        if not texts:
            return []
        if self._fast_wanted:
            chars = self._encoded_chars + sum(map(len, texts))
            if self._fast is None and chars >= FASTOKENS_FROM_CHARS:
                self._start_fast()
            got = self._by_fastokens(texts, wait=chars >= FASTOKENS_WAIT_CHARS)
            if got is not None:
                return got
            self._encoded_chars = chars
        self.stats["reference_texts"] += len(texts)
        return self._reference(texts)

    def building(self) -> bool:
        """fastokens' build is under way: texts are better kept for it than
        encoded by the reference now."""
        return self._fast is not None and not self._fast.done()

    def describe(self) -> str:
        st = self.stats
        parts = [f"{st['texts']:,} texts"]
        if st["fastokens_texts"]:
            parts.append(f"fastokens {st['fastokens_texts']:,}")
        if st["reference_texts"]:
            parts.append(f"{st['reference_texts']:,} by tokenizers")
        parts.append(f"{st['verified_texts']:,} checked against tokenizers, {st['mismatches']} mismatches")
        return "; ".join(parts)

    def _by_fastokens(self, texts: list[str], wait: bool) -> list[np.ndarray] | None:
        """The texts' ids by fastokens once it is built (``wait``, or backend
        ``fastokens``: waited for), its sample checked; None when it is not at
        hand or disagreed."""
        if self._fast is None or not (wait or self.backend == "fastokens" or self._fast.done()):
            return None
        fast = self._fast.result()
        if fast is None:  # it could not be built
            self._stop_fast()
            return None
        try:
            try:
                ids, offsets = fast.encode_batch_flat(texts)
            except (TypeError, UnicodeEncodeError, ValueError):
                texts = [sanitize(t) for t in texts]  # as the reference path does
                ids, offsets = fast.encode_batch_flat(texts)
        except Exception as exc:  # noqa: BLE001 - the reference takes over
            print(f"tokenize: fastokens failed ({type(exc).__name__}); using tokenizers", file=sys.stderr)
            self._stop_fast()
            return None
        bounds = np.frombuffer(offsets, dtype="<u8").astype(np.int64)
        flat = np.frombuffer(ids, dtype="<u4").astype(np.int32)
        got = [flat[bounds[i]:bounds[i + 1]] for i in range(len(texts))]
        sample = _sample(texts)
        self.stats["verified_texts"] += len(sample)
        if not all(np.array_equal(a, got[i]) for a, i in zip(self._reference([texts[i] for i in sample]), sample)):
            self.stats["mismatches"] += 1
            print("tokenize: fastokens disagreed with tokenizers on a checked text; "
                  "not using fastokens from now on", file=sys.stderr)
            self._stop_fast()
            return None
        self.stats["fastokens_texts"] += len(texts)
        return got

    def _reference(self, texts: list[str]) -> list[np.ndarray]:
        try:
            encs = self.tk.encode_batch_fast(texts, add_special_tokens=False)
        except (TypeError, UnicodeEncodeError, ValueError):
            # lone surrogates cannot cross into Rust: replace them and retry
            encs = self.tk.encode_batch_fast([sanitize(t) for t in texts], add_special_tokens=False)
        return [np.array(e.ids, dtype=np.int32) for e in encs]

    def expect_work(self) -> None:
        """Much text is coming (ingest hands parts over): fastokens' build starts now."""
        if self._fast_wanted and self._fast is None:
            self._start_fast()

    def release(self) -> None:
        """Let go of fastokens' tables (the work that paid for them is done;
        built again once enough more is encoded)."""
        self._fast, self._encoded_chars = None, 0

    def _stop_fast(self) -> None:
        """Turn fastokens off for good."""
        self._fast, self._fast_wanted = None, False

    def _start_fast(self) -> None:
        self._fast = start_fastokens(self.source, self.tk, self.add_markers)


def start_fastokens(source, reference=None, add_markers: bool = True) -> Future:
    """fastokens' build in a thread of its own (:func:`_build_fastokens`): its
    result is the tokenizer, or None when it cannot be built."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="replay-fastokens-build")
    fut = pool.submit(_build_fastokens, source, reference, add_markers)
    pool.shutdown(wait=False)  # (its thread ends with the build)
    return fut


def _sample(texts: list[str]) -> list[int]:
    """The indices of the texts of a batch that are checked (module docstring)."""
    got = [i for i, t in enumerate(texts)
           if zlib.crc32(t[-64:].encode("utf-8", "surrogatepass")) % VERIFY_EVERY == 0]
    return got or [min(range(len(texts)), key=lambda i: len(texts[i]))]


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


def _build_fastokens(source, reference=None, add_markers: bool = True):
    """fastokens' tokenizer for ``source`` (a tokenizer.json, given the markers
    ``prepare_tokenizer`` gives the reference: the same ids, as fastokens
    assigns added tokens' ids as ``tokenizers`` does) or the reference's JSON;
    None when it cannot be built (an unsupported tokenizer). From the file, it
    needs no reference: the build can start before the reference is loaded."""
    import fastokens

    try:
        if source is not None:
            enc = fastokens.Tokenizer.from_file(str(source))
            if add_markers:
                from tokenizers import AddedToken

                have = {t["content"] for t in enc.added_tokens()}
                missing = [s for s in MARKERS.values() if s not in have]
                if missing:
                    enc.add_tokens([AddedToken(s, special=True, normalized=False) for s in missing])
        else:
            enc = fastokens.Tokenizer.from_json_str(reference.to_str())
        enc.encode_batch_flat(["warm up"])  # its first call builds more tables
    except Exception as exc:  # noqa: BLE001
        print(f"tokenize: fastokens cannot load this tokenizer ({type(exc).__name__}); "
              "using tokenizers", file=sys.stderr)
        return None
    return enc
