"""What a tokenizer.json says, and the reference tokenizer made from it.

The reference is Hugging Face ``tokenizers`` on the tokenizer.json as shipped,
with the neutral template's markers made special tokens
(:func:`prepare_tokenizer`). :func:`json_facts` reads, from the JSON alone, what
encoding needs before the reference is loaded — the markers' ids, the
vocabulary's size, the added tokens — for tokenizers whose pre-tokenizer is
the one ``replay.text.tiktoken_bpe`` translates (DeepSeek-V3/V4's), so the
encoder can start at once (``replay.text.engine``: the checks against the
reference then wait).
"""

from __future__ import annotations

import dataclasses
import json

import msgspec

from replay.text import tiktoken_bpe
from replay.text.render import MARKERS
from replay.text.render_deepseek import SPECIALS

# The pre-tokenizer tiktoken's translation was made (and is tested) for:
# DeepSeek-V3/V4's digits / CJK / main-regex splits, then byte-level.
KNOWN_PRE_TOKENIZER = {
    "type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
         "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                                               "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
                                               "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def sanitize(text: str) -> str:
    """``text`` with lone surrogates replaced (they cannot cross into Rust)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def prepare_tokenizer(tokenizer, name: str = "", add_markers: bool = True) -> dict:
    """Make every neutral-template marker a special token of ``tokenizer`` (a
    ``tokenizers.Tokenizer``, changed in place). Returns what callers need:
    ``vocab_size`` (base vocabulary), ``marker_ids``, ``markers_added``.
    ``add_markers=False`` (a chat template's tokens must be the tokenizer's as
    shipped): nothing is added, and ``marker_ids`` names the markers it has."""
    from tokenizers import AddedToken

    vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=False)) or 1
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    missing = [s for s in MARKERS.values() if s not in added]
    if not add_markers:
        ids = {m: int(tokenizer.token_to_id(s)) for m, s in {**SPECIALS, **MARKERS}.items() if s in added}
        return {"vocab_size": vocab_size, "marker_ids": ids, "markers_added": False}
    if missing:
        tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in missing])
    marker_ids = {}
    for marker, s in MARKERS.items():
        tid = tokenizer.token_to_id(s)
        if tid is None:  # pragma: no cover - add_special_tokens always succeeds
            raise RuntimeError(f"marker {s!r} missing from tokenizer {name}")
        marker_ids[marker] = int(tid)
    for marker, s in SPECIALS.items():  # another rendering's tokens: used where present, never added
        tid = tokenizer.token_to_id(s)
        if marker not in marker_ids and tid is not None and s in added:
            marker_ids[marker] = int(tid)
    return {"vocab_size": vocab_size, "marker_ids": marker_ids, "markers_added": bool(missing)}


def known_pre_tokenizer(tokenizer) -> bool:
    """True when ``tokenizer`` (loaded) is one tiktoken's translation holds for:
    the known pre-tokenizer, no normalizer, and no added token holding a line break."""
    try:
        pre = tokenizer.pre_tokenizer
        pre_state = json.loads(pre.__getstate__()) if pre is not None else None
        norm = tokenizer.normalizer
        norm_state = json.loads(norm.__getstate__()) if norm is not None else None
    except Exception:  # noqa: BLE001 - anything unexpected: no shortcut
        return False
    return _known(pre_state, norm_state, [t.content for t in tokenizer.get_added_tokens_decoder().values()])


def _known(pre_state, norm_state, added_contents) -> bool:
    """The conditions of :func:`known_pre_tokenizer` on a tokenizer's pre-tokenizer
    and normalizer (as JSON values) and its added tokens' contents."""
    return (pre_state == KNOWN_PRE_TOKENIZER
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
    """The model's vocabulary size. Reading the vocabulary costs far more than
    all else json_facts needs, so the count is kept in the cache beside
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
    it is loaded (``replay.text.engine.Engine.settle``)."""
    info: dict
    added: list
    tokenizer_json: bytes


def json_facts(tokenizer_json: bytes) -> JsonFacts | None:
    """The :class:`JsonFacts` of a tokenizer.json, or None unless every marker is
    an added token already, the model a BPE, and :func:`known_pre_tokenizer`'s
    conditions hold on the JSON's own words: the known pre-tokenizer, no
    normalizer, no added token holding a line break. (A JSON that says them
    differently from the reference's own view only loses the early start.)"""
    try:
        doc = msgspec.json.decode(tokenizer_json, type=_JsonDoc)
        added = [tiktoken_bpe.AddedToken(int(t["id"]), t["content"], bool(t.get("lstrip")),
                                         bool(t.get("rstrip")), bool(t.get("single_word")))
                 for t in doc.added_tokens]
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, ValueError):
        return None
    if (doc.model is None or doc.model.type != "BPE"
            or not _known(doc.pre_tokenizer, doc.normalizer, [t.content for t in added])):
        return None
    ids = {t.content: t.id for t in added}
    if any(m not in ids for m in MARKERS.values()) or len(ids) != len(added):
        return None
    info = {"vocab_size": _vocab_size(tokenizer_json) or 1,
            "marker_ids": {**{name: ids[m] for name, m in SPECIALS.items() if m in ids},
                           **{name: ids[m] for name, m in MARKERS.items()}}, "markers_added": False}
    return JsonFacts(info, added, tokenizer_json)


def load_reference(path: str):
    """The reference: Hugging Face ``tokenizers`` on the tokenizer.json."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)
