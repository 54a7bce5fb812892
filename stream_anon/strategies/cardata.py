"""The car-data approaches of seed 004, with k counted in individuals (drivers, vehicles).

Singer, "Enhancing privacy in car data: anonymization techniques and metrics evaluation", MSc thesis,
University of Stuttgart 2023 (../shared/papers/004_*.txt, Sec. 4.3), where ARX 3.9.1 and diffprivlib 0.6 did:

1. **Generalization** (:func:`cardata_generalize`, strategy ``"car-data"``): the QIs (Engine, Body, Seats,
   derived from the VIN) are generalized along their hierarchies so that every class holds at least k
   **individuals**; a class below k is suppressed (with its individuals' trips), up to ``suppression_limit``
   (the thesis: 100%). ARX's search is replaced by an exhaustive walk of the generalization lattice
   (levels = steps up each hierarchy; full-domain recoding) minimizing the loss with suppressed records
   counted 1 [ours: deterministic and exact for the few QIs of this data]. Each class is then published as
   the lowest common ancestor of its members (local recoding, as the thesis configured ARX): never wider
   than the lattice node, sometimes narrower ("Gas" rather than its unary parent "Fuel").
2. **Mode microaggregation** (:func:`cardata_microaggregate`): the same classes, each QI replaced by the most
   frequent value among the class's individuals (each individual counted once; ties to the first leaf).
3. **Contingency-table synthesis** (:func:`cardata_synthesize`): the per-individual QI tuples are counted over
   the whole leaf domain (fixed by the hierarchies, so absent combinations get noise too), optionally with
   truncated Laplace noise (diffprivlib ``LaplaceTruncated``, lower bound 0, sensitivity 1: each individual
   adds one tuple), and every individual gets a tuple sampled from the (noisy) table. Only the QIs are
   synthesized; the trips' other fields are kept, as in the thesis.

An individual's QIs must be constant over its records (the VIN properties are); otherwise a ValueError.

>>> import pandas as pd
>>> from stream_anon.hierarchy import Hierarchy
>>> h = Hierarchy.from_nested({"?": {"With E": ["EV", "Hybrid"], "Fuel": ["Gas"]}})
>>> df = pd.DataFrame({"driver": [1, 2, 3, 4], "engine": ["EV", "Hybrid", "Gas", "Gas"]})
>>> res = cardata_generalize(df, {"engine": h}, "driver", k=2)
>>> res.released["engine"].tolist(), res.levels
(['With E', 'With E', 'Gas', 'Gas'], {'engine': 1})
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from stream_anon.hierarchy import Hierarchy
from stream_anon.strategies.heuristicmin import interval_hierarchy
from stream_anon.strategies.tabular import generalize_classes, row_groups
from stream_anon.validation import MAX_COUNT, check_integer, check_number

MAX_LATTICE = 20_000


def _ancestor_tables(h: Hierarchy) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per level L (0..height): for each leaf code, the node L steps up (capped at the root), as
    (node lo code, node loss) arrays; the node's leaf range identifies it."""
    height = max(h.depth(leaf) for leaf in h.leaves)
    parents = {c: p for p, c in h.graph.edges}
    lo_tables, loss_tables = [], []
    current = list(h.leaves)
    for _ in range(height + 1):
        ranges = np.array([h.node_range(n) for n in current])
        lo_tables.append(ranges[:, 0] * (h.n_leaves + 1) + ranges[:, 1])
        loss_tables.append((ranges[:, 1] - ranges[:, 0]) / max(h.n_leaves - 1, 1))
        current = [parents.get(n, n) for n in current]
    return lo_tables, loss_tables


