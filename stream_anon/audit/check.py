"""The interface every audit check implements: what a check is given (:class:`AuditContext`), what it returns
(a result dict built with :class:`ViolationLog`), and the :class:`Check` protocol itself."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from .config import AuditConfig
from .in_force import SettingsInForce, settings_in_force
from .primitives import source_key

MAX_EXAMPLES = 10


@dataclass
class RawEvent:
    """One message of the raw topic: its source, the event if it parsed, its audit token and privacy unit."""

    source: tuple[str, int, int] | None
    event: dict | None
    token: str | None
    unit: str | None


@dataclass
class AuditContext:
    """Everything a check may read: the config view, the secret, the parsed raw input and the deduplicated
    outputs of this stream."""

    config: AuditConfig
    secret: bytes
    raws: list[RawEvent]
    records: list[dict]
    manifests: list[dict]
    deadletters: list[dict]
    malformed: list[Any]                 # output messages that were not JSON objects (or nested too deep)
    counterfeits: dict[str, tuple]       # token -> (release_id, class_id) of announced counterfeit records
    aggregates: list[dict] = field(default_factory=list)   # DP rows of anon.aggregates, one per row_id
    previous_secrets: tuple = ()         # secrets before key rotations (their pseudonyms are leaks too)
    earlier_configs: tuple = ()          # the configs in force before accepted changes (--earlier-config)
    # release id -> the settings in force and the config that judges it (:mod:`.in_force`)
    in_force: SettingsInForce = field(init=False)
    # token -> the raw event its records stand for (:meth:`raw_of` also takes the record's partition into account)
    by_token: dict[str, RawEvent] = field(init=False, default_factory=dict)
    _open_by_partition: dict[tuple, RawEvent] = field(init=False, default_factory=dict, repr=False)
    _release_partition: dict[Any, Any] = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # Several raw messages may carry one event id (a producer's retry, a hostile copy with other values). The
        # worker publishes at most the copies it did not dead-letter (the others are placed by their source), so
        # a record stands for a copy that is not dead-lettered, on the partition of its release (the worker's
        # duplicate check is per partition); the first copy only when there is no such copy.
        dead = {source_key(d.get("source")) for d in self.deadletters}
        fallback: dict[str, RawEvent] = {}
        for raw in self.raws:
            if raw.token is None:
                continue
            fallback.setdefault(raw.token, raw)
            if raw.source not in dead:
                self.by_token.setdefault(raw.token, raw)
                if raw.source is not None:
                    self._open_by_partition.setdefault((raw.token, raw.source[1]), raw)
        for token, raw in fallback.items():
            self.by_token.setdefault(token, raw)
        for m in self.manifests:
            self._release_partition.setdefault(m.get("release_id"), m.get("partition"))
        self.in_force = settings_in_force(self.manifests, [self.config, *self.earlier_configs])

    def config_for(self, release_id: Any) -> AuditConfig:
        """The config a release is judged by: the one in force when it was made (:mod:`.in_force`)."""
        return self.in_force.config_of(release_id)

    def raw_of(self, record: dict) -> RawEvent | None:
        """The raw event a published record stands for (None: no raw event has its token)."""
        token: Any = record.get("audit_token")      # any JSON value: one that is no token finds nothing
        partition = self._release_partition.get(record.get("release_id"))
        raw = self._open_by_partition.get((token, partition)) if partition is not None else None
        return raw if raw is not None else self.by_token.get(token)

    def is_counterfeit(self, record: dict) -> bool:
        """An announced counterfeit record of its own release and class (never a raw event's record)."""
        token: Any = record.get("audit_token")      # any JSON value: one that is no token finds nothing
        return token not in self.by_token and \
            self.counterfeits.get(token) == (record.get("release_id"), record.get("class_id"))


class Check(Protocol):
    """One audit check: ``name`` is its key in the report's ``checks``."""

    name: str

    def applies(self, ctx: AuditContext) -> bool:
        """Whether the check is part of this audit (m-invariance only runs for a stream with m)."""

    def run(self, ctx: AuditContext) -> dict:
        """The result: ``passed``, ``violations``, ``violations_by_kind``, details, ``examples``."""


class ViolationLog:
    """Collects violations (counted by kind, first MAX_EXAMPLES kept) and extra details of one check."""

    def __init__(self) -> None:
        self.violations: Counter = Counter()
        self.examples: list[dict] = []
        self.details: dict[str, Any] = {}

    def fail(self, kind: str, **info: Any) -> None:
        self.violations[kind] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"violation": kind, **info})

    def result(self, extra_ok: bool = True) -> dict:
        n = sum(self.violations.values())
        return {"passed": n == 0 and extra_ok, "violations": n,
                "violations_by_kind": dict(self.violations), **self.details, "examples": self.examples}
