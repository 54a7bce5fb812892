"""Precision-loss metrics: NCP, the thesis's in-data and cross-data precision loss, HeuristicMin's Prec,
seed 002's distortion ratio, seed 003's weighted information loss.

Tree attributes lose (leaves(node) - 1) / (leaves(root) - 1), numeric ones (hi - lo) / (U - L) (see
:func:`stream_anon.metrics.base.cell_loss`); a suppressed record loses 1 in every attribute unless stated.

>>> import pandas as pd
>>> from stream_anon.hierarchy import Hierarchy
>>> h = Hierarchy.from_nested({"*": {"AB": ["a", "b"], "c": []}})
>>> orig = pd.DataFrame({"q": ["a", "b", "c"], "n": [0, 10, 5]})
>>> rel = pd.DataFrame({"q": ["AB", "AB", "c"], "n": [(0, 10), (0, 10), 5]})
>>> r = AnonymizedTable(orig, rel, ["q", "n"], hierarchies={"q": h})
>>> round(ncp(r), 4)   # ((0.5 + 1) * 2 + 0) / (3 * 2)
0.5
>>> round(prec(r), 4)  # levels: AB is 1 of height 2; numeric has no levels
0.8333
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from stream_anon.metrics.base import AnonymizedTable, cell_loss, tree_height


def cell_losses(r: AnonymizedTable, cross: bool = False) -> np.ndarray:
    """(n_records, n_qis) matrix of cell losses; suppressed rows are 1."""
    out = np.ones((r.n_records, len(r.qis)))
    kept = np.flatnonzero(r.kept)
    for j, q in enumerate(r.qis):
        rel = r.released[q].to_numpy()
        org = r.original[q].to_numpy()
        cache: dict = {}
        for i in kept:
            key = (_hashable(rel[i]), _hashable(org[i]) if cross else None)
            v = cache.get(key)
            if v is None:
                v = cache[key] = cell_loss(r, q, rel[i], org[i] if cross else None)
            out[i, j] = v
    return out


def _hashable(v):
    if isinstance(v, (list, set)):
        return frozenset(v)
    return v


def ncp(r: AnonymizedTable, weights: Mapping[str, float] | None = None, include_suppressed: bool = True) -> float:
    """Normalized certainty penalty (Xu et al., KDD 2006): mean over records of the weighted mean cell loss.

    ``include_suppressed=False`` averages over released records only (the convention of Mondrian NCP figures).
    """
    w = np.array([1.0 if weights is None else weights.get(q, 0.0) for q in r.qis])
    per_record = cell_losses(r) @ (w / w.sum())
    rows = per_record if include_suppressed else per_record[r.kept]
    return float(rows.mean()) if len(rows) else 0.0


def in_data_precision_loss(r: AnonymizedTable) -> float:
    """IPL = 1/(|T| m) sum_t sum_i IPL_Ai(t') (Iyengar 2002 with Nergiz & Clifton's normalization; thesis
    Sec. 4.2.7): categorical (M_P - 1)/(M - 1), numeric (z - y)/|A_i|, suppressed records 1 per attribute."""
    return float(cell_losses(r).mean()) if r.n_records else 0.0


def cross_data_precision_loss(r: AnonymizedTable) -> float:
    """CPL (thesis Sec. 4.2.8): loss of the closest common ancestor of original and released value, with the
    same (M_u - 1)/(M - 1) scale as IPL so that CPL equals IPL for generalized data, as the thesis states
    (its printed size(u)/|A_i| form would charge 1/|A_i| to an unchanged value). Numeric: width of the
    smallest interval holding both values over |A_i|. Suppressed records count 1."""
    return float(cell_losses(r, cross=True).mean()) if r.n_records else 0.0


def _levels(r: AnonymizedTable) -> np.ndarray:
    """(n, m) generalization level / height per cell; numeric QIs without hierarchy count 0 (kept) or 1."""
    out = np.ones((r.n_records, len(r.qis)))
    kept = np.flatnonzero(r.kept)
    for j, q in enumerate(r.qis):
        h = r.hierarchies.get(q)
        if h is None:
            out[kept, j] = 0.0
            continue
        H = tree_height(h)
        rel = r.released[q].astype(str).to_numpy()
        org = r.original[q].astype(str).to_numpy()
        for i in kept:
            depth_orig = _depth(h, org[i], H)
            out[i, j] = (depth_orig - h.depth(rel[i])) / H if H else 0.0
    return out


def _depth(h, label, default):
    try:
        return h.depth(label)
    except KeyError:
        return default


def prec(r: AnonymizedTable) -> float:
    """Prec = 1 - 1/(n m) sum_cells level(t_ij) / height(tree_i) (Sweeney 2002, used by Arca & Hewett, seed 001).

    Record-weighted (a row with #Rec = 6 counts six times). level = generalization steps from the original
    value. The paper's example prints 1/20 where 1/120 = 1/(3 * 40) is meant (typo)."""
    return 1.0 - float(_levels(r).mean()) if r.n_records else 1.0


def distortion_ratio(r: AnonymizedTable) -> float:
    """DR = D_published / D_fully_generalized (Hasan, Jiang & Li 2017, seed 002): a cell at a leaf costs 0,
    one level up 1/H, the root 1, so the fully generalized table costs one per cell. Utility = 100 (1 - DR)."""
    return float(_levels(r).mean()) if r.n_records else 0.0


def utility_percent(r: AnonymizedTable) -> float:
    """Seed 002's utility = 100 - DR in percent."""
    return 100.0 * (1.0 - distortion_ratio(r))


def weighted_information_loss(r: AnonymizedTable, weights: Mapping[str, float] | None = None,
                              categorical: str = "leaves") -> float:
    """IL_weight = sum_d sum_a w_a IL_d(a) (Kayem, Vester & Meinel, seed 003, Eq. 1-3).

    IL categorical = (k_p - 1)/(P - 1) with k_p leaves under the node; ``categorical="leaves"`` takes P as the
    number of leaves (the standard loss metric, our default), ``"nodes"`` as the number of tree nodes (the
    paper's wording). Numeric (max - min)/(T_max - T_min). Suppressed tuples count 1 per attribute."""
    losses = cell_losses(r)
    if categorical == "nodes":
        for j, q in enumerate(r.qis):
            h = r.hierarchies.get(q)
            if h is not None:
                losses[:, j] *= (h.n_leaves - 1) / max(h.graph.number_of_nodes() - 1, 1)
    w = np.array([1.0 if weights is None else weights.get(q, 0.0) for q in r.qis])
    return float((losses @ w).sum())
