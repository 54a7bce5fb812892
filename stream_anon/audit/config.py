"""The audit's view of a stream config, read from the TOML with :mod:`tomllib` (the one place the audit reads it).

The audit does not use :mod:`stream_anon.config` nor :mod:`stream_anon.criteria`: a bug in the engine's config
parsing (a k read wrongly, a hierarchy misparsed, an l dropped) would otherwise make the engine and its checker
agree on the wrong thing. ``[[anonymization.criteria]]`` is read here into the audit's own specs; a criterion kind
the audit does not know is an error, never a pass.
"""
from __future__ import annotations

import math
import tomllib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_anon.contract import config_dir
from stream_anon.inputs import input_digest, parse_input
from stream_anon.risk import DEFAULT_THRESHOLD, RiskSettings

from .dp_config import DPBudget, read_dp
from .dp_values import DPValues, read_dp_values
from .primitives import Hierarchy, QISpec, numeric_granularity


@dataclass(frozen=True)
class MInvarianceConfig:
    """What the m-invariance check needs: ``[anonymization] m``, the privacy unit and ``[sensitive] invariant``."""

    m: int
    privacy_unit: str
    invariant: str
    stream: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.m, int) or self.m < 2:
            raise ValueError(f"anonymization.m: must be an integer >= 2, got {self.m!r}")

    @classmethod
    def from_toml(cls, path: str | Path, m: int | None = None) -> "MInvarianceConfig":
        """The stream's m-invariance settings; ``m`` overrides the file's (benchmarks compare several m)."""
        return AuditConfig.from_toml(path).m_invariance(m, source=path)


L_KINDS = ("distinct_l_diversity", "entropy_l_diversity", "frequency_l_diversity")
# Seed 003, Table 1 and Example 2 (Kayem, Vester & Meinel, DEXA 2016): the "crime" preset of a severity rule,
# written out here so that the audit shares no table with the engine
CRIME_SEVERITY = {"Embezzlement": 3, "Disorderly Conduct": 3, "Theft": 5, "Drunken Driving": 5, "Robbery": 7,
                  "Murder": 25}


@dataclass(frozen=True)
class LDiversitySpec:
    """An l-diversity criterion: ``kind`` (one of ``L_KINDS``), the sensitive ``field`` and ``l``."""
    kind: str
    field: str
    l: float


@dataclass(frozen=True)
class SeveritySpec:
    """Seed 003's severity rule: ``k_min`` = max(anonymization.k, the map's smallest severity)."""
    field: str
    severity: dict
    k_min: int
    default: float
    cap: int | None = None
    l_floor: int = 1
    diversity: bool = True

    def score(self, value: Any) -> float:
        return self.severity.get(str(value), self.default) if value is not None else self.default


def severity_k_min(k: int, severity: dict) -> int:
    """Seed 003's k_min of a severity map under ``k``: max(k, the map's smallest severity)."""
    return int(max(k, min(severity.values())))


def _criteria(raw: Any, k: int) -> list:
    """The audit's reading of ``[[anonymization.criteria]]``."""
    out: list = []
    for i, t in enumerate(raw or []):
        at = f"anonymization.criteria[{i}]"
        kind = t.get("kind") if isinstance(t, dict) else None
        if kind in L_KINDS:
            l = t.get("l")
            if isinstance(l, bool) or not isinstance(l, (int, float)) or not math.isfinite(l) or l < 1:
                raise ValueError(f"{at}.l: a number >= 1, got {l!r}")
            out.append(LDiversitySpec(kind, str(t["field"]), float(l)))
        elif kind == "severity":
            sev = t.get("severity")
            sev = CRIME_SEVERITY if sev == "crime" else sev
            if not isinstance(sev, dict) or not sev:
                raise ValueError(f"{at}.severity: a table value -> severity, or \"crime\"; got {sev!r}")
            sev = {str(v): float(s) for v, s in sev.items()}
            default = t.get("default_severity")
            out.append(SeveritySpec(str(t["field"]), sev, severity_k_min(k, sev),
                                    float(default) if default is not None else max(sev.values()), t.get("cap"),
                                    int(t.get("l_floor", 1)), bool(t.get("diversity", True))))
        else:
            raise ValueError(f"{at}.kind: the audit cannot check {kind!r}")
    return out


