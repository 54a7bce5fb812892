"""Independent audit of stream-anon outputs.

Why independent
---------------
The engine enforces k-anonymity, generalization and accounting; a bug in it would go unnoticed by any check
that reuses its code (its hierarchy parser, its HMAC helpers, its idea of "the unit of an event"). This module
therefore imports nothing from ``stream_anon`` at all. It re-derives everything from three things only:

* the raw input messages exactly as produced to the raw topic (``((topic, partition, offset), payload)``),
* the secret (to recompute audit tokens ``HMAC(secret, "audit:" + event_id)`` and pseudonyms
  ``HMAC(secret, "unit:" + unit)``),
* the published outputs (records, release manifests, dead letters; docs/contracts.md section 5),

plus the stream's TOML config, read here with :mod:`tomllib` (hierarchy JSON parsed here too).

Checks and what each one defeats
--------------------------------
``duplicates``   Restarted workers re-publish releases with the same ``release_id``; identical copies are
                 merged. Two copies that differ (ignoring the wall-clock ``created_at``) mean the engine is not
                 deterministic and a consumer could see two different releases: "conflicting duplicate release".
``k``            For every class: distinct privacy units (via token -> raw event -> unit) over all its records
                 across releases >= k, and >= k already in the release that created it (manifest entry with
                 ``reused: false``). Defeats counting records instead of individuals, and classes that only
                 reach k later. All records of a class must carry the same ``qi`` (else the class is not an
                 equivalence class as seen by an attacker).
``leaks``        No raw identifier, privacy unit or pseudonym (full, first 16 or 32 hex chars) in any string
                 value or key of records and manifests (dead letters are internal and carry raw payloads).
``coverage``     Every record's generalized QIs contain the raw event's true values. Defeats generalizations
                 that are "anonymous" only because they are wrong (shifted intervals, sibling labels).
``accounting``   Each raw message ends in exactly one place: published, suppressed, dead-lettered or still
                 deferred (latest manifest per partition). Defeats silent loss and double publication.
                 Published/suppressed/deferred tokens of no raw event, and dead letters whose source is not
                 a raw message read, also fail it (fabricated output, or an incomplete read of the input).
``consistency``  Manifests agree with the records actually published (per class and in total), the class
                 generalization equals the records' ``qi``, k matches the config, counts match token lists.
``m_invariance`` Only for a stream with ``[anonymization] m``: the independent m-invariance checker
                 (:mod:`.minvariance`: m-uniqueness of every class of every release, one signature per individual
                 across all releases, counterfeit accounting) runs on the same deduplicated outputs.

Counterfeit records (m-invariance)
----------------------------------
An m-invariant release may add counterfeit records to a class (docs/contracts.md section 5); the manifest gives
their number per class (``counterfeit_records``). They are no input events. A counterfeit record is recognised
by its audit token, ``HMAC(secret, "counterfeit:" + release_id + "/" + class_id + "/" + n)`` for
``n < counterfeit_records`` of its class entry, in that release and class; only then is it kept out of ``k``
(it is no individual), ``coverage`` (it has no raw values) and ``accounting`` (it is no input event: the
equation counts real records only). Any other record of no raw event still fails as fabricated output, and a
class whose counterfeit records differ from its manifest count fails ``consistency``.

Matching rules for ``leaks`` (to avoid false positives)
------------------------------------------------------
Only string-typed output values and dict keys are searched (numbers such as fares never match an id).

* Pseudonyms (64 hex chars) and their 16/32-char prefixes: substring search inside maximal lowercase-hex runs
  (a random 16-hex collision with an audit token is ~1e-8 even for 1e5 x 1e5 pairs).
* Raw identifier / unit values: the value (``str()``) must equal the whole output string, or one of its tokens
  when split on whitespace and ``, ; : / | = ( ) [ ] { } " '`` (not on ``- _ .`` so ISO times, decimals and
  release/class ids stay whole). Values shorter than 4 chars are skipped, as are values that equal a hierarchy
  label or a raw value of a configured (non-identifier) sensitive field: those are published legitimately.

Null raw QI values (``coverage``)
---------------------------------
A raw QI that is null (or absent) is covered when the published QI is absent/null, a dict of only nulls, a
label equal to ``"*"`` or the hierarchy root, or an interval/box covering the configured domain
``[lower, upper]``. Unknown categorical values (not in the hierarchy) are only covered by ``"*"``/the root.
Intervals are inclusive; numeric and geo bounds allow 1e-9 of float slack.

Events whose unit is null do not count as an individual in ``k`` (conservative).
"""
from __future__ import annotations

