"""The encoder process: an :class:`Engine` in a helper process, working beside ingest.

In a child process (``python -P -m replay.text.encoder``, this copy of the
package) loading the tokenizers costs the caller nothing, and ``warm()`` hands
it the body parts ingest has just stored (blob id, kind, JSON text), which it
renders and encodes on the other core while ingest goes on (:class:`Prepared`):
the tokenize stage takes each part's segment ids and new tokens from it. Both
processes render with ``render.render_part`` and ``segids``: the same rows.
With a chat template it is whole requests instead (``warm_requests``,
``replay.text.template_ahead``), rendered while ingest runs and taken by the
tokenize stage a chunk at a time.

The two processes exchange the typed messages of ``replay.text.child`` (the
parent sends an ``Ask``; the child answers those marked "→" in order, after a
``Ready`` or ``Failed`` once first).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import socket
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
import numpy as np

from replay.store.jsontext import loads
from replay.text import child, segids, template_ahead
from replay.text.child import (_HINTS, Ahead, Answer, Ask, Blobs, Describe, Encode, Failed, Part, Ready, Release,
                               Requests, TakeBlobs, TakeRequests, TakeSegments, Template, Text, Tokens, Warm,
                               _Message, _pack, _tokens, _unpack, _Wire, text_of, wire_text)
from replay.text.engine import Engine, _has_fastokens, start_fastokens
from replay.text.render import render_part
from replay.text.tokenizer_json import load_reference, prepare_tokenizer

# Tokens of body parts prepared ahead, waiting for the tokenize stage (past it, the
# stage renders and encodes the rest itself): enough for a week of the bench's traffic.
PREPARED_TOKENS = 128_000_000
WARM_BACKLOG_CHARS = 64_000_000    # body parts waiting to be warmed; more are dropped (they are only hints)
STASH_CHARS = 64_000_000  # text of parts rendered while fastokens is built; more waits for the build
WARM_SEND_CHARS = 6 * PREPARED_TOKENS  # body-part text sent in all (text runs ~3-4 characters a token)

class EncoderProcess:
    """An :class:`Engine` in a child process (module docstring).

    ``path``: the tokenizer.json. Construction returns at once; the
    first call that needs the child's answer waits for it to be ready.
    Raises ``EncoderGone`` when the child is not there (the caller falls back).
    """

    def __init__(self, path: str | Path, backend: str, add_markers: bool = True, template: tuple | None = None):
        mine, theirs = socket.socketpair()
        try:
            self._proc = child.spawn("replay.text.encoder", str(theirs.fileno()), str(path), backend,
                                     "1" if add_markers else "0",
                                     pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self._wire = _Wire(Connection(mine.detach()), Answer)
        self._lock = threading.Lock()
        self._info: dict | None = None
        self._warm_sent = 0
        self._ahead_sent = 0
        self._closed = False
        # Messages go out through one sender thread, in order: a write blocks while the
        # child cannot read (while it loads), which ingest handing over parts must not wait for.
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._gone = False
        self._sender = threading.Thread(target=self._send_loop, daemon=True, name="replay-encoder-sender")
        self._sender.start()
        if template is not None:  # (source, origin, specials): requests are rendered ahead with it
            self._send(Template(*template))

    def info(self) -> dict:
        """vocab_size, marker_ids, markers_added (waits for the child to be ready)."""
        if self._info is None:
            with self._lock:
                if self._info is None:
                    self._info = self._reply(Ready).info
        return self._info

    def _reply(self, kind):
        try:
            msg = self._wire.recv()
        except (EOFError, OSError, msgspec.DecodeError):
            raise EncoderGone("the encoder process ended") from None
        if isinstance(msg, Failed):
            raise (TokenizerUnusable if msg.message.startswith((LOAD_FAILED, ENCODE_FAILED)) else RuntimeError)(
                msg.message)
        if not isinstance(msg, kind):
            raise EncoderGone(f"the encoder process answered {type(msg).__name__}, not {kind.__name__}")
        return msg

    def _send_loop(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is None:
                return
            if self._gone or (self._closed and isinstance(msg, _HINTS)):
                continue  # nobody to send to, or only hints nobody will take
            try:
                self._wire.send(msg)
            except Exception:  # noqa: BLE001 - a broken connection, or a message that cannot be sent
                self._gone = True
                self._wire.conn.close()  # a caller waiting for an answer gets EOF: EncoderGone

    def _send(self, msg: _Message) -> None:
        if self._gone:
            raise EncoderGone("the encoder process ended")
        self._outbox.put(msg)

    def _ask(self, msg: _Message, kind):
        self.info()
        with self._lock:
            self._send(msg)
            return self._reply(kind)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        got = self._ask(Encode([wire_text(t) for t in texts]), Tokens)
        return _unpack(got.flat, got.lengths)

    def warm(self, parts: list[Part]) -> None:
        """Hand over (blob id, kind, JSON text: str, or its UTF-8 bytes) body parts to prepare ahead; no answer.
        Past ``WARM_SEND_CHARS`` in all, parts are no longer sent: the helper could
        not keep them (``PREPARED_TOKENS``), and sending costs this process time."""
        size = sum(len(t) for _, _, t in parts)
        if self._warm_sent + size > WARM_SEND_CHARS:
            return
        self._warm_sent += size
        self._send(Warm([(b, k, t if isinstance(t, bytes) else wire_text(t)) for b, k, t in parts]))

    def warm_requests(self, blobs: list[Part], requests: list[tuple]) -> None:
        """Hand over requests (id, ts_us, format, part ids) to render ahead with
        the template, with the parts (id, kind, text) no earlier request brought;
        no answer (``replay.text.template_ahead``). Past ``WARM_SEND_CHARS`` of
        parts in all, nothing more is sent."""
        size = sum(len(t) for _, _, t in blobs)
        if self._ahead_sent + size > WARM_SEND_CHARS:
            return
        self._ahead_sent += size
        self._send(Ahead([(b, k, wire_text(t)) for b, k, t in blobs],
                         [(r, ts, fmt, list(b)) for r, ts, fmt, b in requests]))

    def take_requests(self, request_ids: list[int], through: int) -> tuple[dict[int, tuple], dict]:
        """The requests among ``request_ids`` rendered ahead: id → (ts_us, format,
        part ids, segment ids, parts), and seg id → tokens of their segments not
        handed over before; the rest, and every request up to ``through``, are
        the caller's to render."""
        got = self._ask(TakeRequests(request_ids, through), Requests)
        segs, parts = _unpack(got.seg_ids, got.lengths, "<u8"), _unpack(got.parts, got.lengths)
        return ({rid: (*r, s, p) for rid, r, s, p in zip(got.ids, got.rest, segs, parts)},
                dict(zip(got.tokens.ids, _unpack(got.tokens.flat, got.tokens.lengths))))

    def take_blobs_flat(self, blob_ids: list[int]) -> PreparedBlobs:
        """The prepared parts among ``blob_ids``, as flat arrays (no array per part:
        the tokenize stage adds them to its pools as they are)."""
        got = self._ask(TakeBlobs(blob_ids), Blobs)
        return PreparedBlobs(got.ids, got.kinds, np.frombuffer(got.seg_ids, dtype="<u8").astype(np.uint64),
                             np.frombuffer(got.lengths, dtype="<i8").astype(np.int64),
                             np.frombuffer(got.parts, dtype="<i4").astype(np.int32))

    def take_segments(self, seg_ids: list[int]) -> dict:
        """seg id → tokens (int32) of the prepared ones among ``seg_ids``."""
        got = self._ask(TakeSegments(seg_ids), Tokens)
        return dict(zip(got.ids, _unpack(got.flat, got.lengths)))

    def release(self) -> None:
        """The tokenize stage is done with what was prepared (no answer)."""
        self._send(Release())

    def describe(self) -> str:
        return self._ask(Describe(), Text).text

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._outbox.put(None)  # pending warm parts are dropped; a message being written finishes
            self._sender.join(timeout=5)
            self._wire.conn.close()  # the child reads its end of input, and leaves
            child.stop(self._proc)

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


