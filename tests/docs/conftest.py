"""The docs tests' shared fixture: ``scripts/results_tables.py``, which prints docs/results.md's tables from
docs/data/ (imported from scripts/, where it imports plot_rewards beside it)."""

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def tables():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import results_tables

        yield results_tables
    finally:
        sys.path.remove(str(SCRIPTS))