import copy
import csv
import hashlib
import hmac
import json
import math
import re
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

MAX_EXAMPLES = 10
MIN_NEEDLE_LEN = 4
EPS = 1e-9
_VOLATILE_MANIFEST_KEYS = ("created_at",)
_SPLIT_RE = re.compile(r"[\s,;:/|=()\[\]{}\"']+")
_HEX_RUN_RE = re.compile(r"[0-9a-f]{16,}")


# ----------------------------------------------------------------------------------------------- primitives
def _hmac_hex(secret: bytes, label: bytes, value: str) -> str:
    return hmac.new(secret, label + value.encode(), hashlib.sha256).hexdigest()


def audit_token(secret: bytes, event_id: str) -> str:
    """hex HMAC-SHA256(secret, b"audit:" + event_id)."""
    return _hmac_hex(secret, b"audit:", event_id)


def pseudonym(secret: bytes, unit: str) -> str:
    """hex HMAC-SHA256(secret, b"unit:" + unit)."""
    return _hmac_hex(secret, b"unit:", unit)


def counterfeit_token(secret: bytes, release_id: str, class_id: str, n: int) -> str:
    """hex HMAC-SHA256(secret, b"counterfeit:" + release_id + "/" + class_id + "/" + n)."""
    return _hmac_hex(secret, b"counterfeit:", f"{release_id}/{class_id}/{n}")


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


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, str) else str(value)


def _as_float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


# ----------------------------------------------------------------------------------------------- hierarchy
class Hierarchy:
    """Label -> parent map from the contract's JSON tree (nested dicts, lists of leaves) or an ARX CSV."""

    def __init__(self, tree: Any = None, chains: Iterable[list[str]] | None = None):
        self.parent: dict[str, str | None] = {}
        self.roots: set[str] = set()
        if tree is not None:
            self._walk(tree, None)
        for chain in chains or ():
            chain = [c for c in chain if c != ""]
            for child, par in zip(chain, chain[1:]):
                self.parent.setdefault(child, par)
            if chain:
                self.parent.setdefault(chain[-1], None)
                self.roots.add(chain[-1])

    def _walk(self, node: Any, parent: str | None) -> None:
        if isinstance(node, dict):
            for key, sub in node.items():
                self.parent[str(key)] = parent
                if parent is None:
                    self.roots.add(str(key))
                self._walk(sub, str(key))
        elif isinstance(node, list):
            for item in node:
                if isinstance(item, (dict, list)):
                    self._walk(item, parent)
                else:
                    self.parent[str(item)] = parent
                    if parent is None:
                        self.roots.add(str(item))

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
        out, cur, seen = [], label, set()
        while cur is not None and cur not in seen:
            out.append(cur)
            seen.add(cur)
            cur = self.parent.get(cur)
        return out

    def covers(self, label: str, value: str) -> bool:
        if label == "*" or label in self.roots:
            return True
        return value in self.parent and label in self.ancestors_or_self(value)


# ----------------------------------------------------------------------------------------------- config
@dataclass
class QISpec:
    """One quasi-identifier: output key, field (path or list of paths), kind, hierarchy, domain bounds."""

    name: str
    field: str | list[str]
    kind: str
    hierarchy: Any = None  # contract JSON dict, or a Hierarchy
    lower: Any = None
    upper: Any = None

    def __post_init__(self) -> None:
        if self.hierarchy is not None:
            self.hierarchy = Hierarchy.from_obj(self.hierarchy)

    @property
    def fields(self) -> list[str]:
        return [self.field] if isinstance(self.field, str) else list(self.field)


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

    def __post_init__(self) -> None:
        self.quasi_identifiers = [q if isinstance(q, QISpec) else QISpec(*q) for q in self.quasi_identifiers]
        if self.privacy_unit not in self.identifier_fields:
            self.identifier_fields = [self.privacy_unit, *self.identifier_fields]

    @classmethod
    def from_toml(cls, path: str | Path) -> "AuditConfig":
        path = Path(path)
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
        stream, anon = raw.get("stream", {}), raw.get("anonymization", {})
        ids = raw.get("identifiers", {})
        qis = []
        for q in raw.get("quasi_identifiers", []):
            hier = None
            if q.get("hierarchy"):
                hier = Hierarchy.load((path.parent / q["hierarchy"]).resolve())
            qis.append(QISpec(q["name"], q["field"], q["kind"], hier, q.get("lower"), q.get("upper")))
        identifiers = list(dict.fromkeys([*ids.get("drop", []), *ids.get("pseudonymize", [])]))
        return cls(
            k=int(anon["k"]),
            privacy_unit=stream["privacy_unit"],
            identifier_fields=identifiers,
            quasi_identifiers=qis,
            sensitive_fields=list(raw.get("sensitive", {}).get("fields", [])),
            stream=stream.get("name"),
            event_time=stream.get("event_time", "event_time"),
            m=int(anon["m"]) if anon.get("m") is not None else None,
            invariant=raw.get("sensitive", {}).get("invariant"),
        )


