"""pytest-xdist's ``--dist loadgroup`` keeps each ``xdist_group`` on one worker only while the group's suffix reaches
the test's id (pytest 9.2 with pytest-xdist 3.8 dropped it silently, and CI built every group's fixture twice): the
run's own groups are checked here (``tests.conftest.untagged_groups``), so such a pairing fails the suite instead of
only slowing it."""

import pytest

from tests.conftest import untagged_groups


class Item:
    def __init__(self, nodeid: str, group: str | None):
        self.nodeid, self.group = nodeid, group

    def iter_markers(self, name):
        return iter([pytest.mark.xdist_group(self.group).mark] if self.group and name == "xdist_group" else [])


def test_a_grouped_test_without_its_suffix_is_named():
    items = [Item("a.py::t@server", "server"), Item("b.py::t", "server"), Item("c.py::t", None)]
    assert untagged_groups(items) == ["b.py::t"]


def test_this_run_keeps_its_groups(request):
    # under -n 2 --dist loadgroup (the default run) every grouped test of the session carries its suffix
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not a pytest-xdist worker with --dist loadgroup")
    grouped = [item for item in request.session.items if any(item.iter_markers("xdist_group"))]
    if not grouped:
        pytest.skip("no grouped test in this session")
    import xdist

    untagged = untagged_groups(request.session.items)
    assert untagged == [], (
        f"--dist loadgroup did not group {len(untagged)} tests under pytest {pytest.__version__} with pytest-xdist "
        f"{xdist.__version__}: each group's fixture (the 2-process fits, the reward server) is built once per worker; "
        "install the dev extra's pytest pin (pip install -e \".[dev]\")")
