"""Getting started's table of slow tests names every test the default run leaves out (``@pytest.mark.slow`` on the
test, on one of its parameters or on its module), by name or by its file, with what it adds and the default test of
the same feature: a test moved to ``-m slow`` without a row fails here."""

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PAGE = (TESTS.parent / "docs/getting-started.md").read_text()


def slow_tests() -> list[tuple[str, str]]:
    """``(file relative to tests/, test name)`` of every test function marked slow, read from the source."""
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        module_slow = any(isinstance(node, ast.Assign) and "mark.slow" in ast.get_source_segment(source, node.value)
                          and any(getattr(t, "id", "") == "pytestmark" for t in node.targets) for node in tree.body)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and (module_slow or any(
                    "mark.slow" in ast.get_source_segment(source, d) for d in node.decorator_list)):
                found.append((path.relative_to(TESTS).as_posix(), node.name))
    return found


def test_every_slow_test_has_a_row_in_the_slow_table():
    first_cells = [line.split(" | ")[0] for line in PAGE.splitlines() if line.startswith("| `")]
    listed = [entry for cell in first_cells for entry in re.findall(r"`([^`]+)`", cell)]
    slow = slow_tests()
    assert len(slow) > 10  # the reader above still finds them
    missing = [f"{file}::{name}" for file, name in slow
               if not any(entry == file or entry.startswith(f"{file}::{name}") for entry in listed)]
    assert not missing, f"slow tests without a row in docs/getting-started.md's slow table: {missing}"
