"""Validation of configuration values, written once (in the spirit of diffprivlib's ``validation.py``).

Every table of a stream configuration (``[stream]``, ``[anonymization]``, ``[dp]``, ``[[aggregates]]``,
``[input]``, ...) and every parameter dataclass (a strategy's ``Params``, ``MInvariantParams``) is checked with
these functions. A failure is a :class:`~stream_anon.errors.ConfigError` of one line that starts with the full
dotted key. The rules, everywhere:

- a number is finite (NaN and +-inf are refused) and a boolean is never a number;
- an integer has a lower and an upper bound (``k = 2**64`` is refused at load, not carried into numpy);
- a :class:`Table` refuses a key it does not know as soon as it is built, suggesting the nearest known key, and
  :meth:`Table.done` refuses a known key that the reading code did not read (it has no meaning next to the
  other keys given): no key of a configuration is ever silently ignored.

>>> t = Table({"k": 10, "window_s": float("nan")}, "anonymization", ("k", "window_s", "max_delay_s"))
>>> t.integer("k", 2, MAX_COUNT)
10
>>> t.number("window_s", above=0, at_most=MAX_SECONDS)
Traceback (most recent call last):
...
stream_anon.errors.ConfigError: anonymization.window_s: expected a finite number, got nan
>>> Table({"max_suppresion_ratio": 0.1}, "anonymization", ("k", "max_suppression_ratio"))
Traceback (most recent call last):
...
stream_anon.errors.ConfigError: anonymization.max_suppresion_ratio: unknown key; did you mean max_suppression_ratio?
"""
from __future__ import annotations

import difflib
import math
import numbers
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from stream_anon.errors import ConfigError

MAX_SECONDS = 10 * 366 * 86400   # largest duration a key may name (ten years): beyond it a typo, not a setting
MAX_COUNT = 1_000_000            # largest count a key may name (k, l, m, contributions, pool sizes, ...)
# largest epsilon a key may name (a budget or an aggregate's share): at 1e9 a count's noise is already far below 1
# (tests run near noise-free at 1e6-1e7); beyond it is a typo (2**64, 1e308), whose sums in the ledger lose meaning
MAX_EPSILON = 1e9
# largest magnitude of a DP aggregate's clamping bound or bin edge: a sum of clamped values stays exact in a float
# (2**53 ~ 9.0e15); at 1e308 the noise scale (upper - lower) / epsilon is infinite
MAX_MAGNITUDE = 1e15
NAME_RE = re.compile(r"^[a-z0-9_-]+$")   # names that become parts of topics, keys and output fields


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


REQUIRED = _Marker("REQUIRED")   # default of a key that must be given
_ABSENT = _Marker("ABSENT")


