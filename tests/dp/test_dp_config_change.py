"""DP settings changed on a running stream with ``--accept-config-change`` (stream_anon/dp/transition.py), on the
worker's core (no broker; tests/kafka/test_config_change_dp_kafka.py runs the same on the broker): a raise applies from
the next period and the ledger keeps what was spent; a lowering applies at once; an aggregate redefined or added
pauses until the next period; each aggregate's first release after the change states it, and the audit's DP check
passes such a stream while it fails one whose budget rose without the step, or within a period."""
from __future__ import annotations

import copy
import dataclasses
import functools
import json

import pytest
from jsonschema import Draft202012Validator

from stream_anon import contract
from stream_anon.audit import AuditConfig, audit
from stream_anon.audit.dp_config import read_dp
from stream_anon.config import load_config, parse_config
from stream_anon.datasets import load_events
from stream_anon.worker import state as st
from stream_anon.worker.aggregates import AGGREGATES_TOPIC
from stream_anon.worker.core import WorkerCore
from stream_anon.worker.partition import ConfigChangeRefused

SECRET = b"dp-config-change-secret-0123456789ab"
DAY1 = "2009-11-09"
CHANGE_AT = 3000             # events of day 1 before the change (day 1 holds ~5,700)


@functools.lru_cache(maxsize=1)
def stream_events() -> tuple[dict, ...]:
    """4,000 events of day 1, then 1,500 of day 2 and 300 of day 3 (which close day 2's windows)."""
    by_day: dict[str, list] = {}
    for e in load_events("oyster-cards"):
        by_day.setdefault(e["event_time"][:10], []).append(e)
    days = sorted(by_day)
    return tuple(by_day[days[0]][:4000] + by_day[days[1]][:1500] + by_day[days[2]][:300])


def cards_raw() -> dict:
    return copy.deepcopy(load_config(contract.config_path("oyster-cards")).raw)


def config_of(raw: dict):
    return parse_config(raw, base_dir=contract.configs_dir())       # a document of the bundled configs' directory


def scaled(factor: float) -> dict:
    raw = cards_raw()
    raw["dp"]["epsilon_per_period"] *= factor
    for aggregate in raw["aggregates"]:
        aggregate["epsilon"] *= factor
    return raw


def messages(events) -> list[tuple[int, bytes]]:
    return [(i, json.dumps(e).encode()) for i, e in enumerate(events)]


def rows_of(out) -> list[dict]:
    return [json.loads(v) for t, _, v in out.messages if t == AGGREGATES_TOPIC]


def run_with_change(new_raw: dict, accept: bool = True):
    """Day 1 up to CHANGE_AT under the bundled config, then the rest under ``new_raw``: (rows before, rows after,
    the resumed partition, the new core)."""
    msgs = messages(stream_events())
    first = WorkerCore(load_config(contract.config_path("oyster-cards")), "app", SECRET)
    ps = first.open_partition(0)
    before = rows_of(first.process(ps, msgs[:CHANGE_AT]))
    value = st.encode_state(first.committed(ps, ps.offset))
    second = WorkerCore(config_of(new_raw), "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=second.kid,
                          settings=second.settings, accept_config_change=accept)
    if not accept:
        return rec
    resumed = second.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    after = rows_of(second.process(resumed, msgs[CHANGE_AT:])) + rows_of(second.flush(resumed))
    return before, after, resumed, rec


def dp_check(rows, raw) -> dict:
    cfg = dataclasses.replace(AuditConfig.from_toml(contract.config_path("oyster-cards")), dp=read_dp(raw))
    return audit([], {"aggregates": rows}, SECRET, cfg).checks["dp"]


@pytest.fixture(scope="module")
def raised():
    return run_with_change(scaled(5))


def test_without_the_step_an_epsilon_raise_halts_with_one_line_per_setting():
    rec = run_with_change(scaled(5), accept=False)
    assert rec.halt == st.HALT_CONFIG_CHANGED
    assert "dp.epsilon_budget 1.0 -> 5.0" in rec.changes
    assert "aggregates.tap_ins_zone_hour.epsilon 0.5 -> 2.5" in rec.changes and len(rec.changes) == 6


def test_a_raise_applies_from_the_next_period_and_the_ledger_keeps_what_was_spent(raised):
    before, after, resumed, rec = raised
    day1 = [r for r in before + after if r["period"] == DAY1]
    later = [r for r in after if r["period"] > DAY1]
    assert day1 and later and any(r["period"] == DAY1 for r in after)     # day 1 went on after the change
    assert {r["ledger_epsilon_budget"] for r in day1} == {1.0}
    assert {r["ledger_epsilon_budget"] for r in later} == {5.0}
    eps = {r["aggregate"]: r["epsilon_period"] for r in day1}
    assert all(r["epsilon_period"] == pytest.approx(5 * eps[r["aggregate"]]) for r in later)
    # each aggregate's first release after the change states it, and only that one
    stated = {}
    for r in after:
        if r.get("settings_changed"):
            stated.setdefault(r["aggregate"], r["release"])
            assert "dp.epsilon_budget 1.0 -> 5.0" in r["settings_changed"]
    assert set(stated) == {r["aggregate"] for r in after}
    assert all(r["release"] == stated[r["aggregate"]] for r in after if r.get("settings_changed"))
    ledger = resumed.dp.ledger
    assert ledger.period_spent(DAY1) <= 1.0 + 1e-9 and ledger.period_spent(DAY1) > 0.5
    assert ledger.epsilon_budget == 5.0
    # the rows, the change's statement included, are what topics/schemas/aggregate.schema.json describes
    schema = json.loads((contract.config_path("oyster-cards").parents[1] / "topics" / "schemas" /
                         "aggregate.schema.json").read_text())
    validator = Draft202012Validator(schema)
    assert not [e.message for r in before + after for e in validator.iter_errors(r)]


