"""Chains of ``+`` joined at once render as transformers' environment renders them.

``replay.text.template_concat`` compiles ``a + b + c`` to in-order steps joined
once; checked
against transformers' environment on values of every kind, on the exceptions
a chain raises (the same type, at the same step: nothing after the failing
``+`` is evaluated), and on a real template's tools block.
"""

from __future__ import annotations

import pytest

from replay.text import render_template
from replay.text.template_concat import concat_end, concat_start, concat_step
from support.text import both as _both


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


# --------------------------------------------------------------------------- chains remembered per object

TOOLS_LOOP = ("{% set ns = namespace(t='T:') %}{% for tool in tools %}"
              "{% set ns.t = ns.t + '\\n# ' + tool.function.name + ' ' + (tool.function.parameters | tojson) + '.' %}"
              "{% endfor %}{{ ns.t }}")


@pytest.fixture
def frozen():
    render_template.freeze_inputs(True)
    yield render_template
    render_template.freeze_inputs(False)


def _tool(name, **params):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": params}}}


def test_a_chain_over_the_same_objects_is_remembered_and_renders_the_same(frozen):
    """The same tool objects request after request: the second render takes the
    remembered texts (the lookups are not made again) and equals transformers'."""
    tools = [_tool("read", path={"type": "string"}), _tool("write", text={"type": "string", "é": [1, None]})]
    first = _both(TOOLS_LOOP, tools=tools)
    memo = render_template._CHAINS
    assert first[0] == first[1] and len(memo.texts) == 2
    tools[0]["function"]["name"] = "changed"  # (what frozen inputs promise not to do: shows the memo is read)
    again = render_template._fast_compiled(TOOLS_LOOP).render(tools=tools)
    assert again == first[0]
    render_template.forget_frozen()
    assert render_template._fast_compiled(TOOLS_LOOP).render(tools=tools) != first[0]  # (forgotten: read afresh)
    fresh = [_tool("read", path={"type": "string"}), _tool("other")]  # (other objects: evaluated, then remembered)
    assert _both(TOOLS_LOOP, tools=fresh)[0] == _both(TOOLS_LOOP, tools=fresh)[1]


@pytest.mark.parametrize("source, variables", [
    # a namespace changes between renders of the chain: never remembered
    ("{% set ns = namespace(t='') %}{% set o = namespace(v='a') %}{% for i in xs %}"
     "{% set ns.t = ns.t + '-' + o.v + '|' %}{% set o.v = o.v + 'b' %}{% endfor %}{{ ns.t }}", {"xs": [1, 2, 3]}),
    # a dict holding something else (a namespace made by the template, changed between renders): not remembered
    ("{% set ns = namespace(t='') %}{% set o = namespace(v='a') %}{% set d = {'k': o} %}{% for i in xs %}"
     "{% set ns.t = ns.t + '-' + d.k.v + '|' %}{% set o.v = o.v + 'b' %}{% endfor %}{{ ns.t }}", {"xs": [1, 2, 3]}),
    ("{% set ns = namespace(t='') %}{% set o = namespace(v='a') %}{% set d = [1, [o]] %}{% for i in xs %}"
     "{% set ns.t = ns.t + '-' + d[1][0].v + '|' %}{% set o.v = o.v + 'b' %}{% endfor %}{{ ns.t }}", {"xs": [1, 2]}),
    # values that are not strings: the original additions, the same errors
    ("{% set ns = namespace(t='') %}{% for x in xs %}{% set ns.t = ns.t + '#' + x.n + '.' %}{% endfor %}{{ ns.t }}",
     {"xs": [{"n": "a"}, {"n": 2}]}),
    ("{% set ns = namespace(t='') %}{% for x in xs %}{% set ns.t = ns.t + '#' + x.m + '.' %}{% endfor %}{{ ns.t }}",
     {"xs": [{"n": "a"}]}),
    ("{% set ns = namespace(t=0) %}{% for x in xs %}{% set ns.t = ns.t + x.n + x.n %}{% endfor %}{{ ns.t }}",
     {"xs": [{"n": 1}, {"n": 2}]}),
    ("{% set ns = namespace(t='') %}{% for x in xs %}{% set ns.t = ns.t + x + '/' %}{% endfor %}{{ ns.t }}",
     {"xs": ["a", "b", "a"]}),
])
def test_chains_that_cannot_be_remembered_render_as_transformers_does(frozen, source, variables):
    for _ in range(3):  # (a memo would answer the later rounds)
        fast, reference = _both(source, **variables)
        assert fast == reference


