"""``stream-anon check``: a pre-flight of one stream before its worker starts, against the broker it will use.

Each check says what the worker (or the audit) would otherwise find later, one line per finding:

- the config loads (the worker's own validation: :func:`stream_anon.config.load_config`);
- the secret is set and strong enough (:func:`stream_anon.crypto.load_secret`), and its key id is the one the
  stream's last releases carry (a worker with another secret halts its partitions with ``key_changed``);
- the broker answers; the stream's topics exist with the partition count the worker expects
  (:func:`stream_anon.kafka.topics.stream_topic_defs`), an existing state topic takes the worker's state records and
  the input topic takes the events the config accepts (``max.message.bytes``);
- the input topic's retention is within the declared ``[stream] input_retention_s`` (as the worker's start-up
  guard judges it: :mod:`stream_anon.kafka.retention`) and not shorter than ``max_delay_s``;
- the principal's rights on those topics, where the broker tells them (authorized operations); a broker that
  does not tell gets one note, never a finding.

Notes (``note: ...``) are information; only findings make the exit status 1.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

from stream_anon import crypto

TIMEOUT_S = 15.0            # each broker request (metadata, configs, descriptions)
TAIL_MESSAGES = 2000        # per partition of the releases topic: where the stream's last releases are looked for
IDLE_S = 1.0                # quiet time that ends the read of that tail

client_log = logging.getLogger("stream_anon.kafka.client")


@dataclass
class Preflight:
    """What :func:`run` found: ``findings`` (each one line, exit 1), ``notes`` (information) and what was checked
    (``checked``, for the closing line)."""

    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = list(self.findings) + [f"note: {n}" for n in self.notes]
        if self.findings:
            out.append(f"check: {len(self.findings)} finding{'s' if len(self.findings) != 1 else ''}")
        else:
            out.append("check: ready (" + "; ".join(self.checked) + ")")
        return out

    @property
    def exit_status(self) -> int:
        return 1 if self.findings else 0


def run(config_path, conn, app_id: str | None = None, allow_outside_paths: bool = False,
        timeout_s: float = TIMEOUT_S, named: str | None = None) -> Preflight:
    """Every check of the module docstring for the stream of ``config_path`` on the broker of ``conn``
    (a :class:`stream_anon.connection.KafkaConnection`); ``app_id``: the worker's (default as the worker's);
    ``named``: the config as the user named it (in the commands a finding suggests)."""
    from stream_anon.config import ConfigError, load_config

    out = Preflight()
    try:
        config = load_config(config_path, allow_outside_paths)
    except (OSError, ConfigError) as exc:
        out.findings.append(f"config {config_path}: {exc}")
        return out
    out.checked.append(f"config {config.stream.name}")
    named = named or str(config_path)
    secret = _secret(out)
    admin = _admin(conn)
    names = _topic_names(admin, timeout_s)
    if names is None:
        out.findings.append(f"broker {conn.describe()}: no answer to a metadata request within {timeout_s:g} s: "
                            "check the address, the listener it advertises and the connection settings")
        return out
    app_id = app_id or f"stream-anon-{config.stream.name}"
    present = _topics(out, admin, config, named, app_id, names, timeout_s)
    _retention(out, admin, config, named, present, timeout_s)
    _rights(out, admin, present, config, app_id, timeout_s)
    if secret is not None:
        _key_id(out, conn, config.stream.name, secret, present)
    return out


def _secret(out: Preflight) -> bytes | None:
    try:
        secret = crypto.load_secret()
    except crypto.SecretError as exc:
        out.findings.append(f"secret: {exc}")
        return None
    out.checked.append(f"secret key id {crypto.key_id(secret)}")
    return secret


def _admin(conn):
    from confluent_kafka.admin import AdminClient
    return AdminClient({**conn.confluent(), "logger": client_log})


def _topic_names(admin, timeout_s: float) -> dict[str, int] | None:
    """Topic -> partition count on the broker, or None when it does not answer."""
    from confluent_kafka import KafkaException

    client_log.disabled = True          # librdkafka's retries while it is down are the one finding's business
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return None
    finally:
        client_log.disabled = False
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


def _topics(out: Preflight, admin, config, named: str, app_id: str, names: dict[str, int], timeout_s: float) -> dict:
    """Presence, partition counts and message size limits; returns the planned topics that exist (name ->
    TopicDef), the state topic among them when it exists."""
    from stream_anon.worker import state as st
    from stream_anon.kafka.topics import input_partitions, state_topic_def, stream_topic_defs

    plan = stream_topic_defs(config)
    state = state_topic_def(config, app_id)
    source = {config.stream.input_topic: input_partitions(config)[1]}
    present = {}
    for name, d in plan.items():
        if name not in names:
            out.findings.append(f"topic {name}: missing (create it with `stream-anon topics apply --config "
                                f"{named}`)")
            continue
        present[name] = d
        why = source.get(name, "topic definition")
        if names[name] != d.partitions and not why.startswith("default"):
            out.findings.append(f"topic {name}: {names[name]} partitions, {d.partitions} expected ({why}); the count "
                                "cannot be changed in place: create the topic again or declare its count")
    configs = _configs(admin, [n for n in (config.stream.input_topic, state.name) if n in names], timeout_s)
    limit = _int(configs.get(config.stream.input_topic, {}).get("max.message.bytes"))
    if limit is not None and limit < config.limits.max_event_bytes:
        out.findings.append(f"topic {config.stream.input_topic}: max.message.bytes {limit} is below [limits] "
                            f"max_event_bytes {config.limits.max_event_bytes}: the broker refuses events the stream "
                            "accepts")
    if state.name in names:
        present[state.name] = state
        if names[state.name] != state.partitions:
            out.findings.append(f"topic {state.name}: {names[state.name]} partitions, {state.partitions} expected "
                                "(one per input partition): the worker halts")
        problem = st.topic_limit_problem(configs.get(state.name, {}))
        if problem:
            out.findings.append(f"topic {state.name}: {problem}")
    else:
        out.notes.append(f"state topic {state.name} does not exist yet: the worker creates it at start "
                         f"(or `stream-anon topics apply --config {named} --app-id {app_id}`)")
    out.checked.append(f"{len(present)} topics")
    return present


def _configs(admin, topics: list[str], timeout_s: float) -> dict[str, dict[str, str]]:
    """Topic -> its configuration as the broker states it (name -> value); a topic it cannot describe: {}."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource

    out: dict[str, dict[str, str]] = {}
    if not topics:
        return out
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics],
                                     request_timeout=timeout_s)
    for resource, future in futures.items():
        try:
            out[resource.name] = {k: e.value for k, e in future.result(timeout_s).items() if e.value is not None}
        except KafkaException:
            out[resource.name] = {}
    return out


