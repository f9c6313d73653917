"""The copy of transformers' chat-template environment (``replay.text.template_env``):
used only while the installed transformers holds the code it copies, and
rendering as transformers' own environment does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from replay.text import render_template, template_env
from replay.text.render_template import ChatTemplate
from support.paths import ROOT

transformers_utils = pytest.importorskip("transformers.utils.chat_template_utils")
TEMPLATES = [*sorted((ROOT / "tests" / "fixtures" / "templates").glob("*.jinja")),
             *sorted((ROOT / "bench" / "templates").glob("*.jinja"))]


def test_the_installed_transformers_holds_the_copied_code():
    """Fails when a transformers upgrade changes the copied definitions: re-read
    them, update the copy and its FINGERPRINT (until then the run imports
    transformers' own, slower but right)."""
    assert template_env.transformers_source_fingerprint() == template_env.FINGERPRINT
    assert template_env.uses_copy()


def test_the_copy_is_that_code():
    """Each copied definition, taken from the installed transformers' source,
    reads the same as the copy here (names and docstrings aside)."""
    import ast
    import inspect

    mine = {n.name: n for n in ast.parse(inspect.getsource(template_env)).body if isinstance(n, ast.FunctionDef)}
    theirs = {n.name: n for n in ast.parse(inspect.getsource(transformers_utils)).body
              if isinstance(n, ast.FunctionDef)}

    def calls(node) -> set:
        return {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}

    def strings(node) -> set:
        return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}

    assert ast.dump(mine["_alias_reasoning_fields"].body[-1]) == ast.dump(theirs["_alias_reasoning_fields"].body[-1])
    env_mine, env_theirs = mine["copied_environment"], theirs["_cached_compile_jinja_template"]
    # every global, filter and environment option theirs sets, this one sets
    assert strings(env_theirs) - {"name:endgeneration"} <= strings(env_mine) | {
        "apply_chat_template requires jinja2 to be installed. Please install it using `pip install jinja2`."}
    # (theirs compiles the template too: the copy returns the environment)
    assert calls(env_theirs) - {"is_jinja_available", "jinja_env.from_string"} <= calls(env_mine)
    assert template_env._REASONING_FIELDS == transformers_utils._REASONING_FIELDS


def test_a_changed_definition_changes_the_fingerprint():
    import inspect

    source = inspect.getsource(transformers_utils)
    assert template_env.fingerprint_of(source) == template_env.FINGERPRINT
    edited = source.replace('"reasoning_content", "thinking", "reasoning"', '"reasoning_content", "thinking"')
    assert edited != source and template_env.fingerprint_of(edited) not in (None, template_env.FINGERPRINT)
    edited = source.replace("def _alias_reasoning_fields(", "def _alias_reasoning_fields_gone(")
    assert template_env.fingerprint_of(edited) is None


SOURCES = [
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.role }}:{{ m.content }}"
    "{% if m.reasoning_content %}[{{ m.reasoning_content }}|{{ m.thinking }}]{% endif %}{% endfor %}{{ ns.n }}",
    "{{ tools | tojson }}|{{ tools | tojson(indent=2, sort_keys=true) }}|{{ dict(a=1) | tojson }}",
    "{% for m in messages %}{% generation %}{{ m.content | upper }}{% endgeneration %}"
    "{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}",
    "{{ messages[0].content if messages[0] is defined }}{{ messages[0].nope }}{{ ''.join(['a', 'b']) }}",
]


@pytest.mark.parametrize("source", SOURCES + [p.read_text() for p in TEMPLATES])
def test_the_copy_renders_as_transformers(source):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi ünïcode <b>"},
                {"role": "assistant", "content": "", "reasoning": "think",
                 "tool_calls": [{"type": "function", "id": "c1",
                                 "function": {"name": "f", "arguments": {"x": 1}}}]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"},
                {"role": "user", "content": "and?"}]
    tools = [{"type": "function", "function": {"name": "f", "description": "é", "parameters": {"type": "object"}}}]
    theirs = transformers_utils.render_jinja_template([json.loads(json.dumps(messages))], tools=tools,
                                                      chat_template=source, add_generation_prompt=True,
                                                      bos_token="<s>", eos_token="</s>")[0][0]
    tpl = ChatTemplate(source, "t", {"bos_token": "<s>", "eos_token": "</s>"})
    mine = "".join(c for c, _ in render_template.render_messages(
        tpl, json.loads(json.dumps(messages)), tools, None))
    if "strftime_now" not in source and "date_string" not in source:  # (the request's time, not the run's)
        assert mine == theirs


