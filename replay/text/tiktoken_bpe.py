"""The DeepSeek-V3/V4 tokenizer as a tiktoken encoding: the ids of ``tokenizers``, faster.

tiktoken encodes the same text faster than ``tokenizers`` (the reference),
given the same vocabulary, and builds in a fraction of fastokens' time
(``docs/tokenization.md``). Two things must agree for the ids to be the same:

* **The pieces.** The reference pre-tokenizer (``tokenizer_json.KNOWN_PRE_TOKENIZER``;
  :func:`build` is only called for it) is a sequence: number runs
  ``\\p{N}{1,3}`` are isolated over the whole text, then CJK runs in what is left,
  then the main regex is applied to *every* piece so far, keeping the text
  between its matches as pieces too ("Isolated"). tiktoken runs one regex over
  the text and keeps only its matches. :data:`PATTERN` is that sequence as one
  regex: a number run; else the main regex restricted to the characters of the
  piece it would have run on (CJK runs: ``K``; the rest, neither digit nor CJK:
  ``O``), with "end of piece" in its one lookahead read as "next character outside
  the piece's class"; else the text no alternative matches ("gaps"): a
  character no alternative can start on unless a letter follows, while no letter
  follows. (Which characters those are is argued next to ``_G_O``/``_G_K``.)
* **The merges.** The reference merges the adjacent pair of lowest merge index
  that is in its merge list; tiktoken the adjacent pair whose concatenation has
  the lowest rank. With rank = token id these pick the same pair when merged ids
  grow with merge index (checked in :func:`build`) and BPE never reaches a state
  where two adjacent symbols concatenate to a token that no merge makes from that
  pair. That holds for a vocabulary learned by BPE but cannot be read off its
  tables, so it is checked: on a probe text when building, in the tests on
  adversarial and real text, and by the engine's sample of every batch (a
  difference turns tiktoken off).

Added tokens (the reference splits them out of the text before pre-tokenizing)
become tiktoken special tokens, allowed everywhere; that is exact when none has
lstrip/rstrip/single_word set and none is a prefix of another (the reference
takes the longest match, tiktoken's regex the first alternative).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import orjson

_K = "\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff"  # the CJK class of the second split

# The main regex, alternative by alternative, on a piece of O characters
# (neither \p{N} nor K: number runs and CJK runs are pieces of their own).
_MAIN_O = "|".join([
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+""",
    rf"[^\r\n\p{{L}}\p{{P}}\p{{S}}\p{{N}}{_K}]?[[\p{{L}}\p{{M}}]--[{_K}]]+",
    rf" ?[[\p{{P}}\p{{S}}]--[{_K}]]+[\r\n]*",
    r"\s*[\r\n]+",
    rf"\s+(?![^\s\p{{N}}{_K}])",  # (?!\S), the piece ending where a digit or CJK begins
    r"\s+",
])
# ... and on a CJK run: no ASCII, space or line break can occur in it.
_MAIN_K = "|".join([
    rf"[[{_K}]--[\p{{L}}\p{{P}}\p{{S}}]]?[[{_K}]&&[\p{{L}}\p{{M}}]]+",
    rf"[[{_K}]&&[\p{{P}}\p{{S}}]]+",
])
# Gaps. In an O piece, a letter or mark starts the second alternative, P/S the
# third, whitespace the fourth to sixth; any other character c only starts the
# second, and only when a letter or mark follows. So the gap characters are
# those outside L, M, P, S, N, \s and K, and a gap is a run of them each not
# followed by a letter/mark. Likewise in a CJK run with the K characters outside
# L, M, P, S (unassigned code points of the kana blocks).
_G_O = rf"[^\p{{L}}\p{{M}}\p{{P}}\p{{S}}\p{{N}}\s{_K}]"
_G_K = rf"[[{_K}]--[\p{{L}}\p{{M}}\p{{P}}\p{{S}}]]"
PATTERN = "|".join([
    r"\p{N}{1,3}",
    _MAIN_K,
    _MAIN_O,
    rf"(?:{_G_K}(?![[{_K}]&&[\p{{L}}\p{{M}}]]))+",
    rf"(?:{_G_O}(?![[\p{{L}}\p{{M}}]--[{_K}]]))+",
])

# Every kind of character the pattern treats apart, run together: the engine checks
# it against the reference before trusting an encoder it built.
PROBE = ("Hello, world!  foo.bar(x)\t:e\n\n    indented\r\n 12345 ٣٤ ⅷ 𝟘\u00a0\u3000x "
          "日本語・カタカナ゛゠ゟ\u3040\u3097゙ 한국어 éü\u0301 😀🤖\u200d \x00\x01\x1c\x1d\x7f\x85\ue000 "
          "\u2028\u2029\u200b\ufeff 's 're ?!... {\"k\": [1, 2]} <b>tag</b> \x0b\x0c end  \n")


def available() -> bool:
    return importlib.util.find_spec("tiktoken") is not None


