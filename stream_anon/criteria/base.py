"""The contract of a privacy criterion: what must hold for every published class, apart from how classes are searched
for (ARX's split of ``criteria``, ``metric`` and ``algorithm``; docs/privacy-criteria.md).

A criterion judges many candidate classes at once. :class:`Classes` carries them as one concatenation of their
records, class by class: the privacy units of the records (k and the distributions count individuals, not
records), the coded values of the sensitive fields the criteria read, and optionally each class's NCP. A criterion
returns one boolean per class (:meth:`Criterion.holds`) and names itself in :attr:`Criterion.reason`, the
suppression reason of records whose class fails it by their deadline.

>>> from stream_anon.criteria import DistinctLDiversity
>>> units = np.array([1, 2, 3, 4, 5, 6])
>>> fare = Column.encode(["PAYG", "PAYG", "PAYG", "PAYG", "Freedom", "Travelcard"])
>>> classes = Classes.of([np.array([0, 1, 2]), np.array([3, 4, 5])], units, {"fare": fare})
>>> DistinctLDiversity("fare", 3).holds(classes).tolist()
[False, True]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Protocol, Sequence

import numpy as np


def value_key(v) -> tuple:
    """The identity of a published sensitive value: equal numbers are one value (180 and 180.0), a boolean is not a
    number (``true`` and ``1`` are published differently), null is a value like any other (a class whose records all
    carry null discloses "missing" as surely as any value)."""
    try:
        hash(v)
    except TypeError:
        return ("repr", repr(v))
    return (isinstance(v, bool), v)


@dataclass(frozen=True)
class Column:
    """One sensitive field's values over some records as integer codes (equal code = equal published value) and the
    value of each code."""
    codes: np.ndarray
    values: tuple = ()

    @classmethod
    def encode(cls, values: Sequence) -> "Column":
        index: dict = {}
        firsts: list = []
        codes = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            key = value_key(v)
            code = index.get(key)
            if code is None:
                code = index[key] = len(firsts)
                firsts.append(v)
            codes[i] = code
        return cls(codes, tuple(firsts))

    def take(self, rows: np.ndarray) -> "Column":
        return Column(self.codes[rows], self.values)


@dataclass(frozen=True)
class Classes:
    """Candidate classes: their records concatenated class by class (``sizes[j]`` records for class j)."""
    sizes: np.ndarray                      # (c,) records per class, each > 0
    units: np.ndarray                      # (n,) privacy-unit ids of the records
    columns: Mapping[str, Column] = field(default_factory=dict)   # sensitive field -> codes of the records
    ncp: np.ndarray | None = None          # (c,) information loss of each class's published box

    @classmethod
    def of(cls, groups: Sequence[np.ndarray], units: np.ndarray, columns: Mapping[str, Column] | None = None,
           ncp: np.ndarray | None = None) -> "Classes":
        """Classes made of ``groups`` (row-index arrays into ``units`` and every column's codes)."""
        groups = [np.asarray(g, dtype=np.int64) for g in groups]
        rows = np.concatenate(groups) if groups else np.empty(0, dtype=np.int64)
        return cls(np.array([len(g) for g in groups], dtype=np.int64), np.asarray(units)[rows],
                   {f: c.take(rows) for f, c in (columns or {}).items()}, ncp)

    @classmethod
    def single(cls, units: np.ndarray, columns: Mapping[str, Column] | None = None) -> "Classes":
        """One class holding every given record (a search's candidate part)."""
        return cls(np.array([len(units)], dtype=np.int64), np.asarray(units), dict(columns or {}))

    def __len__(self) -> int:
        return len(self.sizes)

    @cached_property
    def labels(self) -> np.ndarray:
        """(n,) the class of each record."""
        return np.repeat(np.arange(len(self.sizes)), self.sizes)

    @cached_property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    @cached_property
    def individuals(self) -> np.ndarray:
        """(c,) distinct privacy units per class."""
        return distinct_per_group(self.units, self.sizes)

    def distinct_values(self, name: str) -> np.ndarray:
        """(c,) distinct values of sensitive field ``name`` per class."""
        return distinct_per_group(self.columns[name].codes, self.sizes)

    def value_shares(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The distribution of field ``name`` in each class, counted in individuals: every individual of a class
        weighs 1, spread evenly over its records there (the adversary targets a person; one person's many records
        must neither dominate nor dilute the distribution, as k counts persons). With one record per individual
        this is the textbook distribution over tuples. Returns ``(class of each (class, value) pair, its share)``,
        the shares of a class summing to 1.

        >>> c = Classes.of([np.arange(4)], np.array([7, 7, 7, 8]), {"s": Column.encode(list("aaab"))})
        >>> c.value_shares("s")[1].tolist()      # unit 7 holds "a" three times: 1 of 2 individuals
        [0.5, 0.5]
        """
        codes = self.columns[name].codes
        lab = self.labels
        if len(lab) == 0:
            return np.empty(0, dtype=np.int64), np.empty(0)
        # records of each (class, unit): a record weighs 1 / that count
        order = np.lexsort((self.units, lab))
        lu, uu = lab[order], self.units[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (lu[1:] != lu[:-1]) | (uu[1:] != uu[:-1])
        group = np.cumsum(new) - 1
        weight = np.empty(len(order))
        weight[order] = 1.0 / np.bincount(group)[group]
        # sum of weights per (class, value)
        order = np.lexsort((codes, lab))
        lv, cv = lab[order], codes[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (lv[1:] != lv[:-1]) | (cv[1:] != cv[:-1])
        starts = np.flatnonzero(new)
        pair_weight = np.add.reduceat(weight[order], starts)
        pair_class = lv[starts]
        return pair_class, pair_weight / self.individuals[pair_class]


def distinct_per_group(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Distinct values in each of the consecutive groups of ``values`` of the given sizes.

    >>> distinct_per_group(np.array([5, 5, 7, 1, 1, 1, 2]), np.array([3, 4])).tolist()
    [2, 2]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(values) == 0:
        return np.zeros(len(sizes), dtype=np.int64)
    label = np.repeat(np.arange(len(sizes)), sizes)
    order = np.lexsort((values, label))
    lv, vv = label[order], values[order]
    new = np.ones(len(vv), dtype=bool)
    new[1:] = (lv[1:] != lv[:-1]) | (vv[1:] != vv[:-1])
    return np.bincount(lv[new], minlength=len(sizes))


class Criterion(Protocol):
    """A privacy criterion every published class must meet.

    ``kind``: its name in ``[[anonymization.criteria]]``; ``fields``: the sensitive fields it reads; ``reason``: the
    suppression reason of records whose class fails it by their deadline; ``monotone``: a class that holds it still
    does with more records added inside its box (then CASTLE reuse of an earlier class cannot break it; a criterion
    that is not monotone turns reuse off, see :mod:`stream_anon.formers.kanon`)."""

    kind: str
    fields: tuple[str, ...]
    reason: str
    monotone: bool

    def holds(self, classes: Classes) -> np.ndarray:
        """(c,) True where the class meets the criterion."""
