"""Measurements of the published outputs: numbers a report states, never a verdict.

The privacy criteria (:mod:`.checks.k_individuals`, :mod:`.checks.m_invariance`) judge these numbers against
the configured k and m; keeping the counting apart (ARX's split of criteria and metrics) lets a report state the
same figures whatever the criterion.
"""
from __future__ import annotations

import math

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
        raw = ctx.raw_of(r)
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


@dataclass
class ClassMembers:
    """The published records of every class, each with the privacy unit of its raw event (None: no known
    individual, e.g. a counterfeit record): over all releases, and in the release that created the class."""

    overall: dict[Any, list[tuple[Any, dict]]] = field(default_factory=lambda: defaultdict(list))
    at_creation: dict[Any, list[tuple[Any, dict]]] = field(default_factory=lambda: defaultdict(list))
    created: dict[Any, Any] = field(default_factory=dict)     # class id -> the release that created it


def creating_releases(manifests) -> dict[Any, Any]:
    """Class id -> the release that created it (its first manifest entry with ``reused: false``)."""
    created: dict[Any, Any] = {}
    for m in manifests:
        for c in m.get("classes") or []:
            if isinstance(c, dict) and not c.get("reused"):
                created.setdefault(c.get("class_id"), m.get("release_id"))
    return created


def class_members(ctx: AuditContext) -> ClassMembers:
    """Every published record by class (the equivalence class an adversary sees: one ``class_id`` over all the
    releases it appears in) and the records of the class's creating release (manifest entry ``reused: false``)."""
    created = creating_releases(ctx.manifests)
    out = ClassMembers(created=created)
    for r in ctx.records:
        raw = ctx.raw_of(r)
        unit = raw.unit if raw is not None else None
        cid = r.get("class_id")
        out.overall[cid].append((unit, r))
        if created.get(cid) == r.get("release_id"):
            out.at_creation[cid].append((unit, r))
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


# ------------------------------------------------------------------------------------------------ health figures
ALERT_TYPE = "alert"


def _weighted_quantile(pairs: list[tuple[float, int]], q: float) -> float | None:
    """The smallest value v with at least a share ``q`` of the total weight at or below it.

    >>> _weighted_quantile([(0.1, 90), (0.5, 10)], 0.95), _weighted_quantile([(0.1, 95), (0.5, 5)], 0.95)
    (0.5, 0.1)
    """
    pairs = sorted((v, w) for v, w in pairs if w > 0)
    total = sum(w for _, w in pairs)
    if not total:
        return None
    seen = 0
    for v, w in pairs:
        seen += w
        if seen >= q * total - 1e-9:
            return v
    return pairs[-1][0]


