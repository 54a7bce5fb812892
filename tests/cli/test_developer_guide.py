"""docs/developers.md holds: a new strategy is one module plus one registry line. Its example is executed here,
registered, loaded through a configuration (parameters validated with their key) and run by the engine, whose
former keeps k distinct individuals per class whatever the strategy returns."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from stream_anon import strategies
from stream_anon.config import ConfigError, load_config
from stream_anon.datasets import load_events
from stream_anon.engine import Engine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fixed_width(monkeypatch):
    text = (ROOT / "docs" / "developers.md").read_text()
    start = text.index("\n## Adding a strategy or a former\n")
    section = text[start:text.index("\n## ", start + 1)]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/developers.md example", "exec"), namespace)   # the module as the guide shows it
    monkeypatch.setitem(strategies.STRATEGIES, "fixed-width", namespace["FixedWidth"])   # its registry line
    return namespace["FixedWidth"]


def test_the_readme_strategy_plugs_in_with_one_registry_line(fixed_width):
    base = load_config(ROOT / "configs" / "citibike.toml")
    cfg = base.replace_anonymization(strategy="fixed-width", strategy_params={"bins": 4})
    engine = Engine(cfg, secret=b"developer-guide-secret-0123456789")
    events = load_events("citibike", limit=3000)
    rels = engine.process(events).releases + engine.flush().releases
    classes = [c for r in rels for c in r.classes if not c.reused]
    assert classes and sum(r.published for r in rels) > 0
    assert min(c.individuals for c in classes) >= cfg.anonymization.k
    with pytest.raises(ConfigError, match="anonymization.strategy_params.bins: a positive integer"):
        base.replace_anonymization(strategy="fixed-width", strategy_params={"bins": 0})
    with pytest.raises(ConfigError, match="anonymization.strategy_params.width: unknown parameter"):
        base.replace_anonymization(strategy="fixed-width", strategy_params={"width": 3})
    assert np.isfinite([c.ncp for c in classes]).all()
