"""Seed 000's distortion family (Bhati et al., "Utility-driven k-anonymization of public transport user data",
IEEE Access 2021): utility-factor weights, Gamma_g, Gamma_s, Gamma_tot, and the per-attribute Gamma^a.

Class sizes are measured on the original values of the class members (the class's generalization is the
[min, max] interval, the lowest common ancestor, or the set of stations of its members):
numeric (max - min) / (U - L); tree (L_lca - 1) / (L - 1); graph max shortest path / diameter.

>>> [round(w, 3) for w in utility_weights([1, 5, 5, 1])]   # Table 4, S_OD
[0.083, 0.417, 0.417, 0.083]
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from stream_anon.metrics.base import AnonymizedTable, graph_spread, lca, leaves_under


def utility_weights(factors: Sequence[float]) -> list[float]:
    """w_a = U_a / sum_i U_i (Sec. IV-A). Manual factors are integers in 1..U_max (U_max = 5)."""
    total = float(sum(factors))
    if total <= 0:
        raise ValueError("utility factors must have a positive sum")
    return [u / total for u in factors]


def entropy_factor(values, bucket: float | None = None) -> float:
    """Automatic utility factor U_a = sum_i -p_i log2 p_i over observed values; numeric values are first
    bucketed (``bucket`` width, e.g. 900 s for ride start time)."""
    s = pd.Series(values)
    if bucket:
        s = np.floor(pd.to_numeric(s) / bucket)
    p = s.value_counts(normalize=True).to_numpy()
    return float(-(p * np.log2(p)).sum())


def class_sizes(r: AnonymizedTable) -> pd.DataFrame:
    """Per class (rows) and attribute (columns): the normalized generalization size of the class."""
    classes = r.class_ids()
    orig = r.original.loc[classes.index]
    rows = {}
    for cid, idx in classes.groupby(classes.to_numpy()).groups.items():
        members = orig.loc[idx]
        row = {}
        for q in r.qis:
            vals = members[q].dropna().unique()
            kind = r.kind(q)
            if kind == "tree":
                h = r.hierarchies[q]
                row[q] = (leaves_under(h, lca(h, vals)) - 1) / max(h.n_leaves - 1, 1) if len(vals) else 1.0
            elif kind == "graph":
                row[q] = graph_spread(r.graphs[q], set(vals))
            else:
                L, U = r.bounds[q]
                v = vals.astype(float)
                row[q] = (v.max() - v.min()) / (U - L) if len(v) and U > L else 0.0
        rows[cid] = row
    out = pd.DataFrame.from_dict(rows, orient="index", columns=list(r.qis))
    out["size"] = classes.value_counts().reindex(out.index)
    return out


def distortion(r: AnonymizedTable, weights: Mapping[str, float] | None = None) -> dict:
    """Gamma_g, Gamma_s, Gamma_tot and per attribute Gamma^a.

    Gamma_g^c = |c| sum_a w_a size_a(c); Gamma_g = sum_c Gamma_g^c / |T_ano|; Gamma_s = suppressed / |T|;
    Gamma_tot = Gamma_g + (1 - Gamma_g) Gamma_s. Per attribute Gamma^a = Gamma_g^a + (1 - Gamma_g^a) Gamma_s^a,
    with Gamma_s^a = Gamma_s (a suppressed record loses every attribute) [our reading; the paper leaves
    Gamma_s^a undefined]. |c| multiplies every term [our reading of the paper's Eq. for Gamma_g^c].
    """
    w = {q: (1.0 / len(r.qis) if weights is None else weights.get(q, 0.0)) for q in r.qis}
    sizes = class_sizes(r)
    n_ano = max(r.n_released, 1)
    gamma_s = 1.0 - r.n_released / r.n_records if r.n_records else 0.0
    per_attr_g = {q: float((sizes[q] * sizes["size"]).sum() / n_ano) for q in r.qis}
    gamma_g = float(sum(w[q] * per_attr_g[q] for q in r.qis))
    return {
        "gamma_g": gamma_g,
        "gamma_s": gamma_s,
        "gamma_tot": gamma_g + (1.0 - gamma_g) * gamma_s,
        "per_attribute": {q: g + (1.0 - g) * gamma_s for q, g in per_attr_g.items()},
    }