def _quantile(values: list[int], q: float) -> float:
    """Nearest-rank quantile of a sorted non-empty list."""
    idx = max(0, min(len(values) - 1, int(-(-q * len(values) // 1)) - 1))
    return values[idx]


def size_distribution(sizes: Iterable[int], k: int | Iterable[int]) -> dict:
    """Distribution of class sizes in distinct individuals: quantiles and bins relative to k (one k, or the k in
    force for each class, aligned with ``sizes``).

    >>> size_distribution([5, 5, 6, 10, 12, 40], 5)["bins"]
    {'< k': 0, 'k': 2, 'k+1 .. 2k-1': 1, '2k .. 4k-1': 2, '>= 4k': 1}
    >>> size_distribution([5, 12], [10, 5])["bins"]["< k"]
    1
    """
    sizes = [int(x) for x in sizes]
    ks = [k] * len(sizes) if isinstance(k, int) else list(k)
    bins = {"< k": 0, "k": 0, "k+1 .. 2k-1": 0, "2k .. 4k-1": 0, ">= 4k": 0}
    for n, k in zip(sizes, ks):
        key = "< k" if n < k else "k" if n == k else "k+1 .. 2k-1" if n < 2 * k else \
            "2k .. 4k-1" if n < 4 * k else ">= 4k"
        bins[key] += 1
    s = sorted(sizes)
    if not s:
        return {"classes": 0, "bins": bins}
    return {"classes": len(s), "min": s[0], "p50": _quantile(s, 0.5), "mean": round(sum(s) / len(s), 2),
            "p95": _quantile(s, 0.95), "max": s[-1], "bins": bins}


def deadletter_reason(reason: Any) -> str:
    """The kind of a dead-letter reason: its text before the first ':' (sizes, offsets and values dropped).

    >>> deadletter_reason("oversized payload: 70000 bytes > limit 65536"), deadletter_reason("no privacy unit")
    ('oversized payload', 'no privacy unit')
    """
    return str(reason).split(":", 1)[0].strip() or "unknown"


def is_whole_domain(qi, value: Any) -> bool | None:
    """Whether a published QI value is the whole domain (an H3 ``*``, the hierarchy's root, bounds covering the
    declared ones); None when it cannot tell (a time interval, undeclared bounds, a malformed value)."""
    if not isinstance(value, dict):
        return None
    if "h3" in value:
        return value["h3"] == "*"
    if "label" in value:
        return value["label"] in (qi.hierarchy.roots if qi.hierarchy is not None else {"*"})
    try:
        if "lat" in value and isinstance(qi.lower, (list, tuple)) and isinstance(qi.upper, (list, tuple)):
            (la0, la1), (lo0, lo1) = value["lat"], value["lon"]
            return la0 <= qi.lower[0] and la1 >= qi.upper[0] and lo0 <= qi.lower[1] and lo1 >= qi.upper[1]
        if qi.kind == "numeric" and qi.lower is not None and qi.upper is not None:
            return float(value["from"]) <= float(qi.lower) and float(value["to"]) >= float(qi.upper)
    except (KeyError, TypeError, ValueError):
        return None
    return None


def whole_domain_shares(ctx: AuditContext) -> dict:
    """Per quasi-identifier, the share of published real records whose value is the whole domain
    (:func:`is_whole_domain`): over the run (``run``) and per release (``releases``); QIs it cannot judge (time)
    are left out. A position published as the whole domain tells an analyst nothing about where."""
    judged = [q for q in ctx.config.quasi_identifiers if q.kind != "timestamp"]
    run: dict[str, list[int]] = {q.name: [0, 0] for q in judged}
    per_release: dict[Any, dict[str, list[int]]] = defaultdict(lambda: {q.name: [0, 0] for q in judged})
    for r in ctx.records:
        if ctx.raw_of(r) is None or not isinstance(r.get("qi"), dict):
            continue
        rel = per_release[r.get("release_id")]
        for q in judged:
            whole = is_whole_domain(q, r["qi"].get(q.name))
            if whole is None:
                continue
            for counts in (run[q.name], rel[q.name]):
                counts[0] += whole
                counts[1] += 1

    def shares(counts: dict) -> dict:
        return {name: round(w / n, 6) for name, (w, n) in counts.items() if n}
    return {"run": shares(run), "releases": {rid: shares(c) for rid, c in per_release.items()}}


def cell_area_share(qi, cell: str) -> float | None:
    """Position NCP of a published H3 value: the cell's area over the declared domain's (a lat/lon box, its
    longitude extent scaled by cos(latitude)), capped at 1; 1 for the whole domain ``"*"``; None when the domain
    is not declared or the cell is not valid. Imports h3 itself (not the engine's code)."""
    if cell == "*":
        return 1.0
    import h3
    try:
        (la0, lo0), (la1, lo1) = qi.lower, qi.upper
        if not isinstance(cell, str) or not h3.is_valid_cell(cell):
            return None
    except (TypeError, ValueError):
        return None
    domain = (la1 - la0) * 111.32 * (lo1 - lo0) * 111.32 * math.cos(math.radians((la0 + la1) / 2))
    return min(1.0, h3.cell_area(cell, "km^2") / domain) if domain > 0 else None


def h3_positions(ctx: AuditContext) -> dict:
    """Per H3 geopoint, over the run (``run``) and per release (``releases``): ``records`` (published real
    records), ``mean_resolution`` (over those published as a cell, the whole domain left out: its share is in
    ``whole_domain``) and ``ncp`` (mean area of the published cell over the domain's, :func:`cell_area_share`)."""
    geo = [q for q in ctx.config.quasi_identifiers if q.kind == "geopoint"]
    run: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0.0])        # records, cells, sum of res, sum of NCP
    per_release: dict[Any, dict] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0.0]))
    for r in ctx.records:
        if ctx.raw_of(r) is None or not isinstance(r.get("qi"), dict):
            continue
        for q in geo:
            value = r["qi"].get(q.name)
            if not isinstance(value, dict) or "h3" not in value:
                continue
            share = cell_area_share(q, value["h3"])
            if share is None:
                continue
            for acc in (run[q.name], per_release[r.get("release_id")][q.name]):
                acc[0] += 1
                acc[3] += share
                if value["h3"] != "*":
                    acc[1] += 1
                    acc[2] += int(value.get("resolution", 0))

    def figures(accs: dict) -> dict:
        return {name: {"records": n, "mean_resolution": round(rs / c, 3) if c else None,
                       "ncp": round(ncp / n, 6)} for name, (n, c, rs, ncp) in accs.items() if n}
    return {"run": figures(run), "releases": {rid: figures(a) for rid, a in per_release.items()}}


