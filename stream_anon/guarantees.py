"""The settings a stream's guarantees depend on, as flat dotted keys, and what changed between two of them.

Each partition's state records carry them (:class:`stream_anon.kafka.partition.PartitionState`); a worker that
finds other settings in force than those the state was written under does not resume the partition silently
(:func:`stream_anon.kafka.state.choose_state`): it halts it with one line per changed setting, unless the change is
accepted explicitly (``stream-anon worker --accept-config-change``), and then the change is recorded in the state and
in the next release manifest.

Guarantee-relevant: k and the criteria, m and its horizon, the windows and deadlines, the time granularity and
reuse policy, each quasi-identifier's kind, fields, bounds, granularity and hierarchy (its content, not its file
name), the sensitive fields, their domains and the invariant, the identifiers, and every DP setting (unit, budget,
period, bounds, epsilons, group domains). What only steers utility or speed (the strategy and its parameters, the
seed, loss limits, alert thresholds) is not.

>>> a = {"anonymization.k": 10, "quasi_identifiers.time.upper": 100.0}
>>> changes(a, {"anonymization.k": 3, "quasi_identifiers.time.upper": 100.0})
['anonymization.k 10 -> 3']
>>> changes(a, {"anonymization.k": 10})
['quasi_identifiers.time.upper 100.0 -> (absent)']
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

ANONYMIZATION = ("k", "window_s", "max_delay_s", "m", "m_horizon_s", "time_granularity_s", "reuse",
                 "reuse_horizon_s", "reuse_max_classes")


def _plain(value):
    """A JSON value of a setting (dataclasses, tuples, hierarchies as content digests)."""
    if hasattr(value, "graph") and hasattr(value, "leaves"):          # a Hierarchy: its content, not its file
        edges = sorted((str(a), str(b)) for a, b in value.graph.edges())
        return "sha256:" + hashlib.sha256(json.dumps([value.root, list(value.leaves), edges]).encode()).hexdigest()[:16]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.compare and not f.name.startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def settings(config) -> dict:
    """The guarantee-relevant settings of a :class:`~stream_anon.config.StreamConfig`: dotted key -> JSON value."""
    out: dict = {}
    a = config.anonymization
    for key in ANONYMIZATION:
        out[f"anonymization.{key}"] = _plain(getattr(a, key))
    for i, criterion in enumerate(a.criteria):
        out[f"anonymization.criteria[{i}]"] = {"kind": criterion.kind, **_plain(criterion)}
    out["stream.allowed_lateness_s"] = config.stream.allowed_lateness_s
    for q in config.quasi_identifiers:
        for key, value in _plain(q).items():
            if key not in ("name", "weight"):               # the weight steers the loss measure only
                out[f"quasi_identifiers.{q.name}.{key}"] = value
    out["sensitive.fields"] = list(config.sensitive)
    out["sensitive.invariant"] = config.invariant_sensitive
    for domain in config.domains:
        out[f"sensitive.domains.{domain.field}"] = _plain(domain)
    out["identifiers.drop"], out["identifiers.pseudonymize"] = list(config.drop), list(config.pseudonymize)
    if config.dp is not None:
        dp = _plain(config.dp)
        aggregates = dp.pop("aggregates", [])
        for key, value in dp.items():
            out[f"dp.{key}"] = value
        for spec in aggregates:
            for key, value in spec.items():
                if key != "name":
                    out[f"aggregates.{spec['name']}.{key}"] = value
    return out


def fingerprint(settings_doc: dict) -> str:
    """A short digest of guarantee settings (:func:`settings`): equal fingerprints, equal settings. Release
    manifests carry it (``settings_fingerprint``) so a reader tells which settings every release was made under.

    >>> fingerprint({"anonymization.k": 10}) == fingerprint({"anonymization.k": 10}) != fingerprint({"anonymization.k": 5})
    True
    """
    text = json.dumps(settings_doc, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _shown(value) -> str:
    text = "(absent)" if value is _ABSENT else json.dumps(value, sort_keys=True) if not isinstance(value, str) \
        else value
    return text if len(text) <= 80 else text[:77] + "..."


_ABSENT = object()


def changes(old: dict, new: dict) -> list[str]:
    """``<key> <old> -> <new>`` for every setting that differs, in key order."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if a != b:
            out.append(f"{key} {_shown(a)} -> {_shown(b)}")
    return out
