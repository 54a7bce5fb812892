"""The audit against tampered outputs (issue 39): a worker's honest outputs on the bundled oyster-cards slice
(two partitions, DP aggregates of every kind the config has) pass; each tampering below, done as a faulty or
dishonest worker would, fails the audit with a line naming it. The audit recomputes what it can (every DP value
from the raw topic and the secret, every class's individuals from the records) rather than trusting what the
outputs declare; a check that trusted the declarations would pass most of these (``noise scale lowered``, ``an exact
value without noise``, ``a second row for one cell``, ``a whole release published twice``: the naive checks
``test_the_declared_noise_alone_passes_...`` run show so)."""
from __future__ import annotations

import copy

import orjson
import pytest

from stream_anon import contract, crypto
from stream_anon.audit import AuditConfig, audit
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.worker.core import WorkerCore
from stream_anon.worker.placement import partitions_for

SECRET = b"tamper-secret-0123456789abcdef0123456"
N_PARTITIONS = 2
EVENTS = 3000


@pytest.fixture(scope="module")
def run():
    """(raw messages, outputs, audit config) of an honest worker."""
    cfg = load_config(contract.config_path("oyster-cards"))
    events = load_events("oyster-cards", limit=EVENTS)
    homes = partitions_for(crypto.pseudonym_keys(SECRET, [e["card_id"] for e in events]), N_PARTITIONS).tolist()
    offsets, msgs = [0] * N_PARTITIONS, []
    for e, p in zip(events, homes):
        msgs.append((p, offsets[p], orjson.dumps(e)))
        offsets[p] += 1
    core = WorkerCore(cfg, "tamper", SECRET)
    core.check_placement(N_PARTITIONS)
    for p in range(N_PARTITIONS):
        core.open_partition(p)
    outputs = {"records": [], "manifests": [], "deadletters": [], "aggregates": []}
    for topic, _, value in core.handle(msgs) + core.flush_all():
        doc = orjson.loads(value)
        part = {"anon.aggregates": "aggregates", "anon.releases": "manifests", "anon.deadletter": "deadletters",
                "anon.oyster-cards.records": "records"}.get(topic)
        if part:
            outputs[part].append(doc)
    raw = [((cfg.stream.input_topic, p, o), v) for p, o, v in msgs]
    return raw, outputs, AuditConfig.from_toml(contract.config_path("oyster-cards"))


def judged(run, outputs):
    raw, _, cfg = run
    return audit(raw, outputs, SECRET, cfg)


def test_honest_outputs_pass(run):
    rep = judged(run, run[1])
    assert rep.passed, {k: c.get("examples") for k, c in rep.checks.items() if not c.get("passed", True)}
    chk = rep.checks["dp_values"]
    assert chk["rows_recomputed"] == len(run[1]["aggregates"]) > 10_000 and not chk["not_recomputed"]


def _rows(outputs, aggregate="tap_ins_zone_hour", output="per_window"):
    return [r for r in outputs["aggregates"] if r["aggregate"] == aggregate and r["output"] == output]


def _busiest_release(outputs, aggregate="tap_ins_zone_hour"):
    rows = _rows(outputs, aggregate)
    by = {}
    for r in rows:
        by.setdefault((r["partition"], r["release"]), []).append(r)
    return max(by.values(), key=lambda rs: sum(abs(r["value"]) for r in rs))


def noise_scale_lowered(o):
    for r in _busiest_release(o):
        r["noise_scale"] /= 4


def noise_std_lowered(o):
    for r in _busiest_release(o):
        r["noise_std"] /= 4


def budget_raised(o):
    for r in o["aggregates"]:
        r["ledger_epsilon_budget"] = 2.0


def second_row_for_a_cell(o):
    r = dict(_busiest_release(o)[0])
    r["row_id"] += "-again"
    r["value"] += 7
    o["aggregates"].append(r)