def lattice_classes(codes: np.ndarray, hierarchies: list[Hierarchy], units: np.ndarray, k: int,
                    suppression_limit: float = 1.0, weights: np.ndarray | None = None
                    ) -> tuple[tuple[int, ...], np.ndarray]:
    """Best full-domain generalization with suppression, k counted in distinct ``units``.

    ``codes``: (n, D) leaf codes (-1 = missing, generalized to the root). Returns the chosen levels and a
    class label per record (-1 = suppressed). Loss = mean over records of the weighted node loss, 1 for a
    suppressed record; ties go to the node with fewer generalization steps, then the first in order.

    Records with the same codes share their node at every lattice node, so the walk works on the distinct code
    rows ("patterns") when no unit has records in two patterns (each record its own unit, or the car-data case:
    QIs constant per individual): a class's individuals are then the sum of its patterns' distinct units. The
    per-record values (loss, suppressed or not) are the patterns' values expanded, so the scores and the choice
    are those of a walk over the records."""
    n, D = codes.shape
    w = np.ones(D) / D if weights is None else np.asarray(weights, float) / np.sum(weights)
    tables = [_ancestor_tables(h) for h in hierarchies]
    sizes = [len(t[0]) for t in tables]
    if int(np.prod(sizes)) > MAX_LATTICE:
        raise ValueError(f"car-data: generalization lattice of {int(np.prod(sizes))} nodes is too large")
    uid = pd.factorize(units)[0]
    n_units = int(uid.max()) + 1 if n else 1
    radices = [(h.n_leaves + 1) ** 2 for h in hierarchies]    # node ids: lo * (leaves + 1) + hi
    rows, expand, unit_count = codes, None, None
    if n:
        patterns, inverse = np.unique(codes, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        pattern_units = np.unique(inverse.astype(np.int64) * n_units + uid)
        if len(pattern_units) == n_units:                     # every unit within one pattern
            rows, expand = patterns, inverse
            unit_count = np.bincount(pattern_units // n_units, minlength=len(patterns))
    # per dimension and level: each row's node id and weighted loss (the same float operations as per record)
    node_cols, loss_cols = [], []
    for d, (lo_t, loss_t) in enumerate(tables):
        c = rows[:, d]
        top = len(lo_t) - 1
        node_cols.append([np.where(c >= 0, lo_t[lvl][np.clip(c, 0, None)], lo_t[top][0]) for lvl in range(len(lo_t))])
        loss_cols.append([w[d] * np.where(c >= 0, loss_t[lvl][np.clip(c, 0, None)], 1.0) for lvl in range(len(lo_t))])
    best = None
    node = np.empty(rows.shape, np.int64)
    for levels in itertools.product(*[range(s) for s in sizes]):
        loss = np.zeros(len(rows))
        for d, lvl in enumerate(levels):
            node[:, d] = node_cols[d][lvl]
            loss += loss_cols[d][lvl]
        label = row_groups(node, radices)
        if unit_count is None:
            pairs = np.unique(label * n_units + uid)
            individuals = np.bincount(pairs // n_units, minlength=label.max() + 1)
        else:
            individuals = np.bincount(label, weights=unit_count, minlength=label.max() + 1)
        small = individuals[label] < k
        if expand is not None:
            label, small, loss = label[expand], small[expand], loss[expand]
        if small.mean() > suppression_limit:
            continue
        score = (np.where(small, 1.0, loss).mean(), sum(levels))
        if best is None or score < best[0]:
            best = (score, levels, np.where(small, -1, label))
    if best is None:
        return tuple(s - 1 for s in sizes), np.full(n, -1)
    return best[1], best[2]


@dataclass
class CarDataResult:
    classes: list[np.ndarray]          # row positions per class
    suppressed: np.ndarray             # row positions
    levels: dict[str, int]             # generalization steps per QI
    released: pd.DataFrame


def _frame_codes(df: pd.DataFrame, qis: Mapping[str, Hierarchy], individual: str) -> np.ndarray:
    per = df.groupby(individual)[list(qis)].nunique(dropna=False)
    varying = per.columns[(per > 1).any()].tolist()
    if varying:
        raise ValueError(f"car-data: {varying} vary within an individual; QIs must be per individual")
    cols = []
    for q, h in qis.items():
        c = h.codes(None if pd.isna(v) else str(v) for v in df[q])
        bad = df[q][(c < 0) & df[q].notna().to_numpy()]
        if len(bad):
            raise ValueError(f"car-data: {q} value {bad.iloc[0]!r} is not a leaf of its hierarchy")
        cols.append(c)
    return np.stack(cols, axis=1)


def cardata_generalize(df: pd.DataFrame, qis: Mapping[str, Hierarchy], individual: str, k: int,
                       suppression_limit: float = 1.0) -> CarDataResult:
    """Approach 1: hierarchy generalization with suppression, k in individuals (see module doc)."""
    check_integer(k, "car-data.k", 1, MAX_COUNT)
    check_number(suppression_limit, "car-data.suppression_limit", at_least=0, at_most=1)
    codes = _frame_codes(df, qis, individual)
    levels, label = lattice_classes(codes, list(qis.values()), df[individual].to_numpy(), k, suppression_limit)
    classes = [np.flatnonzero(label == c) for c in np.unique(label[label >= 0])]
    released = generalize_classes(df, classes, qis)
    return CarDataResult(classes, np.flatnonzero(label < 0), dict(zip(qis, map(int, levels))), released)


def cardata_microaggregate(df: pd.DataFrame, qis: Mapping[str, Hierarchy], individual: str,
                           generalized: CarDataResult) -> pd.DataFrame:
    """Approach 2: the generalization's classes, each QI set to the mode over the class's individuals."""
    out = generalized.released.copy()
    for rows in generalized.classes:
        people = df.iloc[rows].drop_duplicates(individual)
        for q, h in qis.items():
            counts = people[q].astype(str).value_counts()
            top = counts[counts == counts.max()].index
            mode = min(top, key=h.code)                 # ties: first leaf in hierarchy order
            idx = df.index[rows]
            out.loc[idx, q] = mode
    return out


def cardata_synthesize(df: pd.DataFrame, qis: Mapping[str, Hierarchy], individual: str,
                       epsilon: float | None = None, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Approach 3: QIs sampled per individual from the (optionally DP) contingency table.

    Returns the synthetic records (``df`` with each individual's QIs replaced) and the published table
    (every leaf combination with its count, noisy when ``epsilon`` is given)."""
    if epsilon is not None:
        check_number(epsilon, "car-data.epsilon", above=0)
    codes = _frame_codes(df, qis, individual)
    first = ~df[individual].duplicated().to_numpy()
    people = df[individual].to_numpy()[first]
    per_person = codes[first]
    shape = [h.n_leaves for h in qis.values()]
    cells = int(np.prod(shape))
    if cells > 1_000_000:
        raise ValueError(f"car-data: contingency table of {cells} cells is too large")
    known = (per_person >= 0).all(axis=1)
    flat = np.ravel_multi_index(per_person[known].T, shape) if known.any() else np.empty(0, np.int64)
    counts = np.bincount(flat, minlength=cells).astype(float)
    rng = np.random.default_rng(seed)
    if epsilon is not None:
        from diffprivlib.mechanisms import LaplaceTruncated

        mech = LaplaceTruncated(epsilon=float(epsilon), sensitivity=1, lower=0, upper=len(people),
                                random_state=np.random.RandomState(seed))
        counts = np.array([mech.randomise(c) for c in counts])
    p = counts / counts.sum() if counts.sum() > 0 else np.full(cells, 1.0 / cells)
    drawn = np.unravel_index(rng.choice(cells, size=len(people), p=p), shape)
    synth = df.copy()
    who = pd.Series(np.arange(len(people)), index=people)
    row_person = who.reindex(df[individual]).to_numpy()
    for d, (q, h) in enumerate(qis.items()):
        synth[q] = np.array(h.leaves, dtype=object)[drawn[d]][row_person]
    grid = pd.DataFrame(list(itertools.product(*[h.leaves for h in qis.values()])), columns=list(qis))
    grid["count"] = counts
    return synth, grid


@dataclass(frozen=True)
class CarDataParams:
    """``[anonymization.strategy_params]`` of ``car-data``: ``numeric_depth`` (1..8) and ``suppression_limit``
    (share of records the lattice search may suppress, in [0, 1])."""
    numeric_depth: int = 2
    suppression_limit: float = 1.0

    def __post_init__(self) -> None:
        check_integer(self.numeric_depth, "numeric_depth", 1, 8)
        check_number(self.suppression_limit, "suppression_limit", at_least=0, at_most=1)

    def check_config(self, sensitive: tuple[str, ...], qi_names: tuple[str, ...]) -> None:
        pass


class CarData:
    """Engine adapter of approach 1: full-domain generalization with suppression over a window, k counted in
    individuals. Categorical dimensions use their hierarchy; numeric ones a binary interval tree of
    ``numeric_depth`` levels over the configured bounds (2 by default: the lattice has (depth + 1) nodes per
    numeric dimension, multiplied over dimensions, and is searched exhaustively every window). Records of suppressed classes stay deferred (the
    engine suppresses them at their deadline unless an earlier class covers them)."""
    name = "car-data"
    uses_sensitive = False
    Params = CarDataParams

    def __init__(self, **params) -> None:
        self.params = p = CarDataParams(**params)
        self.numeric_depth, self.suppression_limit = p.numeric_depth, float(p.suppression_limit)
        self._trees: dict = {}

    def form_classes(self, X, units, k, space, rng=None) -> list[np.ndarray]:
        n, D = X.shape
        if n == 0:
            return []
        codes = np.empty((n, D), np.int64)
        hier = []
        for d in range(D):
            qi = space.qis[space.owner[d]]
            missing = X[:, d] < space.lower[d]
            if qi.kind in ("categorical", "station"):
                h = qi.hierarchy
                codes[:, d] = np.where(missing, -1, X[:, d]).astype(np.int64)
            else:
                key = (float(space.lower[d]), float(space.upper[d]))
                if key not in self._trees:
                    self._trees[key] = interval_hierarchy(*key, self.numeric_depth)
                h = self._trees[key]
                pos = (X[:, d] - space.lower[d]) / (space.width[d] or 1.0) * h.n_leaves
                codes[:, d] = np.where(missing, -1, np.clip(pos.astype(np.int64), 0, h.n_leaves - 1))
            hier.append(h)
        _, label = lattice_classes(codes, hier, np.asarray(units), k, self.suppression_limit,
                                   weights=space.weight)
        return [np.flatnonzero(label == c) for c in np.unique(label[label >= 0])]
