"""The embedded broker and topic provisioning against the real Tansu broker."""
from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from stream_anon.broker import BrokerError, EmbeddedBroker
from stream_anon.kafka.topics import (TopicMismatchWarning, apply_topics, existing_partitions,
                                      load_topic_definitions)

pytestmark = pytest.mark.kafka

EXPECTED = {"raw.fare.oyster": 4, "raw.vehicle.citibike": 4, "raw.vehicle.obd2": 4, "anon.oyster.records": 1,
            "anon.citibike.records": 1, "anon.obd2.records": 1, "anon.releases": 1, "anon.deadletter": 1,
            "anon.metrics": 1, "anon.aggregates": 1, "raw.fare.oyster-cards": 4, "anon.oyster-cards.records": 1}


def test_broker_fixture_roundtrip(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    host, port = broker.bootstrap.split(":")
    assert host == "127.0.0.1" and int(port) > 0
    apply_topics(broker.bootstrap, [replace(load_topic_definitions()["anon.aggregates"], name="t.roundtrip",
                                            partitions=1)])
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i in range(5):
        p.send("t.roundtrip", value=f"m{i}".encode())
    p.flush()
    p.close()
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, auto_offset_reset="earliest",
                      enable_auto_commit=False, consumer_timeout_ms=3000)
    tp = TopicPartition("t.roundtrip", 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got = [m.value for m in c]
    c.close()
    assert got == [f"m{i}".encode() for i in range(5)]


def test_broker_start_failure_reports_output(tmp_path):
    fake = tmp_path / "fake-broker"
    fake.write_text("#!/bin/sh\necho 'boom: cannot bind' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(BrokerError, match="boom: cannot bind"):
        with EmbeddedBroker(binary=str(fake), startup_timeout_s=5):
            pass


def test_topic_definitions_complete():
    defs = load_topic_definitions()
    assert {n: d.partitions for n, d in defs.items()} == EXPECTED
    for name in ("raw.fare.oyster", "raw.vehicle.citibike", "raw.vehicle.obd2"):
        assert defs[name].value_schema is not None and defs[name].value_schema.name.endswith(".schema.json")
        assert defs[name].key
    assert all(d.retention_ms != 0 for d in defs.values())


def test_apply_topics_idempotent(broker):
    defs = load_topic_definitions()
    first = apply_topics(broker.bootstrap, defs)
    assert set(first) == set(EXPECTED) and set(first.values()) <= {"created", "exists"}
    second = apply_topics(broker.bootstrap, defs)
    assert set(second.values()) == {"exists"}
    assert existing_partitions(broker.bootstrap, list(EXPECTED)) == EXPECTED
    # a definition that disagrees with the broker is warned about, never applied
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = apply_topics(broker.bootstrap, [replace(defs["anon.metrics"], partitions=3)])
    assert res == {"anon.metrics": "mismatch"}
    assert any(issubclass(w.category, TopicMismatchWarning) for w in caught)
    assert existing_partitions(broker.bootstrap, ["anon.metrics"]) == {"anon.metrics": 1}