def release_published_twice(o):
    for r in _busiest_release(o):
        twin = dict(r, row_id=r["row_id"] + "-twin", value=r["value"] + 3)
        o["aggregates"].append(twin)


def exact_value_without_noise(o):
    # the value the worker would publish without noise: the recomputed true value (here: published minus noise
    # is not known to a tamperer; publishing a round number stands for any value that is not true + keyed noise)
    r = _busiest_release(o)[0]
    r["value"] = int(round(r["value"] / 10.0)) * 10 + 1


def class_below_k(o):
    m = next(m for m in o["manifests"] if len(m["classes"]) >= 2)
    a, b = m["classes"][0]["class_id"], m["classes"][1]["class_id"]
    moved = [r for r in o["records"] if r["release_id"] == m["release_id"] and r["class_id"] == a]
    for r in moved[1:]:
        r["class_id"] = b


def false_individuals(o):
    m = next(m for m in o["manifests"] if m["classes"])
    m["classes"][0]["individuals"] += 5


def conflicting_manifest(o):
    m = copy.deepcopy(next(m for m in o["manifests"] if m["published"]))
    m["published"] += 1
    o["manifests"].append(m)


def reused_release_id(o):
    a = next(m for m in o["manifests"] if m["partition"] == 0 and m["published"])
    b = copy.deepcopy(next(m for m in o["manifests"] if m["partition"] == 1 and m["published"]))
    b["release_id"] = a["release_id"]
    o["manifests"].append(b)


def conflicting_row_id(o):
    r = dict(_busiest_release(o)[0])
    r["value"] += 1
    o["aggregates"].append(r)


TAMPERS = {
    # name: (tamper, check that must fail, violation kind)
    "noise scale lowered": (noise_scale_lowered, "dp", "aggregate over its epsilon"),
    "noise std lowered": (noise_std_lowered, "dp", "aggregate over its epsilon"),
    "budget raised": (budget_raised, "dp", "declared budget above the config"),
    "a second row for one cell": (second_row_for_a_cell, "dp_values", "second row for a cell"),
    "a whole release published twice": (release_published_twice, "dp", "aggregate over its epsilon"),
    "an exact value without noise": (exact_value_without_noise, "dp_values", "value differs"),
    "a class moved below k": (class_below_k, "k", None),
    "a false individuals count": (false_individuals, "consistency", None),
    "a conflicting manifest": (conflicting_manifest, "duplicates", "conflicting duplicate release"),
    "a reused release id": (reused_release_id, "duplicates", "conflicting duplicate release"),
    "a conflicting row id": (conflicting_row_id, "duplicates", "conflicting duplicate row"),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_each_tampering_fails_the_audit_naming_it(run, name):
    tamper, check, kind = TAMPERS[name]
    outputs = copy.deepcopy(run[1])
    tamper(outputs)
    rep = judged(run, outputs)
    assert not rep.passed, f"{name}: the audit passed"
    result = rep.checks[check]
    assert not result["passed"], f"{name}: check {check} passed; failed: " \
                                 f"{[k for k, c in rep.checks.items() if not c.get('passed', True)]}"
    if kind is not None:
        assert result["violations_by_kind"].get(kind), (name, result["violations_by_kind"])
    print(name, "->", check, result["violations_by_kind"],
          next((e.get("line") for e in result["examples"] if e.get("line")), ""))


def test_the_declared_noise_alone_passes_values_that_are_not_the_keyed_noise(run):
    """The naive audit (the budget check alone, which trusts each row's declared noise and counts one row per
    cell) passes a value published without its noise and a second row for a cell; the recomputation fails them."""
    for tamper in (exact_value_without_noise, second_row_for_a_cell):
        outputs = copy.deepcopy(run[1])
        tamper(outputs)
        rep = judged(run, outputs)
        assert not rep.checks["dp_values"]["passed"]
        if tamper is exact_value_without_noise:
            assert rep.checks["dp"]["passed"], "the rate check alone cannot see a value without its noise"
