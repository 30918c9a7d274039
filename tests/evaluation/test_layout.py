"""The evaluation's maths is pure: the statistics use NumPy alone and the signals tensors alone, so both are usable
(and testable) without Lightning, diffusers or a model."""

from tests.test_layout import ROOT, imported_roots

STDLIB = {"__future__", "dataclasses", "itertools", "math", "typing"}


def test_statistics_and_signals_import_no_framework():
    assert imported_roots(ROOT / "flowrl/evaluation/stats.py") - STDLIB == {"numpy"}
    assert imported_roots(ROOT / "flowrl/evaluation/signals.py") - STDLIB == {"torch", "flowrl"}
