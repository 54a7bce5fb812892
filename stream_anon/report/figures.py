"""The figures of ``stream-anon report``, all from what the audit read and counted (its context and its report):
releases over time, class sizes, re-identification risk per release, the DP budget per period, the analyst's
query error, dead letters and alerts. Numbers only; :mod:`.plots` draws them and :mod:`.summary` states them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from stream_anon.audit.measures import class_individuals

if TYPE_CHECKING:
    from stream_anon.audit.check import AuditContext
    from stream_anon.evaluate.utility import Placement


def _order(m: dict) -> tuple:
    return (str(m.get("window_start")), str(m.get("partition")), m.get("seq") or 0, str(m.get("release_id")))


def releases(ctx) -> list[dict]:
    """One entry per release (the audit's deduplicated manifests), in window order: published and suppressed
    events, NCP mean, suppression ratio, counterfeit records."""
    out = []
    for m in sorted(ctx.manifests, key=_order):
        suppressed = m.get("suppressed") or {}
        out.append({"release_id": m.get("release_id"), "partition": m.get("partition"), "seq": m.get("seq"),
                    "window_start": m.get("window_start"), "published": m.get("published") or 0,
                    "suppressed": sum(v for v in suppressed.values() if isinstance(v, int)),
                    "ncp_mean": m.get("ncp_mean"), "suppression_ratio": m.get("suppression_ratio"),
                    "counterfeit_records": m.get("counterfeit_records", 0),
                    "classes": len(m.get("classes") or [])})
    return out


def class_sizes(ctx) -> list[int]:
    """Distinct individuals of every class over all its releases (the audit's ``k`` count)."""
    return sorted(len(units) for units in class_individuals(ctx).overall.values())


def risk_per_release(report) -> list[dict]:
    """The audit's re-identification risk of every release (``risk.per_release`` of its report:
    :func:`stream_anon.audit.risk.risk_figures`, class sizes in individuals over reused classes), in window order."""
    per = (getattr(report, "risk", None) or {}).get("per_release") or []
    return sorted(per, key=lambda r: (str(r.get("window_start")), str(r.get("release_id"))))


def placement(ctx: AuditContext) -> Placement:
    """What the stream did with its events, from the audit's context (:class:`stream_anon.evaluate.utility.
    Placement`): the raw events a release published or suppressed, in input order, and the published records."""
    from stream_anon.evaluate.utility import Placement

    ordered = sorted(ctx.manifests, key=_order)
    index = {m.get("release_id"): i for i, m in enumerate(ordered)}
    chosen: dict[str, tuple] = {}           # token -> (the raw event the release placed, release index)
    records, record_release = [], []
    for r in ctx.records:
        i = index.get(r.get("release_id"))
        if i is None:
            continue
        records.append(r)
        record_release.append(i)
        raw = ctx.raw_of(r)
        if raw is not None and raw.event is not None:
            assert raw.token is not None        # raw_of finds a raw event by its token
            chosen.setdefault(raw.token, (raw, i))
    for m in ordered:
        for tokens in (m.get("suppressed_tokens") or {}).values():
            for t in tokens or ():
                raw = ctx.by_token.get(t)
                if raw is not None and raw.event is not None:
                    chosen.setdefault(t, (raw, index[m.get("release_id")]))
    placed = sorted(chosen.values(), key=lambda x: x[0].source or ())
    rels = [{"release_id": m.get("release_id"), "partition": m.get("partition"),
             "window_start": m.get("window_start")} for m in ordered]
    return Placement([raw.event for raw, _ in placed], np.array([i for _, i in placed], dtype=np.int64), records,
                     np.array(record_release, dtype=np.int64), rels, list(ctx.aggregates))


def dp_budget(report, config) -> dict | None:
    """The DP budget per period: the audit's recomputed worst-unit charge per aggregate (``spent_by_period`` of its
    ``dp`` check) beside each aggregate's epsilon and the period's budget."""
    if config.dp is None:
        return None
    chk = report.checks.get("dp") or {}
    return {"budget": config.dp.epsilon_budget, "period": config.dp.period, "unit": config.dp.privacy_unit,
            "epsilon": {s.name: s.epsilon for s in config.dp.aggregates},
            "spent_by_period": chk.get("spent_by_period") or {}, "worst_unit_charge": chk.get("worst_unit_charge")}


def generalization(health: dict) -> list[dict]:
    """Per quasi-identifier the audit judges: the share of published records generalized to the whole domain over
    the run and its highest in one release, and for an H3 position the mean published resolution and the
    position NCP (the published cell's area over the domain's), from the audit's health."""
    whole = health.get("whole_domain") or {}
    h3 = (health.get("h3_positions") or {}).get("run") or {}
    rows = []
    for name, share in (whole.get("run") or {}).items():
        highest = max((r.get(name, 0.0) for r in (whole.get("releases") or {}).values()), default=None)
        cell = h3.get(name) or {}
        rows.append({"qi": name, "whole_domain": share, "whole_domain_highest_release": highest,
                     "mean_resolution": cell.get("mean_resolution"), "position_ncp": cell.get("ncp")})
    return rows


def compute(report, ctx, config, query_seed: int = 0) -> dict:
    """Every figure of the report (JSON-ready)."""
    from stream_anon.evaluate.utility import query_error

    figures: dict[str, Any] = {"releases": releases(ctx), "class_sizes": class_sizes(ctx),
                               "risk": risk_per_release(report), "dp_budget": dp_budget(report, config),
                               "deadletters_by_reason": (report.health or {}).get("deadletters_by_reason") or {},
                               "alerts_by_name": (report.health or {}).get("alerts") or {},
                               "generalization": generalization(report.health or {})}
    placed = placement(ctx)
    figures["query_error"] = query_error(config, placed, seed=query_seed) if placed.events else None
    noise_error((figures["query_error"] or {}).get("dp"), report.checks.get("dp_values") or {})
    return figures


def noise_error(dp_errors: dict | None, dp_values: dict) -> None:
    """Each aggregate's ``realized_noise``: the RMSE of its published values against the audit's recomputed
    bounded true values (the error the noise made, per partition's row, for the output the entry measures); and
    ``bounding_bias`` beside it when the RMSE against the unbounded truth is known (what contribution bounding
    and clamping add)."""
    if not dp_errors:
        return
    realized = dp_values.get("realized_error") or {}
    for name, entry in dp_errors.items():
        got = (realized.get(name) or {}).get(entry.get("output")) or {}
        entry["realized_noise"] = {"rmse": got.get("rmse"), "rows": got.get("rows", 0)}
