"""``stream-anon check`` (issue 43) on the real embedded broker: a stream whose topics `topics apply` made passes
(exit 0); a missing topic, a wrong partition count, a retention longer than declared or shorter than max_delay_s,
a weak secret and a secret whose key id is not the one the stream's last releases carry each give their one line
and exit 1."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import synthetic_fares, write_stream_config  # noqa: E402

from stream_anon.cli import main  # noqa: E402
from stream_anon.kafka.topics import TopicDef, apply_topics  # noqa: E402

OTHER = "other-secret-9876543210fedcba9876543210"


def _config(tmp_path: Path, name: str, extra_stream: str = "") -> Path:
    topic = f"raw.test.{name}"
    path = write_stream_config(tmp_path, name, topic)
    path.write_text(path.read_text().replace(f'input_topic = "{topic}"', f'input_topic = "{topic}"{extra_stream}', 1))
    return path


def _check(capsys, bootstrap, cfg, *extra) -> tuple[int, list[str]]:
    status = main(["check", "--config", str(cfg), "--broker", bootstrap, *extra])
    return status, capsys.readouterr().out.splitlines()


def _applied(capsys, bootstrap, cfg) -> None:
    assert main(["topics", "apply", "--broker", bootstrap, "--config", str(cfg)]) == 0
    capsys.readouterr()


def test_a_stream_set_up_by_topics_apply_is_ready(bootstrap, broker_kind, tmp_path, secret_env, capsys):
    cfg = _config(tmp_path, "ready", "\ninput_retention_s = 86400")
    _applied(capsys, bootstrap, cfg)
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 0, lines
    assert lines[-1].startswith("check: ready (config ready; secret key id ") and "retention 86400 s" in lines[-1]
    # Tansu tells no rights (a note, no finding); Apache Kafka tells the principal's authorized operations (all of
    # them without an authorizer), and they are checked
    if broker_kind == "tansu":
        assert any(ln.startswith("note: rights: the broker does not tell") for ln in lines), lines
    else:
        assert "rights on the topics" in lines[-1] and not any("note: rights" in ln for ln in lines), lines
    # the state topic comes with the worker: a note, no finding
    assert any(ln.startswith("note: state topic stream-anon-ready-state does not exist yet") for ln in lines)


def test_a_missing_topic_and_a_wrong_partition_count(bootstrap, tmp_path, secret_env, capsys):
    cfg = _config(tmp_path, "parts", "\npartitions = 2")
    apply_topics(bootstrap, [TopicDef("raw.test.parts", 3, 604800000)])     # not the declared 2
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 1
    assert "topic raw.test.parts: 3 partitions, 2 expected ([stream] partitions); the count cannot be changed " \
           "in place: create the topic again or declare its count" in lines
    missing = [ln for ln in lines if ln.endswith(f"missing (create it with `stream-anon topics apply --config {cfg}`)")]
    assert {ln.split(":")[0] for ln in missing} == {"topic anon.parts.records", "topic anon.releases",
                                                    "topic anon.deadletter", "topic anon.metrics"}
    assert lines[-1] == f"check: {len(missing) + 1} findings"


def test_retention_longer_than_declared_or_shorter_than_max_delay(bootstrap, tmp_path, secret_env, capsys):
    from stream_anon.kafka.retention import confluent_admin, set_topic_retention

    cfg = _config(tmp_path, "ret", "\ninput_retention_s = 3600")
    _applied(capsys, bootstrap, cfg)
    admin = confluent_admin(bootstrap)
    set_topic_retention(admin, "raw.test.ret", 7200_000)
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 1 and "retention: topic raw.test.ret keeps data 7200 s, longer than the declared 3600 s " \
                           f"([stream] input_retention_s) (set it with `stream-anon topics apply --config {cfg}`)" \
                           in lines, lines
    set_topic_retention(admin, "raw.test.ret", 60_000)        # max_delay_s of the test config: 1800 s
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 1 and lines[0] == (
        "retention: topic raw.test.ret keeps data 60 s, shorter than anonymization.max_delay_s 1800 s: an event can "
        "be deleted while its window is still open, before a restarted worker or the audit reads it"), lines
    assert lines[-1] == "check: 1 finding"


def test_a_weak_or_missing_secret(bootstrap, tmp_path, monkeypatch, capsys):
    cfg = _config(tmp_path, "weak")
    _applied(capsys, bootstrap, cfg)
    monkeypatch.setenv("STREAM_ANON_SECRET", "a" * 40)
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 1 and lines[0].startswith("secret: STREAM_ANON_SECRET: the secret is too weak (about 0 bits"), lines
    monkeypatch.delenv("STREAM_ANON_SECRET")
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 1 and lines[0].startswith("secret: STREAM_ANON_SECRET: the secret is missing"), lines


def test_a_secret_whose_key_id_is_not_the_streams(bootstrap, tmp_path, secret_env, monkeypatch, capsys):
    """Releases made by the engine under the test secret are on the broker; a check with another secret names both
    key ids, and the previous secret of a key rotation counts as the stream's."""
    from confluent_kafka import Producer

    from stream_anon import crypto
    from stream_anon.config import load_config
    from stream_anon.worker.core import WorkerCore

    cfg = _config(tmp_path, "kid")
    _applied(capsys, bootstrap, cfg)
    core = WorkerCore(load_config(cfg), "app", secret_env)
    ps = core.open_partition(0)
    events = synthetic_fares(400, seed=3)
    out = core.process(ps, [(i, json.dumps(e).encode()) for i, e in enumerate(events)]).messages
    out += core.flush(ps).messages
    producer = Producer({"bootstrap.servers": bootstrap, "logger": logging.getLogger("stream_anon.kafka.client")})
    released = 0
    for topic, key, value in out:
        if topic == "anon.releases":
            producer.produce(topic, value, key)
            released += 1
    assert released and producer.flush(15) == 0
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 0 and "key id as the last releases of 1 partition" in lines[-1], lines

    monkeypatch.setenv("STREAM_ANON_SECRET", OTHER)
    status, lines = _check(capsys, bootstrap, cfg)
    mine, theirs = crypto.key_id(OTHER.encode()), crypto.key_id(secret_env)
    assert status == 1 and lines[0] == (
        f"secret: key id {mine}, the stream's last releases (partitions 0) carry key id {theirs}: a worker with this "
        "secret halts those partitions (key_changed); give it the secret the stream runs with, or rotate the key "
        "(docs/operations.md, Key rotation)"), lines
    monkeypatch.setenv("STREAM_ANON_PREVIOUS_SECRET", secret_env.decode())      # a rotation under way
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 0, lines


def test_an_unreachable_broker_is_one_finding(tmp_path, secret_env, capsys):
    from stream_anon.broker import free_port

    cfg = _config(tmp_path, "away")
    status, lines = _check(capsys, f"127.0.0.1:{free_port()}", cfg)
    assert status == 1 and len(lines) == 2 and lines[0].startswith("broker 127.0.0.1:") \
        and "no answer to a metadata request within 15 s" in lines[0], lines


def test_an_invalid_config_is_one_finding(bootstrap, tmp_path, secret_env, capsys):
    cfg = _config(tmp_path, "bad")
    cfg.write_text(cfg.read_text().replace("k = 5", "k = 0"))
    status, lines = _check(capsys, bootstrap, cfg)
    assert status == 1 and lines[0].startswith(f"config {cfg}: anonymization.k") and lines[-1] == "check: 1 finding"
