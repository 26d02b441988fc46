"""The page skeleton shared by run and sweep reports: one self-contained HTML document.

* **Self-contained.** CSS and the sorting script are inline; plots are ``data:``
  URIs. A Content-Security-Policy meta tag (``default-src 'none'``, images only from
  ``data:``) makes the browser refuse any request the page might still try.
* **Escaped.** Every string that comes from the input (spec and op names, workload
  labels, error messages) goes through :func:`esc` (``html.escape`` with quotes), in
  text and in attributes alike. Numbers are formatted here, never taken as text.
* **Sortable tables.** :func:`table` writes a ``<table class="sortable">`` whose
  numeric cells carry their raw value in ``data-v``; the script sorts the body rows
  by a clicked header (click again: reverse) and marks it with ``aria-sort``. Without
  JavaScript the table is readable in the order the page wrote it.
* **Phone width.** ``meta viewport``; tables scroll horizontally inside a
  ``div.scroll``; plots are at most the page's width (a click enlarges one inside its
  scrolling box); long names wrap.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["esc", "fmt", "Col", "table", "figures", "page", "plot", "section"]

_CSS = """
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1180px;padding:12px;color:#1b1f24;background:#fff;overflow-wrap:anywhere}
h1{font-size:1.35em;margin:.3em 0}h2{font-size:1.15em;margin:1.4em 0 .4em;
border-bottom:1px solid #d0d7de;padding-bottom:.2em}h3{font-size:1em;margin:1em 0 .3em}
.muted{color:#57606a;font-size:.9em}
dl.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(165px,1fr));gap:8px;margin:0}
dl.figs div{border:1px solid #d0d7de;border-radius:6px;padding:6px 8px;min-width:0}
dl.figs dt{font-size:.8em;color:#57606a}dl.figs dd{margin:0;font-weight:600}
.scroll{overflow-x:auto;max-width:100%;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;font-size:.86em;margin:.3em 0;overflow-wrap:normal}
th,td{border:1px solid #d0d7de;padding:3px 6px;vertical-align:top;white-space:nowrap}
td.w{white-space:normal;min-width:14em;max-width:40em;overflow-wrap:anywhere}
th{background:#f6f8fa;text-align:left;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:#fafbfc}
img.plot{max-width:100%;height:auto;display:block;margin:.4em 0;cursor:zoom-in}
img.plot.zoom{max-width:none;width:1100px;cursor:zoom-out}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f8fa;padding:8px;
border-radius:6px;font-size:.82em;max-width:100%}
.rec{border:1px solid #d0d7de;border-radius:6px;padding:6px 10px;margin:.6em 0}
.rec h3{margin:.2em 0}.tag{display:inline-block;border-radius:4px;padding:0 5px;
font-size:.8em;background:#ddf4ff}.tag.CRITICAL{background:#ffd8d3}
.tag.HIGH{background:#fff1c5}.err{color:#a40e26}
"""

_JS = """
(function(){
function val(c,num){var v=c.getAttribute('data-v');if(v===null)v=c.textContent;
if(!num)return v.toLowerCase();var x=parseFloat(v);return isNaN(x)?null:x;}
function sortBy(t,th,i){var tb=t.tBodies[0],rows=Array.prototype.slice.call(tb.rows);
var num=th.getAttribute('data-type')==='num';
var dir=th.getAttribute('aria-sort')==='ascending'?-1:1;
rows.sort(function(a,b){var x=val(a.cells[i],num),y=val(b.cells[i],num);
if(x===null&&y===null)return a.getAttribute('data-i')-b.getAttribute('data-i');
if(x===null)return 1;if(y===null)return -1;
var c=x<y?-1:x>y?1:0;return c?dir*c:a.getAttribute('data-i')-b.getAttribute('data-i');});
rows.forEach(function(r){tb.appendChild(r);});
Array.prototype.forEach.call(t.tHead.rows[0].cells,function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',dir===1?'ascending':'descending');}
Array.prototype.forEach.call(document.querySelectorAll('img.plot'),function(im){
im.addEventListener('click',function(){im.classList.toggle('zoom');});});
Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),function(t){
Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){th.tabIndex=0;
th.title='sort by this column';
th.addEventListener('click',function(){sortBy(t,th,i);});
th.addEventListener('keydown',function(e){if(e.key==='Enter'||e.key===' '){
e.preventDefault();sortBy(t,th,i);}});});});
})();
"""

_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    "script-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
)


def esc(x: Any) -> str:
    """``x`` as text safe in HTML content and in quoted attributes."""
    return html.escape(str(x), quote=True)


def fmt(v: Any, digits: int = 3) -> str:
    """A number for people: floats to ``digits`` significant digits (trailing zeros
    kept, so ``1.000`` and ``0.7500`` read alike), whole above 1000 (``1,234``);
    integers with separators; ``-`` for ``None`` and NaN."""
    if v is None or isinstance(v, bool):
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 1:
            return f"{v:.{max(0, digits - len(str(int(a))))}f}" if digits > 1 else f"{v:.0f}"
        return f"{v:#.{digits}g}"
    return str(v)


def _raw(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return ""
    if isinstance(v, float) and not math.isfinite(v):
        return ""
    return repr(v) if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Col:
    """A table column: header ``label``, ``key`` into each row dict, ``num`` (sorted
    as numbers, right-aligned, raw value in ``data-v``), ``digits`` shown, ``wrap``
    (long text that may wrap)."""

    label: str
    key: str
    num: bool = False
    digits: int = 3
    wrap: bool = False


def table(
    cols: Sequence[Col],
    rows: Sequence[dict[str, Any]],
    *,
    table_id: str,
    sortable: bool = True,
    caption: str | None = None,
) -> str:
    """A table (in a horizontally scrolling ``div``) of ``rows`` (dicts keyed by
    ``Col.key``; ``wrap`` columns wrap long text, the others stay on one line). Each ``tr`` has ``data-i`` (its position as written); numeric cells
    have ``data-v`` (the exact value, ``repr`` of a float) and the formatted text."""
    num = ' data-type="num"'
    head = "".join(
        f'<th scope="col" data-key="{esc(c.key)}"{num if c.num else ""}>{esc(c.label)}</th>'
        for c in cols
    )
    body = []
    for i, r in enumerate(rows):
        cells = []
        for c in cols:
            v = r.get(c.key)
            if c.num:
                cells.append(f'<td class="n" data-v="{esc(_raw(v))}">{esc(fmt(v, c.digits))}</td>')
            else:
                cls = ' class="w"' if c.wrap else ""
                cells.append(f"<td{cls}>{esc('' if v is None else v)}</td>")
        body.append(f'<tr data-i="{i}">{"".join(cells)}</tr>')
    cls = ' class="sortable"' if sortable else ""
    cap = f'<caption class="muted">{esc(caption)}</caption>' if caption else ""
    return (
        f'<div class="scroll"><table id="{esc(table_id)}"{cls}>{cap}<thead><tr>{head}</tr>'
        f"</thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def figures(items: Sequence[tuple[str, str, Any, str]]) -> str:
    """A grid of key figures: (id, label, value, shown text). ``dd`` has
    ``id="fig-<id>"`` and the exact value in ``data-value``."""
    out = []
    for key, label, value, text in items:
        out.append(
            f'<div><dt>{esc(label)}</dt><dd id="fig-{esc(key)}" '
            f'data-value="{esc(_raw(value))}">{esc(text)}</dd></div>'
        )
    return f'<dl class="figs">{"".join(out)}</dl>'


def plot(uri: str, alt: str, img_id: str) -> str:
    """A plot (``uri`` a ``data:`` URI) at most the page's width, in a box that scrolls
    sideways; a click shows it at full size (and back)."""
    return (
        f'<div class="scroll"><img class="plot" id="{esc(img_id)}" src="{esc(uri)}" '
        f'alt="{esc(alt)}" title="click to enlarge"></div>'
    )


def section(sec_id: str, title: str, body: str) -> str:
    return f'<section id="{esc(sec_id)}"><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, subtitle: str, sections: Sequence[str], *, kind: str) -> str:
    """The whole document; ``kind`` (``run``, ``profile``, ``sweep``) goes to
    ``<body data-kind>``. Sections are trusted HTML made by this package."""
    script = f"<script>{_JS}</script>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="generator" content="wia-hw report">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f'<body data-kind="{esc(kind)}"><header><h1>{esc(title)}</h1>'
        f'<p class="muted">{esc(subtitle)}</p>'
        '<noscript><p class="muted">Tables are shown in the order written; enable '
        "JavaScript to sort them by a column.</p></noscript></header>"
        f"<main>{''.join(sections)}</main>{script}</body></html>\n"
    )
