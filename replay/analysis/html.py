"""The report as one self-contained HTML page (``report.html`` beside ``report.md``).

The Markdown is rendered by markdown-it-py (CommonMark with tables); its PNG
plots are embedded as base64 ``data:`` URIs, and a small inline script makes
every table sortable (click a header; numbers, percentages and TTLs such as
``5m``/``1h``/``inf`` sort by value). Nothing is fetched from the network: no
CDN, no web font, no external image, script or style, so the file opens as it
is, anywhere, and can be mailed alone.

It is made from the report's own Markdown and nothing else, so it holds exactly
the report's figures and, like it, never any prompt text. Raw HTML in the
Markdown is escaped (stream keys and model names come from the logs), except
the report's ``<details><summary>…</summary>`` / ``</details>`` lines, which
become the real elements.

For the browser test, the page's script records on ``<body>`` what rendered:
``data-images`` / ``data-images-loaded`` (images with a natural width) and
``data-sortable-tables``; opened with ``?sort-test`` it clicks the first
numeric header of the first table that has one and records the outcome
(``data-sort-test``: ``ok`` or ``failed``, with the table and column).
"""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path

from replay.store.failpoints import failpoint

HTML_NAME = "report.html"

_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".svg": "image/svg+xml", ".webp": "image/webp"}

_DETAILS_OPEN = re.compile(r"<p>&lt;details&gt;&lt;summary&gt;(.*?)&lt;/summary&gt;</p>")
_DETAILS_CLOSE = "<p>&lt;/details&gt;</p>"

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; line-height: 1.45;
       max-width: 70rem; margin: 1.5rem auto; padding: 0 1rem; color: #1b1f24; }
