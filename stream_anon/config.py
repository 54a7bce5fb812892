"""Stream configuration: one TOML file per stream (every key: docs/configuration.md).

Every privacy parameter is validated once, here, with an error that names the key, through
:mod:`stream_anon.validation`: one reader per table, each refusing keys it does not know. Domain bounds and
hierarchies come from the file (or from the calibration command that writes it) and never from the stream:
a scale that drifted with the data would make information loss incomparable across releases.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_anon.connection import SETTINGS as KAFKA_KEYS
from stream_anon.contract import config_dir
from stream_anon.criteria import parse_criteria
from stream_anon.criteria.parse import KEYS as CRITERIA_KEYS
from stream_anon.domains import DOMAIN_KEYS, SensitiveDomain, flat_domains, parse_domain
from stream_anon.errors import ConfigError
from stream_anon.formers.minvariant import MInvariantParams
from stream_anon.hierarchy import Hierarchy
from stream_anon.inputs import InputSpec, parse_input
from stream_anon.inputs.mapping import FIELD_KEYS, INPUT_KEYS
from stream_anon.risk import DEFAULT_THRESHOLD, RiskSettings
from stream_anon.strategies import STRATEGIES
from stream_anon.validation import MAX_COUNT, MAX_SECONDS, ConfigDir, Table, check_fields, check_file, \
    check_integer, check_number, named_tables

if TYPE_CHECKING:       # the annotation only: stream_anon.dp pulls in diffprivlib, loaded for streams with [dp]
    from stream_anon.dp.specs import DPConfig

STREAM_KINDS = ("fare", "vehicle")
QI_KINDS = ("numeric", "timestamp", "categorical", "station", "geopoint")
REUSE_POLICIES = ("deadline", "immediate", "never")
LATE_POLICIES = ("suppress", "next_release")
H3_RESOLUTIONS = (0, 15)             # the resolutions H3 defines
MAX_PARTITIONS = 1024                # one engine and one checkpoint per partition
MAX_SEED = 2 ** 63 - 1               # the largest TOML integer
MAX_WEIGHT = 1e6                     # a QI's NCP weight (relative to the others)
MAX_EVENT_BYTES = 16 * 2 ** 20

# Every table of a stream configuration and the keys it may hold (docs/configuration.md lists the same keys;
# tests/cli/test_config_reference.py compares them; table_keys() lists all). The others are declared beside their
# readers: [dp] and [[aggregates]] in stream_anon.dp.specs, [input] in stream_anon.inputs.mapping, the sensitive
# domains in stream_anon.domains, [kafka] in stream_anon.connection.
TOP_LEVEL_KEYS = ("stream", "anonymization", "quasi_identifiers", "sensitive", "identifiers", "limits", "dp",
                  "aggregates", "input", "kafka", "risk", "report")
STREAM_KEYS = ("name", "kind", "input_topic", "privacy_unit", "event_time", "event_types", "allowed_lateness_s",
               "late_policy", "max_future_s", "partitions", "input_retention_s")
ANONYMIZATION_KEYS = ("k", "window_s", "max_delay_s", "strategy", "strategy_params", "seed", "reuse",
                      "reuse_max_classes", "reuse_horizon_s", "max_class_ncp", "max_suppression_ratio",
                      "time_granularity_s", "m", "m_horizon_s", "m_params", "criteria")
QI_KEYS = ("name", "field", "kind", "lower", "upper", "weight", "hierarchy", "grid_deg", "resolutions",
           "granularity")
SENSITIVE_KEYS = ("fields", "invariant", "domains")
IDENTIFIER_KEYS = ("drop", "pseudonymize")
LIMIT_KEYS = ("max_event_bytes", "duplicate_horizon_s")
RISK_KEYS = ("population", "sampling_fraction", "threshold", "per_release")
REPORT_KEYS = ("purpose", "controller", "recipients", "retention")
MAX_POPULATION = 10 ** 10            # [risk] population: more individuals than the world holds is a typo


@dataclass(frozen=True)
class QuasiIdentifier:
    name: str
    fields: tuple[str, ...]          # dotted paths; for non-geopoint kinds the first non-null wins
    kind: str
    lower: tuple[float, ...] = ()    # numeric/timestamp: (L,), geopoint: (lat_L, lon_L)
    upper: tuple[float, ...] = ()
    weight: float = 1.0
    hierarchy: Hierarchy | None = None
    grid: float | None = None        # geopoint: boxes widen to this grid (degrees)
    h3: tuple[int, int] | None = None  # geopoint with hierarchy = "h3": (min, max) resolution of published cells
    granularity: float | None = None   # numeric: published bounds snapped outward to this grid

    @property
    def dims(self) -> int:
        return 2 if self.kind == "geopoint" else 1


@dataclass(frozen=True)
class StreamSection:
    name: str
    kind: str
    input_topic: str
    privacy_unit: str
    event_time: str
    event_types: tuple[str, ...]
    allowed_lateness_s: float = 0.0  # watermark = largest event time seen - allowed_lateness_s
    late_policy: str = "next_release"  # an event for an already released window: "next_release" or "suppress"
    # An event more than this beyond the largest event time accepted is dead-lettered as future_event_time (one
    # far-future but valid time would otherwise make every later event late). None: no limit.
    max_future_s: float | None = None
    # Partitions of the input topic: classes form within a partition (one engine each), so more partitions mean
    # more parallel workers and fewer individuals per class candidate set (more loss and suppression on sparse
    # data; docs/operations.md, Partitions). None: not declared (stream_anon.kafka.topics.input_partitions decides).
    partitions: int | None = None
    # The longest the raw input topic may keep data (seconds): ``topics apply`` sets the topic's retention.ms to it
    # and the worker alerts at start when the topic keeps data longer. None: not declared.
    input_retention_s: float | None = None


@dataclass(frozen=True)
class RiskConfig:
    """[risk]: the population the releases are drawn from and the risk threshold (:class:`RiskSettings`), and
    whether the worker puts the figures of every release on its release metric."""
    settings: RiskSettings = field(default_factory=RiskSettings)
    per_release: bool = True


@dataclass(frozen=True)
class ReportSection:
    """[report]: what the DPO summary of ``stream-anon report`` states beside the figures (free text)."""
    purpose: str | None = None
    controller: str | None = None
    recipients: tuple[str, ...] = ()
    retention: str | None = None


@dataclass(frozen=True)
class Anonymization:
    k: int
    window_s: float
    max_delay_s: float
    strategy: str = "mondrian"
    strategy_params: dict = field(default_factory=dict)
    seed: int = 0
    reuse: str = "deadline"
    reuse_max_classes: int = 2000
    reuse_horizon_s: float = 7200.0
    max_class_ncp: float = 1.0
    max_suppression_ratio: float = 0.05
    m: int | None = None                   # m-invariance (stream_anon.formers.minvariant); None: off
    m_horizon_s: float | None = None       # a signature binds its individual this long after its last release
                                           # (event time); default M_HORIZON_S when m is set
    m_params: dict = field(default_factory=dict)   # tuning of the m-invariant class former (MInvariantParams)
    time_granularity_s: float = 60.0       # published time bounds are snapped outward to this grid (> 0)
    criteria: tuple = ()                   # [[anonymization.criteria]] beyond k (stream_anon.criteria)


M_HORIZON_S = 7 * 86400.0          # default anonymization.m_horizon_s (docs/contracts.md, m-invariance)
DUPLICATE_HORIZON_S = 86400.0       # default limits.duplicate_horizon_s


@dataclass(frozen=True)
class Limits:
    max_event_bytes: int = 65536
    duplicate_horizon_s: float = DUPLICATE_HORIZON_S    # event ids seen again within this -> duplicate_event


@dataclass(frozen=True)
class StreamConfig:
    stream: StreamSection
    anonymization: Anonymization
    quasi_identifiers: tuple[QuasiIdentifier, ...]
    sensitive: tuple[str, ...]
    invariant_sensitive: str | None
    drop: tuple[str, ...]            # identifier fields removed from dead-letter payloads
    pseudonymize: tuple[str, ...]    # identifier fields replaced by their keyed pseudonym in dead-letter payloads
    limits: Limits
    source: Path | None = None
    raw: dict = field(default_factory=dict, repr=False)
    dp: "DPConfig | None" = None            # the [dp] / [[aggregates]] tables, when the stream has any
    domains: tuple[SensitiveDomain, ...] = ()   # aligned with ``sensitive`` (undeclared: the ``scalar`` domain)
    input: InputSpec = field(default_factory=InputSpec)   # the [input] mapping (stream_anon.inputs)
    risk: RiskConfig = field(default_factory=RiskConfig)   # the [risk] table (stream_anon.risk)
    report: ReportSection = field(default_factory=ReportSection)   # the [report] table
    allow_outside_paths: bool = False     # its files may lie outside its directory tree (--allow-outside-paths)

    @property
    def identifiers(self) -> tuple[str, ...]:
        """Every field that identifies a person or device: never output."""
        return tuple(dict.fromkeys((self.stream.privacy_unit, *self.drop, *self.pseudonymize)))

    def replace_anonymization(self, **changes) -> "StreamConfig":
        """A copy with some anonymization parameters changed (e.g. k from the command line; None removes a key),
        re-validated."""
        raw = {**self.raw, "anonymization": {**self.raw.get("anonymization", {}), **changes}}
        return parse_config(raw, base_dir=self.source.parent if self.source else Path("."), source=self.source,
                            allow_outside_paths=self.allow_outside_paths)


# -- one reader per table ----------------------------------------------------------------------------------
def parse_config(raw: dict, base_dir: Path = Path("."), source: Path | None = None,
                 allow_outside_paths: bool = False) -> StreamConfig:
    """Validate a parsed TOML document into a StreamConfig (errors name the key). The files it names resolve
    against ``base_dir`` (the config file's directory) and must lie in its tree unless ``allow_outside_paths``
    (:class:`~stream_anon.validation.ConfigDir`).

    A configuration that loads never fails later for a configuration reason: parameters, cross-references
    (a strategy's sensitive field, QI names) and hierarchies are all checked here, and a key that no reader
    knows is refused, never ignored.

    >>> parse_config({"stream": {}})
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: stream.name: missing
    >>> parse_config({"anonymisation": {}})
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: anonymisation: unknown table; did you mean anonymization?
    """
    files = config_dir(base_dir, allow_outside_paths)
    top = Table(raw, "", TOP_LEVEL_KEYS, noun="table")
    stream = _parse_stream(top.table("stream", STREAM_KEYS))
    anonymization, strategy_params, criteria = _parse_anonymization(top.table("anonymization", ANONYMIZATION_KEYS),
                                                                    files)
    qis = _parse_quasi_identifiers(top.get("quasi_identifiers", []), files)
    sensitive, invariant, domains = _parse_sensitive(top.table("sensitive", SENSITIVE_KEYS, {}), anonymization)
    # the criteria name sensitive fields: read with the [anonymization] table, checked once those are known
    anonymization = dataclasses.replace(anonymization, criteria=parse_criteria(
        criteria, k=anonymization.k, sensitive=tuple(sensitive), m=anonymization.m))
    drop, pseudo = _parse_identifiers(top.table("identifiers", IDENTIFIER_KEYS, {}), stream, qis, sensitive,
                                      invariant)
    try:
        strategy_params.check_config(tuple(sensitive), tuple(q.name for q in qis))
    except ValueError as exc:
        raise ConfigError(_keyed("anonymization.strategy_params", exc)) from None
    limits = _parse_limits(top.table("limits", LIMIT_KEYS, {}))
    dp = None
    if (top.get("dp", None), top.get("aggregates", None)) != (None, None):
        # imported only for streams with aggregates: stream_anon.dp pulls in diffprivlib and scikit-learn
        from stream_anon.dp.specs import parse_dp_config
        dp = parse_dp_config(raw, files, need_start=True)
    spec = _parse_input(top.get("input", None), stream, qis, sensitive, dp, files)
    # the connection settings: unknown ones refused here; the values, merged with the environment and the command
    # line, are checked by stream_anon.connection.resolve when a command starts
    top.table("kafka", KAFKA_KEYS, {})
    risk = _parse_risk(top.table("risk", RISK_KEYS, {}))
    report = _parse_report(top.table("report", REPORT_KEYS, {}))
    top.done()
    return StreamConfig(stream, anonymization, qis, sensitive, invariant, drop, pseudo, limits, source, raw, dp,
                        domains, input=spec, risk=risk, report=report, allow_outside_paths=files.allow_outside)


def _parse_stream(t: Table) -> StreamSection:
    """[stream]: the stream's name and input, and its event time: watermark, lateness, future limit."""
    name, kind = t.name(), t.choice("kind", STREAM_KINDS)
    event_types = t.strings("event_types", min_items=1)
    lateness = t.number("allowed_lateness_s", 0.0, at_least=0, at_most=MAX_SECONDS)
    future = t.number("max_future_s", None, above=0, at_most=MAX_SECONDS)
    if future is not None and future < lateness:
        raise ConfigError(f"stream.max_future_s: must be at least stream.allowed_lateness_s ({lateness!r}), got "
                          f"{future!r}: events up to the allowed lateness apart are expected in any order")
    section = StreamSection(name=name, kind=kind, input_topic=t.text("input_topic"),
                            privacy_unit=t.text("privacy_unit"), event_time=t.text("event_time"),
                            event_types=event_types, allowed_lateness_s=lateness,
                            late_policy=t.choice("late_policy", LATE_POLICIES, "next_release"),
                            max_future_s=future, partitions=t.integer("partitions", 1, MAX_PARTITIONS, None),
                            input_retention_s=t.number("input_retention_s", None, above=0, at_most=MAX_SECONDS))
    t.done()
    return section


def _parse_anonymization(t: Table, base_dir: ConfigDir) -> tuple[Anonymization, Any, list | None]:
    """[anonymization]: k, windows and deadlines, the strategy and its parameters, reuse, m-invariance; and the
    ``[[anonymization.criteria]]`` tables as given (:func:`stream_anon.criteria.parse_criteria` reads them)."""
    k = t.integer("k", 2, MAX_COUNT)
    window_s = t.number("window_s", above=0, at_most=MAX_SECONDS)
    max_delay_s = t.number("max_delay_s", above=0, at_most=MAX_SECONDS)
    if max_delay_s < window_s:
        raise ConfigError(f"anonymization.max_delay_s: must be >= window_s ({window_s}), got {max_delay_s}")
    strategy = t.choice("strategy", tuple(STRATEGIES), "mondrian")
    params = _graph_files(t.mapping("strategy_params", {}), base_dir)
    strategy_params = _make_params(STRATEGIES[strategy].Params, params, "anonymization.strategy_params")
    reuse = t.choice("reuse", REUSE_POLICIES, "deadline")
    anonymization = Anonymization(
        k=k, window_s=window_s, max_delay_s=max_delay_s, strategy=strategy, strategy_params=dict(params),
        seed=t.integer("seed", 0, MAX_SEED, 0), reuse=reuse,
        reuse_max_classes=t.integer("reuse_max_classes", 1, MAX_COUNT, 2000),
        reuse_horizon_s=t.number("reuse_horizon_s", 7200.0, above=0, at_most=MAX_SECONDS),
        max_class_ncp=t.number("max_class_ncp", 1.0, above=0, at_most=1),
        max_suppression_ratio=t.number("max_suppression_ratio", 0.05, at_least=0, at_most=1),
        time_granularity_s=t.number("time_granularity_s", 60.0, above=0, at_most=MAX_SECONDS),
        **_parse_m(t, window_s, strategy, reuse),
    )
    criteria = t.get("criteria", None)
    t.done()
    return anonymization, strategy_params, criteria


def _parse_m(t: Table, window_s: float, strategy: str, reuse: str) -> dict:
    """``m``, ``m_horizon_s`` and ``m_params`` of the [anonymization] table (m-invariance)."""
    m = t.integer("m", 2, MAX_COUNT, None)
    if m is None:
        for key in ("m_horizon_s", "m_params"):
            if t.get(key, None) is not None:
                raise ConfigError(f"anonymization.{key}: only meaningful with anonymization.m")
        return {}
    if reuse == "immediate":
        raise ConfigError("anonymization.reuse: 'immediate' is not supported with anonymization.m (a reused class "
                          "must be completed to its signature with counterfeits; use 'deadline' or 'never')")
    if strategy != "mondrian":
        raise ConfigError(f"anonymization.strategy: with anonymization.m classes are formed by the signature-aware "
                          f"Mondrian of stream_anon.formers.minvariant; {strategy!r} cannot be combined with it")
    horizon = t.number("m_horizon_s", None, above=0, at_most=MAX_SECONDS)
    if horizon is not None and horizon < window_s:
        raise ConfigError(f"anonymization.m_horizon_s: must be at least window_s ({window_s}), got {horizon}")
    params = t.mapping("m_params", {})
    _make_params(MInvariantParams, params, "anonymization.m_params")
    if horizon is None:         # the default bounds memory (docs/configuration.md, m_horizon_s)
        horizon = max(M_HORIZON_S, window_s)
    return {"m": m, "m_horizon_s": horizon, "m_params": dict(params)}


def _graph_files(params: dict, base_dir: ConfigDir) -> dict:
    """``strategy_params.graphs`` (utility-clustering's station graphs, QI name -> CSV file) with each file
    resolved against the config file's directory and checked now, as every other file of a configuration."""
    graphs = params.get("graphs")
    if not isinstance(graphs, dict):
        return params
    return {**params, "graphs": {q: str(check_file(g, f"anonymization.strategy_params.graphs.{q}", base_dir))
                                 if isinstance(g, str) else g for q, g in graphs.items()}}


def _make_params(cls, params: dict, path: str):
    """``cls(**params)`` for a frozen parameter dataclass, every failure a ConfigError naming the key."""
    Table(params, path, [f.name for f in dataclasses.fields(cls)], noun="parameter")   # refuses unknown names
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(_keyed(path, exc)) from None


def _keyed(path: str, exc: Exception) -> str:
    """``path.<param>: reason`` when the message starts with a parameter name, else ``path: message``."""
    msg = str(exc)
    head, sep, _ = msg.partition(":")
    return f"{path}.{msg}" if sep and head.replace("_", "").replace(".", "").replace("-", "").isalnum() \
        else f"{path}: {msg}"


def _parse_quasi_identifiers(value, base_dir: ConfigDir) -> tuple[QuasiIdentifier, ...]:
    """[[quasi_identifiers]]: at least one, names distinct."""
    tables = named_tables(value, "quasi_identifiers", QI_KEYS)
    if not tables:
        raise ConfigError("quasi_identifiers: at least one [[quasi_identifiers]] entry is required")
    return tuple(_parse_qi(t, base_dir) for t in tables)


def _parse_qi(t: Table, base_dir: ConfigDir) -> QuasiIdentifier:
    name, kind, fields = t.name(), t.choice("kind", QI_KINDS), t.fields("field")
    weight = t.number("weight", 1.0, at_least=0, at_most=MAX_WEIGHT)
    if kind in ("categorical", "station"):
        file = t.file("hierarchy", base_dir)
        try:
            hierarchy = (Hierarchy.from_arx_csv(file) if file.suffix == ".csv" else Hierarchy.from_json(file))
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"{t.key('hierarchy')}: {exc}") from None
        if hierarchy.n_leaves < 2:
            raise ConfigError(f"{t.key('hierarchy')}: needs at least two leaves")
        qi = QuasiIdentifier(name, fields, kind, weight=weight, hierarchy=hierarchy)
    elif kind == "geopoint":
        qi = _parse_geopoint(t, name, fields, weight)
    else:
        if len(fields) > 1 and kind == "timestamp":
            raise ConfigError(f"{t.key('field')}: a timestamp takes one field")
        for key in ("lower", "upper"):
            if key not in t:
                raise ConfigError(f"{t.key(key)}: missing (domain bounds are fixed by configuration or by "
                                  f"`stream-anon calibrate`, never taken from the stream)")
        read = t.timestamp if kind == "timestamp" else t.number
        lower, upper = read("lower"), read("upper")
        if not lower < upper:
            raise ConfigError(f"{t.key('lower')}: must be below upper ({t.raw['upper']}), got {t.raw['lower']}")
        granularity = None
        if kind == "numeric":
            granularity = t.number("granularity", default_granularity(lower, upper), above=0,
                                   at_most=upper - lower)
        elif "granularity" in t:
            raise ConfigError(f"{t.key('granularity')}: a timestamp's bounds follow "
                              f"anonymization.time_granularity_s")
        qi = QuasiIdentifier(name, fields, kind, (lower,), (upper,), weight, granularity=granularity)
    t.done(f"not a key of a {kind} quasi-identifier")
    return qi


def default_granularity(lower: float, upper: float) -> float:
    """A numeric quasi-identifier's default granularity: the largest power of ten at most 1% of its domain, and at
    least 1 when both bounds are whole numbers (counts, years, readings).

    >>> default_granularity(1931, 1999), default_granularity(0, 200), default_granularity(0, 1_000_000)
    (1, 1, 10000)
    >>> default_granularity(0.0, 1.5)
    0.01
    """
    e = math.floor(math.log10((upper - lower) / 100))
    if float(lower).is_integer() and float(upper).is_integer():
        e = max(e, 0)
    return 10 ** e if e >= 0 else float(f"1e{e}")


def _parse_geopoint(t: Table, name: str, fields: tuple[str, ...], weight: float) -> QuasiIdentifier:
    """A geopoint: [latitude, longitude] bounds, and boxes on a grid or cells along H3."""
    if len(fields) != 2:
        raise ConfigError(f"{t.key('field')}: a geopoint needs exactly two fields [latitude, longitude]")
    bounds = []
    for key in ("lower", "upper"):
        v = t.get(key)
        if not (isinstance(v, list) and len(v) == 2):
            raise ConfigError(f"{t.key(key)}: expected [latitude, longitude], got {v!r}")
        bounds.append((check_number(v[0], f"{t.key(key)}[0]", at_least=-90, at_most=90),
                       check_number(v[1], f"{t.key(key)}[1]", at_least=-180, at_most=180)))
    lower, upper = bounds
    if not (lower[0] < upper[0] and lower[1] < upper[1]):
        raise ConfigError(f"{t.key('lower')}: must be below upper in both latitude and longitude, got {list(lower)} "
                          f"and {list(upper)}")
    grid = t.number("grid_deg", None, above=0, at_most=180)
    return QuasiIdentifier(name, fields, "geopoint", lower, upper, weight, grid=grid, h3=_parse_h3(t, grid))


def _parse_h3(t: Table, grid) -> tuple[int, int] | None:
    """``hierarchy = "h3"`` and ``resolutions = [min, max]`` of a geopoint (positions generalize along the H3
    hexagon hierarchy; docs/contracts.md, "Positions along H3")."""
    hierarchy = t.get("hierarchy", None)
    if hierarchy is None:
        if "resolutions" in t:
            raise ConfigError(f"{t.key('resolutions')}: only meaningful with hierarchy = \"h3\"")
        return None
    if hierarchy != "h3":
        raise ConfigError(f"{t.key('hierarchy')}: a geopoint takes hierarchy = \"h3\" (or none: a lat/lon box), "
                          f"got {hierarchy!r}")
    if grid is not None:
        raise ConfigError(f"{t.key('grid_deg')}: not combinable with hierarchy = \"h3\" (cells are H3 hexagons)")
    res, lo_r, hi_r = t.get("resolutions"), *H3_RESOLUTIONS
    if not (isinstance(res, list) and len(res) == 2):
        raise ConfigError(f"{t.key('resolutions')}: expected [min, max] H3 resolutions (integers {lo_r}-{hi_r}), "
                          f"got {res!r}")
    rmin, rmax = (check_integer(r, f"{t.key('resolutions')}[{i}]", lo_r, hi_r) for i, r in enumerate(res))
    if rmin > rmax:
        raise ConfigError(f"{t.key('resolutions')}: need {lo_r} <= min <= max <= {hi_r}, got {res}")
    try:
        import h3  # noqa: F401  (the dependency is checked when the configuration loads, not at the first close)
    except ImportError:
        raise ConfigError(f"{t.key('hierarchy')}: \"h3\" needs the h3 package (pip install h3)") from None
    return rmin, rmax


def _parse_sensitive(t: Table, anonymization: Anonymization):
    """[sensitive] and [sensitive.domains]: the fields published verbatim, what each may publish, the invariant."""
    given = t.get("fields", [])
    sensitive = check_fields(given, t.key("fields")) if given != [] else ()
    invariant = t.text("invariant", None)
    if anonymization.m is not None:
        if invariant is None:
            raise ConfigError("sensitive.invariant: required when anonymization.m is set (the sensitive attribute "
                              "that must keep one signature per individual across releases)")
        if invariant not in sensitive:
            raise ConfigError(f"sensitive.invariant: {invariant!r} must also be listed in sensitive.fields (its "
                              "values are what each class publishes and what its signature is made of)")
    domains_raw = flat_domains(t.mapping("domains", {}))
    for name in domains_raw:
        if name not in sensitive:
            raise ConfigError(f"sensitive.domains.{name}: not one of sensitive.fields")
    domains = tuple(parse_domain(f, domains_raw[f]) if f in domains_raw else SensitiveDomain(f)
                    for f in sensitive)
    t.done()
    return sensitive, invariant, domains


def _parse_identifiers(t: Table, stream: StreamSection, qis, sensitive, invariant):
    """[identifiers]: fields removed from (drop) or pseudonymized in dead letters; none of them is published."""
    drop, pseudo = t.strings("drop", ()), t.strings("pseudonymize", ())
    t.done()
    identifiers = {stream.privacy_unit, *drop, *pseudo}
    published = {"sensitive.fields": set(sensitive), "quasi_identifiers": {f for q in qis for f in q.fields},
                 "sensitive.invariant": {invariant}}
    for where, fields in published.items():
        bad = identifiers & fields
        if bad:
            raise ConfigError(f"{where}: identifier field(s) {sorted(bad)} would be published; "
                              "identifiers are never output")
    return drop, pseudo


def _parse_limits(t: Table) -> Limits:
    """[limits]: the largest event accepted, how long an event id is remembered to detect duplicates."""
    limits = Limits(max_event_bytes=t.integer("max_event_bytes", 1, MAX_EVENT_BYTES, 65536),
                    duplicate_horizon_s=t.number("duplicate_horizon_s", DUPLICATE_HORIZON_S, at_least=0,
                                                 at_most=MAX_SECONDS))
    t.done()
    return limits


def _parse_risk(t: Table) -> RiskConfig:
    """[risk]: the declared population (individuals, or each release's sampling fraction), the threshold."""
    population = t.integer("population", 1, MAX_POPULATION, None)
    fraction = t.number("sampling_fraction", None, above=0, at_most=1)
    if population is not None and fraction is not None:
        raise ConfigError("risk.sampling_fraction: not with risk.population (one declares the other)")
    settings = RiskSettings(population=population, sampling_fraction=fraction,
                            threshold=t.number("threshold", DEFAULT_THRESHOLD, at_least=0, at_most=1))
    per_release = t.boolean("per_release", True)
    t.done()
    return RiskConfig(settings, per_release)


def _parse_report(t: Table) -> ReportSection:
    """[report]: purpose, controller, recipients and retention as the DPO summary states them."""
    section = ReportSection(purpose=t.text("purpose", None), controller=t.text("controller", None),
                            recipients=t.strings("recipients", ()), retention=t.text("retention", None))
    t.done()
    return section


def table_keys() -> dict[str, tuple[str, ...]]:
    """Every table of a stream configuration -> the keys it accepts, as docs/configuration.md heads them (one
    ``anonymization.strategy_params (<strategy>)`` per strategy)."""
    from stream_anon.dp.specs import AGGREGATE_KEYS, DP_KEYS, GROUP_KEYS
    keys = {"(top level)": TOP_LEVEL_KEYS, "stream": STREAM_KEYS, "anonymization": ANONYMIZATION_KEYS,
            "anonymization.m_params": tuple(f.name for f in dataclasses.fields(MInvariantParams)),
            "quasi_identifiers": QI_KEYS, "sensitive": SENSITIVE_KEYS, "sensitive.domains.FIELD": DOMAIN_KEYS,
            "identifiers": IDENTIFIER_KEYS, "limits": LIMIT_KEYS, "dp": DP_KEYS, "aggregates": AGGREGATE_KEYS,
            "aggregates.group_by": GROUP_KEYS, "input": INPUT_KEYS, "input.fields.FIELD": FIELD_KEYS,
            "kafka": KAFKA_KEYS, "risk": RISK_KEYS, "report": REPORT_KEYS}
    for name, cls in STRATEGIES.items():
        keys[f"anonymization.strategy_params ({name})"] = tuple(f.name for f in dataclasses.fields(cls.Params))
    for kind, names in CRITERIA_KEYS.items():
        keys[f"anonymization.criteria ({kind})"] = names
    return keys


def _parse_input(table, stream: StreamSection, qis, sensitive, dp, base_dir: ConfigDir) -> InputSpec:
    """The [input] table (stream_anon.inputs.mapping): every field the stream reads must be mapped, nothing else."""
    required = {stream.privacy_unit: "privacy unit", stream.event_time: "event time"}
    for q in qis:
        for f in q.fields:
            required.setdefault(f, f"quasi-identifier {q.name} field")
    for f in sensitive:
        required.setdefault(f, "sensitive field")
    if dp is not None:     # what stream_anon.worker.aggregates.needed_fields carries to the closed windows
        fields = [dp.privacy_unit]
        for s in dp.aggregates:
            fields += [f for g in s.group_by for f in g.fields] + ([s.value_field] if s.value_field else []) \
                + [k for k, _ in s.where]
        for f in fields:
            required.setdefault(f, "aggregate field")
    spec = parse_input(table, event_time=stream.event_time, event_types=stream.event_types, required=required,
                       base_dir=base_dir)
    if spec.event_type is not None and spec.event_type not in stream.event_types:
        raise ConfigError(f"input.event_type: {spec.event_type!r} is not one of stream.event_types "
                          f"{list(stream.event_types)}")
    return spec


def config_files(raw: dict) -> list[tuple[dict, str]]:
    """Every file a config document names, as (the table holding it, its key): hierarchies of quasi-identifiers
    and aggregate groups, CSV lookup tables of ``[input]`` fields, utility-clustering's station graphs."""
    out = []
    tables = raw.get("quasi_identifiers", []) + [g for a in raw.get("aggregates", []) for g in a.get("group_by", [])]
    for table in tables:
        if isinstance(table, dict) and isinstance(table.get("hierarchy"), str) and table["hierarchy"] != "h3":
            out.append((table, "hierarchy"))          # "h3" names no file
    graphs = (raw.get("anonymization") or {}).get("strategy_params", {}).get("graphs")
    for q, g in (graphs.items() if isinstance(graphs, dict) else ()):
        if isinstance(g, str):
            out.append((graphs, q))
    for spec in ((raw.get("input") or {}).get("fields") or {}).values():
        if isinstance(spec, dict) and isinstance(spec.get("lookup"), str):
            out.append((spec, "lookup"))
    return out


def with_files_beside(raw: dict, base_dir: Path, out_dir: Path) -> dict:
    """The config document read from ``base_dir``, made to be written into ``out_dir`` (a calibrated config, the
    demo's derived configs) naming the same files within its own directory tree: a file inside ``out_dir``'s tree
    by its path relative to ``out_dir``, any other copied into ``out_dir/files/`` (prefixed with its digest when
    another file of that name is there). Changes ``raw`` in place."""
    out_dir = Path(out_dir).resolve()
    for table, key in config_files(raw):
        src = (Path(base_dir) / table[key]).resolve()
        if src.is_relative_to(out_dir) or not src.is_file():   # a missing file is reported when the copy loads
            table[key] = src.relative_to(out_dir).as_posix() if src.is_relative_to(out_dir) else str(src)
            continue
        dest = out_dir / "files" / src.name
        if dest.exists() and dest.read_bytes() != src.read_bytes():
            dest = dest.with_name(f"{hashlib.sha256(src.read_bytes()).hexdigest()[:12]}-{src.name}")
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        table[key] = dest.relative_to(out_dir).as_posix()
    return raw


def load_config(path: str | Path, allow_outside_paths: bool = False) -> StreamConfig:
    """Load and validate a stream configuration file (``allow_outside_paths``: the files it names may lie outside
    its directory tree)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    return parse_config(raw, base_dir=path.parent, source=path.resolve(), allow_outside_paths=allow_outside_paths)
