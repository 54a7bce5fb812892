"""Config changes on a running oyster-cards stream, through the worker on a real broker (Tansu and Apache Kafka): the
worker runs into day 1 and is stopped with windows open; restarted under the changed config without
``--accept-config-change`` it halts every partition (one ERROR line per changed setting, ``/readyz`` 503) and
processes nothing (shown for epsilon; tests/worker/test_config_change.py shows it for every kind on the worker's core);
with the step it runs to the end of the stream: 0 events dead-lettered, every event accounted.

- epsilon x5 (``dp.epsilon_per_period`` and every aggregate's epsilon): day 1 keeps its budget of 1.0, the next days
  run at 5.0, and ``stream-anon audit`` with the new config passes on the whole stream (its DP check judging each
  period by the budget in force);
- the location hierarchy regrouped (stations moved between zones, a zone band renamed): the records buffered at the
  change are recoded and published; every release's labels cover their raw values under the hierarchy in force
  when it was made (the releases before the change under the old one, after it under the new one), and
  ``stream-anon audit --earlier-config <the original>`` passes on the whole stream (without it, coverage fails with
  one line naming the hierarchy those releases were made under).
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import read_all, state_offsets, wait_for, write_cards_config  # noqa: E402
from test_fail_closed import _get  # noqa: E402

from stream_anon import cli, crypto  # noqa: E402
from stream_anon.audit.kafka_source import audit_from_kafka  # noqa: E402
from stream_anon.audit.primitives import Hierarchy  # noqa: E402
from stream_anon.broker import free_port  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import oyster_cards  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.supervise import (committed_offsets, run_until_accounted, start_worker_process,  # noqa: E402
                                         stop_worker_process)
from stream_anon.kafka.topics import ensure_topics  # noqa: E402

FIRST = 3000                   # events of day 1 before the change (day 1 holds ~5,780)
ROOT = Path(__file__).resolve().parents[2]


def stream_events() -> list[dict]:
    """4,000 events of day 1, 1,500 of day 2 and 300 of day 3 (which close day 2's windows)."""
    by_day: dict[str, list] = {}
    for e in oyster_cards.read_events():
        by_day.setdefault(e["event_time"][:10], []).append(e)
    days = sorted(by_day)
    return by_day[days[0]][:4000] + by_day[days[1]][:1500] + by_day[days[2]][:300]


def start(bootstrap, tmp_path, name: str, edit) -> tuple[Path, Path, list[dict]]:
    """The stream's config (old) and its changed copy (``edit(text) -> text``), topics, and day 1 up to FIRST
    processed by a worker stopped with windows open."""
    old = write_cards_config(tmp_path / "cfg", name, f"raw.test.{name}")
    new = tmp_path / "cfg" / f"{name}-changed.toml"
    new.write_text(edit(old.read_text()))
    cfg = load_config(old)
    ensure_topics(bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records", "anon.releases",
                                    "anon.deadletter", "anon.metrics"],
                  default_partitions={cfg.stream.input_topic: 4, f"anon.{name}.records": 1})
    events = stream_events()
    replay(bootstrap, cfg.stream.input_topic, events[:FIRST], cfg.stream.privacy_unit, progress=False)
    w = start_worker_process(old, bootstrap, tmp_path / "state", f"{name}-app", None, tmp_path / "w1.log")
    try:
        wait_for(lambda: sum(o or 0 for o in committed_offsets(bootstrap, f"{name}-app", cfg.stream.input_topic,
                                                               range(4)).values()) == FIRST, 180,
                 "day 1 up to the change processed")
    finally:
        assert stop_worker_process(w) == 0
    replay(bootstrap, cfg.stream.input_topic, events[FIRST:], cfg.stream.privacy_unit, progress=False)
    return old, new, events


