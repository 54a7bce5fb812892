"""k-anonymity counted in distinct individuals, and the loss limit of a class.

k-anonymity (Sweeney, "k-anonymity: a model for protecting privacy", IJUFKS 2002): every published class is
indistinguishable among at least k. In a stream one person has many records, so k counts distinct privacy units,
not records (CASTLE, Cao et al., ICDE 2008, counts tuples; one commuter's taps would fill a class alone).

>>> import numpy as np
>>> from stream_anon.criteria.base import Classes
>>> c = Classes.of([np.array([0, 1, 2]), np.array([3, 4, 5])], np.array([1, 1, 1, 2, 3, 4]))
>>> KIndividuals(3).holds(c).tolist()
[False, True]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_anon.criteria.base import Classes

# the engine's reason for records left in no class at their deadline (published in manifests since the first
# release format; k failures keep it)
K_REASON = "fewer_than_k_individuals_by_deadline"
LOSS_REASON = "class_loss_above_limit"


@dataclass(frozen=True)
class KIndividuals:
    """At least ``k`` distinct privacy units per class (``anonymization.k``, never a ``criteria`` entry)."""
    k: int
    kind = "k"
    fields = ()
    reason = K_REASON
    monotone = True          # adding records never removes an individual

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ValueError(f"k: a positive integer, got {self.k!r}")

    def holds(self, classes: Classes) -> np.ndarray:
        return classes.individuals >= self.k


@dataclass(frozen=True)
class MaxClassNCP:
    """A class's normalized certainty penalty (Xu et al., "Utility-based anonymization using local recoding", KDD
    2006) at most ``limit`` (``anonymization.max_class_ncp``). Not a privacy criterion but a utility floor: a class
    wider than this is not published and its records wait. Monotone: a record reused into a class lies inside its
    box, which does not change."""
    limit: float
    kind = "max_class_ncp"
    fields = ()
    reason = LOSS_REASON
    monotone = True

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, (int, float)) or not 0 < self.limit <= 1:
            raise ValueError(f"max_class_ncp: in (0, 1], got {self.limit!r}")

    @property
    def binding(self) -> bool:
        """Whether the limit can reject a class: an NCP is at most 1 (stream_anon.engine.space.QISpace.ncp), so a
        limit of 1 never does, and the former need not snap the boxes to learn it."""
        return self.limit < 1

    def holds(self, classes: Classes) -> np.ndarray:
        if classes.ncp is None:
            raise ValueError("max_class_ncp: the classes carry no NCP")
        return np.asarray(classes.ncp) <= self.limit
