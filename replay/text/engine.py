"""Text → token ids, exactly what ``tokenizers`` gives, for less work.

The reference is Hugging Face ``tokenizers`` (``replay.text.tokenizer_json``).
:class:`Engine` gets the same ids for less work in two ways:

* **fastokens** (when installed; any tokenizer.json it can read): a Rust BPE
  encoder for the same tokenizer.json, far faster than the reference but
  slow to build, so it is built once the text encoded otherwise passes
  ``FASTOKENS_AFTER_CHARS`` (or at once with backend ``fastokens``), and takes
  over when ready.
* **tiktoken** (for DeepSeek-V3/V4's pre-tokenizer only): a tiktoken encoding
  of the same vocabulary encodes the text until then; it builds in a fraction
  of fastokens' time (the argument that its ids are the reference's is in
  ``replay.text.tiktoken_bpe``).

Every batch is checked: every ``VERIFY_EVERY``-th text (at least one) is
encoded by the reference and compared; a difference turns that shortcut off
for good (a warning on stderr) and the batch is encoded again without it. So a
disagreement costs speed, never a count that goes unnoticed in the sample.

The checks can also wait (*late checks*). Loading the reference costs the
encoder process's core before it could encode anything, and with little
traffic that core is the one the pipeline waits for. When the tokenizer.json
alone says everything encoding needs (``tokenizer_json.json_facts``), the
engine starts without the reference and keeps each batch's sample; the parent
calls ``settle`` once the tokenize stage is done with it, the reference is
loaded and the samples checked beside the replay, and ``verdict`` waits for
the outcome. A late disagreement cannot be undone by encoding the batch again
(its ids are stored already): the verdict names the shortcut, and the caller
tokenizes again with the reference alone (``replay.text.tokenize.confirm_tokens``).
Which of these are kept, and why: ``docs/tokenization.md``.
"""

from __future__ import annotations

import collections
import itertools
import sys
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from replay.text import tiktoken_bpe
from replay.text.tokenizer_json import JsonFacts, known_pre_tokenizer, prepare_tokenizer, sanitize

BACKEND_ENV = "REPLAY_TOKENIZER_BACKEND"
BACKENDS = ("auto", "tokenizers", "tiktoken", "fastokens")
VERIFY_EVERY = 50                   # every 50th text of a batch is checked against the reference
FASTOKENS_AFTER_CHARS = 16_000_000  # text encoded otherwise before fastokens pays for its build


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