def halts_without_the_step(bootstrap, tmp_path, name: str, new: Path, setting: str) -> None:
    before = state_offsets(bootstrap, f"{name}-app", name)
    port = free_port()
    log = tmp_path / "w2.log"
    w = start_worker_process(new, bootstrap, tmp_path / "state", f"{name}-app", 1.0, log,
                             extra=["--web-port", str(port)])
    try:
        def halted():
            code, body = _get(port, "/readyz")
            return body if code == 503 and len(body.get("halted", {})) == 4 else None
        body = wait_for(halted, 60, "four halted partitions on /readyz")
        assert {h["reason"] for h in body["halted"].values()} == {"config_changed"}
        time.sleep(1.5)
    finally:
        stop_worker_process(w)
    lines = [ln for ln in log.read_text().splitlines() if "config changed on partition" in ln]
    assert sum(f": {setting}" in ln and "ERROR" in ln for ln in lines) == 4, lines
    assert state_offsets(bootstrap, f"{name}-app", name) == before          # nothing processed while halted


def run_with_the_step(bootstrap, tmp_path, name: str, new: Path, n: int) -> dict:
    acc = run_until_accounted(new, bootstrap, tmp_path / "state", n, timeout_s=150, app_id=f"{name}-app",
                              log_path=tmp_path / "w3.log", extra=["--accept-config-change"])
    assert acc["accounted"] == n and acc["dead_lettered"] == 0
    return acc


def times_five(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith(("epsilon_per_period = ", "epsilon = ")):
            key, value = line.split("=", 1)
            line = f"{key}= {float(value.split('#')[0]) * 5}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_epsilon_times_five_halts_without_the_step_and_applies_from_the_next_day_with_it(broker, tmp_path,
                                                                                          secret_env):
    name = "epsx5"
    old, new, events = start(broker.bootstrap, tmp_path, name, times_five)
    halts_without_the_step(broker.bootstrap, tmp_path, name, new, "dp.epsilon_budget 1.0 -> 5.0")
    run_with_the_step(broker.bootstrap, tmp_path, name, new, len(events))
    rows = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.aggregates", stream=name)]
    budgets = {(r["period"], r["ledger_epsilon_budget"]) for r in rows}
    assert budgets == {("2009-11-09", 1.0), ("2009-11-10", 5.0), ("2009-11-11", 5.0)}, budgets
    stated = {(r["partition"], r["aggregate"]) for r in rows if r.get("settings_changed")}
    assert len(stated) == 4 * 5                           # each aggregate's first release on each partition
    manifests = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.releases", stream=name)]
    assert {p["partition"] for p in manifests if "dp.epsilon_budget 1.0 -> 5.0" in p.get("settings_changed", [])} \
        == {0, 1, 2, 3}
    report = audit_from_kafka(broker.bootstrap, new, secret_env, idle_s=1.5, health=False)
    assert report.passed, report.format_text()
    dp = report.checks["dp"]
    assert dp["violations"] == 0 and dp["worst_unit_charge"] > 1.0 and dp["periods"] == 3
    assert report.summary["dead_lettered"] == 0 and report.summary["lost"] == 0


def regrouped_hierarchy(tmp_path: Path) -> Path:
    """oyster_location.json with every third Zone 2 station moved to Zone 3 and the band "Zones 1-2" renamed."""
    h = json.loads((ROOT / "configs" / "hierarchies" / "oyster_location.json").read_text())
    rail = h["tree"]["*"]["Rail"]
    moved = rail["Zones 1-2"]["Zone 2"][::3]
    rail["Zones 1-2"]["Zone 2"] = [s for s in rail["Zones 1-2"]["Zone 2"] if s not in moved]
    rail["Zones 3-4"]["Zone 3"] = moved + rail["Zones 3-4"]["Zone 3"]
    rail = {("Inner zones" if band == "Zones 1-2" else band): zones for band, zones in rail.items()}
    h["tree"]["*"]["Rail"] = rail
    path = tmp_path / "cfg" / "hierarchies" / "oyster_location_regrouped.json"      # in the config's tree
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(h))
    return path