# ----------------------------------------------------------------------------------------------- outputs
@dataclass
class AuditOutputs:
    """Published outputs of one stream (possibly with duplicates from restarted workers)."""

    records: list[dict] = field(default_factory=list)
    manifests: list[dict] = field(default_factory=list)
    deadletters: list[dict] = field(default_factory=list)
    malformed: list[Any] = field(default_factory=list)  # output messages that were not JSON objects


def _outputs_part(outputs: Any, name: str) -> list:
    if isinstance(outputs, dict):
        return list(outputs.get(name) or [])
    return list(getattr(outputs, name, None) or [])


# ----------------------------------------------------------------------------------------------- report
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


class _Check:
    """Collects violations (counted by kind, first MAX_EXAMPLES kept) and extra details."""

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


# ----------------------------------------------------------------------------------------------- raw input
@dataclass
class _Raw:
    source: tuple[str, int, int]
    event: dict | None
    token: str | None
    unit: str | None


def _source_key(src: Any) -> tuple[str, int, int] | None:
    try:
        if isinstance(src, dict):
            return (str(src["topic"]), int(src["partition"]), int(src["offset"]))
        topic, partition, offset = src
        return (str(topic), int(partition), int(offset))
    except (KeyError, TypeError, ValueError):
        return None


def _parse_raw(raw_events: Iterable, secret: bytes, cfg: AuditConfig) -> list[_Raw]:
    out = []
    for source, payload in raw_events:
        event = None
        try:
            text = payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else payload
            obj = json.loads(text) if isinstance(text, str) else text
            if isinstance(obj, dict):
                event = obj
        except (UnicodeDecodeError, ValueError, TypeError):
            event = None
        eid = event.get("event_id") if event else None
        token = audit_token(secret, eid) if isinstance(eid, str) and eid else None
        unit = _as_text(get_path(event, cfg.privacy_unit)) if event else None
        out.append(_Raw(_source_key(source), event, token, unit))
    return out


# ----------------------------------------------------------------------------------------------- dedupe
def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _dedupe(records: list[dict], manifests: list[dict], chk: _Check) -> tuple[list[dict], list[dict]]:
    """Keep one copy per release_id (manifests) and per (release_id, audit_token) (records)."""
    seen_m: dict[Any, tuple[str, dict]] = {}
    for m in manifests:
        rid = m.get("release_id")
        body = {k: v for k, v in m.items() if k not in _VOLATILE_MANIFEST_KEYS}
        c = _canon(body)
        if rid in seen_m:
            if seen_m[rid][0] != c:
                chk.fail("conflicting duplicate release", release_id=rid, what="manifest")
            chk.details["duplicate_manifests"] = chk.details.get("duplicate_manifests", 0) + 1
            continue
        seen_m[rid] = (c, m)
    seen_r: dict[tuple, tuple[str, dict]] = {}
    for r in records:
        key = (r.get("release_id"), r.get("audit_token"))
        c = _canon(r)
        if key in seen_r:
            if seen_r[key][0] != c:
                chk.fail("conflicting duplicate release", release_id=key[0], what="record", audit_token=key[1])
            chk.details["duplicate_records"] = chk.details.get("duplicate_records", 0) + 1
            continue
        seen_r[key] = (c, r)
    chk.details.setdefault("duplicate_manifests", 0)
    chk.details.setdefault("duplicate_records", 0)
    return [v[1] for v in seen_r.values()], [v[1] for v in seen_m.values()]


