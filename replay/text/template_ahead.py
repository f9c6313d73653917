"""A chat template's requests rendered ahead, in the encoder process, while ingest runs.

A template reads a body whole, so here it is whole requests (the neutral
rendering prepares parts: ``encoder.Prepared``): ingest hands over each request
it writes (id, time, format, part ids) with the parts no earlier one brought
(``readers.writer.Writer``); :class:`RequestsAhead` renders them with the
stage's template, splitter and content ids and encodes their new texts. The
stage takes what was rendered of a chunk's rows in one ask (``tokenize._taken_ahead``):
the chunk is the stage's from then on (skipped here). A request that cannot be
rendered or assembled here is not offered.
"""

from __future__ import annotations

import collections

import numpy as np

from replay.text import render_template, segids
from replay.text.template_bodies import TemplateBodies

#: segment ids of rendered requests held at a time, waiting for the stage (then requests are skipped)
HELD_SEG_IDS = 16_000_000
#: requests whose new texts are encoded together (the engine checks a sample of each call, at least one text)
ENCODE_REQUESTS = 16


class RequestsAhead:
    """Requests rendered and encoded ahead (module docstring); ``engine``
    encodes, ``template``: ``(source, origin, specials)`` of the
    ``ChatTemplate``, ``tokenizer_json``: where its added tokens are."""

    def __init__(self, engine, template: tuple, tokenizer_json: str):
        self.engine = engine
        source, origin, specials = template
        self.renderer = render_template.TemplateRenderer(render_template.ChatTemplate(source, origin, specials),
                                                         tokenizer_json)
        self.bodies = TemplateBodies()
        self.requests: dict[int, tuple] = {}  # request id → (ts_us, format, part ids, seg ids, parts)
        self.tokens: dict[int, np.ndarray] = {}
        self.handed: set[int] = set()  # segment ids whose tokens the stage took
        self.held = 0
        self._unencoded: list[tuple[int, tuple]] = []  # rendered requests whose new texts wait for _encode
        self._texts: dict[int, str] = {}
        self.asked = 0  # the stage has asked for the requests up to this id: it renders them itself
        self.stats = collections.Counter()

    def add(self, blobs: list[tuple[int, str, str]], requests: list[tuple], between=None) -> None:
        """Learn ``blobs`` (id, kind, text); render ``requests`` (id, ts_us,
        format, part ids), one at a time, calling ``between()`` before each
        (where the stage's asks are answered)."""
        self.bodies.room()
        for bid, kind, text in blobs:
            self.bodies.learn(bid, kind, text)
        for rid, ts_us, fmt, bids in requests:
            if between is not None:
                between()
            self.stats["handed_over"] += 1
            if rid <= self.asked or self.held >= HELD_SEG_IDS:
                continue
            body = self.bodies.body(bids)
            if body is None:
                continue
            try:
                pieces = self.renderer.render_request(body, fmt, ts_us)
            except Exception:  # noqa: BLE001 - the stage renders it again, and sets it aside with the reason
                continue
            sids = [segids.text_seg_id(text) for _, text, _ in pieces]
            texts = self._texts
            for (_, text, _), sid in zip(pieces, sids):
                if sid not in self.tokens and sid not in self.handed and sid not in texts:
                    texts[sid] = text
            self._unencoded.append((rid, (ts_us, fmt, tuple(bids), np.array(sids, dtype=np.uint64),
                                          np.array([p[2] for p in pieces], dtype=np.int32))))
            if len(self._unencoded) >= ENCODE_REQUESTS:
                self._encode()
        self._encode()

    def _encode(self) -> None:
        """Encode the rendered requests' new texts: they are ready then."""
        texts = self._texts
        if texts:
            for sid, ids in zip(texts, self.engine.encode(list(texts.values()))):
                self.tokens[sid] = ids
        for rid, got in self._unencoded:
            self.requests[rid] = got
            self.held += len(got[3])
        self.stats["rendered"] += len(self._unencoded)
        self._unencoded, self._texts = [], {}

    def take(self, request_ids: list[int], through: int = 0) -> tuple[dict[int, tuple], dict[int, np.ndarray]]:
        """The rendered requests among ``request_ids`` (handed over once), and
        the tokens of their segments not handed over before; the requests up
        to ``through`` and the largest of the ids are the stage's from now on."""
        self.asked = max(self.asked, through, *request_ids)
        if self._unencoded:
            self._encode()
        out = {}
        for rid in request_ids:
            got = self.requests.pop(rid, None)
            if got is not None:
                out[rid] = got
                self.held -= len(got[3])
        self.stats["taken"] += len(out)
        sids = np.unique(np.concatenate([g[3] for g in out.values()])).tolist() if out else []
        return out, self.take_segments(sids)

    def take_segments(self, seg_ids) -> dict[int, np.ndarray]:
        out = {s: t for s, t in ((s, self.tokens.pop(s, None)) for s in seg_ids) if t is not None}
        self.handed.update(out)
        return out

    def release(self) -> None:
        """The stage is done: what was not taken is dropped."""
        self._unencoded, self._texts = [], {}
        self.requests.clear()
        self.tokens.clear()
        self.held = 0
        self.bodies = TemplateBodies()

    def describe(self) -> str:
        st = self.stats
        return (f"; {st['rendered']:,} of {st['handed_over']:,} requests rendered ahead, "
                f"{st['taken']:,} of them taken")
