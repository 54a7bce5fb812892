"""Configuration changes on a real broker (Tansu and Apache Kafka), one after another on one stream: k lowered (5 -> 3),
then raised (3 -> 6), then ``window_s`` changed (900 -> 600), each between two runs of a worker.

Before each step the worker is started without the explicit step: every partition halts (one log line per partition
naming the setting, /readyz 503). With ``--accept-config-change`` every event is placed (0 dead-lettered), no
partition stalls (each one's last input offset committed), each change is written into the manifests, and the audit
judges each release by the k in force when it was made: it passes on the whole stream with the final config and
fails with the first one.

Then the privacy unit (the journey, then the card): halted without the step, refused with it (named with the step),
taken by a new app id with ``--new-lineage``; the audit with the new config judges the superseded lineage by the
unit its manifests state."""
from __future__ import annotations

import json
import sys
from datetime import timedelta
import urllib.error
import urllib.request
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import (START, committed_offsets, read_all, setup_stream, synthetic_fares, wait_for,  # noqa: E402
                            write_stream_config)
from test_lineage import _run_lineage  # noqa: E402

from stream_anon import cli  # noqa: E402
from stream_anon.audit.kafka_source import audit_from_kafka  # noqa: E402
from stream_anon.broker import free_port  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.supervise import run_until_accounted, start_worker_process, stop_worker_process  # noqa: E402
from stream_anon.kafka.topics import ensure_topics  # noqa: E402


def _readyz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except urllib.error.URLError:
        return 0, {}


def _audit(config: Path, bootstrap: str, report: Path) -> tuple[int, dict]:
    code = cli.main(["audit", "--config", str(config), "--broker", bootstrap, "--idle", "1.0",
                     "--report", str(report)])
    return code, json.loads(report.read_text())


def _halted(path: Path, bootstrap: str, state: Path, app_id: str, log: Path, partitions: int = 4,
            extra: tuple = ()) -> dict:
    """Start a worker (``extra``: its options; none: without the step); wait until its ``partitions`` are halted on
    /readyz; stop it."""
    port = free_port()
    w = start_worker_process(path, bootstrap, state, app_id, 1.0, log, extra=["--web-port", str(port), *extra])
    try:
        def halted():
            code, body = _readyz(port)
            return body if code == 503 and len(body.get("halted", {})) == partitions else None
        return wait_for(halted, 60, f"{partitions} halted partition(s) on /readyz")
    finally:
        stop_worker_process(w)


# each step: the settings written into the config, the one line the worker names it with
STEPS = (({"k": 3}, "anonymization.k 5 -> 3"), ({"k": 6}, "anonymization.k 3 -> 6"),
         ({"k": 6, "window_s": 600}, "anonymization.window_s 900.0 -> 600.0"))


def test_k_lowered_then_raised_then_window_changed_halts_each_time_and_is_judged_release_by_release(
        broker, tmp_path, secret_env):
    name = "kchain"
    path, cfg = setup_stream(tmp_path, broker.bootstrap, name)
    topic = cfg.stream.input_topic
    first_config = write_stream_config(tmp_path / "first", name, topic, k=5)
    state, app_id = tmp_path / "state", "kchain-app"
    sent = 600
    replay(broker.bootstrap, topic, synthetic_fares(sent, seed=31), "journey_id", progress=False)
    assert run_until_accounted(path, broker.bootstrap, state, sent, timeout_s=90, app_id=app_id, flush_when_idle_s=1.0,
                               log_path=tmp_path / "w0.log")["accounted"] == sent

    for i, (settings, line) in enumerate(STEPS, start=1):
        write_stream_config(tmp_path / "cfg", name, topic, **settings)           # the operator's edit
        later = synthetic_fares(400, seed=31 + i, start=START + timedelta(hours=5 * i))    # after the ones before
        replay(broker.bootstrap, topic, later, "journey_id", progress=False)
        sent += len(later)
        body = _halted(path, broker.bootstrap, state, app_id, tmp_path / f"halt{i}.log")
        assert {h["reason"] for h in body["halted"].values()} == {"config_changed"}, body
        named = [ln for ln in (tmp_path / f"halt{i}.log").read_text().splitlines() if "config changed on" in ln]
        assert all(ln.endswith(line) and "ERROR" in ln for ln in named), named       # one setting, one line
        assert {ln.split("config changed on partition ")[1].split(":")[0] for ln in named} == {"0", "1", "2", "3"}
        acc = run_until_accounted(path, broker.bootstrap, state, sent, timeout_s=90, app_id=app_id,
                                  flush_when_idle_s=1.0, log_path=tmp_path / f"run{i}.log",
                                  extra=["--accept-config-change"])
        assert acc["accounted"] == sent and acc["dead_lettered"] == 0 and acc["deferred"] == 0, (line, acc)

    # no stall: every partition's last input offset is committed (the input read back, not the broker's end offset)
    last = {}
    for _, _, partition, offset in read_all(broker.bootstrap, topic):
        last[partition] = max(offset, last.get(partition, -1))
    assert committed_offsets(broker.bootstrap, app_id, topic) == {p: o + 1 for p, o in last.items()}
    alerts = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.metrics", stream=name)
              if d.get("alert") == "config_change_accepted"]
    assert {(a["partition"], tuple(a["changes"])) for a in alerts} == {(p, (line,)) for _, line in STEPS
                                                                       for p in range(4)}

    code, report = _audit(path, broker.bootstrap, tmp_path / "final.json")
    assert code == 0 and report["verdict"] == "PASSED", report["verdict_reason"]
    s = report["summary"]
    assert s["events_in"] == sent == s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"]
    assert s["dead_lettered"] == 0 and s["lost"] == 0
    changes = report["checks"]["consistency"]["k_changes"]
    assert sorted((c["partition"], c["change"]) for c in changes) == sorted(
        (p, line) for _, line in STEPS[:2] for p in range(4))
    code, report = _audit(first_config, broker.bootstrap, tmp_path / "first.json")
    violations = report["checks"]["consistency"]["violations_by_kind"]
    assert code != 0 and "manifest k differs from the k in force" in violations, violations


