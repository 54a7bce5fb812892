"""Distribution metrics of Singer's thesis (seed 004, Sec. 4.2.9-4.2.12): earth mover's distance (t-closeness),
g-balance, h-affiliation and adversarial knowledge gain.

>>> import pandas as pd
>>> orig = pd.DataFrame({"q": ["a", "a", "b", "b"], "who": [1, 2, 3, 3], "s": ["x", "y", "x", "x"]})
>>> r = AnonymizedTable.identity(orig, ["q"], individual="who", sensitive="s")
>>> emd(r), g_balance(r), h_affiliation(r), knowledge_gain(r)
(0.25, 0.0, 1.0, 0.25)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from stream_anon.hierarchy import Hierarchy
from stream_anon.metrics.base import AnonymizedTable, tree_height


def _distributions(r: AnonymizedTable, base: str = "released"):
    s = r.sensitive_values()
    classes = r.class_ids().to_numpy()
    ref = s if base == "released" else r.sensitive_values(kept_only=False)
    q = ref.value_counts(normalize=True)
    return s, classes, q


def emd_equal(p: pd.Series, q: pd.Series) -> float:
    """Equal-distance EMD 1/2 sum_i |p_i - q_i| (Li, Li & Venkatasubramanian, ICDE 2007)."""
    idx = p.index.union(q.index)
    return 0.5 * float(np.abs(p.reindex(idx, fill_value=0) - q.reindex(idx, fill_value=0)).sum())


def emd_ordered(p: pd.Series, q: pd.Series) -> float:
    """Ordered-distance EMD 1/(m-1) sum_i |sum_{j<=i} (p_j - q_j)| over the sorted domain (Li et al. 2007).

    >>> q = pd.Series(1 / 9, index=range(3, 12))
    >>> round(emd_ordered(pd.Series(1 / 3, index=[3, 4, 5]), q), 3), round(emd_ordered(pd.Series(1 / 3, index=[6, 8, 11]), q), 3)
    (0.375, 0.167)
    """
    idx = p.index.union(q.index).sort_values()
    diff = (p.reindex(idx, fill_value=0) - q.reindex(idx, fill_value=0)).to_numpy()
    m = len(idx)
    return float(np.abs(np.cumsum(diff)).sum() / (m - 1)) if m > 1 else 0.0


def emd_hierarchical(p: pd.Series, q: pd.Series, h: Hierarchy) -> float:
    """Hierarchical EMD sum_N height(N)/H min(pos_extra(N), neg_extra(N)) (Li et al. 2007), with extra(C)
    summed over the direct children C of N (the thesis's "leaf nodes" wording would double-count moves)."""
    H = tree_height(h)
    extra: dict[str, float] = {}
    height: dict[str, int] = {}
    total = 0.0
    for node in reversed(list(_preorder(h))):
        children = list(h.graph.successors(node))
        if not children:
            extra[node] = float(p.get(node, 0.0)) - float(q.get(node, 0.0))
            height[node] = 0
            continue
        pos = sum(extra[c] for c in children if extra[c] > 0)
        neg = -sum(extra[c] for c in children if extra[c] < 0)
        height[node] = 1 + max(height[c] for c in children)
        total += height[node] / H * min(pos, neg)
        extra[node] = pos - neg
    return total


def _class_equal_emd(s: pd.Series, classes: np.ndarray, q: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per class: (records, equal-distance EMD between the class's sensitive distribution and q), vectorized.

    Same value as ``emd_equal(group.value_counts(normalize=True), q)`` per class: values absent from a class
    contribute q_v, so EMD = 1/2 (sum over present v of |p_v - q_v| + 1 - sum over present v of q_v); a class
    with no non-missing value has an empty p and EMD 1/2 sum q."""
    df = pd.DataFrame({"c": classes, "s": s.to_numpy()})
    sizes = df.groupby("c", sort=True).size()
    present = df.dropna(subset=["s"])
    counts = present.groupby(["c", "s"]).size()
    p = counts / counts.groupby(level=0).transform("sum")
    qv = q.reindex(p.index.get_level_values(1)).fillna(0.0).to_numpy()
    diff = pd.Series(np.abs(p.to_numpy() - qv), index=p.index).groupby(level=0).sum()
    covered = pd.Series(qv, index=p.index).groupby(level=0).sum()
    d = 0.5 * (diff + float(q.sum()) - covered)
    d = d.reindex(sizes.index, fill_value=0.5 * float(q.sum()))
    return sizes.to_numpy(dtype=float), d.to_numpy(dtype=float)


def _preorder(h: Hierarchy):
    stack = [h.root]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(h.graph.successors(n))


def emd(r: AnonymizedTable, kind: str = "equal", hierarchy: Hierarchy | None = None, base: str = "released") -> float:
    """M_EMD = max over classes of EMD(P_e, Q) (thesis Sec. 4.2.9); ``kind`` equal | ordered | hierarchical.

    Q is the sensitive distribution of the released table T' (``base="released"``, as the thesis defines
    and computes it) or of the original table (``base="original"``)."""
    s, classes, q = _distributions(r, base)
    if kind == "equal":
        _, dists = _class_equal_emd(s, classes, q)
        return float(max(0.0, dists.max())) if len(dists) else 0.0
    worst = 0.0
    for _, group in s.groupby(classes):
        p = group.value_counts(normalize=True)
        if kind == "equal":
            d = emd_equal(p, q)
        elif kind == "ordered":
            d = emd_ordered(p, q)
        elif kind == "hierarchical":
            assert hierarchy is not None, "the hierarchical EMD needs the hierarchy"
            d = emd_hierarchical(p, q, hierarchy)
        else:
            raise ValueError(f"emd kind: {kind!r} (equal|ordered|hierarchical)")
        worst = max(worst, d)
    return worst


def g_balance(r: AnonymizedTable) -> float:
    """M_GB = min over classes of 1 - sum_i (c_i / sum_j c_j)^2, c_i records of individual i in the class
    (Ullah et al. 2020; thesis Sec. 4.2.10). 0 when one individual fills a class."""
    df = pd.DataFrame({"c": r.class_ids().to_numpy(), "who": r.individuals().to_numpy()})
    if df.empty:
        return 0.0
    counts = df.groupby(["c", "who"]).size()
    share = counts / counts.groupby(level=0).transform("sum")
    balance = 1.0 - (share ** 2).groupby(level=0).sum()
    return float(min(1.0, balance.min()))


def h_affiliation(r: AnonymizedTable, ignore=()) -> float:
    """M_HA = max over classes of max_j n_j / n_t, n_j individuals holding sensitive value j, n_t individuals
    in the class (Ullah et al. 2020; thesis Sec. 4.2.11). ``ignore``: values every individual has (the thesis
    ignores "Radio")."""
    df = pd.DataFrame({"c": r.class_ids().to_numpy(), "who": r.individuals().to_numpy(),
                       "s": r.sensitive_values().to_numpy()})
    n_t = df.groupby("c")["who"].nunique()
    df = df[~df["s"].isin(list(ignore))]
    if df.empty:
        return 0.0
    n_j = df.groupby(["c", "s"])["who"].nunique()
    return float((n_j / n_t.reindex(n_j.index.get_level_values(0)).to_numpy()).max())


def knowledge_gain(r: AnonymizedTable, variant: str = "additive", base: str = "released") -> float:
    """Adversarial knowledge gain 1/|T'| sum_e |e| A_diff(e) (Brickell & Shmatikov, KDD 2008; thesis
    Sec. 4.2.12). additive: 1/2 sum_v |p(T, v) - p(e, v)|; multiplicative: sum_v |log(p(e, v)/p(T, v))| with
    log 0 := 0. The definition takes p(T, .) from the original table, the thesis's worked example from the
    released one (probabilities out of 8 released trips): ``base`` chooses, default as the example."""
    s, classes, q = _distributions(r, base)
    if variant == "additive":
        sizes, dists = _class_equal_emd(s, classes, q)
        return float((sizes * dists).sum() / len(s)) if len(s) else 0.0
    total = 0.0
    for _, group in s.groupby(classes):
        p = group.value_counts(normalize=True)
        if variant == "additive":
            d = emd_equal(p, q)
        else:
            idx = p.index
            ratio = p.to_numpy() / q.reindex(idx).to_numpy()
            d = float(np.abs(np.log(ratio[ratio > 0])).sum())
        total += len(group) * d
    return total / len(s) if len(s) else 0.0
