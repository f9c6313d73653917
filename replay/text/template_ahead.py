"""A chat template's requests rendered ahead, in the encoder process, while ingest runs.

The neutral rendering's encoder process prepares body *parts* while ingest runs
(``replay.text.encoder.Prepared``); a chat template reads a body whole, so
here it is whole *requests*: ingest hands over each request it writes (its id,
time, format and body part ids) with the parts no earlier request brought
(``replay.readers.writer.Writer``), and :class:`RequestsAhead` renders them
with the same template, splitter and content ids as the tokenize stage
(``replay.text.render_template``) and encodes their new texts. The stage then
takes a request's segment ids and parts instead of rendering it
(``tokenize._Run``), after checking that the request it reads has the time,
format and parts that were rendered (a request id is used again when a
file's rows are rolled back).

The stage renders each chunk's rows backward from its last while this process
renders forward, each side marking where it is on a board both map
(``replay.text.ahead_board``): this process skips the requests the stage has
claimed, and once the stage reaches a request started here it takes, in one
ask, what was rendered of the rows before (``tokenize_ahead.AheadRows``); from
then on every request up to the chunk's last is the stage's. The new texts of
the stage's own renders are sent here as it goes and encoded between two
requests (``encode_for_stage``): their tokens come back with that ask. So each
request is rendered once, by whichever side gets to it first, and the rows are
those of rendering in the stage alone. A request that cannot be rendered or
assembled here is simply not offered (the stage renders it, or sets it aside
with the reason).
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
#: texts whose content id is remembered (then all are forgotten)
TEXT_MEMO_ENTRIES = 500_000


class RequestsAhead:
    """Requests rendered and encoded ahead (module docstring); ``engine``
    encodes, ``template``: ``(source, origin, specials)`` of the
    ``ChatTemplate``, ``tokenizer_json``: where its added tokens are."""

    def __init__(self, engine, template: tuple, tokenizer_json: str, board=None):
        self.engine = engine
        self.board = board  # (``replay.text.ahead_board``: the requests the stage renders itself)
        source, origin, specials = template
        self.renderer = render_template.TemplateRenderer(
            render_template.ChatTemplate(source, origin, specials),
            render_template.Splitter.of_file(tokenizer_json))
        render_template.freeze_inputs(True)  # (nothing changes the bodies assembled here)
        self.bodies = TemplateBodies()
        self.requests: dict[int, tuple] = {}  # request id → (ts_us, format, part ids, seg ids, parts)
        self.tokens: dict[int, np.ndarray] = {}
        self.handed: set[int] = set()  # segment ids whose tokens the stage took
        self.text_ids: dict[str, int] = {}
        self.held = 0
        self._unencoded: list[tuple[int, tuple]] = []  # rendered requests whose new texts wait for _encode
        self._texts: dict[int, str] = {}
        self._for_stage: list[int] = []  # segments the stage's own renders brought: their tokens go with the next take
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
            if self.board is not None:
                self.board.start(rid)
                if self.board.claimed(rid):
                    continue
            if rid <= self.asked or self.held >= HELD_SEG_IDS:
                continue
            body = self.bodies.body(bids)
            if body is None:
                continue
            try:
                pieces = self.renderer.render_request(body, fmt, ts_us)
            except Exception:  # noqa: BLE001 - the stage renders it again, and sets it aside with the reason
                continue
            sids = [self._seg_id(text) for _, text, _ in pieces]
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

    def encode_for_stage(self, texts: dict[int, str]) -> None:
        """New texts of the requests the stage renders (segment id → text):
        encoded here, between two requests, while the stage renders on; their
        tokens go with the stage's next :meth:`take`."""
        texts = {sid: t for sid, t in texts.items() if sid not in self.tokens and sid not in self.handed}
        for sid, ids in zip(texts, self.engine.encode(list(texts.values()))):
            self.tokens[sid] = ids
        self._for_stage.extend(texts)

    def _seg_id(self, text: str) -> int:
        sid = self.text_ids.get(text)
        if sid is None:
            if len(self.text_ids) >= TEXT_MEMO_ENTRIES:
                self.text_ids.clear()
            sid = self.text_ids[text] = segids.text_seg_id(text)
        return sid

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
        sids, self._for_stage = sids + self._for_stage, []
        return out, self.take_segments(sids)

    def take_segments(self, seg_ids) -> dict[int, np.ndarray]:
        out = {s: t for s, t in ((s, self.tokens.pop(s, None)) for s in seg_ids) if t is not None}
        self.handed.update(out)
        return out

    def release(self) -> None:
        """The stage is done: what was not taken is dropped."""
        self._unencoded, self._texts, self._for_stage = [], {}, []
        self.requests.clear()
        self.tokens.clear()
        self.held = 0
        render_template.forget_frozen()
        self.bodies = TemplateBodies()

    def describe(self) -> str:
        st = self.stats
        return (f"; {st['rendered']:,} of {st['handed_over']:,} requests rendered ahead, "
                f"{st['taken']:,} of them taken")