def test_a_privacy_unit_changed_halts_is_refused_in_place_and_taken_by_a_new_lineage(broker, tmp_path, secret_env):
    """One input partition (the input keyed by the journey needs no re-keying for the card to be placed right); each
    card holds three journeys, so a class of 5 journeys may hold fewer than 5 cards."""
    name = "unitchange"
    path = write_stream_config(tmp_path / "cfg", name, f"raw.test.{name}")          # the journey as the unit
    topic, records = f"raw.test.{name}", f"anon.{name}.records"
    ensure_topics(broker.bootstrap, names=[topic, records, "anon.releases", "anon.deadletter", "anon.metrics"],
                  default_partitions={topic: 1, records: 1})
    events = synthetic_fares(600, seed=41)
    for e in events:
        e["card_id"] = "C" + str(int(e["journey_id"].split("-")[1]) // 3)
    replay(broker.bootstrap, topic, events, "journey_id", progress=False)
    state, app_id = tmp_path / "state", "unitchange-app"
    assert run_until_accounted(path, broker.bootstrap, state, len(events), timeout_s=90, app_id=app_id,
                               flush_when_idle_s=1.0, log_path=tmp_path / "w0.log")["accounted"] == len(events)

    cards = tmp_path / "cfg" / f"{name}-cards.toml"                                  # the operator's edit
    cards.write_text(path.read_text().replace('privacy_unit = "journey_id"', 'privacy_unit = "card_id"'))
    line = "config changed on partition 0: stream.privacy_unit journey_id -> card_id"
    body = _halted(cards, broker.bootstrap, state, app_id, tmp_path / "halt.log", partitions=1)
    assert {h["reason"] for h in body["halted"].values()} == {"config_changed"}, body
    named = [ln for ln in (tmp_path / "halt.log").read_text().splitlines() if "config changed on" in ln]
    assert len(named) == 1 and named[0].endswith(line) and "ERROR" in named[0], named
    body = _halted(cards, broker.bootstrap, state, app_id, tmp_path / "refused.log", partitions=1,
                   extra=("--accept-config-change",))
    assert {h["reason"] for h in body["halted"].values()} == {"config_change_refused"}, body
    refused = [ln for ln in (tmp_path / "refused.log").read_text().splitlines() if "HALTED (config_change_refused)" in ln]
    assert len(refused) == 1 and "stream.privacy_unit journey_id -> card_id" in refused[0] \
        and "a new app id and --new-lineage" in refused[0], refused

    # the step: a new app id and --new-lineage; the new lineage places every event again, counted by the card
    first = {d["lineage"] for _, d, _, _ in read_all(broker.bootstrap, "anon.releases", stream=name)}.pop()
    second, manifests = _run_lineage(cards, broker.bootstrap, tmp_path / "state-cards", "unitchange-cards", name,
                                     tmp_path / "w1.log", extra=["--new-lineage"], n=len(events))
    assert second != first and {m["privacy_unit"] for m in manifests} == {"card_id"}
    report = audit_from_kafka(broker.bootstrap, cards, secret_env, idle_s=1.5)
    lineages = report.summary["lineages"]
    assert report.verdict == "PASSED", report.format_text()
    assert {n: (f["verdict"], f["events_in"]) for n, f in lineages.items()} == {
        first: ("PASSED", len(events)), second: ("PASSED", len(events))}
    assert lineages[first]["judged_by_its_own"] == ["stream.privacy_unit journey_id (the config: card_id)"]