class Engine:
    """Encodes texts exactly as the reference ``tokenizers.Tokenizer`` does (module docstring).

    ``tokenizer``: the reference, markers already added (``prepare_tokenizer``);
    or, with ``facts`` (``tokenizer_json.json_facts``), a function that loads it:
    the engine then starts without it, and the checks of its sample wait until
    :meth:`settle` (or until the reference is needed for something else).
    ``source``: tokenizer.json path fastokens may be built from, or None to build
    it from the reference's JSON. ``backend``: ``auto``, ``tokenizers`` (the
    reference alone), ``tiktoken`` (no fastokens) or ``fastokens`` (built at
    once, waited for on every batch).
    """

    def __init__(self, tokenizer, source: str | Path | None = None, backend: str = "auto",
                 facts: JsonFacts | None = None):
        check_backend(backend)
        self.facts = facts
        self._tk, self._load = (None, tokenizer) if facts is not None else (tokenizer, None)
        self._deferred: list | None = [] if facts is not None else None  # checks waiting for settle()
        self.late_failures: list[str] = []  # shortcuts a waiting check found wrong
        self.source = source
        self.backend = backend
        known = facts is not None or known_pre_tokenizer(tokenizer)
        # tiktoken: built at first use, for the pre-tokenizer it was written for
        self._tik_wanted = backend in ("auto", "tiktoken") and known and tiktoken_bpe.available()
        self._tik = None
        self._fast_wanted = backend in ("auto", "fastokens") and _has_fastokens()
        self._fast: _Background | None = None
        self._encoded_chars = 0  # encoded by tiktoken or the reference: when fastokens pays
        self.stats = collections.Counter(texts=0, fastokens_texts=0, reference_texts=0, tiktoken_texts=0,
                                         verified_texts=0, mismatches=0)
        if backend == "fastokens":
            self._start_fast()

    @property
    def tk(self):
        """The reference (loaded now if it was not yet)."""
        if self._tk is None:
            self._tk = self._load()
        return self._tk

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids (int32 arrays), in order."""
        texts = list(texts)
        self.stats["texts"] += len(texts)
        if not texts:
            return []
        got = self._by_fastokens(texts)
        if got is not None:
            return got
        self.stats["reference_texts"] += len(texts)
        self._encoded_chars += sum(map(len, texts))
        got, by_tiktoken = self._bulk(texts)
        if by_tiktoken and not self._verify(texts, got, "tiktoken"):
            self._stop_using("tiktoken")
            got = self._reference(texts)
        if self._fast_wanted and self._fast is None and self._encoded_chars >= FASTOKENS_AFTER_CHARS:
            self._start_fast()  # enough text that fastokens pays for its build
        return got

    def describe(self) -> str:
        st = self.stats
        parts = [f"{st['texts']:,} texts"]
        if st["fastokens_texts"]:
            parts.append(f"fastokens {st['fastokens_texts']:,}")
        if st["reference_texts"]:
            parts.append(f"{st['reference_texts']:,} by {'tiktoken' if st['tiktoken_texts'] else 'tokenizers'}")
        parts.append(f"{st['verified_texts']:,} checked against tokenizers, {st['mismatches']} mismatches")
        return "; ".join(parts)

    # ------------------------------------------------------------ encoders
    def _by_fastokens(self, texts: list[str]) -> list[np.ndarray] | None:
        """The texts' ids by fastokens once it is built (with backend ``fastokens``,
        waited for), its sample checked; None when it is not at hand or disagreed."""
        if self._fast is None or not (self.backend == "fastokens" or self._fast.done()):
            return None
        fast = self._fast.result()
        if fast is None:  # it could not be built
            self._stop_using("fastokens")
            return None
        try:
            try:
                ids, offsets = fast.encode_batch_flat(texts)
            except (TypeError, UnicodeEncodeError, ValueError):
                texts = [sanitize(t) for t in texts]  # as the reference path does
                ids, offsets = fast.encode_batch_flat(texts)
        except Exception as exc:  # noqa: BLE001 - the reference takes over
            print(f"tokenize: fastokens failed ({type(exc).__name__}); using tokenizers", file=sys.stderr)
            self._stop_using("fastokens")
            return None
        bounds = np.frombuffer(offsets, dtype="<u8").astype(np.int64)
        flat = np.frombuffer(ids, dtype="<u4").astype(np.int32)
        got = [flat[bounds[i]:bounds[i + 1]] for i in range(len(texts))]
        if not self._verify(texts, got, "fastokens"):
            self._stop_using("fastokens")
            return None
        self.stats["fastokens_texts"] += len(texts)
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
            texts = [sanitize(t) for t in texts]
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

    def _reference(self, texts: list[str]) -> list[np.ndarray]:
        try:
            encs = self.tk.encode_batch_fast(texts, add_special_tokens=False)
        except (TypeError, UnicodeEncodeError, ValueError):
            # lone surrogates cannot cross into Rust: replace them and retry
            encs = self.tk.encode_batch_fast([sanitize(t) for t in texts], add_special_tokens=False)
        return [np.array(e.ids, dtype=np.int32) for e in encs]

    def _start_fast(self) -> None:
        src, tk = self.source, self.tk
        self._fast = _Background(lambda: _build_fastokens(src, tk), "replay-fastokens-build")

    def _stop_using(self, what: str) -> None:
        """Turn a shortcut off for good."""
        if what == "tiktoken":
            self._tik, self._tik_wanted = None, False
        else:
            self._fast, self._fast_wanted = None, False

    # ------------------------------------------------------------ checks
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
        """Let go of fastokens' tables, which only speed encoding up (it is built
        again once enough more is encoded). tiktoken's tables are small and stay."""
        if self._fast is not None and self._fast.done():
            self._fast = None
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
            for what in ("tiktoken", "fastokens"):
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
