"""Which rendering turns a body into pieces: the neutral template or DeepSeek's encoding.

The rendering is part of the tokenization's identity: a ``Tok`` carries it and
its ``name`` (``meta['tokenizer']``, which the walks' fingerprint names too)
ends with ``+render=NAME`` for any rendering but the neutral one, so
``neutral`` keeps the names, and the tokens, of before, and switching the
rendering re-tokenizes and replays (``replay.prepare``).
"""

from __future__ import annotations

from typing import Callable

from replay.store.jsontext import loads
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


# ------------------------------------------------------------ a chunk's rendering, shared by processes

def render_items(items: list, name: str) -> list:
    """Each of ``items`` rendered with the rendering ``name``, in order: an item is
    ("part", kind, JSON text) or ("body", format, JSON body or None, JSON output
    or None); its result ("ok", pieces, seg ids, output pieces, output seg ids)
    or ("error", why)."""
    request, output = request_renderer(name), output_renderer(name)
    out = []
    for item in items:
        try:
            if item[0] == "part":
                pieces, opieces = render.render_part(item[1], loads(item[2])), None
            else:
                pieces = None if item[2] is None else request(loads(item[2]), item[1])
                o = None if item[3] is None else loads(item[3])
                opieces = None if o is None else output(o, item[1])
        except Exception as exc:  # noqa: BLE001 - the stage sets the request aside, with the reason
            out.append(("error", type(exc).__name__))
            continue
        out.append(("ok", pieces, _ids(pieces), opieces, _ids(opieces)))
    return out


def _ids(pieces: list | None) -> list | None:
    from replay.text.segids import piece_seg_id  # (segids names its markers from this module)

    return None if pieces is None else [piece_seg_id(p) for p in pieces]


def render_shared(pool, name: str, items: list) -> list:
    """:func:`render_items` of ``items``, split in contiguous shares, one per
    worker of ``pool`` (``replay.distributed.file_pool``: a share rendered is
    pure Python and holds a core; None: here). The results come back in the
    items' order, so the stage goes on exactly as with one process."""
    n = 1 if pool is None else pool.workers
    if n < 2 or len(items) < 2:
        return render_items(items, name)
    bounds = [len(items) * k // n for k in range(n + 1)]
    shares = [items[bounds[k]:bounds[k + 1]] for k in range(n)]
    out = []
    for _, got in pool.map_ordered(render_items, [s for s in shares if s], name,
                                   label=lambda share: f"a share of {len(share)} bodies"):
        out.extend(got)
    return out


def rendered_rows(pool, name: str, fmts: list, bodies: list, outputs: list, by_blobs,
                  ahead: dict | None) -> dict[int, tuple]:
    """Row → :func:`render_items` result of a chunk's rows the stage renders
    itself: the body (rows not stored as parts, with one) and the output; rows
    of pre-tokenized requests or rendered ahead are left out."""
    rows = [i for i, f in enumerate(fmts)
            if f != "tokens" and not (ahead and i in ahead) and (by_blobs[i] or bodies[i] is not None)]
    items = [("body", fmts[i], None if by_blobs[i] else bodies[i], outputs[i]) for i in rows]
    return dict(zip(rows, render_shared(pool, name, items)))
