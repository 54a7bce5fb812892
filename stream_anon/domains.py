"""What a sensitive field may publish: the ``[sensitive.domains.<field>]`` tables of a stream configuration
(docs/configuration.md). Sensitive values are published verbatim, so each field declares its domain and the
reader checks every value against it (``stream_anon.engine.records``); a value outside sends the event to the
dead letters.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from stream_anon.errors import ConfigError
from stream_anon.validation import Table

DOMAIN_KEYS = ("type", "values", "other", "lower", "upper", "integer", "max_length", "charset")
MAX_TEXT_LENGTH = 65536              # a text sensitive value cannot be longer than an event
SENSITIVE_TYPES = ("category", "number", "boolean", "text")
DEFAULT_TEXT_CHARSET = r"A-Za-z0-9 .,:/()&+#%_-"   # no quotes, < > ; \\ = or control characters
DEFAULT_TEXT_MAX_LENGTH = 64
_MAX_SAFE_NUMBER = 2.0 ** 53          # undeclared numbers: beyond this a float no longer holds every integer


@dataclass(frozen=True)
class SensitiveDomain:
    """The values a sensitive field may publish (``[sensitive.domains]``; docs/configuration.md).

    ``type``: ``category`` (``values``; a value outside goes to the dead letters, or is published as ``other``
    when one is declared), ``number`` (``lower``..``upper``, ``integer``), ``boolean``, ``text`` (at most
    ``max_length`` characters of the ``charset`` character class), or ``scalar``: the default of a field without
    a declared domain (null, a boolean, a number of magnitude <= 2**53, or text as ``text`` with the defaults).
    Null is always allowed (a missing value is published as null).

    >>> d = SensitiveDomain("p", "category", values=("payg", "travelcard"), other="other")
    >>> d.check("payg"), d.check("<script>"), d.check(["payg"])[1]
    (('payg', None), ('other', None), 'p: a list is not a category value')
    >>> SensitiveDomain("t", "text", max_length=8).check("<b>")[1]
    't: text has characters outside [A-Za-z0-9 .,:/()&+#%_-]'
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
    # Per instance, set by __post_init__: ClassVar keeps them out of the fields (and the guarantees' settings)
    _values: ClassVar[frozenset[str]]
    _text: ClassVar[re.Pattern[str]]

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
            return None, f"{self.field}: value is not in its declared categories"
        if t == "boolean":
            return (v, None) if isinstance(v, bool) else (None, f"{self.field}: a {_kind(v)} is not a boolean")
        if t == "number" or (t == "scalar" and isinstance(v, (int, float)) and not isinstance(v, bool)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return None, f"{self.field}: a {_kind(v)} is not a number"
            if not math.isfinite(v):
                return None, f"{self.field}: number is not finite"
            lo, hi = (self.lower, self.upper) if t == "number" else (-_MAX_SAFE_NUMBER, _MAX_SAFE_NUMBER)
            assert lo is not None and hi is not None, "a number domain has both bounds (parse_domain)"
            if not lo <= v <= hi:
                return None, f"{self.field}: number outside its domain [{lo:g}, {hi:g}]"
            if self.integer and float(v) != int(v):
                return None, f"{self.field}: number is not an integer"
            return v, None
        if t == "scalar" and isinstance(v, bool):
            return v, None
        if not isinstance(v, str):
            return None, f"{self.field}: a {_kind(v)} is not text"
        if len(v) > self.max_length:
            return None, f"{self.field}: text of {len(v)} characters, more than {self.max_length}"
        if not self._text.fullmatch(v):
            return None, f"{self.field}: text has characters outside [{self.charset}]"
        return v, None


def _kind(v) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(type(v), type(v).__name__)




def flat_domains(table: dict, prefix: str = "") -> dict:
    """Domains by dotted field path: ``"a.b" = {...}`` and the nested form TOML makes of an unquoted dotted key
    (``a.b = {...}``, ``[sensitive.domains.a] b = {...}``) are the same."""
    out = {}
    for key, value in table.items():
        if isinstance(value, dict) and "type" not in value and value:
            out.update(flat_domains(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse_domain(name: str, table) -> SensitiveDomain:
    t = Table(table, f"sensitive.domains.{name}", DOMAIN_KEYS)
    kind = t.choice("type", SENSITIVE_TYPES)
    domain = SensitiveDomain(name, kind)
    if kind == "category":
        values = t.strings("values", min_items=1)
        other = t.text("other", None)
        if other is not None and other not in values:
            raise ConfigError(f"{t.key('other')}: {other!r} must be one of the declared values")
        domain = SensitiveDomain(name, kind, values=values, other=other)
    elif kind == "number":
        lower, upper = t.number("lower"), t.number("upper")
        if lower > upper:
            raise ConfigError(f"{t.key('lower')}: must not be above upper ({upper}), got {lower}")
        domain = SensitiveDomain(name, kind, lower=lower, upper=upper, integer=t.boolean("integer", False))
    elif kind == "text":
        charset = t.text("charset", DEFAULT_TEXT_CHARSET)
        try:
            re.compile(f"[{charset}]*")
        except re.error as exc:
            raise ConfigError(f"{t.key('charset')}: not a regular-expression character class: {exc}") from None
        domain = SensitiveDomain(name, kind, charset=charset,
                                 max_length=t.integer("max_length", 1, MAX_TEXT_LENGTH, DEFAULT_TEXT_MAX_LENGTH))
    t.done(f"not a key of a {kind} domain")
    return domain
