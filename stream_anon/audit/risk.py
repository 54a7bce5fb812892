"""Re-identification risk of every release, recomputed by the audit from what it counts itself: figures, never a
verdict (the ``risk`` check, :class:`MaxProsecutorRisk`, judges them against ``--max-prosecutor-risk``).

Class sizes: the distinct privacy units behind a class's real records (from the raw events, as the ``k`` check
counts them; counterfeit records are no one). A class is one ``class_id`` over every release it appears in
(docs/privacy.md, Reuse of published classes): in release r it holds every individual published in it in r or in
an earlier release of its partition. The figures of a release (:func:`stream_anon.risk.release_risk`) are over the
release's own individuals (the distinct units of its real records), each at the size of the smallest class holding
its records in the release; the run's figures weigh the releases by their own individuals.

For an m-invariant stream, :func:`intersection_candidates` measures the cross-release attack of
``stream_anon.attacks.intersection`` (knowledge of the target's quasi-identifiers in every release it appears in)
with the audit's own covering test (under the hierarchies in force when each release was made): for a seeded
sample of individuals, the set of invariant values still possible after intersecting the signatures of every class
that could hold them; the risk is 1 / the smallest set.
"""
from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from stream_anon.risk import RiskSettings, release_risk

from .check import AuditContext, ViolationLog
from .primitives import as_text, covers, get_path, qi_value

INTERSECTION_TARGETS = 200       # individuals sampled for the cross-release figure
INTERSECTION_SEED = 29


def _release_order(ctx: AuditContext) -> list[dict]:
    return sorted(ctx.manifests, key=lambda m: (str(m.get("partition")), m.get("seq") or 0, str(m.get("release_id"))))


def release_class_sizes(ctx: AuditContext) -> list[tuple[dict, list[int], list[int]]]:
    """(manifest, class sizes, individual sizes) of every release, in release order within each partition. Class
    sizes: the distinct individuals of each class the release publishes real records in, over the class's releases
    up to this one. Individual sizes: for each distinct individual the release publishes real records of (its own
    individuals), the size of the smallest class holding them in this release."""
    units: dict[tuple, set] = defaultdict(set)          # (release_id, class_id) -> units of its real records
    for r in ctx.records:
        raw = ctx.raw_of(r)
        if raw is not None and raw.unit is not None:
            units[(r.get("release_id"), r.get("class_id"))].add(raw.unit)
    by_release: dict[Any, list] = defaultdict(list)
    for (rid, cid), us in units.items():
        by_release[rid].append((cid, us))
    so_far: dict[Any, set] = defaultdict(set)           # class_id -> individuals published in it so far
    out = []
    for m in _release_order(ctx):
        sizes: list[int] = []
        smallest: dict[str, int] = {}                   # unit -> the size of the smallest class holding it
        for cid, us in sorted(by_release.get(m.get("release_id"), []), key=lambda x: str(x[0])):
            so_far[cid] |= us
            f = len(so_far[cid])
            sizes.append(f)
            for u in us:
                smallest[u] = min(smallest.get(u, f), f)
        out.append((m, sizes, list(smallest.values())))
    return out


def _pooled(per: list[dict], model: str) -> dict | None:
    rows = [(p["individuals"], p[model]) for p in per if p.get(model)]
    if not rows:
        return None
    n = sum(i for i, _ in rows)
    return {"highest": max(f["highest"] for _, f in rows),
            "average": round(sum(i * f["average"] for i, f in rows) / n, 6),
            "records_at_risk": round(sum(i * f["records_at_risk"] for i, f in rows) / n, 6)}


def risk_figures(ctx: AuditContext, settings: RiskSettings, with_attack: bool = True) -> dict:
    """``per_release`` (one entry per release with individuals: its id, partition, seq, window and figures) and
    ``summary`` (the run's: the highest risk of any release, averages weighted by the releases' individuals, the
    largest population uniqueness), plus ``intersection`` for an m-invariant stream."""
    per = []
    for m, sizes, own in release_class_sizes(ctx):
        fig = release_risk(sizes, settings, own)
        if fig is None:
            continue
        per.append({"release_id": m.get("release_id"), "partition": m.get("partition"), "seq": m.get("seq"),
                    "window_start": m.get("window_start"), "window_end": m.get("window_end"), **fig})
    summary: dict[str, Any] = {"releases": len(per), "threshold": settings.threshold,
                               "individuals": sum(p["individuals"] for p in per),
                               "prosecutor": _pooled(per, "prosecutor")}
    if per:
        summary["marketer"] = round(sum(p["individuals"] * p["marketer"] for p in per) / summary["individuals"], 6)
        worst = max(per, key=lambda p: (p["prosecutor"]["highest"], -per.index(p)))
        summary["highest_release_id"] = worst["release_id"]       # the first release with the highest risk
    journalist = _pooled(per, "journalist")
    if journalist is not None:
        journalist["population_uniqueness_max"] = max(
            p["journalist"]["population_uniqueness"]["share"] for p in per)
        summary["journalist"] = journalist
    out: dict[str, Any] = {"summary": summary, "per_release": per}
    cfg = ctx.config
    if with_attack and cfg.m is not None and cfg.invariant:
        out["intersection"] = intersection_candidates(ctx)
        summary["intersection_risk"] = out["intersection"].get("risk")
    return out


