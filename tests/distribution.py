"""Chi-square test of observed outcomes against an exact distribution, for the sampling tests."""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare


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
    assert chisquare(observed, expected).pvalue > significance
