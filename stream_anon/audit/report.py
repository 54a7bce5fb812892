"""The audit's verdict: every check's result and a summary of the accounting and the classes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stream_anon.numbers import plain, share

from .causes import ADVICE, LATE


def _fmt(counts: dict | None) -> str:
    if counts is None:
        return "not read"
    return ", ".join(f"{k}={v}" for k, v in counts.items()) or "none"


PASSED, FAILED, NOT_PASSED = "PASSED", "FAILED", "NOT PASSED"


def late_cause(by_reason: dict | None) -> str | None:
    """A line naming lateness when it is the largest suppression reason, with what to do; else None.

    >>> late_cause({"late": 90, "k": 10})[:60]
    '  most suppressed events are late: 90 of 100 (90.0%): events'
    >>> late_cause({"late": 1, "k": 10}) is None, late_cause({}) is None
    (True, True)
    """
    counts = by_reason or {}
    total = sum(counts.values())
    late = counts.get(LATE, 0)
    if not late or late < max(counts.values()):
        return None
    return f"  most suppressed events are late: {late} of {total} ({late / total:.1%}): {ADVICE[LATE]}"


def _releases(n: int) -> str:
    return f"{n} release{'' if n == 1 else 's'}"


def format_settings_in_force(entries: list[dict] | None) -> list[str]:
    """The configs that judged the releases, with how many each (:meth:`.in_force.SettingsInForce.judged_by`);
    nothing when the audit config judged every release.

    >>> format_settings_in_force([{"config": "new.toml", "earlier": False, "releases": 5},
    ...                           {"config": "old.toml", "earlier": True, "releases": 3}])
    ['  settings in force: new.toml judged 5 releases; earlier config old.toml judged 3 releases']
    >>> format_settings_in_force([{"config": "new.toml", "earlier": False, "releases": 5},
    ...                           {"config": None, "releases": 3, "unjudged": 0, "k": [10]}])[0]
    '  settings in force: new.toml judged 5 releases; the audit config with k 10 in force judged 3 releases'
    """
    if not entries or len(entries) < 2:
        return []
    parts = []
    for e in entries:
        if e["config"] is None:
            ks = ", ".join(str(k) for k in e["k"])
            parts.append(f"the audit config with k {ks} in force judged {_releases(e['releases'])}"
                         + (f" ({e['unjudged']} made under settings no given config has: see the checks that read "
                            "them)" if e["unjudged"] else ""))
        else:
            parts.append(f"{'earlier config ' if e['earlier'] else ''}{e['config']} judged {_releases(e['releases'])}")
    return ["  settings in force: " + "; ".join(parts)]


@dataclass
class AuditReport:
    """``passed`` only for the verdict PASSED; ``verdict`` FAILED (a check failed) or NOT PASSED (every check held
    but the run published nothing or suppressed more than ``max_suppression_ratio``: :func:`.run.judge`)."""

    passed: bool
    checks: dict[str, dict]
    summary: dict[str, Any]
    health: dict[str, Any] = field(default_factory=dict)   # measures.health_figures: figures, never a verdict
    verdict: str | None = None
    verdict_reason: str | None = None
    risk: dict[str, Any] = field(default_factory=dict)     # risk.risk_figures: summary, per_release, intersection

    def __post_init__(self) -> None:
        if self.verdict is None:
            self.verdict = PASSED if self.passed else FAILED

    def to_dict(self) -> dict:
        return {"passed": self.passed, "verdict": self.verdict, "verdict_reason": self.verdict_reason,
                "summary": self.summary, "health": self.health, "checks": self.checks, "risk": self.risk}

    def format_risk(self) -> list[str]:
        """Risk lines: the run's prosecutor, marketer and journalist figures, the cross-release attack."""
        s = (self.risk or {}).get("summary") or {}
        p = s.get("prosecutor")
        if not p:
            return ["risk: no release with individuals"]
        j = s.get("journalist")
        lines = [f"risk: prosecutor highest={plain(p['highest'], 6)} (release {s.get('highest_release_id')}) "
                 f"average={plain(p['average'], 6)} records_at_risk={share(p['records_at_risk'])} of individuals "
                 f"(risk > {plain(s['threshold'])}) over {s['releases']} releases; marketer="
                 f"{plain(s.get('marketer'), 6)} (= {'journalist' if j else 'prosecutor'} average)"]
        if j:
            lines.append(f"  journalist highest={plain(j['highest'], 6)} average={plain(j['average'], 6)} "
                         f"records_at_risk={share(j['records_at_risk'])} of individuals; population uniqueness max="
                         f"{share(j['population_uniqueness_max'])}")
        x = self.risk.get("intersection")
        if x:
            lines.append(f"  intersection attack (m-invariance): targets={x['targets']} min_candidates="
                         f"{x['min_candidates']} mean_candidates={x['mean_candidates']} pinned={x['pinned']} "
                         f"risk={x['risk']}")
        return lines

    def format_health(self) -> list[str]:
        """Privacy/utility health lines (loss, class sizes, suppression, deferred, dead letters, alerts)."""
        h = self.health
        if not h:
            return []
        ncp, sizes = h.get("ncp") or {}, h.get("class_individuals") or {}
        lines = [f"health: NCP of published records mean={ncp.get('mean')} p95={ncp.get('p95')} "
                 f"(records={ncp.get('records')})"]
        if sizes.get("classes"):
            lines.append("  individuals per class: min={min} p50={p50} mean={mean} p95={p95} max={max} over {classes} "
                         "classes; ".format(**sizes) + _fmt(sizes.get("bins")))
        else:
            lines.append("  individuals per class: no classes")
        whole = h.get("whole_domain") or {}
        if whole.get("run"):
            worst = {name: max((r.get(name, 0) for r in whole["releases"].values()), default=0)
                     for name in whole["run"]}
            lines.append(f"  published as the whole domain (share of records): {_fmt(whole['run'])}; "
                         f"highest in one release: {_fmt(worst)}")
        for name, f in ((h.get("h3_positions") or {}).get("run") or {}).items():
            lines.append(f"  H3 positions {name}: mean resolution {f['mean_resolution']} (cells, whole domain left "
                         f"out), NCP {f['ncp']} (cell area over the domain's) over {f['records']} records")
        lines.append(f"  suppressed by reason: {_fmt(h.get('suppressed_by_reason'))}; deferred={h.get('deferred')}")
        cause = late_cause(h.get("suppressed_by_reason"))
        if cause:
            lines.append(cause)
        lines.append(f"  dead letters by reason: {_fmt(h.get('deadletters_by_reason'))}")
        alerts = h.get("alerts")
        lines.append(f"  alerts on anon.metrics: {_fmt(alerts)}" + (" (ALERT)" if alerts else "")
                     + (f"; expected: {_fmt(h['expected'])} (a new stream's first lineage: no alert)"
                        if h.get("expected") else ""))
        return lines

    def format_text(self) -> str:
        lines = [f"AUDIT {self.verdict}" + (f": {self.verdict_reason}" if self.verdict_reason else "")]
        s = self.summary
        lines.append(
            "events_in={events_in} published={published} suppressed={suppressed} dead_lettered={dead_lettered} "
            "deferred={deferred} open={open} lost={lost} duplicated={duplicated} releases={releases} "
            "classes={classes} min_individuals={min_individuals} (k={k})".format(**{"open": 0, **s})
        )
        if s.get("open"):
            lines.append(f"  open: {s['open']} events in windows not released yet (oldest event time "
                         f"{s.get('open_oldest')}): not lost, released when their windows close")
        lines.extend(format_settings_in_force(s.get("settings_in_force")))
        lineages = s.get("lineages")
        for name, f in (lineages.items() if isinstance(lineages, dict) else ()):
            lines.append(f"  lineage {name}: {f['verdict']}, events_in={f['events_in']} releases={f['releases']} "
                         f"published={f['published']}" + (f", DP worst unit charge {f['dp_worst_unit_charge']} "
                                                          f"(period {f['dp_worst_period']})" if f.get("dp_charges")
                                                          else "")
                         + (f"; superseded, judged by its own {', '.join(f['judged_by_its_own'])}"
                            if f.get("judged_by_its_own") else ""))
        if s.get("dp_across_lineages"):
            lines.append("  dp across lineages (what a consumer of every lineage faces): " + ", ".join(
                f"period {p}: {c:g}" for p, c in s["dp_across_lineages"].items()))
        for name, chk in self.checks.items():
            info = {k: v for k, v in chk.items() if k not in ("passed", "examples") and not isinstance(v, (dict, list))}
            lines.append(f"  [{'ok' if chk['passed'] else 'FAIL'}] {name}: " + ", ".join(f"{k}={v}" for k, v in info.items()))
            for ex in chk.get("examples", [])[:3] if not chk["passed"] else []:
                lines.append(f"      - {ex.get('line', ex) if isinstance(ex, dict) else ex}")
        lines.extend(self.format_health())
        if self.risk:
            lines.extend(self.format_risk())
        return "\n".join(lines)
