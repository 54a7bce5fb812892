"""Apache Kafka for the test tier (not shipped): the broker's jars from Maven Central, run in KRaft mode on free
loopback ports, one combined node or a cluster of several.

The version is pinned once, in ``tests/apache_kafka/pom.xml``; ``mvn dependency:copy-dependencies`` fetches its
runtime closure once into ``~/.cache/stream-anon/apache-kafka-<version>/lib`` (``STREAM_ANON_KAFKA_CACHE``
overrides the directory) and every later start reuses it. ``kafka.tools.StorageTool`` formats each node's log
directory, ``kafka.Kafka`` starts it. ``ApacheKafka`` has :class:`stream_anon.broker.EmbeddedBroker`'s interface
(``.bootstrap``, ``start``/``stop``, a context manager, ``log()``) plus what the cluster tests need: kill -9,
SIGSTOP/SIGCONT and restart of one node, extra listeners and server properties, and arguments to the storage format
(``--add-scram`` users). Everything a broker writes lives in a temporary directory removed by ``stop``.

``python tests/_apache_kafka.py [NODES]`` runs one until Ctrl-C and prints ``bootstrap=...``.
"""
from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Mapping

from stream_anon.broker import BrokerError, _die_with_parent

POM = Path(__file__).resolve().parent / "apache_kafka" / "pom.xml"
STARTED = "Kafka Server started"    # KafkaRaftServer logs it once the broker is unfenced and serving
CONTROLLER = "CONTROLLER"
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def kafka_version() -> str:
    """The Apache Kafka version the tests run, as pinned in the pom."""
    m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if not m:
        raise BrokerError(f"{POM}: no <kafka.version>")
    return m.group(1).strip()


def missing_tools() -> list[str]:
    """The programs the Apache Kafka tier needs that are not on PATH (``java`` 17+, ``mvn``)."""
    return [tool for tool in ("java", "mvn") if shutil.which(tool) is None]


def cache_dir() -> Path:
    override = os.environ.get("STREAM_ANON_KAFKA_CACHE")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "stream-anon" / f"apache-kafka-{kafka_version()}"