def _byte_level_table() -> dict[int, int]:
    """The byte-level alphabet (GPT-2's ``bytes_to_unicode``) inverted: code point → byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(kept, kept))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {c: b for b, c in chars.items()}


def _merge_order_is_id_order(vocab: dict[str, int], merges: list) -> bool:
    """Each merge makes a token of the vocabulary, with ids growing along the list."""
    if merges and isinstance(merges[0], str):
        # "a b": byte-level strings hold no space ("Ġ" stands for it), so a+b is the string without it
        if set(map(str.count, merges, itertools.repeat(" "))) != {1}:
            return False
        made = list(map(vocab.get, map(str.replace, merges, itertools.repeat(" "), itertools.repeat(""))))
    else:
        made = [vocab.get(a + b) for a, b in merges]
    if None in made:
        return False
    ids = np.array(made, dtype=np.int64)
    return bool(np.all(ids[1:] > ids[:-1]))


def _byte_ranks(vocab: dict[str, int]) -> dict[bytes, int]:
    """The vocabulary's byte-level strings as the bytes they stand for → id; strings
    that are not byte-level (a special token kept in the vocabulary) are left out.
    All strings are translated in one piece and cut by their lengths (a string's
    bytes are as many as its characters)."""
    table = _byte_level_table()
    for c in range(0x144):  # below the alphabet's top, outside it: never a byte
        table.setdefault(c, 0x100)
    byte_level = [s for s in vocab if s and max(s) < "\u0144"]
    raw = "".join(byte_level).translate(table)
    try:
        data = raw.encode("latin-1")
    except UnicodeEncodeError:  # some strings held a character outside the alphabet
        ranks = {}
        for s in byte_level:
            try:
                ranks[s.translate(table).encode("latin-1")] = vocab[s]
            except UnicodeEncodeError:
                continue
        return ranks
    return dict(zip(_cut(data, 0, list(itertools.accumulate(map(len, byte_level)))),
                    map(vocab.__getitem__, byte_level)))


def _cut(data: bytes, start: int, ends: list[int]):
    """The consecutive pieces ``data[start:ends[0]]``, ``data[ends[0]:ends[1]]``, …."""
    return map(data.__getitem__, map(slice, [start, *ends[:-1]], ends))


def _ranks_from_json(tokenizer_json: str | bytes) -> dict[bytes, int] | None:
    """The merge ranks tiktoken needs (bytes → id), or None when the model is not a
    byte-level BPE whose merge order is its id order (module docstring)."""
    model = orjson.loads(tokenizer_json).get("model") or {}
    if (model.get("type") != "BPE" or model.get("dropout") or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix") or model.get("byte_fallback") or model.get("ignore_merges")):
        return None
    vocab: dict[str, int] = model.get("vocab") or {}
    if not _merge_order_is_id_order(vocab, model.get("merges") or []):
        return None
    ranks = _byte_ranks(vocab)
    del model, vocab  # the parsed JSON (large) goes before tiktoken copies the ranks
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    return ranks


# The ranks are a function of tokenizer.json alone and deriving them (parse,
# merge check, byte-level translation) is most of the build: they are kept in a
# file named by the JSON's sha256, read back far faster. Bump the version
# whenever _ranks_from_json changes what it gives.
RANKS_CACHE_VERSION = 1
_RANKS_MAGIC = b"replay tiktoken ranks\n"


def cache_dir() -> Path | None:
    """Where the ranks are kept: ``REPLAY_CACHE_DIR`` (empty: nowhere), else
    ``$XDG_CACHE_HOME/replay`` or ``~/.cache/replay``."""
    d = os.environ.get("REPLAY_CACHE_DIR")
    if d is not None:
        return Path(d) if d else None
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "replay"


def cache_file(kind: str, version: int, tokenizer_json: str | bytes, suffix: str) -> Path | None:
    """The cache file of something derived from ``tokenizer_json`` alone (named by
    its sha256), or None when nothing is cached (:func:`cache_dir`)."""
    d = cache_dir()
    if d is None:
        return None
    data = tokenizer_json.encode("utf-8") if isinstance(tokenizer_json, str) else tokenizer_json
    return d / f"{kind}-v{version}-{hashlib.sha256(data).hexdigest()[:32]}{suffix}"


def write_cache(path: Path | None, data: bytes) -> None:
    """Write a cache file atomically; one that cannot be written is no error."""
    if path is None:
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _ranks_path(tokenizer_json: str | bytes) -> Path | None:
    return cache_file("tiktoken-ranks", RANKS_CACHE_VERSION, tokenizer_json, ".bin")


def _pack_ranks(ranks: dict[bytes, int]) -> bytes:
    """magic, count, ids (u32), lengths (u32), then the token bytes run together."""
    keys = list(ranks)
    ids = np.fromiter(map(ranks.__getitem__, keys), dtype="<u4", count=len(keys))
    lens = np.fromiter(map(len, keys), dtype="<u4", count=len(keys))
    return b"".join([_RANKS_MAGIC, struct.pack("<Q", len(keys)), ids.tobytes(), lens.tobytes(), *keys])


def _unpack_ranks(buf: bytes) -> dict[bytes, int] | None:
    """The ranks of a :func:`_pack_ranks` file, or None for anything else (a
    truncated or foreign file)."""
    head = len(_RANKS_MAGIC) + 8
    if len(buf) < head or not buf.startswith(_RANKS_MAGIC):
        return None
    (n,) = struct.unpack_from("<Q", buf, len(_RANKS_MAGIC))
    if len(buf) < head + 8 * n:
        return None
    ids = np.frombuffer(buf, dtype="<u4", count=n, offset=head)
    lens = np.frombuffer(buf, dtype="<u4", count=n, offset=head + 4 * n)
    start = head + 8 * n
    ends = (np.cumsum(lens, dtype=np.int64) + start).tolist()
    if (ends[-1] if n else start) != len(buf):
        return None
    # a plain loop: half the time of dict(zip(map(slice…))) over the 128,000 tokens
    ranks, a = {}, start
    for b, i in zip(ends, ids.tolist()):
        ranks[buf[a:b]] = i
        a = b
    return ranks


def cached_ranks(tokenizer_json: str | bytes) -> dict[bytes, int] | None:
    """:func:`_ranks_from_json`, from the cache file when there is a good one;
    a new result is written there (atomically; a cache that cannot be written is
    no error)."""
    path = _ranks_path(tokenizer_json)
    if path is not None:
        try:
            got = _unpack_ranks(path.read_bytes())
        except OSError:
            got = None
        if got is not None:
            return got
    ranks = _ranks_from_json(tokenizer_json)
    if ranks is not None:
        write_cache(path, _pack_ranks(ranks))
    return ranks


class AddedToken(NamedTuple):
    """An added token of the tokenizer (its entry in tokenizer.json's ``added_tokens``)."""
    id: int
    content: str
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


def added_tokens_of(reference) -> list[AddedToken]:
    """A ``tokenizers`` Tokenizer's added tokens, as :func:`build` takes them."""
    return [AddedToken(int(i), t.content, bool(t.lstrip), bool(t.rstrip), bool(t.single_word))
            for i, t in reference.get_added_tokens_decoder().items()]


def build(added: Sequence[AddedToken], tokenizer_json: str | bytes):
    """A tiktoken Encoding giving the reference's ids, or None when this tokenizer
    is not one the argument above holds for. ``added``: the reference's added
    tokens, markers included (:func:`added_tokens_of`); ``tokenizer_json``: its
    tokenizer.json text (for the vocabulary and merges). The caller has checked
    the pre-tokenizer, and checks :data:`PROBE` against the reference."""
    import tiktoken

    if any(t.lstrip or t.rstrip or t.single_word for t in added):  # the cheap refusals first
        return None
    contents = sorted(t.content for t in added)
    if any(b.startswith(a) for a, b in zip(contents, contents[1:])):  # sorted: a prefix sorts just before
        return None
    ranks = cached_ranks(tokenizer_json)
    if ranks is None:
        return None
    try:
        enc = tiktoken.Encoding("replay-deepseek", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})
    except Exception:  # noqa: BLE001 - a pattern this tiktoken cannot compile: no shortcut
        return None
    return Encoder(enc, {t.content: int(t.id) for t in added})


