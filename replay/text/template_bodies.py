"""Bodies stored as content-addressed parts, assembled as parsed objects for a
chat template (``--chat-template``; the tokenize stage's template path)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from replay.store.jsontext import loads
from replay.text import render_template


class TemplateBodies:
    """Bodies stored as parts, assembled as parsed objects for a chat template:
    each part parsed once (its blob id), so the same tool definitions and
    messages are the same objects in every request that repeats them — the
    template's per-object work (``tojson``) is then remembered
    (``render_template.freeze_inputs``: nothing changes these objects). The
    text between parts (glue: the keys, and every other top-level value) is
    parsed with ``0`` in the parts' places, once per distinct skeleton."""

    MAX_CHARS = 64_000_000  # text of the parts held parsed (then all are forgotten)

    def __init__(self):
        self.parts: dict[int, Any] = {}   # blob id → parsed value (tools, system, messages)
        self.glue: dict[int, str] = {}    # blob id → text (glue)
        self.skeletons: dict[str, Any] = {}
        self.chars = 0

    def _forget(self) -> None:
        self.parts.clear()
        self.skeletons.clear()
        self.chars = 0
        render_template.forget_frozen()

    def assemble(self, con, by_blobs: np.ndarray, blobs_col) -> list:
        """Per row of the chunk: its body (a dict) when stored as parts (``by_blobs``), else None."""
        rows = [blobs_col[i].values.to_numpy(zero_copy_only=False).tolist() if by_blobs[i] else None
                for i in range(len(by_blobs))]
        parts, glue = self.parts, self.glue
        wanted = {b for r in rows if r is not None for b in r if b not in parts and b not in glue}
        if wanted:
            if self.chars > self.MAX_CHARS:
                self._forget()
                wanted = {b for r in rows if r is not None for b in r if b not in glue}
            _replay_blob_ids = pa.table({"blob_id": pa.array(  # noqa: F841 - read by DuckDB by name
                np.fromiter(wanted, dtype=np.uint64, count=len(wanted)), pa.uint64())})
            for bid, kind, text in con.execute("SELECT b.blob_id, b.kind, b.text FROM blobs b "
                                               "SEMI JOIN _replay_blob_ids w USING (blob_id)").fetchall():
                if kind == "glue":
                    glue[bid] = text
                else:
                    parts[bid] = loads(text)
                    self.chars += len(text)
        out: list = [None] * len(rows)
        for i, r in enumerate(rows):
            if r is None or not all(b in glue or b in parts for b in r):
                continue  # (a part missing: the request is set aside, no body)
            skel_text = "".join([glue.get(b, "0") for b in r])
            skel = self.skeletons.get(skel_text)
            if skel is None:
                if len(self.skeletons) >= 10_000:
                    self.skeletons.clear()
                skel = self.skeletons[skel_text] = loads(skel_text)
            values = iter([parts[b] for b in r if b not in glue])
            body = {}
            for k, v in skel.items():
                if k == "system":
                    body[k] = next(values)
                elif (k == "tools" or k == "messages") and type(v) is list:
                    body[k] = [next(values) for _ in v]
                else:
                    body[k] = v
            out[i] = body
        return out
