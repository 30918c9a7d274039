"""A griffe extension for the API reference: flowrl's docstrings are written for doctest and carry Sphinx roles;
this renders each ``>>>`` example with its output as a Python console block and each role (``:class:`~a.B```) as
inline code, so Markdown neither joins the examples into a paragraph nor reads their lists as links."""

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj|exc):`~?([^`]+)`")


def fence_doctests(text: str) -> str:
    """Wraps each run of ``>>>`` / ``...`` lines and the output lines after it (up to a blank line) in a fence."""
    out, block = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith((">>>", "...")) or (block and stripped):
            block.append(line)
            continue
        if block:
            out += ["```pycon", *block, "```"]
            block = []
        out.append(line)
    if block:
        out += ["```pycon", *block, "```"]
    return "\n".join(out)


def markdown(text: str) -> str:
    return fence_doctests(ROLE.sub(lambda m: f"``{m[1].rpartition('.')[2] if m[0].count('~') else m[1]}``", text))


class Docstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
