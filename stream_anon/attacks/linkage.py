"""Prosecutor linkage attack on generalized releases (the attack k-anonymity in individuals defeats).

The adversary knows a target's quasi-identifier values for one event (where and when a car was, which station a
card tapped at) and that the target is in the data. They take every published class whose generalization
covers those values; the target is among the individuals behind those classes. The evaluator, who holds the raw
input and the secret, counts those individuals. A target is **re-identified** when one individual remains: all
records of the matching classes then belong to the target, with their sensitive values.

Counting k in records instead of individuals (as CASTLEGUARD's splits do, see
``../shared/notes/streaming-anchors.md``) lets one frequent individual fill a class alone; this attack shows it.
"""
from __future__ import annotations

import numpy as np

from stream_anon.audit.config import AuditConfig
from stream_anon.audit.primitives import as_text, audit_token, covers, get_path, qi_value


def linkage_attack(records: list[dict], raw_events: list[dict], cfg: AuditConfig, secret: bytes,
                   n_targets: int = 200, seed: int = 0) -> dict:
    """Run the attack on ``n_targets`` published events chosen at random (seeded).

    Returns ``targets``, ``reidentified``, ``success_rate`` (share re-identified), ``mean_candidates`` and
    ``min_candidates`` (distinct individuals consistent with the adversary's knowledge).
    """
    by_token = {audit_token(secret, e["event_id"]): e for e in raw_events}
    classes: dict[str, tuple[dict, set]] = {}
    published = []
    for r in records:
        event = by_token.get(r["audit_token"])
        if event is None:
            continue
        unit = get_path(event, cfg.privacy_unit)
        classes.setdefault(r["class_id"], (r["qi"], set()))[1].add(as_text(unit))
        published.append(event)
    if not published:
        return {"targets": 0, "reidentified": 0, "success_rate": 0.0, "mean_candidates": None,
                "min_candidates": None}
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(published), size=min(n_targets, len(published)), replace=False)
    qis = cfg.quasi_identifiers
    gens = list(classes.values())
    candidates: list[int] = []
    for i in picks:
        target = published[i]
        values = [qi_value(q, target) for q in qis]
        who: set = set()
        for qi, units in gens:
            if all(covers(q, qi.get(q.name), v) for q, v in zip(qis, values)):
                who |= units
        candidates.append(len(who))
    counts = np.array(candidates)
    return {"targets": len(counts), "reidentified": int((counts == 1).sum()),
            "success_rate": float((counts == 1).mean()), "mean_candidates": float(counts.mean()),
            "min_candidates": int(counts.min())}
