"""The normal range of every logged training metric over runs' ``metrics.csv`` files, as the Markdown table of the
docs page "What a healthy run looks like" (``docs/healthy-run.md``; a test checks that the page holds this output).

    python scripts/metric_ranges.py docs/data/quickstart/metrics.csv docs/data/quickstart/metrics_seed1.csv \\
        docs/data/quickstart/metrics_seed2.csv

For each metric: the 5th-95th percentile and the median over the first and over the last tenth of the logged
training rows of every file together.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np


def training_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv`` that carry a training reward (validation rows are logged apart)."""
    with open(path) as f:
        return [row for row in csv.DictReader(f) if row.get("train/reward/total")]


def fmt(x: float) -> str:
    """Three significant digits, ratios near 1 shown as ``1 +- deviation``.

    >>> fmt(0.84123), fmt(1.0015461), fmt(-2.4e-09), fmt(0.0)
    ('0.841', '1 + 1.5e-03', '-2.4e-09', '0')
    """
    if x == 0:
        return "0"
    if 0.99 < x < 1.01 and x != 1:
        return f"1 {'+' if x > 1 else '-'} {abs(x - 1):.1e}"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.1e}"


def summary(values: np.ndarray) -> str:
    lo, mid, hi = np.percentile(values, [5, 50, 95])
    return f"{fmt(lo)} .. {fmt(hi)} (median {fmt(mid)})"


def table(files: list[Path]) -> str:
    runs = [training_rows(f) for f in files]
    keys = [k for k in runs[0][0] if k.startswith(("train/", "rollout/"))]
    lines = ["| metric | first tenth of the run | last tenth of the run |", "| --- | --- | --- |"]
    for key in keys:
        parts = []
        for part in (slice(0, None), slice(None, None)):
            values = []
            for rows in runs:
                tenth = max(1, len(rows) // 10)
                chosen = rows[:tenth] if part.start == 0 else rows[-tenth:]
                values += [float(r[key]) for r in chosen if r.get(key, "") != ""]
            parts.append(summary(np.array(values)) if values else "not logged")
        lines.append(f"| `{key}` | {parts[0]} | {parts[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="metrics.csv files of runs of one config")
    print(table(parser.parse_args().files))


if __name__ == "__main__":
    main()
