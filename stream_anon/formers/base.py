"""The contract between the engine's window core and a class former.

At every window close the core hands the former a :class:`WindowView` of the buffered records. The former
decides which rows form new equivalence classes (:class:`Plan`), and which due leftovers go into an earlier
published class; the core owns everything else (buffer, watermark, sequence numbers, the random generator, the
published-class registry, the release builder and the suppression reasons below).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

# re-exported: the engine counts a release's individuals per class with it
from stream_anon.criteria.k_individuals import K_REASON, LOSS_REASON

# Why a record was suppressed (published in manifests; the audit counts them by reason). A record whose class fails
# a configured criterion by its deadline carries that criterion's ``reason`` (stream_anon.criteria).
SUPPRESSED_NO_CLASS = K_REASON
SUPPRESSED_LOSS = LOSS_REASON
SUPPRESSED_END = "end_of_stream"
SUPPRESSED_VALUE_CHANGED = "invariant_value_changed"
SUPPRESSED_THIN_REUSE = "reused_class_fewer_than_k_new_individuals"


class Space(Protocol):
    """What a former reads of the QI space (:class:`stream_anon.engine.space.QISpace`; formers import no engine)."""
    width: np.ndarray          # (D,) upper - lower
    weight: np.ndarray         # (D,) NCP weights, summing to 1

    def snap(self, lo: np.ndarray, hi: np.ndarray, members: tuple | None = None
             ) -> tuple[np.ndarray, np.ndarray, list]: ...

    def ncp(self, lo: np.ndarray, hi: np.ndarray, labels: list | None = None) -> np.ndarray: ...


class Registry(Protocol):
    """What a former reads of the published classes (:class:`stream_anon.engine.registry.PublishedClasses`)."""
    tag: np.ndarray            # (classes,) registry tag of each class

    def __len__(self) -> int: ...

    def cover(self, X: np.ndarray) -> np.ndarray: ...

    def choose_random(self, X: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...


@dataclass
class WindowView:
    """The buffered records at a window close (read-only for the former; rows are buffer indices)."""
    X: np.ndarray              # (n, D) QI codes
    units: np.ndarray          # (n,) keyed 64-bit ids of the privacy unit
    times: np.ndarray          # (n,) event times (epoch seconds)
    sensitive: list            # n tuples aligned with the config's sensitive fields
    due: np.ndarray            # (n,) True: must be placed or suppressed at this close
    final: bool                # end of stream: everything is due
    window_end: float
    space: Space               # also handed to the strategy
    rng: np.random.Generator   # the release's generator (seed, partition, sequence)
    registry: Registry         # read-only here

    def __len__(self) -> int:
        return len(self.units)


@dataclass
class NewClass:
    rows: np.ndarray           # buffer rows of the class
    tag: int = -1              # registry tag (m-invariance: the class's signature id)


@dataclass
class Plan:
    """A former's decision for one close: new classes, rows it suppresses itself (with a reason), and rows whose
    class was refused for its information loss (suppressed as ``class_loss_above_limit`` when due)."""
    new_classes: list[NewClass] = field(default_factory=list)
    reused: dict[int, list[int]] = field(default_factory=dict)    # registry index -> rows (placed before forming)
    suppressed: dict[str, list[int]] = field(default_factory=dict)
    loss_rejected: np.ndarray | None = None


def thin_reuse_entries(reused: dict[int, list[int]], units: np.ndarray, k: int) -> np.ndarray:
    """Take out of ``reused`` (registry index -> rows) every entry whose rows hold fewer than ``k`` distinct
    individuals (``units``: the privacy unit of each row); returns the rows taken out.

    An adversary who reads the releases in order sees each release's additions to a reused class apart from its
    earlier members; one who knows a target was active in that box during that window has only the individuals
    added in that release as candidates. So the additions of every release hold k individuals, like a new class
    (CASTLE's reuse argument, Cao et al., ICDE 2008, section 4.3, covers an adversary who sees the class whole)."""
    thin = [c for c, rows in reused.items() if len(np.unique(units[rows])) < k]
    taken = [r for c in thin for r in reused.pop(c)]
    return np.array(taken, dtype=np.int64)


@dataclass
class Counterfeits:
    """Counterfeit records a former adds to one class of a release (m-invariance)."""
    individuals: int
    sensitive: list            # one sensitive tuple per counterfeit record


@runtime_checkable
class Former(Protocol):
    """Forms a release's classes. Implementations: :class:`~stream_anon.formers.kanon.KAnonymousFormer` and
    :class:`~stream_anon.formers.minvariant.MInvariantFormer`. A former is a
    :class:`~stream_anon.checkpoint.Checkpointable` (its core and keyed tables are part of the engine's state)."""

    @property
    def m(self) -> int | None:
        """m of an m-invariant former (its releases carry it), None for any other."""

    @property
    def shuffle_records(self) -> bool:
        """True: the release's records are shuffled (counterfeits must not be findable)."""

    @property
    def registry_tags(self) -> bool:
        """True: registered classes carry the tag of their NewClass."""

    def form(self, view: WindowView) -> Plan: ...

    def reuse(self, view: WindowView, rows: np.ndarray, plan: Plan) -> dict[int, list[int]]:
        """Due rows left over after forming -> registry index of an earlier class that takes them."""

    def complete(self, view: WindowView, groups: list, published_rows: list[int]) -> Sequence[Counterfeits | None]:
        """Called once per release with its classes in release order ``(class_id, rows, tag)`` and the rows it
        publishes in placement order; returns the counterfeits per class (or None) and updates the former's own
        state (e.g. binds signatures)."""

    def expire(self, now: float) -> None: ...

    def state_core(self) -> dict: ...

    def state_tables(self) -> dict: ...

    def load_state(self, core: dict, tables: dict) -> None: ...
