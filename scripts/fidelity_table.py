"""The closing table of pipeline fidelity: for every family, the largest absolute difference between flowrl's
adapter and the plain diffusers pipeline on the tests' tiny random-weight folders, for the prompt encodings, the
sigma grid, the first step's guided velocity and a short deterministic sample (``tests/policies/fidelity.py``; the
default suite's ``tests/policies/test_fidelity.py`` holds each within 1e-5).

    OMP_NUM_THREADS=1 python scripts/fidelity_table.py [--steps 3] [--family NAME ...]

Prints a Markdown table with the machine and the torch, diffusers and transformers versions (the Models page keeps
its output).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' pipeline builders


def table(rows: dict[str, dict[str, float]], measures: tuple[str, ...]) -> str:
    """A Markdown table: a row per family, a column per measure, in scientific notation (0 is exact).

    >>> print(table({"SD3": {"encode": 0.0, "sample": 1.5e-7}}, ("encode", "sample")))
    | family | encode | sample |
    |---|---|---|
    | SD3 | 0 | 1.5e-07 |
    """
    lines = ["| family | " + " | ".join(measures) + " |", "|---" * (len(measures) + 1) + "|"]
    for family, measured in rows.items():
        lines.append(f"| {family} | " + " | ".join(f"{measured[m]:.2g}" if measured[m] else "0"
                                                   for m in measures) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    import diffusers
    import torch
    import transformers

    from tests.policies.fidelity import MEASURES, STEPS, folders, measure
    from tests.policies.fidelity_cases import CASES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="the deterministic sample's steps")
    parser.add_argument("--family", action="append", choices=list(CASES), help="only these (default: every one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        paths = folders(Path(root))
        rows = {family: measure(CASES[family], paths[CASES[family].folder], args.steps)
                for family in args.family or CASES}
    print(table(rows, MEASURES))
    print(f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), float32, "
          f"{args.steps} steps; torch {torch.__version__}, diffusers {diffusers.__version__}, "
          f"transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
