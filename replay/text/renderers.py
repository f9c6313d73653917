"""Which rendering turns a body into pieces: the neutral template or DeepSeek's encoding.

The rendering is part of the tokenization's identity: a ``Tok`` carries it and
its ``name`` (``meta['tokenizer']``, which the walks' fingerprint names too)
ends with ``+render=NAME`` for any rendering but the neutral one, so
``neutral`` keeps the names, and the tokens, of before, and switching the
rendering re-tokenizes and replays (``replay.prepare``).
"""

from __future__ import annotations

from typing import Callable

from replay.text import render, render_deepseek

NEUTRAL = "neutral"
DEEPSEEK = render_deepseek.NAME
#: every rendering ``--render`` accepts, the default first
RENDERS: tuple[str, ...] = (NEUTRAL, DEEPSEEK)
_SUFFIX = "+render="
#: a chat template's rendering (``--chat-template``, ``replay.text.render_template``):
#: ``Tok.render`` says it, and the tokenizer's name ends ``+template=DIGEST``
TEMPLATE = "template"
_TEMPLATE_SUFFIX = "+template="

_REQUEST: dict[str, Callable] = {NEUTRAL: render.render_request, DEEPSEEK: render_deepseek.render_request}
_OUTPUT: dict[str, Callable] = {NEUTRAL: render.render_output, DEEPSEEK: render_deepseek.render_output}

#: marker name → special token string, over every rendering (the neutral
#: template's markers, and the tokens DeepSeek's encoding adds to them)
ALL_MARKERS: dict[str, str] = {**render.MARKERS, **render_deepseek.SPECIALS}


def check_render(name: str | None) -> str:
    """``name`` (None = neutral) checked against :data:`RENDERS`."""
    name = NEUTRAL if name is None else str(name).strip().lower()
    if name not in RENDERS:
        raise ValueError(f"unknown rendering {name!r}; choose from {', '.join(RENDERS)}")
    return name


def tokenizer_name(base: str, name: str | None) -> str:
    """The tokenization's name: the tokenizer's, with the rendering unless neutral."""
    name = check_render(name)
    return base if name == NEUTRAL else base + _SUFFIX + name


def template_tokenizer_name(base: str, digest: str) -> str:
    """The tokenization's name under a chat template (its digest)."""
    return base + _TEMPLATE_SUFFIX + digest


def render_of(tokenizer_name: str | None) -> str:
    """The rendering a tokenization's name (``meta['tokenizer']``) says."""
    if tokenizer_name and _TEMPLATE_SUFFIX in tokenizer_name:
        return TEMPLATE
    if tokenizer_name and _SUFFIX in tokenizer_name:
        got = tokenizer_name.rsplit(_SUFFIX, 1)[1]
        return got if got in RENDERS else NEUTRAL
    return NEUTRAL


def request_renderer(name: str | None) -> Callable:
    """``render_request(body, fmt)`` of the rendering ``name``."""
    return _REQUEST[check_render(name)]


def output_renderer(name: str | None) -> Callable:
    """``render_output(output, fmt)`` of the rendering ``name``."""
    return _OUTPUT[check_render(name)]

