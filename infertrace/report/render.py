"""Renderers: the report document as `table` (rich tables and wrapped text for a terminal; `renderables` for
printing in colour), `markdown`, `html` (one self-contained page) or `json` (the document itself, schema
`infertrace.report/2`)."""

from __future__ import annotations

import html
import json
import textwrap
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from infertrace.report.layout import Block, Heading, Paragraph, cell, layout
from infertrace.terminal import SEVERITY_STYLES, is_number, plain_text, rich_table

FORMATS = ("table", "markdown", "json", "html")
MARKS = {"critical": "[CRITICAL]", "warning": "[WARNING]", "info": "[info]", "ok": "[ok]"}


def render(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    blocks = layout(doc)
    if fmt == "table":
        return render_text(blocks)
    if fmt == "markdown":
        return render_markdown(blocks)
    if fmt == "html":
        return render_html(blocks)
    raise ValueError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")


def renderables(blocks: list[Block], width: int = 110) -> list[RenderableType]:
    """The blocks as rich renderables: headings underlined, paragraphs wrapped at `width` with their severity
    marked (and coloured on a terminal), tables as rich tables (numbers right-aligned, rows coloured by
    severity)."""
    out: list[RenderableType] = []
    for b in blocks:
        if isinstance(b, Heading):
            title = b.text.upper() if b.level == 1 else b.text
            out += [Text(""), Text(title, style="bold"), Text(("=" if b.level == 1 else "-") * len(b.text))]
        elif isinstance(b, Paragraph):
            text = f"{MARKS[b.severity]} {b.text}" if b.severity else b.text
            paragraph = Text("\n".join(textwrap.wrap(text, width, subsequent_indent="  ")))
            if b.severity:
                paragraph.stylize(SEVERITY_STYLES[b.severity], 0, len(MARKS[b.severity]))
            out.append(paragraph)
        elif b.rows:
            numeric = [all(is_number(row[i]) for row in b.rows if row[i] is not None)
                       and any(row[i] is not None for row in b.rows) for i in range(len(b.columns))]
            styles = [SEVERITY_STYLES.get(s or "") if s in ("critical", "warning") else None for s in b.severities]
            out.append(rich_table(b.columns, ([cell(v) for v in row] for row in b.rows), numeric, styles))
        else:
            out.append(Text("(none)"))
    while out and isinstance(out[0], Text) and not out[0].plain:
        out.pop(0)
    return out


def render_text(blocks: list[Block]) -> str:
    return plain_text(renderables(blocks))


def render_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Paragraph):
            text = b.text.replace("|", "\\|")
            out += [f"**{b.severity.upper()}** {text}" if b.severity else text, ""]
        elif b.rows:
            out.append("| " + " | ".join(b.columns) + " |")
            out.append("|" + "|".join("---" for _ in b.columns) + "|")
            out += ["| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |" for row in b.rows]
            out.append("")
        else:
            out += ["(none)", ""]
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1d2433; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #d0d5dd; padding: 0.25rem 0.5rem; text-align: left; }
th { background: #f2f4f7; }
.sev { font-weight: 600; padding: 0 0.3rem; border-radius: 3px; }
.critical { background: #fde2e1; } .warning { background: #fef3c7; } .info { background: #e0ecff; }
.ok { background: #dcfce7; }
"""


def render_html(blocks: list[Block]) -> str:
    esc = html.escape
    title = next((b.text for b in blocks if isinstance(b, Heading)), "infertrace report")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{esc(title)}</title>",
           f"<style>{_CSS}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{esc(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            mark = f'<span class="sev {b.severity}">{esc(b.severity)}</span> ' if b.severity else ""
            out.append(f"<p>{mark}{esc(b.text)}</p>")
        elif b.rows:
            out.append("<table><thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in b.columns) + "</tr></thead><tbody>")
            for i, row in enumerate(b.rows):
                sev = b.severities[i] if i < len(b.severities) else None
                attr = f' class="{sev}"' if sev else ""
                out.append(f"<tr{attr}>" + "".join(f"<td>{esc(cell(v))}</td>" for v in row) + "</tr>")
            out.append("</tbody></table>")
        else:
            out.append("<p>(none)</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
