"""l-diversity of one sensitive field: what an adversary who knows a person is in a class learns about its value.

Machanavajjhala, Kifer, Gehrke & Venkitasubramaniam, "l-Diversity: Privacy Beyond k-Anonymity", ACM TKDD 1(1), 2007:
a k-anonymous class whose records share one sensitive value discloses it (the homogeneity attack, Sec. 3.1).

- :class:`DistinctLDiversity`: at least l distinct values per class (the paper's weakest form, Sec. 4.1; seed 003's
  l_e). It does not stop a class where one value dominates.
- :class:`EntropyLDiversity`: the entropy of the class's value distribution is at least log(l) (Definition 4.2).
- :class:`FrequencyLDiversity`: no value has more than 1/l of the class (Xiao & Tao, "Anatomy", VLDB 2006,
  Definition 2; the per-bucket test of Slicing, Li et al., TKDE 2012, that seed 002 uses). It implies entropy
  l-diversity (min-entropy is at most Shannon entropy), which implies distinct l-diversity.

The distributions are counted in individuals (:meth:`~stream_anon.criteria.base.Classes.value_shares`), as k is;
null is a value. Float comparisons allow ``TOLERANCE`` (a uniform class over exactly l values must pass).

>>> import numpy as np
>>> from stream_anon.criteria.base import Classes, Column
>>> s = Column.encode(["a"] * 6 + ["b", "c"])                     # one value dominates
>>> c = Classes.single(np.arange(8), {"s": s})
>>> [int(DistinctLDiversity("s", 3).holds(c)[0]), int(EntropyLDiversity("s", 3).holds(c)[0])]
[1, 0]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stream_anon.criteria.base import Classes
from stream_anon.validation import MAX_COUNT, check_integer, check_number, check_text

TOLERANCE = 1e-9


def _check(field: str, l, integer: bool) -> None:
    check_text(field, "field")
    if integer:
        check_integer(l, "l", 1, MAX_COUNT)
    else:
        check_number(l, "l", at_least=1, at_most=MAX_COUNT)


@dataclass(frozen=True)
class DistinctLDiversity:
    """At least ``l`` distinct values of ``field`` among a class's records. Monotone: records added to a class never
    remove a value."""
    field: str
    l: int
    kind = "distinct_l_diversity"
    monotone = True

    def __post_init__(self) -> None:
        _check(self.field, self.l, integer=True)

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.field,)

    @property
    def reason(self) -> str:
        return f"distinct_l_diversity_not_met:{self.field}"

    def holds(self, classes: Classes) -> np.ndarray:
        return classes.distinct_values(self.field) >= self.l


@dataclass(frozen=True)
class EntropyLDiversity:
    """Entropy of ``field``'s distribution in the class (natural log, counted in individuals) at least log(``l``).
    Not monotone: records of a frequent value added to a class lower its entropy."""
    field: str
    l: float
    kind = "entropy_l_diversity"
    monotone = False

    def __post_init__(self) -> None:
        _check(self.field, self.l, integer=False)

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.field,)

    @property
    def reason(self) -> str:
        return f"entropy_l_diversity_not_met:{self.field}"

    def holds(self, classes: Classes) -> np.ndarray:
        pair_class, share = classes.value_shares(self.field)
        entropy = np.bincount(pair_class, weights=-share * np.log(share), minlength=len(classes))
        return entropy >= math.log(self.l) - TOLERANCE


@dataclass(frozen=True)
class FrequencyLDiversity:
    """No value of ``field`` held by more than 1/``l`` of the class (counted in individuals). Not monotone."""
    field: str
    l: float
    kind = "frequency_l_diversity"
    monotone = False

    def __post_init__(self) -> None:
        _check(self.field, self.l, integer=False)

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.field,)

    @property
    def reason(self) -> str:
        return f"frequency_l_diversity_not_met:{self.field}"

    def holds(self, classes: Classes) -> np.ndarray:
        pair_class, share = classes.value_shares(self.field)
        top = np.zeros(len(classes))
        np.maximum.at(top, pair_class, share)
        return (top * self.l <= 1.0 + TOLERANCE) & (classes.sizes > 0)