def intersection_candidates(ctx: AuditContext, n_targets: int = INTERSECTION_TARGETS,
                            seed: int = INTERSECTION_SEED, targets: list[str] | None = None) -> dict:
    """The intersection attack with knowledge of the targets' quasi-identifiers (module docstring): ``targets``,
    ``min_candidates``, ``mean_candidates``, ``pinned`` (one value left), ``risk`` (1 / min_candidates) and
    ``true_value_missed`` (targets whose true value fell out: 0 unless published values are wrong). Targets: a
    sample of ``n_targets`` of the individuals with published records (``seed``), or the given units."""
    invariant = ctx.config.invariant
    assert invariant is not None                         # an m-invariant stream's (module docstring)
    sigs: dict[tuple, set] = defaultdict(set)            # (release, class) -> invariant values published there
    gen: dict[tuple, dict] = {}
    seen: dict[str, dict[Any, list]] = defaultdict(lambda: defaultdict(list))
    truth: dict[str, set] = defaultdict(set)
    for r in ctx.records:
        key = (r.get("release_id"), r.get("class_id"))
        v = as_text(get_path(r.get("sensitive") or {}, invariant))
        if v is not None:
            sigs[key].add(v)
        gen.setdefault(key, r.get("qi") or {})
        raw = ctx.raw_of(r)
        if raw is None or raw.unit is None or raw.event is None:
            continue                                      # counterfeit: no individual behind it
        seen[raw.unit][key[0]].append(raw.event)
        truth[raw.unit].add(as_text(get_path(raw.event, invariant)))
    classes_of: dict[Any, list] = defaultdict(list)
    for key, qi in gen.items():
        classes_of[key[0]].append((key, qi))
    pool = sorted(seen) if targets is None else [t for t in targets if t in seen]
    if targets is None and len(pool) > n_targets:
        pool = sorted(random.Random(seed).sample(pool, n_targets))
    sizes, missed = [], 0
    for unit in pool:
        cands: set | None = None
        for rid, events in seen[unit].items():
            qis = ctx.config_for(rid).quasi_identifiers        # the hierarchies in force when rid was made
            for event in events:
                values = [qi_value(q, event) for q in qis]
                c = set().union(*[sigs[k] for k, qi in classes_of[rid]
                                  if all(covers(q, qi.get(q.name), v) for q, v in zip(qis, values))])
                cands = c if cands is None else cands & c
        cands = cands or set()
        missed += not (truth[unit] - {None}) <= cands
        sizes.append(len(cands))
    if not sizes:
        return {"targets": 0, "min_candidates": None, "mean_candidates": None, "pinned": 0, "risk": None,
                "true_value_missed": 0}
    smallest = min(sizes)
    return {"targets": len(sizes), "min_candidates": smallest, "mean_candidates": round(sum(sizes) / len(sizes), 4),
            "pinned": sum(s == 1 for s in sizes), "risk": round(1 / smallest, 6) if smallest else 1.0,
            "true_value_missed": missed}


class MaxProsecutorRisk:
    """The ``risk`` check (``stream-anon audit --max-prosecutor-risk R``): every release's highest prosecutor
    risk is at most R (a release holding a class of f individuals has 1/f)."""

    name = "risk"

    def __init__(self, limit: float):
        if not 0 < limit <= 1:
            raise ValueError(f"--max-prosecutor-risk: in (0, 1], got {limit}")
        self.limit = limit

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext, figures: dict) -> dict:
        log = ViolationLog()
        worst = 0.0
        for p in figures["per_release"]:
            highest = p["prosecutor"]["highest"]
            worst = max(worst, highest)
            if highest > self.limit:
                log.fail("prosecutor risk above the limit", release_id=p["release_id"], highest=highest,
                         limit=self.limit, line=f"release {p['release_id']}: highest prosecutor risk {highest:g} > "
                                                f"{self.limit:g} (a class of {round(1 / highest)} individuals)")
        log.details.update({"limit": self.limit, "releases": len(figures["per_release"]), "highest": worst})
        return log.result()
