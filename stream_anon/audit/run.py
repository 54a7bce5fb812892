"""``audit()``: parse the input once, then run every applicable check on the same context.

Why independent: the engine enforces k-anonymity, generalization and accounting; a bug in it would go unnoticed
by any check that reuses its code (its hierarchy parser, its HMAC helpers, its idea of "the unit of an event").
The audit therefore imports nothing of the engine, the strategies or the engine's config. It re-derives
everything from three things only:

* the raw input messages exactly as produced to the raw topic (``((topic, partition, offset), payload)``),
* the secret (to recompute audit tokens ``HMAC(secret, "audit:" + event_id)`` and pseudonyms
  ``HMAC(secret, "unit:" + unit)``),
* the published outputs (records, release manifests, dead letters; docs/contracts.md section 5),

plus the stream's TOML config (:mod:`.config`).

Checks, in report order (each module's docstring says what it defeats): ``duplicates`` (:mod:`.inputs`:
identical copies from restarted workers merged, differing copies fail), ``k`` (:mod:`.checks.k_individuals`),
``l_diversity`` and ``severity`` (:mod:`.checks.l_diversity`, :mod:`.checks.severity`: only for a stream with
such ``[[anonymization.criteria]]``), ``leaks``, ``coverage``, ``accounting``, ``consistency``, ``m_invariance``
(only for a stream with ``[anonymization] m``), ``dp`` (:mod:`.checks.dp_budget`: only for a stream with ``[dp]``
or aggregate rows) and ``config`` (only when it finds something); ``input`` first when the manifests state another
reading of the raw messages (``input_digest``) than the config judging them has. Across accepted configuration
changes each release is judged by the config in force when it was made, the audit config or one of
``earlier_configs`` (:mod:`.in_force`).

Counterfeit records (m-invariance)
----------------------------------
An m-invariant release may add counterfeit records to a class (docs/contracts.md section 5); the manifest gives
their number per class (``counterfeit_records``). They are no input events. A counterfeit record is recognised
by its audit token, ``HMAC(secret, "counterfeit:" + release_id + "/" + class_id + "/" + n)`` for
``n < counterfeit_records`` of its class entry, in that release and class; only then is it kept out of ``k``
(it is no individual), ``coverage`` (it has no raw values) and ``accounting`` (it is no input event: the
equation counts real records only). Any other record of no raw event still fails as fabricated output, and a
class whose counterfeit records differ from its manifest count fails ``consistency``.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence, cast

from stream_anon.progress import steps

from .check import AuditContext, Check
from .causes import dominant_cause, k_out_of_reach, nothing_published_cause
from .checks.accounting import Accounting
from .checks.config_sanity import ConfigSanity
from .checks.consistency import Consistency
from .checks.coverage import Coverage
from .checks.dp_budget import DPBudgetCheck
from .checks.dp_values import DPValuesCheck
from .checks.k_individuals import KInIndividuals
from .checks.l_diversity import LDiversity
from .checks.leaks import Leaks
from .checks.m_invariance import MInvariance
from .checks.release_delta import ReleaseDelta
from .checks.severity import Severity
from .config import AuditConfig
from .inputs import build_context, outputs_part
from .lineages import own_settings, split_by_lineage, superseded_lineages, translate_tokens, unread
from .primitives import key_id
from .measures import class_individuals, health_figures, window_individuals
from .report import FAILED, NOT_PASSED, PASSED, AuditReport
from .risk import MaxProsecutorRisk, risk_figures

CHECKS: tuple[Check, ...] = (KInIndividuals(), ReleaseDelta(), LDiversity(), Severity(), Leaks(), Coverage(),
                             Accounting(), Consistency(), MInvariance(), DPBudgetCheck(), DPValuesCheck(),
                             ConfigSanity())
_M_SUMMARY_RENAMED = ("releases", "classes", "individuals")   # the audit's own summary has these names


def audit(raw_events: Iterable, outputs: Any, secret: bytes | str, config_view: AuditConfig,
          alerts: Iterable[dict] | None = None, max_prosecutor_risk: float | None = None,
          previous_secrets: Iterable[bytes | str] = (), earlier_configs: Iterable[AuditConfig] = (),
          reread: Callable | None = None) -> AuditReport:
    """Audit published outputs against the raw input: the report of :func:`audit_with_context`."""
    return audit_with_context(raw_events, outputs, secret, config_view, alerts, max_prosecutor_risk,
                              previous_secrets, earlier_configs, reread)[0]


def audit_with_context(raw_events: Iterable, outputs: Any, secret: bytes | str, config_view: AuditConfig,
                       alerts: Iterable[dict] | None = None, max_prosecutor_risk: float | None = None,
                       previous_secrets: Iterable[bytes | str] = (), earlier_configs: Iterable[AuditConfig] = (),
                       reread: Callable | None = None) -> tuple[AuditReport, AuditContext | None]:
    """Audit published outputs against the raw input. See the module docstring for the checks.

    raw_events: iterable of ``((topic, partition, offset), payload)`` with payload bytes/str (may be malformed).
    outputs: dict or object with lists ``records``, ``manifests``, ``deadletters`` (and optional ``malformed`` and
    ``aggregates``, the DP rows of anon.aggregates).
    alerts: the stream's messages on anon.metrics (any type; alerts are picked out), or None if not read.
    Returns the report and the context its checks read (None when the outputs carry another key id), from which
    ``stream-anon report`` draws its figures. The report's ``health`` (:func:`.measures.health_figures`) states
    loss, class sizes, dead letters by reason and alerts, and its ``risk`` (:func:`.risk.risk_figures`) the
    re-identification risk of every release; neither changes the verdict, except ``max_prosecutor_risk``: the
    ``risk`` check then fails for a release whose highest prosecutor risk is above it.
    previous_secrets: the secrets before key rotations; their tokens are mapped to ``secret``'s
    (:mod:`.lineages`). Outputs of several lineages are judged per lineage (:func:`audit_lineages`).
    earlier_configs: the configs in force before accepted configuration changes; each release is judged by the one
    whose settings were in force when it was made (:mod:`.in_force`; the report's ``settings_in_force``).
    reread: ``reread(config)`` -> the raw messages as ``config`` reads them (its ``[input]`` mapping), for a
    superseded lineage made under another reading (:func:`.lineages.own_settings`); None: ``raw_events`` for all.
    """
    cfg = config_view
    earlier = tuple(earlier_configs)
    if isinstance(secret, str):
        secret = secret.encode()
    previous = [p.encode() if isinstance(p, str) else p for p in previous_secrets]
    other_key = _other_key(outputs, secret, previous)
    if other_key:           # every token would look fabricated: one line, before any other check
        return AuditReport(passed=False, checks={"key": {"passed": False, "detail": other_key}},
                           summary=_EMPTY_SUMMARY | {"k": cfg.k}, verdict=FAILED, verdict_reason=other_key), None
    if previous:
        raw_events = list(raw_events)
        outputs = translate_tokens(raw_events, outputs, previous, secret)
    by_lineage = split_by_lineage(outputs)
    if len(by_lineage) > 1:
        return audit_lineages(list(raw_events), by_lineage, secret, cfg, alerts, previous, max_prosecutor_risk,
                              earlier, reread)
    report, ctx = _audit_one(raw_events, outputs, secret, cfg, alerts, previous, max_prosecutor_risk, earlier,
                             unread(cfg, outputs_part(outputs, "manifests")))
    report.summary["lineages"] = sorted(by_lineage)
    return report, ctx


def _audit_one(raw_events, outputs, secret: bytes, cfg: AuditConfig, alerts, previous: list[bytes],
               max_prosecutor_risk: float | None, earlier: tuple = (), unread: str | None = None
               ) -> tuple[AuditReport, AuditContext]:
    """Every check on the outputs of one lineage (``unread``: why its raw messages cannot be read as it read them,
    a failed check ``input``)."""
    ctx, duplicates = build_context(raw_events, outputs, secret, cfg, earlier)
    ctx.previous_secrets = tuple(previous)
    checks = {"duplicates": duplicates}
    if unread:
        checks["input"] = {"passed": False, "violations": 1, "violations_by_kind": {"input read otherwise": 1},
                           "examples": [{"violation": "input read otherwise", "line": unread}]}
    for check in steps(CHECKS, "auditing", unit="check"):
        if check.applies(ctx):
            checks[check.name] = check.run(ctx)

    accounting = checks["accounting"]
    counts = {key: accounting[key] for key in ("events_in", "published", "suppressed", "dead_lettered",
                                               "deferred", "open", "open_oldest", "lost", "duplicated",
                                               "unknown_tokens", "counterfeit_records")}
    summary = {**counts, "suppressed_by_reason": accounting["suppressed_by_reason"],
               "releases": len(ctx.manifests), "records": len(ctx.records), "classes": checks["k"]["classes"],
               "min_individuals": checks["k"]["min_individuals"], "k": cfg.k,
               "settings_in_force": ctx.in_force.judged_by(), "window_individuals": window_individuals(ctx)}
    if "m_invariance" in checks and "summary" in checks["m_invariance"]:
        summary.update({f"m_invariance_{k}" if k in _M_SUMMARY_RENAMED else k: v
                        for k, v in checks["m_invariance"]["summary"].items()})
    risk = risk_figures(ctx, cfg.risk)
    if max_prosecutor_risk is not None:
        checks["risk"] = MaxProsecutorRisk(max_prosecutor_risk).run(ctx, risk)
    health = health_figures(ctx, class_individuals(ctx), alerts)
    health["suppressed_by_reason"] = dict(sorted(accounting["suppressed_by_reason"].items()))
    health["deferred"] = accounting["deferred"]
    verdict, reason = judge(checks, summary, cfg.max_suppression_ratio)
    return AuditReport(passed=verdict == PASSED, checks=checks, summary=summary, health=health, verdict=verdict,
                       verdict_reason=reason, risk=risk), ctx


_EMPTY_SUMMARY = {"events_in": 0, "published": 0, "suppressed": 0, "dead_lettered": 0, "deferred": 0, "open": 0,
                  "lost": 0, "duplicated": 0, "releases": 0, "classes": 0, "min_individuals": None}


def _other_key(outputs: Any, secret: bytes, previous: Sequence[bytes] = ()) -> str | None:
    """Why the outputs cannot be audited with ``secret`` and the ``previous`` ones (their manifests name another
    key id), or None."""
    mine = key_id(secret)
    given = {mine} | {key_id(p) for p in previous}
    theirs = sorted({m["kid"] for m in outputs_part(outputs, "manifests") if isinstance(m, dict) and m.get("kid")}
                    - given)
    if not theirs:
        return None
    also = f" (previous: {', '.join(sorted(given - {mine}))})" if len(given) > 1 else ""
    return f"the releases carry key id {', '.join(theirs)}, this secret is key id {mine}{also}"


def audit_lineages(raw_events: list, by_lineage: dict, secret: bytes, cfg: AuditConfig, alerts,
                   previous: list[bytes], max_prosecutor_risk: float | None = None, earlier: tuple = (),
                   reread: Callable | None = None) -> tuple[AuditReport, AuditContext]:
    """Each lineage audited apart (:mod:`.lineages`): checks named ``<check> [<lineage>]``, the verdict the worst
    of theirs, the summary (and context) of the last lineage with every lineage's figures under ``lineages``. A
    superseded lineage is judged by the privacy unit, k, m and input reading it ran under
    (:func:`.lineages.own_settings`, listed under its ``judged_by_its_own``), its raw messages read as its config
    reads them (``reread``)."""
    superseded = superseded_lineages(m for part in by_lineage.values() for m in part.manifests)
    own = {name: own_settings(cfg, part.manifests, earlier) if name in superseded else (cfg, [])
           for name, part in by_lineage.items()}
    audited = {}
    for name, part in by_lineage.items():
        mine, raw, why = own[name][0], raw_events, unread(own[name][0], part.manifests)
        if None not in (mine.input_digest, cfg.input_digest) and mine.input_digest != cfg.input_digest:
            if reread is not None:
                raw = reread(mine)
            elif why is None:
                why = (f"the lineage read its raw messages as input_digest {mine.input_digest} states, this audit has "
                       f"them only as the config reads them ({cfg.input_digest})")
        audited[name] = _audit_one(raw, part, secret, mine, alerts, previous, max_prosecutor_risk, earlier, why)
    reports = {name: r for name, (r, _) in audited.items()}
    checks = {f"{check} [{name}]": result for name, r in reports.items() for check, result in r.checks.items()}
    if cfg.dp is not None and cfg.dp.period is not None and len(reports) > 1:
        checks["dp across lineages"] = _dp_across_check(reports, cfg.dp.budget)
    order = {FAILED: 2, NOT_PASSED: 1, PASSED: 0}
    worst = max(reports, key=lambda n: order[cast(str, reports[n].verdict)])     # set by AuditReport.__post_init__
    verdict = reports[worst].verdict
    reason = None if verdict == PASSED else f"lineage {worst}: {reports[worst].verdict_reason}"
    if not checks.get("dp across lineages", {"passed": True})["passed"]:
        verdict, reason = FAILED, "dp across lineages" + (f"; {reason}" if reason else "")
    last = list(reports)[-1]
    summary = dict(reports[last].summary)
    summary["lineages"] = {name: {"verdict": r.verdict, "releases": r.summary["releases"],
                                  "published": r.summary["published"], "events_in": r.summary["events_in"],
                                  **({"judged_by_its_own": own[name][1]} if own[name][1] else {}),
                                  **_dp_figures(r)} for name, r in reports.items()}
    across = _dp_across(reports)
    if across:
        summary["dp_across_lineages"] = across
    return AuditReport(passed=verdict == PASSED, checks=checks, summary=summary, health=reports[last].health,
                       verdict=verdict, verdict_reason=reason, risk=reports[last].risk), audited[last][1]


def _dp_figures(report: AuditReport) -> dict:
    dp = report.checks.get("dp")
    if not dp:
        return {}
    return {"dp_worst_unit_charge": dp.get("worst_unit_charge"), "dp_worst_period": dp.get("worst_period"),
            "dp_charges": period_totals(dp)}


def period_totals(dp: dict) -> dict:
    """Period -> the worst unit's charge in all (the DP check's ``spent_by_period``)."""
    return {period: entry["total"] for period, entry in (dp.get("spent_by_period") or {}).items()}


def _dp_across(reports: dict) -> dict:
    """Period -> the worst partition's charge summed over the lineages: what a consumer of every lineage faces."""
    total: dict = {}
    for r in reports.values():
        for period, charge in period_totals(r.checks.get("dp") or {}).items():
            total[period] = round(total.get(period, 0.0) + charge, 9)
    return total


