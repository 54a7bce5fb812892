"""Shared fixtures: a real Kafka broker; Kafka is never mocked.

Every test that takes ``broker``, ``bootstrap`` or ``module_broker`` runs twice: on Tansu (the embedded broker of
``stream_anon/broker.py``, one per test) and on Apache Kafka (``tests/_apache_kafka.py``, one per pytest process
reused across tests, its topics and groups deleted before each), unless marked ``one_broker``: a test of what does
not depend on the broker's behaviour (input formats, the API, the report, metrics, DP schedules and budgets) runs on
one, Apache Kafka when it can run here (the broker users run), else Tansu; the transactions, recovery, lineage, key
rotation, config change, chaos, state and partition tests and the guide run on both (docs/brokers.md).
``--broker tansu|apache`` keeps one of them. The
Apache Kafka variant is skipped when ``java`` or ``mvn`` is missing; ``.ci/run`` installs them and fails when no
test ran on Apache Kafka (the counts ``STREAM_ANON_BROKER_COUNTS`` names, written at the end of the session).

The ``kafka`` marker (what ``make test-fast`` leaves out: ``-m "not kafka"``) is set here, never by hand: a test
has it when it requests a fixture of :data:`BROKER_FIXTURES`, directly or through another fixture. A test that
starts a broker itself (one it stops and restarts, or a ``stream-anon broker`` / ``demo`` subprocess) requests
``broker_of_its_own`` (or ``new_broker``). A test without the marker that starts a Tansu anyway fails: its broker
binary is replaced by one that says so (:func:`_no_broker_unless_marked`)."""
from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from _apache_kafka import ApacheKafka, missing_tools
from stream_anon.broker import EmbeddedBroker

# The test modules lie in one directory per area (tests/engine/, tests/kafka/, ...: docs/developers.md), the helpers
# (_kafka_helpers.py, ...) here in tests/, which pytest puts on sys.path for this file. A few modules import another
# test module (``from test_lineage import _run_lineage``), some of another area: every area directory goes on
# sys.path too, as pytest puts a module's own there when it imports it (module names are unique across areas).
AREAS = sorted(d for d in Path(__file__).resolve().parent.iterdir()
               if d.is_dir() and not (d / "__init__.py").exists() and any(d.glob("test_*.py")))
for _area in AREAS:
    if str(_area) not in sys.path:
        sys.path.insert(0, str(_area))

TEST_SECRET = "test-secret-0123456789abcdef0123456789"
BROKER_KINDS = ("tansu", "apache")
COUNTS_ENV = "STREAM_ANON_BROKER_COUNTS"

# the workers the tests start. Tansu only: it holds a consumer-group join for half the session timeout (3 s at the
# worker's default of 6 s, 1 s at 2 s), and the suite starts a worker ~70 times. Apache Kafka answers a join at
# once (group.initial.rebalance.delay.ms=0); the test broker accepts 2 s (group.min.session.timeout.ms), so a killed
# worker's partitions move as fast on both
os.environ.setdefault("STREAM_ANON_SESSION_TIMEOUT_S", "2")


def pytest_addoption(parser):
    parser.addoption("--broker", choices=("both",) + BROKER_KINDS, default="both",
                     help="the broker the Kafka tests run on (default both: Tansu and Apache Kafka)")


def pytest_generate_tests(metafunc):
    if "broker_kind" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("broker")
        if chosen != "both":
            kinds = (chosen,)
        elif metafunc.definition.get_closest_marker("one_broker"):
            kinds = ("tansu",) if missing_tools() else ("apache",)
        else:
            kinds = BROKER_KINDS
        # module scope: a module's tests run on one broker, then on the other (module_broker is built once each)
        metafunc.parametrize("broker_kind", kinds, scope="module")


