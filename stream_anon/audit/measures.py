"""Measurements of the published outputs: numbers a report states, never a verdict.

The privacy criteria (:mod:`.checks.k_individuals`, :mod:`.checks.m_invariance`) judge these numbers against
the configured k and m; keeping the counting apart (ARX's split of criteria and metrics) lets a report state the
same figures whatever the criterion.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .check import AuditContext


@dataclass
class ClassIndividuals:
    """Distinct privacy units behind each class's real records: over all releases, and per (release, class)."""

    overall: dict[Any, set] = field(default_factory=lambda: defaultdict(set))
    per_release: dict[tuple, set] = field(default_factory=lambda: defaultdict(set))
    counterfeit_records: int = 0
    unknown_records: list[dict] = field(default_factory=list)    # records of no raw event, not counterfeit

    @property
    def min_individuals(self) -> int | None:
        return min((len(u) for u in self.overall.values()), default=None)


def class_individuals(ctx: AuditContext) -> ClassIndividuals:
    """Count the individuals of every class (a record whose event has no privacy unit counts no one; an
    announced counterfeit record is no individual)."""
    out = ClassIndividuals()
    for r in ctx.records:
        cid, rid = r.get("class_id"), r.get("release_id")
        raw = ctx.by_token.get(r.get("audit_token"))
        if raw is None and ctx.is_counterfeit(r):
            out.counterfeit_records += 1
        elif raw is None:
            out.unknown_records.append(r)
        elif raw.unit is not None:
            out.overall[cid].add(raw.unit)
            out.per_release[(rid, cid)].add(raw.unit)
        else:
            out.overall.setdefault(cid, set())
            out.per_release.setdefault((rid, cid), set())
    return out


def counterfeit_lower_bound(releases: Iterable[Any], m: int) -> int:
    """Sum over releases of ``max(0, m*c - n)``: a release of n individuals whose most common invariant value is
    held by c of them needs at least that many counterfeit individuals to be m-unique (any split into classes
    needs at least as many). Each release is either a mapping value -> number of individuals, or an iterable of
    values with one item per individual.

    >>> counterfeit_lower_bound([{"a": 2, "b": 1}, ["x", "y"]], 2)
    1
    """
    total = 0
    for rel in releases:
        counts = Counter(dict(rel)) if isinstance(rel, Mapping) else Counter(rel)
        n = sum(counts.values())
        c = max(counts.values(), default=0)
        total += max(0, m * c - n)
    return total
