"""A namespace in the template's environment stores what transformers' stores."""

from __future__ import annotations

import pytest

from replay.text import render_template
from replay.text.render_template import ChatTemplate


def test_namespace_writes_are_those_of_transformers():
    """The environment's namespace stores what transformers' stores, and
    refuses an underscore name as it does."""
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
