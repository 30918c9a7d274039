"""Docs are executed: the site builds with ``mkdocs build --strict`` (a broken link or anchor, a nav entry without its
page, an API reference to a name that no longer exists all fail), the healthy-run table is what the script computes
from the kept runs, and the README keeps the install and test commands that ``.ci/run`` runs."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings_handlers")),
                    reason="the docs extra is not installed (pip install -e '.[docs]')")
def test_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for page in ("index.html", "getting-started/index.html", "methods/flow-grpo/index.html",
                 "api/advantages/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site/api/methods/index.html").read_text()
    assert 'id="flowrl.methods.BaseModule.credit"' in api  # docstrings rendered, not just headings
    pages = {p: p.read_text() for p in (tmp_path / "site").rglob("*.html")}
    # reST's "text::" before a code block is Markdown's plain colon: mkdocstrings would print the second colon
    assert [p.name for p, html in pages.items() if "::</p>" in html] == []


def test_healthy_run_table_is_the_scripts_output():
    data = ROOT / "docs/data/quickstart"
    files = [data / "metrics.csv", data / "metrics_seed1.csv", data / "metrics_seed2.csv"]
    out = subprocess.run([sys.executable, str(ROOT / "scripts/metric_ranges.py"), *map(str, files)],
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert out.count("\n") > 10 and out in (ROOT / "docs/healthy-run.md").read_text()


def test_readme_keeps_the_ci_commands_and_links_to_existing_pages():
    ci = (ROOT / ".ci/run").read_text()
    cpu = ['pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu', 'pip install -e ".[dev]"']
    for command in (*cpu, "python -m pytest"):  # CI installs exactly as the README's CPU lines say
        assert command in README and command in ci
    assert 'pip install "torch==2.13.0" -e ".[dev]"' in README  # and the GPU line stays labelled beside them
    assert "python -m flowrl fit --config configs/quickstart.yaml" in README
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = re.findall(r"\]\((docs/[^)#]+\.md)", README)
    assert pages, "the front page links to the docs pages"
    for page in pages:
        assert (ROOT / page).is_file(), page
        assert page.removeprefix("docs/") in nav, page
    assert len(README.splitlines()) <= 210


def test_method_pages_equations_fit_the_page():
    """The equation blocks of the method pages fit a wide screen's content column (110 monospace columns with
    ``docs/stylesheets/extra.css``) without horizontal scrolling."""
    long = []
    for page in sorted((ROOT / "docs/methods").glob("*.md")):
        inside = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside = not inside
            elif inside and len(line) > 110:
                long.append(f"{page.name}:{number} ({len(line)} columns)")
    assert long == []