def _int(value) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _retention(out: Preflight, admin, config, named: str, present: dict, timeout_s: float) -> None:
    """The input topic's retention.ms: within the declared input_retention_s (the worker's guard), and long
    enough that an event is still there while its window may be open."""
    from stream_anon.kafka.retention import check_raw_retention, topic_retention_ms

    topic = config.stream.input_topic
    if topic not in present:
        return
    check = check_raw_retention(admin, topic, config.stream.input_retention_s)
    if check is not None and check.exceeded:
        out.findings.append(f"retention: {check.detail()} (set it with `stream-anon topics apply --config "
                            f"{named}`)")
        return
    try:
        kept = topic_retention_ms(admin, topic, timeout_s) if check is None else check.retention_ms
    except Exception:   # noqa: BLE001 - a broker that does not describe it: nothing to judge here
        kept = None
    needed = config.anonymization.max_delay_s * 1000
    if kept is not None and 0 <= kept < needed:
        out.findings.append(f"retention: topic {topic} keeps data {kept / 1000:g} s, shorter than "
                            f"anonymization.max_delay_s {needed / 1000:g} s: an event can be deleted while its "
                            "window is still open, before a restarted worker or the audit reads it")
        return
    out.checked.append("retention " + ("not stated" if kept is None else "forever" if kept < 0 else
                                       f"{kept / 1000:g} s"))


# the operations the worker needs on each kind of topic (consumer groups and transactional ids are not topics:
# a broker tells their rights only per group, once it exists)
_READ, _WRITE = ("READ", "DESCRIBE"), ("WRITE", "DESCRIBE")


