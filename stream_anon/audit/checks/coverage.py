"""Check ``coverage``: every record's generalized QIs contain the raw event's true values. Defeats
generalizations that are "anonymous" only because they are wrong (shifted intervals, sibling labels).

Null raw QI values: a raw QI that is null (or absent) is covered when the published QI is absent/null, a dict of
only nulls, a label equal to ``"*"`` or the hierarchy root, or an interval/box covering the configured domain
``[lower, upper]``. Unknown categorical values (not in the hierarchy) are only covered by ``"*"``/the root.
Time intervals are half-open, ``[from, to)`` (the engine snaps them outward to ``time_granularity_s``: a zero-width
interval is malformed and covers nothing); numeric intervals and geo boxes are closed and allow 1e-9 of float slack
(:func:`..primitives.cover_test`).
A geopoint published as an H3 cell (``{"h3": cell, "resolution": r}``) covers a position when the position's cell at
that resolution is the cell (:func:`..primitives.h3_cell_covers`, with the h3 package, exact); ``{"h3": "*"}`` is
the whole domain.

Each record is judged by the config in force when its release was made (:mod:`..in_force`): its quasi-identifiers'
fields, kinds, domain bounds and hierarchies. A release made under such a setting that no given config has fails
once per setting, with one line naming the release and the setting's value (give the config in force then with
``--earlier-config``, e.g. the hierarchy's digest); that quasi-identifier is not judged under another setting.
"""
from __future__ import annotations

from ..check import AuditContext, ViolationLog
from ..primitives import cover_test, qi_value


class Coverage:
    name = "coverage"

    def applies(self, ctx: AuditContext) -> bool:
        return True

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        for entry in ctx.in_force.unmatched_lines(self.name):
            log.fail("release made under settings no given config has", **entry)
        checked = 0
        for r in ctx.records:
            raw = ctx.raw_of(r)
            if raw is None or raw.event is None:
                continue  # reported by k / accounting
            # A raw event type beside a class box would split the class (contracts.md section 5): it may appear
            # only generalized, as a configured QI.
            if "event_type" in r:
                log.fail("raw event_type published outside the QIs", release_id=r.get("release_id"),
                         audit_token=r.get("audit_token"))
            qi = r.get("qi") or {}
            if not isinstance(qi, dict):
                log.fail("malformed qi", release_id=r.get("release_id"), audit_token=r.get("audit_token"))
                continue
            rid = r.get("release_id")
            unjudged = ctx.in_force.skipped(rid, self.name)
            for q in ctx.config_for(rid).quasi_identifiers:
                if any(key.startswith(f"quasi_identifiers.{q.name}.") for key in unjudged):
                    continue
                checked += 1
                ok, why = cover_test(q, qi.get(q.name), qi_value(q, raw.event))
                if not ok:
                    log.fail(f"{q.name}: {why}", release_id=r.get("release_id"), class_id=r.get("class_id"),
                             audit_token=r.get("audit_token"), published=qi.get(q.name))
        log.details.update(records=len(ctx.records), qi_values_checked=checked)
        return log.result()