# ----------------------------------------------------------------------------------------------- checks
def _check_k(cfg: AuditConfig, records: list[dict], manifests: list[dict], by_token: dict[str, _Raw],
             fakes: dict[str, tuple] | None = None) -> dict:
    chk = _Check()
    fakes = fakes or {}
    units_all: dict[Any, set] = defaultdict(set)
    units_rel: dict[tuple, set] = defaultdict(set)
    qi_of_class: dict[Any, str] = {}
    counterfeit = 0
    for r in records:
        cid, rid = r.get("class_id"), r.get("release_id")
        raw = by_token.get(r.get("audit_token"))
        if raw is None and fakes.get(r.get("audit_token")) == (rid, cid):
            counterfeit += 1        # announced counterfeit: no individual (its qi must still be the class's)
        elif raw is None:
            chk.fail("record of unknown event", release_id=rid, class_id=cid, audit_token=r.get("audit_token"))
        elif raw.unit is not None:
            units_all[cid].add(raw.unit)
            units_rel[(rid, cid)].add(raw.unit)
        else:
            units_all.setdefault(cid, set())
            units_rel.setdefault((rid, cid), set())
        q = _canon(r.get("qi"))
        if qi_of_class.setdefault(cid, q) != q:
            chk.fail("class with inconsistent generalization", class_id=cid, release_id=rid)
    created: dict[Any, Any] = {}
    for m in manifests:
        for c in m.get("classes") or []:
            if not c.get("reused"):
                created.setdefault(c.get("class_id"), m.get("release_id"))
    counts = {}
    for cid, units in units_all.items():
        n = len(units)
        counts[cid] = n
        if n < cfg.k:
            chk.fail("class below k (all releases)", class_id=cid, individuals=n, k=cfg.k)
        rid = created.get(cid)
        if rid is None:
            chk.fail("class without creating release", class_id=cid)
        else:
            n0 = len(units_rel.get((rid, cid), ()))
            if n0 < cfg.k:
                chk.fail("class below k at creation", class_id=cid, release_id=rid, individuals=n0, k=cfg.k)
    chk.details.update(k=cfg.k, classes=len(counts), min_individuals=min(counts.values()) if counts else None,
                       counterfeit_records=counterfeit)
    return chk.result()


def _needles(cfg: AuditConfig, raws: list[_Raw], secret: bytes) -> tuple[dict[str, str], dict[str, str]]:
    """(exact-value needles -> description, hex prefixes/pseudonyms -> description)."""
    allow: set[str] = set()
    for q in cfg.quasi_identifiers:
        if q.hierarchy is not None:
            allow.update(q.hierarchy.parent)
    legit_sensitive = [f for f in cfg.sensitive_fields if f not in cfg.identifier_fields]
    exact: dict[str, str] = {}
    hexes: dict[str, str] = {}
    for raw in raws:
        if raw.event is None:
            continue
        for f in legit_sensitive:
            v = _as_text(get_path(raw.event, f))
            if v is not None:
                allow.add(v)
    for raw in raws:
        if raw.event is None:
            continue
        for f in cfg.identifier_fields:
            v = _as_text(get_path(raw.event, f))
            if v is not None and len(v) >= MIN_NEEDLE_LEN:
                exact.setdefault(v, f"raw {f}")
        if raw.unit is not None:
            p = pseudonym(secret, raw.unit)
            hexes[p] = "pseudonym"
            hexes.setdefault(p[:32], "pseudonym[:32]")
            hexes.setdefault(p[:16], "pseudonym[:16]")
    for v in allow:
        exact.pop(v, None)
    return exact, hexes


def _strings(obj: Any, path: str = ""):
    """Yield (path, string) for every string value and dict key, recursively."""
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str):
                yield f"{path}.<key>", k
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _strings(v, f"{path}[{i}]")


def _check_leaks(cfg: AuditConfig, records: list[dict], manifests: list[dict], raws: list[_Raw],
                 secret: bytes, fakes: dict[str, tuple] | None = None) -> dict:
    chk = _Check()
    exact, hexes = _needles(cfg, raws, secret)
    tokens_known = {r.token for r in raws if r.token is not None} | set(fakes or ())

    def leaks_in(s: str) -> tuple[str, ...]:
        found = [f"leaked {exact[t]}" for t in {s, *_SPLIT_RE.split(s)} if t in exact]
        if s not in tokens_known:  # an audit token is an HMAC of its own: no pseudonym inside
            for run in _HEX_RUN_RE.findall(s):
                for i in range(len(run) - 15):
                    if run[i:i + 16] in hexes:  # every needle starts with its pseudonym's 16-char prefix
                        n = next(n for n in (64, 32, 16) if run[i:i + n] in hexes)
                        found.append(f"leaked {hexes[run[i:i + n]]}")
        return tuple(found)  # () is a shared singleton: the cache stays small

    cache: dict[str, tuple[str, ...]] = {}  # keys, labels and times repeat across records
    scanned = 0
    for kind, items in (("record", records), ("manifest", manifests)):
        for item in items:
            for path, s in _strings(item):
                scanned += 1
                found = cache.get(s)
                if found is None:
                    found = cache[s] = leaks_in(s)
                for what in found:
                    chk.fail(what, where=kind, release_id=item.get("release_id"), path=path)
    chk.details.update(strings_scanned=scanned, identifier_values=len(exact), pseudonym_needles=len(hexes))
    return chk.result()