def _rights(out: Preflight, admin, present: dict, config, app_id: str, timeout_s: float) -> None:
    """The principal's authorized operations on the topics that exist, where the broker tells them."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AclOperation

    if not present:
        return
    try:
        futures = admin.describe_topics(TopicCollection(sorted(present)), include_authorized_operations=True,
                                        request_timeout=timeout_s)
        told = {name: f.result(timeout_s).authorized_operations for name, f in futures.items()}
    except KafkaException as exc:
        out.notes.append(f"rights: the broker did not describe the topics ({exc}): not checked")
        return
    if not any(told.values()):
        out.notes.append("rights: the broker does not tell the principal's authorized operations: not checked")
        return
    state = f"{app_id}-state"
    for name, ops in sorted(told.items()):
        if not ops:
            continue
        have = {op.name for op in ops}
        if AclOperation.ALL.name in have:
            continue
        need = _READ if name == config.stream.input_topic else _READ + _WRITE if name == state else _WRITE
        missing = sorted(set(need) - have)
        if missing:
            out.findings.append(f"rights: topic {name}: the principal lacks {', '.join(missing)} (has "
                                f"{', '.join(sorted(have)) or 'nothing'})")
    out.checked.append("rights on the topics")


def _key_id(out: Preflight, conn, stream: str, secret: bytes, present: dict) -> None:
    """This secret's key id against the one the stream's last releases carry (the newest manifest of each stream
    partition in the tail of the releases topic). The previous secret of a key rotation counts as the stream's."""
    from stream_anon.contract import topics

    releases = topics().releases
    if releases not in present:
        return
    last = last_manifests(conn, releases, stream)
    if not last:
        out.notes.append(f"no release of stream {stream} in the last {TAIL_MESSAGES} messages of each partition "
                         f"of {releases}: the key id is not compared")
        return
    mine = crypto.key_id(secret)
    previous = os.environ.get(crypto.PREVIOUS_SECRET_ENV) or os.environ.get(crypto.PREVIOUS_SECRET_FILE_ENV)
    accepted = {mine}
    if previous:
        try:
            accepted.add(crypto.key_id(crypto.load_secret(crypto.PREVIOUS_SECRET_ENV,
                                                          crypto.PREVIOUS_SECRET_FILE_ENV)))
        except crypto.SecretError as exc:
            out.findings.append(f"previous secret: {exc}")
    theirs: dict[str | None, list[int]] = {}
    for partition, m in sorted(last.items()):
        theirs.setdefault(m.get("kid"), []).append(partition)
    for kid, partitions in sorted(theirs.items(), key=lambda kv: str(kv[0])):
        if kid is not None and kid not in accepted:
            out.findings.append(f"secret: key id {mine}, the stream's last releases (partitions "
                                f"{', '.join(map(str, partitions))}) carry key id {kid}: a worker with this secret "
                                "halts those partitions (key_changed); give it the secret the stream runs with, or "
                                "rotate the key (docs/operations.md, Key rotation)")
    if not out.findings or all(not f.startswith("secret: key id") for f in out.findings):
        out.checked.append(f"key id as the last releases of {len(last)} partition{'s' if len(last) != 1 else ''}")


# answers of a broker whose partition leaders are not known yet or moving (Apache Kafka right after a topic is
# created or deleted and created again): asked again until TIMEOUT_S
_LEADER_NOT_READY = ("NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART")


def _watermarks(consumer, tp) -> tuple[int, int]:
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            err = exc.args[0]
            transient = isinstance(err, KafkaError) and (err.retriable() or err.name() in _LEADER_NOT_READY)
            if not transient or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def last_manifests(conn, topic: str, stream: str, tail: int = TAIL_MESSAGES, idle_s: float = IDLE_S,
                   max_wait_s: float = 60.0) -> dict[int, dict]:
    """Stream partition -> the stream's newest manifest (by ``created_at``) among the last ``tail`` messages of
    each partition of ``topic`` (committed ones; read until ``idle_s`` without a new message)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conn.confluent(), "logger": client_log, "group.id": "stream-anon-check",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "allow.auto.create.topics": False})
    try:
        md = consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        tps = []
        for p in sorted(md.partitions if md is not None else ()):
            low, high = _watermarks(consumer, TopicPartition(topic, p))
            tps.append(TopicPartition(topic, p, max(low, high - tail, 0)))
        if not tps:
            return {}
        consumer.assign(tps)
        newest: dict[int, dict] = {}
        start = quiet = time.monotonic()
        while time.monotonic() - quiet < idle_s and time.monotonic() - start < max_wait_s:
            msgs = consumer.consume(500, timeout=0.2)
            if msgs:
                quiet = time.monotonic()
            for msg in msgs:
                value = msg.value()
                if msg.error() is not None or value is None:
                    continue
                try:
                    doc = json.loads(value)
                except ValueError:
                    continue
                if not isinstance(doc, dict) or doc.get("stream") != stream or "partition" not in doc:
                    continue
                held = newest.get(doc["partition"])
                if held is None or str(doc.get("created_at", "")) >= str(held.get("created_at", "")):
                    newest[doc["partition"]] = doc
        return newest
    finally:
        consumer.close()