def _shown(value, limit: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + "..."


def _got(value) -> str:
    """A refused value as a message shows it: its kind, then its repr (cut)."""
    kind = {bool: "boolean", str: "string", list: "list", dict: "table", int: "integer", float: "number"}.get(
        type(value), type(value).__name__)
    return f"{kind} {_shown(value)}"


def _fmt(x) -> str:
    # math.trunc, not int(): typeshed's numbers.Real has no __int__; the same integer for a whole value
    return str(math.trunc(x)) if isinstance(x, numbers.Real) and float(x).is_integer() else repr(x)


def interval(above=None, at_least=None, below=None, at_most=None) -> str:
    """The allowed range in interval notation, as the messages and docs/configuration.md write it.

    >>> interval(above=0, at_most=1), interval(at_least=0, below=1), interval(at_least=2), interval(above=0)
    ('(0, 1]', '[0, 1)', '>= 2', '> 0')
    """
    lo, lo_open = (above, True) if above is not None else (at_least, False)
    hi, hi_open = (below, True) if below is not None else (at_most, False)
    if lo is not None and hi is not None:
        return f"{'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {_fmt(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {_fmt(hi)}"
    return "finite"


def check_number(value, key: str, *, above=None, at_least=None, below=None, at_most=None) -> float:
    """A finite real number (an integer is one too; a boolean is not) within the bounds given, as a float.

    >>> check_number(3, "x", above=0)
    3.0
    >>> check_number(True, "x")
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: x: expected a number, got boolean True
    >>> check_number(float("-inf"), "x")
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: x: expected a finite number, got -inf
    >>> check_number(0, "x", above=0, at_most=1)
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: x: must be in (0, 1], got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{key}: expected a number, got {_got(value)}")
    try:
        v = float(value)
    except OverflowError:           # an integer beyond any float
        v = math.inf
    if not math.isfinite(v):
        raise ConfigError(f"{key}: expected a finite number, got {_shown(value)}")
    if ((above is not None and not v > above) or (at_least is not None and not v >= at_least)
            or (below is not None and not v < below) or (at_most is not None and not v <= at_most)):
        raise ConfigError(f"{key}: must be {_range_words(above, at_least, below, at_most)}, got {_shown(value)}")
    return v


def _range_words(above, at_least, below, at_most) -> str:
    text = interval(above, at_least, below, at_most)
    return f"in {text}" if text[0] in "[(" else text


def check_integer(value, key: str, lo: int, hi: int) -> int:
    """An integer (not a boolean, not 2.0) in ``[lo, hi]``; every integer key has both bounds.

    >>> check_integer(2 ** 64, "anonymization.k", 2, MAX_COUNT)
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: anonymization.k: must be in [2, 1000000], got 18446744073709551616
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{key}: expected an integer, got {_got(value)}")
    n = int(value)                  # exact for an Integral; typeshed's Integral does not compare with int
    if not lo <= n <= hi:
        raise ConfigError(f"{key}: must be in [{lo}, {hi}], got {_shown(value)}")
    return n


def check_choice(value, key: str, choices: Iterable):
    """One of ``choices``.

    >>> check_choice("sometimes", "anonymization.reuse", ("deadline", "immediate", "never"))
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: anonymization.reuse: must be one of deadline, immediate, never, got 'sometimes'
    """
    choices = tuple(choices)
    if isinstance(value, bool) or value not in choices:        # True == 1: a boolean is no choice of numbers
        near = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1) \
            if isinstance(value, str) else []
        raise ConfigError(f"{key}: must be one of {', '.join(map(str, choices))}, got {_shown(value)}"
                          + (f"; did you mean {near[0]}?" if near else ""))
    return value


