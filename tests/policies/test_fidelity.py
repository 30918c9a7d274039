"""Every family equals its diffusers pipeline on a tiny model (:mod:`tests.policies.fidelity`): the prompt
encodings, the sigma grid, the first step's guided velocity and a short deterministic sample within 1e-5, with the
published scheduler configs (Wan's UniPC included), a negative prompt longer than the prompts and non-square sizes
where the family has them. ``scripts/fidelity_table.py`` prints the same measures as the Models page's table."""

import pytest

from tests.policies.fidelity import MEASURES, measure, published_wan
from tests.policies.fidelity_cases import CASES


@pytest.fixture(scope="module")
def wan_published(wan_dirs, tmp_path_factory):
    return published_wan(wan_dirs, tmp_path_factory.mktemp("wan_published"))


@pytest.mark.parametrize("family", list(CASES))
def test_every_family_equals_its_pipeline(family, request):
    case = CASES[family]
    folders = request.getfixturevalue("wan_published") if case.folder.startswith("wan") else {
        case.folder: request.getfixturevalue(case.folder)}
    measured = measure(case, folders[case.folder])
    assert set(measured) == set(MEASURES)
    assert max(measured.values()) <= 1e-5, measured
