"""Kafka connection settings (stream_anon/connection.py): sources, validation, redaction, and the mapping to the
options of every client the project opens.

What is tested where: the embedded Tansu broker cannot serve TLS (``--cert`` with ``--key`` is refused; ``--cert``
alone starts but serves plaintext) and with ``--authentication`` every client fails, so TLS and SASL are not
tested against a broker here. These tests check (a) that each client library *accepts* the mapped options
(kafka-python's config keys, librdkafka's property validation at construction, aiokafka's constructor, faust's
credentials -> aiokafka translation), and (b) with a local TLS server that requires a client certificate, that
kafka-python and confluent-kafka really open a mutually authenticated TLS connection with the mapped options.
PLAINTEXT runs against the real broker in the broker, worker and wheel-install tests.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest

from stream_anon import connection
from stream_anon.connection import ConnectionSettingsError, KafkaConnection, kafka_net_client, resolve

SECRET = "pa55-w0rd-never-logged"
CLIENT_LOG = logging.getLogger("stream_anon.kafka.client")     # librdkafka lines through Python logging


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost and an encrypted client key+certificate (openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl command not available")
    d = tmp_path_factory.mktemp("pki")

    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
         "-subj", "/CN=stream-anon-test-ca")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=localhost")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.pem", "-days", "2", "-extfile", "san.cnf")
    ossl("req", "-newkey", "rsa:2048", "-keyout", "client.key", "-out", "client.csr", "-subj",
         "/CN=stream-anon-client", "-passout", f"pass:{SECRET}")
    ossl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "client.pem", "-days", "2")
    return d


def tls(pki, bootstrap="127.0.0.1:9093", **kw) -> KafkaConnection:
    return resolve(bootstrap, environ={"STREAM_ANON_KAFKA_SSL_PASSWORD": SECRET}, security_protocol="SSL",
                   ssl_cafile=str(pki / "ca.pem"), ssl_certfile=str(pki / "client.pem"),
                   ssl_keyfile=str(pki / "client.key"), **kw)


def sasl(mechanism="SCRAM-SHA-512", protocol="SASL_PLAINTEXT", **kw) -> KafkaConnection:
    return resolve("127.0.0.1:9094", environ={"STREAM_ANON_KAFKA_SASL_PASSWORD": SECRET}, security_protocol=protocol,
                   sasl_mechanism=mechanism, sasl_username="anon-worker", **kw)


# ------------------------------------------------------------------------------------------- sources, validation
def test_sources_merge_file_then_env_then_options(tmp_path):
    f = tmp_path / "kafka.toml"
    f.write_text('[kafka]\nbootstrap = "file:1"\nsecurity_protocol = "sasl_plaintext"\nsasl_mechanism = "PLAIN"\n'
                 'sasl_username = "from-file"\n')
    env = {"STREAM_ANON_KAFKA_SASL_USERNAME": "from-env", "STREAM_ANON_KAFKA_SASL_PASSWORD": SECRET,
           "STREAM_ANON_KAFKA_BOOTSTRAP": "env:2"}
    c = resolve(None, files=[f], environ=env)
    assert (c.bootstrap, c.security_protocol, c.sasl_mechanism, c.sasl_username, c.sasl_password) == \
        ("env:2", "SASL_PLAINTEXT", "PLAIN", "from-env", SECRET)
    c = resolve("cli:3", files=[f], environ=env, sasl_username="from-cli", sasl_mechanism="scram-sha-256")
    assert (c.bootstrap, c.sasl_username, c.sasl_mechanism) == ("cli:3", "from-cli", "SCRAM-SHA-256")
    assert c.sources["sasl_username"] == "--sasl-username" and c.sources["sasl_password"].startswith("env ")


@pytest.mark.parametrize("env, overrides, message", [
    ({}, {"security_protocol": "TLS"}, "security_protocol (from --security-protocol): unknown 'TLS'"),
    ({"STREAM_ANON_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "STREAM_ANON_KAFKA_SASL_MECHANISM": "GSSAPI"}, {},
     "sasl_mechanism (from env STREAM_ANON_KAFKA_SASL_MECHANISM): unknown 'GSSAPI'"),
    ({}, {"security_protocol": "SASL_SSL"}, "sasl_mechanism (from --security-protocol): missing"),
    ({}, {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u"},
     "sasl_password: missing for SASL_PLAINTEXT with PLAIN (set STREAM_ANON_KAFKA_SASL_PASSWORD"),
    ({}, {"sasl_username": "u"}, "sasl_username (from --sasl-username): SASL settings given but security_protocol "
                                 "is PLAINTEXT"),
    ({}, {"ssl_cafile": "/etc/hostname"}, "ssl_cafile (from --ssl-cafile): TLS settings given but security_protocol"),
    ({}, {"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"},
     "ssl_cafile (from --ssl-cafile): file not found: /nonexistent/ca.pem"),
    ({"STREAM_ANON_KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, {}, "ssl_check_hostname"),
])
def test_wrong_settings_fail_at_start_with_the_setting_named(env, overrides, message):
    with pytest.raises(ConnectionSettingsError) as err:
        resolve("127.0.0.1:9092", environ=env, **overrides)
    assert message in str(err.value)


def test_missing_bootstrap_and_bad_files(tmp_path):
    with pytest.raises(ConnectionSettingsError, match="kafka.bootstrap: missing"):
        resolve(None, environ={})
    with pytest.raises(ConnectionSettingsError, match="expected HOST:PORT"):
        resolve("localhost", environ={})
    f = tmp_path / "k.toml"
    f.write_text('[kafka]\nsasl_pasword = "typo"\n')
    with pytest.raises(ConnectionSettingsError, match=r"kafka.sasl_pasword \(from .*k.toml\): unknown setting"):
        resolve("h:1", files=[f], environ={})
    with pytest.raises(ConnectionSettingsError, match="connection file not found"):
        resolve("h:1", files=[tmp_path / "missing.toml"], environ={})


def test_stream_config_kafka_table_is_read_and_does_not_disturb_the_config(tmp_path):
    from stream_anon.config import load_config
    from stream_anon.contract import config_path

    text = config_path("obd2").read_text()
    path = tmp_path / "obd2.toml"
    path.write_text(text.replace("[stream]", '[kafka]\nbootstrap = "kafka-1:9092,kafka-2:9092"\n\n[stream]', 1))
    assert load_config(path).stream.name == load_config(config_path("obd2")).stream.name
    c = resolve(None, files=[path], environ={})
    assert c.kafka_python()["bootstrap_servers"] == ["kafka-1:9092", "kafka-2:9092"]
    assert c.confluent()["bootstrap.servers"] == "kafka-1:9092,kafka-2:9092"
    assert c.faust_url() == "kafka://kafka-1:9092;kafka://kafka-2:9092"


# ------------------------------------------------------------------------------------------- secrets never shown
def test_secrets_redacted_in_repr_str_describe_and_logs(pki, caplog):
    for c in (tls(pki), sasl(protocol="SASL_SSL", ssl_cafile=str(pki / "ca.pem"))):
        assert SECRET not in repr(c) and SECRET not in str(c) and SECRET not in c.describe()
        assert "'***'" in repr(c)
        with caplog.at_level(logging.DEBUG):
            logging.getLogger("stream_anon.test").info("connection %s / %r / %s", c, c, c.describe())
        assert SECRET not in caplog.text
    assert sasl().describe() == "127.0.0.1:9094 (SASL_PLAINTEXT, SCRAM-SHA-512 as anon-worker)"


def test_worker_and_cli_parsers_take_the_options_and_secrets_only_from_env_or_file(monkeypatch, tmp_path):
    from stream_anon.cli import build_parser
    from stream_anon.kafka.app import build_parser as worker_parser

    monkeypatch.setenv("STREAM_ANON_KAFKA_SASL_PASSWORD", SECRET)
    argv = ["--broker", "k:9092", "--security-protocol", "sasl_plaintext", "--sasl-mechanism", "scram-sha-256",
            "--sasl-username", "w"]
    wargs = worker_parser().parse_args(["--config", "x.toml", *argv, "--log-format", "json"])
    c = connection.from_args(wargs)
    assert (c.security_protocol, c.sasl_mechanism, c.sasl_password, wargs.log_format) == \
        ("SASL_PLAINTEXT", "SCRAM-SHA-256", SECRET, "json")
    for sub in (["replay", "--topic", "t"], ["audit", "--config", "oyster"], ["topics", "apply"]):
        args = build_parser().parse_args([*sub, *argv])
        assert connection.from_args(args).sasl_username == "w"
    for parser in (worker_parser(), build_parser()):
        assert "password" not in " ".join(a for action in parser._actions for a in action.option_strings)
    # the child-process form (test harness) carries the secret by environment only
    assert SECRET not in " ".join(connection.to_args(c))
    assert connection.secret_env(c) == {"STREAM_ANON_KAFKA_SASL_PASSWORD": SECRET}


# ------------------------------------------------------------------------------------------- client mappings
def test_kafka_python_mapping_uses_its_option_names(pki):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

    t, s = tls(pki).kafka_python(), sasl(protocol="SASL_SSL", ssl_cafile=str(pki / "ca.pem")).kafka_python()
    assert t == {"bootstrap_servers": ["127.0.0.1:9093"], "security_protocol": "SSL", "ssl_check_hostname": True,
                 "ssl_cafile": str(pki / "ca.pem"), "ssl_certfile": str(pki / "client.pem"),
                 "ssl_keyfile": str(pki / "client.key"), "ssl_password": SECRET, "kafka_client": kafka_net_client}
    assert (s["sasl_mechanism"], s["sasl_plain_username"], s["sasl_plain_password"], s["security_protocol"]) == \
        ("SCRAM-SHA-512", "anon-worker", SECRET, "SASL_SSL")
    for client in (KafkaProducer, KafkaConsumer, KafkaAdminClient):
        assert set(t) | set(s) <= set(client.DEFAULT_CONFIG), client
    assert KafkaConnection("h:1").kafka_python() == {"bootstrap_servers": ["h:1"], "security_protocol": "PLAINTEXT",
                                                     "kafka_client": kafka_net_client}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_mapping_is_accepted_by_librdkafka(pki, mechanism):
    """librdkafka validates property names and values (and loads the CA and key files) when a client is built."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    c = sasl(mechanism, protocol="SASL_SSL", ssl_cafile=str(pki / "ca.pem"))
    conf = c.confluent()
    assert conf == {"bootstrap.servers": "127.0.0.1:9094", "security.protocol": "SASL_SSL",
                    "ssl.endpoint.identification.algorithm": "https", "ssl.ca.location": str(pki / "ca.pem"),
                    "sasl.mechanism": mechanism, "sasl.username": "anon-worker", "sasl.password": SECRET}
    conf = {**conf, "logger": CLIENT_LOG}
    confluent_kafka.Producer(conf).flush(0)
    confluent_kafka.Consumer({**conf, "group.id": "g"}).close()
    confluent_kafka.Producer({**tls(pki).confluent(), "logger": CLIENT_LOG}).flush(0)
    with pytest.raises(confluent_kafka.KafkaException):      # the check is real: a wrong name is refused
        confluent_kafka.Producer({**conf, "sasl.user.name": "anon-worker", "logger": CLIENT_LOG})
    with pytest.raises(confluent_kafka.KafkaException):      # and so is a CA file that is no certificate
        confluent_kafka.Producer({**conf, "ssl.ca.location": str(pki / "san.cnf"), "logger": CLIENT_LOG})