def check_text(value, key: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {_got(value)}")
    return value


def check_name(value, key: str) -> str:
    """A name of lowercase letters, digits, ``_`` or ``-`` (it becomes part of topic names and output keys).

    >>> check_name("Oyster", "stream.name")
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: stream.name: use lowercase letters, digits, '_' or '-', got 'Oyster'
    """
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ConfigError(f"{key}: use lowercase letters, digits, '_' or '-', got {_shown(value)}")
    return value


def check_bool(value, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {_got(value)}")
    return value


def check_fields(value, key: str) -> tuple[str, ...]:
    """A field path (dotted) or a non-empty list of them.

    >>> check_fields("event_time", "q.field"), check_fields(["station", "bus_route"], "q.field")
    (('event_time',), ('station', 'bus_route'))
    """
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: expected a field path or a non-empty list of field paths, got {_got(value)}")
    return tuple(value)


def check_strings(value, key: str, min_items: int = 0, allow_empty: bool = False) -> tuple[str, ...]:
    """A list of at least ``min_items`` strings, none empty unless ``allow_empty`` (field paths, names).

    >>> check_strings(["tap_in", ""], "event_types", min_items=1)
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: event_types: expected a non-empty list of non-empty strings, got list ['tap_in', '']
    """
    if (not isinstance(value, list) or len(value) < min_items
            or not all(isinstance(v, str) and (v or allow_empty) for v in value)):
        what = f"{'a non-empty list' if min_items else 'a list'} of {'strings' if allow_empty else 'non-empty strings'}"
        raise ConfigError(f"{key}: expected {what}, got {_got(value)}")
    return tuple(value)


ALLOW_OUTSIDE_FLAG = "--allow-outside-paths"
ALLOW_OUTSIDE_HELP = ("the files the config names (hierarchies, lookup tables, station graphs) may lie outside its "
                      "directory tree (default: refused, one line naming the key and the path)")


@dataclass(frozen=True)
class ConfigDir:
    """Where the files a configuration names are (hierarchies, lookup tables, station graphs): a relative path
    resolves against ``path``, the config file's directory, and the file must lie in ``root``, the tree of that
    directory (a wider root for the bundled configs: :func:`stream_anon.contract.config_dir`), unless
    ``allow_outside`` (``--allow-outside-paths``). Checked on the path with symbolic links followed, before the
    file is looked for: a config cannot probe what exists elsewhere.

    >>> ConfigDir.of("/srv/streams").file("../../etc/passwd", "quasi_identifiers.zone.hierarchy")
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: quasi_identifiers.zone.hierarchy: /etc/passwd is outside /srv/streams, the config's directory (a file elsewhere needs --allow-outside-paths)
    """
    path: Path
    root: Path
    allow_outside: bool = False

    @classmethod
    def of(cls, base, allow_outside: bool = False, root=None) -> "ConfigDir":
        """``base``: a ConfigDir (returned as it is) or the config file's directory (``root``: its tree)."""
        if isinstance(base, ConfigDir):
            return base
        path = Path(base or ".").resolve()
        return cls(path, Path(root).resolve() if root is not None else path, allow_outside)

    def resolve(self, value, key: str) -> Path:
        """The absolute path ``value`` names, refused when outside the tree (not checked for existence)."""
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a file path (relative to the config file), got {_got(value)}")
        file = (self.path / value).resolve()
        if not self.allow_outside and not file.is_relative_to(self.root):
            raise ConfigError(f"{key}: {file} is outside {self.root}, the config's directory (a file elsewhere needs "
                              f"{ALLOW_OUTSIDE_FLAG})")
        return file

    def file(self, value, key: str) -> Path:
        """The path of an existing file named by ``value`` (:meth:`resolve`)."""
        file = self.resolve(value, key)
        if not file.is_file():
            raise ConfigError(f"{key}: file not found: {file}")
        return file


def check_file(value, key: str, base_dir) -> Path:
    """The path of an existing file, relative to the configuration file's directory ``base_dir`` (a
    :class:`ConfigDir`, or a directory whose tree the file must lie in)."""
    return ConfigDir.of(base_dir).file(value, key)


def check_timezone(value, key: str):
    """An IANA time zone name, as a ``tzinfo`` (``UTC``: :data:`datetime.timezone.utc`).

    >>> check_timezone("Mars/Base", "dp.timezone")
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: dp.timezone: unknown time zone 'Mars/Base'
    """
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected an IANA time zone name such as 'Europe/London', got {_got(value)}")
    if value.upper() == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{key}: unknown time zone {_shown(value)}") from None


def check_timestamp(value, key: str) -> float:
    """Epoch seconds of a time given as a number, a TOML date-time or ISO-8601 text, with a UTC offset.

    >>> check_timestamp("2009-11-09T00:00:00+00:00", "q.lower")
    1257724800.0
    >>> check_timestamp("2009-11-09T00:00:00", "q.lower")
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: q.lower: timestamp needs a UTC offset, got '2009-11-09T00:00:00'
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return check_number(value, key)
    ts = value
    if isinstance(value, str):
        try:
            ts = datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(f"{key}: not an ISO-8601 timestamp: {_shown(value)}") from None
    if not isinstance(ts, datetime):
        raise ConfigError(f"{key}: expected a timestamp or a number, got {_got(value)}")
    if ts.tzinfo is None:
        raise ConfigError(f"{key}: timestamp needs a UTC offset, got {_shown(value)}")
    return ts.timestamp()


def _check_mapping(value, key: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table, got {_got(value)}")
    return value


def unknown_key(key: str, name: str, known: Iterable[str], noun: str = "key") -> ConfigError:
    """The error for a key ``name`` that is not one of ``known``, with the nearest known one when close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known)) or 'none'}"
    return ConfigError(f"{key}: unknown {noun}; {hint}")


