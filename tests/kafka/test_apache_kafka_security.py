"""Security for real (issue 40): Apache Kafka with TLS (a CA and a broker certificate made here), SASL/SCRAM-SHA-512
and ACLs (StandardAuthorizer, nothing allowed without an ACL), each command with its own principal and least
privilege. The ACLs are the ``kafka-acls.sh`` commands docs/operations.md lists, read from it and run with the
Apache Kafka tool itself (``org.apache.kafka.tools.AclCommand``): the documentation is what was tested.

- replay, worker and audit each work under their ACLs (replay -> worker -> audit PASSED);
- a principal without rights cannot read the raw topic or write an output topic (the broker refuses);
- a wrong password and an untrusted broker certificate: one line and exit 2 from worker, replay and audit;
- no password in the commands' logs and output, the worker's /metrics, any topic or the state directory;
- docker-compose.yml's worker command with its commented TLS/SASL variables set runs under the worker's ACLs.
"""
from __future__ import annotations

import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
import _apache_kafka as apache  # noqa: E402
import _compose as compose  # noqa: E402
from _kafka_helpers import wait_for  # noqa: E402

from stream_anon import contract  # noqa: E402
from stream_anon.broker import free_port  # noqa: E402
from stream_anon.connection import KafkaConnection  # noqa: E402
from stream_anon.kafka.supervise import OutputReader, start_worker_process, stop_worker_process  # noqa: E402

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
ACL_BLOCK = "<!-- the ACLs as tests/kafka/test_apache_kafka_security.py runs them -->"
DOC_BOOTSTRAP, DOC_ADMIN_CONFIG = "kafka-1:9093", "admin.properties"
STREAM, APP_ID, RAW = "oyster", "stream-anon-oyster", "raw.fare.oyster"       # the bundled config: the names the documented ACLs use
WORKER, AUDIT, REPLAY, NOBODY = "stream-anon-worker", "stream-anon-audit", "stream-anon-replay", "nobody"
USERS = ("admin", WORKER, AUDIT, REPLAY, NOBODY)
N_EVENTS = 1500
SECRET = "test-secret-0123456789abcdef0123456789"
CLIENT_LOG = logging.getLogger("stream_anon.kafka.client")     # librdkafka's lines through Python logging


def documented_acl_commands() -> list[list[str]]:
    """The ``kafka-acls.sh`` commands of the fenced block after :data:`ACL_BLOCK` in docs/operations.md, each as
    its arguments (continuation lines joined, comments dropped)."""
    text = DOC.read_text()
    assert ACL_BLOCK in text, f"{DOC}: no {ACL_BLOCK}"
    block = text.split(ACL_BLOCK, 1)[1].split("```", 2)[1]
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("kafka-acls.sh "):
            commands.append(shlex.split(line)[1:])
    return commands


def make_pki(d: Path) -> dict[str, Path]:
    """A CA and a broker certificate for 127.0.0.1 signed by it (the broker's PEM key store: key + certificate), and
    another CA that signed nothing the broker shows (the untrusted case)."""
    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    for ca in ("ca", "other-ca"):
        ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
             "-days", "2", "-subj", f"/CN=stream-anon-test-{ca}")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr", "-subj",
         "/CN=localhost")
    ossl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
         "broker.crt", "-days", "2", "-extfile", "san.cnf")
    (d / "broker.pem").write_text((d / "broker.key").read_text() + (d / "broker.crt").read_text())
    return {"ca": d / "ca.pem", "other_ca": d / "other-ca.pem", "keystore": d / "broker.pem"}


def secure_broker_properties(keystore: Path, broker_password: str) -> dict[str, str]:
    """Clients on SASL_SSL with SCRAM-SHA-512; the brokers and controllers among themselves on SASL_PLAINTEXT with
    PLAIN (the principal ``broker``, a super user); the PLAINTEXT listener the launcher always has serves nobody
    anything (no ACL names ANONYMOUS)."""
    plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
             f'username="broker" password="{broker_password}" user_broker="{broker_password}";')
    return {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,BROKER:SASL_PLAINTEXT,"
                                          f"{apache.CONTROLLER}:SASL_PLAINTEXT",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain,
        "listener.name.broker.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.broker.plain.sasl.jaas.config": plain,
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:broker;User:admin",
        "allow.everyone.if.no.acl.found": "false",
    }


