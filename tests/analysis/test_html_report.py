"""`replay run --html` (replay/analysis/html.py): one self-contained page beside report.md,
opened in headless Chromium (the system's package; these tests skip without it) to see that
its plots load, its tables sort, and its figures are the Markdown report's — with no prompt
text and nothing fetched from the network."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay import api
from replay.analysis.html import HTML_NAME, render
from replay.cli.main import main
from support.paths import ROOT

SAMPLE = ROOT / "data" / "sample"
CANARY = "CANARY-" + secrets.token_hex(8)
BROWSER = next((b for b in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if b), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (apt-get install chromium)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _plant(obj):
    """The canary at the end of every text of the request (system, messages, tools)."""
    if isinstance(obj, dict):
        return {k: (v + " " + CANARY if k in ("text", "content", "description") and isinstance(v, str) else _plant(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plant(x) for x in obj]
    return obj


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One small report, built once: an agent log of the sample with the canary in every
    prompt, written newest-first (so the report also says a file was not in time order)."""
    d = tmp_path_factory.mktemp("html")
    recs = [json.loads(line) for line in (SAMPLE / "agent-anthropic.jsonl").read_text().splitlines()]
    recs = [dict(r, request=_plant(r["request"])) for r in recs]
    log = d / "agents-newest-first.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in reversed(recs)))
    db = d / "r.duckdb"
    res = CliRunner().invoke(main, ["run", str(log), "--db", str(db), "--out", str(d / "reports"), "--name", "h",
                                    "--html"])
    assert res.exit_code == 0, res.output
    assert CANARY not in res.output
    con = api.open_db(db)  # (the in-process run may still hold it open: same settings)
    stored = con.execute(f"SELECT count(*) FROM request_bodies WHERE contains(body, '{CANARY}')").fetchone()[0]
    con.close()
    assert stored == len(recs)  # the canary really went in
    out = d / "reports" / "h"
    return {"dir": out, "db": db, "md": (out / "report.md").read_text(), "html": (out / HTML_NAME).read_text()}


def _dump_dom(page: Path, query: str, tmp: Path) -> str:
    """The DOM of ``page`` after its scripts ran, as headless Chromium prints it."""
    res = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={tmp}", "--dump-dom", page.resolve().as_uri() + query],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and "<body" in res.stdout, res.stderr[-2000:]
    return res.stdout


@pytest.fixture(scope="module")
def dom(report, tmp_path_factory):
    return _dump_dom(report["dir"] / HTML_NAME, "?sort-test", tmp_path_factory.mktemp("chromium"))


class _Page(HTMLParser):
    """The body's attributes, the tables (rows of cell texts), the text outside scripts and
    styles, and the resource URLs of images, scripts and stylesheets."""

    def __init__(self, page: str):
        super().__init__()
        self.body: dict = {}
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self.resources: list[tuple[str, str]] = []
        self.skip = 0
        self.cell: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag in ("script", "style"):
            self.skip += 1
            if a.get("src"):
                self.resources.append((tag, a["src"]))
        elif tag == "img" or (tag == "link") or (tag in ("source", "iframe", "embed", "object", "video", "audio")):
            for k in ("src", "href", "data", "srcset"):
                if a.get(k):
                    self.resources.append((tag, a[k]))
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip -= 1
        elif tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.skip:
            return
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def _md_tables(md: str) -> list[list[list[str]]]:
    tables, cur = [], None
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue  # the header's rule
            if cur is None:
                cur = []
                tables.append(cur)
            cur.append(cells)
        else:
            cur = None
    return tables


def _numbers(cells) -> Counter:
    return Counter(n for c in cells for n in NUMBER.findall(c))


@needs_browser
def test_the_page_renders_its_plots_and_tables_in_a_headless_browser(report, dom):
    page = _Page(dom)
    images = len(re.findall(r"!\[[^\]]*\]\([^)]+\)", report["md"]))
    tables = len(_md_tables(report["md"]))
    assert images >= 3 and tables >= 3
    assert page.body.get("data-images") == str(images)          # every plot of the Markdown, ...
    assert page.body.get("data-images-loaded") == str(images)   # ... decoded (natural width > 0)
    assert page.body.get("data-sortable-tables") == str(tables)
    assert len(page.tables) == tables


@needs_browser
def test_a_click_on_a_numeric_header_sorts_its_table(report, dom):
    page = _Page(dom)
    assert page.body.get("data-sort-test") == "ok", page.body
    t, col = int(page.body["data-sort-test-table"]), int(page.body["data-sort-test-column"])
    rows = page.tables[t][1:]
    md_rows = _md_tables(report["md"])[t][1:]
    assert sorted(map(tuple, rows)) == sorted(map(tuple, md_rows))  # the same rows, reordered
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def value(cell: str) -> float:
        cell = cell.replace(",", "").removesuffix("%").strip()
        if cell == "inf":
            return float("inf")
        if cell[-1:] in units and cell[:-1].replace(".", "", 1).isdigit():
            return float(cell[:-1]) * units[cell[-1]]
        return float(cell)

    got = [value(r[col]) for r in rows if r[col]]
    assert got == sorted(got) and len(set(got)) > 1  # ascending, on a column with something to sort


