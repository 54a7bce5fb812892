"""Severity-driven privacy parameters (seed 003: Kayem, Vester & Meinel, "Automated k-anonymization and
l-diversity for shared data privacy", DEXA 2016, Sec. 3.3-3.4).

>>> k_min(5, [3, 5, 7]), severity_penalty(25, 5), average_severity([5, 3, 7, 5, 5])
(5, 5.0, 5.0)
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd

# the paper's Table 1 and its Eq. 4 belong to the severity rule (criteria, the lower layer); re-exported here
from stream_anon.criteria.severity import CRIME_SEVERITY, k_min  # noqa: F401


def severity_penalty(severity: float, class_size: int) -> float:
    """SP_d = S(c_d) / |e_d| (Eq. 5): a severe value in a small class costs much."""
    return severity / class_size


def total_severity_penalty(classes: Iterable, sensitive: Iterable, severity: Mapping) -> float:
    """SP_tot = sum over tuples of SP_d (Eq. 6)."""
    df = pd.DataFrame({"c": list(classes), "s": list(sensitive)})
    size = df.groupby("c")["c"].transform("size")
    return float((df["s"].map(severity) / size).sum())


def average_severity(severities: Iterable[float]) -> float:
    """AS_D (Eq. 8) over the dataset, or AS_e (Eq. 10) over one class: the mean severity. The paper prints the
    class form as a sum over D divided by |e|; Example 3 ((5+3+7+5+5)/5 = 5) shows the sum runs over e."""
    s = np.asarray(list(severities), dtype=float)
    return float(s.mean()) if len(s) else 0.0


def distinct_diversity(values: Iterable) -> int:
    """l_e: the number of distinct sensitive values in a class (distinct l-diversity)."""
    return len(set(values))


def needs_top_generalization(class_values: Iterable, severity: Mapping) -> bool:
    """The CG-Diverse rule: a class whose AS_e exceeds its l_e is generalized to the top level (Sec. 3.4)."""
    values = list(class_values)
    return average_severity(severity[v] for v in values) > distinct_diversity(values)


def fitness(privacy_term: float, information_loss: float) -> float:
    """FF = 1 / max(SP_tot or AS_D, LM_CG) (Eq. 7 and 9): higher is better."""
    m = max(privacy_term, information_loss)
    return float("inf") if m == 0 else 1.0 / m