def ensure_jars() -> Path:
    """The directory of the broker's runtime jars, fetched with Maven on first use (one process at a time: pytest
    workers share the cache, and a lock file keeps a second one from reading a half-copied directory)."""
    root = cache_dir()
    lib, done = root / "lib", root / "lib.complete"
    # the marker names the pom it was fetched for: a dependency added to the pom is fetched into an existing cache
    fetched_for = f"{kafka_version()} {hashlib.sha256(POM.read_bytes()).hexdigest()[:16]}\n"
    if done.exists() and done.read_text() == fetched_for:
        return lib
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and done.read_text() == fetched_for:
            return lib
        missing = missing_tools()
        if missing:
            raise BrokerError(f"Apache Kafka needs {' and '.join(missing)} on PATH")
        shutil.rmtree(lib, ignore_errors=True)
        cmd = ["mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
               f"-DoutputDirectory={lib}"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if run.returncode != 0 or not any(lib.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"fetching Apache Kafka's jars failed ({' '.join(cmd)}):\n"
                              f"{(run.stdout + run.stderr)[-3000:]}")
        done.write_text(fetched_for)
    return lib


def _free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` a moment ago (held together while chosen, so none repeats)."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def random_cluster_id() -> str:
    """What ``kafka-storage random-uuid`` prints: 16 random bytes, URL-safe base64 without padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):   # Kafka's own generator never makes these (they read as options)
            return text


# the admin client of ``reset``: librdkafka's own lines (a broker just restarted, a topic being deleted) would go to
# the test's stderr
_QUIET = logging.getLogger("apache-kafka-reset")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


class KafkaNode:
    """One ``kafka.Kafka`` process: its id, roles, ports (listener name -> port), directory and log."""

    def __init__(self, node_id: int, roles: str, ports: dict[str, int], directory: Path):
        self.node_id = node_id
        self.roles = roles
        self.ports = ports
        self.directory = directory
        self.proc: subprocess.Popen | None = None
        self.log_path = directory / "server.log"
        self.properties_path = directory / "server.properties"
        self.started_at = 0.0

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class ApacheKafka:
    """Apache Kafka (KRaft) on free loopback ports for the lifetime of a ``with`` block.

    ``nodes`` processes; the first ``controllers`` of them (all of them up to 3 by default) are combined
    broker+controller nodes forming the controller quorum, the others brokers only. ``replication_factor``
    (default: the number of nodes, at most 3) and ``min_insync_replicas`` (default: ``replication_factor - 1``,
    at least 1) apply to topics created without them and to the internal topics (consumer offsets, transaction
    state). ``listeners`` maps extra client listener names to their security protocol (``{"SASL_SSL":
    "SASL_SSL"}``), ``client_listener`` is the one ``bootstrap`` names and ``inter_broker_listener`` the one brokers
    replicate over (both default to PLAINTEXT, always present). ``server_properties`` (a mapping, or a function of
    the node id returning one) adds or overrides server properties; ``format_args`` go to ``StorageTool format``
    (e.g. ``["--add-scram", "SCRAM-SHA-512=[name=admin,password=...]"]``).
    """

    def __init__(self, nodes: int = 1, *, controllers: int | None = None, replication_factor: int | None = None,
                 min_insync_replicas: int | None = None, listeners: Mapping[str, str] | None = None,
                 client_listener: str = "PLAINTEXT", inter_broker_listener: str = "PLAINTEXT",
                 server_properties: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
                 format_args: list[str] | tuple[str, ...] = (), host: str = "127.0.0.1", heap_mb: int = 384,
                 jvm_options: list[str] | tuple[str, ...] = (), startup_timeout_s: float = 180.0,
                 die_with_parent: bool = True):
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        self.node_count = nodes
        self.controller_count = controllers if controllers is not None else min(nodes, 3)
        if not 1 <= self.controller_count <= nodes:
            raise ValueError("controllers must be between 1 and nodes")
        self.replication_factor = replication_factor if replication_factor is not None else min(nodes, 3)
        self.min_insync_replicas = (min_insync_replicas if min_insync_replicas is not None
                                    else max(1, self.replication_factor - 1))
        self.listeners = {"PLAINTEXT": "PLAINTEXT", **dict(listeners or {})}
        self.client_listener = client_listener
        self.inter_broker_listener = inter_broker_listener
        for name in (client_listener, inter_broker_listener):
            if name not in self.listeners:
                raise ValueError(f"listener {name!r} is not among {sorted(self.listeners)}")
        self.server_properties = server_properties
        self.format_args = list(format_args)
        self.host = host
        self.heap_mb = heap_mb
        self.jvm_options = list(jvm_options)
        self.startup_timeout_s = startup_timeout_s
        self.die_with_parent = die_with_parent
        self.nodes: dict[int, KafkaNode] = {}
        self.cluster_id: str | None = None
        self.workdir: Path | None = None
        self.lib: Path | None = None
        self.start_seconds: float | None = None   # the last start(), format included

    # -- addresses ---------------------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return self.addresses(self.client_listener)

    def addresses(self, listener: str) -> str:
        """``host:port`` of ``listener`` on every broker node, comma-separated."""
        if not self.nodes:
            raise BrokerError("broker not started")
        return ",".join(f"{self.host}:{n.ports[listener]}" for n in self.nodes.values() if n.is_broker)

    def node_address(self, node_id: int, listener: str | None = None) -> str:
        return f"{self.host}:{self.nodes[node_id].ports[listener or self.client_listener]}"

    def node_at(self, port: int) -> int:
        """The id of the node listening on ``port`` (a client's view of a leader is an address)."""
        for node in self.nodes.values():
            if port in node.ports.values():
                return node.node_id
        raise KeyError(port)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> "ApacheKafka":
        t0 = time.monotonic()
        self.lib = ensure_jars()
        self.plan()
        try:
            formats = [(node, self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c",
                                         str(node.properties_path), *self.format_args, log=node.log_path))
                       for node in self.nodes.values()]
            for node, proc in formats:
                if proc.wait(timeout=120) != 0:
                    raise BrokerError(f"StorageTool format of node {node.node_id} exited {proc.returncode}:\n"
                                      f"{node.log_tail()}")
            for node in self.nodes.values():
                self._launch(node)
            self._wait_started(list(self.nodes.values()))
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def plan(self) -> dict[int, KafkaNode]:
        """The nodes' ids, roles, free ports, directories and ``server.properties``, written, nothing started."""
        self.workdir = Path(tempfile.mkdtemp(prefix="apache-kafka-"))
        (self.workdir / "log4j2.properties").write_text(LOG4J2)
        self.cluster_id = random_cluster_id()
        free = iter(_free_ports(self.host, self.node_count * len(self.listeners) + self.controller_count))
        for node_id in range(1, self.node_count + 1):
            roles = "broker,controller" if node_id <= self.controller_count else "broker"
            ports = {name: next(free) for name in self.listeners}
            if "controller" in roles:
                ports[CONTROLLER] = next(free)
            directory = self.workdir / f"node-{node_id}"
            (directory / "data").mkdir(parents=True)
            self.nodes[node_id] = KafkaNode(node_id, roles, ports, directory)
        for node in self.nodes.values():
            node.properties_path.write_text(self._properties_text(node))
        return self.nodes

    def stop(self) -> None:
        """Kill every node (SIGKILL: the data is thrown away, so there is nothing to shut down cleanly for) and
        remove the directory."""
        for node in self.nodes.values():
            self._kill(node)
        self.nodes = {}
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "ApacheKafka":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- one node ----------------------------------------------------------------------------------------------
    def kill(self, node_id: int) -> None:
        """kill -9 one node; ``restart`` brings it back on the same ports and data."""
        self._kill(self.nodes[node_id])

    def pause(self, node_id: int) -> None:
        """SIGSTOP one node (it keeps its sockets, answers nothing)."""
        self._signal(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self._signal(node_id, signal.SIGCONT)

    def stop_node(self, node_id: int, timeout_s: float = 60.0) -> None:
        """A clean shutdown of one node (SIGTERM: controlled shutdown, leadership moved first)."""
        node = self.nodes[node_id]
        if node.running:
            node.proc.terminate()
            try:
                node.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill(node)

    def restart(self, node_id: int) -> float:
        """Start a killed or stopped node again (killed first if still running); seconds until it serves."""
        node = self.nodes[node_id]
        self._kill(node)
        t0 = time.monotonic()
        self._launch(node)
        self._wait_started([node])
        return time.monotonic() - t0

    def reset(self, timeout_s: float = 60.0) -> None:
        """Delete every topic but the internal ones and every consumer group, and wait until they are gone: the
        next test finds an empty broker, as on a fresh Tansu."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _QUIET})
        deadline = time.monotonic() + timeout_s
        while True:
            topics = [t for t in admin.list_topics(timeout=10).topics if not t.startswith("__")]
            groups = [g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid]
            if not topics and not groups:
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"Apache Kafka still has topics {topics} and groups {groups} "
                                  f"{timeout_s:.0f}s after deleting them")
            futures = {**(admin.delete_topics(topics, operation_timeout=30) if topics else {}),
                       **(admin.delete_consumer_groups(groups, request_timeout=10) if groups else {})}
            for future in futures.values():
                try:
                    future.result()
                except KafkaException:
                    pass   # already gone, or a group whose last member has not left yet: the next round sees it
            time.sleep(0.2)

    def log(self, node_id: int | None = None) -> str:
        """The last lines of one node's log, or of every node's."""
        ids = [node_id] if node_id is not None else list(self.nodes)
        return "\n".join(f"--- node {i} ---\n{self.nodes[i].log_tail()}" for i in ids)

    # -- internals ---------------------------------------------------------------------------------------------
    def _properties_text(self, node: KafkaNode) -> str:
        voters = ",".join(f"{n.node_id}@{self.host}:{n.ports[CONTROLLER]}" for n in self.nodes.values()
                          if CONTROLLER in n.ports)
        names = [name for name in node.ports]
        protocols = {**self.listeners, CONTROLLER: "PLAINTEXT"}
        props = {
            "process.roles": node.roles,
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": CONTROLLER,
            "listeners": ",".join(f"{name}://{self.host}:{node.ports[name]}" for name in names),
            "advertised.listeners": ",".join(f"{name}://{self.host}:{node.ports[name]}" for name in self.listeners),
            "listener.security.protocol.map": ",".join(f"{name}:{protocols[name]}" for name in protocols),
            "inter.broker.listener.name": self.inter_broker_listener,
            "log.dirs": str(node.directory / "data"),
            "default.replication.factor": str(self.replication_factor),
            "min.insync.replicas": str(self.min_insync_replicas),
            "offsets.topic.replication.factor": str(self.replication_factor),
            "transaction.state.log.replication.factor": str(self.replication_factor),
            "transaction.state.log.min.isr": str(self.min_insync_replicas),
            "share.coordinator.state.topic.replication.factor": str(self.replication_factor),
            "share.coordinator.state.topic.min.isr": str(self.min_insync_replicas),
            # a fast start on a small machine: fewer internal partitions and threads than the defaults (50 and 50
            # partitions, 8 I/O threads), no wait for more members before the first rebalance
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0",
            # the tests' workers run 2 s sessions (a killed one's partitions move quickly); the default floor is 6 s
            "group.min.session.timeout.ms": "1000",
            "num.io.threads": "2",
            "num.network.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "4",
        }
        extra = self.server_properties(node.node_id) if callable(self.server_properties) else self.server_properties
        props.update({k: str(v) for k, v in (extra or {}).items()})
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, main: str, *args: str, log: Path) -> subprocess.Popen:
        cmd = ["java", f"-Xmx{self.heap_mb}m", "-Xms32m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}", *self.jvm_options,
               "-cp", f"{self.lib}/*", main, *args]
        with open(log, "ab") as out:
            try:
                return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True,
                                        preexec_fn=_die_with_parent if self.die_with_parent else None)
            except OSError as exc:
                raise BrokerError(f"cannot start java ({' '.join(cmd[:3])} ...): {exc}") from exc

    def _launch(self, node: KafkaNode) -> None:
        node.started_at = node.log_path.stat().st_size if node.log_path.exists() else 0
        node.proc = self._java("kafka.Kafka", str(node.properties_path), log=node.log_path)

    def _wait_started(self, nodes: list[KafkaNode]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        waiting = list(nodes)
        while waiting:
            for node in list(waiting):
                if node.proc.poll() is not None:
                    raise BrokerError(f"Apache Kafka node {node.node_id} exited with code {node.proc.returncode} "
                                      f"during startup:\n{node.log_tail()}")
                with open(node.log_path, "rb") as f:
                    f.seek(node.started_at)
                    if STARTED.encode() in f.read():
                        waiting.remove(node)
            if waiting and time.monotonic() > deadline:
                raise BrokerError(f"Apache Kafka node(s) {[n.node_id for n in waiting]} not started within "
                                  f"{self.startup_timeout_s}s:\n" + "\n".join(n.log_tail() for n in waiting))
            time.sleep(0.1)

    def _signal(self, node_id: int, sig: int) -> None:
        node = self.nodes[node_id]
        if not node.running:
            raise BrokerError(f"node {node_id} is not running")
        node.proc.send_signal(sig)

    @staticmethod
    def _kill(node: KafkaNode) -> None:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(timeout=30)
        node.proc = None


if __name__ == "__main__":  # manual use: python tests/_apache_kafka.py [NODES]
    with ApacheKafka(int(sys.argv[1]) if len(sys.argv) > 1 else 1) as kafka:
        print(f"bootstrap={kafka.bootstrap} (Apache Kafka {kafka_version()}, started in {kafka.start_seconds:.1f}s)",
              flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
