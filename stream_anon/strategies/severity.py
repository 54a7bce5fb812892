"""Severity-driven k-anonymity and l-diversity (seed 003) as a strategy and a batch anonymizer.

Kayem, Vester & Meinel, "Automated k-anonymization and l-diversity for shared data privacy", DEXA 2016
(../shared/papers/003_*.txt). Each sensitive category has a severity S(c) (Table 1; e.g. Murder 25):

- k_min = max(k_cons, min severity) (Eq. 4), with k_cons the configured k. **[ours]** In a stream the minimum
  is taken over the severity map (fixed per configuration) so k does not move between windows;
  ``k_min_from="data"`` takes it over the records being anonymized, as the paper does on its table.
- Severe tuples go to larger classes: a class must hold at least ``clip(max S in class, k_min, cap)``
  distinct individuals **[our reading]**, so every tuple's severity penalty SP_d = S(c_d)/|e_d| (Eq. 5) is at
  most 1 unless ``cap`` (the paper's unstated size threshold) binds.
- Diversity (CG-Diverse, Sec. 3.4): a class whose average severity AS_e exceeds its number of distinct
  sensitive values l_e is at risk. The paper generalizes such a class to the top level (``rule="top"``, batch
  only: the engine publishes the members' box, never a wider one). The default ``rule="merge"`` [ours] keeps
  partitions together instead (a split is refused when a half would break AS_e <= l_e), so every published
  class meets the rule; a window that breaks it as a whole is not published and waits (deferred, then
  suppressed at its deadline). ``l_floor`` is the paper's diversity floor (3 in the paper; 1 by default here,
  since the AS rule already asks l_e >= AS_e).
- Classes are formed by top-down median splits (:func:`~stream_anon.strategies.partition.median_partition`);
  the paper's genetic search (CG-Kanon / CG-Diverse fitness) is replaced by this deterministic partitioning,
  and its fitness terms (SP_tot, AS_D, weighted IL) are reported by :func:`severity_anonymize`.

An unmapped sensitive value gets ``default_severity`` (default: the map's maximum, privacy first).

The acceptance test is the criterion :class:`stream_anon.criteria.severity.SeverityRule`. The strategy's parameters
steer the search only; to have the former enforce the rule on every published class (whatever the strategy, and
with reuse of earlier classes turned off, since the rule is not monotone) and the audit check it, list it in
``[[anonymization.criteria]]`` (``kind = "severity"``).

>>> import pandas as pd
>>> df = pd.DataFrame({"age": [20, 21, 22, 60, 61, 62], "crime": ["Theft"] * 3 + ["Robbery"] * 3})
>>> sev = {"Theft": 2, "Robbery": 2}
>>> [c.tolist() for c in severity_anonymize(df, {"age": (0, 100)}, "crime", sev, k_cons=2).classes]
[[0, 1, 2, 3, 4, 5]]
>>> [c.tolist() for c in severity_anonymize(df, {"age": (0, 100)}, "crime", sev, k_cons=2, rule="none").classes]
[[0, 1, 2], [3, 4, 5]]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, TypedDict, cast

import networkx as nx
import numpy as np
import pandas as pd

from stream_anon.criteria import Classes, Column
from stream_anon.criteria.severity import PRESETS
from stream_anon.criteria.severity import SeverityRule as SeverityCriterion
from stream_anon.errors import ConfigError
from stream_anon.hierarchy import Hierarchy
from stream_anon.metrics.severity import average_severity, distinct_diversity, k_min, total_severity_penalty
from stream_anon.strategies.partition import frame_keys, median_partition
from stream_anon.strategies.tabular import QISpec, frame_attributes, generalize_classes
from stream_anon.validation import MAX_COUNT, check_bool, check_choice, check_integer, check_number, check_text

RULES = ("merge", "top", "none")
L_RANGE = (3, 25)          # the paper's diversity range for the global l target


class _CriterionParams(TypedDict):
    """The keywords of :class:`stream_anon.criteria.SeverityRule` a :class:`SeverityRule` fixes."""
    severity: Mapping | str
    default_severity: float | None
    cap: int | None
    l_floor: int
    diversity: bool


class SeverityRule:
    """The search side of seed 003's rule: where k_min comes from (``k_min_from``: the map, fixed per
    configuration, or the records being anonymized) and the acceptance test of a candidate class, which is the
    criterion :class:`stream_anon.criteria.SeverityRule` (the former and the batch form check the same code)."""

    def __init__(self, severity: Mapping | str, default_severity: float | None = None, cap: int | None = None,
                 l_floor: int = 1, diversity: bool = True, k_min_from: str = "map"):
        if k_min_from not in ("map", "data"):
            raise ValueError(f"k_min_from: 'map' or 'data', got {k_min_from!r}")
        self.params = _CriterionParams(severity=severity, default_severity=default_severity, cap=cap,
                                       l_floor=l_floor, diversity=diversity)
        self.probe = self.criterion("field", 1)         # validates the parameters once
        # the criterion's __post_init__ has resolved a preset name to its map
        self.severity, self.default = cast(Mapping, self.probe.severity), self.probe.default
        self.cap, self.l_floor, self.diversity, self.k_min_from = cap, l_floor, diversity, k_min_from

    def criterion(self, field: str, kmin: int) -> SeverityCriterion:
        return SeverityCriterion(field, k_min=int(kmin), **self.params)

    def scores(self, values) -> np.ndarray:
        return self.probe.scores(values)

    def k_min(self, k_cons: int, scores: np.ndarray) -> int:
        source = self.severity.values() if self.k_min_from == "map" else (scores if len(scores) else [k_cons])
        return k_min(k_cons, source)

    def acceptor(self, units: np.ndarray, values, kmin: int):
        """``accept(idx)``: the criterion on the candidate class of rows ``idx``."""
        rule, column, units = self.criterion("s", kmin), Column.encode(list(values)), np.asarray(units)

        def accept(idx: np.ndarray) -> bool:
            return bool(rule.holds(Classes.single(units[idx], {"s": column.take(idx)}))[0])
        return accept


@dataclass(frozen=True)
class SeverityParams:
    """``[anonymization.strategy_params]`` of ``severity``: ``field`` (the sensitive field holding the category,
    required), ``severity`` (value -> severity, or ``"crime"``), ``default_severity``, ``cap``, ``l_floor``,
    ``diversity``, ``k_min_from``."""
    field: str = ""
    severity: Mapping | str = "crime"
    default_severity: float | None = None
    cap: int | None = None
    l_floor: int = 1
    diversity: bool = True
    k_min_from: str = "map"

    def __post_init__(self) -> None:
        if self.field == "":
            raise ConfigError("field: the sensitive field holding the category is required")
        check_text(self.field, "field")
        if isinstance(self.severity, str):
            check_choice(self.severity, "severity", tuple(PRESETS))
        elif not isinstance(self.severity, Mapping) or not self.severity:
            raise ConfigError("severity: a non-empty table sensitive value -> severity, or a preset name")
        else:
            for value, s in self.severity.items():
                check_number(s, f"severity.{value}", above=0, at_most=MAX_COUNT)
        if self.default_severity is not None:
            check_number(self.default_severity, "default_severity", above=0, at_most=MAX_COUNT)
        if self.cap is not None:
            check_integer(self.cap, "cap", 1, MAX_COUNT)
        check_integer(self.l_floor, "l_floor", 1, MAX_COUNT)
        check_bool(self.diversity, "diversity")
        check_choice(self.k_min_from, "k_min_from", ("map", "data"))

    def rule(self) -> "SeverityRule":
        return SeverityRule(self.severity, self.default_severity, self.cap, self.l_floor, self.diversity,
                            self.k_min_from)

    def check_config(self, sensitive: tuple[str, ...], qi_names: tuple[str, ...]) -> None:
        if self.field not in sensitive:
            raise ValueError(f"field: {self.field!r} is not listed in sensitive.fields")


class Severity:
    """Engine adapter: severity-sized classes with the AS_e <= l_e rule over a window's buffer.

    Parameters: ``field`` (the sensitive field carrying the category; must be listed in ``[sensitive]``),
    ``severity`` (value -> severity, or ``"crime"`` for the paper's Table 1), ``default_severity``, ``cap``,
    ``l_floor``, ``diversity`` (apply the AS rule), ``k_min_from``. The configured k is k_cons.
    """
    name = "severity"
    uses_sensitive = True
    Params = SeverityParams

    def __init__(self, **params):
        self.params = p = SeverityParams(**params)
        self.field = p.field
        self.rule = p.rule()

    def criteria(self, k: int, sensitive: dict) -> tuple:
        """What its classes meet (``stream-anon evaluate`` checks them): the severity rule with the k_min of these
        values."""
        return (self.rule.criterion(self.field, self.rule.k_min(k, self.rule.scores(sensitive[self.field]))),)

    def form_classes(self, X, units, k, space, rng=None, sensitive=None) -> list[np.ndarray]:
        if sensitive is None or self.field not in sensitive:
            raise ValueError(f"severity.field: {self.field!r} is not a configured sensitive field")
        values = sensitive[self.field]
        scores = self.rule.scores(values)
        accept = self.rule.acceptor(np.asarray(units), values, self.rule.k_min(k, scores))
        return median_partition(X, accept, width=space.width)


@dataclass
class SeverityResult:
    classes: list[np.ndarray]
    suppressed: np.ndarray
    top: list[int]                 # classes generalized to the top level (rule="top")
    released: pd.DataFrame
    k_min: int
    average_severity: float        # AS_D over the table (Eq. 8)
    l_target: float                # AS_D clipped to the paper's diversity range 3..25
    severity_penalty: float        # SP_tot over the published tuples (Eq. 6)
    qis: Mapping


def severity_anonymize(df: pd.DataFrame, qis: Mapping[str, QISpec], sensitive: str, severity: Mapping | str,
                       k_cons: int = 5, individual: str | None = None, rule: str = "merge",
                       default_severity: float | None = None, cap: int | None = None, l_floor: int = 1,
                       k_min_from: str = "data") -> SeverityResult:
    """Seed 003 on a DataFrame (``qis`` as in :func:`~stream_anon.strategies.tabular.frame_attributes`).

    ``rule``: ``"merge"`` (classes meet AS_e <= l_e by construction), ``"top"`` (the paper: size-rule classes,
    then every class with AS_e > l_e is generalized to the hierarchy roots / whole domains) or ``"none"``.
    ``k_min_from`` defaults to ``"data"`` here: a batch table is the paper's setting.
    """
    if rule not in RULES:
        raise ValueError(f"severity.rule: one of {RULES}, got {rule!r}")
    if not isinstance(k_cons, int) or k_cons < 1:
        raise ValueError(f"severity.k_cons: a positive integer, got {k_cons!r}")
    sr = SeverityRule(severity, default_severity, cap, l_floor, rule == "merge", k_min_from)
    attrs = frame_attributes(df, qis)
    units = (pd.factorize(df[individual])[0] if individual else np.arange(len(df))).astype(np.int64)
    values = df[sensitive].tolist()
    scores = sr.scores(values)
    kmin = sr.k_min(k_cons, scores)
    classes = median_partition(frame_keys(attrs), sr.acceptor(units, values, kmin))
    released = generalize_classes(df, classes, qis)
    top = []
    if rule == "top":
        for j, c in enumerate(classes):
            vals = [values[i] for i in c]
            if average_severity(scores[c]) > distinct_diversity(vals):
                top.append(j)
                idx = df.index[c]
                for name, spec in qis.items():
                    value = (spec.root if isinstance(spec, Hierarchy) else frozenset(spec.nodes)
                             if isinstance(spec, nx.Graph) else tuple(spec) if spec is not None
                             else (float(df[name].min()), float(df[name].max())))
                    released.loc[idx, name] = pd.Series([value] * len(idx), index=idx, dtype=object)
    placed = np.concatenate(classes) if classes else np.empty(0, np.int64)
    suppressed = np.setdiff1d(np.arange(len(df)), placed)
    cls = np.full(len(df), -1)
    for j, c in enumerate(classes):
        cls[c] = j
    sp = total_severity_penalty(cls[placed], [str(values[i]) for i in placed],
                                {v: s for v, s in zip(map(str, values), scores)}) if len(placed) else 0.0
    as_d = average_severity(scores)
    return SeverityResult(classes, suppressed, top, released, kmin, as_d,
                          float(np.clip(as_d, *L_RANGE)), sp, dict(qis))
