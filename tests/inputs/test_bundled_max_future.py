"""Every bundled config sets ``[stream] max_future_s``, says why that value, and dead-letters none of its bundled
data with it (issue 28: an earlier value dead-lettered every day of the oyster-cards slice after the first).

``max_future_s`` is judged in stream time: against the largest event time accepted before the event on its
partition. Here the bundled data of each config goes through the engine's record reader on one partition, in
file order; ``bench/max_future.py --full`` measures the full files and random partitionings
(bench/results/max_future.json)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from stream_anon import contract
from stream_anon.config import load_config
from stream_anon.datasets import DATASETS
from stream_anon.engine.records import FUTURE_EVENT_TIME, RecordReader
from stream_anon.engine.space import QISpace

ROOT = contract.configs_dir()
BUNDLED = sorted(ROOT.glob("*.toml")) + sorted((ROOT / "inputs").glob("*.toml"))
DATASET_OF = {"oyster": "oyster", "oyster-cards": "oyster-cards", "citibike": "citibike", "citibike-h3": "citibike",
              "obd2": "obd2", "obd2-h3": "obd2"}


@pytest.mark.parametrize("path", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_every_bundled_config_sets_max_future_s_with_the_reason_above_it(path):
    cfg = load_config(path)
    assert cfg.stream.max_future_s is not None and cfg.stream.max_future_s >= cfg.stream.allowed_lateness_s
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if re.match(r"max_future_s\s*=", line))
    assert lines[at - 1].startswith("#"), f"{path.name}: no comment saying why max_future_s = {lines[at]}"


@pytest.mark.parametrize("name", sorted(DATASET_OF))
def test_the_bundled_data_has_no_event_the_value_dead_letters(name):
    cfg = load_config(contract.config_path(name))
    ds = DATASETS[DATASET_OF[name]]
    events = ds.read(ds.slice_path)
    reader = RecordReader(cfg, QISpace(cfg), b"bundled-max-future-secret-0123456789")
    largest, future, accepted = -np.inf, 0, 0
    for i in range(0, len(events), 5000):             # batches carry the largest time on, as the worker does
        rec, rejected = reader.read(events[i:i + 5000], largest)
        future += sum(r.startswith(FUTURE_EVENT_TIME) for _, r in rejected)
        accepted += len(rec)
        if len(rec):
            largest = max(largest, float(rec.times.max()))
    assert accepted > 0.9 * len(events) and future == 0, (name, future)
