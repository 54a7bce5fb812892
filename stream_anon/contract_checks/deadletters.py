"""The dead-letter contract on every bundled stream (docs/privacy.md: what dead letters contain): an event refused
for a value of one of its published fields yields a dead letter holding no more than the output publishes (the
quasi-identifiers' and sensitive fields, the event time, the privacy unit as a keyed pseudonym), no identifier's
value, a reason that names the problem without the refused value, and the event's audit token.

Each quasi-identifier's and sensitive field of the stream, one at a time, gets a hostile value in one event of
the stream's bundled slice; the stream runs through the in-process API (the worker's own pipeline and renderer).
A field whose hostile value is accepted (a free-text sensitive field) makes no dead letter and is not judged; at
least one field of every stream must."""
from __future__ import annotations

import copy

import orjson

from stream_anon import crypto

from . import registry
from .parts import SECRET, _events

HOSTILE = "Atlantis-<script>-0xDEADBEEF"
AT = 5               # the event of the slice that gets the hostile value


def _set(event: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        event = event.setdefault(p, {})
    event[leaf] = value


def _get(event: dict, path: str):
    node: object = event
    for p in path.split("."):
        node = node.get(p) if isinstance(node, dict) else None
    return node


def _leaves(doc: dict, prefix: str = ""):
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaves(value, path + ".")
        else:
            yield path


def published_fields(config) -> set[str]:
    """The dotted fields a dead letter may hold: the quasi-identifiers' and sensitive fields, the event time, the
    privacy unit and ``identifiers.pseudonymize`` (as pseudonyms), less ``identifiers.drop``."""
    fields = {f for q in config.quasi_identifiers for f in q.fields} | set(config.sensitive) | \
        {config.stream.event_time, config.stream.privacy_unit, *config.pseudonymize}
    return fields - set(config.drop)


def check_deadletters(name: str) -> int:
    """The contract on bundled stream ``name``; returns how many fields made a dead letter (at least one)."""
    from stream_anon.api import anonymize

    config = registry.without_dp(registry.bundled()[name])       # dead letters do not depend on the aggregates
    events = _events(config, 300)
    allowed = published_fields(config)
    judged = 0
    for field in [q.fields[0] for q in config.quasi_identifiers] + list(config.sensitive):
        what = f"stream {name}, field {field}"
        bad = copy.deepcopy(events[AT])
        _set(bad, field, HOSTILE)
        result = anonymize([*events[:AT], bad, *events[AT + 1:]], config, secret=SECRET)
        token = crypto.audit_token(SECRET.encode(), str(bad["event_id"]))
        dead = [d for d in result.dead_letters if d.get("audit_token") == token]
        if not dead:
            assert token in {r["audit_token"] for r in result.records} or result.counts()["suppressed"], \
                f"{what}: the event is neither dead-lettered nor published nor suppressed"
            continue
        judged += 1
        assert len(dead) == 1, f"{what}: {len(dead)} dead letters for one event"
        letter = dead[0]
        assert HOSTILE not in letter["reason"], f"{what}: the reason holds the refused value: {letter['reason']}"
        text = orjson.dumps(letter).decode()
        for ident in config.identifiers:
            value = _get(bad, ident)
            if value is not None and len(str(value)) >= 4:
                assert str(value) not in text, f"{what}: identifier {ident} in the dead letter"
        payload = orjson.loads(letter["payload"]) if "payload" in letter else {}
        extra = set(_leaves(payload)) - allowed
        assert not extra, f"{what}: the dead letter holds {sorted(extra)}, which no output publishes"
        unit = _get(payload, config.stream.privacy_unit)
        assert unit is None or str(unit).startswith("pseudonym:"), f"{what}: the privacy unit in clear"
    assert judged, f"stream {name}: no hostile value made a dead letter"
    return judged
