"""Rendering of a partition's output as Kafka messages ``(topic, key, value bytes)``: a release's records, its
manifest, its metric and alerts (docs/contracts.md section 5), and dead letters. What a message holds is decided
here and nowhere else."""
from __future__ import annotations

import copy
import hashlib
import logging
import math
import re
import time
from datetime import datetime, timezone

import orjson

from stream_anon import crypto, guarantees
from stream_anon.contract import topics
from stream_anon.engine import get_path
from stream_anon.inputs import input_digest
from stream_anon.metric_rows import alert_row, metric_row, now_iso
from stream_anon.risk import release_risk

log = logging.getLogger("stream_anon.worker")

TOPICS = topics()           # the topic contract (topics/topics.toml), shipped inside the package
DEADLETTER_PAYLOAD_MAX = 4096   # characters of an oversized payload kept in its dead letter
SUPPRESSION_LIMIT_EXCEEDED = "suppression_limit_exceeded"


def release_accounting(manifests: list[dict], dead_letters: list) -> dict:
    """Where the events of a stream's output went, from its manifests (each release once) and dead letters:
    ``published``, ``suppressed`` (``suppressed_by_reason``), ``deferred`` (held by each partition's latest
    release for a later window), ``dead_lettered``, ``accounted`` (their sum) and ``releases``."""
    by_reason: dict[str, int] = {}
    latest: dict = {}
    for m in manifests:
        for reason, n in (m.get("suppressed") or {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + n
        p = m.get("partition")
        if p not in latest or m.get("seq", -1) > latest[p].get("seq", -1):
            latest[p] = m
    published = sum(m.get("published", 0) for m in manifests)
    suppressed = sum(by_reason.values())
    deferred = sum(m.get("deferred", 0) for m in latest.values())
    return {"releases": len(manifests), "published": published, "suppressed": suppressed, "deferred": deferred,
            "dead_lettered": len(dead_letters), "accounted": published + suppressed + deferred + len(dead_letters),
            "suppressed_by_reason": by_reason}


def json_bytes(obj) -> bytes:
    """Output serialization: orjson (compact UTF-8, numpy scalars and arrays natively; ~5x faster than json.dumps
    on the record path)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


class AlertLog:
    """WARNING lines for release alerts, at most one per alert name every ``interval_s`` seconds; the lines held
    back are counted into the next one (``+N more since the last line``)."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def warn(self, name: str, msg: str, *args) -> bool:
        now = time.monotonic()
        if now - self.last.get(name, float("-inf")) < self.interval_s:
            self.held[name] = self.held.get(name, 0) + 1
            return False
        more = self.held.pop(name, 0)
        self.last[name] = now
        log.warning("alert %s: " + msg + (f" (+{more} more since the last line)" if more else ""), name, *args)
        return True


class Renderer:
    """The messages of one stream's releases and dead letters (``raw_deadletters``: every field of a dead-lettered
    event with its identifiers redacted, and payloads that are not JSON objects verbatim: an operator's opt-in)."""

    def __init__(self, config, secret: bytes, raw_deadletters: bool = False):
        self.config, self.secret, self.raw_deadletters = config, secret, raw_deadletters
        self.kid = crypto.key_id(secret)          # published with releases and dead letters (secret rotation)
        # the guarantee settings in force, as a digest in every manifest (stream_anon.guarantees.fingerprint)
        self.settings_fingerprint = guarantees.fingerprint(guarantees.settings(config))
        # how the raw messages are read: an audit of a superseded lineage reads them as it did
        self.input_digest = input_digest(config.input, config.stream.event_time)
        self.stream = config.stream.name
        self.topic = config.stream.input_topic
        self.alert_log = AlertLog()

    def release(self, rel, settings_changed: list[str] | None = None, notes: dict | None = None
                ) -> tuple[list[tuple[str, bytes, bytes]], dict, list[str]]:
        """(messages, counters, alert names raised) for one release: records, manifest, release metric, alerts.
        ``settings_changed``: guarantee settings changed (and accepted) since the partition's previous release,
        written into the manifest (``settings_changed``): the release and those after it were made under them.
        ``notes``: further fields of the manifest (``lineage_started``: the first release of a partition in a new
        lineage; ``key_rotated``: the first release under a rotated secret)."""
        key = rel.release_id.encode()
        topic = TOPICS.records(self.stream)
        out = [(topic, key, payload) for payload in rel.record_payloads(json_bytes)]
        # privacy_unit: the field whose values are the individuals counted (an audit of a superseded lineage
        # counts by it)
        manifest = rel.manifest({"settings_fingerprint": self.settings_fingerprint,
                                 "privacy_unit": self.config.stream.privacy_unit, "input_digest": self.input_digest,
                                 **({"settings_changed": list(settings_changed)} if settings_changed else {}),
                                 **(notes or {})})
        out.append((TOPICS.releases, key, json_bytes(manifest)))
        metric = metric_row("release", self.stream, rel.partition, release_id=rel.release_id,
                            seq=manifest.get("seq"), published=manifest.get("published"),
                            suppressed=manifest.get("suppressed"), deferred=manifest.get("deferred"),
                            ncp_mean=manifest.get("ncp_mean"), suppression_ratio=manifest.get("suppression_ratio"),
                            late=rel.late)
        if "m" in manifest:     # m-invariance: counterfeit counts, as in the manifest (never which records)
            metric.update({name: manifest[name] for name in ("m", "counterfeit_individuals", "counterfeit_records")})
        if self.config.risk.per_release:
            metric["risk"] = release_risk_figures(manifest, self.config.risk.settings, rel.own_class_sizes)
        out.append((TOPICS.metrics, self.stream.encode(), json_bytes(metric)))
        alerts = []
        limit = self.config.anonymization.max_suppression_ratio
        if manifest.get("suppression_limit_exceeded"):
            alerts.append(SUPPRESSION_LIMIT_EXCEEDED)
            alert = alert_row(SUPPRESSION_LIMIT_EXCEEDED, self.stream, rel.partition, release_id=rel.release_id,
                              suppression_ratio=manifest.get("suppression_ratio"), limit=limit)
            out.append((TOPICS.metrics, self.stream.encode(), json_bytes(alert)))
            self.alert_log.warn(SUPPRESSION_LIMIT_EXCEEDED, "stream %s partition %s release %s: %.1f%% of its "
                                "records suppressed (limit %.1f%%): %s", self.stream, rel.partition,
                                rel.release_id, 100 * (manifest.get("suppression_ratio") or 0), 100 * limit,
                                manifest.get("suppressed"))
        lossy = (manifest.get("suppressed") or {}).get("class_loss_above_limit")
        if lossy:
            self.alert_log.warn("loss_limit", "stream %s partition %s release %s: %s records suppressed because "
                                "their class's NCP was above max_class_ncp %.3g", self.stream, rel.partition,
                                rel.release_id, lossy, self.config.anonymization.max_class_ncp)
        counts = {"releases": 1, "published": manifest.get("published", 0),
                  "suppressed": sum((manifest.get("suppressed") or {}).values())}
        return out, counts, alerts

    def alert(self, name: str, partition: int, **fields) -> tuple[str, bytes, dict]:
        """(topic, key, alert) of a one-off alert for ``anon.metrics``; the caller serializes it."""
        return TOPICS.metrics, self.stream.encode(), alert_row(name, self.stream, partition, **fields)

    def deadletter(self, reason, partition, offset, raw: bytes | None = None,
                        event: dict | None = None, index: int | None = None,
                        opaque: bool = False, lineage: str | None = None) -> tuple[str, bytes, bytes]:
        """A dead letter: reason (naming the field and the problem, never a value of the event), source
        coordinates, the event's audit token when it has an event id, and the payload as the output contract
        allows it (:meth:`contract_payload`). A payload that is not a JSON object cannot be searched for
        identifiers: it is withheld (size and digest only). ``raw_deadletters`` (``--deadletter-raw-payload``):
        every field of the event with only its identifiers redacted (:meth:`redact`), and a payload that is not a
        JSON object verbatim."""
        doc = {"reason": reason, "stream": self.stream,
               "source": {"topic": self.topic, "partition": partition, "offset": offset},
               "received_at": now_iso(), "kid": self.kid}
        if lineage is not None:     # the stream's lineage (stream_anon.kafka.lineage): dedupe by it and the source
            doc["lineage"] = lineage
        if index is not None:       # the event's position inside a multi-event message (stream_anon.inputs)
            doc["source"]["index"] = index
        if event is None and raw is not None and not opaque:   # opaque: a mapped format's raw message is never
            # searched for identifiers (its fields are not the engine's): withheld unless raw_deadletters
            try:
                event = orjson.loads(raw)
            except ValueError:
                event = None
        if isinstance(event, dict):
            doc["reason"] = reason_without_values(str(reason), event)
            eid = event.get("event_id")
            if isinstance(eid, str) and eid:
                try:    # the event's audit token: dead letters are accounted for like published records
                    doc["audit_token"] = crypto.audit_token(self.secret, eid)
                except UnicodeEncodeError:
                    pass
            try:
                shown = self.redact(event) if self.raw_deadletters else self.contract_payload(event)
                text = orjson.dumps(shown, default=str).decode()
            except Exception as exc:   # noqa: BLE001 - e.g. nested deeper than the encoder allows
                text = None
                doc["payload_withheld"] = f"cannot be redacted: {type(exc).__name__}"
                if raw is not None:
                    doc["payload_bytes"] = len(raw)
                    doc["payload_sha256"] = hashlib.sha256(raw).hexdigest()
        elif self.raw_deadletters and raw is not None:
            text = raw.decode("utf-8", errors="replace")
        else:
            text = None
            if raw is not None:
                doc["payload_withheld"] = ("raw message of a mapped input: identifiers cannot be located" if opaque
                                           else "not a JSON object: identifiers cannot be located")
                doc["payload_bytes"] = len(raw)
                doc["payload_sha256"] = hashlib.sha256(raw).hexdigest()
        if text is not None:
            doc["payload"] = text[:DEADLETTER_PAYLOAD_MAX]
            if len(text) > DEADLETTER_PAYLOAD_MAX:
                doc["payload_truncated"] = True
                doc["payload_bytes"] = len(raw) if raw is not None else len(text)
        return TOPICS.deadletter, self.stream.encode(), json_bytes(doc)

    def contract_payload(self, event: dict) -> dict:
        """What a dead letter may hold of an event: the fields the output publishes (the quasi-identifiers' and
        the sensitive fields) and the privacy unit and ``identifiers.pseudonymize`` fields as keyed pseudonyms;
        the event time and every timestamp quasi-identifier floored to ``time_granularity_s`` (a time that does not
        parse becomes ``"unreadable"``); every other field (``identifiers.drop``, fields no output publishes, the
        event id, whose audit token the dead letter carries) left out."""
        cfg = self.config
        g = float(cfg.anonymization.time_granularity_s)
        times = {cfg.stream.event_time, *(f for q in cfg.quasi_identifiers if q.kind == "timestamp" for f in q.fields)}
        pseudonymized = {cfg.stream.privacy_unit, *cfg.pseudonymize}
        kept = dict.fromkeys([*pseudonymized, *(f for q in cfg.quasi_identifiers for f in q.fields), *cfg.sensitive,
                              cfg.stream.event_time])
        out: dict = {}
        for path in kept:
            if path in cfg.drop:
                continue
            value = get_path(event, path)
            if value is None:
                continue
            if path in pseudonymized:
                value = "pseudonym:" + crypto.pseudonym(self.secret, str(value))[:20]
            elif path in times:
                value = coarse_time(value, g)
            holder = out
            *parents, leaf = path.split(".")
            for p in parents:
                holder = holder.setdefault(p, {})
            holder[leaf] = value
        return out

    def redact(self, event: dict) -> dict:
        event = copy.deepcopy(event)
        ids = self.config
        for path in ids.identifiers:
            parent, _, leaf = path.rpartition(".")
            holder = get_path(event, parent) if parent else event
            if not isinstance(holder, dict) or leaf not in holder:
                continue
            if path in ids.drop:
                del holder[leaf]
            else:
                holder[leaf] = "pseudonym:" + crypto.pseudonym(self.secret, str(holder[leaf]))[:20]
        return event


def release_risk_figures(manifest: dict, settings, own_class_sizes=None) -> dict | None:
    """The release's re-identification risk (:func:`stream_anon.risk.release_risk`) from the individuals of the
    classes its manifest lists and ``own_class_sizes`` (the release's own individuals by the size of their
    smallest class, :attr:`stream_anon.engine.release.Release.own_class_sizes`; without it each class's
    individuals count once per class, as the manifest lists them).
    A reused class holds the individuals it was created with (at least k, the audit's ``k`` check) and those
    added since; the release knows only its own additions, so the class counts max(k, added): a lower bound of
    its individuals, hence an upper bound of each individual's risk and of the release's figures (the audit
    counts the class exactly)."""
    k = int(manifest.get("k") or 1)
    classes = manifest.get("classes") or ()
    sizes = [max(k, int(c.get("individuals") or 0)) if c.get("reused") else int(c.get("individuals") or 0)
             for c in classes]
    if own_class_sizes:
        own = [f for f, n in own_class_sizes for _ in range(n)]
    else:
        own = [f for f, c in zip(sizes, classes) for _ in range(int(c.get("individuals") or 0))]
    return release_risk(sizes, settings, own)


def coarse_time(value, granularity_s: float) -> str:
    """An ISO-8601 time floored to ``granularity_s`` (UTC), as the output's time bounds are; ``"unreadable"``.

    >>> coarse_time("2009-11-09T07:31:42+00:00", 60), coarse_time("2009-11-09T07:31:42+01:00", 900), coarse_time(3, 60)
    ('2009-11-09T07:31:00+00:00', '2009-11-09T06:30:00+00:00', 'unreadable')
    """
    if not isinstance(value, str):
        return "unreadable"
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return "unreadable"
    if t.tzinfo is None:
        return "unreadable"
    ts = math.floor(t.timestamp() / granularity_s) * granularity_s
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def _leaves(obj, depth: int = 0):
    if depth > 32:
        return
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v, depth + 1)
    else:
        yield obj


def reason_without_values(reason: str, event: dict) -> str:
    """``reason`` with every value of ``event`` it quotes replaced by ``<value>``: a dead letter's reason names
    the field and the problem, never the raw value (a rule every reader's reason keeps, enforced here for all).

    >>> reason_without_values("station: 'Atlantis' is not in hierarchy 'loc'", {"station": "Atlantis"})
    "station: <value> is not in hierarchy 'loc'"
    >>> reason_without_values("fare: number 123456 outside [0, 1000]", {"fare": 123456})
    'fare: number <value> outside [0, 1000]'
    >>> reason_without_values("latitude: missing (input position.latitude)", {"kind": "position"})
    'latitude: missing (input position.latitude)'
    """
    for v in _leaves(event):
        if isinstance(v, str) and v:
            for shown in (repr(v), f'"{v}"'):
                reason = reason.replace(shown, "<value>")
            # a bare word of the reason, not part of a dotted path or a longer word (the pattern is compiled only
            # for a value the reason holds: compiling one per leaf of a hostile event cost ~1 ms each)
            if len(v) >= 4 and v in reason:
                reason = re.sub(rf"(?<![\w.]){re.escape(v)}(?![\w.])", "<value>", reason)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and len(str(v)) >= 2 and str(v) in reason:
            reason = re.sub(rf"(?<![\w.]){re.escape(str(v))}(?![\w.])", "<value>", reason)
    return reason
