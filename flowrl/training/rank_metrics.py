"""An update's metrics of every rank as the one value a single process would log for the whole batch.

Each rank's update returns means over its own trained pairs (the loss, the KL, the ratio's extremes); metrics.csv
holds rank zero's row, so without this a 2-process run logs half a batch. A mean is the pair-weighted mean of the
ranks' means (the mean over every rank's pairs), an extreme the extreme of the ranks', and a count per sample the
row-weighted mean. Values that are already global (gradient norms, skipped steps, the hooks' diagnostics) are equal
on every rank and come out unchanged.
"""

from __future__ import annotations

import math

#: metrics that are an extreme over pairs, with how two ranks' values combine
EXTREMES = {"ratio_min": min, "ratio_max": max, "ratio_max_dev": max, "check_ratio_max_dev": max}
#: metrics that are a mean per sample (row), not per trained pair
PER_ROW = ("forward_passes",)


def combine_ranks(ranks: list[tuple[dict[str, float], int, int]]) -> dict[str, float]:
    """``ranks``: ``(metrics, trained pairs, rows)`` of each rank; returns one value per metric any rank logged. A rank
    without pairs (or without the metric) adds nothing to a pair-weighted mean.

    >>> combine_ranks([({"loss": 1.0, "ratio_max": 1.1}, 3, 2), ({"loss": -1.0, "ratio_max": 1.3}, 1, 2)])
    {'loss': 0.5, 'ratio_max': 1.3}
    """
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for metrics, _, _ in ranks for k in metrics):
        values = [(float(m[key]), rows if key in PER_ROW else pairs) for m, pairs, rows in ranks if key in m]
        if key in EXTREMES:
            finite = [v for v, _ in values if not math.isnan(v)]
            out[key] = EXTREMES[key](finite) if finite else math.nan
            continue
        weighted = [(v, w) for v, w in values if w > 0]
        if weighted:  # (3 * 1.0 + 1 * -1.0) / 4 = 0.5 in the example
            out[key] = sum(v * w for v, w in weighted) / sum(w for _, w in weighted)
        else:  # no rank trained a pair: the ranks' values (equal, or NaN) as they are
            out[key] = sum(v for v, _ in values) / len(values)
    return out