@dataclass
class AuditConfig:
    """What the audit needs from a stream config, nothing more."""

    k: int
    privacy_unit: str
    identifier_fields: list[str] = field(default_factory=list)
    quasi_identifiers: list[Any] = field(default_factory=list)  # QISpec or (name, field, kind, hierarchy)
    sensitive_fields: list[str] = field(default_factory=list)
    stream: str | None = None
    event_time: str = "event_time"
    m: int | None = None                 # [anonymization] m: the m-invariance check runs when set
    invariant: str | None = None         # [sensitive] invariant
    input_topic: str | None = None       # [stream] input_topic: the raw topic the audit reads from a broker
    criteria: list = field(default_factory=list)   # LDiversitySpec / SeveritySpec of [[anonymization.criteria]]
    dp: DPBudget | None = None           # [dp] and [[aggregates]]: the DP check's budget
    dp_values: DPValues | None = None    # [dp] and [[aggregates]] as the recomputation of every DP value reads them
    max_suppression_ratio: float = 0.05  # [anonymization]: a run suppressing more is NOT PASSED
    risk: RiskSettings = field(default_factory=RiskSettings)   # [risk]: population and threshold of the figures
    source: str | None = None            # the file it was read from (names it in the report)
    drop: list[str] = field(default_factory=list)           # [identifiers] drop, as given (settings in force)
    pseudonymize: list[str] = field(default_factory=list)   # [identifiers] pseudonymize, as given
    input_digest: str | None = None      # how the raw messages are read (stream_anon.inputs.input_digest)

    def __post_init__(self) -> None:
        self.quasi_identifiers = [q if isinstance(q, QISpec) else QISpec(*q) for q in self.quasi_identifiers]
        if self.privacy_unit not in self.identifier_fields:
            self.identifier_fields = [self.privacy_unit, *self.identifier_fields]

    def with_k(self, k: int) -> "AuditConfig":
        """This config with another k in force; a severity rule's k_min follows it."""
        if k == self.k:
            return self
        criteria = [dataclasses.replace(c, k_min=severity_k_min(k, c.severity)) if isinstance(c, SeveritySpec)
                    else c for c in self.criteria]
        return dataclasses.replace(self, k=k, criteria=criteria)

    def m_invariance(self, m: int | None = None, source: Any = "the config") -> MInvarianceConfig:
        """The m-invariance settings of this stream (``m`` overrides the config's)."""
        m = m if m is not None else self.m
        if m is None:
            raise ValueError(f"anonymization.m: missing in {source}")
        if not self.invariant:
            raise ValueError(f"sensitive.invariant: missing in {source}")
        return MInvarianceConfig(m=int(m), privacy_unit=self.privacy_unit, invariant=self.invariant,
                                 stream=self.stream)

    @classmethod
    def from_toml(cls, path: str | Path, allow_outside_paths: bool = False) -> "AuditConfig":
        """The stream config at ``path``; the hierarchy files it names must lie in its directory tree unless
        ``allow_outside_paths`` (the rule of the worker: stream_anon.validation.ConfigDir)."""
        path = Path(path)
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
        files = config_dir(path.parent, allow_outside_paths)
        stream, anon = raw.get("stream", {}), raw.get("anonymization", {})
        ids, sensitive = raw.get("identifiers", {}), raw.get("sensitive", {})
        qis = []
        for q in raw.get("quasi_identifiers", []):
            hier = None
            if q.get("hierarchy") and q.get("kind") != "geopoint":     # a geopoint's "h3" is no file
                hier = Hierarchy.load(files.file(q["hierarchy"], f"quasi_identifiers.{q.get('name')}.hierarchy"))
            qis.append(QISpec(q["name"], q["field"], q["kind"], hier, q.get("lower"), q.get("upper"),
                              numeric_granularity(q)))
        identifiers = list(dict.fromkeys([*ids.get("drop", []), *ids.get("pseudonymize", [])]))
        return cls(
            k=int(anon["k"]),
            privacy_unit=stream["privacy_unit"],
            identifier_fields=identifiers,
            quasi_identifiers=qis,
            sensitive_fields=list(sensitive.get("fields", [])),
            stream=stream.get("name"),
            event_time=stream.get("event_time", "event_time"),
            m=int(anon["m"]) if anon.get("m") is not None else None,
            invariant=sensitive.get("invariant"),
            input_topic=stream.get("input_topic"),
            criteria=_criteria(anon.get("criteria"), int(anon["k"])),
            dp=read_dp(raw),
            dp_values=read_dp_values(raw, files),
            max_suppression_ratio=float(anon.get("max_suppression_ratio", 0.05)),
            risk=read_risk(raw.get("risk") or {}),
            source=str(path),
            drop=list(ids.get("drop", [])),
            pseudonymize=list(ids.get("pseudonymize", [])),
            input_digest=input_digest(parse_input(raw.get("input"), event_time=stream.get("event_time", "event_time"),
                                                  event_types=tuple(stream.get("event_types", ())), base_dir=files),
                                      stream.get("event_time", "event_time")),
        )


def read_risk(table: dict) -> RiskSettings:
    """The audit's reading of ``[risk]`` (population or sampling fraction, threshold)."""
    population, fraction = table.get("population"), table.get("sampling_fraction")
    return RiskSettings(population=int(population) if population is not None else None,
                        sampling_fraction=float(fraction) if fraction is not None else None,
                        threshold=float(table.get("threshold", DEFAULT_THRESHOLD)))
