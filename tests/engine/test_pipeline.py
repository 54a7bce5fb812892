"""Every stage of a partition's pipeline implements its declared protocol (stream_anon.pipeline), and every stateful
stage the one state model (stream_anon.checkpoint.Checkpointable): the stages call each other through these
methods only."""
from __future__ import annotations

import pytest

from stream_anon import checkpoint, pipeline
from stream_anon.config import load_config
from stream_anon.contract import config_path
from stream_anon.engine import Engine, RecordReader
from stream_anon.formers.base import Former
from stream_anon.worker.aggregates import PartitionAggregates
from stream_anon.render import Renderer

SECRET = b"pipeline-test-secret-0123456789"


@pytest.fixture(scope="module")
def cards():
    return load_config(config_path("oyster-cards"))       # m-invariant former and DP aggregates


@pytest.fixture(scope="module")
def plain():
    return load_config(config_path("oyster"))             # k-anonymous former


def test_every_stage_implements_its_protocol(cards, plain):
    for config in (cards, plain):
        engine = Engine(config, secret=SECRET)
        assert isinstance(engine.reader, RecordReader) and isinstance(engine.reader, pipeline.Reader)
        assert isinstance(engine, pipeline.WindowCore)
        assert isinstance(engine.former, Former)
        assert isinstance(Renderer(config, SECRET), pipeline.Renderer)
    assert isinstance(PartitionAggregates(cards, 0, SECRET), pipeline.WindowConsumer)


def test_every_stateful_stage_is_checkpointable(cards, plain):
    for config in (cards, plain):
        engine = Engine(config, secret=SECRET)
        for part in (engine, engine.former, engine.registry):
            assert isinstance(part, checkpoint.Checkpointable), type(part).__name__
    dp = PartitionAggregates(cards, 0, SECRET)
    for part in (dp, dp.aggregator, dp.ledger):
        assert isinstance(part, checkpoint.Checkpointable), type(part).__name__


def test_a_protocol_check_fails_for_a_stage_missing_a_method():
    class NoFlush:
        def read(self, events): ...

        def process_records(self, records): ...

    assert not isinstance(NoFlush(), pipeline.WindowCore)