@pytest.fixture(scope="session")
def apache_kafka_tools():
    """For a test that starts its own Apache Kafka (a cluster, TLS, another address): the launcher class; the test
    is skipped when ``java`` or ``mvn`` is missing (and marked ``kafka``)."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"Apache Kafka tier: {' and '.join(missing)} not on PATH")
    return ApacheKafka


@pytest.fixture(scope="session")
def apache_kafka():
    """The Apache Kafka of this pytest process (one combined KRaft node, ~10 s to start), shared by its tests.

    Sound to share, unlike Tansu: Apache Kafka aborts a dead producer's transaction after its
    ``transaction.timeout.ms`` and a new producer of the same transactional id aborts it at once, so a worker
    killed by one test leaves nothing that stalls the next."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"Apache Kafka tier: {' and '.join(missing)} not on PATH")
    with ApacheKafka() as kafka:
        yield kafka


def _broker_of(kind: str, request):
    if kind == "tansu":
        return EmbeddedBroker()
    kafka = request.getfixturevalue("apache_kafka")
    kafka.reset()
    return None


@pytest.fixture
def broker(broker_kind, request):
    """A broker with nothing on it: a Tansu of the test's own on a free loopback port (memory storage; it starts in
    ~0.1 s), or the process's Apache Kafka with every topic and group deleted.

    Never one Tansu per session: Tansu 0.6 does not abort a transaction whose producer died (Apache Kafka aborts it
    after ``transaction.timeout.ms``), and it defers the commit of every later transaction that wrote behind it on
    the same partition: the commit answers OK, yet its offsets are not applied and its records stay invisible to
    read_committed readers until the dead producer's id is initialized again. A worker killed by one test would
    leave its open transaction on the shared topics (anon.releases, anon.metrics, anon.deadletter) and stall the
    tests after it. The probe: ``tests/kafka/test_broker.py``."""
    tansu = _broker_of(broker_kind, request)
    if tansu is None:
        yield request.getfixturevalue("apache_kafka")
        return
    with tansu as b:
        yield b


@pytest.fixture(scope="module")
def module_broker(broker_kind, request):
    """One broker for a module whose module-scoped fixture publishes once for several tests (see :func:`broker`)."""
    tansu = _broker_of(broker_kind, request)
    if tansu is None:
        yield request.getfixturevalue("apache_kafka")
        return
    with tansu as b:
        yield b


@pytest.fixture
def bootstrap(broker) -> str:
    return broker.bootstrap


@pytest.fixture
def reset_broker(broker, broker_kind):
    """A broker reset under the stream: every topic, group and committed offset gone. Tansu (memory storage):
    stopped and started again on the same port; Apache Kafka: everything deleted."""
    def reset():
        if broker_kind == "tansu":
            broker.stop()
            broker.start()
        else:
            broker.reset()
    return reset


@pytest.fixture
def new_broker(broker_kind):
    """For a test that needs a broker of its own on an address it chooses (``host=``): a new broker of the test's
    kind, to start with ``with``."""
    if broker_kind == "apache" and missing_tools():
        pytest.skip(f"Apache Kafka tier: {' and '.join(missing_tools())} not on PATH")
    return EmbeddedBroker if broker_kind == "tansu" else ApacheKafka


@pytest.fixture
def broker_of_its_own():
    """For a test that starts its broker itself: :class:`~stream_anon.broker.EmbeddedBroker` (the marker is the
    point: the test needs the broker's binary and runs in ``make test``, not in ``make test-fast``)."""
    return EmbeddedBroker


# the fixtures that give a test a broker: the test is marked ``kafka``
BROKER_FIXTURES = frozenset({"broker", "module_broker", "broker_of_its_own", "new_broker", "apache_kafka",
                             "apache_kafka_tools"})
NEEDS_A_BROKER = ("this test starts a broker but requests no fixture of BROKER_FIXTURES (tests/conftest.py), so "
                  "it is not marked kafka and would run in make test-fast: request broker_of_its_own")


