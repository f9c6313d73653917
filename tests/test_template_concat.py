"""Chains of ``+`` joined at once render as transformers' environment renders them.

``replay.text.template_concat`` compiles ``a + b + c`` to in-order steps joined
once; checked
against transformers' environment on values of every kind, on the exceptions
a chain raises (the same type, at the same step: nothing after the failing
``+`` is evaluated), and on a real template's tools block.
"""

from __future__ import annotations

import pytest

from replay.text import render_template, template_env
from replay.text.template_concat import concat_end, concat_start, concat_step


def _both(source: str, **variables):
    """(fast environment's result, transformers' environment's result); each an
    output or ``("raised", exception type name)``."""
    out = []
    for template in (render_template._fast_compiled(source), template_env.environment().from_string(source)):
        try:
            out.append(template.render(**variables))
        except Exception as exc:  # noqa: BLE001 - compared by type
            out.append(("raised", type(exc).__name__))
    return out


CASES = [
    ("{{ a + b + c + d }}", {"a": "x" * 300, "b": "-", "c": "y", "d": "é"}),
    ("{{ a + '\\n' + b.name + c['k'] + 'z' }}", {"a": "A", "b": {"name": "N"}, "c": {"k": "K"}}),
    ("{{ 1 + n + 2 + m }}", {"n": 3, "m": 4.5}),
    ("{{ (l + m + l) | length }}", {"l": [1, 2], "m": [3]}),
    ("{{ a + b + c }}", {"a": "s", "b": 1, "c": "t"}),  # TypeError at the first +
    ("{{ a + nothing + c }}", {"a": "s", "c": "t"}),  # undefined
    ("{{ a + (b + c + d) + e }}", {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}),
    ("{{ a + b | tojson + c + d | upper }}", {"a": "<", "b": {"k": [1, "é"]}, "c": ">", "d": "q"}),
    ("{{ 'x' + 'y' + 'z' }}", {}),  # constants: folded by Jinja
    ("{% set ns = namespace(t='') %}{% for x in xs %}{% set ns.t = ns.t + '#' + x + '|' + x %}{% endfor %}{{ ns.t }}",
     {"xs": ["a", "bb", "ccc"]}),
    ("{{ a + b + c }}", {"a": None, "b": "s", "c": "t"}),
    # a failing + before a lookup that raises too: the + comes first (TypeError, not UndefinedError)
    ("{% set ns = namespace(t='a') %}{{ ns.t + n + u.x + 'z' }}", {"n": None}),
    ("{% set ns = namespace(t='a') %}{{ ns.t + 'b' + u.x + n }}", {"n": None}),
    ("{{ a + b + c + d }}", {"a": "s", "b": "t", "c": ["l"], "d": "u"}),  # TypeError at the third +
    ("{{ a + b + c + d }}", {"a": [1], "b": [2], "c": [3], "d": [4]}),
]


@pytest.mark.parametrize("source, variables", CASES)
def test_chains_render_as_transformers_does(source, variables):
    fast, reference = _both(source, **variables)
    assert fast == reference


def test_nothing_after_a_failing_addition_is_evaluated():
    calls = []

    def tick():
        calls.append(1)
        return "t"

    fast, reference = _both("{{ a + 'b' + tick() + 'c' }}", a=None, tick=tick)
    assert fast == reference == ("raised", "TypeError")
    assert calls == []  # (neither environment called it: the first + had failed)
    fast, reference = _both("{{ a + 'b' + tick() + 'c' }}", a="a", tick=tick)
    assert fast == reference == "abtc" and calls == [1, 1]


def test_a_chain_compiles_to_one_join():
    source = "{{ a + b + c }}"
    env = render_template._fast_compiled(source).environment
    assert "concat_end" in env.compile(source, raw=True)
    assert "concat_end" not in env.compile("{{ a + b }}", raw=True)  # (two operands: Python's +)
    assert "concat_end" in env.compile("{% set ns.t = ns.t + a + b %}", raw=True)  # (a text being built)
    assert "concat_end" not in env.compile("{{ '<t>' + m['c'] + '</t>' }}", raw=True)  # (short: Python's +)


def _chain(*operands):
    acc = concat_start(operands[0])
    for x in operands[1:]:
        acc = concat_step(acc, x)
    return concat_end(acc)


def test_the_steps():
    assert _chain("a", "b", "c") == "abc" and type(_chain("a", "b")) is str
    assert _chain(1, 2, 3) == 6
    assert _chain([1], [2]) == [1, 2]
    assert _chain("a", "b", ["c"][0], "d") == "abcd"
    with pytest.raises(TypeError):
        _chain("a", "b", 1)
