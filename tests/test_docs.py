"""The repository stands alone: every link of README.md and docs/ resolves to a
file inside it, and every path of the package, its tests and benchmarks they (and
the build files) name exists."""

from __future__ import annotations

import re
from support.paths import ROOT

PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
PACKAGE_PATH = re.compile(r"\b(?:replay|tests|bench)/[\w/]+\.(?:py|pyx|toml)\b")


def test_every_link_resolves_inside_the_repository():
    bad = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+://|mailto:|#", target):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert not bad, bad


def test_every_path_named_exists():
    named = {(f.name, p) for f in [*PAGES, ROOT / "pyproject.toml", ROOT / "setup.py"]
             for p in PACKAGE_PATH.findall(f.read_text())}
    assert len(named) > 10
    assert not sorted((f, p) for f, p in named if not (ROOT / p).exists())
