"""Chi-square test of observed outcomes against an exact distribution, for the sampling tests."""

from __future__ import annotations

import numpy as np
from scipy.special import chdtrc


def chisquare_pvalue(observed, expected) -> float:
    """Pearson's chi-square test's p-value (scipy.stats.chisquare's, without importing scipy.stats: 1-3 s of
    every run's start): how often a sample of `expected` strays from it as far as `observed` does."""
    observed, expected = np.asarray(observed, dtype=float), np.asarray(expected, dtype=float)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(chdtrc(observed.size - 1, statistic))


def assert_counts_follow(exact: dict, counts: dict, significance: float = 0.001) -> None:
    """`counts` (outcome -> times seen) are a sample of `exact` (outcome -> probability).

    Cells expected fewer than 5 times are pooled; a correct sampler fails one seed set in 1/significance.
    """
    n = sum(counts.values())
    expected = np.array(list(exact.values())) * n
    observed = np.array([counts[key] for key in exact])
    rare = expected < 5
    if rare.any():
        expected = np.append(expected[~rare], expected[rare].sum())
        observed = np.append(observed[~rare], observed[rare].sum())
    assert chisquare_pvalue(observed, expected) > significance