@dataclasses.dataclass
class PreparedBlobs:
    """Prepared body parts, flat: part ``i`` (blob ``ids[i]``, ``kinds[i]``) has the
    next ``lengths[i]`` of ``seg_ids`` and of ``parts`` (each segment's part)."""
    ids: list[int]
    kinds: list[str]
    seg_ids: np.ndarray   # uint64
    lengths: np.ndarray   # int64, one per part
    parts: np.ndarray     # int32, one per segment

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def empty(cls) -> "PreparedBlobs":
        return cls([], [], np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int32))

    @classmethod
    def joined(cls, parts: dict, more: "PreparedBlobs") -> "PreparedBlobs":
        """``parts`` (blob id → (kind, segment ids, parts), as ``Prepared`` keeps
        them) followed by ``more``."""
        ids, values = list(parts), list(parts.values())
        return cls(ids + more.ids, [v[0] for v in values] + more.kinds,
                   np.concatenate([np.asarray(v[1], np.uint64) for v in values] + [more.seg_ids]),
                   np.concatenate([np.array([len(v[1]) for v in values], np.int64), more.lengths]),
                   np.concatenate([np.asarray(v[2], np.int32) for v in values] + [more.parts]))


class EncoderGone(RuntimeError):
    pass


class TokenizerUnusable(Exception):
    """The tokenizer given cannot be loaded (not a tokenizer.json, damaged) or
    cannot encode (a vocabulary without an unknown token, say): a bad argument,
    not a failed stage."""


