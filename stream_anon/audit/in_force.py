"""The settings each release was made under, read from the manifests alone, and the config that judges it.

A worker changes a guarantee setting only through an accepted configuration change (``stream-anon worker
--accept-config-change``) and writes it into the next manifest of each partition (``settings_changed``:
``anonymization.k 10 -> 3``, a hierarchy as ``sha256:<16 hex>`` of its content). So the settings in force are known
per release without trusting the worker: walking a partition's manifests from the newest back, they start as the
audit config's and switch at each recorded change to its old side. Each release is then judged by the config (the
audit config, or one given with ``--earlier-config``) whose settings equal those in force.

The settings compared are those the record and class checks read, computed here by the audit's own code from its
own config reading (never ``stream_anon.guarantees``; tests/audit/test_audit_in_force.py shows both agree on the bundled
configs):

- ``anonymization.k`` (the ``k`` check, a severity rule's k_min, the health figures);
- ``anonymization.criteria[<i>]``: an l-diversity kind's kind, field and l (the ``l_diversity`` check), a severity
  rule's field, map, k_min, default (the map's largest when none is given), cap, l_floor and diversity (``severity``);
- ``quasi_identifiers.<name>.hierarchy``: the content digest (:meth:`.primitives.Hierarchy.content_digest`;
  ``coverage`` and the labels ``leaks`` allows), ``.fields``, ``.kind``, ``.lower`` and ``.upper`` (a time as epoch
  seconds: ``coverage``), ``.granularity`` (the numeric bounds of ``leaks``);
- ``sensitive.fields``, ``identifiers.drop`` and ``identifiers.pseudonymize`` (the values ``leaks`` searches for and
  those it allows).

Every other recorded change is ignored here: windows, reuse, time granularity, the sensitive domains (no check reads
them) and the DP settings (the ``dp`` check follows them from the rows: :mod:`.checks.dp_budget`). The privacy unit,
m, the invariant, the event time and the input mapping never change within a lineage (the worker refuses them in
place): a superseded lineage is judged by its own (:func:`.lineages.own_settings`). A criterion whose recorded text an
older worker cut to 80 characters matches any config.

A release whose settings no given config has is judged by the audit config with the k in force (k needs no config:
the k of the manifests' walk, as when no earlier config is given); each check that reads a setting it lacks fails
with one line naming the release, the setting and its value (:meth:`SettingsInForce.unmatched_lines`). A manifest
whose ``k`` differs from the k in force (a change the worker did not record, or an audit given another config than
the one in force), a recorded change whose new side is not the setting in force, and a settings fingerprint that
changes between two releases of a partition without a recorded change (:func:`_check_fingerprint`) are violations of
``consistency``. Published classes are never reused across an accepted change (the worker retires them), so a class is
judged by the settings of the release that created it.

>>> from stream_anon.audit.config import AuditConfig
>>> new, old = AuditConfig(k=3, privacy_unit="card"), AuditConfig(k=10, privacy_unit="card", source="old.toml")
>>> ms = [{"release_id": "a", "partition": 0, "seq": 1, "k": 10},
...       {"release_id": "b", "partition": 0, "seq": 2, "k": 3, "settings_changed": ["anonymization.k 10 -> 3"]}]
>>> s = settings_in_force(ms, [new, old])
>>> s.k_of, s.config_of("a") is old, s.problems, s.changes[0]["change"]
({'b': 3, 'a': 10}, True, [], 'anonymization.k 10 -> 3')
>>> settings_in_force(ms, [AuditConfig(k=10, privacy_unit="card")]).problems[0][0]
'manifest k differs from the k in force'
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .config import L_KINDS, AuditConfig, LDiversitySpec, SeveritySpec
from .primitives import parse_time

K = "anonymization.k"
_QI = r"quasi_identifiers\..+\.(hierarchy|granularity|lower|upper|fields|kind)"
TRACKED = re.compile(rf"^(anonymization\.k|anonymization\.criteria\[\d+\]|{_QI}|sensitive\.fields"
                      r"|identifiers\.(drop|pseudonymize))$")
# (key prefix, key ends, the check that reads the setting); a criterion: l_diversity or severity by its kind
_CHECK_OF = (("quasi_identifiers.", (".hierarchy", ".lower", ".upper", ".fields", ".kind"), "coverage"),
             ("quasi_identifiers.", (".granularity",), "leaks"), ("sensitive.fields", ("",), "leaks"),
             ("identifiers.", ("",), "leaks"), ("anonymization.criteria[", ("]",), "l_diversity"))
SEVERITY = "severity"


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


ABSENT = _Marker("(absent)")     # the setting did not exist (a criterion added by the change)
ANY = _Marker("(any)")           # a value the audit cannot read or does not compare: matches every config


def _criterion(c: Any) -> Any:
    if isinstance(c, LDiversitySpec):
        return (c.kind, c.field, float(c.l))
    if isinstance(c, SeveritySpec):
        return (SEVERITY, c.field, tuple(sorted((str(v), float(s)) for v, s in c.severity.items())), int(c.k_min),
                float(c.default), c.cap, int(c.l_floor), bool(c.diversity))
    return ANY


def _bound(q: Any, value: Any) -> Any:
    """A quasi-identifier's domain bound as the worker records it: its numbers (a time as epoch seconds)."""
    values = value if isinstance(value, (list, tuple)) else () if value is None else (value,)
    out = []
    for v in values:
        if isinstance(v, str):
            v = parse_time(v) if q.kind == "timestamp" else None
        if isinstance(v, datetime):
            v = (v if v.tzinfo else v.replace(tzinfo=timezone.utc)).timestamp()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return ANY
        out.append(float(v))
    return tuple(out)


