"""Topic definitions (``*.toml`` of the package's ``stream_anon.topics``, the repository's ``topics/``; see
:mod:`stream_anon.contract`) and idempotent provisioning with kafka-python's admin client.

The Tansu broker returns no error when asked to create a topic that exists, and auto-creates topics with several
partitions on first use, so :func:`apply_topics` lists the existing topics first, creates only the missing ones and
checks the partition count of the others (a mismatch is warned about, never "fixed": shrinking is impossible and
growing would move keys between partitions).
"""
from __future__ import annotations

import logging
import time
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from stream_anon import contract
from stream_anon.connection import REPLICATION_FACTOR, as_connection
from stream_anon.kafka.retention import confluent_admin, declared_ms, set_topic_retention, stated_retention_ms, \
    topic_retention_ms

log = logging.getLogger(__name__)


class TopicError(RuntimeError):
    pass


class TopicMismatchWarning(UserWarning):
    """An existing topic does not have the defined number of partitions."""


@dataclass(frozen=True)
class TopicDef:
    name: str
    partitions: int
    retention_ms: int = -1
    key: str = ""
    value_schema: Path | None = None   # JSON schema of raw topics
    value: str = ""                    # description of output values
    configs: dict = field(default_factory=dict)

    def topic_configs(self) -> dict[str, str]:
        out = {"retention.ms": str(self.retention_ms)}
        out.update({k: str(v) for k, v in self.configs.items()})
        return out


def _parse(entry: dict, base: Path, source: Path) -> TopicDef:
    try:
        name = str(entry["name"])
        partitions = int(entry["partitions"])
    except KeyError as exc:
        raise TopicError(f"{source}: topic entry without {exc.args[0]!r}: {entry}") from exc
    if partitions < 1:
        raise TopicError(f"{source}: topic {name}: partitions must be >= 1")
    schema = entry.get("value_schema")
    return TopicDef(
        name=name, partitions=partitions, retention_ms=int(entry.get("retention_ms", -1)),
        key=str(entry.get("key", "")), value_schema=(base / schema) if schema else None,
        value=str(entry.get("value", "")), configs=dict(entry.get("configs", {})),
    )


def load_topic_definitions(directory: str | Path | None = None) -> dict[str, TopicDef]:
    """Read every ``*.toml`` in ``directory`` (default: the bundled definitions): each holds ``[[topic]]`` tables
    (or one topic at top level)."""
    directory = contract.topics_dir() if directory is None else Path(directory)
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise TopicError(f"no topic definitions (*.toml) in {directory}")
    defs: dict[str, TopicDef] = {}
    for path in files:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
        entries = data.get("topic", [data] if "name" in data else [])
        for entry in entries:
            t = _parse(entry, directory, path)
            if t.name in defs:
                raise TopicError(f"{path}: topic {t.name} defined twice")
            defs[t.name] = t
    return defs


def _admin(bootstrap):
    """kafka-python admin client; ``bootstrap``: 'HOST:PORT' or a :class:`stream_anon.connection.KafkaConnection`."""
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(**as_connection(bootstrap).kafka_python(), client_id="stream-anon-admin", request_timeout_ms=15000)


def existing_partitions(bootstrap, names=None, admin=None) -> dict[str, int]:
    """Partition counts of existing topics (all, or those of ``names`` that exist)."""
    own = admin is None
    admin = admin or _admin(bootstrap)
    try:
        existing = set(admin.list_topics())
        wanted = sorted(existing if names is None else existing & set(names))
        if not wanted:
            return {}
        out = {}
        for desc in admin.describe_topics(wanted):
            out[desc.get("name") or desc.get("topic")] = len(desc.get("partitions") or [])
        return out
    finally:
        if own:
            admin.close()