LOAD_FAILED = "cannot load the tokenizer"
ENCODE_FAILED = "the tokenizer cannot encode these prompts"


class Prepared:
    """Body parts rendered and encoded ahead, kept until the tokenize stage takes them.

    ``add`` renders (blob id, kind, JSON text) parts, computes their segment ids
    and encodes their new texts; ``take_blobs`` gives (and forgets) a part's
    (kind, segment ids, segment parts); ``take_segments`` the tokens of
    segments. A part is only offered when every one of its segments' tokens is
    here or was handed over already. At most ``PREPARED_TOKENS`` wait at a time.
    """

    def __init__(self, engine: Engine, info: dict):
        self.engine = engine
        self.marker_ids = info["marker_ids"]
        self.vocab_size = info["vocab_size"]
        self.blobs: dict[int, tuple[str, np.ndarray, np.ndarray]] = {}
        self.tokens: dict[int, np.ndarray] = {}
        self.handed: set[int] = set()  # segment ids whose tokens the caller took
        self.waiting_tokens = 0
        self.texts: dict[int, str] = {}  # segment id → text of the parts rendered, not encoded yet
        self.text_chars = 0
        self.rendered: list = []  # (blob id, kind, segment ids, parts) of those parts
        self.stats = collections.Counter()

    def add(self, parts: list[tuple[int, str, str]]) -> None:
        if self.waiting_tokens >= PREPARED_TOKENS:
            self.stats["parts_dropped"] += len(parts)
            return
        texts = self.texts
        for bid, kind, text in parts:
            try:
                pieces = render_part(kind, loads(text))
            except Exception:  # noqa: BLE001 - left to the tokenize stage, which reports it
                continue
            sids = [segids.piece_seg_id(p) for p in pieces]
            for p, sid in zip(pieces, sids):
                if sid in self.tokens or sid in self.handed or sid in texts:
                    continue
                if p[0] == "text":
                    texts[sid] = p[1]
                    self.text_chars += len(p[1])
                elif p[0] == "marker":
                    self.tokens[sid] = np.array([self.marker_ids[p[1]]], dtype=np.int32)
                else:
                    self.tokens[sid] = segids.image_tokens(p[1][0], p[1][1], self.vocab_size)
            self.rendered.append((bid, kind, np.array(sids, dtype=np.uint64),
                                  np.array([p[2] for p in pieces], dtype=np.int32)))
        # While fastokens is being built, parts are only rendered (beside the
        # build's thread): their texts wait for it, not for the reference
        if not self.engine.building() or self.text_chars >= STASH_CHARS:
            self.finish()

    def finish(self) -> None:
        """Encode the texts of the parts rendered so far; offer those parts."""
        texts = self.texts
        for sid, ids in zip(texts, self.engine.encode(list(texts.values())) if texts else ()):
            self.tokens[sid] = ids
            self.waiting_tokens += len(ids)
        for bid, kind, sids, prt in self.rendered:
            self.blobs[bid] = (kind, sids, prt)
        self.stats["parts"] += len(self.rendered)
        self.texts, self.text_chars, self.rendered = {}, 0, []

    def take_blobs(self, blob_ids) -> dict:
        self.finish()
        out = _take(self.blobs, blob_ids)
        self.stats["parts_taken"] += len(out)
        return out

    def take_segments(self, seg_ids) -> dict:
        self.finish()
        out = _take(self.tokens, seg_ids)
        self.handed.update(out)
        self.waiting_tokens -= sum(map(len, out.values()))
        return out


