"""What a tokenizer.json says, and the reference tokenizer made from it.

The reference is Hugging Face ``tokenizers`` on the tokenizer.json as shipped,
with the neutral template's markers made special tokens
(:func:`prepare_tokenizer`).
"""

from __future__ import annotations

import msgspec

from replay.text.render import MARKERS
from replay.text.render_deepseek import SPECIALS

# DeepSeek-V3/V4's pre-tokenizer (digits / CJK / main-regex splits, then
# byte-level): the one a chat template's long runs are cut into lines for
# (``replay.text.render_template``).
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


def _known(pre_state, norm_state, added_contents) -> bool:
    """A tokenizer's pre-tokenizer and normalizer (as JSON values) and its added
    tokens' contents are the known pre-tokenizer's, no normalizer, and no added
    token holding a line break."""
    return (pre_state == KNOWN_PRE_TOKENIZER
            and norm_state in (None, {"type": "Sequence", "normalizers": []})
            and not any("\n" in c or "\r" in c for c in added_contents))


class _JsonDoc(msgspec.Struct):  # what the splitter reads of a tokenizer.json; the rest is skipped unread
    added_tokens: list[dict] = []
    normalizer: object = None
    pre_tokenizer: object = None


def load_reference(path: str):
    """The reference: Hugging Face ``tokenizers`` on the tokenizer.json."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)
