"""The audit's independent toolkit: keyed tokens, value parsing, the cover test of a generalization.

Nothing here comes from the engine: a bug in the engine's HMAC helpers, hierarchy parser or time parsing would
otherwise be checked by itself. The attacks (:mod:`stream_anon.attacks`) use the same toolkit, so an attack and
the audit agree on what "covers" and "the token of an event" mean.

A hostile raw message does not make these helpers raise: strings are encoded with ``surrogatepass`` (a lone
surrogate, which a JSON escape can produce, gets a token instead of a ``UnicodeEncodeError``; every other string
encodes exactly as the engine's strict UTF-8 in stream_anon/crypto.py does, so the tokens agree), JSON nested
too deep for the decoder is not an object, and every walk over nested data is iterative.

>>> as_text(True), as_text(3), as_text("x"), as_text([1]), as_text(None)
('true', '3', 'x', None, None)
>>> get_path({"signals": {"birth_year": 1970}}, "signals.birth_year"), get_path({"a.b": 1}, "a.b")
(1970, 1)
>>> parse_time("2024-01-01T00:00:00Z").isoformat(), parse_time("yesterday")
('2024-01-01T00:00:00+00:00', None)
>>> audit_token(b"k", "\\ud800") == audit_token(b"k", "\\ud800")     # a lone surrogate still gets a token
True
>>> nesting_depth([[[]]]), nesting_depth({"a": [1, {"b": 2}]}), nesting_depth("x")
(3, 3, 0)
"""
from __future__ import annotations

import csv
import hashlib
import hmac
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

EPS = 1e-9          # float slack of numeric and geo interval bounds


# ----------------------------------------------------------------------------------------------- keyed tokens
def _utf8(value: str) -> bytes:
    """UTF-8 bytes of a string; a lone surrogate is kept as its code unit instead of raising."""
    return value.encode("utf-8", "surrogatepass")


def _hmac_hex(secret: bytes, label: bytes, value: str) -> str:
    return hmac.new(secret, label + _utf8(value), hashlib.sha256).hexdigest()


def key_id(secret: bytes) -> str:
    """The public id of a secret as the worker publishes it in manifests: the first 8 hex digits of
    HMAC-SHA256(secret, "kid")."""
    return hmac.new(secret, b"kid", hashlib.sha256).hexdigest()[:8]


def audit_token(secret: bytes, event_id: str) -> str:
    """hex HMAC-SHA256(secret, b"audit:" + event_id)."""
    return _hmac_hex(secret, b"audit:", event_id)


def pseudonym(secret: bytes, unit: str) -> str:
    """hex HMAC-SHA256(secret, b"unit:" + unit)."""
    return _hmac_hex(secret, b"unit:", unit)


def counterfeit_token(secret: bytes, release_id: str, class_id: str, n: int) -> str:
    """hex HMAC-SHA256(secret, b"counterfeit:" + release_id + "/" + class_id + "/" + n)."""
    return _hmac_hex(secret, b"counterfeit:", f"{release_id}/{class_id}/{n}")


def report_alias(secret: bytes, unit: str) -> str:
    """Names an individual in a report's examples without revealing it (a keyed hash of its privacy unit)."""
    return "ind-" + _hmac_hex(secret, b"minv-report:", unit)[:10]


def counterfeit_tokens(manifests: list[dict], secret: bytes) -> dict[str, tuple]:
    """Token -> (release_id, class_id) of every counterfeit record the manifests announce."""
    out: dict[str, tuple] = {}
    for m in manifests:
        rid = m.get("release_id")
        for c in m.get("classes") or []:
            n = c.get("counterfeit_records")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                for i in range(n):
                    out[counterfeit_token(secret, str(rid), str(c.get("class_id")), i)] = (rid, c.get("class_id"))
    return out


# ----------------------------------------------------------------------------------------------- values
def source_key(src: Any) -> tuple | None:
    """``(topic, partition, offset)`` from a tuple or a dead letter's ``source`` dict; None if malformed.

    An event inside a multi-event message (``[input] format = "gtfs-realtime"``) has the key
    ``(topic, partition, offset, index)``: a dead letter's source then carries ``index``."""
    try:
        if isinstance(src, dict):
            key = (str(src["topic"]), int(src["partition"]), int(src["offset"]))
            return key + (int(src["index"]),) if src.get("index") is not None else key
        if len(src) == 4:
            topic, partition, offset, index = src
            return (str(topic), int(partition), int(offset), int(index))
        topic, partition, offset = src
        return (str(topic), int(partition), int(offset))
    except (KeyError, TypeError, ValueError):
        return None


