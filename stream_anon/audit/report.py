"""The audit's verdict: every check's result and a summary of the accounting and the classes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class AuditReport:
    passed: bool
    checks: dict[str, dict]
    summary: dict[str, Any]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "summary": self.summary, "checks": self.checks}

    def format_text(self) -> str:
        lines = [f"AUDIT {'PASSED' if self.passed else 'FAILED'}"]
        s = self.summary
        lines.append(
            "events_in={events_in} published={published} suppressed={suppressed} dead_lettered={dead_lettered} "
            "deferred={deferred} lost={lost} duplicated={duplicated} releases={releases} classes={classes} "
            "min_individuals={min_individuals} (k={k})".format(**s)
        )
        for name, chk in self.checks.items():
            info = {k: v for k, v in chk.items() if k not in ("passed", "examples") and not isinstance(v, (dict, list))}
            lines.append(f"  [{'ok' if chk['passed'] else 'FAIL'}] {name}: " + ", ".join(f"{k}={v}" for k, v in info.items()))
            for ex in chk.get("examples", [])[:3] if not chk["passed"] else []:
                lines.append(f"      - {ex}")
        return "\n".join(lines)
