"""The retention guard on a real broker (Tansu and Apache Kafka): what it states of ``retention.ms`` (set at creation,
altered, never stated), ``topics apply --config`` setting the declared retention on an existing raw topic, and a worker
whose raw topic keeps data longer than declared raising ``raw_retention_exceeded`` (WARNING line, anon.metrics,
/metrics, /readyz detail) while it goes on."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import read_all, wait_for, write_stream_config  # noqa: E402
from _metrics_helpers import families, get  # noqa: E402

from stream_anon.broker import free_port  # noqa: E402
from stream_anon.kafka.retention import LONGER, NOT_STATED, RAW_RETENTION_EXCEEDED, UNLIMITED, check_raw_retention, \
    confluent_admin, stated_retention_ms, topic_retention_ms  # noqa: E402
from stream_anon.kafka.topics import TopicDef, apply_topics, load_topic_definitions  # noqa: E402

DAY_MS, WEEK_MS = 86_400_000, 604_800_000


def _declaring(tmp_path: Path, name: str, topic: str, retention_s: float) -> Path:
    path = write_stream_config(tmp_path, name, topic)
    text = path.read_text().replace(f'input_topic = "{topic}"', f'input_topic = "{topic}"\ninput_retention_s = '
                                    f'{retention_s}', 1)
    path.write_text(text)
    return path


def test_what_the_broker_states_and_the_check(bootstrap, broker_kind):
    apply_topics(bootstrap, [TopicDef("ret.week", 1, WEEK_MS), TopicDef("ret.forever", 1, -1)])
    # created without retention.ms (kafka-python's NewTopic with no configs): Tansu states none, Apache Kafka its
    # default (log.retention.hours = 168: a week), longer than the day declared below either way
    from kafka.admin import KafkaAdminClient, NewTopic
    admin_kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin_kp.create_topics([NewTopic("ret.unstated", 1, 1)])
    admin_kp.close()
    admin = confluent_admin(bootstrap)
    wait_for(lambda: topic_retention_ms(admin, "ret.week") == WEEK_MS, 10, "retention stated")
    assert topic_retention_ms(admin, "ret.forever") == -1
    assert topic_retention_ms(admin, "ret.unstated") == (None if broker_kind == "tansu" else WEEK_MS)
    assert check_raw_retention(admin, "ret.week", 7 * 86400).cause is None
    assert check_raw_retention(admin, "ret.week", 8 * 86400).exceeded is False
    longer = check_raw_retention(admin, "ret.week", 86400)
    assert (longer.exceeded, longer.cause, longer.retention_ms, longer.declared_ms) == (True, LONGER, WEEK_MS, DAY_MS)
    assert check_raw_retention(admin, "ret.forever", 86400).cause == UNLIMITED
    assert check_raw_retention(admin, "ret.unstated", 86400).cause == (NOT_STATED if broker_kind == "tansu" else LONGER)
    assert check_raw_retention(admin, "ret.week", None) is None        # nothing declared, nothing checked


def test_topics_apply_sets_the_declared_retention(bootstrap, tmp_path, capsys):
    from stream_anon.cli import main
    topic = "raw.test.retapply"
    defs = load_topic_definitions()
    apply_topics(bootstrap, [replace(defs["raw.fare.oyster"], name=topic, partitions=1)])    # 7 days
    admin = confluent_admin(bootstrap)
    assert stated_retention_ms(admin, topic, WEEK_MS) == WEEK_MS
    cfg = _declaring(tmp_path, "retapply", topic, 86400)
    assert main(["topics", "apply", "--broker", bootstrap, "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert f"{topic}: retention.ms set to {DAY_MS} as declared (was {WEEK_MS})" in out
    assert topic_retention_ms(admin, topic) == DAY_MS
    assert check_raw_retention(admin, topic, 86400).exceeded is False
    # idempotent: the second run finds it as declared
    assert main(["topics", "apply", "--broker", bootstrap, "--config", str(cfg)]) == 0
    assert f"{topic}: retention.ms {DAY_MS} as declared" in capsys.readouterr().out
    # a stream whose input topic does not exist yet: created with the declared retention
    fresh = _declaring(tmp_path / "fresh", "retfresh", "raw.test.retfresh", 3600)
    assert main(["topics", "apply", "--broker", bootstrap, "--config", str(fresh)]) == 0
    assert stated_retention_ms(admin, "raw.test.retfresh", 3_600_000) == 3_600_000


def test_worker_alerts_on_a_raw_topic_kept_longer_than_declared(bootstrap, tmp_path, secret_env):
    from stream_anon.kafka.supervise import start_worker_process, stop_worker_process
    topic, name = "raw.test.retworker", "retworker"
    apply_topics(bootstrap, [TopicDef(topic, 1, WEEK_MS)])
    cfg = _declaring(tmp_path, name, topic, 86400)
    port, log_path = free_port(), tmp_path / "worker.log"
    proc = start_worker_process(cfg, bootstrap, tmp_path / "state", f"{name}-app", None, log_path,
                                extra=["--web-port", str(port)])
    try:
        ready = wait_for(lambda: (lambda r: json.loads(r[1]) if r[0] == 200 else None)(get(port, "/readyz")), 90,
                         "/readyz 200")
        # the alert never makes the worker unready: it goes on
        assert ready["ready"] is True
        guard = ready["raw_retention"]
        assert (guard["topic"], guard["retention_ms"], guard["declared_ms"], guard["exceeded"], guard["cause"]) == \
            (topic, WEEK_MS, DAY_MS, True, LONGER)
        fams = families(get(port, "/metrics")[1])
        samples = {(n, lab.get("topic") or lab.get("alert")): v for fam in fams.values()
                   for n, lab, v in fam["samples"]}
        assert samples[("stream_anon_raw_retention_exceeded", topic)] == 1.0
        assert samples[("stream_anon_raw_retention_seconds", topic)] == WEEK_MS / 1000
        assert samples[("stream_anon_raw_retention_declared_seconds", topic)] == 86400.0
        assert samples[("stream_anon_alerts_total", RAW_RETENTION_EXCEEDED)] == 1.0
        alerts = [doc for _key, doc, _p, _o in read_all(bootstrap, "anon.metrics", stream=name, min_count=1)
                  if doc.get("alert") == RAW_RETENTION_EXCEEDED]
        assert len(alerts) == 1 and alerts[0]["retention_ms"] == WEEK_MS and alerts[0]["declared_ms"] == DAY_MS
        assert alerts[0]["cause"] == LONGER and topic in alerts[0]["detail"]
    finally:
        stop_worker_process(proc)
    text = log_path.read_text()
    assert "WARNING" in text and f"alert {RAW_RETENTION_EXCEEDED}: topic {topic} keeps data 604800 s, longer than " \
                                  f"the declared 86400 s" in text
