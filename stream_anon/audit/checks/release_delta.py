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
from ..measures import class_individuals, creating_releases


class ReleaseDelta:
    name = "release_delta"

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        entries = class_individuals(ctx).per_release
        created = creating_releases(ctx.manifests)
        k_of = ctx.in_force.k_of
        smallest: dict = {}                          # individual -> its smallest candidate set
        exposed: set = set()
        below = 0
        for (rid, cid), units in sorted(entries.items(), key=lambda e: (str(e[0][0]), str(e[0][1]))):
            k = k_of.get(created.get(cid), ctx.config.k)
            if len(units) < k:
                below += 1
                exposed |= units
                if created.get(cid) != rid:          # a creation entry below k is the k check's
                    log.fail("release adds fewer than k individuals to a reused class", release_id=rid,
                             class_id=cid, individuals=len(units), k=k)
            for u in units:
                smallest[u] = min(smallest.get(u, len(units)), len(units))
        log.details.update(targets=len(smallest), min_candidates=min(smallest.values(), default=None),
                           singled_out=sum(1 for n in smallest.values() if n == 1), targets_below_k=len(exposed),
                           entries_below_k=below)
        return log.result()
