"""Guarantee ``release_delta``: every release's additions to a class hold k distinct individuals, against an
adversary who reads the releases in order (:mod:`stream_anon.attacks.release_delta`).

The ``k`` check judges a class whole and at its creation; a reused class's later entries stand apart for a
reader of the record topic, who sees each release's additions to it and the manifest's count of them. This check
measures that attack's outcome on every published individual (its smallest candidate set over the entries holding
it; the entries' individuals recomputed from the raw events and the secret, never read from the manifests) and
fails on every reused entry of fewer individuals than the k its class was created under. Counterfeit records count
no one (a reader cannot tell them apart, but they are nobody). Computed here, apart from the attack's own code.
"""
from __future__ import annotations

from ..check import AuditContext, ViolationLog
from ..measures import class_individuals


class ReleaseDelta:
    name = "release_delta"

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        entries = class_individuals(ctx).per_release
        created: dict = {}
        for m in ctx.manifests:
            for c in m.get("classes") or []:
                if isinstance(c, dict) and not c.get("reused"):
                    created.setdefault(c.get("class_id"), m.get("release_id"))
        k_of = ctx.in_force.k_of
        k_class = {cid: k_of.get(created.get(cid), ctx.config.k) for _, cid in entries}
        for (rid, cid), units in sorted(entries.items(), key=lambda e: (str(e[0][0]), str(e[0][1]))):
            if len(units) < k_class[cid] and created.get(cid) != rid:     # creation entries: the k check's
                log.fail("release adds fewer than k individuals to a reused class", release_id=rid,
                         class_id=cid, individuals=len(units), k=k_class[cid])
        smallest: dict = {}                          # individual -> its smallest candidate set
        exposed: set = set()
        for (rid, cid), units in entries.items():
            if len(units) < k_class[cid]:
                exposed |= units
            for u in units:
                smallest[u] = min(smallest.get(u, len(units)), len(units))
        log.details.update(targets=len(smallest), min_candidates=min(smallest.values(), default=None),
                           singled_out=sum(1 for n in smallest.values() if n == 1), targets_below_k=len(exposed),
                           entries_below_k=sum(1 for (_, cid), units in entries.items() if len(units) < k_class[cid]))
        return log.result()