def health_figures(ctx: AuditContext, individuals: ClassIndividuals, alerts: Iterable[dict] | None = None) -> dict:
    """Utility and privacy health of the published outputs (numbers, never a verdict):

    - ``ncp``: mean and p95 normalized certainty penalty of the published *real* records, each record at its
      class's NCP from the (deduplicated) manifests; counterfeit records left out;
    - ``class_individuals``: distribution of distinct individuals per class (a class reused by later releases
      counts every individual published in it, in any release: the rule of the k check and of the summary,
      docs/privacy.md "Reuse of published classes"), counted from the raw events behind the records;
    - ``whole_domain``: per QI, the share of published records generalized to the whole domain, over the run and
      per release (:func:`whole_domain_shares`);
    - ``h3_positions``: per H3 geopoint, the mean published resolution and the position NCP (cell area over the
      domain's), over the run and per release (:func:`h3_positions`);
    - ``deadletters_by_reason``: dead letters (deduplicated by source offset) by the kind of their reason;
    - ``alerts``: alert messages of this stream on anon.metrics by alert name (deduplicated by alert, partition,
      release and lineage); ``None`` when the metrics topic was not read;
    - ``expected``: those that are no alert (:func:`first_lineage`), by name, beside ``alerts``.
    """
    pairs = []
    for m in ctx.manifests:
        for c in m.get("classes") or []:
            if not isinstance(c, dict):
                continue
            try:
                real = int(c.get("records", 0)) - int(c.get("counterfeit_records", 0) or 0)
                ncp = float(c["ncp"])
            except (KeyError, TypeError, ValueError):
                continue
            pairs.append((ncp, real))
    weight = sum(w for _, w in pairs if w > 0)
    mean = sum(v * w for v, w in pairs if w > 0) / weight if weight else None
    p95 = _weighted_quantile(pairs, 0.95)
    dead: dict[Any, dict] = {}
    for d in ctx.deadletters:
        source = d.get("source")
        src = source if isinstance(source, dict) else {}
        key: tuple = (src.get("topic"), src.get("partition"), src.get("offset"))
        if src.get("offset") is None:
            key = key + (str(d.get("reason")), str(d.get("payload")))
        dead.setdefault(key, d)
    by_reason = Counter(deadletter_reason(d.get("reason")) for d in dead.values())
    k_of = ctx.in_force.k_of                     # the k check's rule: the k in force when the class was made
    created = {c.get("class_id"): m.get("release_id") for m in reversed(ctx.manifests)
               for c in m.get("classes") or [] if isinstance(c, dict) and not c.get("reused")}
    out = {
        "ncp": {"records": weight, "mean": None if mean is None else round(mean, 6),
                "p95": None if p95 is None else round(p95, 6)},
        "class_individuals": size_distribution([len(u) for u in individuals.overall.values()],
                                               [k_of.get(created.get(c), ctx.config.k) for c in individuals.overall]),
        "deadletters_by_reason": dict(sorted(by_reason.items())),
        "whole_domain": whole_domain_shares(ctx),
        "h3_positions": h3_positions(ctx),
        "alerts": None,
    }
    if alerts is not None:
        seen: dict[tuple, dict] = {}
        for a in alerts:
            if isinstance(a, dict) and a.get("type") == ALERT_TYPE and a.get("stream") in (None, ctx.config.stream):
                seen.setdefault((a.get("alert"), a.get("partition"), a.get("release_id"), a.get("lineage")), a)
        first = first_lineage(list(seen.values()))
        out["alerts"] = dict(sorted(Counter(str(a.get("alert")) for a in seen.values() if a is not first).items()))
        out["expected"] = {} if first is None else {LINEAGE_STARTED: 1}
    return out


LINEAGE_STARTED = "lineage_started"


def first_lineage(alerts: list[dict]) -> dict | None:
    """The ``lineage_started`` alert of the stream's first lineage: the first one declared that supersedes nothing.
    Every new stream starts one, so it is expected, not an alert; a later one (a lost state, a reset: another
    lineage declared after it) stays an alert. A broker reset that lost anon.metrics as well leaves only the new
    lineage's: nothing read can tell it from a first one (docs/operations.md, Lineage).

    >>> a = {"alert": "lineage_started", "lineage": "L1", "supersedes": []}
    >>> first_lineage([a, {"alert": "lineage_started", "lineage": "L2", "supersedes": ["L1"]}]) is a
    True
    >>> first_lineage([{**a, "supersedes": ["L0"]}]), first_lineage([a, {**a, "lineage": "L2"}]) is a
    (None, True)
    """
    started = [a for a in alerts if a.get("alert") == LINEAGE_STARTED]
    if started and not started[0].get("supersedes"):
        return started[0]
    return None


def window_individuals(ctx: AuditContext) -> dict | None:
    """The most distinct individuals the raw events of one window of one input partition hold (``individuals``;
    each partition's engine forms its own classes), windows of the releases' length (``window_s``, their most
    common window_end - window_start) aligned as the engine aligns them (multiples of window_s since the epoch);
    None without a release of a known window. Fewer than k: no class of k could form in any window, whatever the
    deadline."""
    from .primitives import get_path, parse_time

    lengths: Counter[float] = Counter()
    for m in ctx.manifests:
        start, end = parse_time(m.get("window_start")), parse_time(m.get("window_end"))
        if start is not None and end is not None and end > start:
            lengths[(end - start).total_seconds()] += 1
    if not lengths:
        return None
    window_s = lengths.most_common(1)[0][0]
    units: dict[tuple, set] = defaultdict(set)
    for raw in ctx.raws:
        t = parse_time(get_path(raw.event, ctx.config.event_time)) if raw.event is not None else None
        if t is not None and raw.unit is not None:
            units[(raw.source and raw.source[1], math.floor(t.timestamp() / window_s))].add(raw.unit)
    return {"window_s": window_s, "individuals": max((len(u) for u in units.values()), default=0)}
