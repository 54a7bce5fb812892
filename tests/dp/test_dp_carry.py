"""A lineage after a total loss (broker and state lost together) starts with an empty ledger (issue 43 item 14):
without the carried budget it spends each period again and a unit's loss over both lineages is twice the budget;
the audit's ``dp across lineages`` check fails it, naming the period. With ``worker --carry-budget`` (the rows of
``anon.aggregates`` a consumer kept) the new lineage's ledgers start with what the lost one spent: the sum stays
within the budget, and the audit passes. In-process worker cores on the Oyster slice; the broker run of the same
procedure: tests/kafka/test_lineage.py."""
from __future__ import annotations

import json

import pytest

from stream_anon.audit import audit
from stream_anon.audit.config import AuditConfig
from stream_anon.config import load_config
from stream_anon.render import TOPICS
from stream_anon.datasets import load_events
from stream_anon.dp.carry import carried_spend, with_carried
from stream_anon.worker.core import WorkerCore

SECRET = b"test-secret-carried-budget-0123456789"
CONFIG = "configs/oyster.toml"


def lineage_outputs(config, lineage: str, events: list[dict]) -> dict:
    """One lineage's outputs by kind: a worker core from an empty state over every event (one partition)."""
    core = WorkerCore(config, f"app-{lineage}", SECRET)
    core.open_partition(0, lineage=lineage)
    msgs = [(0, i, json.dumps(e).encode()) for i, e in enumerate(events)]
    by_topic: dict[str, list] = {}
    for topic, _key, value in core.handle(msgs) + core.flush_all():
        by_topic.setdefault(topic, []).append(json.loads(value))
    return {"records": by_topic.get(TOPICS.records(config.stream.name), []),
            "manifests": by_topic.get(TOPICS.releases, []), "deadletters": by_topic.get(TOPICS.deadletter, []),
            "aggregates": by_topic.get(TOPICS.aggregates, []), "metrics": by_topic.get(TOPICS.metrics, [])}


@pytest.fixture(scope="module")
def lost_lineage():
    config = load_config(CONFIG)
    events = load_events("oyster", limit=3000)
    return config, events, lineage_outputs(config, "Lfirst001", events)


@pytest.mark.parametrize("carry", [False, True], ids=["no carry", "carried"])
def test_a_new_lineage_spends_only_what_the_lost_one_left(lost_lineage, carry):
    config, events, first = lost_lineage
    spent = carried_spend(first["aggregates"])
    assert spent and max(eps for _, eps in spent.values()) == pytest.approx(config.dp.epsilon_budget)
    second = lineage_outputs(with_carried(config, spent) if carry else config, "Lsecond02", events)
    raw = [((config.stream.input_topic, 0, i), json.dumps(e)) for i, e in enumerate(events)]
    outputs = {kind: first[kind] + second[kind] for kind in ("records", "manifests", "deadletters", "aggregates")}
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(CONFIG))
    across = report.summary["dp_across_lineages"]
    check = report.checks["dp across lineages"]
    if carry:
        assert report.passed, report.format_text()
        assert max(across.values()) <= config.dp.epsilon_budget + 1e-9
        assert not second["aggregates"]                    # every period of the slice was spent by the lost one
        assert any(m.get("type") == "budget_exhausted" for m in second["metrics"])
    else:
        assert max(across.values()) == pytest.approx(2 * config.dp.epsilon_budget)
        assert not check["passed"] and report.verdict == "FAILED"
        assert check["examples"][0]["violation"] == "period over budget across lineages"
        assert report.verdict_reason.startswith("dp across lineages")