def audit_settings(cfg: AuditConfig) -> dict[str, Any]:
    """The settings of a config the walk compares (module docstring), computed from the audit's own reading.

    >>> from stream_anon.audit.primitives import QISpec
    >>> s = audit_settings(AuditConfig(k=5, privacy_unit="u", quasi_identifiers=[QISpec("age", "age", "numeric",
    ...                                                                              lower=0, upper=99)]))
    >>> s["quasi_identifiers.age.lower"], s["quasi_identifiers.age.fields"], s["identifiers.drop"]
    ((0.0,), ('age',), ())
    """
    out: dict[str, Any] = {K: cfg.k}
    for i, c in enumerate(cfg.criteria):
        out[f"anonymization.criteria[{i}]"] = _criterion(c)
    for q in cfg.quasi_identifiers:
        at = f"quasi_identifiers.{q.name}."
        out[at + "hierarchy"] = q.hierarchy.content_digest() if q.hierarchy is not None else None
        out[at + "granularity"] = q.granularity
        out[at + "lower"], out[at + "upper"] = _bound(q, q.lower), _bound(q, q.upper)
        out[at + "fields"], out[at + "kind"] = tuple(q.fields), q.kind
    out["sensitive.fields"] = tuple(cfg.sensitive_fields)
    out["identifiers.drop"], out["identifiers.pseudonymize"] = tuple(cfg.drop), tuple(cfg.pseudonymize)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _texts(value: Any) -> Any:
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return tuple(value) if ok else ANY


def _severity(value: dict) -> Any:
    """A recorded severity rule as :func:`_criterion` holds one (the default: the map's largest when none)."""
    sev, default, cap = value.get("severity"), value.get("default_severity"), value.get("cap")
    if not (isinstance(sev, dict) and sev and all(_number(s) for s in sev.values()) and _number(value.get("k_min"))
            and isinstance(value.get("field"), str) and (default is None or _number(default))
            and (cap is None or _number(cap)) and _number(value.get("l_floor"))
            and isinstance(value.get("diversity"), bool)):
        return ANY
    return (SEVERITY, value["field"], tuple(sorted((str(v), float(s)) for v, s in sev.items())),
            int(value["k_min"]), float(default if default is not None else max(sev.values())), cap,
            int(value["l_floor"]), value["diversity"])


def read_value(key: str, text: str) -> Any:
    """One side of a recorded change (as the worker shows it: a string as is, anything else as JSON; older workers
    cut it to 80 characters) as :func:`audit_settings` holds it.

    >>> read_value("anonymization.criteria[0]", '{"field": "fare", "kind": "distinct_l_diversity", "l": 3}')
    ('distinct_l_diversity', 'fare', 3.0)
    >>> read_value("quasi_identifiers.age.granularity", "10.0"), read_value("anonymization.k", "(absent)")
    (10.0, (absent))
    >>> read_value("quasi_identifiers.age.upper", "[99]"), read_value("identifiers.drop", '["card_id"]')
    ((99.0,), ('card_id',))
    """
    if text == "(absent)":
        return ABSENT
    if key == K:
        return int(text) if text.isdigit() else ANY
    if key.endswith(".hierarchy"):
        return None if text == "null" else text
    if key.endswith(".kind") and key.startswith("quasi_identifiers."):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return ANY                                    # cut to 80 characters, or not JSON
    if key.endswith(".granularity"):
        ok = value is None or _number(value)
        return (float(value) if value is not None else None) if ok else ANY
    if key.endswith((".lower", ".upper")):
        ok = isinstance(value, list) and all(_number(v) for v in value)
        return tuple(float(v) for v in value) if ok else ANY
    if key.endswith(".fields") or key.startswith("identifiers."):
        return _texts(value)
    if isinstance(value, dict) and value.get("kind") in L_KINDS and isinstance(value.get("field"), str) \
            and _number(value.get("l")):
        return (value["kind"], value["field"], float(value["l"]))
    if isinstance(value, dict) and value.get("kind") == SEVERITY:
        return _severity(value)
    return ANY