def _take(store: dict, keys) -> dict:
    """The entries of ``keys`` that ``store`` holds, removed from it."""
    return {k: v for k, v in ((k, store.pop(k, None)) for k in keys) if v is not None}


class _Inbox:
    """The child's order of work (not thread-safe: the caller holds a lock).

    Hints (warm parts, requests ahead) are handled in arrival order. An ask the
    parent waits for goes ahead of them, except a :class:`TakeBlobs` naming
    parts still queued (or being prepared): it waits until those are done, so
    the tokenize stage works on its first chunk while the helper prepares the
    later ones.
    """

    def __init__(self, backlog_chars: int | None = None):
        self.backlog_chars = WARM_BACKLOG_CHARS if backlog_chars is None else backlog_chars
        self.warm: collections.deque = collections.deque()
        self.asks: collections.deque = collections.deque()  # answered in arrival order
        self.pending: set[int] = set()  # blob ids of queued or in-progress warm parts
        self.warm_chars = 0
        self.eof = False

    def put(self, msg: _Message | None) -> None:
        """A message from the parent (None: its end of input)."""
        if msg is None:
            self.eof = True
        elif isinstance(msg, _HINTS):
            size = sum(len(t) for _, _, t in msg.parts)
            if self.warm_chars + size <= self.backlog_chars:  # else dropped: only a hint
                self.warm.append(msg)
                if isinstance(msg, Warm):
                    self.pending.update(bid for bid, _, _ in msg.parts)
                self.warm_chars += size
        else:
            self.asks.append(msg)

    def ready(self) -> bool:
        """The first ask may be answered now."""
        return bool(self.asks) and not (isinstance(self.asks[0], TakeBlobs)
                                        and any(b in self.pending for b in self.asks[0].ids))

    def next(self) -> _Message | None:
        """The message to handle now, or None (nothing to do yet, or end of input)."""
        if self.ready():
            return self.asks.popleft()
        if self.eof:
            return None
        return self.warm.popleft() if self.warm else None

    def waiting(self) -> bool:
        """The parent waits for an answer."""
        return bool(self.asks)

    def done(self, msg: _Message) -> None:
        """A hint has been handled."""
        if isinstance(msg, Warm):
            self.pending.difference_update(bid for bid, _, _ in msg.parts)
        self.warm_chars -= sum(len(t) for _, _, t in msg.parts)