def test_the_audit_passes_an_accepted_raise_and_fails_one_without_the_step(raised):
    before, after, _, _ = raised
    rows = before + after
    chk = dp_check(rows, scaled(5))
    assert chk["passed"], chk["examples"]
    assert chk["worst_unit_charge"] > 1.0                 # day 2 spends more than day 1's budget, as accepted
    unaccepted = [{k: v for k, v in r.items() if k != "settings_changed"} for r in rows]
    chk = dp_check(unaccepted, scaled(5))
    assert not chk["passed"] and chk["violations_by_kind"].get("declared budget raised")
    line = next(e["line"] for e in chk["examples"] if e["violation"] == "declared budget raised")
    assert "period 2009-11-10" in line and "worst unit charged" in line and "1 -> 5" in line
    assert line.startswith("dp: tap_ins_zone_hour ")      # the aggregate that charged most
    # a raise within a period (the rows of day 1 after the change declaring the new budget) fails too
    mid = copy.deepcopy(rows)
    for r in mid:
        if r["period"] == DAY1 and r["window"] > max(b["window"] for b in before):
            r["ledger_epsilon_budget"] = 5.0
    chk = dp_check(mid, scaled(5))
    assert chk["violations_by_kind"].get("declared budget raised within a period")


def test_a_lowered_budget_applies_at_once_and_old_periods_are_judged_by_theirs():
    before, after, resumed, _ = run_with_change(scaled(0.2))
    day1_after = [r for r in after if r["period"] == DAY1]
    assert {r["ledger_epsilon_budget"] for r in day1_after} <= {0.2}
    ledger = resumed.dp.ledger
    spent_before = max(r["ledger_epsilon_spent"] for r in before)
    assert ledger.period_spent(DAY1) <= max(0.2, spent_before) + 1e-9
    if spent_before >= 0.2:                               # nothing more released on day 1 after the change
        assert not day1_after
    later = [r for r in after if r["period"] > DAY1]
    assert later and {r["ledger_epsilon_budget"] for r in later} == {0.2}
    chk = dp_check(before + after, scaled(0.2))
    assert chk["passed"], chk["examples"]


def test_a_redefined_aggregate_pauses_until_the_next_period_and_an_added_one_starts_there():
    raw = cards_raw()
    histogram = next(a for a in raw["aggregates"] if a["name"] == "fare_histogram")
    histogram["bins"] = [0, 100, 400, 2000]
    added = copy.deepcopy(histogram)
    added["name"], added["epsilon"] = "fare_histogram_coarse", 0.05
    raw["aggregates"].append(added)
    raw["aggregates"] = [a for a in raw["aggregates"] if a["name"] != "share_capped"]      # removed
    before, after, resumed, rec = run_with_change(raw)
    assert not [r for r in after if r["period"] == DAY1 and r["aggregate"].startswith("fare_histogram")]
    assert {r["group"]["bin"] for r in after if r["aggregate"] == "fare_histogram"} == \
        {"[0,100)", "[100,400)", "[400,2000]"}
    assert any(r["aggregate"] == "fare_histogram_coarse" for r in after)
    assert not [r for r in after if r["aggregate"] == "share_capped"]
    assert resumed.dp.ledger.period_spent(DAY1) <= 1.0 + 1e-9


def test_the_period_or_the_unit_of_privacy_is_refused_in_place():
    raw = cards_raw()
    raw["dp"]["timezone"] = "UTC"
    msgs = messages(load_events("oyster-cards", limit=1500))
    first = WorkerCore(load_config(contract.config_path("oyster-cards")), "app", SECRET)
    ps = first.open_partition(0)
    first.process(ps, msgs)
    value = st.encode_state(first.committed(ps, ps.offset))
    second = WorkerCore(config_of(raw), "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=second.kid,
                          settings=second.settings, accept_config_change=True)
    with pytest.raises(ConfigChangeRefused, match="dp.timezone Europe/London -> UTC: the period's time zone"):
        second.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)


def test_a_group_whose_values_map_to_other_cells_of_the_same_domain_goes_on_another_domain_pauses():
    """The settings record each DP group's value mapping (a digest): a hierarchy regrouped under the same labels
    changes it and the aggregate goes on, counting each event in its new cell; a group with other cells pauses
    until the next period; a DP schedule start moved is refused (the schedule's windows)."""
    from stream_anon import guarantees
    from stream_anon.dp import transition
    from stream_anon.worker.partition import check_change
    cards = load_config(contract.config_path("oyster-cards"))
    old = guarantees.settings(cards)
    name = next(s.name for s in cards.dp.aggregates if any(g.mapping for g in s.group_by))
    key = f"aggregates.{name}.group_by"
    moved = copy.deepcopy(old)
    first = moved[key][0]
    first["mapping"] = "sha256:" + "0" * 16                        # stations moved between the same zones
    other = copy.deepcopy(moved)
    other[key][0]["domain"] = other[key][0]["domain"][:-1]         # a zone gone
    for new, paused in ((moved, []), (other, [name])):
        lines = guarantees.changes(old, new)
        assert [line.split(" ")[0] for line in lines] == [key]
        assert transition.carry(old, new, lines)["pause"] == paused
    started = {**old, "dp.start": old["dp.start"] + 86400}
    with pytest.raises(ConfigChangeRefused, match="dp.start .*the release schedule's first window"):
        check_change(guarantees.changes(old, started), {}, old, started)