@pytest.fixture(autouse=True)
def _no_broker_unless_marked(request, tmp_path_factory, monkeypatch):
    """A test not marked ``kafka`` gets a broker binary that fails with :data:`NEEDS_A_BROKER` (in this process
    and in the subprocesses that inherit the environment)."""
    if request.node.get_closest_marker("kafka") is not None:
        yield
        return
    refuse = tmp_path_factory.getbasetemp() / "no-broker.sh"
    if not refuse.exists():
        refuse.write_text(f"#!/bin/sh\necho '{NEEDS_A_BROKER}' >&2\nexit 3\n")
        refuse.chmod(0o755)
    monkeypatch.setenv("STREAM_ANON_TANSU_BIN", str(refuse))
    yield


@pytest.fixture
def secret_env(monkeypatch):
    """STREAM_ANON_SECRET set for this test (and the worker subprocesses it starts)."""
    monkeypatch.setenv("STREAM_ANON_SECRET", TEST_SECRET)
    return TEST_SECRET.encode()


def _doctest_starts_a_broker(item) -> bool:
    """A doctest of the package whose examples start an embedded broker (it requests no fixture)."""
    examples = getattr(getattr(item, "dtest", None), "examples", ())
    return any("EmbeddedBroker(" in example.source for example in examples)


def _module_rank(items) -> dict[str, int]:
    """Per test module, its place in the run: the modules that start clusters of their own first, then the ones
    run on both brokers, the other broker tests, the rest. xdist hands whole modules (``--dist loadfile``) to its
    workers in this order, so the longest start first and short ones fill the end (longest first: the run ends
    with the workers evenly busy)."""
    rank: dict[str, int] = {}
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        kind = getattr(item, "callspec", None) and item.callspec.params.get("broker_kind")
        r = 0 if "apache_kafka_tools" in names else 1 if kind else 2 if BROKER_FIXTURES & names else 3
        rank[_module(item)] = min(r, rank.get(_module(item), 3))
    return rank


def _module(item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    rank = _module_rank(items)
    items.sort(key=lambda item: rank[_module(item)])       # stable: a module's tests stay in order
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())) or _doctest_starts_a_broker(item):
            item.add_marker(pytest.mark.kafka)
        kind = getattr(item, "callspec", None) and item.callspec.params.get("broker_kind")
        if kind:
            item.user_properties.append(("broker", kind))
    # the kafka tests start subprocesses that need the package importable from the repo root
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pp = os.environ.get("PYTHONPATH", "")
    if root not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")


LOG_TAIL_LINES = 40


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the last lines of every ``*.log`` its subprocesses wrote under ``tmp_path``
    (workers, replays): CI keeps only the printed report, and a timeout says nothing without them."""
    outcome = yield
    report = outcome.get_result()
    tmp = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if not report.failed or tmp is None:
        return
    # first among the sections: CI shows the head and the tail of a long report, and the captured output can be long
    for i, log in enumerate(sorted(tmp.rglob("*.log"))[:8]):
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError as err:
            lines = [f"(unreadable: {err})"]
        report.sections.insert(i, (f"last {LOG_TAIL_LINES} lines of {log.relative_to(tmp)}",
                                   "\n".join(lines[-LOG_TAIL_LINES:])))


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A test running a command in this process (``cli.main``) sets the root logger's handler on the stream pytest
    captures for that test; restored afterwards, so later tests' log lines do not go to a closed capture file
    (a "--- Logging error ---" traceback each)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


_outcomes: Counter = Counter()


def pytest_runtest_logreport(report):
    """Count each test's outcome per broker (in the controlling process under xdist: reports carry the property)."""
    kind = dict(report.user_properties).get("broker")
    if kind and (report.when == "call" or report.outcome != "passed"):
        _outcomes[(kind, report.outcome)] += 1


def pytest_sessionfinish(session):
    path = os.environ.get(COUNTS_ENV)
    if path and not hasattr(session.config, "workerinput"):
        counts = {kind: {o: n for (k, o), n in _outcomes.items() if k == kind} for kind in BROKER_KINDS}
        with open(path, "w") as f:
            json.dump(counts, f)
