"""Shared fixtures: a real embedded Kafka-compatible broker (Tansu) per test; Kafka is never mocked."""
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
def bootstrap(broker) -> str:
    return broker.bootstrap


@pytest.fixture
def secret_env(monkeypatch):
    """STREAM_ANON_SECRET set for this test (and the worker subprocesses it starts)."""
    monkeypatch.setenv("STREAM_ANON_SECRET", TEST_SECRET)
    return TEST_SECRET.encode()


def pytest_collection_modifyitems(config, items):
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
