"""Privacy criterion ``m_invariance``: m-uniqueness, signature invariance and counterfeit accounting.

It runs on its own (:func:`check_m_invariance`, for benchmarks and tests) and as one check of the audit
(:class:`MInvariance`, for a stream with ``[anonymization] m``, on the audit's deduplicated outputs). It
re-derives everything from the published records and release manifests (docs/contracts.md section 5), the raw
input events and the secret, plus three settings of the stream's TOML (:class:`..config.MInvarianceConfig`:
``[anonymization] m``, ``[stream] privacy_unit``, ``[sensitive] invariant``).

Definitions used here
---------------------
* **Release**: one manifest (``release_id``); records and manifests are deduplicated by ``release_id`` (records
  by ``(release_id, audit_token)``), as restarted workers may publish a release twice.
* **Class in a release**: the records of one release carrying one ``class_id`` (a reused class seen again in a
  later release is judged by the records it holds *in that release*: that is what an adversary sees there).
* **Real record / counterfeit record**: a record whose ``audit_token`` equals ``HMAC(secret, "audit:" +
  event_id)`` of a raw event is real; any other record is counterfeit.
* **Individuals of a class**: the *real* individuals are the distinct privacy-unit values of the raw events
  behind its real records; each holds the raw event's invariant value (an individual whose raw value differs
  between its events is counted under each of its values, the conservative choice, and reported in
  ``value_changes``; an individual whose value is null counts as an individual holding the value ``None``,
  which never counts as a distinct sensitive value). The *counterfeit* individuals are counted from the
  manifest's class entry ``counterfeit_individuals``; their values are the invariant values published in the
  ``sensitive`` dict of the class's counterfeit records. The manifest does not say which counterfeit record
  belongs to which counterfeit individual (publishing that would tell real values from fake ones), so: every
  value seen on a counterfeit record is held by at least one counterfeit individual, a value cannot be held by
  more counterfeit individuals than it has counterfeit records, and the 1/m test passes when some assignment
  of the counted individuals within these limits satisfies it (the engine knows the actual one).
* **Signature** of a class in a release: the set of non-null invariant values published on its records (real
  and counterfeit), i.e. the candidate set an adversary reads off the class.

Checks
------
``m_uniqueness``  every class of every release has >= m distinct invariant values among its individuals (real
                  and counterfeit) and no value held by more than 1/m of them (``count * m <= individuals``);
                  a real record's published invariant value must equal the raw one.
``invariance``    every real individual has one signature over all (release, class) pairs it appears in
                  (contiguous or not; the horizon is "forever"). ``signature_changes`` counts individuals with
                  more than one signature; examples name them by a keyed hash, never by their identifier.
``counterfeits``  records of no raw event == sum of the manifests' ``counterfeit_records``, and per class:
                  counterfeit records == the class entry's ``counterfeit_records``; ``counterfeit_individuals``
                  between the number of distinct counterfeit values and the number of counterfeit records.
                  Counterfeit records in a class the manifest does not list fail here too.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..check import MAX_EXAMPLES, AuditContext, ViolationLog
from ..config import MInvarianceConfig
from ..measures import counterfeit_lower_bound
from ..primitives import as_text, audit_token, get_path, json_object, report_alias


# ----------------------------------------------------------------------------------------------- report
@dataclass
class MInvarianceReport:
    passed: bool
    checks: dict[str, dict]
    summary: dict[str, Any]
    # per release: Counter value -> real individuals (input of the counterfeit lower bound)
    release_value_counts: dict[str, Counter] = field(default_factory=dict, repr=False)

    def counterfeit_lower_bound(self, m: int | None = None) -> int:
        """Minimum counterfeit individuals the value distribution forces (:func:`..measures.counterfeit_lower_bound`)."""
        return counterfeit_lower_bound(self.release_value_counts.values(), m or self.summary["m"])

    def to_dict(self) -> dict:
        return {"passed": self.passed, "summary": self.summary, "checks": self.checks}

    def format_text(self) -> str:
        s = self.summary
        lines = [f"M-INVARIANCE {'PASSED' if self.passed else 'FAILED'} (m={s['m']}): releases={s['releases']} "
                 f"classes={s['classes']} individuals={s['individuals']} "
                 f"counterfeit_individuals={s['counterfeit_individuals']} "
                 f"(lower bound {s['counterfeit_lower_bound']}) counterfeit_records={s['counterfeit_records']} "
                 f"signature_changes={s['signature_changes']}"]
        for name, chk in self.checks.items():
            lines.append(f"  [{'ok' if chk['passed'] else 'FAIL'}] {name}: violations={chk['violations']}")
            for ex in chk["examples"][:3] if not chk["passed"] else []:
                lines.append(f"      - {ex}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- input
def _events(raw_events: Iterable) -> list[dict]:
    """Raw events as dicts: accepts event dicts or ``(source, payload)`` pairs as read from the raw topic."""
    out = []
    for item in raw_events:
        if isinstance(item, dict):
            out.append(item)
            continue
        try:
            _, payload = item
        except (TypeError, ValueError):
            continue
        event = json_object(payload)
        if event is not None:
            out.append(event)
    return out


def _dedupe(records: list[dict], manifests: list[dict]) -> tuple[list[dict], list[dict]]:
    """First copy per release_id / (release_id, audit_token). Unlike the audit's ``inputs.deduplicate`` it does
    not compare copies (the audit reports conflicting copies; run on its own this checker judges m only)."""
    m_by_id: dict[Any, dict] = {}
    for m in manifests:
        m_by_id.setdefault(m.get("release_id"), m)
    r_by_key: dict[tuple, dict] = {}
    for r in records:
        r_by_key.setdefault((r.get("release_id"), r.get("audit_token")), r)
    return list(r_by_key.values()), list(m_by_id.values())


@dataclass
class _Group:
    """One class in one release."""
    real: dict[str, set] = field(default_factory=lambda: defaultdict(set))   # unit -> raw values
    cf_values: Counter = field(default_factory=Counter)                     # value -> counterfeit records
    cf_records: int = 0
    signature: set = field(default_factory=set)


# ----------------------------------------------------------------------------------------------- checker
def check_m_invariance(records: list[dict], manifests: list[dict], raw_events: Iterable, secret: bytes | str,
                       config: MInvarianceConfig,
                       event_of: Callable[[dict], dict | None] | None = None) -> MInvarianceReport:
    """Verify m-uniqueness, invariance and counterfeit accounting (module docstring). ``event_of``: the raw event
    a record stands for (the audit's :meth:`..check.AuditContext.raw_of`, which knows the dead letters); without
    it, the first raw event with the record's token."""
    cfg = config
    secret = secret.encode() if isinstance(secret, str) else secret
    records, manifests = _dedupe(list(records), list(manifests))
    if cfg.stream is not None:
        manifests = [m for m in manifests if m.get("stream") in (None, cfg.stream)]
    by_token: dict[str, dict] = {}
    for e in _events(raw_events):
        eid = e.get("event_id")
        if isinstance(eid, str) and eid:
            by_token.setdefault(audit_token(secret, eid), e)

    uniq, inv, cf = ViolationLog(), ViolationLog(), ViolationLog()
    groups: dict[tuple, _Group] = defaultdict(_Group)
    values_of_unit: dict[str, set] = defaultdict(set)
    cf_total = 0
    for r in records:
        key = (r.get("release_id"), r.get("class_id"))
        g = groups[key]
        pub = as_text(get_path(r.get("sensitive") or {}, cfg.invariant))
        if pub is not None:
            g.signature.add(pub)
        token: Any = r.get("audit_token")          # any JSON value: one that is no token finds no event
        event = event_of(r) if event_of is not None else by_token.get(token)
        if event is None:
            g.cf_records += 1
            cf_total += 1
            g.cf_values[pub] += 1
            continue
        unit = as_text(get_path(event, cfg.privacy_unit))
        raw_value = as_text(get_path(event, cfg.invariant))
        if pub != raw_value:
            uniq.fail("published invariant value differs from raw", release_id=key[0], class_id=key[1],
                      audit_token=r.get("audit_token"))
        if unit is None:
            continue        # no individual to count (conservative: it cannot raise a class's count)
        g.real[unit].add(raw_value)
        values_of_unit[unit].add(raw_value)

    class_entries: dict[tuple, dict] = {}
    manifest_cf_records = manifest_cf_individuals = 0
    for m in manifests:
        for c in m.get("classes") or []:
            class_entries[(m.get("release_id"), c.get("class_id"))] = c
            manifest_cf_records += int(c.get("counterfeit_records") or 0)
            manifest_cf_individuals += int(c.get("counterfeit_individuals") or 0)
        if m.get("m") is not None and m.get("m") != cfg.m:
            uniq.fail("manifest m differs from config", release_id=m.get("release_id"), manifest_m=m.get("m"),
                      m=cfg.m)

    # (a) m-uniqueness, (c) per-class counterfeit accounting
    release_counts: dict[str, Counter] = defaultdict(Counter)
    release_units: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for (rid, cid), g in groups.items():
        for unit, vals in g.real.items():
            release_units[rid][unit] |= vals
        entry = class_entries.get((rid, cid))
        n_cf = int((entry or {}).get("counterfeit_individuals") or 0)
        n_cf_rec = int((entry or {}).get("counterfeit_records") or 0)
        cf_vals = {v: n for v, n in g.cf_values.items() if v is not None}
        where = {"release_id": rid, "class_id": cid}
        if entry is None and g.cf_records:
            cf.fail("counterfeit records in a class the manifest does not list", **where, records=g.cf_records)
        if g.cf_records != n_cf_rec:
            cf.fail("class counterfeit records differ from manifest", **where, published=g.cf_records,
                    manifest=n_cf_rec)
        if None in g.cf_values:
            cf.fail("counterfeit record without invariant value", **where)
        if n_cf < len(cf_vals):
            cf.fail("fewer counterfeit individuals than counterfeit values", **where, individuals=n_cf,
                    values=len(cf_vals))
        if n_cf > g.cf_records:
            cf.fail("more counterfeit individuals than counterfeit records", **where, individuals=n_cf,
                    records=g.cf_records)
        real_counts: Counter = Counter()
        for vals in g.real.values():
            for v in vals:
                real_counts[v] += 1
        n = len(g.real) + n_cf
        distinct = ({v for v in real_counts if v is not None} | set(cf_vals))
        if len(distinct) < cfg.m:
            uniq.fail("fewer than m distinct values", **where, values=len(distinct), m=cfg.m, individuals=n)
        if not _one_over_m_feasible(real_counts, cf_vals, n_cf, n, cfg.m):
            uniq.fail("a value is held by more than 1/m of the class", **where, individuals=n,
                      most_common_real=max(real_counts.values(), default=0), m=cfg.m)
    for rid, units in release_units.items():
        for vals in units.values():
            for v in vals:
                release_counts[rid][v] += 1
    if cf_total != manifest_cf_records:
        cf.fail("records of no raw event differ from manifests' counterfeit_records", records=cf_total,
                manifests=manifest_cf_records)

    # (b) invariance
    sigs_of_unit: dict[str, set] = defaultdict(set)
    for (rid, cid), g in groups.items():
        sig = frozenset(g.signature)
        for unit in g.real:
            sigs_of_unit[unit].add(sig)
    changes = 0
    for unit, sigs in sigs_of_unit.items():
        if len(sigs) > 1:
            changes += 1
            inv.fail("signature change", individual=report_alias(secret, unit),
                     signatures=sorted(sorted(s) for s in sigs)[:4])
    value_changes = sum(1 for vals in values_of_unit.values() if len(vals) > 1)
    inv.details.update(signature_changes=changes, individuals=len(sigs_of_unit), value_changes=value_changes)
    cf.details.update(counterfeit_records=cf_total, manifest_counterfeit_records=manifest_cf_records,
                      counterfeit_individuals=manifest_cf_individuals)
    uniq.details.update(m=cfg.m, classes=len(groups))

    checks = {"m_uniqueness": uniq.result(), "invariance": inv.result(), "counterfeits": cf.result()}
    release_ids = {m.get("release_id") for m in manifests} | {rid for rid, _ in groups}
    summary = {"m": cfg.m, "releases": len(release_ids), "classes": len(groups),
               "individuals": len(values_of_unit), "counterfeit_individuals": manifest_cf_individuals,
               "counterfeit_records": cf_total, "signature_changes": changes, "value_changes": value_changes,
               "counterfeit_lower_bound": counterfeit_lower_bound(release_counts.values(), cfg.m)}
    return MInvarianceReport(passed=all(c["passed"] for c in checks.values()), checks=checks, summary=summary,
                             release_value_counts=dict(release_counts))


def _one_over_m_feasible(real_counts: Counter, cf_records: dict[str, int], n_cf: int, n: int, m: int) -> bool:
    """Whether ``n_cf`` counterfeit individuals can be spread over the counterfeit values (each value seen on a
    counterfeit record gets >= 1, at most one per counterfeit record) so that every value's individuals * m <= n.
    """
    if n == 0:
        return False
    cap = n // m                       # count * m <= n  <=>  count <= floor(n / m)
    load = Counter(real_counts)
    for v in cf_records:
        load[v] += 1
    if any(c > cap for c in load.values()):
        return False
    surplus = n_cf - len(cf_records)
    if surplus <= 0:
        return True                    # fewer individuals than values is reported by the counterfeit check
    room = sum(min(cf_records[v] - 1, cap - load[v]) for v in cf_records)
    return room >= surplus


class MInvariance:
    """The m-invariance criterion as one check of the audit (on its parsed raw input and deduplicated outputs)."""

    name = "m_invariance"

    def applies(self, ctx: AuditContext) -> bool:
        return ctx.config.m is not None

    def run(self, ctx: AuditContext) -> dict:
        cfg = ctx.config
        if not cfg.invariant:
            log = ViolationLog()
            log.fail("anonymization.m is set but sensitive.invariant is not")
            return log.result()
        def event_of(record: dict) -> dict | None:
            raw = ctx.raw_of(record)
            return None if raw is None else raw.event
        rep = check_m_invariance(ctx.records, ctx.manifests, [r.event for r in ctx.raws if r.event is not None],
                                 ctx.secret, cfg.m_invariance(), event_of=event_of)
        return {"passed": rep.passed, "violations": sum(c["violations"] for c in rep.checks.values()),
                "summary": rep.summary, "checks": rep.checks,
                "examples": [ex for c in rep.checks.values() for ex in c["examples"]][:MAX_EXAMPLES]}