@pytest.mark.parametrize("make", ["tls", "sasl_ssl", "sasl_plaintext"])
def test_aiokafka_and_faust_mappings(pki, make):
    from aiokafka import AIOKafkaProducer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    c = {"tls": lambda: tls(pki), "sasl_ssl": lambda: sasl(protocol="SASL_SSL", ssl_cafile=str(pki / "ca.pem")),
         "sasl_plaintext": lambda: sasl("PLAIN")}[make]()
    opts = c.aiokafka()

    async def build():
        producer = AIOKafkaProducer(**opts)      # validates protocol, mechanism, credentials and ssl_context
        await producer.stop()                    # never started: closes nothing but the object

    asyncio.run(build())
    assert isinstance(opts.get("ssl_context"), ssl.SSLContext) == c.uses_tls
    via_faust = credentials_to_aiokafka_auth(c.faust_credentials())
    assert via_faust["security_protocol"] == c.security_protocol
    if c.uses_sasl:
        assert (via_faust["sasl_mechanism"], via_faust["sasl_plain_username"], via_faust["sasl_plain_password"]) \
            == (c.sasl_mechanism, "anon-worker", SECRET)
    assert isinstance(via_faust.get("ssl_context"), ssl.SSLContext) == c.uses_tls
    assert c.faust_settings()["broker"] == f"kafka://{c.bootstrap}"
    assert KafkaConnection("h:1").faust_settings() == {"broker": "kafka://h:1"}


