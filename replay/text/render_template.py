"""Render a request with a model's own chat template (``--chat-template PATH``).

``PATH`` is a Jinja file, or a local model directory (its
``chat_template.jinja``, else the ``chat_template`` of its
``tokenizer_config.json``). The template is compiled in ``transformers``'
sandboxed environment (the one ``apply_chat_template`` uses:
``replay.text.template_env``) and rendered with what
``apply_chat_template(..., tools=tools, add_generation_prompt=True)``
passes: ``messages`` (``replay.text.template_messages`` maps each format to
that shape, null keys dropped, reasoning aliased as transformers does),
``tools``, ``add_generation_prompt=True`` and the special tokens
(``bos_token``, ``eos_token``, …, from the ``tokenizer_config.json`` beside the
template, else beside the tokenizer). The
request's own time is the template's "now": ``strftime_now(fmt)`` formats the
request's timestamp in UTC (transformers would print the run's local time) and
``date_string`` is the request's day (``"%d %b %Y"``, the variable Llama-3
templates read), so a template that prints the date changes at the requests'
midnight, not at the run's.

Exactness with speed
--------------------
The stored tokens are those of tokenizing the whole rendered text with the
tokenizer (``add_special_tokens=False``, as ``apply_chat_template`` does).
Hugging Face ``tokenizers`` first cuts a text at its added tokens (leftmost
longest) and encodes the text between them independently, so the rendered text
is cut the same way here — at every added token that matches its plain
content (not ``normalized``, no ``lstrip``/``rstrip``/``single_word``) — and
each piece is a content-addressed segment encoded once — a run of added
tokens glued to the piece after it when both lie in one part (``_glued``:
tokenizers cuts there anyway, and every later step works per segment). That
is exact unless the tokenizer's encoding of a piece depends on where it sits
in the whole text: a ``Metaspace`` pre-tokenizer that prefixes
only the text's first word (``prepend_scheme: first``). Such a tokenizer, or one
with no added token to cut at, encodes each request's whole text as one
segment (slower, still exact). A template that puts no added token between
messages gives one piece per request the same way.

A long text with no added token inside (DeepSeek-V3.1 writes the system prompt
and every tool definition in one run) is also cut at line starts the known
pre-tokenizer never joins across (``replay.text.line_cuts``). The tokenize stage
checks the cuts on one request of every chunk (``tokenize.check_cuts``) and stops
with a clear error if a tokenizer breaks them; ``REPLAY_TEMPLATE_WHOLE_TEXT=1``
turns the cutting off.

Parts
-----
Each piece belongs to the part (``prompts.seg_parts``: ``0`` before any
message, ``1`` a top-level system, ``2 + k`` logged message ``k``) of the
message the template was reading when it wrote the piece's first character:
the messages note each read of a field, and the text is collected chunk by
chunk as the template writes it (a tools block written inside the system
message is that message's; the generation prompt the last message's). When
the template read several messages since the last chunk (DeepSeek-V3.1 scans
them all for the system prompt; a template may look at the next message),
the chunk is the message's whose ``content``, ``tool_calls`` or
``reasoning_content`` it read last there, else the first one read there. A
chunk written with no read since the last one belongs to the same message.

Replies (``render_output``) are the neutral rendering's texts without its markers
(``replay.text.render``): a template describes prompts, not what a model writes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from replay.text import template_env
from replay.text.render import Piece, render_output
from replay.text.template_messages import Written, template_messages
from replay.text.splitter import WHOLE_TEXT_ENV, Splitter  # noqa: F401 - WHOLE_TEXT_ENV: named here too

#: bumped whenever the mapping of bodies or the rendering changes what a template sees
MAPPING_VERSION = "1"
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# a loop over a message's content: the template reads content blocks (vLLM's "openai" content format)
_LOOPS_CONTENT = re.compile(r"\{%-?\s*for\s+\w+\s+in\s+[^%]*content[^%]*%\}")


class TemplateError(ValueError):
    """A chat template that cannot be read or compiled (what to do is in the message)."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(config: Path) -> dict[str, str] | None:
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    out = {k: t for k in _SPECIAL_KEYS if (t := _token_text(cfg.get(k))) is not None}
    extra = cfg.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t for t in map(_token_text, extra) if t is not None]
    return out


