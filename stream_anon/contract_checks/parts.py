"""The contract of each registered part (:mod:`.registry`), checked on real data by the package's own pipeline and
judged by the independent audit (:mod:`stream_anon.audit`, which imports nothing of the engine):

- a **strategy** (``form_classes``, stream_anon/strategies/__init__.py): each call returns disjoint, non-empty
  classes of valid rows, each of at least k distinct units; its ``Params`` is a frozen dataclass; the stream it
  runs in publishes records the audit passes (k, coverage, accounting), the same for the same seed;
- a **criterion** (``[[anonymization.criteria]]``): a stream with it publishes records and the audit's check of
  that criterion passes on every class;
- a **former**: it implements the Former protocol and is Checkpointable; the bundled stream that selects it
  passes the audit (m-invariance too for an m-invariant one), the same output twice;
- an **aggregate kind** (``[[aggregates]] kind``): alone in a stream, it releases rows for every window, the
  audit's DP check passes, the same rows twice.
Each check raises AssertionError naming the part and what failed. The state contract of the stateful parts is
:mod:`.checkpointable`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from stream_anon.datasets import load_events

from . import registry

SECRET = "contract-checks-secret-" + "0123456789abcdef" * 2
EVENTS = 600          # of the part's stream's bundled slice: a few windows, every release path


def _events(config, n: int) -> list:
    """The first ``n`` events of the bundled slice of the config's stream (``citibike-h3``: the citibike slice)."""
    from stream_anon.datasets import DATASETS
    name = config.stream.name
    dataset = max((d for d in DATASETS if name == d or name.startswith(d + "-")), key=len, default=registry.BASE)
    return load_events(dataset, limit=n)


def _run(config, events: int = EVENTS):
    """The in-process API's output for the first ``events`` events of the config's bundled slice."""
    from stream_anon.api import anonymize
    return anonymize(_events(config, events), config, secret=SECRET)


def _audit(result, config, what: str, checks: tuple[str, ...]) -> Any:
    """The audit of ``result`` in a copy of ``config`` written to a temporary directory (the audit reads TOML);
    every check of ``checks`` present and passed."""
    from stream_anon.api import audit_result
    with registry.ConfigCopy(config.raw, config.stream.name) as path:
        report = audit_result(result, path, secret=SECRET)
    for name in checks:
        assert name in report.checks, f"{what}: the audit ran no {name} check"
        assert report.checks[name]["passed"], f"{what}: the audit's {name} check failed: {report.checks[name]}"
    return report


def _same_twice(config, first, what: str, events: int = EVENTS) -> None:
    again = _run(config, events)
    assert again.records == first.records and again.dp_rows == first.dp_rows, f"{what}: another run differs"


def check_strategy(name: str) -> None:
    from stream_anon.engine import Engine
    from stream_anon.formers.kanon import KAnonymousFormer
    from stream_anon.strategies import STRATEGIES

    what = f"strategy {name}"
    cls = STRATEGIES[name]
    params = getattr(cls, "Params", None)
    frozen = (dataclasses.is_dataclass(params)
              and params.__dataclass_params__.frozen)  # type: ignore[union-attr]  # not in typeshed's DataclassInstance
    assert frozen, f"{what}: Params must be a frozen dataclass"
    config = registry.strategy_config(name)
    engine = Engine(config, secret=SECRET.encode())
    assert isinstance(engine.former, KAnonymousFormer), f"{what}: its config must make a k-anonymous former"
    strategy = engine.former.strategy
    form, calls = strategy.form_classes, []

    def observed(X, units, k, space, rng, **extra):      # what each call received and returned
        classes = form(X, units, k, space, rng, **extra)
        calls.append((len(X), np.asarray(units), k, [np.asarray(c) for c in classes]))
        return classes

    strategy.form_classes = observed
    engine.process(_events(config, EVENTS))
    engine.flush()
    assert calls, f"{what}: never asked to form classes"
    for n, units, k, classes in calls:
        rows = np.concatenate(classes) if classes else np.empty(0, np.int64)
        assert all(len(c) for c in classes), f"{what}: an empty class"
        assert len(np.unique(rows)) == len(rows), f"{what}: overlapping classes"
        assert rows.size == 0 or (rows.min() >= 0 and rows.max() < n), f"{what}: a row out of range"
        small = [len(np.unique(units[c])) for c in classes if len(np.unique(units[c])) < k]
        assert not small, f"{what}: classes of {small} distinct units, k = {k}"
    result = _run(config)
    assert result.records, f"{what}: published nothing"
    _audit(result, config, what, ("k", "coverage", "accounting"))
    _same_twice(config, result, what)


def check_criterion(kind: str) -> None:
    what = f"criterion {kind}"
    sample = registry.CRITERION_SAMPLES.get(kind)
    assert sample is not None, f"{what}: no sample entry in contract_checks/registry.py CRITERION_SAMPLES"
    base = registry.bundled()[registry.BASE]
    raw = {**base.raw, "anonymization": {**base.raw["anonymization"], "criteria": [{"kind": kind, **sample}]}}
    raw.pop("dp", None)
    raw.pop("aggregates", None)
    with registry.ConfigCopy(raw, base.stream.name) as path:
        from stream_anon.config import load_config
        config = load_config(path)
    assert [c.kind for c in config.anonymization.criteria] == [kind], f"{what}: not in force"
    result = _run(config)
    assert result.records, f"{what}: published nothing"
    _audit(result, config, what, ("k", "severity" if kind == "severity" else "l_diversity", "accounting"))


def check_former(name: str) -> None:
    from stream_anon.checkpoint import Checkpointable
    from stream_anon.engine import Engine
    from stream_anon.formers.base import Former

    what = f"former {name}"
    config = registry.former_config(name)
    former = Engine(config, secret=SECRET.encode()).former
    assert isinstance(former, Former) and isinstance(former, Checkpointable), f"{what}: protocols not implemented"
    result = _run(config, 2000)
    assert result.records, f"{what}: published nothing"
    checks = ("k", "coverage", "accounting", "consistency") + (("m_invariance",) if former.m else ())
    _audit(result, config, what, checks)
    _same_twice(config, result, what, 2000)


def check_aggregate_kind(kind: str) -> None:
    what = f"aggregate kind {kind}"
    base, entry = registry.aggregate_sample(kind)
    config = registry.with_only(base, [entry])
    result = _run(config, 2000)
    rows = [r for r in result.dp_rows if r.get("kind") == kind]
    assert rows, f"{what}: no rows"
    assert all(np.isfinite(r["value"]) for r in rows if isinstance(r.get("value"), (int, float))), \
        f"{what}: a value that is not finite"
    windows = {r["window"] for r in rows}
    closed = {r["window"] for r in result.dp_rows}
    assert windows == closed, f"{what}: rows for windows {sorted(windows)}, windows closed {sorted(closed)}"
    _audit(result, config, what, ("dp",))
    _same_twice(config, result, what, 2000)


CHECKS = {"strategy": check_strategy, "criterion": check_criterion, "former": check_former,
          "aggregate": check_aggregate_kind}


def check_all() -> list[tuple[str, str]]:
    """Every check of every registered part; returns the (registry, part) pairs checked."""
    done = []
    for part_kind, names in registry.registered().items():
        for name in names:
            CHECKS[part_kind](name)
            done.append((part_kind, name))
    return done