# ------------------------------------------------------------------------------------------- real TLS handshakes
class MutualTLSServer:
    """Accepts TLS connections that present a client certificate signed by the test CA; records the client's
    certificate subject, then closes (no Kafka protocol: the clients fail after the handshake, which is enough)."""

    def __init__(self, pki):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
        self.ctx.load_verify_locations(pki / "ca.pem")
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.clients: list[str] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(5)
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as s:
                    subject = dict(x[0] for x in s.getpeercert()["subject"])
                    self.clients.append(subject["commonName"])
            except (ssl.SSLError, OSError) as exc:
                self.failures.append(repr(exc))
                conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def _wait_for(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not cond():
        time.sleep(0.1)
    return cond()


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_clients_open_mutual_tls_with_the_mapped_options(pki, client):
    server = MutualTLSServer(pki)
    try:
        c = tls(pki, bootstrap=f"127.0.0.1:{server.port}")
        if client == "kafka-python":
            from kafka.admin import KafkaAdminClient
            from kafka.errors import KafkaError
            with pytest.raises((KafkaError, OSError, ValueError)):
                KafkaAdminClient(**c.kafka_python(), request_timeout_ms=3000, bootstrap_timeout_ms=4000)
        else:
            confluent_kafka = pytest.importorskip("confluent_kafka")
            from confluent_kafka.admin import AdminClient
            admin = AdminClient({**c.confluent(), "socket.timeout.ms": 3000, "logger": CLIENT_LOG})
            try:
                admin.list_topics(timeout=3)
            except confluent_kafka.KafkaException:
                pass
        assert _wait_for(lambda: server.clients), f"no verified client handshake; server saw {server.failures}"
        assert server.clients[0] == "stream-anon-client"
        if client == "kafka-python":     # it logs its configuration at DEBUG: our handler redacts the key password
            import io

            from stream_anon.logsetup import make_handler
            buf = io.StringIO()
            handler = make_handler("json", stream=buf)
            logger = logging.getLogger("kafka")
            logger.addHandler(handler)
            old = logger.level
            logger.setLevel(logging.DEBUG)
            try:
                with pytest.raises((KafkaError, OSError, ValueError)):
                    KafkaAdminClient(**c.kafka_python(), request_timeout_ms=3000, bootstrap_timeout_ms=1000)
            finally:
                logger.removeHandler(handler)
                logger.setLevel(old)
            assert "ssl_password" in buf.getvalue() and SECRET not in buf.getvalue()
    finally:
        server.close()


def test_tls_without_the_client_certificate_is_refused_by_the_server(pki):
    """Control: the server really requires the client certificate (so the test above can fail)."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    server = MutualTLSServer(pki)
    try:
        c = resolve(f"127.0.0.1:{server.port}", environ={}, security_protocol="SSL", ssl_cafile=str(pki / "ca.pem"))
        with pytest.raises((KafkaError, OSError, ValueError)):
            KafkaAdminClient(**c.kafka_python(), request_timeout_ms=3000, bootstrap_timeout_ms=4000)
        assert _wait_for(lambda: server.failures, 10)
        assert not server.clients
    finally:
        server.close()


def test_kafka_python_clients_warn_only_of_a_network_step_that_stalls(bootstrap):
    """kafka-python's "blocking the event loop" warning fires on a 0.1 s network step, which reading a fetch of a few
    MB on a busy machine takes (every `make demo` and audit printed it, issue 43 item 10); the project's clients
    keep it for a stall of :data:`stream_anon.connection.SLOW_NETWORK_STEP_S`."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

    conn = KafkaConnection(bootstrap)
    net = conn.kafka_python()["kafka_client"](**conn.kafka_python())
    try:
        assert net._net.config["slow_task_threshold_secs"] == connection.SLOW_NETWORK_STEP_S >= 1
    finally:
        net.close()
    for client in (KafkaConsumer, KafkaProducer, KafkaAdminClient):      # each takes it as its network client
        client(**conn.kafka_python()).close()
