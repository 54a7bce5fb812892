"""Intersection by release: an adversary who reads the record topic release by release and knows that a target
was active in a class's box during a window singles the target out from that release's additions to the class.

A class that is reused (deadline leftovers, late records) appears in several releases under one ``class_id``
and one published box. Read whole, it holds at least k individuals (CASTLE's argument, Cao et al., ICDE 2008,
section 4.3). Read in order, each release's additions stand apart from the earlier members: the adversary's
candidates for a target are the individuals whose records the class gained in the release the target appears
in. The attack's measure per target is the smallest such candidate set over the (release, class) entries holding
it; a target is singled out at 1.

Pure Python; it works from the entries' individuals (evaluated with the secret: token -> raw event -> privacy
unit), so it runs against any anonymizer's output.

>>> entries = {("r1", "c1"): {"a", "b", "c"}, ("r2", "c1"): {"d"}, ("r2", "c2"): {"a", "e", "f"}}
>>> res = release_delta_attack(entries, k=3)
>>> res["min_candidates"], res["singled_out"], res["targets"], res["entries_below_k"]
(1, 1, 6, 1)
"""
from __future__ import annotations

from typing import Any, Hashable, Iterable, Mapping

import numpy as np


def entries_of(records: Iterable[dict], unit_of) -> dict[tuple, set]:
    """(release_id, class_id) -> the distinct individuals of its real records (``unit_of(record)``: the record's
    privacy unit, None for a record of no individual, e.g. a counterfeit)."""
    out: dict[tuple, set] = {}
    for r in records:
        entry = out.setdefault((r.get("release_id"), r.get("class_id")), set())
        unit = unit_of(r)
        if unit is not None:
            entry.add(unit)
    return out


def release_delta_attack(entries: Mapping[tuple, set], *, k: int | Mapping[Hashable, int] | None = None,
                         n_targets: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Run the attack over ``entries`` ((release_id, class_id) -> individuals added there).

    ``k``: the guarantee (one value, or class_id -> k) that ``entries_below_k`` and ``targets_below_k`` count
    against; ``n_targets``: a seeded sample of the individuals (None: every one). Returns ``targets``,
    ``min_candidates``, ``singled_out`` (targets with one candidate), ``success_rate`` (their share),
    ``targets_below_k``, ``entries_below_k`` and ``smallest`` (the candidate-set sizes of the first targets by
    size, for examples)."""
    smallest: dict[Hashable, int] = {}
    exposed: set = set()                     # individuals in an entry of fewer than its class's k
    below = 0
    for (rid, cid), units in entries.items():
        n = len(units)
        k_c = k.get(cid) if isinstance(k, Mapping) else k
        if k_c is not None and n < k_c:
            below += 1
            exposed.update(units)
        for u in units:
            if n < smallest.get(u, n + 1):
                smallest[u] = n
    targets = sorted(smallest, key=repr)
    if n_targets is not None and n_targets < len(targets):
        pick = np.random.default_rng(seed).choice(len(targets), size=n_targets, replace=False)
        targets = [targets[i] for i in sorted(pick.tolist())]
    sizes = [smallest[t] for t in targets]
    singled = sum(1 for s in sizes if s == 1)
    return {"targets": len(targets), "min_candidates": min(sizes, default=None), "singled_out": singled,
            "success_rate": round(singled / len(sizes), 6) if sizes else 0.0,
            "targets_below_k": sum(1 for t in targets if t in exposed), "entries_below_k": below,
            "smallest": sorted(sizes)[:10]}
