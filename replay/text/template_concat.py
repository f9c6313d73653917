"""A chat template's chains of ``+`` joined at once (``render_template``'s environment).

Jinja compiles ``a + b + c + d`` to ``((a + b) + c) + d``: each ``+`` copies the
text so far. A template that builds a long text piece by piece —
DeepSeek-V3.1's tools block is ``tool_ns.text + '\\n### ' + name + … + '\\n'``
for each tool, eight operands — copies the whole block seven times per tool.
:class:`ConcatGenerator` compiles such a chain (three operands or more, the
first a variable or a namespace's attribute: a text being built) to

    concat_end(concat_step(concat_step(concat_step(concat_start(a), b), c), d))

Python evaluates that in the original order — ``a``, ``b``, the first step,
``c``, the second step, … — and each step is the original ``+`` unless both
sides are exactly ``str``: strings are then only gathered, and joined once at
the end (``str + str`` neither raises nor does anything else, so leaving it
for later changes nothing). At the first operand that is not a ``str``, the
strings so far are joined and ``+`` is applied from there on, at the same
step, before the next operand is evaluated: the same value, or the same
exception at the same step.

A chain whose operands after the first are *pure* — constants, names, their
attributes and items, and the filters the environment names pure (``tojson``
without arguments) — is also remembered (:class:`ChainMemo`): while the
inputs are frozen (``render_template.freeze_inputs``), the texts those
operands give are remembered per object their names hold, when every one of
those objects is JSON data (dicts, lists, strings, numbers, booleans, None,
nothing else inside: a template can change none of them, and the caller
changes none while frozen). The same objects then give the same texts, so a
later render adds the remembered text to the first operand and evaluates
nothing else. The tools block is such a chain per tool, and the tools are the
same objects in every request that sends them.
"""

from __future__ import annotations

import itertools

from jinja2 import nodes
from jinja2.compiler import CodeGenerator

#: a number for each chain compiled in this process (the memo's key: chains of other templates never collide)
_CHAIN_NUMBERS = itertools.count()
_JSON_SCALARS = (str, int, float, bool, type(None))


def _accumulator(node) -> bool:
    """A chain worth joining starts with a variable or a namespace's attribute
    (``x + …``, ``ns.text + …``: a text being built); one that starts with a
    constant or an item (``'<tag>' + m['content'] + …``) is short, and
    Python's ``+`` beats a call per operand."""
    return isinstance(node, nodes.Name) or (isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name))


class _Gathered(list):
    """Strings of a chain waiting to be joined (never seen by the template)."""
    __slots__ = ()


def concat_start(x):
    return _Gathered((x,)) if type(x) is str else x


def concat_step(acc, x):
    """``acc + x``: gathered while both are exactly ``str`` (module docstring)."""
    if type(acc) is _Gathered:
        if type(x) is str:
            acc.append(x)
            return acc
        acc = "".join(acc)
    return acc + x


def concat_end(acc):
    return "".join(acc) if type(acc) is _Gathered else acc


class ChainMemo:
    """``concat_memo(number, first, roots, rest, whole)``: the chain ``number``
    (module docstring); ``first`` its first operand's value, ``roots`` the values
    of the names its other operands read, ``rest()`` those operands' values,
    ``whole()`` the chain evaluated in full. ``frozen[0]``: the inputs are frozen."""

    #: characters of remembered texts (then all are forgotten)
    MAX_CHARS = 16_000_000
    #: characters of remembered sums (``first`` and the text after it: then all are forgotten)
    SUM_CHARS = 4_000_000
    #: a chain missed this often without a hit is no longer tried (its objects are new each time)
    GIVE_UP = 1_000

    def __init__(self, frozen: list):
        self.frozen = frozen
        self.clear()

    def clear(self) -> None:
        self.texts: dict[tuple, tuple] = {}  # (number, ids of the roots) → (the roots, held; the text)
        self.json: dict[int, tuple] = {}  # id → (object, held; is it JSON data)
        self.misses: dict[int, int] = {}  # chain number → misses while it has had no hit (-1: it has)
        self.chars = 0
        self.sums: dict[tuple, tuple] = {}  # (key, id of first) → (first and the roots, held; first + the text)
        self.sum_chars = 0

    def __call__(self, number: int, first, roots: tuple, rest, whole):
        if type(first) is not str or not self.frozen[0]:
            return whole()
        key = (number, *map(id, roots))
        hit = self.texts.get(key)
        if hit is not None:  # (the entry holds its roots: their ids name no other object meanwhile)
            self.misses[number] = -1  # (it hits: never given up)
            # the very string this sum gave before: a text built in a loop (a tools block)
            # is then each step's string again, and no step copies the text so far
            at = (key, id(first))
            got = self.sums.get(at)
            if got is not None and got[0] is first:
                return got[2]
            out = first + hit[1]
            if self.sum_chars > self.SUM_CHARS:
                self.sums.clear()
                self.sum_chars = 0
            self.sums[at] = (first, hit[0], out)
            self.sum_chars += len(out)
            return out
        misses = self.misses.get(number, 0)
        if misses > self.GIVE_UP:
            return whole()
        out = whole()
        if misses >= 0:
            self.misses[number] = misses + 1
        # (only over a dict or list: a chain of strings alone costs less than remembering it)
        if (type(out) is str and any(type(r) is dict or type(r) is list for r in roots)
                and all(map(self._is_json, roots))):
            values = rest()  # (evaluated before without raising: the same values again)
            if all(type(v) is str for v in values):
                text = "".join(values)
                if self.chars > self.MAX_CHARS:
                    self.texts.clear()
                    self.json.clear()
                    self.chars = 0
                self.texts[key] = (roots, text)
                self.chars += len(text)
        return out

    def _is_json(self, x) -> bool:
        if type(x) in _JSON_SCALARS:
            return True
        got = self.json.get(id(x))  # (an entry holds its object: its id names no other meanwhile)
        if got is None:
            got = self.json[id(x)] = (x, _json_data(x))
        return got[1]


