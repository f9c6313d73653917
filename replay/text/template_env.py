"""transformers' chat-template environment, without importing transformers.

``apply_chat_template`` compiles a template in an environment that
``transformers.utils.chat_template_utils._cached_compile_jinja_template`` builds
(sandboxed, ``trim_blocks``/``lstrip_blocks``, loop controls, its
``{% generation %}`` block, its own ``tojson``, ``raise_exception``,
``strftime_now``, ``dict`` and ``namespace``), and aliases the reasoning fields of
each message (``_alias_reasoning_fields``) before rendering. Importing
transformers to get them takes over a second of CPU in each process that
renders — the tokenize stage's and the encoder process's — which is as much as
rendering several hundred requests.

So the same environment and aliasing are built here, copied from transformers'
code (Apache-2.0), and used only while that code is the one they were copied
from: :data:`FINGERPRINT` is a hash of the source of those two functions and of
``_REASONING_FIELDS`` in the installed transformers, read from its file
(``transformers_source_fingerprint``) without importing it. Any other
transformers gets its own environment and aliasing, imported. The tests render
fixture templates both ways and check that the fingerprint matches the
installed transformers, so an upgrade that changes that code fails the tests
rather than the results.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path

#: sha256 of the three definitions below in the transformers this copies (5.25.0)
FINGERPRINT = "d2f9a6d1a69946ed"
#: the definitions the copy stands for, in transformers/utils/chat_template_utils.py
COPIED = ("_cached_compile_jinja_template", "_alias_reasoning_fields", "_REASONING_FIELDS")
#: set to 1: always import transformers' own environment (to compare, or to rule this copy out)
OWN_ENV = "REPLAY_TRANSFORMERS_ENV"

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def transformers_source_fingerprint() -> str | None:
    """The hash of :data:`COPIED` in the installed transformers' source, or None
    (not installed, or a definition missing). Nothing is imported."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "utils" / "chat_template_utils.py"
    try:
        source = path.read_text(encoding="utf-8")
    except OSError:
        return None
    return fingerprint_of(source)


def fingerprint_of(source: str) -> str | None:
    """The hash of the :data:`COPIED` definitions of a module's source (None when one is missing)."""
    found = {}
    lines = source.splitlines(keepends=True)  # (``ast.get_source_segment`` splits the whole file per call)
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in COPIED:
            name = node.name
        elif isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in COPIED:
            name = node.targets[0].id
        else:
            continue
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        found[name] = "".join(lines[start - 1:node.end_lineno])
    if len(found) != len(COPIED):
        return None
    joined = "\n".join(found[name] for name in COPIED)
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:len(FINGERPRINT)]


def uses_copy() -> bool:
    """Whether :func:`environment` and :func:`alias_reasoning` are the copies here."""
    return os.environ.get(OWN_ENV) != "1" and transformers_source_fingerprint() == FINGERPRINT


def _transformers():
    """transformers' chat-template module (its advice that PyTorch is absent is
    not for our users: only the template code is used)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers.utils import chat_template_utils

    return chat_template_utils


def environment():
    """The environment ``apply_chat_template`` compiles a template in (raises
    ImportError when a copy cannot be used and transformers is missing)."""
    if uses_copy():
        return copied_environment()
    return _transformers()._compile_jinja_template("").environment


def reasoning_alias():
    """``_alias_reasoning_fields`` (each message's reasoning under all its
    names), or no aliasing (an older transformers without it)."""
    if uses_copy():
        return _alias_reasoning_fields
    return getattr(_transformers(), "_alias_reasoning_fields", None) or (lambda messages: messages)


def alias_reasoning(messages: list) -> list:
    """:func:`reasoning_alias` applied to ``messages``."""
    return reasoning_alias()(messages)


# --- copied from transformers 5.25.0, transformers/utils/chat_template_utils.py ------------------

def _alias_reasoning_fields(chat):
    aliased_chat = []
    for message in chat:
        if isinstance(message, dict):
            reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased_chat.append(message)
    return aliased_chat


def copied_environment():
    """``_cached_compile_jinja_template``'s environment (its version check of
    jinja2 ≥ 3.1.6 included), built for each caller (a template is compiled
    once per ``ChatTemplate``: nothing is remembered here)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class AssistantTracker(Extension):
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._tracking = ContextVar("assistant_tracker", default=None)

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context, caller):
            rv = caller()
            if (tracking := self._tracking.get()) is not None:
                rendered_blocks, generation_indices = tracking
                start_index = len("".join(rendered_blocks))
                end_index = start_index + len(rv)
                generation_indices.append((start_index, end_index))
            return rv

        def is_active(self) -> bool:
            return self._tracking.get() is not None

        @contextmanager
        def activate_tracker(self, rendered_blocks, generation_indices):
            if self.is_active():
                raise ValueError("AssistantTracker should not be reused before closed")
            token = self._tracking.set((rendered_blocks, generation_indices))
            try:
                yield
            finally:
                self._tracking.reset(token)

    from packaging import version  # (matplotlib's dependency, as transformers')

    if version.parse(jinja2.__version__) < version.parse("3.1.6"):
        raise ImportError(
            f"apply_chat_template requires jinja2>=3.1.6 to be installed. Your version is {jinja2.__version__}. "
            "You can upgrade it with `pip install -U jinja2`.")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute.")

    jinja_env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    jinja_env.filters["tojson"] = tojson
    jinja_env.globals["raise_exception"] = raise_exception
    jinja_env.globals["strftime_now"] = strftime_now
    jinja_env.globals["dict"] = TemplateDict()
    jinja_env.globals["namespace"] = TemplateNamespace
    return jinja_env

# --- end of the copy -------------------------------------------------------------------------------

