"""m-invariance through the faust worker on a real broker (Tansu and Apache Kafka): the worker is killed between
releases and restarted from its checkpoints; signatures survive (they are engine state), and the independent checker and
the audit still pass on everything that was published, re-produced releases included.

Then the operator changes m (3 -> 2): refused in place even with ``--accept-config-change`` (m binds every card's
signature; one line per partition naming the setting and the step), taken by a new app id with ``--new-lineage``:
the new lineage places every event again under m = 2, and the audit with the new config passes each lineage, the
superseded one judged by the m it ran under."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import read_all, write_cards_config  # noqa: E402
from test_lineage import _halted_with, _run_lineage  # noqa: E402

from stream_anon.attacks.intersection import intersection_attack  # noqa: E402
from stream_anon.audit.kafka_source import audit_from_kafka, read_outputs, read_topic  # noqa: E402
from stream_anon.audit import MInvarianceConfig, check_m_invariance  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import oyster_cards  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.topics import ensure_topics  # noqa: E402
from _worker_harness import start_worker_process  # noqa: E402  (honours the kill-at-the-worst-moment variables)
from stream_anon.kafka.supervise import committed_states, run_until_accounted  # noqa: E402

N_EVENTS = 9000          # the first 9,000 events of the oyster-cards slice: two mornings, about 24 windows


def signatures(bootstrap, app_id, stream) -> dict[int, tuple]:
    """unit id -> signature, from every partition's committed state (keyed unit ids only: no card id in state)."""
    out = {}
    for p, doc in committed_states(bootstrap, app_id, stream, range(4), idle_s=0.3).items():
        table = doc["tables"].get("engine/former/signatures")
        if table is None:
            continue
        sigs = [tuple(s) for s in doc["engine"]["former"]["signatures"]["sigs"]]
        for uid, sid in zip(table[0].tolist(), table[1]["sig"].tolist()):
            out[(p, uid)] = sigs[sid]
    return out


