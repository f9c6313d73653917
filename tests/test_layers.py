"""docs/architecture.md's layer table, enforced: every module of ``replay/`` imports
only modules of its own layer or of the layers below it (at module or function
level), and every module belongs to a row of the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support.paths import ROOT

PACKAGE = ROOT / "replay"
ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*`(replay/[^`]*)`\s*\|")


def layers() -> list[tuple[str, str]]:
    """The table's rows, top to bottom: (layer name, its package or module as a dotted name)."""
    rows = []
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows.append((m.group(1), m.group(2).rstrip("/").removesuffix(".py").replace("/", ".")))
    return rows


def rank_of(module: str, rows) -> int | None:
    """The row (0 = top) a dotted module name belongs to: the longest package or module that holds it."""
    best = None
    for i, (_, name) in enumerate(rows):
        if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(rows[best][1])):
            best = i
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import of the package in a module, wherever it stands."""
    if path.suffix == ".pyx":  # Cython: read its import lines (ast does not parse it)
        return [(n, m.group(1)) for n, line in enumerate(path.read_text().splitlines(), 1)
                if (m := re.match(r"\s*(?:from|c?import)\s+(replay[\w.]*)", line))]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the module's own package
                base = module_name(path).split(".")
                base = base[:len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from replay import api` imports replay.api: each name is tried as a module
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return [(n, name) for n, name in out if name == "replay" or name.startswith("replay.")]


SOURCES = sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pyx"))


def test_the_table_is_read():
    rows = layers()
    names = [name for _, name in rows]
    assert names[:2] == ["replay.cli", "replay.api"] and "replay.core" in names and "replay.store" in names
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_its_own_layer_or_lower_ones(path):
    rows = layers()
    me = module_name(path)
    if me == "replay":  # the package's own __init__: its version string, nothing imported
        assert imports_of(path) == []
        return
    mine = rank_of(me, rows)
    assert mine is not None, f"{me} is in no row of docs/architecture.md's layer table"
    upward = []
    for line, name in imports_of(path):
        theirs = rank_of(name, rows)
        if theirs is None:  # `from replay.core.trie import Trie` names a module's attribute: its module's row
            theirs = rank_of(name.rsplit(".", 1)[0], rows)
        assert theirs is not None, f"{path.name}:{line} imports {name}, which is in no layer"
        if theirs < mine:
            upward.append(f"{path.relative_to(ROOT)}:{line} ({rows[mine][0]}) imports {name} ({rows[theirs][0]})")
    assert not upward, "imports upward:\n" + "\n".join(upward)


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: a store module importing core, inside a function, is refused."""
    rows = layers()
    mod = PACKAGE / "store" / "db.py"
    fake = tmp_path / "probe.py"
    fake.write_text("def f():\n    from replay.core.trie import Trie\n    return Trie\n")
    (line, name), = imports_of(fake)
    assert (line, name) == (2, "replay.core.trie.Trie")
    assert rank_of("replay.core.trie", rows) < rank_of(module_name(mod), rows)