def _template_of_config(config: Path) -> str | None:
    try:
        tpl = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(tpl, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) else None


@dataclass
class ChatTemplate:
    """A chat template's source, where it came from, and its special tokens."""
    source: str
    origin: str
    specials: dict = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """Names the rendering (``Tok.name`` ends ``+template=DIGEST``): the
        template's text, its special tokens and :data:`MAPPING_VERSION`."""
        h = hashlib.sha256(self.source.encode("utf-8"))
        h.update(json.dumps(self.specials, sort_keys=True).encode("utf-8"))
        h.update(MAPPING_VERSION.encode())
        return h.hexdigest()[:12]

    @functools.cached_property
    def compiled(self):
        """The template compiled (:func:`compile_template`), once per object."""
        return compile_template(self.source)

    @functools.cached_property
    def alias(self):
        """How transformers aliases a message's reasoning (``template_env``), looked up once per object."""
        return template_env.reasoning_alias()

    @property
    def reads_blocks(self) -> bool:
        """Does the template loop over a message's content (content as blocks)?"""
        return bool(_LOOPS_CONTENT.search(self.source))

    def with_default_specials(self, specials: dict | None) -> "ChatTemplate":
        """This template, given ``specials`` when it has none of its own."""
        if self.specials or not specials:
            return self
        return ChatTemplate(self.source, self.origin, dict(specials))


def load_template(path: str | Path) -> ChatTemplate:
    """The template at ``path`` (a Jinja file or a model directory)."""
    p = Path(path)
    if p.is_dir():
        jinja, config = p / "chat_template.jinja", p / "tokenizer_config.json"
        source = jinja.read_text(encoding="utf-8") if jinja.is_file() else (
            _template_of_config(config) if config.is_file() else None)
        if source is None:
            raise TemplateError(f"no chat template in {p} (neither chat_template.jinja nor a chat_template "
                                "in tokenizer_config.json); pass the template file itself")
    elif p.is_file():
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read the chat template {p}: {exc}") from None
        source = _template_of_config(p) if p.suffix == ".json" else text
        if source is None:
            raise TemplateError(f"{p} holds no chat_template")
        config = p.parent / "tokenizer_config.json"
    else:
        raise TemplateError(f"no chat template at {p}: give a .jinja file or a model directory")
    specials = (_special_tokens(config) if config.is_file() else None) or {}
    tpl = ChatTemplate(source, str(p), specials)
    check_syntax(tpl.source)  # a template that does not compile is refused here, not per request
    return tpl


def specials_for_tokenizer(tokenizer_json: str | Path) -> dict:
    """The special tokens a tokenizer's directory names in its
    ``tokenizer_config.json`` (for a template file that comes without them;
    the default tokenizer's package ships one)."""
    config = Path(tokenizer_json).parent / "tokenizer_config.json"
    return (_special_tokens(config) if config.is_file() else None) or {}


