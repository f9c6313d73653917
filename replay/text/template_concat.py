"""A chat template's chains of ``+`` joined at once (``render_template``'s environment).

Jinja compiles ``a + b + c + d`` to ``((a + b) + c) + d``: each ``+`` copies the
text so far. A template that builds a long text piece by piece —
DeepSeek-V3.1's tools block is ``tool_ns.text + '\\n### ' + name + … + '\\n'``
for each tool, eight operands — copies the whole block seven times per tool.
:class:`ConcatGenerator` compiles such a chain (three operands or more, the
first a variable or a namespace's attribute: a text being built) to
``environment.concat_all(a, b, c, d)``, which joins strings once, and with
any operand that is not exactly a ``str`` adds them in order with ``+``: the
same value, or the same exception at the same step.

Every operand is still evaluated in its own order, and none after a ``+``
that would have come before it: operands that cannot raise or change anything
(constants, names, attribute and item lookups, which the sandbox answers with
an undefined value rather than raising) are gathered freely; any other operand
(a filter, a call) starts a new ``concat_all`` whose first argument is the
chain so far, so the additions before it are made before it is evaluated.
"""

from __future__ import annotations

from jinja2 import nodes
from jinja2.compiler import CodeGenerator

#: operands evaluated freely: they neither raise nor change anything
_QUIET = (nodes.Const, nodes.Name)


def _quiet(node) -> bool:
    if isinstance(node, _QUIET):
        return True
    if isinstance(node, nodes.Getattr):
        return _quiet(node.node)
    if isinstance(node, nodes.Getitem):
        return _quiet(node.node) and _quiet(node.arg)
    return False


def _accumulator(node) -> bool:
    """A chain worth joining starts with a variable or a namespace's attribute
    (``x + …``, ``ns.text + …``: a text being built); one that starts with a
    constant or an item (``'<tag>' + m['content'] + …``) is short, and
    Python's ``+`` beats a call."""
    return isinstance(node, nodes.Name) or (isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name))


def concat_all(*operands):
    """``operands[0] + operands[1] + …``, strings joined at once."""
    for x in operands:
        if type(x) is not str:
            out = operands[0]
            for y in operands[1:]:
                out = out + y
            return out
    return "".join(operands)


class ConcatGenerator(CodeGenerator):
    """Jinja's code generator, a chain of three or more ``+`` compiled to
    ``environment.concat_all`` (module docstring)."""

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
        # levels: each loud operand after the first starts one (its ``+`` made before it is evaluated)
        levels = [[operands[0]]]
        for x in operands[1:]:
            if _quiet(x):
                levels[-1].append(x)
            else:
                levels.append([x])
        self.write("environment.concat_all(" * len(levels))
        for k, level in enumerate(levels):
            for i, x in enumerate(level):
                if k or i:
                    self.write(", ")
                self.visit(x, frame)
            self.write(")")