class Table:
    """One table of a configuration, read key by key.

    Built on ``raw`` (a dict) with ``keys``, every key the table may hold: an unknown key is refused at once
    (with the nearest known key). Each reader (``number``, ``integer``, ``choice``, ...) validates one key and
    records it as read; ``default`` is returned as given when the key is absent (``REQUIRED``: absent is an
    error). A value ``None`` counts as absent (TOML has no null; Python callers use it for "not set").
    :meth:`done` refuses every known key present but not read.

    >>> t = Table({"kind": "count", "lower": 0}, "aggregates.taps", ("kind", "lower", "upper"))
    >>> t.choice("kind", ("count", "sum"))
    'count'
    >>> t.done("not a key of a count aggregate")
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: aggregates.taps.lower: not a key of a count aggregate
    """

    def __init__(self, raw, path: str, keys: Iterable[str], noun: str = "key"):
        if not isinstance(raw, dict):
            raise ConfigError(f"{path or 'config'}: expected a table, got {_got(raw)}")
        self.raw, self.path, self.keys = raw, path, tuple(keys)
        self.read: set[str] = set()
        for name in raw:
            if name not in self.keys:
                raise unknown_key(self.key(name), name, self.keys, noun)

    def key(self, name: str) -> str:
        """The full dotted key of ``name``."""
        return f"{self.path}.{name}" if self.path else name

    def __contains__(self, name: str) -> bool:
        return self.raw.get(name) is not None

    def get(self, name: str, default=REQUIRED):
        """The raw value of ``name`` (``default`` when absent), marked as read."""
        if name not in self.keys:
            raise KeyError(f"{self.path}: {name!r} is read but not declared among its keys")   # a bug here
        self.read.add(name)
        value = self.raw.get(name)
        if value is not None:
            return value
        if default is REQUIRED:
            raise ConfigError(f"{self.key(name)}: missing")
        return default

    def _checked(self, name: str, default, check, *args, **kwargs):
        """``check(value, full key, ...)`` of the value of ``name``; ``default`` itself when absent."""
        v = self.get(name, REQUIRED if default is REQUIRED else _ABSENT)
        return default if v is _ABSENT else check(v, self.key(name), *args, **kwargs)

    def number(self, name: str, default=REQUIRED, **bounds) -> float:
        return self._checked(name, default, check_number, **bounds)

    def integer(self, name: str, lo: int, hi: int, default=REQUIRED) -> int:
        return self._checked(name, default, check_integer, lo, hi)

    def choice(self, name: str, choices: Iterable, default=REQUIRED):
        return self._checked(name, default, check_choice, choices)

    def text(self, name: str, default=REQUIRED) -> str:
        return self._checked(name, default, check_text)

    def name(self, name: str = "name", default=REQUIRED) -> str:
        return self._checked(name, default, check_name)

    def boolean(self, name: str, default=REQUIRED) -> bool:
        return self._checked(name, default, check_bool)

    def fields(self, name: str, default=REQUIRED) -> tuple[str, ...]:
        return self._checked(name, default, check_fields)

    def strings(self, name: str, default=REQUIRED, min_items: int = 0, allow_empty: bool = False
                ) -> tuple[str, ...]:
        return self._checked(name, default, check_strings, min_items, allow_empty)

    def file(self, name: str, base_dir, default=REQUIRED) -> Path:
        return self._checked(name, default, check_file, base_dir)

    def timezone(self, name: str, default=REQUIRED):
        return self._checked(name, default, check_timezone)

    def timestamp(self, name: str, default=REQUIRED) -> float:
        return self._checked(name, default, check_timestamp)

    def mapping(self, name: str, default=REQUIRED) -> dict:
        """A table whose keys are names chosen by the user (field names, QI names), not keys to check."""
        return self._checked(name, default, _check_mapping)

    def table(self, name: str, keys: Iterable[str], default=REQUIRED) -> "Table":
        """The sub-table ``name`` as a :class:`Table` (of ``default``, e.g. ``{}``, when absent)."""
        return Table(self.mapping(name, default), self.key(name), keys)

    def done(self, unused: str = "not used with the other keys of this table") -> None:
        """Refuse every known key present but not read (``unused`` says why it has no meaning here)."""
        for name, value in self.raw.items():
            if name not in self.read and value is not None:
                raise ConfigError(f"{self.key(name)}: {unused}")


def named_tables(value, path: str, keys: Iterable[str]) -> list[Table]:
    """An array of tables (``[[quasi_identifiers]]``, ``[[aggregates]]``) whose entries are known by their
    ``name``: one :class:`Table` each, its path ``<path>.<name>``; names are checked and must differ.

    >>> [t.path for t in named_tables([{"name": "time"}, {"name": "zone"}], "quasi_identifiers", ("name",))]
    ['quasi_identifiers.time', 'quasi_identifiers.zone']
    """
    if not isinstance(value, list):
        raise ConfigError(f"{path}: expected an array of tables ([[{path}]]), got {_got(value)}")
    tables, seen = [], set()
    for i, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}[{i}]: expected a table, got {_got(raw)}")
        name = check_name(raw.get("name"), f"{path}[{i}].name")
        if name in seen:
            raise ConfigError(f"{path}.{name}.name: duplicate name (names key the output)")
        seen.add(name)
        tables.append(Table(raw, f"{path}.{name}", keys))
    return tables