@needs_browser
def test_the_page_shows_the_markdown_figures(report, dom):
    page = _Page(dom)
    md_tables = _md_tables(report["md"])
    for md_t, html_t in zip(md_tables, page.tables):  # every number of every table, cell for cell
        assert len(md_t) == len(html_t)
        assert _numbers(c for r in md_t for c in r) == _numbers(c for r in html_t for c in r)
    # and every number of the text (the summary's counts and ratios) is on the page
    prose = "\n".join(line for line in report["md"].splitlines() if not line.startswith(("|", "![")))
    shown = _numbers(["".join(page.text)])
    missing = _numbers([prose]) - shown
    assert not missing, missing
    # the note on the file that was not in time order is there too, by file name
    assert "agents-newest-first.jsonl" in report["md"] and "agents-newest-first.jsonl" in "".join(page.text)


def test_the_page_needs_no_network(report):
    page = _Page(report["html"])
    assert page.resources, "no image at all"
    for tag, url in page.resources:
        assert url.startswith("data:image/png;base64,"), (tag, url[:80])
    assert not re.search(r"<(script|link|img|iframe|source)\b[^>]*(src|href)\s*=\s*[\"']?\s*(https?:)?//",
                         report["html"], re.I)
    assert "@import" not in report["html"] and "url(" not in report["html"]
    # the plots are the report's own files, embedded
    pngs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report["md"])
    assert len(page.resources) == len(pngs) and all((report["dir"] / p).is_file() for p in pngs)


@needs_browser
def test_no_prompt_text_in_the_markdown_the_page_or_what_the_browser_shows(report, dom):
    for name, text in (("report.md", report["md"]), ("report.html", report["html"]), ("DOM", dom)):
        assert CANARY not in text, name
    for p in report["dir"].iterdir():
        assert CANARY.encode() not in p.read_bytes(), p.name


def test_a_report_without_html_leaves_no_earlier_page(report, tmp_path):
    out = tmp_path / "h"
    shutil.copytree(report["dir"], out)
    for f in report["db"].parent.glob(report["db"].name + "*"):  # (the database and any write-ahead log)
        shutil.copy(f, tmp_path / f.name)
    assert (out / HTML_NAME).exists()
    con = api.open_db(tmp_path / report["db"].name)
    grid = api.Grid(ttls=(300.0,), blocks=(512,), min_prefixes=(0,), streams=("tenant",))  # (walks current: no replay)
    api.write_report(con, out, grid)
    con.close()
    assert (out / "report.md").exists() and not (out / HTML_NAME).exists()


def test_raw_html_in_the_markdown_is_escaped_and_only_local_images_are_embedded(tmp_path):
    (tmp_path / "p.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    (tmp_path.parent / "outside.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    md = "\n".join([
        "# Title <b>", "",
        "<details><summary>The whole sweep</summary>", "",
        "| stream_key | hit % |", "|---|---|", "| tenant:<script>alert(1)</script> | 12.5 |", "",
        "</details>", "",
        "![here](p.png) ![remote](https://example.com/x.png) ![up](../outside.png) ![gone](nope.png)",
        "<img src=x onerror=alert(2)>"])
    page = render(md, tmp_path)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page
    assert "<details><summary>The whole sweep</summary>" in page and "</details>" in page
    assert '<table class="sortable">' in page
    assert page.count("data:image/png;base64,") == 1  # p.png; not the URL, not outside the folder, not missing
    assert "example.com" not in page and page.count("image not embedded") == 3
    assert "<title>Title &lt;b&gt;</title>" in page


def test_the_page_is_the_final_markdown_rendered(report):
    assert report["html"] == render(report["md"], report["dir"])


def test_a_report_killed_while_its_page_is_written_leaves_neither_and_a_rerun_both(report, tmp_path):
    for f in report["db"].parent.glob(report["db"].name + "*"):
        shutil.copy(f, tmp_path / f.name)
    out = tmp_path / "k"
    code = ("import sys; from replay import api; con = api.open_db(sys.argv[1]); "
            "api.write_report(con, sys.argv[2], api.Grid(ttls=(300.0,), blocks=(512,), min_prefixes=(0,), "
            "streams=('tenant',)), html=True)")
    args = [sys.executable, "-c", code, str(tmp_path / report["db"].name), str(out)]
    killed = subprocess.run(args, env=dict(os.environ, REPLAY_FAILPOINT="report.html"), capture_output=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (out / "report.md").exists() and not (out / HTML_NAME).exists()
    con = api.open_db(tmp_path / report["db"].name)  # run again (here: the failpoint is unset)
    api.write_report(con, out, api.Grid(ttls=(300.0,), blocks=(512,), min_prefixes=(0,), streams=("tenant",)),
                     html=True)
    con.close()
    assert (out / HTML_NAME).read_text() == render((out / "report.md").read_text(), out)
    assert not list(out.glob(".*.partial"))
