"""Stream configuration: one TOML file per stream (docs/contracts.md section 2).

Every privacy parameter is validated once, here, with an error that names the key. Domain bounds and
hierarchies come from the file (or from the calibration command that writes it) and never from the stream:
a scale that drifted with the data would make information loss incomparable across releases.
"""
from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from stream_anon.criteria import parse_criteria
from stream_anon.errors import ConfigError
from stream_anon.formers.minvariant import MInvariantParams
from stream_anon.hierarchy import Hierarchy
from stream_anon.inputs import InputConfigError, InputSpec, parse_input
from stream_anon.strategies import STRATEGIES

QI_KINDS = ("numeric", "timestamp", "categorical", "station", "geopoint")
REUSE_POLICIES = ("deadline", "immediate", "never")
LATE_POLICIES = ("suppress", "next_release")
H3_RESOLUTIONS = (0, 15)             # the resolutions H3 defines
_NAME_RE = re.compile(r"^[a-z0-9_-]+$")


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
    # data; README "Partitions"). None: not declared (stream_anon.kafka.topics.input_partitions decides).
    partitions: int | None = None


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
    m: int | None = None                   # m-invariance (stream_anon.engine.minvariance); None: off
    m_horizon_s: float | None = None       # a signature binds its individual this long after its last release
                                           # (event time); default M_HORIZON_S when m is set
    m_params: dict = field(default_factory=dict)   # tuning of the m-invariant class former (MInvariantParams)
    time_granularity_s: float = 60.0       # published time bounds are snapped outward to this grid (> 0)
    criteria: tuple = ()                   # [[anonymization.criteria]] beyond k (stream_anon.criteria)


SENSITIVE_TYPES = ("category", "number", "boolean", "text")
DEFAULT_TEXT_CHARSET = r"A-Za-z0-9 .,:/()&+#%_-"   # no quotes, < > ; \\ = or control characters
DEFAULT_TEXT_MAX_LENGTH = 64
_MAX_SAFE_NUMBER = 2.0 ** 53          # undeclared numbers: beyond this a float no longer holds every integer