def _raw_qi(q: QISpec, event: dict) -> Any:
    if q.kind == "geopoint":
        fs = q.fields
        return (_as_float(get_path(event, fs[0])), _as_float(get_path(event, fs[1]))) if len(fs) == 2 else (None, None)
    for f in q.fields:
        v = get_path(event, f)
        if v is not None:
            return v
    return None


def _is_full(q: QISpec, pub: Any) -> bool:
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
    if q.kind == "geopoint" and isinstance(q.lower, list) and isinstance(q.upper, list):
        try:
            return (pub["lat"][0] <= q.lower[0] + EPS and pub["lat"][1] >= q.upper[0] - EPS
                    and pub["lon"][0] <= q.lower[1] + EPS and pub["lon"][1] >= q.upper[1] - EPS)
        except (KeyError, TypeError, IndexError):
            return False
    if q.lower is not None and q.upper is not None:
        if q.kind == "timestamp":
            lo, hi, ql, qu = (parse_time(pub.get("from")), parse_time(pub.get("to")),
                              parse_time(q.lower), parse_time(q.upper))
            return None not in (lo, hi, ql, qu) and lo <= ql and hi >= qu
        lo, hi = _as_float(pub.get("from")), _as_float(pub.get("to"))
        return lo is not None and hi is not None and lo <= float(q.lower) + EPS and hi >= float(q.upper) - EPS
    return False


def _covers(q: QISpec, pub: Any, value: Any) -> tuple[bool, str]:
    if value is None or value == (None, None):
        return _is_full(q, pub), "null raw value"
    if pub is None:
        return True, ""  # fully suppressed attribute reveals nothing and is trivially true
    if not isinstance(pub, dict):
        return False, "malformed generalization"
    if q.kind == "timestamp":
        t, lo, hi = parse_time(value), parse_time(pub.get("from")), parse_time(pub.get("to"))
        if None in (t, lo, hi):
            return False, "unparseable time"
        return lo <= t <= hi, "time interval"
    if q.kind == "numeric":
        x, lo, hi = _as_float(value), _as_float(pub.get("from")), _as_float(pub.get("to"))
        if None in (x, lo, hi):
            return False, "non-numeric bound or value"
        return lo - EPS <= x <= hi + EPS, "numeric interval"
    if q.kind in ("categorical", "station"):
        label, v = pub.get("label"), _as_text(value)
        if not isinstance(label, str) or v is None:
            return False, "missing label"
        if q.hierarchy is None:
            return label in ("*", v), "label"
        return q.hierarchy.covers(label, v), "label not the value or an ancestor"
    if q.kind == "geopoint":
        lat, lon = value
        if lat is None or lon is None:
            return _is_full(q, pub), "null raw value"
        try:
            (a0, a1), (o0, o1) = pub["lat"], pub["lon"]
            ok = a0 - EPS <= lat <= a1 + EPS and o0 - EPS <= lon <= o1 + EPS
        except (KeyError, TypeError, ValueError):
            return False, "malformed box"
        return ok, "box"
    return False, f"unknown QI kind {q.kind!r}"


def _check_coverage(cfg: AuditConfig, records: list[dict], by_token: dict[str, _Raw]) -> dict:
    chk = _Check()
    checked = 0
    for r in records:
        raw = by_token.get(r.get("audit_token"))
        if raw is None or raw.event is None:
            continue  # reported by k / accounting
        # A raw event type beside a class box would split the class (contracts.md section 5): it may appear
        # only generalized, as a configured QI.
        if "event_type" in r:
            chk.fail("raw event_type published outside the QIs", release_id=r.get("release_id"),
                     audit_token=r.get("audit_token"))
        qi = r.get("qi") or {}
        for q in cfg.quasi_identifiers:
            checked += 1
            value = _raw_qi(q, raw.event)
            ok, why = _covers(q, qi.get(q.name), value)
            if not ok:
                chk.fail(f"{q.name}: {why}", release_id=r.get("release_id"), class_id=r.get("class_id"),
                         audit_token=r.get("audit_token"), published=qi.get(q.name))
    chk.details.update(records=len(records), qi_values_checked=checked)
    return chk.result()


