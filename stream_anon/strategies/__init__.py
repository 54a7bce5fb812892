"""Class-forming strategies: how a window's buffered records are grouped into equivalence classes.

A strategy is a class with ``form_classes(X, units, k, space, rng) -> list[np.ndarray]``:
- ``X``: (n, D) float codes of the buffered records (``stream_anon.engine.space.QISpace``);
- ``units``: (n,) int64 privacy-unit ids (equal ids = same individual);
- ``k``: every returned class must hold records of at least k distinct units;
- ``space``: the QI space (bounds, widths, weights, hierarchies) for distance and loss;
- ``rng``: a seeded ``numpy.random.Generator`` (the only source of randomness).
A strategy with ``uses_sensitive = True`` also gets ``sensitive=`` (sensitive field -> values of the rows), and one
with ``uses_due = True`` gets ``due=`` ((n,) bool: the rows that must be placed or suppressed at this close; a row
that is not due may be left out to wait for the next close; the batch evaluation passes none).
It returns arrays of row indices; rows in no class stay deferred. The k-anonymous former
(``stream_anon.formers.kanon``) checks the k condition again before anything is published, so a faulty strategy
can cost utility, never privacy.

Its parameters (``[anonymization.strategy_params]``) are a frozen dataclass, the class attribute ``Params``,
that validates itself in ``__post_init__`` and checks its references to the rest of the configuration in
``check_config(sensitive, qi_names)``; the constructor takes the same keywords. A new strategy is one module
plus one line in ``STRATEGIES`` (README, developer section).
"""
from __future__ import annotations

import importlib
from typing import Protocol

import numpy as np


class Strategy(Protocol):
    name: str
    uses_sensitive: bool
    Params: type          # frozen dataclass of the strategy's parameters

    def form_classes(self, X: np.ndarray, units: np.ndarray, k: int, space, rng: np.random.Generator,
                     sensitive: dict[str, list] | None = None) -> list[np.ndarray]:
        ...


class _Registry(dict):
    """Strategy name -> class. A built-in strategy is listed as ``"module:Class"`` and imported when first asked
    for: a worker loads its own strategy only, not the others' pandas and networkx (~0.3 s of every start)."""

    def __getitem__(self, name: str) -> type:
        value = super().__getitem__(name)
        if isinstance(value, str):
            module, _, attr = value.partition(":")
            value = getattr(importlib.import_module(module), attr)
            super().__setitem__(name, value)
        return value

    def get(self, name, default=None):
        return self[name] if name in self else default

    def values(self):
        return [self[name] for name in self]

    def items(self):
        return [(name, self[name]) for name in self]


STRATEGIES: dict[str, type[Strategy]] = _Registry({
    "mondrian": "stream_anon.strategies.mondrian:Mondrian",
    "heuristicmin": "stream_anon.strategies.heuristicmin:HeuristicMin",
    "utility-clustering": "stream_anon.strategies.utility_clustering:UtilityClustering",
    "severity": "stream_anon.strategies.severity:Severity",
    "grouping": "stream_anon.strategies.grouping:Grouping",
    "car-data": "stream_anon.strategies.cardata:CarData",
    "h3-mondrian": "stream_anon.strategies.h3_mondrian:H3Mondrian",
})
_CLASS_NAMES = {"Mondrian": "mondrian", "HeuristicMin": "heuristicmin", "UtilityClustering": "utility-clustering",
                "Severity": "severity", "Grouping": "grouping", "CarData": "car-data",
                "H3Mondrian": "h3-mondrian"}


def __getattr__(name: str):
    """``stream_anon.strategies.Mondrian`` and the other built-in classes, imported on first use."""
    if name in _CLASS_NAMES:
        return STRATEGIES[_CLASS_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_strategy(name: str, params: dict | None = None):
    return STRATEGIES[name](**(params or {}))
