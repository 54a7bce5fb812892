"""Privacy criterion ``k``: k-anonymity in distinct individuals, not in records.

For every class: distinct privacy units (via token -> raw event -> unit) over all its records across releases
>= k, and >= k already in the release that created it (manifest entry with ``reused: false``). Defeats counting
records instead of individuals, and classes that only reach k later. All records of a class must carry the same
``qi`` (else the class is not an equivalence class as seen by an attacker). Events whose unit is null do not
count as an individual (conservative). A class is judged by the k in force when its creating release was made
(:mod:`..in_force`: the k of the config in force then, or the k the manifests' walk finds when no given config has
that release's settings).
"""
from __future__ import annotations

from typing import Any

from ..check import AuditContext, ViolationLog
from ..inputs import canonical_json
from ..measures import class_individuals, creating_releases


class KInIndividuals:
    name = "k"

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        k = ctx.config.k
        k_of = ctx.in_force.k_of                            # each class judged by the k it was created under
        measured = class_individuals(ctx)
        for r in measured.unknown_records:
            log.fail("record of unknown event", release_id=r.get("release_id"), class_id=r.get("class_id"),
                     audit_token=r.get("audit_token"))
        qi_of_class: dict[Any, str] = {}
        for r in ctx.records:
            q = canonical_json(r.get("qi"))
            if qi_of_class.setdefault(r.get("class_id"), q) != q:
                log.fail("class with inconsistent generalization", class_id=r.get("class_id"),
                         release_id=r.get("release_id"))
        created = creating_releases(ctx.manifests)
        for cid, units in measured.overall.items():
            n = len(units)
            rid = created.get(cid)
            k_class = k_of.get(rid, k)
            if n < k_class:
                log.fail("class below k (all releases)", class_id=cid, individuals=n, k=k_class)
            if rid is None:
                log.fail("class without creating release", class_id=cid)
            else:
                n0 = len(measured.per_release.get((rid, cid), ()))
                if n0 < k_class:
                    log.fail("class below k at creation", class_id=cid, release_id=rid, individuals=n0, k=k_class)
        log.details.update(k=k, classes=len(measured.overall), min_individuals=measured.min_individuals,
                           counterfeit_records=measured.counterfeit_records)
        return log.result()