def _token_list(obj: Any) -> list[str]:
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _token_list(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _token_list(v)]
    return [obj] if isinstance(obj, str) else []


def _check_accounting(raws: list[_Raw], records: list[dict], manifests: list[dict],
                      deadletters: list[dict], fakes: dict[str, tuple] | None = None) -> tuple[dict, dict]:
    chk = _Check()
    fakes = fakes or {}
    raw_tokens = {r.token for r in raws if r.token is not None}
    # places per token (published / suppressed / deferred) and per source (dead-lettered)
    placed: dict[str, list[str]] = defaultdict(list)
    counterfeit = 0
    for r in records:
        t = r.get("audit_token")
        if t not in raw_tokens and fakes.get(t) == (r.get("release_id"), r.get("class_id")):
            counterfeit += 1        # announced counterfeit record: no input event, outside the equation
            continue
        placed[t].append(f"published:{r.get('release_id')}")
    suppressed_by_reason: Counter = Counter()
    for m in manifests:
        for reason, toks in (m.get("suppressed_tokens") or {}).items():
            for t in _token_list(toks):
                placed[t].append(f"suppressed:{reason}")
    latest: dict[tuple, dict] = {}
    for m in manifests:
        key = (m.get("stream"), m.get("partition"))
        if key not in latest or (m.get("seq") or 0) > (latest[key].get("seq") or 0):
            latest[key] = m
    for m in latest.values():
        for t in _token_list(m.get("deferred_tokens")):
            placed[t].append("deferred")
    dl_by_source: Counter = Counter()
    for d in deadletters:
        src = _source_key(d.get("source"))
        dl_by_source[src] += 1
    sources = Counter(r.source for r in raws)
    for src, n in sources.items():
        if n > 1:
            chk.fail("raw source read twice", source=src)
    for src in dl_by_source:
        if src not in sources:
            chk.fail("dead letter of unknown source", source=src)
    raws_by_token: dict[str, list[_Raw]] = defaultdict(list)
    outcome: Counter = Counter()
    for raw in raws:
        n_dl = dl_by_source.get(raw.source, 0)
        if n_dl:
            outcome["dead_lettered"] += 1
            if n_dl > 1:
                outcome["duplicated"] += 1
                chk.fail("duplicated", source=raw.source, places=["deadletter"] * n_dl)
        if raw.token is None:
            if not n_dl:
                outcome["lost"] += 1
                chk.fail("lost", source=raw.source, note="unparseable or no event_id, not dead-lettered")
            continue
        raws_by_token[raw.token].append(raw)
    for token, group in raws_by_token.items():
        open_ = [r for r in group if not dl_by_source.get(r.source)]
        places = placed.get(token, [])
        for p in places[: len(open_)]:
            kind = p.split(":", 1)[0]
            outcome[kind] += 1
            if kind == "suppressed":
                suppressed_by_reason[p.split(":", 1)[1]] += 1
        if len(places) < len(open_):
            for r in open_[len(places):]:
                outcome["lost"] += 1
                chk.fail("lost", source=r.source, audit_token=token)
        elif len(places) > len(open_):
            outcome["duplicated"] += len(places) - len(open_)
            chk.fail("duplicated", source=group[0].source, audit_token=token, places=places)
    unknown = [t for t in placed if t not in raws_by_token]
    for t in unknown:
        chk.fail("token of no raw event", audit_token=t, places=placed[t])
    counts = {
        "events_in": len(raws), "published": outcome["published"], "suppressed": outcome["suppressed"],
        "suppressed_by_reason": dict(suppressed_by_reason), "dead_lettered": outcome["dead_lettered"],
        "deferred": outcome["deferred"], "lost": outcome["lost"], "duplicated": outcome["duplicated"],
        "unknown_tokens": len(unknown), "counterfeit_records": counterfeit,
    }
    balance = counts["published"] + counts["suppressed"] + counts["dead_lettered"] + counts["deferred"]
    equation = f"{counts['events_in']} == {counts['published']} + {counts['suppressed']} + " \
               f"{counts['dead_lettered']} + {counts['deferred']}"
    chk.details.update(counts, equation=equation, balanced=balance == counts["events_in"])
    return chk.result(extra_ok=balance == counts["events_in"]), counts


