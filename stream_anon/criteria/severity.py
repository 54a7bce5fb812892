"""The severity rule of seed 003: severe sensitive values ask for larger and more diverse classes.

Kayem, Vester & Meinel, "Automated k-anonymization and l-diversity for shared data privacy", DEXA 2016
(../shared/papers/003_*.txt). Each sensitive category c has a severity S(c) (Table 1; e.g. Murder 25). A class
meets the rule when

- it holds at least ``clip(max S in the class, k_min, cap)`` distinct individuals **[our reading]**, with
  k_min = max(k_cons, min S) (Eq. 4); so every tuple's severity penalty S(c_d) / |e_d| (Eq. 5) is at most 1 unless
  ``cap`` (the paper's unstated size threshold) binds. In a stream k_min is taken over the severity map, fixed per
  configuration, so it does not move between windows;
- with ``diversity``: its average severity AS_e (Eq. 10, the mean over the class's tuples) is at most its number of
  distinct values l_e, and l_e >= ``l_floor`` (the CG-Diverse rule, Sec. 3.4: a class with AS_e > l_e is at risk).

An unmapped value (null included) gets ``default_severity`` (default: the map's maximum, privacy first). Not
monotone: a severe record added to a class raises what it needs.

>>> import numpy as np
>>> from stream_anon.criteria.base import Classes, Column
>>> rule = SeverityRule("crime", {"Theft": 5, "Murder": 25}, k_min=5)
>>> crimes = Column.encode(["Theft"] * 5 + ["Murder"] + ["Theft"] * 4)
>>> c = Classes.of([np.arange(5), np.arange(5, 10)], np.arange(10), {"crime": crimes})
>>> rule.holds(c).tolist()     # AS_e 5 > l_e 1; and a Murder needs 25 individuals
[False, False]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, cast

import numpy as np

from stream_anon.criteria.base import Classes
from stream_anon.validation import MAX_COUNT, check_bool, check_integer, check_number, check_text

# Table 1 of the paper (guideline sentence as weight) and Example 2 (Murder): the ``crime`` preset.
CRIME_SEVERITY = {"Embezzlement": 3, "Disorderly Conduct": 3, "Theft": 5, "Drunken Driving": 5,
                  "Robbery": 7, "Murder": 25}
PRESETS = ("crime",)


def severity_map(severity) -> dict[str, float]:
    """A severity map (value -> positive number) or a preset's name, validated, keys as text."""
    if isinstance(severity, str):
        if severity not in PRESETS:
            raise ValueError(f"severity: unknown preset {severity!r}; known: {list(PRESETS)}")
        severity = CRIME_SEVERITY
    if not isinstance(severity, Mapping) or not severity:
        raise ValueError("severity: a non-empty mapping sensitive value -> severity, or a preset")
    for v, s in severity.items():
        check_number(s, f"severity.{v}", above=0, at_most=MAX_COUNT)
    return {str(k): float(v) for k, v in severity.items()}


def k_min(k_cons: int, severities: Iterable[float]) -> int:
    """k_min = max(k_cons, min S) (Eq. 4)."""
    return int(max(k_cons, min(severities)))


@dataclass(frozen=True)
class SeverityRule:
    """Seed 003's rule on sensitive ``field`` (module docstring). ``k_min``: the minimum class size in individuals."""
    field: str
    severity: Mapping | str
    k_min: int = 1
    default_severity: float | None = None
    cap: int | None = None
    l_floor: int = 1
    diversity: bool = True
    kind = "severity"
    monotone = False

    def __post_init__(self) -> None:
        check_text(self.field, "field")
        object.__setattr__(self, "severity", severity_map(self.severity))
        if self.default_severity is not None:
            check_number(self.default_severity, "default_severity", above=0, at_most=MAX_COUNT)
        check_integer(self.k_min, "k_min", 1, MAX_COUNT)
        if self.cap is not None:
            check_integer(self.cap, "cap", 1, MAX_COUNT)
        check_integer(self.l_floor, "l_floor", 1, MAX_COUNT)
        check_bool(self.diversity, "diversity")

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.field,)

    @property
    def reason(self) -> str:
        return f"severity_rule_not_met:{self.field}"

    @property
    def _severities(self) -> dict[str, float]:
        return cast(dict[str, float], self.severity)        # severity_map's, since __post_init__

    @property
    def default(self) -> float:
        return float(self.default_severity) if self.default_severity is not None else max(self._severities.values())

    def scores(self, values) -> np.ndarray:
        """S of each value (unmapped and null: the default)."""
        get, default = self._severities.get, self.default
        return np.array([get(str(v), default) if v is not None else default for v in values], dtype=float)

    def holds(self, classes: Classes) -> np.ndarray:
        if len(classes) == 0:
            return np.zeros(0, dtype=bool)
        column = classes.columns[self.field]
        s = self.scores(column.values)[column.codes]
        need = np.maximum(self.k_min, np.ceil(np.maximum.reduceat(s, classes.starts)))
        if self.cap is not None:
            need = np.maximum(self.k_min, np.minimum(need, self.cap))
        ok = classes.individuals >= need
        if self.diversity:
            l_e = classes.distinct_values(self.field)
            average = np.add.reduceat(s, classes.starts) / classes.sizes
            ok &= (l_e >= self.l_floor) & (average <= l_e)
        return ok