def _give_back_memory() -> None:
    """Return freed heap memory to the system: after the tokenize stage took (and
    this process freed) what it had prepared, glibc would keep those pages."""
    import ctypes

    try:
        # this process's own symbols (libc's among them), not ctypes.util.find_library: its
        # `ldconfig -p` in a forked child shows for a moment this whole process's memory as its own
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _load_engine(path: str, backend: str, add_markers: bool = True, fast=None) -> tuple[Engine, dict]:
    """The engine, and the tokenizer's info (vocab_size, marker_ids, markers_added);
    ``fast``: fastokens' build, started already."""
    tk = load_reference(path)
    info = prepare_tokenizer(tk, path, add_markers)
    return Engine(tk, source=path, backend=backend, add_markers=add_markers, fast=fast), info


def _early(wire: _Wire) -> list:
    """The messages already waiting, up to the first hint. A parent that made
    its tokenizer just before ingesting has handed over body parts by the time
    this process has imported its modules: fastokens' build (about a second)
    then starts beside the reference's load, not after it."""
    got = []
    try:
        while wire.conn.poll(0):
            got.append(wire.recv())
            if isinstance(got[-1], _HINTS):
                break
    except (EOFError, OSError):  # the parent left: the reader thread finds it so and leaves
        pass
    return got


class _Child:
    """The child's side: answers the parent's messages, one at a time, in the
    order :class:`_Inbox` gives them."""

    def __init__(self, engine: Engine, info: dict, wire: _Wire, path: str = ""):
        self.engine = engine
        self.prepared = Prepared(engine, info)
        self.ahead: template_ahead.RequestsAhead | None = None
        self.path = path
        self.wire = wire
        self.between = None  # answers the parent's asks between two requests rendered ahead (``_serve``)

    def handle(self, msg: _Message, waiting: bool) -> None:
        """Do what ``msg`` asks; ``waiting``: the parent waits for an answer now."""
        if isinstance(msg, _HINTS):
            self.engine.expect_work()  # (ingest goes on: enough text will come for fastokens to pay)
        if isinstance(msg, Warm):
            # beside the parent's ingest: one thread; if the parent already waits, both cores
            os.environ["TOKENIZERS_PARALLELISM"] = "true" if waiting else "false"
            self.prepared.add([(b, k, text_of(t)) for b, k, t in msg.parts])  # found by ingest: render, encode
        elif isinstance(msg, Ahead):
            if self.ahead is not None:
                os.environ["TOKENIZERS_PARALLELISM"] = "false"
                self.ahead.add([(b, k, text_of(t)) for b, k, t in msg.parts], msg.requests, self.between)
        elif isinstance(msg, Template):
            try:
                self.ahead = template_ahead.RequestsAhead(self.engine, (msg.source, msg.origin, msg.specials),
                                                          self.path)
            except Exception as exc:  # noqa: BLE001 - the stage renders every request itself
                print(f"tokenize: the encoder process cannot render ahead ({type(exc).__name__}: {exc})",
                      file=sys.stderr)
        elif isinstance(msg, TakeRequests):
            self._answer(lambda: self._requests(msg))
        elif isinstance(msg, Encode):
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
            self._answer(lambda: Tokens(*_pack(self.engine.encode([text_of(t) for t in msg.texts]))), ENCODE_FAILED)
        elif isinstance(msg, TakeBlobs):
            got = self.prepared.take_blobs(msg.ids)
            kinds, segs, parts = zip(*got.values()) if got else ((), (), ())
            self._answer(lambda: Blobs(list(got), list(kinds), *_pack(list(segs), "<u8"), _pack(list(parts))[0]))
        elif isinstance(msg, TakeSegments):
            got = self.prepared.take_segments(msg.ids)
            if self.ahead is not None:
                got.update(self.ahead.take_segments([s for s in msg.ids if s not in got]))
            self._answer(lambda: _tokens(got))
        elif isinstance(msg, Release):
            self._release()
        elif isinstance(msg, Describe):
            self._answer(lambda: Text(self._describe()))

    def _requests(self, msg: TakeRequests) -> Requests:
        got, tokens = self.ahead.take(msg.ids, msg.through) if self.ahead is not None else ({}, {})
        segs, lengths = _pack([v[3] for v in got.values()], "<u8")
        return Requests(list(got), [v[:3] for v in got.values()], segs, lengths,
                        _pack([v[4] for v in got.values()])[0], _tokens(tokens))

    def _answer(self, answer, failing: str = "failed") -> None:
        try:
            reply = answer()
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            reply = Failed(f"{failing}: {type(exc).__name__}: {exc}")
        self.wire.send(reply)

    def _release(self) -> None:
        # this process lives on beside the replay: it gives back what the stage no longer needs
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        if self.ahead is not None:
            self.ahead.release()
        self.engine.release()
        _give_back_memory()

    def _describe(self) -> str:
        st = self.prepared.stats
        ahead = (f"; {st['parts_taken']:,} of {st['parts']:,} body parts prepared while ingesting"
                 + (f" ({st['parts_dropped']:,} over the limit)" if st["parts_dropped"] else "")
                 if st["parts"] or st["parts_dropped"] else "")
        return self.engine.describe() + ahead + (self.ahead.describe() if self.ahead is not None else "")


