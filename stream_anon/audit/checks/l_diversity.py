"""Privacy criterion ``l_diversity``: the configured l-diversity criteria (``[[anonymization.criteria]]`` kinds
``distinct_l_diversity``, ``entropy_l_diversity``, ``frequency_l_diversity``), re-derived from the published
records alone. Defeats the homogeneity attack (Machanavajjhala et al., TKDD 2007): a class whose records share one
sensitive value tells anyone who knows a person is in it that person's value, however many individuals it holds.

A class is what an adversary sees as one: every record with its ``class_id``, over all the releases it appears in,
and also its records in the release that created it. The sensitive value of a record is its published
``sensitive[field]`` (absent or null: the value null); two values are equal when their JSON texts are. For each
class:

- distinct: at least l distinct values;
- entropy: -sum p log p >= log l (natural log, 1e-9 of float slack), p the share of a value counted in individuals;
- frequency: no share above 1/l (1e-9 slack).

A share counted in individuals: each individual (the raw event's privacy unit) of the class weighs 1, spread evenly
over its records there; a record of no known individual counts as one individual of its own. Written here, apart
from ``stream_anon.criteria``, so that a bug in the engine's criteria cannot pass its own check.

A class is judged by the criteria of the config in force when its creating release was made (:mod:`..in_force`;
classes are never reused across an accepted change). A release made under a criterion no given config has fails
once per such criterion, with one line naming it; its classes are not judged by another l.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from ..check import AuditContext, ViolationLog
from ..config import LDiversitySpec
from ..inputs import canonical_json
from ..measures import class_members

SLACK = 1e-9


def value_shares(members: list[tuple[Any, dict]], field: str) -> dict[str, float]:
    """Share of each published value of ``field`` in the class, counted in individuals.

    >>> shares = value_shares([("u1", {"sensitive": {"f": "a"}}), ("u1", {"sensitive": {"f": "a"}}),
    ...                        ("u2", {"sensitive": {"f": "b"}})], "f")
    >>> shares == {'"a"': 0.5, '"b"': 0.5}
    True
    """
    by_unit: dict[Any, Counter] = defaultdict(Counter)
    for i, (unit, record) in enumerate(members):
        sensitive = record.get("sensitive")
        value = sensitive.get(field) if isinstance(sensitive, dict) else None
        by_unit[unit if unit is not None else ("record", i)][canonical_json(value)] += 1
    shares: dict[str, float] = defaultdict(float)
    for counts in by_unit.values():
        n = sum(counts.values())
        for value, c in counts.items():
            shares[value] += c / n
    return {v: s / len(by_unit) for v, s in shares.items()}


def diversity(spec: LDiversitySpec, members: list[tuple[Any, dict]]) -> tuple[float, bool]:
    """(the measured figure, whether it meets ``spec``): distinct values, the entropy's exponent exp(H) or
    1 / the largest share, so each figure is compared with l."""
    shares = value_shares(members, spec.field)
    if spec.kind == "distinct_l_diversity":
        figure = float(len(shares))
        return figure, figure >= spec.l
    if spec.kind == "entropy_l_diversity":
        entropy = -sum(p * math.log(p) for p in shares.values() if p > 0)
        return math.exp(entropy), entropy >= math.log(spec.l) - SLACK
    top = max(shares.values(), default=1.0)
    return 1.0 / top, top * spec.l <= 1.0 + SLACK


class LDiversity:
    name = "l_diversity"

    def applies(self, ctx: AuditContext) -> bool:
        return any(isinstance(c, LDiversitySpec) for cfg in ctx.in_force.used() for c in cfg.criteria) \
            or bool(ctx.in_force.unmatched_lines(self.name))

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        for entry in ctx.in_force.unmatched_lines(self.name):
            log.fail("release made under settings no given config has", **entry)
        members = class_members(ctx)
        lowest: dict[str, float] = {}
        for when, classes in (("all releases", members.overall), ("at creation", members.at_creation)):
            for cid, recs in classes.items():
                rid = members.created.get(cid)
                unjudged = ctx.in_force.skipped(rid, self.name)
                for i, spec in enumerate(ctx.config_for(rid).criteria):
                    if not isinstance(spec, LDiversitySpec) or f"anonymization.criteria[{i}]" in unjudged:
                        continue
                    name = f"{spec.kind}:{spec.field}"
                    figure, ok = diversity(spec, recs)
                    lowest[name] = min(lowest.get(name, math.inf), figure)
                    if not ok:
                        log.fail(f"class below {spec.kind} ({when})", class_id=cid, field=spec.field, l=spec.l,
                                 measured=round(figure, 6))
        log.details.update(classes=len(members.overall),
                           lowest={name: round(v, 6) for name, v in lowest.items()},
                           criteria=[{"kind": c.kind, "field": c.field, "l": c.l} for c in ctx.config.criteria
                                     if isinstance(c, LDiversitySpec)])
        return log.result()
