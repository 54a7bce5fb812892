"""Kafka connection settings in one place: bootstrap servers, security protocol, TLS and SASL.

Every Kafka client the project opens (worker: faust/aiokafka, and confluent-kafka; replay, audit, topics, demo and
the test harness: kafka-python) takes its connection options from one :class:`KafkaConnection`, mapped to the
option names of that client:

==================  ==========================  ==============================  =========================
setting             kafka-python / aiokafka     confluent-kafka (librdkafka)    faust (``broker_credentials``)
==================  ==========================  ==============================  =========================
bootstrap           bootstrap_servers           bootstrap.servers               ``kafka://host:port;...``
security_protocol   security_protocol           security.protocol               implied by the credentials
ssl_cafile          ssl_cafile / ssl_context    ssl.ca.location                 SSL context
ssl_certfile        ssl_certfile / ssl_context  ssl.certificate.location        SSL context
ssl_keyfile         ssl_keyfile / ssl_context   ssl.key.location                SSL context
ssl_password        ssl_password / ssl_context  ssl.key.password                SSL context
ssl_check_hostname  ssl_check_hostname          ssl.endpoint.identification...  SSL context
sasl_mechanism      sasl_mechanism              sasl.mechanism                  SASLCredentials.mechanism
sasl_username       sasl_plain_username         sasl.username                   SASLCredentials.username
sasl_password       sasl_plain_password         sasl.password                   SASLCredentials.password
==================  ==========================  ==============================  =========================

Where the settings come from, later sources winning key by key:

1. the ``[kafka]`` table of the stream config (``--config``) or of a separate TOML file (``--kafka-config``),
2. the environment: ``STREAM_ANON_KAFKA_<SETTING>`` in upper case (``STREAM_ANON_KAFKA_SASL_PASSWORD``, ...),
3. command-line options (``--broker``, ``--security-protocol``, ``--ssl-cafile``, ...). Passwords have no
   command-line option (a command line is visible to every user of the machine): environment or file only.

:meth:`KafkaConnection.validate` runs at start (every command calls :func:`resolve`): an unknown protocol or
mechanism, a SASL mechanism without credentials, credentials on a protocol that does not use them, a TLS file that
does not exist: each is a :class:`ConnectionSettingsError` naming the setting and where it came from. Secrets are
never logged: ``repr``/``str``/:meth:`describe` show ``'***'``.

>>> c = KafkaConnection("kafka:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
...                     sasl_username="anon", sasl_password="s3cret")
>>> "s3cret" in repr(c), c.describe()
(False, 'kafka:9093 (SASL_SSL, SCRAM-SHA-512 as anon)')
>>> sorted(c.confluent())
['bootstrap.servers', 'sasl.mechanism', 'sasl.password', 'sasl.username', 'security.protocol', 'ssl.endpoint.identification.algorithm']
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

ENV_PREFIX = "STREAM_ANON_KAFKA_"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SECRET_FIELDS = ("ssl_password", "sasl_password")
_FILE_FIELDS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")

# Where a reader of a whole shared output partition (manifests, records, dead letters: written by every partition's
# transactional producer) starts: offset 0, not the broker's earliest offset (OFFSET_BEGINNING, seek_to_beginning).
# Tansu 0.6 can state a partition's earliest offset past its first batch when transactional producers write their
# first batches to it at once (the batch is still there; tests/kafka/test_broker.py), and a reader starting there misses
# it: a workaround for Tansu only (Apache Kafka stated 0 on every topic tried), harmless elsewhere. Where retention
# did remove offset 0, the fetch is out of range and the reader's auto.offset.reset = earliest starts it at the log
# start. A state partition (one producer) and the input are read from the broker's earliest.
FIRST_OFFSET = 0

# every topic of ours is created with the broker's default.replication.factor (-1: KIP-464, as Kafka Streams does
# since 3.0): a cluster's replication applies without a setting here, one broker's 1 on a single node
REPLICATION_FACTOR = -1


def seek_to_first(consumer, tps) -> None:
    """A kafka-python consumer's assigned partitions ``tps`` set to :data:`FIRST_OFFSET`."""
    for tp in tps:
        consumer.seek(tp, FIRST_OFFSET)