def apply_topics(bootstrap, defs, timeout_s: float = 15.0) -> dict[str, str]:
    """Create the missing topics of ``defs`` (dict name->TopicDef or iterable of TopicDef); idempotent.

    Returns ``{topic: "created" | "exists" | "mismatch"}``. Partition mismatches of existing topics are warned
    about (:class:`TopicMismatchWarning`) and logged.
    """
    from kafka.admin import NewTopic

    if isinstance(defs, dict):
        defs = list(defs.values())
    admin = _admin(bootstrap)
    try:
        current = existing_partitions(bootstrap, [d.name for d in defs], admin=admin)
        result: dict[str, str] = {}
        missing = []
        for d in defs:
            if d.name in current:
                if current[d.name] != d.partitions:
                    msg = (f"topic {d.name} exists with {current[d.name]} partitions, defined with {d.partitions} "
                           f"(left as is)")
                    warnings.warn(msg, TopicMismatchWarning, stacklevel=2)
                    log.warning(msg)
                    result[d.name] = "mismatch"
                else:
                    result[d.name] = "exists"
            else:
                missing.append(d)
        if missing:
            admin.create_topics([NewTopic(d.name, num_partitions=d.partitions, replication_factor=REPLICATION_FACTOR,
                                          topic_configs=d.topic_configs()) for d in missing],
                                timeout_ms=int(timeout_s * 1000), raise_errors=False)
            # wait until metadata shows them with the right partition count
            deadline = time.monotonic() + timeout_s
            names = [d.name for d in missing]
            while True:
                now = existing_partitions(bootstrap, names, admin=admin)
                if all(now.get(d.name) == d.partitions for d in missing):
                    break
                if time.monotonic() > deadline:
                    raise TopicError(f"topics not visible with the defined partitions after {timeout_s}s: "
                                     f"{ {n: now.get(n) for n in names} }")
                time.sleep(0.1)
            for d in missing:
                result[d.name] = "created"
        return result
    finally:
        admin.close()


DEFAULT_INPUT_PARTITIONS = 1
"""Partitions of a stream's input topic when neither ``[stream] partitions`` nor a topic definition says: one.
Classes form within a partition, so one partition gives every class the whole stream's individuals to form from:
the lowest information loss and suppression (docs/benchmarks.md, partitions: measured at 1, 2, 4, 8). Declare more when one
worker cannot keep up; the count cannot be lowered later without moving keys."""


def input_partitions(config, defs: dict[str, TopicDef] | None = None) -> tuple[int, str]:
    """(partition count of the stream's input topic, where it comes from): ``[stream] partitions`` if declared,
    else the topic definition, else :data:`DEFAULT_INPUT_PARTITIONS`."""
    declared = getattr(config.stream, "partitions", None)
    if declared is not None:
        return declared, "[stream] partitions"
    defs = load_topic_definitions() if defs is None else defs
    topic = config.stream.input_topic
    if topic in defs:
        return defs[topic].partitions, "topic definition"
    return DEFAULT_INPUT_PARTITIONS, "default (one partition: lowest loss; declare [stream] partitions to scale out)"


def stream_topic_defs(config, defs: dict[str, TopicDef] | None = None) -> dict[str, TopicDef]:
    """The topics a stream's worker reads and writes, its input topic with :func:`input_partitions` (the stream's
    decision wins over the definition) and its records topic with one partition if undefined."""
    from stream_anon.contract import topics as names_of

    defs = load_topic_definitions() if defs is None else defs
    names = names_of()
    topic, records = config.stream.input_topic, names.records(config.stream.name)
    n, source = input_partitions(config, defs)
    out: dict[str, TopicDef] = {}
    base = defs.get(topic) or TopicDef(topic, n, retention_ms=604800000, key="pseudonym of the privacy unit",
                                       value="raw events of the stream")
    from dataclasses import replace
    if base.partitions != n:
        base = replace(base, partitions=n)
    declared = declared_ms(getattr(config.stream, "input_retention_s", None))
    if declared is not None:           # created with the declared retention (docs/operations.md, Retention)
        base = replace(base, retention_ms=declared)
    log.info("input topic %s: %d partition(s) (%s)", topic, n, source)
    out[topic] = base
    out[records] = defs.get(records) or TopicDef(records, 1, value="published records of the stream")
    for name in (names.releases, names.deadletter, names.metrics) + ((names.aggregates,) if config.dp else ()):
        if name not in defs:
            raise TopicError(f"no definition for shared topic {name}")
        out[name] = defs[name]
    return out


def shared_topic_defs(defs: dict[str, TopicDef] | None = None) -> dict[str, TopicDef]:
    """The topics every stream writes (releases, dead letters, metrics, DP aggregates), from their definitions."""
    from stream_anon.contract import topics as names_of

    defs = load_topic_definitions() if defs is None else defs
    names = names_of()
    out = {}
    for name in (names.releases, names.deadletter, names.metrics, names.aggregates):
        if name not in defs:
            raise TopicError(f"no definition for shared topic {name}")
        out[name] = defs[name]
    return out


