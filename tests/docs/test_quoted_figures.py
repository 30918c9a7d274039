"""Figures other pages quote from docs/results.md are the kept runs': a paragraph of the README or of a docs page that
links to a section of the Results page may quote only figures that the section's tables hold, as
``scripts/plot_rewards.py --results`` makes them from docs/data/ (``results_tables.blocks``). A rerun that changes
the data, or a figure copied wrong, fails here until the prose says what the data says."""

import re
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
RESULTS = (ROOT / "docs/results.md").read_text()
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "results.md")
LINK = re.compile(r"\]\((?:[\w./-]*/)?results\.md#([\w-]+)\)")
HEADING = re.compile(r"^(#+) (.+)$", re.M)


@pytest.fixture(scope="module")
def made(tables):
    return tables.blocks()


def sections(page: str) -> dict[str, str]:
    """Each heading's anchor (MkDocs' slug) and its text down to the next heading of its level or above."""
    heads = list(HEADING.finditer(page))
    out = {}
    for i, head in enumerate(heads):
        end = next((h.start() for h in heads[i + 1:] if len(h[1]) <= len(head[1])), len(page))
        out[slugify(head[2], "-")] = page[head.start():end]
    return out


def quoted(text: str) -> list[tuple[set[str], str]]:
    """``(anchors it links, paragraph)`` of every paragraph of ``text`` that links to a Results section, its code
    (fenced blocks, inline spans) left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [(set(LINK.findall(p)), re.sub(r"`[^`]*`", "", p)) for p in re.split(r"\n\s*\n", text) if LINK.search(p)]


def problems(name: str, text: str, made: dict[str, str], tables) -> list[str]:
    held = sections(RESULTS)
    out = []
    for anchors, paragraph in quoted(text):
        missing = anchors - held.keys()
        out += [f"{name} links results.md#{a}, which is no heading of the page" for a in sorted(missing)]
        numbers = tables.figures("\n".join(made.get(n, "") for a in anchors - missing
                                           for n, _ in tables.BLOCK.findall(held[a])))
        out += [f"{name} quotes {f!r} beside its link to results.md#{', #'.join(sorted(anchors))}, "
                f"which none of that section's tables holds"
                for f in sorted(tables.figures(paragraph, tables.FIGURE) - numbers)]
    return out


def test_every_figure_quoted_beside_a_results_link_is_in_its_sections_tables(made, tables):
    found = [p for page in PAGES for p in problems(str(page.relative_to(ROOT)), page.read_text(), made, tables)]
    assert found == []


def test_the_audited_figures_are_checked(tables):
    """The figures issue 24's audit found copied by hand stand in paragraphs this test reads, so it cannot pass by
    reading none of them."""
    # keyed by path: docs/data/*/README.md share the name of the repository's README
    checked = {str(page.relative_to(ROOT)): set().union(*[tables.figures(p, tables.FIGURE)
                                                          for _, p in quoted(page.read_text())]) for page in PAGES}
    assert {"0.547", "-0.013 +- 0.016", "50.4", "8,064"} <= checked["docs/methods/tempflow-grpo.md"]
    assert {"157", "108", "15,912", "0.540"} <= checked["docs/methods/tree-rpo.md"]
    assert {"0.549", "0.004 +- 0.008", "-0.013 +- 0.016", "0.011 +- 0.010"} <= checked["docs/methods/tree-rollouts.md"]
    assert "0.741 +- 0.032" in checked["README.md"]


def test_a_figure_copied_wrong_fails(made, tables):
    page = (ROOT / "docs/methods/tempflow-grpo.md").read_text()
    assert problems("p", page, made, tables) == []
    for before, after in [("(0.547 against 0.536", "(0.548 against 0.536"), ("0.522, -0.013", "0.522, -0.012"),
                          ("50.4 %", "50.5 %")]:
        assert page.count(before) == 1, before
        assert problems("p", page.replace(before, after), made, tables), before
    assert problems("p", "See [Results](../results.md#no-such-section).", made, tables) == [
        "p links results.md#no-such-section, which is no heading of the page"]
