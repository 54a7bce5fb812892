"""Syntactic metrics of Singer's thesis (seed 004, "Enhancing privacy in car data", Stuttgart 2023, Sec. 4.2.2-4.2.6).

k and average class size are counted in **individuals** (the thesis's drivers), discernibility in records (trips).

>>> import pandas as pd
>>> orig = pd.DataFrame({"q": ["a", "a", "b", "b"], "who": [1, 2, 3, 3], "s": ["x", "y", "x", "x"]})
>>> r = AnonymizedTable.identity(orig, ["q"], individual="who", sensitive="s")
>>> min_k(r), min_l(r), average_class_size(r), discernibility(r)
(1, 1, 1.5, 8)
"""
from __future__ import annotations

import numpy as np

from stream_anon.metrics.base import AnonymizedTable


def suppression_ratio(r: AnonymizedTable) -> float:
    """1 - |T'| / |T| (thesis Sec. 4.2.2)."""
    return 1.0 - r.n_released / r.n_records if r.n_records else 0.0


def individuals_per_class(r: AnonymizedTable):
    return r.individuals().groupby(r.class_ids().to_numpy()).nunique()


def min_k(r: AnonymizedTable) -> int:
    """M_k = min over classes of the number of distinct individuals (thesis Sec. 4.2.3, counted in drivers)."""
    per = individuals_per_class(r)
    return int(per.min()) if len(per) else 0


def min_l(r: AnonymizedTable) -> int:
    """M_l = min over classes of the number of distinct sensitive values (distinct l-diversity, Sec. 4.2.4)."""
    per = r.sensitive_values().groupby(r.class_ids().to_numpy()).nunique()
    return int(per.min()) if len(per) else 0


def average_class_size(r: AnonymizedTable, by: str = "individuals", k: int | None = None) -> float:
    """|T'| / |EC| (Machanavajjhala et al. 2006). ``by="individuals"``: the thesis's variant, summing the
    distinct individuals of every class; ``by="records"``: the original. With ``k``: LeFevre's normalized
    form divided by k (Sec. 4.2.5)."""
    if by == "individuals":
        per = individuals_per_class(r)
        value = float(per.sum() / len(per)) if len(per) else 0.0
    else:
        n_classes = r.class_ids().nunique()
        value = r.n_released / n_classes if n_classes else 0.0
    return value / k if k else value


def discernibility(r: AnonymizedTable) -> int:
    """sum over released records of |EC(t)| + |T| * (|T| - |T'|) (Bayardo & Agrawal 2005; Sec. 4.2.6)."""
    sizes = r.class_ids().value_counts().to_numpy()
    return int(np.sum(sizes.astype(np.int64) ** 2) + r.n_records * (r.n_records - r.n_released))