def state_topic_def(config, app_id: str, defs: dict[str, TopicDef] | None = None) -> TopicDef:
    """The state topic of the worker ``app_id`` of ``config``'s stream, as that worker creates it when it is
    missing (stream_anon.worker.state: compacted, ``max.message.bytes`` for its values), one partition per input
    partition."""
    from stream_anon.worker.state import STATE_TOPIC_CONFIG, state_topic

    return TopicDef(state_topic(app_id), input_partitions(config, defs)[0],
                    value="the worker's state records (stream_anon.worker.state)", configs=dict(STATE_TOPIC_CONFIG))


def lineage_topic_def(app_id: str) -> TopicDef:
    """The lineage topic of the worker ``app_id``, as that worker creates it when it is missing
    (stream_anon.kafka.lineage: one partition, compacted)."""
    from stream_anon.kafka.lineage import LINEAGE_TOPIC_CONFIG, lineage_topic

    return TopicDef(lineage_topic(app_id), 1, value="the stream's lineage declarations (stream_anon.kafka.lineage)",
                    configs=dict(LINEAGE_TOPIC_CONFIG))


def apply_plan(defs: dict[str, TopicDef], configs=(), app_id: str | None = None) -> dict[str, TopicDef]:
    """What ``topics apply`` creates: without stream configs every defined topic; with them the shared topics and
    each stream's (:func:`stream_topic_defs`), no other stream's; with ``app_id`` (one config) also the state
    topic and lineage topic of that worker (:func:`state_topic_def`, :func:`lineage_topic_def`)."""
    if not configs:
        return dict(defs)
    out = shared_topic_defs(defs)
    for config in configs:
        out.update(stream_topic_defs(config, defs))
    if app_id is not None:
        if len(configs) != 1:
            raise TopicError(f"--app-id {app_id}: the state topic belongs to one stream; give one --config")
        for own in (state_topic_def(configs[0], app_id, defs), lineage_topic_def(app_id)):
            out[own.name] = own
    return out


def declared_retention(configs) -> dict[str, int]:
    """Raw topic -> the ``retention.ms`` its streams declare (``[stream] input_retention_s``; the shortest when
    several streams read one topic)."""
    out: dict[str, int] = {}
    for config in configs:
        ms = declared_ms(getattr(config.stream, "input_retention_s", None))
        if ms is not None:
            topic = config.stream.input_topic
            out[topic] = min(ms, out.get(topic, ms))
    return out


def apply_declared_retention(bootstrap, retention: dict[str, int]) -> dict[str, str]:
    """Set each raw topic's ``retention.ms`` to the declared one where the broker states another (or none), and
    read it back; returns ``{topic: what was done}``. ``topics apply --config`` calls it; the worker only checks
    (stream_anon.kafka.retention)."""
    if not retention:
        return {}
    admin = confluent_admin(bootstrap)
    out = {}
    for topic, ms in sorted(retention.items()):
        before = topic_retention_ms(admin, topic)
        if before == ms:
            out[topic] = f"retention.ms {ms} as declared"
            continue
        set_topic_retention(admin, topic, ms)
        after = stated_retention_ms(admin, topic, ms)
        if after != ms:
            raise TopicError(f"topic {topic}: retention.ms set to {ms}, the broker states {after}")
        out[topic] = f"retention.ms set to {ms} as declared (was {'not stated' if before is None else before})"
        log.info("topic %s: %s", topic, out[topic])
    return out


def ensure_stream_topics(bootstrap, config, directory: str | Path | None = None) -> dict[str, str]:
    """Apply the topics of one stream (:func:`stream_topic_defs`); idempotent."""
    defs = load_topic_definitions(directory)
    return apply_topics(bootstrap, stream_topic_defs(config, defs))


def ensure_topics(bootstrap, directory: str | Path | None = None, names=None,
                  default_partitions: dict[str, int] | None = None) -> dict[str, str]:
    """Load the definitions from ``directory`` (default: the bundled ones) and apply them (only ``names`` if given).

    A name without a definition is an error unless ``default_partitions`` gives its partition count (then it is
    created with that count and the default retention, and a warning is logged).
    """
    directory = contract.topics_dir() if directory is None else Path(directory)
    defs = load_topic_definitions(directory)
    if names is not None:
        default_partitions = default_partitions or {}
        unknown = sorted(set(names) - set(defs) - set(default_partitions))
        if unknown:
            raise TopicError(f"no definition for topics {unknown} in {directory}")
        chosen = {}
        for n in names:
            if n in defs:
                chosen[n] = defs[n]
            else:
                log.warning("topic %s has no definition in %s: using %d partitions", n, directory,
                            default_partitions[n])
                chosen[n] = TopicDef(n, default_partitions[n], value="(undefined topic)")
        defs = chosen
    return apply_topics(bootstrap, defs)