def same(a: Any, b: Any) -> bool:
    """Two values of one setting agree (:data:`ANY` agrees with everything; numbers to 1e-9)."""
    if a is ANY or b is ANY:
        return True
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def _differing(settings: dict, other: dict) -> list[str]:
    return sorted(key for key in set(settings) | set(other)
                  if not same(settings.get(key, ABSENT), other.get(key, ABSENT)))


def check_of(key: str, *values: Any) -> str | None:
    """The check that reads a setting (None: k, which needs no config); a criterion's: ``severity`` when one of
    ``values`` (its values compared) is a severity rule, else ``l_diversity``."""
    check = next((check for head, tails, check in _CHECK_OF if key.startswith(head) and key.endswith(tails)), None)
    if check == "l_diversity" and any(isinstance(v, tuple) and v[:1] == (SEVERITY,) for v in values):
        return SEVERITY
    return check


def _seq(manifest: dict) -> float:
    seq = manifest.get("seq")
    return seq if isinstance(seq, (int, float)) and not isinstance(seq, bool) else float("inf")


@dataclass
class SettingsInForce:
    """The walk's result. ``configs``: the audit config first, then the earlier ones; ``config_index``: release id
    -> the index of the config that judges it (None: no given config has its settings); ``k_of``: release id -> the
    k in force; ``unmatched``: release id -> {setting: the recorded text of its value} for the settings in force
    that the judging config lacks (``unmatched_checks``: release id -> {setting: the check that reads it});
    ``changes``: the recorded changes of the compared settings (partition, release id, change line; ``k_changes``
    those of k); ``problems``: (violation name, details) for ``consistency``."""

    configs: list[AuditConfig]
    config_index: dict = field(default_factory=dict)
    k_of: dict = field(default_factory=dict)
    unmatched: dict = field(default_factory=dict)
    unmatched_checks: dict = field(default_factory=dict)
    changes: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    release_order: list = field(default_factory=list)      # release ids, each partition newest first
    _with_k: dict = field(default_factory=dict, repr=False)

    @property
    def k_changes(self) -> list:
        return [c for c in self.changes if c["change"].startswith(K + " ")]

    def config_of(self, release_id: Any) -> AuditConfig:
        """The config a release is judged by (a release of no manifest: the audit config)."""
        i = self.config_index.get(release_id, 0)
        if i is not None:
            return self.configs[i]
        return self.with_k(self.k_of.get(release_id, self.configs[0].k))

    def with_k(self, k: int) -> AuditConfig:
        """The audit config with another k in force (a severity rule's k_min follows it)."""
        base = self.configs[0]
        if k == base.k:
            return base
        if k not in self._with_k:
            self._with_k[k] = base.with_k(k)
        return self._with_k[k]

    def used(self) -> list[AuditConfig]:
        """Every config some release is judged by (the audit config always)."""
        return [self.configs[0]] + [self.configs[i] for i in sorted({i for i in self.config_index.values() if i})] \
            + [self.with_k(k) for k in sorted({self.k_of[r] for r, i in self.config_index.items() if i is None})
               if k != self.configs[0].k]

    def unmatched_lines(self, check: str) -> list[dict]:
        """One entry per setting value no given config has among those ``check`` reads: ``line`` (``<check>: release
        <id> was made under <setting> <value> ; give the config in force then with --earlier-config``, naming the
        newest such release of the first partition walked), ``setting``, ``value`` and ``releases`` (how many)."""
        groups: dict[tuple, list] = defaultdict(list)
        for rid in self.release_order:
            checks = self.unmatched_checks.get(rid) or {}
            for key, text in (self.unmatched.get(rid) or {}).items():
                if checks.get(key) == check:
                    groups[(key, text)].append(rid)
        return [{"line": f"{check}: release {rids[0]} was made under {key} {text} ; give the config in force then "
                         f"with --earlier-config", "setting": key, "value": text, "releases": len(rids)}
                for (key, text), rids in groups.items()]

    def skipped(self, release_id: Any, check: str) -> set[str]:
        """The settings ``check`` cannot judge ``release_id`` by (no given config has them)."""
        checks = self.unmatched_checks.get(release_id) or {}
        return {key for key in self.unmatched.get(release_id) or {} if checks.get(key) == check}

    def judged_by(self) -> list[dict]:
        """The configs used and how many releases each judged (the text report's lines)."""
        counts = Counter(self.config_index.values())
        out = [{"config": self.configs[i].source or f"config {i}", "earlier": i > 0, "releases": counts.get(i, 0)}
               for i in range(len(self.configs))]
        no_config = [r for r, i in self.config_index.items() if i is None]
        if no_config:
            unmatched = sum(bool(self.unmatched.get(r)) for r in no_config)
            out.append({"config": None, "releases": len(no_config), "unjudged": unmatched,
                        "k": sorted({self.k_of[r] for r in no_config})})
        return out


