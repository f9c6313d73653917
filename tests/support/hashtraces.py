"""Generated Mooncake-style hash-id traces (JSON Lines records) with the cases the
direct capacity path must read exactly as ingest does: equal timestamps,
gaps of exactly a TTL, empty prompts, partial last blocks, shared prefixes."""

from __future__ import annotations

import json
import random


def mooncake_records(seed: int, n: int = 60, block_size: int | None = None) -> list[dict]:
    """``n`` records in a shuffled-ish time order: prefixes chained from a few
    conversations (ids shared at equal positions), every tenth prompt empty,
    the last block partial in most, ties and gaps of exactly 5 s, 60 s and 1 h."""
    rng = random.Random(seed)
    b = block_size or 512
    convs = [[rng.randrange(1_000_000) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    ts, out = 0, []
    for i in range(n):
        ts += rng.choice((0, 0, 1, 5_000, 60_000, 3_600_000, 4_999, 5_001, 250))
        conv = convs[rng.randrange(len(convs))]
        if rng.random() < 0.5:  # the conversation grows by a block or two
            conv.extend(rng.randrange(1_000_000) for _ in range(rng.randint(1, 2)))
        k = 0 if i % 10 == 9 else rng.randint(1, len(conv))
        ids = conv[:k]
        n_in = 0 if k == 0 else b * (k - 1) + rng.choice((1, b // 2, b - 1, b, b))
        if k == 1 and rng.random() < 0.2:
            n_in = b + rng.randint(1, 900)  # one block holding more than a block (its tokens beyond never hit)
        rec = {"timestamp": ts, "input_length": n_in, "output_length": rng.randint(0, 300), "hash_ids": ids}
        if block_size is not None:
            rec["block_size"] = block_size
        out.append(rec)
    if seed % 2:  # a file not in time order: the replay sorts it, ties in file order
        rng.shuffle(out)
    return out


def write_jsonl(path, records, sep: str = "\n") -> str:
    path.write_text(sep.join(json.dumps(r) for r in records) + "\n")
    return str(path)