_BOOL_TRUE, _BOOL_FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ConnectionSettingsError(ValueError):
    """A Kafka connection setting is missing, unknown or inconsistent (message names the setting and source)."""


@dataclass(frozen=True)
class KafkaConnection:
    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    sources: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)   # setting -> origin

    # ---- display: secrets redacted
    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            if f.name == "sources":
                continue
            v = getattr(self, f.name)
            if f.name in SECRET_FIELDS:
                v = None if v is None else "***"
            shown.append(f"{f.name}={v!r}")
        return f"KafkaConnection({', '.join(shown)})"

    __str__ = __repr__

    def describe(self) -> str:
        """One line for logs: bootstrap, protocol, mechanism and user; never a secret."""
        if self.security_protocol == "PLAINTEXT":
            return f"{self.bootstrap} (PLAINTEXT)"
        extra = f", {self.sasl_mechanism} as {self.sasl_username}" if self.uses_sasl else ""
        return f"{self.bootstrap} ({self.security_protocol}{extra})"

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def _where(self, name: str) -> str:
        src = self.sources.get(name)
        return f" (from {src})" if src else ""

    # ---- validation
    def validate(self) -> "KafkaConnection":
        """Raise :class:`ConnectionSettingsError` for anything a client would fail on later, less clearly."""
        if not self.bootstrap or not all(_hostport(b) for b in self.bootstrap.split(",")):
            raise ConnectionSettingsError(f"kafka.bootstrap{self._where('bootstrap')}: expected HOST:PORT[,HOST:PORT...]"
                                          f", got {self.bootstrap!r}")
        if self.security_protocol not in PROTOCOLS:
            raise ConnectionSettingsError(
                f"kafka.security_protocol{self._where('security_protocol')}: unknown {self.security_protocol!r}; "
                f"known: {', '.join(PROTOCOLS)}")
        if self.uses_sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise ConnectionSettingsError(
                    f"kafka.sasl_mechanism{self._where('sasl_mechanism')}: "
                    + (f"unknown {self.sasl_mechanism!r}" if self.sasl_mechanism else "missing")
                    + f" (security_protocol {self.security_protocol}); known: {', '.join(MECHANISMS)}")
            for name in ("sasl_username", "sasl_password"):
                if not getattr(self, name):
                    raise ConnectionSettingsError(
                        f"kafka.{name}: missing for {self.security_protocol} with {self.sasl_mechanism} (set "
                        f"{ENV_PREFIX}{name.upper()}" + (" or the [kafka] table" if name == "sasl_username" else "")
                        + ")")
        else:
            given = [n for n in ("sasl_mechanism", "sasl_username", "sasl_password") if getattr(self, n)]
            if given:
                raise ConnectionSettingsError(
                    f"kafka.{given[0]}{self._where(given[0])}: SASL settings given but security_protocol is "
                    f"{self.security_protocol} (use SASL_SSL or SASL_PLAINTEXT)")
        if not self.uses_tls:
            given = [n for n in (*_FILE_FIELDS, "ssl_password") if getattr(self, n)]
            if given:
                raise ConnectionSettingsError(
                    f"kafka.{given[0]}{self._where(given[0])}: TLS settings given but security_protocol is "
                    f"{self.security_protocol} (use SSL or SASL_SSL)")
        for name in _FILE_FIELDS:
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConnectionSettingsError(f"kafka.{name}{self._where(name)}: file not found: {path}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile) and self.ssl_keyfile:
            raise ConnectionSettingsError(f"kafka.ssl_keyfile{self._where('ssl_keyfile')}: given without "
                                          "ssl_certfile (the client certificate)")
        if self.ssl_password and not self.ssl_keyfile:
            raise ConnectionSettingsError("kafka.ssl_password: given without ssl_keyfile (it decrypts the key)")
        return self

    # ---- client options
    def kafka_python(self) -> dict[str, Any]:
        """Options of kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient (their network client:
        :func:`kafka_net_client`)."""
        out: dict[str, Any] = {"bootstrap_servers": self.bootstrap.split(","),
                               "security_protocol": self.security_protocol, "kafka_client": kafka_net_client}
        if self.uses_tls:
            out["ssl_check_hostname"] = self.ssl_check_hostname
            for name in (*_FILE_FIELDS, "ssl_password"):
                if getattr(self, name):
                    out[name] = getattr(self, name)
        if self.uses_sasl:
            out.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                       sasl_plain_password=self.sasl_password)
        return out

    def confluent(self) -> dict[str, Any]:
        """Configuration properties of confluent-kafka (librdkafka) Producer, Consumer and AdminClient."""
        out: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "security.protocol": self.security_protocol}
        if self.uses_tls:
            # librdkafka's default is "https" (verify the broker's host name) since 2.0; say it explicitly
            out["ssl.endpoint.identification.algorithm"] = "https" if self.ssl_check_hostname else "none"
        for name, prop in (("ssl_cafile", "ssl.ca.location"), ("ssl_certfile", "ssl.certificate.location"),
                           ("ssl_keyfile", "ssl.key.location"), ("ssl_password", "ssl.key.password")):
            if self.uses_tls and getattr(self, name):
                out[prop] = getattr(self, name)
        if self.uses_sasl:
            out.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.sasl_username,
                        "sasl.password": self.sasl_password})
        return out

    def ssl_context(self):
        """An :class:`ssl.SSLContext` for aiokafka/faust (None without TLS)."""
        if not self.uses_tls:
            return None
        import ssl

        ctx = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=self.ssl_cafile)
        if self.ssl_certfile:
            ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=self.ssl_password)
        ctx.check_hostname = self.ssl_check_hostname
        return ctx

    def aiokafka(self) -> dict[str, Any]:
        """Options of aiokafka's AIOKafkaProducer / AIOKafkaConsumer."""
        out: dict[str, Any] = {"bootstrap_servers": self.bootstrap.split(","),
                               "security_protocol": self.security_protocol}
        if self.uses_tls:
            out["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            out.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                       sasl_plain_password=self.sasl_password)
        return out

    def faust_url(self) -> str:
        return ";".join(f"kafka://{b}" for b in self.bootstrap.split(","))

    def faust_credentials(self):
        """``broker_credentials`` of a faust App (None for PLAINTEXT)."""
        if self.security_protocol == "PLAINTEXT":
            return None
        import faust

        if self.uses_sasl:
            return faust.SASLCredentials(username=self.sasl_username, password=self.sasl_password,
                                         ssl_context=self.ssl_context(), mechanism=self.sasl_mechanism)
        return faust.SSLCredentials(self.ssl_context())

    def faust_settings(self) -> dict[str, Any]:
        """``broker`` and ``broker_credentials`` keyword arguments of :class:`faust.App`."""
        out: dict[str, Any] = {"broker": self.faust_url()}
        creds = self.faust_credentials()
        if creds is not None:
            out["broker_credentials"] = creds
        return out


# kafka-python 3 warns "blocking the event loop" when one step of its network task takes over 0.1 s. Reading a
# fetch response of a few MB (4 KB a recv, then parsed) takes that long on a busy machine, and so does waiting for
# the GIL while the audit's readers decode in other threads: every `make demo` and audit printed it. A step this
# long is a stall worth a line, as the check means it (a task that never yields).
SLOW_NETWORK_STEP_S = 5.0


def kafka_net_client(**configs):
    """kafka-python's network client (its ``kafka_client`` option) with the slow-step warning at
    :data:`SLOW_NETWORK_STEP_S`."""
    from kafka.net.compat import KafkaNetClient

    return KafkaNetClient(**{**configs, "slow_task_threshold_secs": SLOW_NETWORK_STEP_S})


def _hostport(value: str) -> bool:
    host, sep, port = value.strip().rpartition(":")
    return bool(sep and host and port.isdigit())


def _coerce(name: str, value: Any, origin: str) -> Any:
    if name == "ssl_check_hostname":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _BOOL_TRUE:
            return True
        if text in _BOOL_FALSE:
            return False
        raise ConnectionSettingsError(f"kafka.ssl_check_hostname (from {origin}): expected true or false, "
                                      f"got {value!r}")
    if not isinstance(value, str):
        raise ConnectionSettingsError(f"kafka.{name} (from {origin}): expected a string, got {type(value).__name__}")
    value = value.strip()
    if name == "security_protocol":
        return value.upper()
    if name == "sasl_mechanism":
        return value.upper()
    return value or None


SETTINGS = tuple(f.name for f in fields(KafkaConnection) if f.name != "sources")


def settings_from_toml(path: str | Path) -> dict[str, Any]:
    """The ``[kafka]`` table of a TOML file (a stream config or a connection file); unknown keys are errors."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConnectionSettingsError(f"kafka: connection file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConnectionSettingsError(f"kafka: {path} is not valid TOML: {exc}") from None
    table = raw.get("kafka", {})
    if not isinstance(table, dict):
        raise ConnectionSettingsError(f"kafka: {path}: [kafka] must be a table")
    unknown = sorted(set(table) - set(SETTINGS))
    if unknown:
        raise ConnectionSettingsError(f"kafka.{unknown[0]} (from {path}): unknown setting; known: "
                                      f"{', '.join(SETTINGS)}")
    return table


def settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    out = {}
    for name in SETTINGS:
        value = environ.get(ENV_PREFIX + name.upper())
        if value not in (None, ""):
            out[name] = value
    return out


def resolve(bootstrap: str | None = None, files=(), environ: Mapping[str, str] | None = None,
            **overrides) -> KafkaConnection:
    """Merge file tables (in order), the environment, then ``bootstrap`` and ``overrides`` (None = not given),
    and validate. ``files``: TOML paths whose ``[kafka]`` table is read (missing table: nothing).

    >>> resolve("127.0.0.1:9092", environ={}).kafka_python()["bootstrap_servers"]
    ['127.0.0.1:9092']
    >>> resolve("h:1", environ={"STREAM_ANON_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext"})
    Traceback (most recent call last):
    ...
    stream_anon.connection.ConnectionSettingsError: kafka.sasl_mechanism (from env STREAM_ANON_KAFKA_SECURITY_PROTOCOL): missing (security_protocol SASL_PLAINTEXT); known: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for path in files:
        if path is None:
            continue
        for name, value in settings_from_toml(path).items():
            values[name] = _coerce(name, value, str(path))
            sources[name] = f"[kafka] of {path}"
    for name, value in settings_from_env(environ).items():
        values[name] = _coerce(name, value, f"env {ENV_PREFIX}{name.upper()}")
        sources[name] = f"env {ENV_PREFIX}{name.upper()}"
    if bootstrap:
        values["bootstrap"], sources["bootstrap"] = bootstrap, "--broker"
    for name, value in overrides.items():
        if name not in SETTINGS:
            raise TypeError(f"unknown connection setting {name!r}")
        if value is not None:
            values[name] = _coerce(name, value, "--" + name.replace("_", "-"))
            sources[name] = "--" + name.replace("_", "-")
    if not values.get("bootstrap"):
        raise ConnectionSettingsError(f"kafka.bootstrap: missing (give --broker HOST:PORT, {ENV_PREFIX}BOOTSTRAP or "
                                      "bootstrap in a [kafka] table)")
    # SASL settings name the mechanism: default the protocol's missing pieces for a clearer error later
    sources_first = dict(sources)
    if "sasl_mechanism" not in sources_first and values.get("security_protocol") in ("SASL_PLAINTEXT", "SASL_SSL"):
        sources_first["sasl_mechanism"] = sources.get("security_protocol", "")
    conn = KafkaConnection(**values, sources=sources_first)
    from stream_anon.logsetup import register_secret
    for name in SECRET_FIELDS:      # kafka-python logs its configuration (passwords included) at DEBUG
        register_secret(getattr(conn, name))
    return conn.validate()


def plaintext(bootstrap: str) -> KafkaConnection:
    """A PLAINTEXT connection to ``bootstrap`` (the embedded broker, tests)."""
    return KafkaConnection(bootstrap)


def as_connection(value) -> KafkaConnection:
    """A :class:`KafkaConnection` from a connection or a bootstrap string (functions accept either)."""
    if isinstance(value, KafkaConnection):
        return value
    if isinstance(value, str):
        return KafkaConnection(value)
    raise TypeError(f"expected a KafkaConnection or 'HOST:PORT', got {type(value).__name__}")


def add_arguments(parser, broker_required: bool = False) -> None:
    """The connection options of every command (``--broker`` and the TLS/SASL settings; no passwords)."""
    g = parser.add_argument_group("Kafka connection (also [kafka] table of --config/--kafka-config, env "
                                  f"{ENV_PREFIX}*; passwords: env or file only)")
    g.add_argument("--broker", required=broker_required, default=None,
                   help=f"bootstrap servers HOST:PORT[,HOST:PORT] (or env {ENV_PREFIX}BOOTSTRAP)")
    g.add_argument("--kafka-config", default=None, help="TOML file with a [kafka] table of connection settings")
    g.add_argument("--security-protocol", default=None, type=str.upper, choices=PROTOCOLS,
                   help="how the clients talk to the brokers (default: PLAINTEXT)")
    g.add_argument("--ssl-cafile", default=None, help="CA certificate(s) to verify the brokers (PEM)")
    g.add_argument("--ssl-certfile", default=None, help="client certificate (PEM) for mutual TLS")
    g.add_argument("--ssl-keyfile", default=None, help="client private key (PEM); its password: env "
                                                       f"{ENV_PREFIX}SSL_PASSWORD")
    g.add_argument("--sasl-mechanism", default=None, type=str.upper, choices=MECHANISMS,
                   help="SASL mechanism with SASL_PLAINTEXT or SASL_SSL")
    g.add_argument("--sasl-username", default=None, help=f"password: env {ENV_PREFIX}SASL_PASSWORD")


def from_args(args, config_path=None, environ: Mapping[str, str] | None = None) -> KafkaConnection:
    """The connection of a command: ``[kafka]`` of its stream config, then of ``--kafka-config``, the environment
    and the command-line options."""
    files = [p for p in (config_path, getattr(args, "kafka_config", None)) if p]
    return resolve(getattr(args, "broker", None), files=files, environ=environ,
                   **{name: getattr(args, name, None) for name in
                      ("security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "sasl_mechanism",
                       "sasl_username")})


BROKER_TIMEOUT_S = 10.0        # the commands' wait for a broker's first answer (--timeout)


def timeout_seconds(text: str) -> float:
    """``--timeout SECONDS`` (the worker's ``--broker-wait``): a number > 0, else an argparse error line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds, a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds, a number > 0, got {text!r}")
    return value


def broker_unreachable(conn: KafkaConnection, timeout_s: float = BROKER_TIMEOUT_S) -> str | None:
    """One line saying why the broker cannot be used (no answer to a metadata request within ``timeout_s``),
    naming the address, what a plain TCP connection to it gets, and what to check; or None when it answers. Every
    command that talks to Kafka asks this first, so that a wrong address costs ``timeout_s`` and one line instead of
    a client's own wait and traceback. A broker that refuses the SASL credentials or whose certificate the CA does
    not verify is named as such at once (:func:`_refusal`): its answer is known, waiting longer changes nothing."""
    import logging
    import time

    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    client_log = logging.getLogger("stream_anon.kafka.client")
    client_log.disabled = True            # librdkafka's retries during the probe are this one line's business
    refused: list = []                    # librdkafka's authentication and TLS errors, served by poll()
    admin = AdminClient({**conn.confluent(),
                         "logger": client_log,              # type: ignore[dict-item]  # hint omits the logger
                         "error_cb": refused.append})       # type: ignore[dict-item]  # and the callbacks
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                return None
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                why = err.str() if hasattr(err, "str") else str(err)
            admin.poll(0)
            refusal = _refusal(conn, refused)
            if refusal:
                return refusal
            if time.monotonic() >= deadline:
                break
    finally:
        client_log.disabled = False
    tcp = [_tcp_outcome(address, min(1.0, timeout_s)) for address in conn.bootstrap.split(",")]
    where = conn.sources.get("bootstrap")
    where = f" (from {where})" if where else ""
    if any(outcome.endswith(": TCP connects") for outcome in tcp):
        check = (f"check that {conn.bootstrap}{where} is a Kafka listener for {conn.security_protocol}"
                 + ("" if conn.security_protocol == "PLAINTEXT" else " and that the TLS and SASL settings fit it"))
    else:
        check = f"check that a Kafka broker runs at {conn.bootstrap}{where} and is reachable from here"
    return (f"broker {conn.describe()} unreachable: no answer to a metadata request within {timeout_s:g} s "
            f"({why}; {', '.join(tcp)}); {check}")


def _refusal(conn: KafkaConnection, errors) -> str | None:
    """The line for a broker that answered and refused: SASL authentication failed (librdkafka's ``_AUTHENTICATION``)
    or the TLS handshake failed (``_SSL``: the broker's certificate is not verified by ``ssl_cafile``); None for
    other errors. librdkafka's text is kept, the secret never is in it."""
    from confluent_kafka import KafkaError

    for err in errors:
        code, text = err.code(), err.str().split(": ", 1)[-1].removeprefix("SSL handshake failed: ")
        if code == KafkaError._AUTHENTICATION:
            return (f"broker {conn.describe()} refused the credentials: {text}; check the user name and the password "
                    f"({ENV_PREFIX}SASL_PASSWORD or the [kafka] table)")
        if code == KafkaError._SSL:
            ca = f"ssl_cafile {conn.ssl_cafile}" if conn.ssl_cafile else "the system's CA certificates (no ssl_cafile)"
            return (f"broker {conn.describe()}: TLS handshake failed: {text}; check that {ca} holds the CA of the "
                    "broker's certificate and that the certificate names the address")
    return None


def _tcp_outcome(address: str, timeout_s: float) -> str:
    """``HOST:PORT: TCP connects`` or what a TCP connection to it met (refused, timed out, unknown host)."""
    import socket

    host, _, port = address.strip().rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except socket.gaierror:
        return f"{address}: host name not resolved"
    except ConnectionRefusedError:
        return f"{address}: connection refused"
    except TimeoutError:
        return f"{address}: TCP connection timed out"
    except OSError as exc:
        return f"{address}: {exc.strerror or exc}"
    return f"{address}: TCP connects"


def to_args(conn: KafkaConnection) -> list[str]:
    """Command-line options that give a child command the non-secret settings of ``conn`` (secrets:
    :func:`secret_env`).

    >>> to_args(KafkaConnection("h:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
    ...                         sasl_username="u", sasl_password="p"))
    ['--broker', 'h:1', '--security-protocol', 'SASL_PLAINTEXT', '--sasl-mechanism', 'PLAIN', '--sasl-username', 'u']
    """
    out = ["--broker", conn.bootstrap]
    if conn.security_protocol != "PLAINTEXT":
        out += ["--security-protocol", conn.security_protocol]
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "sasl_mechanism", "sasl_username"):
        if getattr(conn, name):
            out += ["--" + name.replace("_", "-"), str(getattr(conn, name))]
    return out


def secret_env(conn: KafkaConnection) -> dict[str, str]:
    """Environment variables that carry the secrets of ``conn`` to a child command."""
    return {ENV_PREFIX + name.upper(): getattr(conn, name) for name in SECRET_FIELDS if getattr(conn, name)}


def replace(conn: KafkaConnection, **changes) -> KafkaConnection:
    return dataclasses.replace(conn, **changes)
