"""Class-forming strategies: how a window's buffered records are grouped into equivalence classes.

A strategy is a class with ``form_classes(X, units, k, space, rng) -> list[np.ndarray]``:
- ``X``: (n, D) float codes of the buffered records (``stream_anon.engine.space.QISpace``);
- ``units``: (n,) int64 privacy-unit ids (equal ids = same individual);
- ``k``: every returned class must hold records of at least k distinct units;
- ``space``: the QI space (bounds, widths, weights, hierarchies) for distance and loss;
- ``rng``: a seeded ``numpy.random.Generator`` (the only source of randomness).
A strategy with ``uses_sensitive = True`` also gets ``sensitive=`` (sensitive field -> values of the rows).
It returns arrays of row indices; rows in no class stay deferred. The k-anonymous former
(``stream_anon.formers.kanon``) checks the k condition again before anything is published, so a faulty strategy
can cost utility, never privacy.

Its parameters (``[anonymization.strategy_params]``) are a frozen dataclass, the class attribute ``Params``,
that validates itself in ``__post_init__`` and checks its references to the rest of the configuration in
``check_config(sensitive, qi_names)``; the constructor takes the same keywords. A new strategy is one module
plus one line in ``STRATEGIES`` (README, developer section).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from stream_anon.strategies.cardata import CarData
from stream_anon.strategies.grouping import Grouping
from stream_anon.strategies.heuristicmin import HeuristicMin
from stream_anon.strategies.mondrian import Mondrian
from stream_anon.strategies.severity import Severity
from stream_anon.strategies.utility_clustering import UtilityClustering


class Strategy(Protocol):
    name: str
    uses_sensitive: bool
    Params: type          # frozen dataclass of the strategy's parameters

    def form_classes(self, X: np.ndarray, units: np.ndarray, k: int, space, rng: np.random.Generator,
                     sensitive: dict[str, list] | None = None) -> list[np.ndarray]:
        ...


STRATEGIES: dict[str, type] = {
    "mondrian": Mondrian,
    "heuristicmin": HeuristicMin,
    "utility-clustering": UtilityClustering,
    "severity": Severity,
    "grouping": Grouping,
    "car-data": CarData,
}


def make_strategy(name: str, params: dict | None = None):
    return STRATEGIES[name](**(params or {}))
