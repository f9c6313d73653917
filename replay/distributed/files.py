"""What a Ray task does with one log file (``--engine ray``): parse it
(``replay.readers.parsed``) and, for the neutral rendering, render and encode
the body parts it introduces, as the encoder process does while the single
process ingests (``replay.text.encoder.Prepared``) — but with the reference
``tokenizers`` alone, so the ids need no check. The driver hands the parts
of the blobs it stores to the tokenizer (``Tok.add_prepared``), and the
tokenize stage takes them as it takes the encoder process's: the same
rendering, segment ids and tokens, so the same rows.
"""

from __future__ import annotations

import functools

from replay.readers.formats import Options
from replay.readers.parsed import ParsedFile, parse_unit


@functools.lru_cache(maxsize=2)
def _reference(tokenizer_json: str):
    """The reference tokenizer with the neutral rendering's markers, and its info
    (once per worker process: Ray reuses them)."""
    from replay.text.engine import Engine
    from replay.text.tokenizer_json import load_reference, prepare_tokenizer

    tk = load_reference(tokenizer_json)
    info = prepare_tokenizer(tk, tokenizer_json, True)
    return Engine(tk, backend="tokenizers"), info


def parse_and_prepare(path, forced: str | None, opts: Options, known: frozenset = frozenset(),
                      tokenizer_json: str | None = None) -> ParsedFile:
    """``parse_unit`` (a file, or a byte range of one: ``replay.readers.units``), and with ``tokenizer_json`` its new body parts
    rendered and encoded (``ParsedFile.prepared``: blob id → (kind, segment
    ids, parts) and segment id → tokens)."""
    got = parse_unit(path, forced, opts, known)
    if tokenizer_json is None or got.blobs is None or not got.blobs.num_rows:
        return got
    from replay.text.encoder import Prepared

    engine, info = _reference(tokenizer_json)
    prep = Prepared(engine, info)
    cols = [got.blobs.column(c).to_pylist() for c in ("blob_id", "kind", "text")]
    prep.add([(b, k, t) for b, k, t in zip(*cols) if k != "glue"])
    got.prepared = (prep.blobs, prep.tokens)
    return got