def test_kill_between_releases_restart_checker_still_passes(broker, broker_kind, tmp_path, secret_env):
    name = "mcards"
    path = write_cards_config(tmp_path / "cfg", name, f"raw.test.{name}", m=3)
    cfg = load_config(path)
    ensure_topics(broker.bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records", "anon.releases",
                                           "anon.deadletter", "anon.metrics"],
                  default_partitions={cfg.stream.input_topic: 4, f"anon.{name}.records": 1})
    events = oyster_cards.read_events()[:N_EVENTS]
    replay(broker.bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False)
    state, app_id = tmp_path / "state", "mcards-app"
    small = ["--batch-max", "300", "--batch-within", "0.2"]

    # 1) the worst moment: SIGKILL inside the 8th transaction, releases and state sent but not committed
    env = {**os.environ, "STREAM_ANON_TEST_KILL_AFTER_BATCHES": "8"}
    p1 = start_worker_process(path, broker.bootstrap, state, app_id, 2.0, tmp_path / "w1.log", env=env, extra=small)
    p1.wait(timeout=90)
    assert p1.returncode == -signal.SIGKILL
    before = signatures(broker.bootstrap, app_id, name)
    assert before, "signatures were checkpointed before the kill"
    assert "oyc-card" not in "".join(str(v) for v in before)

    # 2) restart, then kill -9 from outside once it has moved on (between or during releases)
    p2 = start_worker_process(path, broker.bootstrap, state, app_id, 2.0, tmp_path / "w2.log", extra=small)
    try:
        def progressed():
            states = committed_states(broker.bootstrap, app_id, name, range(4), idle_s=0.3)
            return sum(d["offset"] + 1 for d in states.values()) > N_EVENTS // 2
        deadline = time.monotonic() + 90
        while not progressed():
            assert time.monotonic() < deadline, "no progress after the restart"
            assert p2.poll() is None, "worker died after the restart"
            time.sleep(0.3)
    finally:
        os.kill(p2.pid, signal.SIGKILL)
        p2.wait(timeout=10)
    middle = signatures(broker.bootstrap, app_id, name)
    assert all(middle[u] == sig for u, sig in before.items() if u in middle), "a signature changed over a restart"

    # 3) restart and run to the end
    acc = run_until_accounted(path, broker.bootstrap, state, N_EVENTS, timeout_s=120, app_id=app_id,
                              log_path=tmp_path / "w3.log")
    assert acc["accounted"] == N_EVENTS
    after = signatures(broker.bootstrap, app_id, name)
    assert set(before) <= set(after) and all(after[u] == sig for u, sig in before.items())

    # the independent checker on everything published (re-produced releases deduplicated by release_id)
    out = read_outputs(broker.bootstrap, name, idle_s=1.5)
    # the killed worker's aborted releases (read_uncommitted; the audit's reads leave them out on Apache Kafka)
    release_ids = [doc["release_id"] for _, doc, _, _ in read_all(broker.bootstrap, "anon.releases", stream=name,
                                                                  committed=False)]
    assert len(release_ids) > len(set(release_ids)), "the hook kill re-produced at least one release"
    report = check_m_invariance(out.records, out.manifests, events, secret_env, MInvarianceConfig.from_toml(path))
    assert report.passed, report.format_text()
    assert report.summary["signature_changes"] == 0 and report.summary["counterfeit_records"] > 0
    k = int(re.search(r"^k = (\d+)", path.read_text(), re.M).group(1))
    attack = intersection_attack(out.records, events, secret_env, privacy_unit="card_id",
                                 invariant="product_category")
    assert attack["pinned"] == 0 and attack["min_candidates"] >= 3
    # the release metrics carry the manifests' counterfeit counts (what monitoring sees)
    metrics = [json.loads(v) for _, v in read_topic(broker.bootstrap, "anon.metrics", idle_s=1.0)]
    by_release = {m["release_id"]: m for m in metrics if m.get("type") == "release" and m["stream"] == name}
    assert set(by_release) == set(release_ids)
    for manifest in out.manifests:
        metric = by_release[manifest["release_id"]]
        assert (metric["m"], metric["counterfeit_records"]) == (manifest["m"], manifest["counterfeit_records"])
        # and the release's re-identification risk (docs/privacy.md): no class under k individuals
        if manifest["published"]:
            assert 0 < metric["risk"]["prosecutor"]["highest"] <= 1 / k, metric["risk"]

    # 4) m changed (3 -> 2): refused even with --accept-config-change, one line per partition naming it and the step
    changed = write_cards_config(tmp_path / "cfg", name, cfg.stream.input_topic, m=2)         # the operator's edit
    _halted_with(changed, broker.bootstrap, state, app_id, tmp_path / "w4.log", {"config_change_refused"},
                 extra=["--accept-config-change"])
    halted = [ln for ln in (tmp_path / "w4.log").read_text().splitlines() if "HALTED (config_change_refused)" in ln]
    assert {ln.split("partition ")[1].split(" ")[0] for ln in halted} == {"0", "1", "2", "3"}
    assert all("anonymization.m 3 -> 2" in ln and "a new app id and --new-lineage" in ln for ln in halted), halted
    # 5) the step: a new app id and --new-lineage; the new lineage places every event again, under m = 2
    first = {m["lineage"] for m in out.manifests}.pop()
    # the same input again: its DP budget is carried from the rows a consumer kept, or a unit's loss per day doubles
    kept = tmp_path / "kept-rows.jsonl"
    kept.write_text("".join(json.dumps(d) + "\n" for _, d, _, _ in read_all(broker.bootstrap, "anon.aggregates",
                                                                          stream=name)))
    second, manifests = _run_lineage(changed, broker.bootstrap, tmp_path / "state-m2", "mcards-m2", name,
                                     tmp_path / "w5.log", extra=["--new-lineage", "--carry-budget", str(kept)],
                                     n=N_EVENTS)
    assert second != first and {m["m"] for m in manifests} == {2}
    assert {m["lineage_started"]["supersedes"][0] for m in manifests if "lineage_started" in m} == {first}

    # the full audit with the new config, each lineage apart: re-produced releases identical, counterfeits outside
    # the accounting equation, the risk check at 1/k, the cross-release risk of the intersection attack at most 1/m;
    # the first lineage judged by the m it ran under
    audit = audit_from_kafka(broker.bootstrap, changed, secret_env, idle_s=1.5, max_prosecutor_risk=1 / k)
    assert audit.passed, audit.format_text()
    lineages = audit.summary["lineages"]
    assert {n: (f["verdict"], f["events_in"]) for n, f in lineages.items()} == {first: ("PASSED", N_EVENTS),
                                                                                second: ("PASSED", N_EVENTS)}
    assert lineages[first]["judged_by_its_own"] == ["anonymization.m 3 (the config: 2)"]
    assert "judged_by_its_own" not in lineages[second]
    assert {n: audit.checks[f"m_invariance [{n}]"]["summary"]["m"] for n in (first, second)} == {first: 3, second: 2}
    for n in (first, second):
        assert audit.checks[f"risk [{n}]"]["passed"] and 0 < audit.checks[f"risk [{n}]"]["highest"] <= 1 / k
    # the killed worker's aborted copies of releases: Tansu shows them to the audit's read_committed reads (they
    # match the committed ones); Apache Kafka hides them, so the audit never counts an aborted record
    duplicates = audit.checks[f"duplicates [{first}]"]["duplicate_manifests"]
    assert duplicates > 0 if broker_kind == "tansu" else duplicates == 0
    cross = audit.risk["intersection"]                                     # of the latest lineage (m = 2)
    assert cross["targets"] > 0 and cross["min_candidates"] >= 2 and cross["true_value_missed"] == 0
    s = audit.summary                                                      # of the latest lineage
    assert s["events_in"] == N_EVENTS == s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"]