class Encoder:
    """tiktoken's ordinary encoding, with the added tokens split out of the text
    first, as the reference does. (Not tiktoken's own special-token handling: it
    is slow with a thousand of them.)"""

    def __init__(self, enc, added: dict[str, int]):
        self.enc = enc
        self.added = added
        self._firsts = tuple(sorted({s[0] for s in added if s}))
        self._added_re = _trie_regex(list(added)) if added else None

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids (int32). The texts must hold no lone surrogate: tiktoken
        would replace it with U+FFFD, the engine's reference path with "?"
        (the engine replaces them first)."""
        ordinary, firsts = self.enc.encode_ordinary, self._firsts
        flat: list[int] = []
        ends = []
        for t in texts:
            if any(f in t for f in firsts):
                ids: list[int] = []
                pos = 0
                for m in self._added_re.finditer(t):
                    if m.start() > pos:
                        ids += ordinary(t[pos:m.start()])
                    ids.append(self.added[m.group()])
                    pos = m.end()
                if pos < len(t):
                    ids += ordinary(t[pos:])
            else:
                ids = ordinary(t)
            flat += ids
            ends.append(len(flat))
        values = np.array(flat, dtype=np.int32)  # one conversion, then views: far cheaper than one a text
        return [values[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def _trie_regex(words: list[str]) -> re.Pattern:
    """A regex matching exactly ``words`` (none a prefix of another), as a trie of
    alternatives: a thousand flat alternatives would be tried one by one at every
    ``<`` of a text."""
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items())]
        if len(alts) <= 1:
            return alts[0] if alts else ""
        return "(?:" + "|".join(alts) + ")"

    return re.compile(emit(trie))