def _dp_across_check(reports: dict, budget: float) -> dict:
    """A unit's loss in a period over every lineage (a lineage after a total loss starts with an empty ledger):
    each period's worst charge summed over the lineages within the budget, else a line naming the period and the
    charges (a new lineage carries what a lost one spent: ``worker --carry-budget``, docs/operations.md)."""
    examples = []
    for period, total in sorted(_dp_across(reports).items()):
        if total > budget * (1 + 1e-9):
            examples.append({"violation": "period over budget across lineages", "period": period, "charge": total,
                             "budget": budget, "by_lineage": {name: period_totals(r.checks.get("dp") or {})
                                                              .get(period) for name, r in reports.items()}})
    return {"passed": not examples, "violations": len(examples),
            "violations_by_kind": {"period over budget across lineages": len(examples)} if examples else {},
            "examples": examples[:10]}


def judge(checks: dict, summary: dict, max_suppression_ratio: float) -> tuple[str, str | None]:
    """The verdict: FAILED when a check failed; NOT PASSED when every check held but the run published nothing,
    or suppressed more than ``max_suppression_ratio`` of the events it placed (suppressed / (published +
    suppressed)); else PASSED. A run that protects by publishing nothing is no evidence that the stream works."""
    if not all(c["passed"] for c in checks.values()):
        return FAILED, ", ".join(name for name, c in checks.items() if not c["passed"])
    published, suppressed = summary["published"], summary["suppressed"]
    if not published:
        return NOT_PASSED, (f"nothing published ({summary['events_in']} events in, {suppressed} suppressed): "
                            f"{nothing_published_cause(summary)}")
    ratio = suppressed / (published + suppressed)
    if ratio > max_suppression_ratio:
        cause = k_out_of_reach(summary) or dominant_cause(summary.get("suppressed_by_reason"))
        return NOT_PASSED, (f"{ratio:.1%} of the placed events suppressed, above max_suppression_ratio "
                            f"{max_suppression_ratio:g}; {cause}")
    return PASSED, None
