"""The audit's DP check (stream_anon/audit/checks/dp_budget.py) on rows the engine and the DP aggregates really
produce for the Oyster cards stream (bundled slice, one partition): honest rows pass at exactly the budget; rows of
a stream whose epsilon was raised x5, rows tampered to claim less noise (the naive check that trusts each row's
``epsilon`` field passes them), rows filed under another period and a budget raised between periods all fail, each
with one line naming aggregate, period and the worst unit's charge."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from stream_anon import contract
from stream_anon.audit import AuditConfig, audit
from stream_anon.audit.checks.dp_budget import worst_charge
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.engine import Engine
from stream_anon.worker.aggregates import PartitionAggregates, needed_fields

SECRET = b"audit-dp-secret-0123456789abcdef0123"
EVENTS = 6000


def _rows(config) -> list[dict]:
    events = load_events("oyster-cards", limit=EVENTS)
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    pa = PartitionAggregates(config, 0, SECRET)
    rows: list[dict] = []
    for start in range(0, len(events), 2000):
        rows += pa.close_windows(engine.process(events[start:start + 2000]).windows)[0]
    rows += pa.close_windows(engine.flush().windows)[0]
    return rows


def _scaled(config, factor: float):
    dp = config.dp
    specs = tuple(dataclasses.replace(s, epsilon=s.epsilon * factor) for s in dp.aggregates)
    return dataclasses.replace(config, dp=dataclasses.replace(dp, epsilon_budget=dp.epsilon_budget * factor,
                                                              aggregates=specs))


@pytest.fixture(scope="module")
def config():
    return load_config(contract.config_path("oyster-cards"))


@pytest.fixture(scope="module")
def honest(config):
    return _rows(config)


@pytest.fixture(scope="module")
def audit_cfg():
    return AuditConfig.from_toml(contract.config_path("oyster-cards"))


def dp_check(rows, cfg) -> dict:
    return audit([], {"aggregates": rows}, SECRET, cfg).checks["dp"]


def test_honest_rows_pass_at_the_budget(honest, audit_cfg):
    chk = dp_check(honest, audit_cfg)
    assert chk["passed"], chk["examples"]
    assert chk["rows"] == len(honest) > 1000
    # the worst card spends the whole day's budget, never more (each aggregate its share)
    assert chk["worst_unit_charge"] == pytest.approx(1.0, rel=1e-9)
    assert chk["periods"] >= 2


def test_epsilon_raised_fails_with_one_line_per_aggregate_and_period(config, audit_cfg):
    raised = _rows(_scaled(config, 5.0))
    chk = dp_check(raised, audit_cfg)
    assert not chk["passed"]
    kinds = chk["violations_by_kind"]
    assert kinds["aggregate over its epsilon"] >= 5 and kinds["period over budget"] >= 2
    assert kinds["declared budget above the config"] >= 2
    lines = [e["line"] for e in chk["examples"] if "line" in e]
    assert any(l.startswith("dp: tap_ins_zone_hour period 2009-11-") and "worst unit charged 2.5 > epsilon 0.5"
               in l for l in lines), lines
    assert chk["worst_unit_charge"] == pytest.approx(5.0, rel=1e-9)


def test_rows_claiming_less_noise_fail_although_their_epsilon_fits(honest, audit_cfg):
    tampered = copy.deepcopy(honest)
    for r in tampered:
        if r["aggregate"] == "taps_per_zone":
            r["noise_scale"] /= 4
            r["noise_std"] /= 4
    # a naive check summing the rows' own epsilon claims sees nothing wrong
    naive: dict = {}
    for r in tampered:
        if r["output"] == "per_window":
            naive[(r["period"], r["aggregate"], r["release"])] = r["epsilon"]
    by_period: dict = {}
    for (period, agg, _), e in naive.items():
        by_period.setdefault(period, {}).setdefault(agg, 0.0)
        by_period[period][agg] += e
    assert all(sum(min(e, audit_cfg.dp.aggregates[a].epsilon) for a, e in aggs.items()) <= 1.0 + 1e-9
               for aggs in by_period.values())
    chk = dp_check(tampered, audit_cfg)
    assert not chk["passed"]
    assert any("dp: taps_per_zone period" in e.get("line", "") and "worst unit charged 0.8 > epsilon 0.2"
               in e["line"] for e in chk["examples"]), chk["examples"]


def test_noise_std_below_the_declared_scale_is_charged(honest, audit_cfg):
    tampered = copy.deepcopy(honest)
    for r in tampered:
        if r["aggregate"] == "fare_histogram":
            r["noise_std"] /= 3          # the scale still says the honest noise
    chk = dp_check(tampered, audit_cfg)
    assert not chk["passed"] and chk["violations_by_kind"].get("aggregate over its epsilon")


def test_rows_moved_to_another_period_fail(honest, audit_cfg):
    tampered = copy.deepcopy(honest)
    for r in tampered:
        if r["aggregate"] == "tap_ins_zone_hour":
            r["period"] = "1999-01-01"
    assert dp_check(tampered, audit_cfg)["violations_by_kind"].get("period label")


def test_budget_raised_between_periods_is_reported(honest, audit_cfg):
    tampered = copy.deepcopy(honest)
    last = max(r["period"] for r in tampered)
    for r in tampered:
        if r["period"] == last:
            r["ledger_epsilon_budget"] = 0.5       # the rows of the last day declare less than the first days'
    chk = dp_check(tampered, audit_cfg)
    kinds = chk["violations_by_kind"]
    assert kinds.get("period over declared budget") and not kinds.get("declared budget raised")
    first = min(r["period"] for r in tampered)
    for r in tampered:
        r["ledger_epsilon_budget"] = 0.9 if r["period"] == first else 1.0
    assert dp_check(tampered, audit_cfg)["violations_by_kind"].get("declared budget raised")


def test_rows_without_dp_config_and_unknown_aggregates_fail(honest, audit_cfg):
    no_dp = dataclasses.replace(audit_cfg, dp=None)
    assert dp_check(honest[:10], no_dp)["violations_by_kind"] == {"rows without [dp]": 1}
    stray = copy.deepcopy(honest[:3])
    for r in stray:
        r["aggregate"] = "not_configured"
    assert dp_check(stray, audit_cfg)["violations_by_kind"] == {"unknown aggregate": 3}


def test_conflicting_copies_of_a_row_fail_duplicates(honest, audit_cfg):
    twin = dict(honest[0], value=honest[0]["value"] + 7)
    report = audit([], {"aggregates": [honest[0], twin]}, SECRET, audit_cfg)
    assert report.checks["duplicates"]["violations_by_kind"] == {"conflicting duplicate row": 1}


def test_worst_charge_is_the_best_spread_of_w_windows():
    # a unit puts its W windows where they cost most: 2 in the dearest release, the rest in the next
    assert worst_charge([(0.1, 4, False), (0.3, 2, False), (0.2, 4, False)], 4) == pytest.approx(1.0)
    assert worst_charge([(0.1, 4, False)] * 10, 4) == pytest.approx(0.4)
    assert worst_charge([(0.1, 1, False)] * 3, float("inf")) == pytest.approx(0.3)
