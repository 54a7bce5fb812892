"""Contribution bounding: the step that gives every noisy aggregate a finite sensitivity.

Per window and per aggregate each individual (value of the stream's ``privacy_unit``) keeps at most
``max_contributions`` events: the **first ones in arrival order** (a deterministic choice that depends only on that
individual's own events, so a restarted worker cuts the same events). Numeric values are clamped to the
configured ``[lower, upper]``. With both bounds the L1 sensitivity of one window of a count is
``max_contributions`` and of a sum ``max_contributions * max(|lower|, |upper|)`` (Wilson et al., *Differentially
Private SQL with Bounded User Contribution*, PoPETs 2020; Amin et al., *Bounding User Contributions*, ICML 2019).

>>> keep, cut = bound_contributions(["a", "b", "a", "a", "b"], 2)
>>> keep.tolist(), cut
([True, True, True, False, True], 1)
>>> clamp([-5, 3, 120], 0, 100).tolist()
[0.0, 3.0, 100.0]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd


def bound_contributions(units: Sequence, max_contributions: int) -> tuple[np.ndarray, int]:
    """Mask of the events kept (the first ``max_contributions`` of each individual, in the given order) and the
    number of events cut. ``units`` holds one privacy-unit value per event, in arrival order."""
    if isinstance(max_contributions, bool) or not isinstance(max_contributions, (int, np.integer)) \
            or max_contributions < 1:
        raise ValueError(f"max_contributions: must be a positive integer, got {max_contributions!r}")
    n = len(units)
    if n == 0:
        return np.zeros(0, dtype=bool), 0
    codes = pd.factorize(np.asarray(list(units), dtype=object), use_na_sentinel=False)[0]
    rank = pd.Series(codes).groupby(codes).cumcount().to_numpy()
    keep = rank < max_contributions
    return keep, int(n - keep.sum())


def clamp(values, lower: float, upper: float) -> np.ndarray:
    """Values clipped to ``[lower, upper]`` (bounds from configuration, never from the data)."""
    if not lower < upper:
        raise ValueError(f"clamp: lower ({lower}) must be below upper ({upper})")
    return np.clip(np.asarray(values, dtype=float), lower, upper)