def test_the_messages_reads_are_still_noted(frozen):
    """A chain over a message (tracked: its reads name the chunk's part) is never
    taken from the memo: the chunks and their messages are those of rendering afresh."""
    source = ("{% set ns = namespace(t='') %}{% for m in messages %}{% set ns.t = ns.t + '\\n' + m.content + '!' %}"
              "{{ m.role }}{% endfor %}{{ ns.t }}")
    tpl = render_template.ChatTemplate(source, "test", {})
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    got = [render_template.render_messages(tpl, messages, None, 0) for _ in range(3)]
    render_template.freeze_inputs(False)
    assert got[0] == got[1] == got[2] == render_template.render_messages(tpl, messages, None, 0)


def test_nothing_is_remembered_unless_the_inputs_are_frozen():
    tools = [_tool("read", path={"type": "string"})]
    first = render_template._fast_compiled(TOOLS_LOOP).render(tools=tools)
    tools[0]["function"]["name"] = "changed"  # (allowed: the inputs are not frozen)
    fast, reference = _both(TOOLS_LOOP, tools=tools)
    assert fast == reference != first


FRESH_DICTS = ("{% set ns = namespace(t='') %}{% for n in names %}{% set d = {'n': n} %}"
               "{% set ns.t = ns.t + '<' + d.n + '>' %}{% endfor %}{{ ns.t }}")


def test_a_chain_over_new_objects_every_time_is_given_up(frozen, monkeypatch):
    """A dict the template makes is a new object each render: never a hit, so
    after GIVE_UP misses the chain is no longer remembered (the output stays right)."""
    from replay.text.template_concat import ChainMemo

    monkeypatch.setattr(ChainMemo, "GIVE_UP", 3)
    names = [f"x{i}" for i in range(10)]
    fast, reference = _both(FRESH_DICTS, names=names)
    assert fast == reference
    assert len(render_template._CHAINS.texts) == 4  # (misses 0..3 remembered, then given up)


def test_a_chain_that_hits_is_never_given_up(frozen, monkeypatch):
    from replay.text.template_concat import ChainMemo

    monkeypatch.setattr(ChainMemo, "GIVE_UP", 3)
    tools = [_tool("read")]
    assert _both(TOOLS_LOOP, tools=tools)[0] == _both(TOOLS_LOOP, tools=tools)[1]  # (a miss, then a hit)
    more = [_tool(f"t{i}") for i in range(10)]  # (ten misses after the hit)
    fast, reference = _both(TOOLS_LOOP, tools=more)
    assert fast == reference and len(render_template._CHAINS.texts) == 11


def test_remembered_texts_are_bounded(frozen, monkeypatch):
    from replay.text.template_concat import ChainMemo

    monkeypatch.setattr(ChainMemo, "MAX_CHARS", 200)
    tools = [_tool(f"t{i}", p={"type": "string", "description": "d" * 50}) for i in range(20)]
    fast, reference = _both(TOOLS_LOOP, tools=tools)
    memo = render_template._CHAINS
    assert fast == reference and 0 < len(memo.texts) < 20 and memo.chars <= 200 + max(map(len, fast.split("\n")))


def test_a_text_built_in_a_loop_is_each_steps_string_again(frozen):
    """The same tools again: each step's sum is the very string of the last
    render (nothing copied), and the text is transformers'; a new first
    operand (another header) is summed afresh."""
    tools = [_tool(f"t{i}", p={"type": "string"}) for i in range(4)]
    first = _both(TOOLS_LOOP, tools=tools)  # (the texts remembered)
    second = _both(TOOLS_LOOP, tools=tools)  # (the sums remembered)
    memo = render_template._CHAINS
    sums = {k: v[2] for k, v in memo.sums.items()}
    again = _both(TOOLS_LOOP, tools=tools)
    assert again == second == first and first[0] == first[1] and len(sums) == 4
    assert sums and all(memo.sums[k][2] is v for k, v in sums.items())  # (the same objects: none made again)
    headed = TOOLS_LOOP.replace("t='T:'", "t=head")
    for head in ("T:", "U:", "U:", "".join(["T", ":"])):  # (another first operand, equal or not: summed afresh)
        fast, reference = _both(headed, tools=tools, head=head)
        assert fast == reference and fast.startswith(head)


def test_remembered_sums_are_bounded(frozen, monkeypatch):
    from replay.text.template_concat import ChainMemo

    monkeypatch.setattr(ChainMemo, "SUM_CHARS", 300)
    tools = [_tool(f"t{i}", p={"type": "string", "description": "d" * 50}) for i in range(20)]
    for _ in range(3):
        fast, reference = _both(TOOLS_LOOP, tools=tools)
        assert fast == reference
    memo = render_template._CHAINS
    assert 0 < len(memo.sums) < 20 and memo.sum_chars <= 300 + len(fast)
