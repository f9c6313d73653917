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
"""

from __future__ import annotations

from jinja2.compiler import CodeGenerator
from jinja2 import nodes


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


class ConcatGenerator(CodeGenerator):
    """Jinja's code generator, a chain of three or more ``+`` starting with a
    text being built compiled to in-order steps joined once (module docstring)."""

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
        self.write("environment.concat_end(" + "environment.concat_step(" * (len(operands) - 1)
                   + "environment.concat_start(")
        self.visit(operands[0], frame)
        self.write(")")
        for x in operands[1:]:
            self.write(", ")
            self.visit(x, frame)
            self.write(")")
        self.write(")")