def test_the_copy_refuses_what_transformers_refuses():
    messages = [{"role": "user", "content": "a"}]
    for source, error in [("{% set ns = namespace(a=1) %}{% set ns._x = 2 %}", jinja2.exceptions.SecurityError),
                          ("{{ raise_exception('no') }}", jinja2.exceptions.TemplateError),
                          ("{{ messages.__class__ }}{{ ''.__class__.__mro__ }}", None)]:
        outs = []
        for render in (lambda: transformers_utils.render_jinja_template([messages], chat_template=source)[0][0],
                       lambda: "".join(c for c, _ in render_template.render_messages(
                           ChatTemplate(source, "t", {}), messages, None, 0))):
            try:
                outs.append(render())
            except jinja2.exceptions.TemplateError as exc:
                outs.append(type(exc))
        assert outs[0] == outs[1]
        if error is not None:
            assert outs[0] is error


def test_another_transformers_gets_its_own_environment(monkeypatch):
    """A fingerprint that does not match (or REPLAY_TRANSFORMERS_ENV=1) means
    transformers' own environment and aliasing, imported."""
    def fresh():
        pass  # (nothing is remembered between calls)

    try:
        with monkeypatch.context() as m:
            m.setattr(template_env, "FINGERPRINT", "0" * 16)
            fresh()
            assert not template_env.uses_copy()
            assert template_env.environment().globals["namespace"].__module__.startswith("transformers")
            assert template_env.alias_reasoning([{"reasoning": "r"}]) == [
                {"thinking": "r", "reasoning": "r", "reasoning_content": "r"}]
        with monkeypatch.context() as m:
            m.setenv(template_env.OWN_ENV, "1")
            fresh()
            assert not template_env.uses_copy()
        fresh()
        assert template_env.environment().globals["namespace"].__module__ == template_env.__name__
    finally:
        fresh()


def test_rendering_does_not_import_transformers(tmp_path):
    """The point of the copy: neither the tokenize stage nor the encoder
    process pays for importing transformers. Here importing it fails in both
    (a package of that name that raises, beside a copy of the real
    chat_template_utils.py for the fingerprint): the run still renders, in
    both processes, the rows transformers' own environment gives."""
    from support.conversations import STRIPS, conversations_log

    fake = tmp_path / "fake" / "transformers"
    (fake / "utils").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('transformers imported')\n")
    (fake / "utils" / "chat_template_utils.py").write_text(Path(transformers_utils.__file__).read_text())
    log = tmp_path / "log.jsonl"
    n = len(conversations_log((7, 8), "anthropic", log, n_conv=4, turns=5))
    script = f"""
import re, sys, time
import replay.api as rp
from support.text import rows as _rows
tok = rp.load_tokenizer(rp.tokenizer_spec(None, None, {str(STRIPS)!r}))
con = rp.open_db(sys.argv[1])
rp.ingest(con, [{str(log)!r}], tokenizer=tok)
deadline = time.monotonic() + 120
while time.monotonic() < deadline and not re.search("{n} of {n} requests rendered ahead", tok.encoder_name()):
    time.sleep(0.1)
done = rp.prepare(con, tokenizer=tok)
print(repr(_rows(con)))
print(done["tokenize"].rendered_ahead, "transformers" in sys.modules)
tok.close()
"""
    outs = []
    for k, path in enumerate([tmp_path / "fake", None]):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (path, ROOT, ROOT / "tests") if p)}
        if path is None:
            env[template_env.OWN_ENV] = "1"
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"{k}.duckdb")],
                             capture_output=True, text=True, cwd=ROOT, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        outs.append(out.stdout.splitlines())
    (rows, last), (own_rows, own_last) = outs
    assert rows == own_rows
    assert own_last.split()[1] == "True"  # (the comparison: transformers' own)
    ahead, imported = last.split()
    assert imported == "False" and int(ahead) > 0  # (the encoder process rendered them, without transformers too)
