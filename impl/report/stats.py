"""Confidence intervals of a mean over repeats (seeds, runs), for the report tables, figures
and the papers' claims: Student's t with n - 1 degrees of freedom, 95%."""

from __future__ import annotations

import math
from collections.abc import Iterable


def ci95_half_width(sd: float | None, n: int) -> float:
    """Half-width of the 95% confidence interval of a mean of ``n`` values with sample
    standard deviation ``sd`` (Student's t, n - 1 degrees of freedom), in the values' unit;
    NaN for n < 2 or a missing sd."""
    if n < 2 or sd is None or math.isnan(sd):
        return math.nan
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def mean_ci95(values: Iterable[float]) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% confidence interval of the mean of ``values`` (NaNs
    dropped; :func:`ci95_half_width`); low = high = mean for a single value, all NaN for none."""
    v = [float(x) for x in values if not math.isnan(float(x))]
    if not v:
        return math.nan, math.nan, math.nan
    mean = sum(v) / len(v)
    if len(v) < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1))
    half = ci95_half_width(sd, len(v))
    return mean, mean - half, mean + half


__all__ = ["ci95_half_width", "mean_ci95"]
