"""Every family equals its diffusers pipeline on a tiny model (:mod:`tests.policies.fidelity`): the prompt
encodings, the sigma grid, the first step's guided velocity and a short deterministic sample within 1e-5, with the
published scheduler configs (Wan's UniPC included), a negative prompt longer than the prompts and non-square sizes
where the family has them. ``scripts/fidelity_table.py`` prints the same measures as the Models page's table."""

from pathlib import Path

import pytest

from tests.policies.fidelity import MEASURES, measure, published_wan
from tests.policies.fidelity_cases import CASES


@pytest.fixture(scope="module")
def wan_published(wan_dirs, tmp_path_factory):
    return published_wan(wan_dirs, tmp_path_factory.mktemp("wan_published"))


@pytest.mark.parametrize("family", list(CASES))
def test_every_family_equals_its_pipeline(family, request):
    case = CASES[family]
    shared = "wan_published" if case.folder.startswith("wan") else "hunyuan15_dirs" \
        if case.folder.startswith("hunyuan15") else None
    folders = request.getfixturevalue(shared) if shared else {case.folder: request.getfixturevalue(case.folder)}
    measured = measure(case, folders[case.folder])
    assert set(measured) == set(MEASURES)
    assert max(measured.values()) <= 1e-5, measured


def test_the_models_pages_table_has_every_family_and_measure():
    """The Models page keeps ``scripts/fidelity_table.py``'s table: a row per case, its four measures within 1e-5."""
    page = (Path(__file__).resolve().parents[2] / "docs/models.md").read_text()
    header = "| family | " + " | ".join(MEASURES) + " |"
    assert header in page
    rows = page.split(header)[1].split("\n\n")[0].strip().splitlines()[1:]
    table = {cells[0]: [float(c) for c in cells[1:]] for cells in
             ([c.strip() for c in row.strip("|").split("|")] for row in rows)}
    assert list(table) == list(CASES)
    assert all(len(values) == len(MEASURES) and max(values) <= 1e-5 for values in table.values()), table
