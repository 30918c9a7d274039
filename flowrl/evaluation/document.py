"""A report as a list of blocks (headings, paragraphs, lists, tables, figures), written as Markdown and as one
offline HTML file with its figures embedded, so the two never say different things.

Text may use three inline marks of Markdown: ``**bold**``, ```code``` and ``[text](link)``; the HTML writer
translates them and escapes everything else.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Union


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    path: str  # relative to the report's folder
    alt: str


Block = Union[Heading, Paragraph, Bullets, Table, Figure]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    """The report as Markdown.

    >>> print(to_markdown([Heading("Scores", 1), Table(["model", "mean"], [["base", "0.47"]])]))
    # Scores
    <BLANKLINE>
    | model | mean |
    | --- | --- |
    | base | 0.47 |
    <BLANKLINE>
    """
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Bullets):
            parts.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            lines = [block.header, ["---"] * len(block.header), *block.rows]
            parts.append("\n".join("| " + " | ".join(_cell(c) for c in line) + " |" for line in lines))
        elif isinstance(block, Figure):
            parts.append(f"![{block.alt}]({block.path})")
    return "\n\n".join(parts) + "\n"


def inline_html(text: str) -> str:
    """Escaped text with the inline marks as HTML.

    >>> inline_html("**flag**: `a<b` in [docs](https://x.org/?a=1&b=2)")
    '<strong>flag</strong>: <code>a&lt;b</code> in <a href="https://x.org/?a=1&amp;b=2">docs</a>'
    """
    text = html.escape(text, quote=True)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    text = re.sub(r"`(.+?)`", r"<code>\1</code>", text)
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', text)


STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3}td{text-align:right}td:first-child,td:nth-child(2){text-align:left}
img{max-width:100%;image-rendering:pixelated}code{background:#f3f3f3;padding:0 3px}"""


def to_html(blocks: list[Block], folder: Path, title: str) -> str:
    """The report as one HTML page that needs no network and no other file: figures are embedded (``folder`` is
    where their relative paths start)."""
    body = []
    for block in blocks:
        if isinstance(block, Heading):
            body.append(f"<h{block.level}>{inline_html(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            body.append(f"<p>{inline_html(block.text)}</p>")
        elif isinstance(block, Bullets):
            body.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{inline_html(h)}</th>" for h in block.header)
            rows = "".join("<tr>" + "".join(f"<td>{inline_html(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(block, Figure):
            data = base64.b64encode((folder / block.path).read_bytes()).decode("ascii")
            body.append(f'<p><img src="data:image/png;base64,{data}" alt="{html.escape(block.alt)}"></p>')
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")