h1, h2, h3 { line-height: 1.2; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; margin-top: 2rem; }
img { max-width: 100%; height: auto; }
code { background: #f3f4f6; padding: 0 .25em; border-radius: 3px; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .9rem; }
th, td { border: 1px solid #d0d7de; padding: .25rem .55rem; }
tbody tr:nth-child(even) { background: #f6f8fa; }
table.sortable th { cursor: pointer; user-select: none; background: #eef1f4; white-space: nowrap; }
table.sortable th::after { content: " \\2195"; color: #8c959f; font-size: .8em; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; color: #1b1f24; }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; color: #1b1f24; }
details { margin: .8rem 0; }
summary { cursor: pointer; font-weight: 600; }
.missing-image { color: #8c959f; font-style: italic; }
"""

# Sorting: a column is numeric when every non-empty cell reads as a number ("1,234",
# "48.4", "48.4 %"), a duration ("30s", "5m", "1h", "2d") or "inf"; it is then sorted
# by value, empty cells last; else as text (locale-aware, digits by value). A click
# sorts ascending, the next one descending; rows that tie keep their order.
_JS = r"""
(function () {
  "use strict";
  var UNIT = {ms: 0.001, s: 1, m: 60, h: 3600, d: 86400};
  function value(text) {
    var t = text.trim().replace(/,/g, "").replace(/\s*%$/, "");
    if (t === "") return null;
    if (/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(t)) return parseFloat(t);
    if (/^(inf|\u221e)$/i.test(t)) return Infinity;
    var m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(t);
    if (m) return parseFloat(m[1]) * UNIT[m[2]];
    return NaN;
  }
  function isNumeric(rows, col) {
    var seen = 0;
    for (var i = 0; i < rows.length; i++) {
      var c = rows[i].cells[col];
      var v = c ? value(c.textContent) : null;
      if (v === null) continue;
      if (isNaN(v)) return false;
      seen++;
    }
    return seen > 0;
  }
  function bodyRows(table) {
    var body = table.tBodies[0];
    return body ? Array.prototype.slice.call(body.rows) : [];
  }
  function sortBy(table, col, descending) {
    var rows = bodyRows(table);
    var numeric = isNumeric(rows, col);
    var keyed = rows.map(function (r, i) {
      var c = r.cells[col], t = c ? c.textContent.trim() : "";
      return {row: r, i: i, t: t, v: numeric ? value(t) : null};
    });
    keyed.sort(function (a, b) {
      var d;
      if (numeric) {
        if (a.v === null || b.v === null) return (a.v === null) - (b.v === null) || a.i - b.i;
        d = a.v < b.v ? -1 : a.v > b.v ? 1 : 0;
      } else {
        d = a.t.localeCompare(b.t, undefined, {numeric: true});
      }
      return (descending ? -d : d) || a.i - b.i;
    });
    var body = table.tBodies[0];
    keyed.forEach(function (k) { body.appendChild(k.row); });
    var heads = table.tHead ? table.tHead.rows[0].cells : [];
    for (var h = 0; h < heads.length; h++) {
      if (h === col) heads[h].setAttribute("aria-sort", descending ? "descending" : "ascending");
      else heads[h].removeAttribute("aria-sort");
    }
    return numeric;
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    if (!table.tHead) return;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.setAttribute("title", "sort by this column");
      th.addEventListener("click", function () {
        sortBy(table, col, th.getAttribute("aria-sort") === "ascending");
      });
    });
  });
  function sortTest(body) {
    for (var t = 0; t < tables.length; t++) {
      var table = tables[t], rows = bodyRows(table);
      if (!table.tHead || rows.length < 2) continue;
      var heads = table.tHead.rows[0].cells;
      for (var col = 0; col < heads.length; col++) {
        if (!isNumeric(rows, col)) continue;
        heads[col].click();
        var vals = bodyRows(table).map(function (r) { return value(r.cells[col].textContent); })
                                  .filter(function (v) { return v !== null; });
        var ok = heads[col].getAttribute("aria-sort") === "ascending";
        for (var i = 1; i < vals.length; i++) if (vals[i - 1] > vals[i]) ok = false;
        body.setAttribute("data-sort-test", ok ? "ok" : "failed");
        body.setAttribute("data-sort-test-table", String(t));
        body.setAttribute("data-sort-test-column", String(col));
        return;
      }
    }
    body.setAttribute("data-sort-test", "no numeric column");
  }
  window.addEventListener("load", function () {
    var body = document.body, imgs = document.images, loaded = 0;
    for (var i = 0; i < imgs.length; i++) if (imgs[i].complete && imgs[i].naturalWidth > 0) loaded++;
    body.setAttribute("data-images", String(imgs.length));
    body.setAttribute("data-images-loaded", String(loaded));
    body.setAttribute("data-sortable-tables", String(tables.length));
    if (/(^\?|&)sort-test(=|&|$)/.test(window.location.search)) sortTest(body);
  });
})();
"""


def _parser():
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")

    def image(self, tokens, idx, options, env):
        tok = tokens[idx]
        src = _data_uri(env["base"], str(tok.attrGet("src") or ""))
        if src is None:  # not a file of the report's folder: not fetched, only named
            alt = self.renderInlineAsText(tok.children or [], options, env)
            return f'<span class="missing-image">[image not embedded: {html.escape(alt)}]</span>'
        tok.attrSet("src", src)
        return self.image(tokens, idx, options, env)

    md.add_render_rule("image", image)
    return md


def _data_uri(base: Path, src: str) -> str | None:
    """A plot of the report's folder as a ``data:`` URI; None for anything else (a URL,
    a path leaving the folder, a missing file, a type that is no image)."""
    if not src or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", src) or src.startswith(("/", "\\")):
        return None
    root = base.resolve()
    path = (root / src).resolve()
    mime = _MIME.get(path.suffix.lower())
    if mime is None or root not in path.parents or not path.is_file():
        return None
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def render(markdown: str, base: str | Path) -> str:
    """The page for ``markdown``, whose images are read from the folder ``base``."""
    md = _parser()
    env = {"base": Path(base)}
    tokens = md.parse(markdown, env)
    for tok in tokens:
        if tok.type == "table_open":
            tok.attrSet("class", "sortable")
    body = md.renderer.render(tokens, md.options, env)
    opened = len(_DETAILS_OPEN.findall(body))
    if opened and opened == body.count(_DETAILS_CLOSE):  # only whole pairs become elements
        body = _DETAILS_OPEN.sub(r"<details><summary>\1</summary>", body).replace(_DETAILS_CLOSE, "</details>")
    title = next((t.content for t, h in zip(tokens[1:], tokens) if h.type == "heading_open" and h.tag == "h1"),
                 "Report")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n{body}"
            f"<script>{_JS}</script>\n</body>\n</html>\n")


def write_html(markdown: str, out_dir: str | Path, name: str = HTML_NAME) -> Path:
    """Write the page for ``markdown`` (the report's text, its plots in ``out_dir``) to
    ``out_dir/name``, whole or not at all."""
    out = Path(out_dir)
    path = out / name
    tmp = path.with_name(f".{name}.partial")
    tmp.write_text(render(markdown, out), encoding="utf-8")
    failpoint("report.html")
    os.replace(tmp, path)
    return path