def _check_consistency(cfg: AuditConfig, records: list[dict], manifests: list[dict], malformed: list,
                       fakes: dict[str, tuple] | None = None) -> dict:
    chk = _Check()
    fakes = fakes or {}
    fake_per_class: Counter = Counter(fakes[r.get("audit_token")] for r in records
                                      if fakes.get(r.get("audit_token")) == (r.get("release_id"), r.get("class_id")))
    for m in malformed[:MAX_EXAMPLES]:
        chk.fail("malformed output message", value=str(m)[:200])
    if len(malformed) > MAX_EXAMPLES:
        chk.violations["malformed output message"] += len(malformed) - MAX_EXAMPLES
    per_release: Counter = Counter()
    per_class: Counter = Counter()
    qi_by_class: dict[tuple, Any] = {}
    for r in records:
        per_release[r.get("release_id")] += 1
        per_class[(r.get("release_id"), r.get("class_id"))] += 1
        qi_by_class.setdefault((r.get("release_id"), r.get("class_id")), r.get("qi"))
    classes_of_release: dict[Any, set] = defaultdict(set)
    for rid, cid in per_class:
        classes_of_release[rid].add(cid)
    known = {m.get("release_id") for m in manifests}
    for rid in per_release:
        if rid not in known:
            chk.fail("records without manifest", release_id=rid, records=per_release[rid])
    creators: Counter = Counter()
    for m in manifests:
        rid = m.get("release_id")
        if cfg.stream is not None and m.get("stream") not in (None, cfg.stream):
            chk.fail("manifest of another stream", release_id=rid)
        if m.get("k") is not None and m.get("k") != cfg.k:
            chk.fail("manifest k differs from config", release_id=rid, manifest_k=m.get("k"), k=cfg.k)
        classes = m.get("classes") or []
        total = 0
        listed = set()
        fake_total = 0
        for c in classes:
            cid = c.get("class_id")
            listed.add(cid)
            n = c.get("records") or 0
            total += n
            n_fake = c.get("counterfeit_records") or 0
            fake_total += n_fake
            if fake_per_class.get((rid, cid), 0) != n_fake:
                chk.fail("class counterfeit records differ from manifest", release_id=rid, class_id=cid,
                         manifest=n_fake, published=fake_per_class.get((rid, cid), 0))
            if not c.get("reused"):
                creators[cid] += 1
            if per_class.get((rid, cid), 0) != n:
                chk.fail("class record count differs", release_id=rid, class_id=cid, manifest=n,
                         published=per_class.get((rid, cid), 0))
            if (rid, cid) in qi_by_class and "generalization" in c and \
                    _canon(c["generalization"]) != _canon(qi_by_class[(rid, cid)]):
                chk.fail("class generalization differs from records", release_id=rid, class_id=cid)
        for cid in classes_of_release.get(rid, ()):
            if cid not in listed:
                chk.fail("record class not in manifest", release_id=rid, class_id=cid)
        actual = per_release.get(rid, 0)
        if total != actual:
            chk.fail("classes' records do not sum to published records", release_id=rid, sum=total, actual=actual)
        if m.get("published") is not None and m.get("published") != actual - fake_total:
            chk.fail("published count differs", release_id=rid, manifest=m.get("published"),
                     actual=actual - fake_total)
        if m.get("counterfeit_records") is not None and m.get("counterfeit_records") != fake_total:
            chk.fail("release counterfeit records differ from its classes", release_id=rid,
                     manifest=m.get("counterfeit_records"), classes=fake_total)
        for reason, toks in (m.get("suppressed_tokens") or {}).items():
            n = (m.get("suppressed") or {}).get(reason)
            if n is not None and n != len(_token_list(toks)):
                chk.fail("suppressed count differs from tokens", release_id=rid, reason=reason)
        if isinstance(m.get("deferred"), int) and m.get("deferred_tokens") is not None \
                and m["deferred"] != len(_token_list(m["deferred_tokens"])):
            chk.fail("deferred count differs from tokens", release_id=rid)
    for cid, n in creators.items():
        if n > 1:
            chk.fail("class created in more than one release", class_id=cid, releases=n)
    chk.details.update(releases=len(manifests), records=len(records))
    return chk.result()


