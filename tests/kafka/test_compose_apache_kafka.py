"""docker-compose.yml against the Apache Kafka it names, without Docker: the kafka service's environment becomes the
server properties of a broker of that version (tests/_apache_kafka.py), and the topics and worker services' commands
and environment run against it as written (hosts, ports and the state volume mapped to this machine)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from _apache_kafka import kafka_version
from _compose import SERVICES, command, ready, service_environment
from _kafka_helpers import committed_offsets
from stream_anon.broker import free_port

EVENTS = 2000
# the apache/kafka image's own variables, not server properties (its entrypoint skips them)
IMAGE_VARIABLES = {"KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_GC_LOG_OPTS",
                   "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_VERSION"}
# where the broker is reached: the container's names and ports, mapped to the launcher's free loopback ports
ADDRESS_PROPERTIES = {"listeners", "advertised.listeners", "controller.quorum.voters"}


def server_properties(environment: dict) -> dict[str, str]:
    """The apache/kafka image's mapping: ``KAFKA_`` dropped, lower case, ``___`` is ``-``, ``__`` is ``_``,
    ``_`` is ``.``."""
    props = {}
    for name, value in environment.items():
        if name.startswith("KAFKA_") and name not in IMAGE_VARIABLES:
            key = name[len("KAFKA_"):].lower().replace("___", "-").replace("__", "\0").replace("_", ".")
            props[key.replace("\0", "_")] = str(value)
    return props


def test_compose_names_the_apache_kafka_version_the_tests_run():
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{kafka_version()}"


def _committed(bootstrap: str) -> int:
    from kafka.errors import KafkaError

    try:
        return sum(committed_offsets(bootstrap, "stream-anon-oyster", "raw.fare.oyster").values())
    except KafkaError as err:
        if err.retriable:     # the group's coordinator moving, or the offsets topic still being created
            return 0
        raise


def test_compose_broker_settings_topics_and_two_workers_run_on_that_apache_kafka(tmp_path, apache_kafka_tools):
    props = server_properties(SERVICES["kafka"]["environment"])
    # the addresses are the container's; their listener names and protocols are the launcher's
    assert {p.split("://")[0] for p in props["listeners"].split(",")} == {"PLAINTEXT", "CONTROLLER"}
    assert props["controller.listener.names"] == "CONTROLLER"
    settings = {k: v for k, v in props.items() if k not in ADDRESS_PROPERTIES}
    secret = "compose-test-secret-" + "0123456789abcdef" * 2
    # the workers get the compose environment alone (the suite's STREAM_ANON_SESSION_TIMEOUT_S etc. dropped)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_ANON_")}
    compose_env = {**base_env, "STREAM_ANON_SECRET": secret}
    workers: list[subprocess.Popen] = []
    with apache_kafka_tools(server_properties=settings) as kafka:
        bootstrap = kafka.bootstrap
        topics = subprocess.run(command("topics", bootstrap, tmp_path, 0), capture_output=True, text=True,
                                timeout=120, env=base_env)
        assert topics.returncode == 0, topics.stderr[-2000:]
        assert "raw.fare.oyster: created" in topics.stdout and "anon.releases: created" in topics.stdout
        replay = subprocess.run([sys.executable, "-m", "stream_anon.cli", "replay", "--dataset", "oyster",
                                 "--events", str(EVENTS), "--topic", "raw.fare.oyster", "--config", "oyster",
                                 "--broker", bootstrap], capture_output=True, text=True, timeout=180,
                                env=compose_env)
        assert replay.returncode == 0, replay.stderr[-2000:]
        counts = json.loads(replay.stdout.strip().splitlines()[-1])
        assert counts["events"] == EVENTS and counts["errors"] == 0
        ports = {}
        try:
            for service in ("worker-1", "worker-2"):
                env = service_environment(service, compose_env)
                ports[service] = free_port()
                with open(tmp_path / f"{service}.log", "w") as log:
                    workers.append(subprocess.Popen(command(service, bootstrap, tmp_path / "state", ports[service]),
                                                    env=env, stdout=log, stderr=subprocess.STDOUT,
                                                    cwd=tmp_path))
            # the compose workers do not flush when idle: the last windows stay open, so the test waits for the
            # group's committed input offsets (every event read and its transaction committed), not for releases
            deadline = time.monotonic() + 240
            while _committed(bootstrap) < EVENTS:
                assert all(w.poll() is None for w in workers), "a compose worker exited"
                assert time.monotonic() < deadline, "the compose workers did not commit every input offset in 240 s"
                time.sleep(1)
            # the compose healthcheck: both workers ready (partitions assigned and recovered, none halted), once
            # the second one's join has moved half of the partitions to it
            while not all(ready(port) for port in ports.values()):
                assert time.monotonic() < deadline, f"compose workers not both ready: {ports}"
                time.sleep(1)
            audit = subprocess.run([sys.executable, "-m", "stream_anon.cli", "audit", "--config", "oyster",
                                    "--broker", bootstrap, "--idle", "1.0"], capture_output=True, text=True,
                                   timeout=240, env=compose_env)
            assert audit.stdout.startswith("AUDIT PASSED"), audit.stdout[-3000:] + audit.stderr[-2000:]
        finally:
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
