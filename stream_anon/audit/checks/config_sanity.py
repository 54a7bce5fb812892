"""Check ``config``: settings that make the published output leak whatever the engine does. Reported only when
it finds something (a clean config adds no entry to the report)."""
from __future__ import annotations

from ..check import AuditContext, ViolationLog


def _identifiers_marked_sensitive(ctx: AuditContext) -> list[str]:
    return [f for f in ctx.config.sensitive_fields if f in ctx.config.identifier_fields]


class ConfigSanity:
    name = "config"

    def applies(self, ctx: AuditContext) -> bool:
        return bool(_identifiers_marked_sensitive(ctx))

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        for f in _identifiers_marked_sensitive(ctx):
            log.fail("identifier configured as sensitive (published verbatim)", field=f)
        return log.result()