def _serve(fd: int, path: str, backend: str, add_markers: bool = True) -> None:
    """The child: the protocol on the connection ``fd``; anything printed goes to stderr."""
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # Beside the parent's ingest one encoder thread and a lower priority leave it its
    # core; an ask the parent waits for gets both (TOKENIZERS_PARALLELISM, read per call).
    try:
        os.nice(5)
    except OSError:  # pragma: no cover
        pass
    wire = _Wire(Connection(fd), Ask)
    early = _early(wire)
    fast = None
    if backend != "tokenizers" and any(isinstance(m, _HINTS) for m in early) and _has_fastokens():
        fast = start_fastokens(path, add_markers=add_markers)  # (work is coming: it pays)
    try:
        engine, info = _load_engine(path, backend, add_markers, fast)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        wire.send(Failed(f"{LOAD_FAILED} {path}: {type(exc).__name__}: {exc}"))
        return
    wire.send(Ready(info))
    worker = _Child(engine, info, wire, path)
    cond = threading.Condition()
    inbox = _Inbox()
    for msg in early:
        inbox.put(msg)

    def reader() -> None:  # reads promptly, so the parent never waits on a full buffer
        while True:
            try:
                msg = wire.recv()
            except (EOFError, OSError):
                # The parent closed its end, or died: nobody will read another answer,
                # so leave now, not after the work in hand (a helper must not outlive its command).
                sys.stderr.flush()
                os._exit(0)
            with cond:
                inbox.put(msg)
                cond.notify()

    def between() -> None:
        """Between two requests rendered ahead: the parent's asks are answered
        now, not after the work in hand (but an ask for body parts, which may
        wait for parts queued: ``_Inbox.ready``)."""
        while True:
            with cond:
                if not inbox.ready():
                    return
                msg = inbox.asks.popleft()
            worker.handle(msg, True)

    worker.between = between
    # an ask waits for the reader thread to get the interpreter lock from the rendering: sooner
    sys.setswitchinterval(0.0005)
    threading.Thread(target=reader, daemon=True, name="replay-encoder-reader").start()
    while True:
        with cond:
            while (msg := inbox.next()) is None:
                cond.wait()
            waiting = inbox.waiting()
        try:
            worker.handle(msg, waiting)
        finally:
            if isinstance(msg, _HINTS):
                with cond:
                    inbox.done(msg)


if __name__ == "__main__":
    try:
        _serve(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:5] != ["0"])
    except (BrokenPipeError, ConnectionResetError):  # the parent left before an answer: nobody to tell
        os._exit(0)