class SecureKafka:
    """The broker, its PKI, the users' passwords and a connection file per user."""

    def __init__(self, d: Path):
        self.dir = d
        self.pki = make_pki(d)
        self.passwords = {u: f"pw-{u}-{secrets.token_hex(10)}" for u in USERS}
        self.broker_password = secrets.token_hex(12)
        scram = [a for u in USERS for a in
                 ("--add-scram", f"SCRAM-SHA-512=[name={u},password={self.passwords[u]}]")]
        self.kafka = apache.ApacheKafka(
            1, listeners={"SASL_SSL": "SASL_SSL", "BROKER": "SASL_PLAINTEXT"}, client_listener="SASL_SSL",
            inter_broker_listener="BROKER",
            server_properties=secure_broker_properties(self.pki["keystore"], self.broker_password),
            format_args=scram)

    def start(self) -> "SecureKafka":
        self.kafka.start()
        for user in USERS:
            (self.dir / f"{user}.toml").write_text(
                f'[kafka]\nbootstrap = "{self.kafka.bootstrap}"\nsecurity_protocol = "SASL_SSL"\n'
                f'ssl_cafile = "{self.pki["ca"]}"\nsasl_mechanism = "SCRAM-SHA-512"\nsasl_username = "{user}"\n')
        (self.dir / "admin.properties").write_text(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="admin" password="{self.passwords["admin"]}";\n'
            f"ssl.truststore.type=PEM\nssl.truststore.location={self.pki['ca']}\n")
        return self

    def conn(self, user: str, password: str | None = None, ca: Path | None = None) -> KafkaConnection:
        return KafkaConnection(self.kafka.bootstrap, security_protocol="SASL_SSL", ssl_cafile=str(ca or self.pki["ca"]),
                               sasl_mechanism="SCRAM-SHA-512", sasl_username=user,
                               sasl_password=password or self.passwords[user])

    def env(self, user: str, password: str | None = None) -> dict[str, str]:
        return {**os.environ, "STREAM_ANON_SECRET": SECRET,
                "STREAM_ANON_KAFKA_SASL_PASSWORD": password or self.passwords[user]}

    def command(self, user: str, *args: str, password: str | None = None, timeout: float = 180,
                extra_env: dict | None = None) -> subprocess.CompletedProcess:
        """``stream-anon ARGS --kafka-config <user>.toml`` with the user's password in the environment."""
        return subprocess.run([sys.executable, "-m", "stream_anon.cli", *args, "--kafka-config",
                               str(self.dir / f"{user}.toml")], env={**self.env(user, password), **(extra_env or {})},
                              capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))

    def add_documented_acls(self) -> list[str]:
        """Each documented ``kafka-acls.sh`` command, run with Apache Kafka's AclCommand as the admin (side by side:
        one JVM each)."""
        procs = []
        for args in documented_acl_commands():
            args = [self.kafka.bootstrap if a == DOC_BOOTSTRAP else str(self.dir / "admin.properties")
                    if a == DOC_ADMIN_CONFIG else a for a in args]
            procs.append(subprocess.Popen(["java", "-Xmx128m", "-XX:+UseSerialGC", "-cp", f"{self.kafka.lib}/*",
                                           "org.apache.kafka.tools.AclCommand", *args],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = []
        for p in procs:
            out = p.communicate(timeout=120)[0]
            assert p.returncode == 0, f"{' '.join(p.args[5:])}:\n{out[-2000:]}"
            outputs.append(out)
        return outputs


@pytest.fixture(scope="module")
def secure(tmp_path_factory, apache_kafka_tools):
    missing = [] if shutil.which("openssl") else ["openssl"]
    if missing:
        pytest.skip(f"Apache Kafka with TLS needs {', '.join(missing)}")
    s = SecureKafka(tmp_path_factory.mktemp("secure-kafka")).start()
    try:
        done = s.command("admin", "topics", "apply", "--config", STREAM, "--app-id", APP_ID)
        assert done.returncode == 0, done.stderr
        s.acl_output = s.add_documented_acls()
        yield s
    finally:
        s.kafka.stop()


def topic_bytes(conn: KafkaConnection) -> dict[str, bytes]:
    """Every record (keys, values, header values) of every topic but the broker's internal ones, read committed."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**conn.confluent(), "logger": CLIENT_LOG})
    topics = [t for t in admin.list_topics(timeout=30).topics if not t.startswith("__")]
    c = Consumer({**conn.confluent(), "logger": CLIENT_LOG, "group.id": "grep", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    out: dict[str, bytearray] = {t: bytearray() for t in topics}
    try:
        md = c.list_topics(timeout=30)
        c.assign([TopicPartition(t, p, 0) for t in topics for p in md.topics[t].partitions])
        quiet = time.monotonic()
        while time.monotonic() - quiet < 3:
            for m in c.consume(500, timeout=0.5):
                if m.error() is None:
                    quiet = time.monotonic()
                    out[m.topic()] += (m.key() or b"") + (m.value() or b"") + \
                        b"".join(v or b"" for _, v in (m.headers() or []))
    finally:
        c.close()
    return {t: bytes(b) for t, b in out.items()}


def test_replay_worker_and_audit_each_under_its_acls_pass_and_no_password_leaks(secure, tmp_path):
    replay = secure.command(REPLAY, "replay", "--dataset", STREAM, "--events", str(N_EVENTS), "--config", STREAM,
                            "--loglevel", "debug")
    assert replay.returncode == 0, replay.stderr[-3000:]
    port, log = free_port(), tmp_path / "worker.log"
    worker = start_worker_process(contract.config_path(STREAM), secure.conn(WORKER), tmp_path / "state", APP_ID, 2.0,
                                  log, env=secure.env(WORKER),
                                  extra=["--no-create-topics", "--web-port", str(port), "--session-timeout", "6"])
    reader = OutputReader(secure.conn("admin"), STREAM)
    try:
        def accounted():
            assert worker.poll() is None, log.read_text()[-3000:]
            reader.poll(300)
            acc = reader.accounting()
            return acc if acc["accounted"] >= N_EVENTS and acc["deferred"] == 0 else None
        acc = wait_for(accounted, 180, "every event accounted", lambda: str(reader.accounting()))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
    finally:
        reader.close()
        code = stop_worker_process(worker)
    assert code == 0, log.read_text()[-3000:]
    assert acc["dead_lettered"] == 0, acc
    audit = secure.command(AUDIT, "audit", "--config", STREAM, "--idle", "2")
    assert audit.returncode == 0 and "PASSED" in audit.stdout, audit.stdout[-3000:] + audit.stderr[-2000:]

    worker_log = log.read_text()
    assert "as stream-anon-worker" in worker_log and "TopicAuthorizationFailedError" not in worker_log, worker_log
    assert "stream_anon_" in metrics
    texts = {"replay": replay.stdout + replay.stderr, "worker log": worker_log, "audit": audit.stdout + audit.stderr,
             "/metrics": metrics}
    texts.update({f"state file {p.name}": p.read_bytes().decode(errors="replace")
                  for p in (tmp_path / "state").rglob("*") if p.is_file()})
    texts.update({f"topic {t}": b.decode(errors="replace") for t, b in topic_bytes(secure.conn("admin")).items()})
    assert len(texts["topic anon.releases"]) > 1000 and len(texts[f"topic {APP_ID}-state"]) > 100
    for user, password in {**secure.passwords, "broker": secure.broker_password}.items():
        leaked = [where for where, text in texts.items() if password in text]
        assert not leaked, f"the password of {user} appears in {leaked}"


def test_a_principal_without_rights_cannot_read_the_raw_topic_or_write_an_output_topic(secure):
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KafkaPythonError

    def read(user, topic):
        """What a reader of partition 0 of ``topic`` as ``user`` gets: "read", or the broker's refusal of the topic's
        metadata (no Describe) or of the fetch (no Read)."""
        c = Consumer({**secure.conn(user).confluent(), "logger": CLIENT_LOG, "group.id": f"{user}-probe",
                      "enable.auto.commit": False})
        try:
            refused = c.list_topics(topic, timeout=20).topics[topic].error
            if refused is not None:
                return refused.name()
            c.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                for m in c.consume(10, timeout=0.5):
                    if m.error() is None:
                        return "read"
                    if m.error().code() != KafkaError.GROUP_AUTHORIZATION_FAILED:   # the probe's group: not read
                        return m.error().name()
            return "nothing"
        finally:
            c.close()

    def write(user, topic):
        # not idempotent: a principal without Write on any topic is refused a producer id first (cluster
        # authorization), before the topic's ACL is asked
        p = KafkaProducer(**secure.conn(user).kafka_python(), max_block_ms=15000, enable_idempotence=False)
        try:
            p.send(topic, b"forged", partition=0).get(timeout=20)
            return "written"
        except KafkaPythonError as exc:
            return f"{type(exc).__name__} {exc}"
        finally:
            p.close()

    raw, out = "raw.fare.oyster", "anon.releases"
    assert read(NOBODY, raw) == "TOPIC_AUTHORIZATION_FAILED"
    assert read(REPLAY, raw) == "TOPIC_AUTHORIZATION_FAILED"        # replay writes the input, never reads it
    refused = "TopicAuthorizationFailedError"
    assert write(NOBODY, out).startswith(refused)
    assert write(AUDIT, out).startswith(refused)                       # the audit reads the outputs, never writes
    assert write(REPLAY, f"anon.{STREAM}.records").startswith(refused)
    assert write(WORKER, raw).startswith(refused)                      # the worker cannot forge its own input
    # the same principals where their ACLs allow it (the refusals above are the ACLs', not a broken connection)
    assert read(AUDIT, raw) == "read" and write(REPLAY, raw) == "written"


@pytest.mark.parametrize("case", ["wrong password", "untrusted certificate"])
def test_a_wrong_password_or_an_untrusted_certificate_is_one_line_and_exit_2(secure, tmp_path, case):
    wrong = f"not-the-password-{secrets.token_hex(6)}"
    commands = {
        WORKER: ["worker", "--config", STREAM, "--state-dir", str(tmp_path / "state"), "--app-id", APP_ID,
                 "--no-create-topics", "--timeout", "8", "--loglevel", "warning"],   # its INFO lines: its lifecycle
        REPLAY: ["replay", "--dataset", STREAM, "--events", "10", "--config", STREAM, "--timeout", "8"],
        AUDIT: ["audit", "--config", STREAM, "--timeout", "8"],
    }
    for user, args in commands.items():
        if case == "wrong password":
            done = secure.command(user, *args, password=wrong, timeout=60)
            expected = "refused the credentials: SASL authentication error: Authentication failed"
        else:
            done = secure.command(user, *args, timeout=60,
                                  extra_env={"STREAM_ANON_KAFKA_SSL_CAFILE": str(secure.pki["other_ca"])})
            expected = "TLS handshake failed: error:0A000086:SSL routines::certificate verify failed"
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2, (user, done.returncode, done.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith(f"stream-anon {args[0]}: broker {secure.kafka.bootstrap} "
                                                       f"(SASL_SSL, SCRAM-SHA-512 as {user})"), (user, lines)
        assert expected in lines[0], (user, lines[0])
        assert wrong not in done.stdout + done.stderr and secure.passwords[user] not in done.stdout + done.stderr



def test_the_compose_worker_with_its_tls_sasl_variables_runs_under_the_worker_acls(secure, tmp_path):
    """docker-compose.yml's worker-1, its commented TLS/SASL variables set as a user uncomments them (the CA file
    mounted at this machine's path, the password from the environment), runs on the SASL_SSL broker as the
    documented worker principal: ready, every offset of the raw topic read and committed, no password in its log."""
    kafka_env = compose.commented_kafka_environment()
    assert set(kafka_env) == {"STREAM_ANON_KAFKA_SECURITY_PROTOCOL", "STREAM_ANON_KAFKA_SSL_CAFILE",
                              "STREAM_ANON_KAFKA_SASL_MECHANISM", "STREAM_ANON_KAFKA_SASL_USERNAME",
                              "STREAM_ANON_KAFKA_SASL_PASSWORD"}, kafka_env
    assert kafka_env["STREAM_ANON_KAFKA_SASL_USERNAME"] == WORKER     # the principal the documented ACLs name
    kafka_env["STREAM_ANON_KAFKA_SSL_CAFILE"] = str(secure.pki["ca"])   # the mounted file, here
    base = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_ANON_")}
    env = {**base, "STREAM_ANON_SECRET": SECRET, "STREAM_ANON_KAFKA_SASL_PASSWORD": secure.passwords[WORKER]}
    env = compose.service_environment("worker-1", env)
    env.update({k: compose.substituted(v, env) for k, v in kafka_env.items()})
    replay = secure.command(REPLAY, "replay", "--dataset", STREAM, "--events", str(N_EVENTS), "--config", STREAM)
    assert replay.returncode == 0, replay.stderr[-3000:]
    end = raw_end_offsets(secure.conn("admin"))
    port, log = free_port(), tmp_path / "compose-worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen(compose.command("worker-1", secure.kafka.bootstrap, tmp_path / "state", port),
                                  env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        def caught_up():
            assert worker.poll() is None, log.read_text()[-3000:]
            return committed_raw_offsets(secure.conn("admin")) == end and compose.ready(port)
        wait_for(caught_up, 180, f"the compose worker ready with every raw offset committed ({end})",
                 lambda: f"committed {committed_raw_offsets(secure.conn('admin'))}, ready {compose.ready(port)}")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert f"as {WORKER}" in text and "AuthorizationFailed" not in text, text[-3000:]
    for user, password in secure.passwords.items():
        assert password not in text, f"the password of {user} appears in the compose worker's log"


def raw_end_offsets(conn: KafkaConnection) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**conn.confluent(), "logger": CLIENT_LOG, "group.id": "end-offsets", "enable.auto.commit": False})
    try:
        parts = c.list_topics(RAW, timeout=30).topics[RAW].partitions
        return {p: c.get_watermark_offsets(TopicPartition(RAW, p), timeout=30)[1] for p in parts}
    finally:
        c.close()


def committed_raw_offsets(conn: KafkaConnection) -> dict[int, int]:
    """The worker's group's committed offsets of the raw topic (partitions without one left out)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**conn.confluent(), "logger": CLIENT_LOG, "group.id": APP_ID, "enable.auto.commit": False})
    try:
        parts = c.list_topics(RAW, timeout=30).topics[RAW].partitions
        done = c.committed([TopicPartition(RAW, p) for p in parts], timeout=30)
        return {tp.partition: tp.offset for tp in done if tp.offset >= 0}
    finally:
        c.close()
