"""The settings a stream's guarantees depend on, as flat dotted keys, and what changed between two of them.

Each partition's state records carry them (:class:`stream_anon.worker.partition.PartitionState`); a worker that
finds other settings in force than those the state was written under does not resume the partition silently
(:func:`stream_anon.worker.state.choose_state`): it halts it with one line per changed setting, unless the change is
accepted explicitly (``stream-anon worker --accept-config-change``), and then the change is recorded in the state and
in the next release manifest (:func:`stream_anon.worker.partition.check_change` refuses what the state cannot carry).

The settings are derived from the validated config (:class:`~stream_anon.config.StreamConfig`): every dataclass field
of it and of its sections, recursively, is a setting, except those :data:`NOT_GUARANTEES` names with the reason no
guarantee, audit check or published field's form depends on them (the seed, loss limits, the risk and report
tables; the Kafka connection is no field of it). A field added to the config is therefore fenced until it is
declared otherwise; tests/privacy/test_guarantees.py walks the schema (:func:`schema`) and fails on a field neither
covered nor declared. A hierarchy is recorded by its content, an input lookup table and a DP group's value mapping by a
digest of theirs (:data:`DIGESTED`).

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
import typing
from collections.abc import Mapping

# "<Class>.<field>" of the config's schema -> why no guarantee, no audit check and no published field's form
# depends on it. Every other field is a setting.
NOT_GUARANTEES = {
    "StreamConfig.source": "the path the config was read from",
    "StreamConfig.raw": "the TOML document the validated fields are read from: what it sets is in them",
    "StreamConfig.allow_outside_paths": "where the files the config names may lie: their contents are recorded",
    "StreamSection.name": "the stream's name: a state of another stream is refused on its own (open_partition)",
    "StreamSection.input_topic": "where the input is read: a re-created topic halts on its own "
                                 "(input_topic_recreated)",
    "StreamSection.max_future_s": "a dead-letter rule for far-future event times: it decides which events are "
                                  "processed, and the audit's accounting places every event whatever it is",
    "StreamSection.partitions": "the declared partition count: units are placed by the topic's own count "
                                "(wrong_partition)",
    "StreamSection.input_retention_s": "how long the raw topic keeps data: an alert at start",
    "Anonymization.seed": "the randomness of class search and reuse: which classes, not what each meets",
    "Anonymization.max_class_ncp": "a loss limit: a class above it is suppressed",
    "Anonymization.max_suppression_ratio": "a loss limit: an alert, and the audit's NOT PASSED over the whole run "
                                           "(by the audit config)",
    "Anonymization.m_params": "the m-invariant former's search: which classes, not what each meets",
    "QuasiIdentifier.weight": "weighs the quasi-identifier in the loss measure (NCP) only",
    "FieldSpec.source": "the text of the field's source, for reasons (its content: parts, pointer, const)",
    "FieldSpec.lookup_source": "the name of the lookup table, for reasons (its content: lookup)",
    "FieldSpec.elapsed_source": "the text of the elapsed path, for reasons (its content: elapsed_parts)",
    "InputSpec.raw": "the [input] table the validated fields are read from: what it sets is in them",
    "Limits.max_event_bytes": "the largest message accepted: larger ones are dead-lettered",
    "Limits.duplicate_horizon_s": "how long event ids are remembered to dead-letter copies: a copy let through "
                                  "later is another event, which the audit's accounting finds whatever it is",
    "DPConfig.carried": "an operator's input when a lineage starts (worker --carry-budget), charged once to the "
                        "new ledger, whose state and rows then hold it",
    "RiskConfig.per_release": "whether the release metric carries risk figures: a figure, no guarantee",
    "RiskSettings.population": "the population the risk figures assume: figures beside the releases",
    "RiskSettings.sampling_fraction": "the sampling fraction the risk figures assume: figures beside the releases",
    "RiskSettings.threshold": "the risk above which the figures count an individual at risk",
    "ReportSection.purpose": "text of the DPO summary",
    "ReportSection.controller": "text of the DPO summary",
    "ReportSection.recipients": "text of the DPO summary",
    "ReportSection.retention": "text of the DPO summary",
}
# a field recorded as a digest of its content (large tables)
DIGESTED = ("GroupKey.mapping", "FieldSpec.lookup")
# fields holding a section whose fields are recorded one key each ("<key>.<field>"; a section that is None: none)
SECTIONS = ("StreamConfig.stream", "StreamConfig.anonymization", "StreamConfig.limits", "StreamConfig.dp",
            "StreamConfig.input", "StreamConfig.risk", "StreamConfig.report", "RiskConfig.settings")
# fields holding entries, each recorded under "<key>.<its key field>" ("<key>[<i>]" with no key field); an entry of
# a section class is recorded one key per field, any other as one value
ENTRIES = {"StreamConfig.quasi_identifiers": ("name", True), "StreamConfig.domains": ("field", False),
           "DPConfig.aggregates": ("name", True), "InputSpec.fields": ("name", False),
           "Anonymization.criteria": (None, False)}
# keys other than the field's name (the states and manifests written so far carry them)
KEY_OF = {"StreamConfig.sensitive": "sensitive.fields", "StreamConfig.invariant_sensitive": "sensitive.invariant",
          "StreamConfig.drop": "identifiers.drop", "StreamConfig.pseudonymize": "identifiers.pseudonymize",
          "StreamConfig.domains": "sensitive.domains", "DPConfig.aggregates": "aggregates"}


def _name(obj, f: dataclasses.Field) -> str:
    return f"{type(obj).__name__}.{f.name}"


def _digest(value) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _plain(value):
    """A JSON value of a setting (dataclasses as their fields, sets sorted, hierarchies as content digests)."""
    if hasattr(value, "graph") and hasattr(value, "leaves"):          # a Hierarchy: its content, not its file
        edges = sorted((str(a), str(b)) for a, b in value.graph.edges())
        return "sha256:" + hashlib.sha256(json.dumps([value.root, list(value.leaves), edges]).encode()).hexdigest()[:16]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            name = _name(value, f)
            if name not in NOT_GUARANTEES:
                plain = _plain(getattr(value, f.name))
                out[f.name] = _digest(plain) if name in DIGESTED and plain is not None else plain
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _section(obj, prefix: str, out: dict, key_field: str | None = None) -> None:
    """Record every setting of the dataclass ``obj`` under ``prefix`` (its ``key_field``: in the prefix already)."""
    for f in dataclasses.fields(obj):
        name, value = _name(obj, f), getattr(obj, f.name)
        if name in NOT_GUARANTEES or f.name == key_field:
            continue
        key = KEY_OF.get(name, prefix + f.name)
        if name in SECTIONS:
            if value is not None:
                _section(value, key + ".", out)
        elif name in ENTRIES:
            entry_key, flat = ENTRIES[name]
            for i, item in enumerate(value):
                at = f"{key}[{i}]" if entry_key is None else f"{key}.{getattr(item, entry_key)}"
                if flat:
                    _section(item, at + ".", out, entry_key)
                else:        # a criterion's kind is its class's, no field
                    kind = getattr(type(item), "kind", None)
                    out[at] = {**({"kind": kind} if isinstance(kind, str) else {}), **_plain(item)}
        else:
            plain = _plain(value)
            out[key] = _digest(plain) if name in DIGESTED and plain is not None else plain


def settings(config) -> dict:
    """The guarantee settings of a :class:`~stream_anon.config.StreamConfig`: dotted key -> JSON value."""
    out: dict = {}
    _section(config, "", out)
    return out


def schema(root=None) -> dict[str, typing.Any]:
    """Every field of the config's schema, ``"<Class>.<field>"`` -> its class, found from the type annotations of
    :class:`~stream_anon.config.StreamConfig` down (the criteria's classes: :data:`stream_anon.criteria.KINDS`)."""
    from stream_anon.config import StreamConfig
    from stream_anon.criteria import KINDS
    from stream_anon.dp.specs import DPConfig
    out: dict = {}
    elements = {"Anonymization.criteria": tuple(KINDS.values())}

    def walk(cls) -> None:
        hints = typing.get_type_hints(cls, localns={"DPConfig": DPConfig})
        for f in dataclasses.fields(cls):
            name = f"{cls.__name__}.{f.name}"
            if name in out:
                continue
            out[name] = cls
            for inner in elements.get(name, ()) + _dataclasses_in(hints.get(f.name)):
                walk(inner)

    walk(root or StreamConfig)
    return out


def _dataclasses_in(hint) -> tuple:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return (hint,)
    return tuple(c for arg in typing.get_args(hint) for c in _dataclasses_in(arg))


def fingerprint(settings_doc: dict) -> str:
    """A short digest of guarantee settings (:func:`settings`): equal fingerprints, equal settings. Release
    manifests carry it (``settings_fingerprint``) so a reader tells which settings every release was made under.

    >>> fingerprint({"anonymization.k": 10}) == fingerprint({"anonymization.k": 10}) != fingerprint({"anonymization.k": 5})
    True
    """
    text = json.dumps(settings_doc, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _shown(value, width: int | None) -> str:
    text = "(absent)" if value is _ABSENT else json.dumps(value, sort_keys=True) if not isinstance(value, str) \
        else value
    return text if width is None or len(text) <= width else text[:width - 3] + "..."


_ABSENT = object()


def changes(old: dict, new: dict, width: int | None = None) -> list[str]:
    """``<key> <old> -> <new>`` for every setting that differs, in key order; each value whole (the audit reads
    the lines of the manifests: tests/audit/test_audit_in_force.py), or cut to ``width`` characters (the DP rows'
    lines).

    >>> changes({"sensitive.fields": ["fare_product", "daily_capping"]}, {}, width=20)
    ['sensitive.fields ["fare_product", ... -> (absent)']
    """
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if a != b:
            out.append(f"{key} {_shown(a, width)} -> {_shown(b, width)}")
    return out
