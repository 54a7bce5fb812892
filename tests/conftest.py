"""Shared fixtures: a real embedded Kafka-compatible broker (Tansu) per test session; Kafka is never mocked."""
from __future__ import annotations

import os

import pytest

from stream_anon.broker import EmbeddedBroker

TEST_SECRET = "test-secret-0123456789abcdef0123456789"


@pytest.fixture(scope="session")
def broker():
    """A Tansu broker on a free loopback port for the whole session (memory storage)."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="session")
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