# ----------------------------------------------------------------------------------------------- entry point
def audit(raw_events: Iterable, outputs: Any, secret: bytes, config_view: AuditConfig) -> AuditReport:
    """Audit published outputs against the raw input. See the module docstring for the checks.

    raw_events: iterable of ``((topic, partition, offset), payload)`` with payload bytes/str (may be malformed).
    outputs: dict or object with lists ``records``, ``manifests``, ``deadletters`` (and optional ``malformed``).
    """
    cfg = config_view
    if isinstance(secret, str):
        secret = secret.encode()
    records = copy.deepcopy(_outputs_part(outputs, "records"))
    manifests = copy.deepcopy(_outputs_part(outputs, "manifests"))
    deadletters = _outputs_part(outputs, "deadletters")
    if cfg.stream is not None:
        manifests = [m for m in manifests if m.get("stream") in (None, cfg.stream)]
        deadletters = [d for d in deadletters if d.get("stream") in (None, cfg.stream)]
    raws = _parse_raw(raw_events, secret, cfg)
    by_token: dict[str, _Raw] = {}
    for raw in raws:
        if raw.token is not None:
            by_token.setdefault(raw.token, raw)

    dup = _Check()
    records, manifests = _dedupe(records, manifests, dup)
    checks = {"duplicates": dup.result()}
    fakes = counterfeit_tokens(manifests, secret)
    checks["k"] = _check_k(cfg, records, manifests, by_token, fakes)
    checks["leaks"] = _check_leaks(cfg, records, manifests, raws, secret, fakes)
    checks["coverage"] = _check_coverage(cfg, records, by_token)
    checks["accounting"], counts = _check_accounting(raws, records, manifests, deadletters, fakes)
    checks["consistency"] = _check_consistency(cfg, records, manifests, _outputs_part(outputs, "malformed"), fakes)
    if cfg.m is not None:
        checks["m_invariance"] = _check_m_invariance(cfg, records, manifests, raws, secret)
    cfg_chk = _Check()
    for f in cfg.sensitive_fields:
        if f in cfg.identifier_fields:
            cfg_chk.fail("identifier configured as sensitive (published verbatim)", field=f)
    if cfg_chk.violations:
        checks["config"] = cfg_chk.result()

    summary = {**{k: v for k, v in counts.items() if k != "suppressed_by_reason"},
               "suppressed_by_reason": counts["suppressed_by_reason"], "releases": len(manifests),
               "records": len(records), "classes": checks["k"]["classes"],
               "min_individuals": checks["k"]["min_individuals"], "k": cfg.k}
    if cfg.m is not None:
        summary.update({f"m_invariance_{k}" if k in ("releases", "classes", "individuals") else k: v
                        for k, v in checks["m_invariance"]["summary"].items()})
    return AuditReport(passed=all(c["passed"] for c in checks.values()), checks=checks, summary=summary)


def _check_m_invariance(cfg: AuditConfig, records: list[dict], manifests: list[dict], raws: list[_Raw],
                        secret: bytes) -> dict:
    """The independent m-invariance checker (:mod:`.minvariance`, same package: nothing of the engine)."""
    from .minvariance import MInvarianceConfig, check_m_invariance   # it imports this module

    chk = _Check()
    if not cfg.invariant:
        chk.fail("anonymization.m is set but sensitive.invariant is not")
        return chk.result()
    mcfg = MInvarianceConfig(m=cfg.m, privacy_unit=cfg.privacy_unit, invariant=cfg.invariant, stream=cfg.stream)
    rep = check_m_invariance(records, manifests, [r.event for r in raws if r.event is not None], secret, mcfg)
    return {"passed": rep.passed, "violations": sum(c["violations"] for c in rep.checks.values()),
            "summary": rep.summary, "checks": rep.checks,
            "examples": [ex for c in rep.checks.values() for ex in c["examples"]][:MAX_EXAMPLES]}


def qi_value(q: QISpec, event: dict) -> Any:
    """The raw value of quasi-identifier ``q`` in a raw event (a (lat, lon) pair for a geopoint)."""
    return _raw_qi(q, event)


def covers(q: QISpec, published: Any, value: Any) -> bool:
    """Whether a published generalization of ``q`` covers a raw value (used by the audit and the attacks)."""
    return _covers(q, published, value)[0]
