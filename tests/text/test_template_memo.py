"""Logged messages and tools are mapped to the template's shape once per object
while the tokenize stage holds its inputs frozen (``template_messages(memo=)``,
``render_template.freeze_inputs``): the same mapping, the same rendering."""

from __future__ import annotations

import copy
import random

import pytest

from replay.text import render_template
from replay.text.render_template import ChatTemplate, render_chunks
from replay.text.template_messages import template_messages
from support.conversations import MIDNIGHT_US, TEMPLATES, Conversation


def _shared_bodies(fmt: str, seed: int, turns: int = 8) -> list[dict]:
    """A growing conversation's bodies whose earlier messages and tools are the
    same objects from one request to the next (as ``TemplateBodies`` hands them out)."""
    conv = Conversation(random.Random(seed), fmt, tools=True)
    seen: dict[str, object] = {}
    out = []
    for _ in range(turns):
        body = conv.step()
        for key in ("messages", "tools"):
            if key in body:
                body[key] = [seen.setdefault(repr(x), x) for x in body[key]]
        out.append(body)
    return out


@pytest.mark.parametrize("fmt", ["anthropic", "openai"])
@pytest.mark.parametrize("blocks", [False, True])
def test_a_memo_maps_each_object_once_and_the_same_way(fmt, blocks):
    memo: dict = {}
    for body in _shared_bodies(fmt, seed=3):
        plain = template_messages(copy.deepcopy(body), fmt, blocks)
        got = template_messages(body, fmt, blocks, memo)
        again = template_messages(body, fmt, blocks, memo)
        assert got == plain
        # (the logged messages' mapped objects come back: a template's per-object work is remembered too)
        assert all(a is b for a, b, part in zip(got[0], again[0], got[2]) if part >= 2)
        assert all(a is b for a, b in zip(got[1] or [], again[1] or []))
    # the other content shape is a mapping of its own, not the remembered one
    body = _shared_bodies(fmt, seed=3)[-1]
    assert template_messages(body, fmt, not blocks, memo) == template_messages(copy.deepcopy(body), fmt, not blocks)


@pytest.mark.parametrize("name", ["chatml_tools.jinja", "dated.jinja", "strips_reasoning.jinja"])
@pytest.mark.parametrize("fmt", ["anthropic", "openai"])
def test_frozen_rendering_equals_fresh_rendering_and_changes_nothing(name, fmt):
    path = TEMPLATES / name
    tpl = ChatTemplate(path.read_text(), str(path))
    bodies = _shared_bodies(fmt, seed=7)
    fresh = [render_chunks(tpl, copy.deepcopy(b), fmt, MIDNIGHT_US + k) for k, b in enumerate(bodies)]
    before = copy.deepcopy(bodies)
    render_template.freeze_inputs(True)
    try:
        frozen = [render_chunks(tpl, b, fmt, MIDNIGHT_US + k) for k, b in enumerate(bodies)]
        assert render_template._MAPPED  # (the memo was used)
    finally:
        render_template.freeze_inputs(False)
    assert frozen == fresh
    assert bodies == before  # the shared inputs are untouched
    assert not render_template._MAPPED  # (forgotten with the freeze)


def test_namespace_writes_are_those_of_transformers():
    """The fast environment's namespace (one call a ``set ns.x``) stores what
    transformers' stores, and refuses an underscore name as it does."""
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template

    source = ("{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
              "{% set ns.s = ns.s + m.content %}{% endfor %}{{ ns.n }}:{{ ns.s }}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    tpl = ChatTemplate(source, "t", {})
    got = "".join(c for c, _ in render_template.render_messages(tpl, messages, None, 0))
    assert got == render_jinja_template([messages], chat_template=source)[0][0] == "2:ab"
    bad = ChatTemplate("{% set ns = namespace(a=1) %}{% set ns._x = 2 %}{{ ns.a }}", "t", {})
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_template.render_messages(bad, messages, None, 0)
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_jinja_template([messages], chat_template=bad.source)
