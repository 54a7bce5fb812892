"""Shared fixtures: a real embedded Kafka-compatible broker (Tansu) per test; Kafka is never mocked.

The ``kafka`` marker (what ``make test-fast`` leaves out: ``-m "not kafka"``) is set here, never by hand: a test
has it when it requests a fixture of :data:`BROKER_FIXTURES`, directly or through another fixture. A test that
starts a broker itself (one it stops and restarts, or a ``stream-anon broker`` / ``demo`` subprocess) requests
``broker_of_its_own``. A test without the marker that starts a broker anyway fails: its broker binary is
replaced by one that says so (:func:`_no_broker_unless_marked`)."""
from __future__ import annotations

import logging
import os

import pytest

from stream_anon.broker import EmbeddedBroker

TEST_SECRET = "test-secret-0123456789abcdef0123456789"

# the workers the tests start: Tansu holds a consumer-group join for half the session timeout (3 s at the worker's
# default of 6 s, 1 s at 2 s), and the suite starts a worker ~70 times
os.environ.setdefault("STREAM_ANON_SESSION_TIMEOUT_S", "2")


@pytest.fixture
def broker():
    """A Tansu broker of the test's own on a free loopback port (memory storage; it starts in ~0.1 s).

    Never one per session: Tansu 0.6 does not abort a transaction whose producer died (Apache Kafka aborts it after
    ``transaction.timeout.ms``), and it defers the commit of every later transaction that wrote behind it on the same
    partition: the commit answers OK, yet its offsets are not applied and its records stay invisible to
    read_committed readers until the dead producer's id is initialized again. A worker killed by one test would
    leave its open transaction on the shared topics (anon.releases, anon.metrics, anon.deadletter) and stall the
    tests after it. The probe: ``tests/test_broker.py``."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="module")
def module_broker():
    """One broker for a module whose module-scoped fixture publishes once for several tests (see :func:`broker`)."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def broker_of_its_own():
    """For a test that starts its broker itself: :class:`~stream_anon.broker.EmbeddedBroker` (the marker is the
    point: the test needs the broker's binary and runs in ``make test``, not in ``make test-fast``)."""
    return EmbeddedBroker


# the fixtures that give a test a broker: the test is marked ``kafka``
BROKER_FIXTURES = frozenset({"broker", "module_broker", "broker_of_its_own"})
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
def bootstrap(broker) -> str:
    return broker.bootstrap


@pytest.fixture
def secret_env(monkeypatch):
    """STREAM_ANON_SECRET set for this test (and the worker subprocesses it starts)."""
    monkeypatch.setenv("STREAM_ANON_SECRET", TEST_SECRET)
    return TEST_SECRET.encode()


def _doctest_starts_a_broker(item) -> bool:
    """A doctest of the package whose examples start an embedded broker (it requests no fixture)."""
    examples = getattr(getattr(item, "dtest", None), "examples", ())
    return any("EmbeddedBroker(" in example.source for example in examples)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())) or _doctest_starts_a_broker(item):
            item.add_marker(pytest.mark.kafka)
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
