"""Intersection attack across releases (Xiao & Tao 2007; the thesis' Figure 4.1), and the naive baseline it beats.

Each release can be k-anonymous and l-diverse on its own and still leak: an individual who appears in several
releases sits in a class of every one of them, each class narrows the individual's invariant sensitive value
(fare product category, fleet contract) to the set of values published in it, and the adversary intersects
those sets. m-invariance defends by giving an individual's classes the same value set (signature) in every
release, filled with counterfeits where needed, so the intersection never drops below m values.

Adversary model (:func:`intersection_attack`)
---------------------------------------------
The adversary knows a target's identity-level quasi-identifiers and which releases the target appears in.

* ``knowledge="class"`` (default, the worst case): the adversary knows exactly which class holds the target in
  every release it appears in (evaluated here with the secret: token -> raw event -> privacy unit). The
  candidate set of a release is the intersection of the signatures (sets of invariant values published in the
  class in that release) of the target's classes there.
* ``knowledge="qi"``: the adversary knows the target's raw QI values (when and where it tapped) for each of its
  published events, and takes every class of that release whose generalization covers them (the same covering
  test as the audit). An event's candidates are the union of the covering classes' signatures; a release's are
  the intersection over the target's events in it.

The candidate set of a target is the intersection over its releases. It is **pinned** when one value is left.
Counterfeit records count in signatures (the adversary cannot tell them apart).

Baseline (:func:`naive_kl_releases`)
------------------------------------
The "naive" per-window anonymizer: for each event-time window on its own, individuals (distinct privacy units)
are sorted by their first event's QI values and grouped greedily into classes of at least ``k`` individuals
holding at least ``l`` distinct invariant values (distinct l-diversity); leftovers join the last class; a window
that cannot form one class is suppressed. Each class publishes the tightest generalization of its records' QIs
(time interval, lowest common hierarchy ancestor, bounding box) in the record format of docs/contracts.md
section 5. It knows nothing of earlier releases: exactly what the attack exploits.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Iterable, cast

import numpy as np

from stream_anon.audit.primitives import QISpec, as_text, audit_token, covers, get_path, parse_time, qi_value


def signatures(records: Iterable[dict], invariant: str) -> dict[tuple, frozenset]:
    """(release_id, class_id) -> set of non-null invariant values published in that class in that release."""
    sigs: dict[tuple, set] = defaultdict(set)
    for r in records:
        v = as_text(get_path(r.get("sensitive") or {}, invariant))
        s = sigs[(r.get("release_id"), r.get("class_id"))]
        if v is not None:
            s.add(v)
    return {k: frozenset(v) for k, v in sigs.items()}


def intersection_attack(records: list[dict], raw_events: list[dict], secret: bytes | str, *, privacy_unit: str,
                        invariant: str, knowledge: str = "class",
                        quasi_identifiers: list[QISpec] | None = None, targets: Iterable[str] | None = None,
                        n_targets: int | None = None, min_releases: int = 1, seed: int = 0) -> dict:
    """Run the attack; returns ``targets, pinned, success_rate, mean_candidates, min_candidates`` plus
    ``mean_releases`` (releases per target), ``by_releases`` (success rate per number of releases) and
    ``true_value_missed`` (targets whose true value fell out of the candidates: 0 unless the published values
    are wrong).

    Targets are the individuals with published real records in at least ``min_releases`` releases (or the given
    ``targets`` units), sampled down to ``n_targets`` with ``seed``. ``knowledge="qi"`` needs
    ``quasi_identifiers`` (``stream_anon.audit.AuditConfig.from_toml(path).quasi_identifiers``).
    """
    if knowledge not in ("class", "qi"):
        raise ValueError(f"knowledge: 'class' or 'qi', got {knowledge!r}")
    if knowledge == "qi" and not quasi_identifiers:
        raise ValueError("knowledge='qi' needs quasi_identifiers")
    secret = secret.encode() if isinstance(secret, str) else secret
    by_token = {audit_token(secret, e["event_id"]): e for e in raw_events if e.get("event_id")}
    sigs = signatures(records, invariant)
    # the target's published records: unit -> release -> [(class key, raw event)]
    seen: dict[str, dict[Any, list]] = defaultdict(lambda: defaultdict(list))
    true_values: dict[str, set] = defaultdict(set)
    for r in records:
        token: Any = r.get("audit_token")              # any JSON value: one that is no token finds no event
        event = by_token.get(token)
        if event is None:
            continue                                   # counterfeit: no individual behind it
        unit = as_text(get_path(event, privacy_unit))
        if unit is None:
            continue
        seen[unit][r.get("release_id")].append(((r.get("release_id"), r.get("class_id")), event))
        true_values[unit].add(as_text(get_path(event, invariant)))
    if targets is not None:
        pool = [t for t in targets if t in seen]
    else:
        pool = sorted(u for u, rels in seen.items() if len(rels) >= min_releases)
    if n_targets is not None and n_targets < len(pool):
        rng = np.random.default_rng(seed)
        pool = [pool[i] for i in sorted(rng.choice(len(pool), size=n_targets, replace=False))]
    classes_of_release: dict[Any, list] = defaultdict(list)
    if knowledge == "qi":
        gen: dict[tuple, dict] = {}
        for r in records:
            gen.setdefault((r.get("release_id"), r.get("class_id")), r.get("qi") or {})
        for key, qi in gen.items():
            classes_of_release[key[0]].append((key, qi))
    qis = quasi_identifiers or []                      # not empty when knowledge == "qi" (checked above)
    sizes, n_rel, missed = [], [], 0
    for unit in pool:
        cands: frozenset | None = None
        for rid, items in seen[unit].items():
            for key, event in items:
                if knowledge == "class":
                    c = sigs[key]
                else:
                    values = [qi_value(q, event) for q in qis]
                    c = frozenset().union(*[sigs[k] for k, qi in classes_of_release[rid]
                                            if all(covers(q, qi.get(q.name), v)
                                                   for q, v in zip(qis, values))])
                cands = c if cands is None else cands & c
        cands = cands or frozenset()
        if not (true_values[unit] - {None}) <= cands:
            missed += 1
        sizes.append(len(cands))
        n_rel.append(len(seen[unit]))
    if not sizes:
        return {"targets": 0, "pinned": 0, "success_rate": 0.0, "mean_candidates": None, "min_candidates": None,
                "mean_releases": None, "by_releases": {}, "true_value_missed": 0, "knowledge": knowledge}
    sizes_a, rel_a = np.array(sizes), np.array(n_rel)
    by_rel = {}
    for n in sorted(set(n_rel)):
        sel = rel_a == n
        by_rel[int(n)] = {"targets": int(sel.sum()), "success_rate": round(float((sizes_a[sel] == 1).mean()), 4)}
    return {"targets": len(sizes), "pinned": int((sizes_a == 1).sum()),
            "success_rate": float((sizes_a == 1).mean()), "mean_candidates": float(sizes_a.mean()),
            "min_candidates": int(sizes_a.min()), "mean_releases": float(rel_a.mean()), "by_releases": by_rel,
            "true_value_missed": missed, "knowledge": knowledge}


# ----------------------------------------------------------------------------------------------- naive baseline
def _epoch(s: Any) -> float | None:
    t = parse_time(s)
    return None if t is None else t.timestamp()


def _leaf_order(q: QISpec) -> dict[str, int]:
    if q.hierarchy is None:
        return {}
    parents = set(q.hierarchy.parent.values())
    return {label: i for i, label in enumerate(l for l in q.hierarchy.parent if l not in parents)}


def _root(q: QISpec) -> str:
    return next(iter(q.hierarchy.roots)) if q.hierarchy is not None and q.hierarchy.roots else "*"


def _generalize(q: QISpec, values: list[Any]) -> dict:
    if q.kind == "timestamp":
        ts = [(_epoch(v), v) for v in values]
        if any(t is None for t, _ in ts):
            return {"from": q.lower, "to": q.upper}
        return {"from": min(ts)[1], "to": max(ts)[1]}
    if q.kind == "numeric":
        xs = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(xs) < len(values):
            return {"from": q.lower, "to": q.upper}
        return {"from": min(xs), "to": max(xs)}
    if q.kind == "geopoint":
        if any(v is None or None in v for v in values):
            return {"lat": [q.lower[0], q.upper[0]], "lon": [q.lower[1], q.upper[1]]} if q.lower else {}
        return {"lat": [min(v[0] for v in values), max(v[0] for v in values)],
                "lon": [min(v[1] for v in values), max(v[1] for v in values)]}
    texts = {as_text(v) for v in values}
    if None in texts:
        return {"label": _root(q)}
    if q.hierarchy is None:
        return {"label": texts.pop() if len(texts) == 1 else "*"}
    if any(t not in q.hierarchy.parent for t in texts):
        return {"label": _root(q)}
    chains = [q.hierarchy.ancestors_or_self(t) for t in sorted(cast(set[str], texts))]   # None returned above
    common = set(chains[0]).intersection(*map(set, chains[1:]))
    return {"label": next((a for a in chains[0] if a in common), _root(q))}


def naive_kl_releases(events: list[dict], k: int, l: int, *, secret: bytes | str,
                      privacy_unit: str = "card_id", invariant: str = "product_category", window_s: float = 900,
                      quasi_identifiers: list[QISpec] | None = None, sensitive_fields: list[str] | None = None,
                      stream: str = "naive", partition: int = 0) -> tuple[list[dict], list[dict]]:
    """Per-window k-anonymous (distinct individuals), distinct-l-diverse releases WITHOUT invariance.

    Returns ``(records, manifests)`` in the formats of docs/contracts.md section 5 (manifests also carry
    ``l`` and zero counterfeit counts per class, so the m-invariance checker can read them). Default QIs: the
    event time only; default sensitive fields: the invariant attribute.
    """
    secret = secret.encode() if isinstance(secret, str) else secret
    qis = list(quasi_identifiers or [QISpec("time", "event_time", "timestamp")])
    sens = list(sensitive_fields or [invariant])
    orders = {q.name: _leaf_order(q) for q in qis}
    windows: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        t = _epoch(get_path(e, "event_time"))
        if t is not None:
            windows[int(t // window_s)].append(e)

    def sort_key(e: dict) -> tuple:
        cat, num = [], []
        for q in qis:
            v = qi_value(q, e)
            if q.kind in ("categorical", "station"):
                label = as_text(v)
                cat.append(orders[q.name].get(label, -1) if label is not None else -1)
            elif q.kind == "timestamp":
                num.append(_epoch(v) or 0.0)
            elif q.kind == "geopoint":
                num.extend(x if x is not None else 0.0 for x in v)
            else:
                num.append(v if isinstance(v, (int, float)) else 0.0)
        return (*cat, *num)

    records: list[dict] = []
    manifests: list[dict] = []
    for seq, w in enumerate(sorted(windows)):
        rid = f"{stream}-p{partition}-{seq:06d}"
        by_unit: dict[str, list[dict]] = defaultdict(list)
        unitless: list[dict] = []
        for e in windows[w]:
            u = as_text(get_path(e, privacy_unit))
            (by_unit[u] if u is not None else unitless).append(e)
        units = sorted(by_unit, key=lambda u: (sort_key(min(by_unit[u], key=lambda e: e["event_time"])), u))
        groups: list[list[str]] = []
        cur: list[str] = []
        cur_vals: set = set()
        for u in units:
            cur.append(u)
            v = as_text(get_path(by_unit[u][0], invariant))
            if v is not None:
                cur_vals.add(v)
            if len(cur) >= k and len(cur_vals) >= l:
                groups.append(cur)
                cur, cur_vals = [], set()
        suppressed = [e for e in unitless]
        if cur:
            if groups:
                groups[-1].extend(cur)
            else:
                suppressed.extend(e for u in cur for e in by_unit[u])
        classes = []
        for ci, group in enumerate(groups):
            cid = f"{rid}-c{ci:04d}"
            evs = [e for u in group for e in by_unit[u]]
            gen = {q.name: _generalize(q, [qi_value(q, e) for e in evs]) for q in qis}
            for e in evs:
                records.append({"release_id": rid, "class_id": cid, "qi": gen,
                                "sensitive": {f: get_path(e, f) for f in sens},
                                "audit_token": audit_token(secret, e["event_id"])})
            classes.append({"class_id": cid, "generalization": gen, "individuals": len(group),
                            "records": len(evs), "reused": False, "counterfeit_individuals": 0,
                            "counterfeit_records": 0})
        start = datetime.fromtimestamp(w * window_s, timezone.utc).isoformat()
        end = datetime.fromtimestamp((w + 1) * window_s, timezone.utc).isoformat()
        sup_tokens = [audit_token(secret, e["event_id"]) for e in suppressed]
        manifests.append({"release_id": rid, "stream": stream, "partition": partition, "seq": seq,
                          "window_start": start, "window_end": end, "k": k, "l": l, "classes": classes,
                          "published": sum(c["records"] for c in classes),
                          "suppressed": {"naive_window_too_small": len(sup_tokens)} if sup_tokens else {},
                          "suppressed_tokens": {"naive_window_too_small": sup_tokens} if sup_tokens else {},
                          "deferred": 0, "deferred_tokens": []})
    return records, manifests