def check_syntax(source: str) -> None:
    """Raise :class:`TemplateError` when ``source`` does not compile in
    transformers' environment (``template_env``'s copy of it: whatever the
    installed transformers, its syntax is that one's)."""
    try:
        template_env.copied_environment().from_string(source)
    except ImportError as exc:  # (too old a jinja2)
        raise TemplateError(f"--chat-template: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - jinja's TemplateSyntaxError and friends
        raise TemplateError(f"the chat template does not compile: {type(exc).__name__}: {exc}") from None


def compile_template(source: str):
    """``source`` compiled in transformers' environment (``template_env``),
    its attribute lookup taking the common cases first (:func:`_plain_lookup`)
    and the JSON of what a body part maps to written once
    (``template_messages.Written``)."""
    try:
        base = template_env.environment()
    except ImportError as exc:  # pragma: no cover - transformers is a dependency
        raise TemplateError(f"--chat-template needs transformers ({exc})") from None
    env = base.overlay()
    env.globals = dict(base.globals)
    quick = _plain_lookup(base, template_env.uses_copy())
    if quick is not None:  # (``Written.json`` is then out of the templates' sight)
        env.getattr, env.globals["namespace"] = quick
        env.filters = dict(base.filters)
        tojson = base.filters["tojson"]

        def tojson_(x, *args, **kwargs):
            if type(x) is not Written or args or kwargs:
                return tojson(x, *args, **kwargs)
            if x._json is None:
                x._json = tojson(x)
            return x._json

        env.filters["tojson"] = tojson_
    try:
        return env.from_string(source)
    except Exception as exc:  # noqa: BLE001 - jinja's TemplateSyntaxError and friends
        raise TemplateError(f"the chat template does not compile: {type(exc).__name__}: {exc}") from None


def _plain_lookup(env, copied: bool):
    """``(getattr, namespace)``: ``env.getattr`` (the sandbox's lookup of
    ``x.name``) with two cases first that give what it gives: a plain dict (or
    tracked message, or ``Written``: its ``_json`` is not the templates') has
    no attribute but its type's, so ``d.name`` is ``d["name"]`` for any other
    name, else undefined; a namespace's plain value under a name without an
    underscore is returned (the sandbox's checks pass it). The namespace is
    :func:`_namespace`'s for ``template_env``'s copy (``copied``). None for an
    environment whose lookup is not the sandbox's own."""
    from jinja2.sandbox import SandboxedEnvironment

    sandbox = env.getattr
    if getattr(type(env), "getattr", None) is not SandboxedEnvironment.getattr:
        return None
    undefined = env.undefined
    namespace = env.globals.get("namespace")
    values = None
    if copied and namespace is not None:
        namespace, values = _namespace(namespace)
    own = {dict: frozenset(dir(dict)), _Tracked: frozenset(dir(_Tracked)), Written: frozenset(dir(dict))}
    plain = (str, int, bool, float, type(None), list, dict, tuple)

    def getattr_(obj, attribute):
        names = own.get(type(obj))
        if names is not None:
            if attribute not in names:
                try:
                    return obj[attribute]
                except KeyError:
                    return undefined(obj=obj, name=attribute)
        elif type(obj) is namespace and attribute[:1] != "_":
            try:
                value = values(obj)[attribute] if values is not None else getattr(obj, attribute)
            except (KeyError, AttributeError):
                return undefined(obj=obj, name=attribute)
            if type(value) in plain:
                return value
        return sandbox(obj, attribute)

    return getattr_, namespace


def _namespace(copied):
    """``(class, values of an instance)``: transformers' namespace (``copied``)
    keeping its values in a slot (one call a store or read, not four): the same
    values, repr, refusal of underscore names, and no attribute but them."""
    check, slot = copied._check_name, None

    class TemplateNamespace(copied):
        __slots__ = ("_values",)

        def __init__(*args, **kwargs):  # (jinja's signature: ``namespace(self=...)`` works)
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                check(name)
            slot.__set__(self, attrs)

        def __getattribute__(self, name):
            if name == "__class__":
                return object.__getattribute__(self, name)
            try:
                return slot.__get__(self)[name]
            except KeyError:
                raise AttributeError(name) from None

        def __setitem__(self, name, value):
            if isinstance(name, str) and name.startswith("_"):
                check(name)
            slot.__get__(self)[name] = value

        def __repr__(self):
            return f"<Namespace {slot.__get__(self)!r}>"

    slot = TemplateNamespace.__dict__["_values"]
    return TemplateNamespace, slot.__get__


def template_now(ts_us: int | None) -> dict:
    """The template variables that print the request's time: ``strftime_now``
    and ``date_string`` (a relative or missing timestamp: the epoch's)."""
    when = datetime.fromtimestamp((ts_us or 0) / 1e6, tz=timezone.utc)
    return {"strftime_now": when.strftime, "date_string": when.strftime("%d %b %Y")}


#: fields holding what a message says: the one of these read last in a scan names the chunk's message
_CONTENT_KEYS = frozenset(("content", "tool_calls", "reasoning_content"))


class _Tracked(dict):
    """A message that notes its reads in the window ``w`` shared by all
    messages: ``[last read, first read, last content-like read, several read]``
    (indices; ``render_chunks`` opens a new window at each written chunk)."""
    __slots__ = ("_index", "_w")

    def __getitem__(self, key):
        w, i = self._w, self._index
        w[0] = i
        if w[1] is None:
            w[1] = i
        elif w[1] != i:
            w[3] = True
        if key in _CONTENT_KEYS:
            w[2] = i
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default


def render_chunks(tpl: ChatTemplate, body: dict, fmt: str | None, ts_us: int | None
                  ) -> tuple[list[tuple[str, int]], list[int]]:
    """The rendered text as ``(chunk, message index)`` in order (index ``-1``:
    written before the template read any message), and each template
    message's part (``template_messages``)."""
    messages, tools, origin = template_messages(body, fmt, tpl.reads_blocks)
    return render_messages(tpl, messages, tools, ts_us), origin


def render_messages(tpl: ChatTemplate, messages: list[dict], tools: list | None, ts_us: int | None,
                    add_generation_prompt: bool = True) -> list[tuple[str, int]]:
    """:func:`render_chunks` of messages already in the template's shape."""
    w = [None, None, None, False]  # the reads since the last chunk written (``_Tracked``)
    tracked = []
    for j, m in enumerate(tpl.alias(messages)):
        t = _Tracked(m)
        t._index, t._w = j, w
        tracked.append(t)
    variables = {**tpl.specials, **template_now(ts_us)}
    gen = tpl.compiled.generate(messages=tracked, tools=tools, documents=None,
                                              add_generation_prompt=add_generation_prompt, **variables)
    chunks = []
    cur = -1
    for c in gen:
        if c:
            if w[1] is not None:  # (no read since the last chunk: the same message goes on)
                cur = (w[2] if w[2] is not None else w[1]) if w[3] else w[0]
                w[1] = w[2] = None
                w[3] = False
            chunks.append((c, cur))
    return chunks


def render_text(tpl: ChatTemplate, body: dict, fmt: str | None, ts_us: int | None) -> str:
    """The whole rendered prompt."""
    return "".join(c for c, _ in render_chunks(tpl, body, fmt, ts_us)[0])


def output_pieces(output: Any, fmt: str = "anthropic") -> list[Piece]:
    """A reply's pieces: the neutral rendering's texts (and images) without its
    markers — the tokenizer as shipped may not have them."""
    return [p for p in render_output(output, fmt) if p[0] != "marker"]


def pieces_of(splitter: Splitter, chunks: list[tuple[str, int]], origin: list[int]) -> list[Piece]:
    """The pieces (``("text", str, part)``) of rendered chunks: the text cut by
    ``splitter``, each piece in the part of the chunk it starts in."""
    text = "".join([c for c, _ in chunks])
    # the runs of chunks of one part: (start, part)
    starts, parts, pos, last = [], [], 0, None
    for c, j in chunks:
        part = origin[j] if j >= 0 else 0
        if part != last:
            starts.append(pos)
            parts.append(part)
            last = part
        pos += len(c)
    got = splitter.pieces(text)
    at, pieces = [s for s, _ in got], [p for _, p in got]
    if len(parts) <= 1:
        of = [parts[0] if parts else 0] * len(pieces)
    else:
        of = np.asarray(parts)[np.searchsorted(np.asarray(starts), np.asarray(at), "right") - 1].tolist()
    return _glued(pieces, of, splitter.cut_at)


def _glued(pieces: list[str], of: list[int], cut_at: set) -> list[Piece]:
    """The pieces as ``("text", str, part)``, each run of added tokens glued to
    the piece after it when all are in one part: ``tokenizers`` cuts at an
    added token anyway, so the glued text's ids are the token's, then the
    rest's — the same ids in fewer segments."""
    out = []
    n, i = len(pieces), 0
    while i < n:
        p, part = pieces[i], of[i]
        j = i + 1
        if p in cut_at:
            while j < n and of[j] == part and pieces[j] in cut_at:
                j += 1
            if j < n and of[j] == part:
                j += 1
        out.append(("text", "".join(pieces[i:j]) if j - i > 1 else p, part))
        i = j
    return out


class TemplateRenderer:
    """``render_request(body, fmt, ts_us)`` → pieces, for one template and
    tokenizer: the one object that holds what rendering remembers (the
    compiled template, and the splitter's line runs: ``Splitter``)."""

    def __init__(self, tpl: ChatTemplate, tokenizer_json: str | Path):
        self.template, self.splitter = tpl, Splitter.of_file(tokenizer_json)

    def render_request(self, body: dict, fmt: str = "anthropic", ts_us: int | None = None) -> list[Piece]:
        return pieces_of(self.splitter, *render_chunks(self.template, body, fmt, ts_us))

    def render_output(self, output: Any, fmt: str = "anthropic") -> list[Piece]:
        return output_pieces(output, fmt)
