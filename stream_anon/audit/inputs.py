"""From what the audit is handed to an :class:`~.check.AuditContext`: raw messages parsed, outputs filtered to
the stream, malformed outputs set aside and duplicates from restarted workers merged.

Hostile input is data to report, not a reason to stop: a raw message that does not parse (including JSON nested
too deep for the decoder) is an event without token, which accounting then requires to be dead-lettered; an
output item that is no JSON object or is nested deeper than :data:`MAX_OUTPUT_NESTING` goes to ``malformed``
(reported by consistency) before any check serializes it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from .check import AuditContext, RawEvent, ViolationLog
from .config import AuditConfig
from .primitives import as_text, audit_token, counterfeit_tokens, get_path, json_object, nesting_depth, source_key

# Published records and manifests nest about 6 deep (manifest -> classes -> class -> generalization -> QI -> box);
# far deeper is no output of the engine and would exhaust json.dumps's recursion in canonical_json.
MAX_OUTPUT_NESTING = 64
_VOLATILE_MANIFEST_KEYS = ("created_at",)


@dataclass
class AuditOutputs:
    """Published outputs of one stream (possibly with duplicates from restarted workers)."""

    records: list[dict] = field(default_factory=list)
    manifests: list[dict] = field(default_factory=list)
    deadletters: list[dict] = field(default_factory=list)
    malformed: list[Any] = field(default_factory=list)  # output messages that were not JSON objects
    aggregates: list[dict] = field(default_factory=list)  # DP rows of anon.aggregates (duplicates kept)


def outputs_part(outputs: Any, name: str) -> list:
    """``outputs[name]`` of a dict or ``outputs.name`` of an object such as :class:`AuditOutputs`."""
    if isinstance(outputs, dict):
        return list(outputs.get(name) or [])
    return list(getattr(outputs, name, None) or [])


def raw_decoder(config_path, secret: bytes | None = None, allow_outside_paths: bool = False) -> Any:
    """A function decoding the raw messages of a stream whose TOML has a mapped ``[input]`` (None for the built-in
    JSON shape, which the audit parses as it is); ``secret`` keys the event ids of an ``[input] event_key`` as the
    worker does. The TOML is read here with tomllib, the decoding done by :mod:`stream_anon.inputs` (independent
    of the engine and its config module); its lookup files must lie in the config's directory tree unless
    ``allow_outside_paths``."""
    import tomllib
    from pathlib import Path

    from stream_anon.inputs import Decoder, parse_input
    from stream_anon.contract import config_dir

    raw = tomllib.loads(Path(config_path).read_text())
    stream = raw.get("stream", {})
    spec = parse_input(raw.get("input"), event_time=stream.get("event_time", "event_time"),
                       event_types=tuple(stream.get("event_types", ())),
                       base_dir=config_dir(Path(config_path).parent, allow_outside_paths))
    if spec.legacy:
        return None
    decoder = Decoder(spec, max_bytes=int(raw.get("limits", {}).get("max_event_bytes", 65536)), secret=secret)
    return lambda raw_events: decode_raw(raw_events, decoder)


def decode_raw(raw_events: Iterable, decoder) -> list[tuple]:
    """Raw messages of a mapped input -> ``(source, event)`` pairs, one per input event, as the worker counts them
    (stream_anon.inputs.decode): an unreadable message is one event without content (``None``: it must be
    dead-lettered at the message's source); a message of N events gives N pairs, their source with the event's
    index when the format holds several events per message. Events that fail the mapping keep what could be read
    (their derived event id, hence their token)."""
    out = []
    for source, payload in raw_events:
        key = source_key(source)
        if key is None:
            out.append((source, None))
            continue
        topic, partition, offset = key[:3]
        d = decoder.decode(payload, topic, partition, offset)
        if d.reason:
            out.append((key, None))
            continue
        for i, event in enumerate(d.events):
            out.append(((*key, i) if decoder.spec.multi else key, event))
    return out


def parse_raw(raw_events: Iterable, secret: bytes, privacy_unit: str) -> list[RawEvent]:
    """``((topic, partition, offset), payload)`` pairs -> :class:`RawEvent` (event None when unparseable)."""
    out = []
    for source, payload in raw_events:
        event = json_object(payload)
        eid = event.get("event_id") if event else None
        token = audit_token(secret, eid) if isinstance(eid, str) and eid else None
        unit = as_text(get_path(event, privacy_unit)) if event else None
        out.append(RawEvent(source_key(source), event, token, unit))
    return out


def canonical_json(obj: Any) -> str:
    """One text per JSON value whatever its key order (items are bounded by MAX_OUTPUT_NESTING first)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def deduplicate(records: list[dict], manifests: list[dict], log: ViolationLog) -> tuple[list[dict], list[dict]]:
    """Keep one copy per release_id (manifests) and per (release_id, audit_token) (records); copies that differ
    (ignoring the wall-clock ``created_at``) are a "conflicting duplicate release"."""
    seen_m: dict[Any, tuple[str, dict]] = {}
    for m in manifests:
        rid = m.get("release_id")
        c = canonical_json({k: v for k, v in m.items() if k not in _VOLATILE_MANIFEST_KEYS})
        if rid in seen_m:
            if seen_m[rid][0] != c:
                log.fail("conflicting duplicate release", release_id=rid, what="manifest")
            log.details["duplicate_manifests"] = log.details.get("duplicate_manifests", 0) + 1
            continue
        seen_m[rid] = (c, m)
    seen_r: dict[tuple, tuple[str, dict]] = {}
    for r in records:
        key = (r.get("release_id"), r.get("audit_token"))
        c = canonical_json(r)
        if key in seen_r:
            if seen_r[key][0] != c:
                log.fail("conflicting duplicate release", release_id=key[0], what="record", audit_token=key[1])
            log.details["duplicate_records"] = log.details.get("duplicate_records", 0) + 1
            continue
        seen_r[key] = (c, r)
    log.details.setdefault("duplicate_manifests", 0)
    log.details.setdefault("duplicate_records", 0)
    return [v[1] for v in seen_r.values()], [v[1] for v in seen_m.values()]


def deduplicate_rows(rows: list[dict], log: ViolationLog) -> list[dict]:
    """One DP row per ``row_id`` (a re-produced row is identical); copies that differ are a "conflicting
    duplicate row" (one window and cell released twice with different noise)."""
    seen: dict[Any, tuple[str, dict]] = {}
    for r in rows:
        rid = r.get("row_id")
        c = canonical_json(r)
        if rid in seen:
            if seen[rid][0] != c:
                log.fail("conflicting duplicate row", row_id=rid, what="aggregate")
            continue
        seen[rid] = (c, r)
    return [v[1] for v in seen.values()]


def _well_formed(items: list, malformed: list) -> list[dict]:
    """The JSON objects of bounded nesting among ``items``; the others are appended to ``malformed``."""
    kept = []
    for item in items:
        if isinstance(item, dict) and nesting_depth(item, MAX_OUTPUT_NESTING) <= MAX_OUTPUT_NESTING:
            kept.append(item)
        else:
            malformed.append(item)
    return kept


def build_context(raw_events: Iterable, outputs: Any, secret: bytes, config: AuditConfig,
                  earlier_configs: Iterable[AuditConfig] = ()) -> tuple[AuditContext, dict]:
    """The context every check reads, and the result of merging duplicates (the report's ``duplicates``).
    ``earlier_configs``: the configs in force before accepted changes (:mod:`.in_force`)."""
    malformed = outputs_part(outputs, "malformed")
    records = _well_formed(outputs_part(outputs, "records"), malformed)   # read only: no check changes them
    manifests = _well_formed(outputs_part(outputs, "manifests"), malformed)
    deadletters = _well_formed(outputs_part(outputs, "deadletters"), malformed)
    if config.stream is not None:
        manifests = [m for m in manifests if m.get("stream") in (None, config.stream)]
        deadletters = [d for d in deadletters if d.get("stream") in (None, config.stream)]
    aggregates = _well_formed(outputs_part(outputs, "aggregates"), malformed)
    if config.stream is not None:
        aggregates = [a for a in aggregates if a.get("stream") in (None, config.stream)]
    duplicates = ViolationLog()
    records, manifests = deduplicate(records, manifests, duplicates)
    aggregates = deduplicate_rows(aggregates, duplicates)
    ctx = AuditContext(config=config, secret=secret, raws=parse_raw(raw_events, secret, config.privacy_unit),
                       records=records, manifests=manifests, deadletters=deadletters, malformed=malformed,
                       counterfeits=counterfeit_tokens(manifests, secret), aggregates=aggregates,
                       earlier_configs=tuple(earlier_configs))
    return ctx, duplicates.result()