def test_a_regrouped_location_hierarchy_dead_letters_nothing_and_every_release_covers_under_its_own(
        broker, tmp_path, secret_env, capsys):
    name = "regroup"
    regrouped = regrouped_hierarchy(tmp_path)
    original = str(ROOT / "configs" / "hierarchies" / "oyster_location.json")
    old, new, events = start(broker.bootstrap, tmp_path, name, lambda text: text.replace(
        'hierarchy = "hierarchies/oyster_location.json"', f'hierarchy = "hierarchies/{regrouped.name}"'))
    assert regrouped.name in new.read_text()
    run_with_the_step(broker.bootstrap, tmp_path, name, new, len(events))
    manifests = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.releases", stream=name)]
    changed = {}
    for m in sorted(manifests, key=lambda m: m["release_id"]):
        if any(c.startswith("quasi_identifiers.location.hierarchy") for c in m.get("settings_changed", [])):
            changed.setdefault(m["partition"], m["release_id"])
    assert set(changed) == {0, 1, 2, 3}

    by_release = {m["release_id"]: m["partition"] for m in manifests}
    before = {c.split(" ")[1] for m in manifests for c in m.get("settings_changed", [])
              if c.startswith("quasi_identifiers.location.hierarchy")}
    assert before == {Hierarchy.load(Path(original)).content_digest()}          # the audit's own digest
    # the audit with the new config alone: everything holds, but coverage names the hierarchy the releases before
    # the change were made under, in one line, instead of judging their labels under the new one
    report = audit_from_kafka(broker.bootstrap, new, secret_env, idle_s=1.5, health=False)
    print(report.format_text())
    failed = {n for n, c in report.checks.items() if not c["passed"]}
    assert failed == {"coverage"}, report.format_text()
    lines = [e["line"] for e in report.checks["coverage"]["examples"]]
    assert len(lines) == 1 and re.fullmatch(
        rf"coverage: release (\S+) was made under quasi_identifiers\.location\.hierarchy {before.pop()} ; give the "
        r"config in force then with --earlier-config", lines[0]), lines
    assert lines[0].split(" ")[2] < changed[by_release[lines[0].split(" ")[2]]]
    acc = report.checks["accounting"]
    assert acc["lost"] == 0 and acc["dead_lettered"] == 0 and acc["balanced"]
    # with the original config as --earlier-config the audit passes on the whole stream, each release judged by
    # the config in force when it was made
    capsys.readouterr()                                   # the first report's text is not this audit's
    code = cli.main(["audit", "--config", str(new), "--broker", broker.bootstrap, "--idle", "1.5",
                     "--earlier-config", str(old), "--report", str(tmp_path / "audit.json")])
    text = capsys.readouterr().out
    print(text)
    assert code == 0 and text.startswith("AUDIT PASSED"), text
    judged = json.loads((tmp_path / "audit.json").read_text())["summary"]["settings_in_force"]
    assert [(j["config"], j["earlier"]) for j in judged] == [(str(new), False), (str(old), True)]
    assert all(j["releases"] > 0 for j in judged) and sum(j["releases"] for j in judged) == len(by_release)
    assert f"  settings in force: {new} judged {judged[0]['releases']} releases; earlier config {old} judged " \
           f"{judged[1]['releases']} releases" in text.splitlines()          # dozens of releases each
    # every published label covers its raw value under the hierarchy in force when its release was made (the
    # audit's own hierarchy reader); a retired label is not published after the change
    raw = {crypto.audit_token(secret_env, e["event_id"]): e.get("station") or e.get("bus_route") for e in events}
    trees = {False: Hierarchy(json.loads(Path(original).read_text())["tree"]),
             True: Hierarchy(json.loads(regrouped.read_text())["tree"])}
    records = [d for _, d, _, _ in read_all(broker.bootstrap, f"anon.{name}.records")]
    seen = {False: 0, True: 0}
    for r in records:
        if r["audit_token"] not in raw:                  # a counterfeit record (m-invariance) has no raw event
            continue
        made_after = r["release_id"] >= changed[by_release[r["release_id"]]]
        label = r["qi"]["location"]["label"]
        assert trees[made_after].covers(label, raw[r["audit_token"]]), (r["release_id"], label)
        assert not (made_after and label == "Zones 1-2")
        seen[made_after] += 1
    assert seen[False] > 1000 and seen[True] > 1000, seen