def _parse(line: Any) -> tuple[str, str, str] | None:
    """``<key> <old> -> <new>`` of a compared setting, else None."""
    if not isinstance(line, str) or " -> " not in line or " " not in line:
        return None
    key, rest = line.split(" ", 1)
    if not TRACKED.match(key):
        return None
    before, after = rest.split(" -> ", 1)
    return key, before, after


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else repr(value) if isinstance(value, _Marker) else json.dumps(value)


def _check_fingerprint(older: dict, newer: dict, problems: list) -> None:
    """The settings fingerprint of a partition's releases changes only at a release that records the change: the
    worker fences every setting it digests (stream_anon.guarantees), so another fingerprint without
    ``settings_changed`` is a change that bypassed the fence (the audit reads the fingerprints, never computes one)."""
    fp, fp_newer = older.get("settings_fingerprint"), newer.get("settings_fingerprint")
    if isinstance(fp, str) and isinstance(fp_newer, str) and fp != fp_newer and not newer.get("settings_changed"):
        problems.append(("settings fingerprint changed without a recorded change",
                         {"release_id": newer.get("release_id"), "fingerprint": fp_newer, "before": fp,
                          "release_before": older.get("release_id")}))


def settings_in_force(manifests, configs: list[AuditConfig]) -> SettingsInForce:
    """Walk each partition's manifests from the newest back (module docstring): the settings in force of every
    release and the config that judges it. ``configs``: the audit config first, then the earlier ones."""
    out = SettingsInForce(list(configs))
    known = [audit_settings(c) for c in out.configs]
    by_partition: dict = defaultdict(list)
    for m in manifests:
        by_partition[(m.get("stream"), m.get("partition"))].append(m)
    for (_, partition), ms in by_partition.items():
        current, text = dict(known[0]), {key: _shown(v) for key, v in known[0].items()}
        newer: dict = {}
        for m in sorted(ms, key=_seq, reverse=True):
            rid = m.get("release_id")
            _check_fingerprint(m, newer, out.problems)
            newer = m
            k = current[K] if isinstance(current.get(K), int) else out.configs[0].k
            if m.get("k") is not None and m.get("k") != k:
                out.problems.append(("manifest k differs from the k in force",
                                     {"release_id": rid, "manifest_k": m.get("k"), "k": k}))
            out.k_of[rid] = k
            out.release_order.append(rid)
            match = next((i for i, s in enumerate(known) if not _differing(current, s)), None)
            out.config_index[rid] = match
            if match is None:
                lacking = {key: text.get(key, "(absent)") for key in _differing(current, known[0]) if key != K}
                if lacking:
                    out.unmatched[rid] = lacking
                    out.unmatched_checks[rid] = {key: check_of(key, current.get(key), known[0].get(key))
                                                 for key in lacking}
            # a manifest may state several changes (accepted on restarts without a release between them), oldest
            # first: walking back in time, the newest is undone first
            for line in reversed(m.get("settings_changed") or []):
                parsed = _parse(line)
                if parsed is None:
                    continue
                key, before, after = parsed
                old, new = read_value(key, before), read_value(key, after)
                if key == K and (old is ANY or new is ANY):
                    continue                                    # not a k change the walk can follow
                out.changes.append({"partition": partition, "release_id": rid, "change": line})
                if not same(new, current.get(key, ABSENT)):
                    name = "recorded k change does not lead to the k in force" if key == K else \
                        "recorded change does not lead to the setting in force"
                    out.problems.append((name, {"release_id": rid, "change": line,
                                                "in_force": text.get(key, "(absent)")}))
                if old is ABSENT:
                    current.pop(key, None)
                    text.pop(key, None)
                else:
                    current[key], text[key] = old, before
    out.changes.reverse()
    return out