@dataclass(frozen=True)
class SensitiveDomain:
    """The values a sensitive field may publish (``[sensitive.domains]``; docs/contracts.md section 2).

    ``type``: ``category`` (``values``; a value outside goes to the dead letters, or is published as ``other``
    when one is declared), ``number`` (``lower``..``upper``, ``integer``), ``boolean``, ``text`` (at most
    ``max_length`` characters of the ``charset`` character class), or ``scalar``: the default of a field without
    a declared domain (null, a boolean, a number of magnitude <= 2**53, or text as ``text`` with the defaults).
    Null is always allowed (a missing value is published as null).

    >>> d = SensitiveDomain("p", "category", values=("payg", "travelcard"), other="other")
    >>> d.check("payg"), d.check("<script>"), d.check(["payg"])[1]
    (('payg', None), ('other', None), 'p: a list is not a category value')
    >>> SensitiveDomain("t", "text", max_length=8).check("<b>")[1]
    "t: text '<b>' has characters outside [A-Za-z0-9 .,:/()&+#%_-]"
    """
    field: str
    type: str = "scalar"
    values: tuple[str, ...] = ()
    other: str | None = None
    lower: float | None = None
    upper: float | None = None
    integer: bool = False
    max_length: int = DEFAULT_TEXT_MAX_LENGTH
    charset: str = DEFAULT_TEXT_CHARSET

    def __post_init__(self) -> None:
        object.__setattr__(self, "_values", frozenset(self.values))
        object.__setattr__(self, "_text", re.compile(f"[{self.charset}]*"))

    def check(self, v) -> tuple[object, str | None]:
        """(the value to publish, None) or (None, the reason the event is rejected)."""
        if v is None:
            return None, None
        t = self.type
        if t == "category":
            if not isinstance(v, str):
                return None, f"{self.field}: a {_kind(v)} is not a category value"
            if v in self._values:
                return v, None
            if self.other is not None:
                return self.other, None
            return None, f"{self.field}: value {_shown(v)} is not in its declared categories"
        if t == "boolean":
            return (v, None) if isinstance(v, bool) else (None, f"{self.field}: a {_kind(v)} is not a boolean")
        if t == "number" or (t == "scalar" and isinstance(v, (int, float)) and not isinstance(v, bool)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return None, f"{self.field}: a {_kind(v)} is not a number"
            if not math.isfinite(v):
                return None, f"{self.field}: number is not finite"
            lo, hi = (self.lower, self.upper) if t == "number" else (-_MAX_SAFE_NUMBER, _MAX_SAFE_NUMBER)
            if not lo <= v <= hi:
                return None, f"{self.field}: number {_shown(v)} outside its domain [{lo:g}, {hi:g}]"
            if self.integer and float(v) != int(v):
                return None, f"{self.field}: number {_shown(v)} is not an integer"
            return v, None
        if t == "scalar" and isinstance(v, bool):
            return v, None
        if not isinstance(v, str):
            return None, f"{self.field}: a {_kind(v)} is not text"
        if len(v) > self.max_length:
            return None, f"{self.field}: text of {len(v)} characters, more than {self.max_length}"
        if not self._text.fullmatch(v):
            return None, f"{self.field}: text {_shown(v)} has characters outside [{self.charset}]"
        return v, None


def _kind(v) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(type(v), type(v).__name__)


def _shown(v, limit: int = 40) -> str:
    """A value for a reason: repr (escapes control characters and lone surrogates), cut to ``limit``."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "...'"


def _flat_domains(table: dict, prefix: str = "") -> dict:
    """Domains by dotted field path: ``"a.b" = {...}`` and the nested form TOML makes of an unquoted dotted key
    (``a.b = {...}``, ``[sensitive.domains.a] b = {...}``) are the same."""
    out = {}
    for key, value in table.items():
        if isinstance(value, dict) and "type" not in value and value:
            out.update(_flat_domains(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _parse_domain(name: str, table) -> SensitiveDomain:
    path = f"sensitive.domains.{name}"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: expected a table {{ type = ... }}")
    t = _get(table, "type", path, str)
    if t not in SENSITIVE_TYPES:
        raise ConfigError(f"{path}.type: must be one of {', '.join(SENSITIVE_TYPES)}, got {t!r}")
    known = {"category": {"type", "values", "other"}, "number": {"type", "lower", "upper", "integer"},
             "boolean": {"type"}, "text": {"type", "max_length", "charset"}}[t]
    for key in table:
        if key not in known:
            raise ConfigError(f"{path}.{key}: not a key of a {t} domain (known: {', '.join(sorted(known))})")
    if t == "category":
        values = _get(table, "values", path, list)
        if not values or not all(isinstance(v, str) for v in values):
            raise ConfigError(f"{path}.values: expected a non-empty list of strings")
        other = _get(table, "other", path, str, required=False, default=None)
        if other is not None and other not in values:
            raise ConfigError(f"{path}.other: {other!r} must be one of the declared values")
        return SensitiveDomain(name, t, values=tuple(values), other=other)
    if t == "number":
        lower = float(_get(table, "lower", path, (int, float)))
        upper = float(_get(table, "upper", path, (int, float)))
        if not (math.isfinite(lower) and math.isfinite(upper) and lower <= upper):
            raise ConfigError(f"{path}: lower ({lower}) must be finite and not above upper ({upper})")
        return SensitiveDomain(name, t, lower=lower, upper=upper,
                               integer=_get(table, "integer", path, bool, required=False, default=False))
    if t == "text":
        max_length = _get(table, "max_length", path, int, required=False, default=DEFAULT_TEXT_MAX_LENGTH)
        _positive(max_length, f"{path}.max_length", integer=True)
        charset = _get(table, "charset", path, str, required=False, default=DEFAULT_TEXT_CHARSET)
        try:
            re.compile(f"[{charset}]*")
        except re.error as exc:
            raise ConfigError(f"{path}.charset: not a regular-expression character class: {exc}") from None
        return SensitiveDomain(name, t, max_length=max_length, charset=charset)
    return SensitiveDomain(name, t)


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

    @property
    def identifiers(self) -> tuple[str, ...]:
        """Every field that identifies a person or device: never output."""
        return tuple(dict.fromkeys((self.stream.privacy_unit, *self.drop, *self.pseudonymize)))

    def replace_anonymization(self, **changes) -> "StreamConfig":
        """A copy with some anonymization parameters changed (e.g. k from the command line), re-validated."""
        raw = {**self.raw, "anonymization": {**self.raw.get("anonymization", {}), **changes}}
        return parse_config(raw, base_dir=self.source.parent if self.source else Path("."), source=self.source)


# -- helpers ------------------------------------------------------------------------------------------------
def _get(table: dict, key: str, path: str, types, required=True, default=None):
    if key not in table:
        if required:
            raise ConfigError(f"{path}.{key}: missing")
        return default
    value = table[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise ConfigError(f"{path}.{key}: expected {_type_names(types)}, got {type(value).__name__} {value!r}")
    return value


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(types))


def _positive(value, path: str, integer=False):
    if value <= 0 or (integer and int(value) != value):
        raise ConfigError(f"{path}: must be a positive {'integer' if integer else 'number'}, got {value!r}")
    return value


def _partitions(s: dict) -> int | None:
    """``[stream] partitions``: a positive integer (at most 1024), or absent.

    >>> _partitions({"partitions": 2}), _partitions({})
    (2, None)
    >>> _partitions({"partitions": 0})
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: stream.partitions: must be a positive integer, got 0
    """
    n = _get(s, "partitions", "stream", int, required=False, default=None)
    if n is None:
        return None
    _positive(n, "stream.partitions", integer=True)
    if n > 1024:
        raise ConfigError(f"stream.partitions: at most 1024 (one engine and checkpoint per partition), got {n}")
    return int(n)


def _time_value(value, path: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigError(f"{path}: timestamp needs a UTC offset, got {value!r}")
        return value.timestamp()
    if isinstance(value, str):
        try:
            ts = datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(f"{path}: not an ISO-8601 timestamp: {value!r}") from None
        if ts.tzinfo is None:
            raise ConfigError(f"{path}: timestamp needs a UTC offset, got {value!r}")
        return ts.timestamp()
    raise ConfigError(f"{path}: expected a timestamp or number, got {type(value).__name__}")


def _fields(value, path: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{path}: expected a field path or a non-empty list of field paths")
    return tuple(value)


def _parse_qi(table: dict, i: int, base_dir: Path) -> QuasiIdentifier:
    path = f"quasi_identifiers[{i}]"
    name = _get(table, "name", path, str)
    if not _NAME_RE.match(name):
        raise ConfigError(f"{path}.name: use lowercase letters, digits, '_' or '-', got {name!r}")
    path = f"quasi_identifiers.{name}"
    kind = _get(table, "kind", path, str)
    if kind not in QI_KINDS:
        raise ConfigError(f"{path}.kind: must be one of {', '.join(QI_KINDS)}, got {kind!r}")
    fields = _fields(table.get("field"), f"{path}.field")
    weight = float(_get(table, "weight", path, (int, float), required=False, default=1.0))
    if weight < 0:
        raise ConfigError(f"{path}.weight: must be >= 0, got {weight}")
    if kind in ("categorical", "station"):
        hpath = _get(table, "hierarchy", path, str)
        file = (base_dir / hpath).resolve()
        if not file.exists():
            raise ConfigError(f"{path}.hierarchy: file not found: {file}")
        try:
            hierarchy = (Hierarchy.from_arx_csv(file) if file.suffix == ".csv" else Hierarchy.from_json(file))
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"{path}.hierarchy: {exc}") from None
        if hierarchy.n_leaves < 2:
            raise ConfigError(f"{path}.hierarchy: needs at least two leaves")
        return QuasiIdentifier(name, fields, kind, weight=weight, hierarchy=hierarchy)
    if kind == "geopoint":
        if len(fields) != 2:
            raise ConfigError(f"{path}.field: a geopoint needs exactly two fields [latitude, longitude]")
        lower, upper = table.get("lower"), table.get("upper")
        for key, v in (("lower", lower), ("upper", upper)):
            if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)):
                raise ConfigError(f"{path}.{key}: expected [latitude, longitude]")
        if not (lower[0] < upper[0] and lower[1] < upper[1]):
            raise ConfigError(f"{path}: lower must be below upper in both latitude and longitude")
        grid = table.get("grid_deg")
        if grid is not None:
            _positive(grid, f"{path}.grid_deg")
        h3 = _parse_h3(table, path, grid)
        return QuasiIdentifier(name, fields, kind, tuple(map(float, lower)), tuple(map(float, upper)), weight,
                               grid=float(grid) if grid is not None else None, h3=h3)
    for key in ("resolutions",):
        if key in table:
            raise ConfigError(f"{path}.{key}: only meaningful for a geopoint with hierarchy = \"h3\"")
    if len(fields) > 1 and kind == "timestamp":
        raise ConfigError(f"{path}.field: a timestamp takes one field")
    conv = _time_value if kind == "timestamp" else (
        lambda v, p: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
        else (_ for _ in ()).throw(ConfigError(f"{p}: expected a number, got {v!r}")))
    for key in ("lower", "upper"):
        if key not in table:
            raise ConfigError(f"{path}.{key}: missing (domain bounds are fixed by configuration or by "
                              f"`stream-anon calibrate`, never taken from the stream)")
    lower, upper = conv(table["lower"], f"{path}.lower"), conv(table["upper"], f"{path}.upper")
    if not lower < upper:
        raise ConfigError(f"{path}: lower ({table['lower']}) must be below upper ({table['upper']})")
    return QuasiIdentifier(name, fields, kind, (lower,), (upper,), weight)


def _parse_h3(table: dict, path: str, grid) -> tuple[int, int] | None:
    """``hierarchy = "h3"`` and ``resolutions = [min, max]`` of a geopoint (positions generalize along the H3
    hexagon hierarchy; docs/contracts.md, "Positions along H3")."""
    hierarchy = table.get("hierarchy")
    if hierarchy is None:
        if "resolutions" in table:
            raise ConfigError(f"{path}.resolutions: only meaningful with hierarchy = \"h3\"")
        return None
    if hierarchy != "h3":
        raise ConfigError(f"{path}.hierarchy: a geopoint takes hierarchy = \"h3\" (or none: a lat/lon box), "
                          f"got {hierarchy!r}")
    if grid is not None:
        raise ConfigError(f"{path}.grid_deg: not combinable with hierarchy = \"h3\" (cells are H3 hexagons)")
    res = table.get("resolutions")
    lo_r, hi_r = H3_RESOLUTIONS
    if not (isinstance(res, list) and len(res) == 2
            and all(isinstance(r, int) and not isinstance(r, bool) for r in res)):
        raise ConfigError(f"{path}.resolutions: expected [min, max] H3 resolutions (integers {lo_r}-{hi_r}), "
                          f"got {res!r}")
    if not lo_r <= res[0] <= res[1] <= hi_r:
        raise ConfigError(f"{path}.resolutions: need {lo_r} <= min <= max <= {hi_r}, got {res}")
    try:
        import h3  # noqa: F401  (the dependency is checked when the configuration loads, not at the first close)
    except ImportError:
        raise ConfigError(f"{path}.hierarchy: \"h3\" needs the h3 package (pip install h3)") from None
    return int(res[0]), int(res[1])


def _parse_lateness(s: dict) -> dict:
    """``allowed_lateness_s``, ``late_policy`` and ``max_future_s`` of the [stream] table (event time, watermarks,
    lateness)."""
    lateness = _get(s, "allowed_lateness_s", "stream", (int, float), required=False, default=0)
    if not math.isfinite(lateness) or lateness < 0:
        raise ConfigError(f"stream.allowed_lateness_s: must be a finite number of seconds >= 0, got {lateness!r}")
    policy = _get(s, "late_policy", "stream", str, required=False, default="next_release")
    if policy not in LATE_POLICIES:
        raise ConfigError(f"stream.late_policy: must be one of {', '.join(LATE_POLICIES)}, got {policy!r}")
    future = _get(s, "max_future_s", "stream", (int, float), required=False, default=None)
    if future is not None and (isinstance(future, bool) or not math.isfinite(future) or future <= 0):
        raise ConfigError(f"stream.max_future_s: must be a finite number of seconds > 0 (omit it for no limit), "
                          f"got {future!r}")
    if future is not None and future < lateness:
        raise ConfigError(f"stream.max_future_s ({future!r}) must be at least stream.allowed_lateness_s "
                          f"({lateness!r}): events up to the allowed lateness apart are expected in any order")
    return {"allowed_lateness_s": float(lateness), "late_policy": policy,
            "max_future_s": None if future is None else float(future)}


def _parse_m(a: dict) -> dict:
    """``m``, ``m_horizon_s`` and ``m_params`` of the [anonymization] table (m-invariance, issue 3)."""
    m = a.get("m")
    if m is None:
        for key in ("m_horizon_s", "m_params"):
            if key in a:
                raise ConfigError(f"anonymization.{key}: only meaningful with anonymization.m")
        return {}
    if not isinstance(m, int) or isinstance(m, bool) or m < 2:
        raise ConfigError(f"anonymization.m: must be an integer >= 2, got {m!r}")
    if a.get("reuse", "deadline") == "immediate":
        raise ConfigError("anonymization.reuse: 'immediate' is not supported with anonymization.m (a reused class "
                          "must be completed to its signature with counterfeits; use 'deadline' or 'never')")
    strategy = a.get("strategy", "mondrian")
    if strategy != "mondrian":
        raise ConfigError(f"anonymization.strategy: with anonymization.m classes are formed by the signature-aware "
                          f"Mondrian of stream_anon.engine.minvariance; {strategy!r} cannot be combined with it")
    horizon = a.get("m_horizon_s")
    if horizon is not None:
        if not isinstance(horizon, (int, float)) or isinstance(horizon, bool):
            raise ConfigError(f"anonymization.m_horizon_s: expected a number of seconds, got {horizon!r}")
        _positive(horizon, "anonymization.m_horizon_s")
        if horizon < a.get("window_s", 0):
            raise ConfigError(f"anonymization.m_horizon_s: must be at least window_s ({a.get('window_s')}), "
                              f"got {horizon}")
    params = _get(a, "m_params", "anonymization", dict, required=False, default={})
    _make_params(MInvariantParams, params, "anonymization.m_params")
    if horizon is None:         # the default bounds memory (docs/contracts.md, m-invariance: Horizon)
        horizon = max(M_HORIZON_S, float(a.get("window_s", 0)))
    return {"m": int(m), "m_horizon_s": float(horizon), "m_params": dict(params)}


def _make_params(cls, params: dict, path: str):
    """``cls(**params)`` for a frozen parameter dataclass, every failure a ConfigError naming the key."""
    known = {f.name for f in dataclasses.fields(cls)}
    for key in params:
        if key not in known:
            raise ConfigError(f"{path}.{key}: unknown parameter (known: {', '.join(sorted(known)) or 'none'})")
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


def parse_config(raw: dict, base_dir: Path = Path("."), source: Path | None = None) -> StreamConfig:
    """Validate a parsed TOML document into a StreamConfig (errors name the key).

    A configuration that loads never fails later for a configuration reason: parameters, cross-references
    (a strategy's sensitive field, QI names) and hierarchies are all checked here.

    >>> parse_config({"stream": {}})
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: stream.name: missing
    """
    s = raw.get("stream")
    if not isinstance(s, dict):
        raise ConfigError("stream: missing table [stream]")
    name = _get(s, "name", "stream", str)
    if not _NAME_RE.match(name):
        raise ConfigError(f"stream.name: use lowercase letters, digits, '_' or '-', got {name!r}")
    kind = _get(s, "kind", "stream", str)
    if kind not in ("fare", "vehicle"):
        raise ConfigError(f"stream.kind: must be 'fare' or 'vehicle', got {kind!r}")
    event_types = _get(s, "event_types", "stream", list)
    if not event_types or not all(isinstance(t, str) for t in event_types):
        raise ConfigError("stream.event_types: expected a non-empty list of strings")
    stream = StreamSection(
        name=name, kind=kind,
        input_topic=_get(s, "input_topic", "stream", str),
        privacy_unit=_get(s, "privacy_unit", "stream", str),
        event_time=_get(s, "event_time", "stream", str),
        event_types=tuple(event_types),
        **_parse_lateness(s),
        partitions=_partitions(s),
    )

    a = raw.get("anonymization")
    if not isinstance(a, dict):
        raise ConfigError("anonymization: missing table [anonymization]")
    k = _positive(_get(a, "k", "anonymization", int), "anonymization.k", integer=True)
    if k < 2:
        raise ConfigError(f"anonymization.k: must be at least 2, got {k}")
    window_s = _positive(float(_get(a, "window_s", "anonymization", (int, float))), "anonymization.window_s")
    max_delay_s = float(_get(a, "max_delay_s", "anonymization", (int, float)))
    if max_delay_s < window_s:
        raise ConfigError(f"anonymization.max_delay_s: must be >= window_s ({window_s}), got {max_delay_s}")
    strategy = _get(a, "strategy", "anonymization", str, required=False, default="mondrian")
    if strategy not in STRATEGIES:
        raise ConfigError(f"anonymization.strategy: unknown {strategy!r}; known: {', '.join(sorted(STRATEGIES))}")
    params = _get(a, "strategy_params", "anonymization", dict, required=False, default={})
    strategy_params = _make_params(STRATEGIES[strategy].Params, params, "anonymization.strategy_params")
    reuse = _get(a, "reuse", "anonymization", str, required=False, default="deadline")
    if reuse not in REUSE_POLICIES:
        raise ConfigError(f"anonymization.reuse: must be one of {', '.join(REUSE_POLICIES)}, got {reuse!r}")
    max_class_ncp = float(_get(a, "max_class_ncp", "anonymization", (int, float), required=False, default=1.0))
    if not 0 < max_class_ncp <= 1:
        raise ConfigError(f"anonymization.max_class_ncp: must be in (0, 1], got {max_class_ncp}")
    max_supp = float(_get(a, "max_suppression_ratio", "anonymization", (int, float), required=False,
                          default=0.05))
    if not 0 <= max_supp <= 1:
        raise ConfigError(f"anonymization.max_suppression_ratio: must be in [0, 1], got {max_supp}")
    anonymization = Anonymization(
        k=int(k), window_s=window_s, max_delay_s=max_delay_s, strategy=strategy, strategy_params=dict(params),
        seed=_get(a, "seed", "anonymization", int, required=False, default=0),
        reuse=reuse,
        reuse_max_classes=int(_positive(_get(a, "reuse_max_classes", "anonymization", int, required=False,
                                             default=2000), "anonymization.reuse_max_classes", integer=True)),
        reuse_horizon_s=float(_positive(_get(a, "reuse_horizon_s", "anonymization", (int, float),
                                             required=False, default=7200.0), "anonymization.reuse_horizon_s")),
        max_class_ncp=max_class_ncp, max_suppression_ratio=max_supp,
        time_granularity_s=float(_positive(_get(a, "time_granularity_s", "anonymization", (int, float),
                                                required=False, default=60.0), "anonymization.time_granularity_s")),
        **_parse_m(a),
    )

    qis_raw = raw.get("quasi_identifiers")
    if not isinstance(qis_raw, list) or not qis_raw:
        raise ConfigError("quasi_identifiers: at least one [[quasi_identifiers]] entry is required")
    qis = tuple(_parse_qi(t, i, base_dir) for i, t in enumerate(qis_raw))
    names = [q.name for q in qis]
    if len(set(names)) != len(names):
        raise ConfigError(f"quasi_identifiers: duplicate names {sorted({n for n in names if names.count(n) > 1})}")

    sens = raw.get("sensitive", {})
    sensitive = _fields(sens["fields"], "sensitive.fields") if sens.get("fields") else ()
    invariant = _get(sens, "invariant", "sensitive", str, required=False, default=None)
    if invariant is not None and not invariant:
        raise ConfigError("sensitive.invariant: must be a non-empty field path")
    if anonymization.m is not None:
        if invariant is None:
            raise ConfigError("sensitive.invariant: required when anonymization.m is set (the sensitive attribute "
                              "that must keep one signature per individual across releases)")
        if invariant not in sensitive:
            raise ConfigError(f"sensitive.invariant: {invariant!r} must also be listed in sensitive.fields (its "
                              "values are what each class publishes and what its signature is made of)")
    anonymization = dataclasses.replace(anonymization, criteria=parse_criteria(
        a.get("criteria"), k=anonymization.k, sensitive=tuple(sensitive), m=anonymization.m))
    domains_raw = _flat_domains(_get(sens, "domains", "sensitive", dict, required=False, default={}))
    for name in domains_raw:
        if name not in sensitive:
            raise ConfigError(f"sensitive.domains.{name}: not one of sensitive.fields")
    domains = tuple(_parse_domain(f, domains_raw[f]) if f in domains_raw else SensitiveDomain(f)
                    for f in sensitive)
    ids = raw.get("identifiers", {})
    drop = tuple(ids.get("drop", []))
    pseudo = tuple(ids.get("pseudonymize", []))
    if not all(isinstance(x, str) for x in drop + pseudo):
        raise ConfigError("identifiers: drop and pseudonymize must be lists of field paths")
    identifiers = {stream.privacy_unit, *drop, *pseudo}
    qi_fields = {f for q in qis for f in q.fields}
    for bad, where in ((identifiers & set(sensitive), "sensitive.fields"), (identifiers & qi_fields,
                                                                            "quasi_identifiers"),
                       (identifiers & {invariant}, "sensitive.invariant")):
        if bad:
            raise ConfigError(f"{where}: identifier field(s) {sorted(bad)} would be published; "
                              "identifiers are never output")
    try:
        strategy_params.check_config(tuple(sensitive), tuple(names))
    except ValueError as exc:
        raise ConfigError(_keyed("anonymization.strategy_params", exc)) from None
    lim = raw.get("limits", {})
    for key in lim:
        if key not in ("max_event_bytes", "duplicate_horizon_s"):
            raise ConfigError(f"limits.{key}: unknown key (known: max_event_bytes, duplicate_horizon_s; event times "
                              "are bounded by the timestamp quasi-identifiers' domains)")
    dup_horizon = _get(lim, "duplicate_horizon_s", "limits", (int, float), required=False,
                       default=DUPLICATE_HORIZON_S)
    if not dup_horizon >= 0 or dup_horizon == float("inf"):
        raise ConfigError(f"limits.duplicate_horizon_s: must be a finite number of seconds >= 0 (0: no duplicate "
                          f"detection), got {dup_horizon!r}")
    limits = Limits(
        max_event_bytes=int(_positive(_get(lim, "max_event_bytes", "limits", int, required=False,
                                           default=65536), "limits.max_event_bytes", integer=True)),
        duplicate_horizon_s=float(dup_horizon),
    )
    dp = None
    if "dp" in raw or "aggregates" in raw:
        # imported only for streams with aggregates: stream_anon.dp pulls in diffprivlib and scikit-learn
        from stream_anon.dp.specs import parse_dp_config
        dp = parse_dp_config(raw, base_dir)
    return StreamConfig(stream, anonymization, qis, sensitive, invariant, drop, pseudo, limits, source, raw, dp,
                        domains, input=_parse_input(raw, stream, qis, sensitive, dp, base_dir))


def _parse_input(raw: dict, stream: StreamSection, qis, sensitive, dp, base_dir: Path) -> InputSpec:
    """The [input] table (stream_anon.inputs.mapping): every field the stream reads must be mapped, nothing else."""
    required = {stream.privacy_unit: "privacy unit", stream.event_time: "event time"}
    for q in qis:
        for f in q.fields:
            required.setdefault(f, f"quasi-identifier {q.name} field")
    for f in sensitive:
        required.setdefault(f, "sensitive field")
    if dp is not None:     # what stream_anon.kafka.aggregates.needed_fields carries to the closed windows
        fields = [dp.privacy_unit]
        for s in dp.aggregates:
            fields += [f for g in s.group_by for f in g.fields] + ([s.value_field] if s.value_field else []) \
                + [k for k, _ in s.where]
        for f in fields:
            required.setdefault(f, "aggregate field")
    try:
        spec = parse_input(raw.get("input"), event_time=stream.event_time, event_types=stream.event_types,
                           required=required, base_dir=base_dir)
    except InputConfigError as exc:
        raise ConfigError(str(exc)) from None
    if spec.event_type is not None and spec.event_type not in stream.event_types:
        raise ConfigError(f"input.event_type: {spec.event_type!r} is not one of stream.event_types "
                          f"{list(stream.event_types)}")
    return spec


def with_absolute_paths(raw: dict, base_dir: Path) -> dict:
    """The config document with every file it names made absolute against ``base_dir`` (the directory of the file
    it was read from): hierarchies of quasi-identifiers and aggregate groups, CSV lookup tables of ``[input]``. For
    copies written elsewhere (calibrated configs, the demo's derived configs). Changes ``raw`` in place."""
    tables = raw.get("quasi_identifiers", []) + [g for a in raw.get("aggregates", []) for g in a.get("group_by", [])]
    for table in tables:
        if isinstance(table.get("hierarchy"), str):
            table["hierarchy"] = str((base_dir / table["hierarchy"]).resolve())
    for spec in (raw.get("input") or {}).get("fields", {}).values():
        if isinstance(spec, dict) and isinstance(spec.get("lookup"), str):
            spec["lookup"] = str((base_dir / spec["lookup"]).resolve())
    return raw


def load_config(path: str | Path) -> StreamConfig:
    """Load and validate a stream configuration file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    return parse_config(raw, base_dir=path.parent, source=path.resolve())


def config_dict(cfg: StreamConfig) -> dict[str, Any]:
    """The raw validated document (for reports)."""
    return cfg.raw
