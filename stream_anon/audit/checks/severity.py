"""Privacy criterion ``severity``: seed 003's rule (Kayem, Vester & Meinel, DEXA 2016; ``[[anonymization.criteria]]``
``kind = "severity"``), re-derived from the published records. Defeats a k-anonymous release that puts a severe
value (a murder report, a disability pass) in a class of k people: the severity penalty S / |class| above 1.

For each class (all its releases, and its creating release), with S the severity of a record's published value
(unmapped or null: the configured default, else the map's maximum):

- its distinct individuals (raw events' privacy units; a record of no known individual counts no one) are at least
  ``max(k_min, ceil(max S))``, capped at ``cap`` (never below k_min), k_min = max(anonymization.k, min S of the map);
- with ``diversity``: its number of distinct values l_e is at least ``l_floor`` and its average severity over its
  records AS_e is at most l_e.

Written here, apart from ``stream_anon.criteria``, so that a bug in the engine's rule cannot pass its own check.
A class is judged by the rule of the config in force when its creating release was made (:mod:`..in_force`: its
k_min follows the k in force). A release made under a rule no given config has fails once per rule, with one line
naming it; its classes are not judged by another rule.
"""
from __future__ import annotations

import math
from typing import Any

from ..check import AuditContext, ViolationLog
from ..config import SeveritySpec
from ..inputs import canonical_json
from ..measures import class_members


def violations(spec: SeveritySpec, members: list[tuple[Any, dict]]) -> list[str]:
    """What the class breaks of ``spec`` (empty: it meets the rule).

    >>> spec = SeveritySpec("c", {"Theft": 5.0, "Murder": 25.0}, k_min=5, default=25.0)
    >>> violations(spec, [(f"u{i}", {"sensitive": {"c": "Theft"}}) for i in range(5)])
    ['average severity above distinct values']
    """
    values = [(r.get("sensitive") or {}).get(spec.field) if isinstance(r.get("sensitive"), dict) else None
              for _, r in members]
    scores = [spec.score(v) for v in values]
    need = max(spec.k_min, math.ceil(max(scores, default=0.0)))
    if spec.cap is not None:
        need = max(spec.k_min, min(need, spec.cap))
    out = []
    if len({u for u, _ in members if u is not None}) < need:
        out.append("fewer individuals than the severity asks")
    if spec.diversity:
        l_e = len({canonical_json(v) for v in values})
        if l_e < spec.l_floor:
            out.append("distinct values below l_floor")
        if scores and sum(scores) / len(scores) > l_e:
            out.append("average severity above distinct values")
    return out


class Severity:
    name = "severity"

    def applies(self, ctx: AuditContext) -> bool:
        return any(isinstance(c, SeveritySpec) for cfg in ctx.in_force.used() for c in cfg.criteria) \
            or bool(ctx.in_force.unmatched_lines(self.name))

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        for entry in ctx.in_force.unmatched_lines(self.name):
            log.fail("release made under settings no given config has", **entry)
        members = class_members(ctx)
        specs = [c for c in ctx.config.criteria if isinstance(c, SeveritySpec)]
        for when, classes in (("all releases", members.overall), ("at creation", members.at_creation)):
            for cid, recs in classes.items():
                rid = members.created.get(cid)
                unjudged = ctx.in_force.skipped(rid, self.name)
                for spec in (c for i, c in enumerate(ctx.config_for(rid).criteria)
                             if isinstance(c, SeveritySpec) and f"anonymization.criteria[{i}]" not in unjudged):
                    for what in violations(spec, recs):
                        log.fail(f"{what} ({when})", class_id=cid, field=spec.field, k_min=spec.k_min)
        log.details.update(classes=len(members.overall),
                           criteria=[{"field": s.field, "k_min": s.k_min, "cap": s.cap, "l_floor": s.l_floor,
                                      "diversity": s.diversity} for s in specs])
        return log.result()
