"""Bodies stored as content-addressed parts, assembled as parsed objects for a
chat template (``--chat-template``; the tokenize stage's template path)."""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.store.jsontext import loads


class Part(dict):
    """A body part parsed once (an object): :class:`TemplateBodies` hands the
    same one to every request that repeats the part, and nothing changes it, so
    what is derived from it alone is kept on it (``derived``: by the function
    and arguments that derived it; ``template_messages``)."""
    __slots__ = ("derived",)

    def __init__(self, value: dict):
        super().__init__(value)
        self.derived: dict = {}


class TemplateBodies:
    """Bodies stored as parts, assembled as parsed objects for a chat template:
    each part parsed once (by blob id) however many requests repeat it; the
    glue between parts (keys, other top-level values) parsed with ``0`` in the
    parts' places, once per distinct skeleton. Parsed parts are held in two
    generations of at most :data:`MAX_CHARS` of text: a full young one becomes
    the old one, whose parts move back when a body uses them — so the parts of
    conversations going on stay (the encoder process cannot read them again)."""

    MAX_CHARS = 64_000_000  # text of the parts held parsed in one generation

    def __init__(self):
        self.parts: dict[int, tuple[Any, int]] = {}  # blob id → (parsed value, its text's length): young
        self.old: dict[int, tuple[Any, int]] = {}
        self.glue: dict[int, str] = {}    # blob id → text (glue)
        self.raw: dict[int, tuple[str, str]] = {}  # blob id → (kind, text) read, not parsed yet
        self.skeletons: dict[str, Any] = {}
        self.chars = 0

    def learn(self, bid: int, kind: str, text: str) -> None:
        """A stored part: glue kept as text, any other part parsed."""
        if kind == "glue":
            self.glue[bid] = text
        else:
            value = loads(text)
            self.parts[bid] = (Part(value) if type(value) is dict else value, len(text))
            self.chars += len(text)

    def room(self) -> None:
        """Once the young generation holds :data:`MAX_CHARS` of text, it becomes the old one."""
        if self.chars > self.MAX_CHARS:
            self.old, self.parts, self.chars = self.parts, {}, 0
            self.skeletons.clear()

    def _has(self, bid: int) -> bool:
        """Is the part here (moved back to the young generation if the old one had it)?"""
        if bid in self.parts or bid in self.glue:
            return True
        got = self.old.pop(bid, None)
        if got is None:
            return False
        self.parts[bid] = got
        self.chars += got[1]
        return True

    def rows(self, con, by_blobs: np.ndarray, blobs_col, known: dict | None = None) -> "RowBodies":
        """A chunk's bodies stored as parts (``by_blobs``): the parts not here are
        taken from ``known`` (blob id → (kind, text): what ingest handed over)
        or read now, parsed when a body needs them."""
        offsets = blobs_col.offsets.to_numpy().tolist()
        values = blobs_col.values.to_numpy(zero_copy_only=False).tolist()
        rows = [values[offsets[i]:offsets[i + 1]] if on else None for i, on in enumerate(by_blobs.tolist())]
        self.room()
        glue, raw = self.glue, self.raw
        wanted = {b for b in set().union(*[r for r in rows if r]) if b not in raw and not self._has(b)}
        if wanted and known:
            for b in [b for b in wanted if b in known]:
                kind, text = known[b]
                if kind == "glue":
                    glue[b] = text
                else:
                    raw[b] = (kind, text)
                wanted.discard(b)
        if wanted:
            import pyarrow as pa  # (here: the encoder process, which only assembles, starts sooner without it)

            _replay_blob_ids = pa.table({"blob_id": pa.array(  # noqa: F841 - read by DuckDB by name
                np.fromiter(wanted, dtype=np.uint64, count=len(wanted)), pa.uint64())})
            for bid, kind, text in con.execute("SELECT b.blob_id, b.kind, b.text FROM blobs b "
                                               "SEMI JOIN _replay_blob_ids w USING (blob_id)").fetchall():
                if kind == "glue":
                    glue[bid] = text
                else:
                    raw[bid] = (kind, text)
        return RowBodies(self, rows)

    def body(self, blob_ids: list[int]) -> dict | None:
        """The body of these parts, or None when one of them is not here (the
        request is then set aside, or rendered elsewhere)."""
        parts, glue, raw = self.parts, self.glue, self.raw
        for b in blob_ids:
            if not self._has(b):
                if b not in raw:
                    return None
                self.learn(b, *raw.pop(b))
        skel_text = "".join([glue.get(b, "0") for b in blob_ids])
        skel = self.skeletons.get(skel_text)
        if skel is None:
            if len(self.skeletons) >= 10_000:
                self.skeletons.clear()
            skel = self.skeletons[skel_text] = loads(skel_text)
        values = iter([parts[b][0] for b in blob_ids if b not in glue])
        body = {}
        for k, v in skel.items():
            if k == "system":
                body[k] = next(values)
            elif (k == "tools" or k == "messages") and type(v) is list:
                body[k] = [next(values) for _ in v]
            else:
                body[k] = v
        return body


class RowBodies:
    """A chunk's bodies: ``part_ids[i]``, row ``i``'s part ids (None: not stored
    as parts); ``[i]`` its body (assembled when asked for), or None."""

    def __init__(self, bodies: TemplateBodies, part_ids: list):
        self.bodies, self.part_ids = bodies, part_ids

    def __getitem__(self, i: int) -> dict | None:
        ids = self.part_ids[i]
        return None if ids is None else self.bodies.body(ids)
