"""Are two runs' ``metrics.csv`` the same, value for value? The check that a refactor keeps behaviour.

    python scripts/compare_metrics.py docs/data/regression/quickstart_seed0_20batches.csv \
        runs/quickstart/version_N/metrics.csv

Compares the rows both files have, in order, on the columns both have, except timings (``rollout/samples_per_s``),
as the strings CSVLogger wrote (so "equal" means bit-identical floats). Columns only one file has are listed, not
compared: a new metric is not a change of behaviour. Exits 1 on the first differences (printed), 0 otherwise.

The references in ``docs/data/regression/`` (the quickstart's first 20 batches, Dynamic-TreeRPO's 4 and TDM-R1's 5)
and the commands that recorded them are in that folder's README.md; ``tests/scripts/test_regression_references.py``
reruns them. They hold bit for bit only for the machine and libraries that recorded them, at one thread
(``OMP_NUM_THREADS=1``): the thread count, the CPU's vector instructions and library versions change float
reductions. A run that differs where no commit changed the numbers: rerun the reference's own commit to tell.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

TIMINGS = ("rollout/samples_per_s",)


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def same(x: str, y: str, rtol: float = 0.0) -> bool:
    """Two logged values agree: as written (bit for bit) where ``rtol`` is 0, else as numbers within ``rtol``
    (relative, and absolute near 0).

    >>> same("0.46737655252218246", "0.4673765227198601"), same("0.46737655252218246", "0.4673765227198601", 1e-6)
    (False, True)
    """
    if x == y or not rtol:
        return x == y
    try:
        return math.isclose(float(x), float(y), rel_tol=rtol, abs_tol=rtol)
    except ValueError:  # an empty cell against a number
        return False


def differences(a: list[dict[str, str]], b: list[dict[str, str]], skip=TIMINGS, rtol: float = 0.0) -> list[str]:
    """Every (row, column) where ``a`` and ``b`` disagree (``same``), over their common rows and columns.

    >>> differences([{"step": "0", "x": "1.5"}], [{"step": "0", "x": "1.5", "new": "2"}])
    []
    >>> differences([{"x": "1.5"}, {"x": "2"}], [{"x": "1.25"}])
    ['row 0 x: 1.5 != 1.25', 'row count: 2 != 1']
    """
    columns = [c for c in a[0] if c in b[0] and c not in skip] if a and b else []
    out = [f"row {i} {c}: {ra[c]} != {rb[c]}" for i, (ra, rb) in enumerate(zip(a, b)) for c in columns
           if not same(ra[c], rb[c], rtol)]
    if len(a) != len(b):
        out.append(f"row count: {len(a)} != {len(b)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("run", type=Path)
    parser.add_argument("--rows", type=int, default=None, help="compare only the first ROWS rows of each")
    args = parser.parse_args(argv)
    a, b = read(args.reference)[:args.rows], read(args.run)[:args.rows]
    only = sorted(set(a[0]) ^ set(b[0])) if a and b else []
    if only:
        print(f"columns in one file only (not compared): {only}")
    found = differences(a, b)
    for line in found[:20]:
        print(line)
    compared = len([c for c in a[0] if c in b[0] and c not in TIMINGS]) if a and b else 0
    print(f"{'DIFFERENT' if found else 'identical'}: {min(len(a), len(b))} rows x {compared} columns compared")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
