"""The Apache Kafka launcher's cluster plan (tests/_apache_kafka.py), without Java: what each node's
server.properties says for a cluster with an extra listener, as the cluster and security tests start it."""
from __future__ import annotations

from _apache_kafka import CONTROLLER, ApacheKafka, kafka_version, random_cluster_id


def _properties(node) -> dict[str, str]:
    return dict(line.split("=", 1) for line in node.properties_path.read_text().splitlines())


def test_a_four_node_plan_has_a_quorum_of_three_and_the_listeners_asked():
    kafka = ApacheKafka(4, listeners={"SASL_SSL": "SASL_SSL"}, client_listener="SASL_SSL",
                        server_properties=lambda node_id: {"broker.rack": f"r{node_id}"})
    try:
        nodes = kafka.plan()
        props = {i: _properties(n) for i, n in nodes.items()}
        voters = {f"{i}@127.0.0.1:{nodes[i].ports[CONTROLLER]}" for i in (1, 2, 3)}
        for i, p in props.items():
            assert set(p["controller.quorum.voters"].split(",")) == voters
            assert p["process.roles"] == ("broker,controller" if i <= 3 else "broker")
            assert (CONTROLLER in p["listeners"]) == (i <= 3) and "CONTROLLER" not in p["advertised.listeners"]
            assert f"SASL_SSL://127.0.0.1:{nodes[i].ports['SASL_SSL']}" in p["advertised.listeners"]
            assert "SASL_SSL:SASL_SSL" in p["listener.security.protocol.map"]
            assert p["inter.broker.listener.name"] == "PLAINTEXT" and p["broker.rack"] == f"r{i}"
            # replication factor 3 and min ISR 2 for new topics and the internal ones (transaction state included)
            assert (p["default.replication.factor"], p["min.insync.replicas"]) == ("3", "2")
            assert (p["transaction.state.log.replication.factor"], p["transaction.state.log.min.isr"]) == ("3", "2")
            assert p["offsets.topic.replication.factor"] == "3" and p["node.id"] == str(i)
        assert kafka.bootstrap == ",".join(f"127.0.0.1:{nodes[i].ports['SASL_SSL']}" for i in (1, 2, 3, 4))
        assert len({port for n in nodes.values() for port in n.ports.values()}) == 3 * 3 + 1 * 2   # all distinct
    finally:
        kafka.stop()
    assert kafka.workdir is None and not kafka.nodes


def test_the_version_is_pinned_once_and_cluster_ids_are_kafkas_form():
    assert kafka_version().split(".")[0] == "4"
    ids = {random_cluster_id() for _ in range(200)}
    assert len(ids) == 200 and all(len(i) == 22 and not i.startswith("-") for i in ids)