def parse_time(value: Any) -> datetime | None:
    """ISO-8601 string -> aware datetime (naive is taken as UTC); None if unparseable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def get_path(event: Any, path: str) -> Any:
    """Dotted path into a nested event (``signals.birth_year``); a literal flat key also works."""
    if isinstance(event, dict) and path in event:
        return event[path]
    cur = event
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def as_text(value: Any) -> str | None:
    """A scalar as the text it is compared by (booleans as JSON spells them); None for null and containers."""
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, str) else str(value)


def as_float(value: Any) -> float | None:
    """A number (or numeric string) as float; None for null, booleans, NaN and anything else."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def json_object(payload: Any) -> dict | None:
    """A message payload (bytes, text or an already decoded object) as a JSON object, else None.

    Nesting too deep for the decoder is malformed input like any other, not an audit crash."""
    try:
        text = payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else payload
        obj = json.loads(text) if isinstance(text, str) else text
    except (UnicodeDecodeError, ValueError, TypeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _children(obj: Any) -> Iterable:
    if isinstance(obj, dict):
        return obj.values()
    if isinstance(obj, (list, tuple)):
        return obj
    return ()


def nesting_depth(obj: Any, limit: int | None = None) -> int:
    """Container nesting depth of ``obj`` (a scalar is 0); stops counting once ``limit`` is exceeded."""
    deepest = 0
    stack = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            depth += 1
            deepest = max(deepest, depth)
            if limit is not None and deepest > limit:
                return deepest
            stack.extend((child, depth) for child in _children(node))
    return deepest


def strings_in(obj: Any, keys: bool = True) -> Iterator[tuple[str, str]]:
    """(path, string) of every string value (and, with ``keys``, every string dict key), in document order,
    without recursion.

    >>> list(strings_in({"a": ["x", {"b": "y"}]}))
    [('.<key>', 'a'), ('.a[0]', 'x'), ('.a[1].<key>', 'b'), ('.a[1].b', 'y')]
    >>> [s for _, s in strings_in({"a": ["x", {"b": "y"}]}, keys=False)]
    ['x', 'y']
    """
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            yield path, node
        elif isinstance(node, dict):
            children: list[tuple[str, Any]] = []
            for k, v in node.items():
                if keys and isinstance(k, str):
                    children.append((f"{path}.<key>", k))
                children.append((f"{path}.{k}", v))
            stack.extend(reversed(children))
        elif isinstance(node, (list, tuple)):
            stack.extend(reversed([(f"{path}[{i}]", v) for i, v in enumerate(node)]))


def string_values(obj: Any) -> list[str]:
    """Every string value under ``obj`` (dict keys excluded), in document order: a manifest's token lists."""
    return [s for _path, s in strings_in(obj, keys=False)]


# ----------------------------------------------------------------------------------------------- hierarchy
class Hierarchy:
    """Label -> parent map from the contract's JSON tree (nested dicts, lists of leaves) or an ARX CSV.

    >>> h = Hierarchy({"Rail": {"Zone 1": ["Bank", "Aldgate"]}})
    >>> h.covers("Rail", "Bank"), h.covers("Zone 1", "Aldgate"), h.covers("Zone 1", "Unknown")
    (True, True, False)
    """

    def __init__(self, tree: Any = None, chains: Iterable[list[str]] | None = None):
        self.parent: dict[str, str | None] = {}
        self.roots: set[str] = set()
        if tree is not None:
            self._walk(tree)
        for chain in chains or ():
            chain = [c for c in chain if c != ""]
            for child, par in zip(chain, chain[1:]):
                self.parent.setdefault(child, par)
            if chain:
                self.parent.setdefault(chain[-1], None)
                self.roots.add(chain[-1])

    def _add(self, label: str, parent: str | None) -> None:
        self.parent[label] = parent
        if parent is None:
            self.roots.add(label)

    def _walk(self, tree: Any) -> None:
        """Pre-order, as the tree is written (the naive baseline orders leaves by it), with an explicit stack so
        that no hierarchy file is too deep to read. Labels are dict keys and list items; a scalar dict value
        names nothing."""
        stack: list[tuple] = [("node", tree, None)]
        while stack:
            item = stack.pop()
            if item[0] == "label":
                _, label, parent = item
                self._add(label, parent)
                continue
            _, node, parent = item
            if isinstance(node, dict):
                for key, sub in reversed(list(node.items())):
                    stack.append(("node", sub, str(key)))
                    stack.append(("label", str(key), parent))
            elif isinstance(node, list):
                for sub in reversed(node):
                    stack.append(("node", sub, parent) if isinstance(sub, (dict, list))
                                 else ("label", str(sub), parent))

    @classmethod
    def from_obj(cls, obj: Any) -> "Hierarchy":
        if isinstance(obj, Hierarchy):
            return obj
        if isinstance(obj, dict) and "tree" in obj:
            return cls(tree=obj["tree"])
        return cls(tree=obj)

    @classmethod
    def load(cls, path: Path) -> "Hierarchy":
        if path.suffix.lower() == ".csv":
            text = path.read_text(encoding="utf-8")
            delim = ";" if text.count(";") >= text.count(",") else ","
            return cls(chains=[row for row in csv.reader(text.splitlines(), delimiter=delim) if row])
        return cls.from_obj(json.loads(path.read_text(encoding="utf-8")))

    def ancestors_or_self(self, label: str) -> list[str]:
        out, seen = [], set()
        cur: str | None = label
        while cur is not None and cur not in seen:
            out.append(cur)
            seen.add(cur)
            cur = self.parent.get(cur)
        return out

    def covers(self, label: str, value: str) -> bool:
        if label == "*" or label in self.roots:
            return True
        return value in self.parent and label in self.ancestors_or_self(value)

    def content_digest(self) -> str | None:
        """The hierarchy's content as release manifests name it (``settings_changed``), not its file:
        ``"sha256:"`` + the first 16 hex digits of SHA-256 over the UTF-8 of ``json.dumps([root, leaves, edges])``
        (Python's default separators), with ``leaves`` the leaf labels in depth-first order (children in the
        order the file gives them) and ``edges`` the sorted ``[parent, child]`` pairs (docs/privacy.md, Settings in
        force). None for a forest (several roots), which no worker accepts.

        >>> Hierarchy({"*": {"Rail": ["A", "B"], "Bus": ["1"]}}).content_digest()
        'sha256:3ac41bb764316400'
        """
        if len(self.roots) != 1:
            return None
        children: dict[str, list[str]] = {}
        for label, par in self.parent.items():          # insertion order: a child's first appearance in the file
            if par is not None:
                children.setdefault(par, []).append(label)
        root = next(iter(self.roots))
        leaves, stack, seen = [], [root], set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            kids = children.get(node)
            if not kids:
                leaves.append(node)
            stack.extend(reversed(kids or []))
        edges = sorted([par, label] for label, par in self.parent.items() if par is not None)
        text = json.dumps([root, leaves, edges])
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- QIs
@dataclass
class QISpec:
    """One quasi-identifier: output key, field (path or list of paths), kind, hierarchy, domain bounds, and for a
    numeric one the granularity its published bounds must sit on (None: not checked)."""

    name: str
    field: str | list[str]
    kind: str
    hierarchy: Any = None  # contract JSON dict, or a Hierarchy
    lower: Any = None
    upper: Any = None
    granularity: float | None = None

    def __post_init__(self) -> None:
        if self.hierarchy is not None:
            self.hierarchy = Hierarchy.from_obj(self.hierarchy)

    @property
    def fields(self) -> list[str]:
        return [self.field] if isinstance(self.field, str) else list(self.field)


def numeric_granularity(q: dict) -> float | None:
    """The granularity of a numeric ``[[quasi_identifiers]]`` table as the audit reads it: ``granularity``, else
    the largest power of ten at most 1% of the domain, at least 1 for whole-number bounds (docs/configuration.md).

    >>> numeric_granularity({"kind": "numeric", "lower": 0, "upper": 1_000_000}), numeric_granularity(
    ...     {"kind": "numeric", "lower": 0.0, "upper": 1.5}), numeric_granularity({"kind": "timestamp"})
    (10000.0, 0.01, None)
    """
    if q.get("kind") != "numeric":
        return None
    if q.get("granularity") is not None:
        return float(q["granularity"])
    lo, hi = float(q["lower"]), float(q["upper"])
    e = math.floor(math.log10((hi - lo) / 100))
    if lo.is_integer() and hi.is_integer():
        e = max(e, 0)
    return float(10 ** e) if e >= 0 else float(f"1e{e}")


def on_grid(x: float, g: float) -> bool:
    """``x`` is a multiple of ``g`` (to 1e-9 of a step)."""
    r = x / g
    return abs(r - round(r)) <= 1e-9 * max(1.0, abs(r))


def qi_value(q: QISpec, event: dict) -> Any:
    """The raw value of quasi-identifier ``q`` in a raw event (a (lat, lon) pair for a geopoint)."""
    if q.kind == "geopoint":
        fs = q.fields
        return (as_float(get_path(event, fs[0])), as_float(get_path(event, fs[1]))) if len(fs) == 2 else (None, None)
    for f in q.fields:
        v = get_path(event, f)
        if v is not None:
            return v
    return None


def is_full(q: QISpec, pub: Any) -> bool:
    """Published QI reveals nothing (allowed for a null raw value)."""
    if pub is None:
        return True
    if not isinstance(pub, dict):
        return False
    if all(v is None for v in pub.values()):
        return True
    if q.kind in ("categorical", "station"):
        label = pub.get("label")
        return label == "*" or (q.hierarchy is not None and label in q.hierarchy.roots)
    if q.kind == "geopoint" and "h3" in pub:
        return pub["h3"] == "*"
    if q.kind == "geopoint" and isinstance(q.lower, list) and isinstance(q.upper, list):
        try:
            return (pub["lat"][0] <= q.lower[0] + EPS and pub["lat"][1] >= q.upper[0] - EPS
                    and pub["lon"][0] <= q.lower[1] + EPS and pub["lon"][1] >= q.upper[1] - EPS)
        except (KeyError, TypeError, IndexError):
            return False
    if q.lower is not None and q.upper is not None:
        if q.kind == "timestamp":
            t_lo, t_hi, ql, qu = (parse_time(pub.get("from")), parse_time(pub.get("to")),
                                  parse_time(q.lower), parse_time(q.upper))
            return (t_lo is not None and t_hi is not None and ql is not None and qu is not None
                    and t_lo <= ql and t_hi >= qu)
        lo, hi = as_float(pub.get("from")), as_float(pub.get("to"))
        return lo is not None and hi is not None and lo <= float(q.lower) + EPS and hi >= float(q.upper) - EPS
    return False


def cover_test(q: QISpec, pub: Any, value: Any) -> tuple[bool, str]:
    """Whether a published generalization of ``q`` covers a raw value, and what was tested (the reason of a
    failure in the audit's examples).

    >>> q = QISpec("fare", "fare", "numeric")
    >>> cover_test(q, {"from": 1, "to": 2}, 1.5), cover_test(q, {"from": 1, "to": 2}, 3)
    ((True, 'numeric interval'), (False, 'numeric interval'))
    """
    if value is None or value == (None, None):
        return is_full(q, pub), "null raw value"
    if pub is None:
        return True, ""  # fully suppressed attribute reveals nothing and is trivially true
    if not isinstance(pub, dict):
        return False, "malformed generalization"
    if q.kind == "timestamp":
        t, t_lo, t_hi = parse_time(value), parse_time(pub.get("from")), parse_time(pub.get("to"))
        if t is None or t_lo is None or t_hi is None:
            return False, "unparseable time"
        return t_lo <= t < t_hi, "time interval [from, to)"
    if q.kind == "numeric":
        x, lo, hi = as_float(value), as_float(pub.get("from")), as_float(pub.get("to"))
        if x is None or lo is None or hi is None:
            return False, "non-numeric bound or value"
        return lo - EPS <= x <= hi + EPS, "numeric interval"
    if q.kind in ("categorical", "station"):
        label, v = pub.get("label"), as_text(value)
        if not isinstance(label, str) or v is None:
            return False, "missing label"
        if q.hierarchy is None:
            return label in ("*", v), "label"
        return q.hierarchy.covers(label, v), "label not the value or an ancestor"
    if q.kind == "geopoint":
        lat, lon = value
        if lat is None or lon is None:
            return is_full(q, pub), "null raw value"
        if "h3" in pub:
            return h3_cell_covers(pub, lat, lon), "H3 cell"
        try:
            (a0, a1), (o0, o1) = pub["lat"], pub["lon"]
            ok = a0 - EPS <= lat <= a1 + EPS and o0 - EPS <= lon <= o1 + EPS
        except (KeyError, TypeError, ValueError):
            return False, "malformed box"
        return ok, "box"
    return False, f"unknown QI kind {q.kind!r}"


def h3_cell_covers(pub: dict, lat: float, lon: float) -> bool:
    """A published H3 cell ``{"h3": cell, "resolution": r}`` holds (lat, lon): the position's cell at the
    cell's own resolution is that cell (``"*"``: the whole domain). The resolution is read from the cell id; a
    ``resolution`` that disagrees with it, or an invalid id, fails. Imports h3 itself (not the engine's code)."""
    import h3
    cell = pub.get("h3")
    if cell == "*":
        return True
    if not isinstance(cell, str) or not h3.is_valid_cell(cell):
        return False
    res = h3.get_resolution(cell)
    if "resolution" in pub and pub["resolution"] != res:
        return False
    return h3.latlng_to_cell(float(lat), float(lon), res) == cell


def covers(q: QISpec, published: Any, value: Any) -> bool:
    """Whether a published generalization of ``q`` covers a raw value (used by the audit and the attacks)."""
    return cover_test(q, published, value)[0]