def _json_data(x) -> bool:
    """Is ``x`` made of dicts, lists and JSON scalars only (exact types)?"""
    stack = [x]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            if not all(type(k) in _JSON_SCALARS for k in v):
                return False
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
        elif t not in _JSON_SCALARS:
            return False
    return True


def _pure(node, filters) -> bool:
    """An operand whose value depends only on the objects its names hold."""
    if isinstance(node, (nodes.Const, nodes.Name)):
        return True
    if isinstance(node, nodes.Getattr):
        return _pure(node.node, filters)
    if isinstance(node, nodes.Getitem):
        return _pure(node.node, filters) and _pure(node.arg, filters)
    if isinstance(node, nodes.Filter):
        return (node.name in filters and node.node is not None and not node.args and not node.kwargs
                and node.dyn_args is None and node.dyn_kwargs is None and _pure(node.node, filters))
    return False


class ConcatGenerator(CodeGenerator):
    """Jinja's code generator, a chain of three or more ``+`` starting with a
    text being built compiled to in-order steps joined once (module docstring).
    Its environment gives the steps (``concat_start``, ``concat_step``,
    ``concat_end``), the memo (``concat_memo``, a :class:`ChainMemo`) and the
    names of the pure filters (``concat_pure_filters``):
    ``render_template._fast_compiled``."""

    def visit_Add(self, node, frame):
        if self.optimizer is not None and not frame.eval_ctx.volatile:  # (constants folded, as Jinja does)
            folded = self.optimizer.visit(node, frame.eval_ctx)
            if folded != node:
                return self.visit(folded, frame)
        whole, operands = node, []
        while isinstance(node, nodes.Add):
            operands.append(node.right)
            node = node.left
        operands.append(node)
        operands.reverse()
        if len(operands) < 3 or not _accumulator(operands[0]):
            return super().visit_Add(whole, frame)
        filters = self.environment.concat_pure_filters
        rest = operands[1:]
        if all(_pure(x, filters) for x in rest) and any(not isinstance(x, nodes.Const) for x in rest):
            names = {}
            for x in rest:
                for name in [x] if isinstance(x, nodes.Name) else x.find_all(nodes.Name):
                    names.setdefault(name.name, name)
            self.write(f"environment.concat_memo({next(_CHAIN_NUMBERS)}, ")
            self.visit(operands[0], frame)
            self.write(", (")
            for name in names.values():
                self.visit(name, frame)
                self.write(", ")
            self.write("), lambda: (")
            for x in rest:
                self.visit(x, frame)
                self.write(", ")
            self.write("), lambda: ")
            self._steps(operands, frame)
            self.write(")")
            return None
        return self._steps(operands, frame)

    def _steps(self, operands, frame) -> None:
        self.write("environment.concat_end(" + "environment.concat_step(" * (len(operands) - 1)
                   + "environment.concat_start(")
        self.visit(operands[0], frame)
        self.write(")")
        for x in operands[1:]:
            self.write(", ")
            self.visit(x, frame)
            self.write(")")
        self.write(")")
