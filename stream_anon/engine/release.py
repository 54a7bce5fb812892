"""What the engine emits: releases (records + manifest), rejections for the dead-letter topic."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np


@dataclass
class Rejection:
    """An input event the engine cannot anonymize, with the reason (goes to the dead-letter topic)."""
    event: dict
    reason: str


@dataclass
class ClassInfo:
    class_id: str
    generalization: dict
    individuals: int       # distinct privacy units among this release's records of the class
    records: int
    ncp: float
    reused: bool           # True: records released under a class published by an earlier release


@dataclass
class Release:
    """One window's output of one partition (columnar; records materialize on demand)."""
    release_id: str
    stream: str
    partition: int
    seq: int
    window_start: float
    window_end: float
    watermark: float
    k: int
    classes: list[ClassInfo]
    # per published record (aligned arrays)
    record_class: np.ndarray           # index into classes
    record_sensitive: list             # tuples aligned with sensitive_fields
    record_token: list
    record_ncp: np.ndarray
    sensitive_fields: tuple
    suppressed_tokens: dict[str, list] = field(default_factory=dict)
    deferred_tokens: list = field(default_factory=list)
    max_suppression_ratio: float = 1.0

    @property
    def published(self) -> int:
        return len(self.record_token)

    @property
    def suppressed(self) -> dict[str, int]:
        return {reason: len(tokens) for reason, tokens in self.suppressed_tokens.items()}

    @property
    def n_suppressed(self) -> int:
        return sum(len(t) for t in self.suppressed_tokens.values())

    @property
    def ncp_mean(self) -> float:
        return float(self.record_ncp.mean()) if len(self.record_ncp) else 0.0

    @property
    def suppression_ratio(self) -> float:
        total = self.published + self.n_suppressed
        return self.n_suppressed / total if total else 0.0

    @property
    def records(self) -> list[dict]:
        """Published records as dicts (docs/contracts.md section 5)."""
        gens = [c.generalization for c in self.classes]
        ids = [c.class_id for c in self.classes]
        names = self.sensitive_fields
        return [
            {"release_id": self.release_id, "class_id": ids[c], "qi": gens[c],
             "sensitive": dict(zip(names, sv)), "audit_token": tok}
            for c, sv, tok in zip(self.record_class.tolist(), self.record_sensitive, self.record_token)
        ]

    def manifest(self) -> dict:
        ratio = self.suppression_ratio
        return {
            "release_id": self.release_id, "stream": self.stream, "partition": self.partition, "seq": self.seq,
            "window_start": _iso(self.window_start), "window_end": _iso(self.window_end),
            "watermark": _iso(self.watermark), "k": self.k,
            "classes": [{"class_id": c.class_id, "generalization": c.generalization, "individuals": c.individuals,
                         "records": c.records, "ncp": round(c.ncp, 6), "reused": c.reused} for c in self.classes],
            "published": self.published, "suppressed": self.suppressed,
            "suppressed_tokens": self.suppressed_tokens, "deferred": len(self.deferred_tokens),
            "deferred_tokens": self.deferred_tokens, "ncp_mean": round(self.ncp_mean, 6),
            "suppression_ratio": round(ratio, 6),
            "suppression_limit_exceeded": ratio > self.max_suppression_ratio,
            "created_at": datetime.now(timezone.utc).isoformat(),
        }


@dataclass
class StepResult:
    releases: list[Release] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)

    def extend(self, other: "StepResult") -> "StepResult":
        self.releases += other.releases
        self.rejected += other.rejected
        return self


def _iso(ts: float) -> str | None:
    if ts is None or not np.isfinite(ts):
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()
