"""Class-forming strategies: how a window's buffered records are grouped into equivalence classes.

A strategy is a class with ``form_classes(X, units, k, space, rng) -> list[np.ndarray]``:
- ``X``: (n, D) float codes of the buffered records (``stream_anon.engine.space.QISpace``);
- ``units``: (n,) int64 privacy-unit ids (equal ids = same individual);
- ``k``: every returned class must hold records of at least k distinct units;
- ``space``: the QI space (bounds, widths, weights, hierarchies) for distance and loss;
- ``rng``: a seeded ``numpy.random.Generator`` (the only source of randomness).
A strategy with ``uses_sensitive = True`` also gets ``sensitive=`` (sensitive field -> values of the rows).
It returns arrays of row indices; rows in no class stay deferred. The engine checks the k condition again
before it publishes anything, so a faulty strategy can cost utility, never privacy.

Register new strategies in ``STRATEGIES`` (the source papers' algorithms plug in here).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from stream_anon.strategies.mondrian import Mondrian


class Strategy(Protocol):
    name: str

    def form_classes(self, X: np.ndarray, units: np.ndarray, k: int, space, rng: np.random.Generator
                     ) -> list[np.ndarray]:
        ...


STRATEGIES: dict[str, type] = {"mondrian": Mondrian}
from stream_anon.strategies.heuristicmin import HeuristicMin  # noqa: E402
STRATEGIES["heuristicmin"] = HeuristicMin
from stream_anon.strategies.utility_clustering import UtilityClustering  # noqa: E402
STRATEGIES["utility-clustering"] = UtilityClustering
from stream_anon.strategies.severity import Severity  # noqa: E402
STRATEGIES["severity"] = Severity
from stream_anon.strategies.grouping import Grouping  # noqa: E402
STRATEGIES["grouping"] = Grouping
from stream_anon.strategies.cardata import CarData  # noqa: E402
STRATEGIES["car-data"] = CarData


def make_strategy(name: str, params: dict | None = None):
    return STRATEGIES[name](**(params or {}))
