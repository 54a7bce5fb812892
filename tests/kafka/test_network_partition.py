"""A network partition between two workers' machines (issue 28), on one machine: each worker in its own network
namespace, the broker in the root namespace (tests/_netns.py). Worker A, inside a transaction (output and state
sent), is cut off for longer than the session timeout: worker B takes every partition, which fences A's producers.
Reconnected, A's commit is refused, A rejoins the group, recovers partitions from the state topic and processes the
rest of the stream. Judged by the audit: nothing lost, no release id with two contents, no record published twice,
m-invariance and the DP budget hold. ``bench/chaos.py --only network_partition`` runs it on the whole slice."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import release_contents  # noqa: E402
import _netns as netns  # noqa: E402

from stream_anon import contract  # noqa: E402
from stream_anon.audit.kafka_source import audit_from_kafka  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import oyster_cards  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.topics import ensure_topics  # noqa: E402

pytestmark = pytest.mark.kafka


def test_a_worker_cut_off_longer_than_its_session_is_fenced_and_rejoins_nothing_lost_or_repeated(
        tmp_path, secret_env, new_broker):
    why = netns.unavailable()          # probed when the test runs, not when it is collected
    if why:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    events = oyster_cards.read_events()[:3000]
    half = len(events) // 2
    cfg_path = contract.config_path("oyster-cards")
    cfg = load_config(cfg_path)
    t = contract.topics()
    with netns.NetnsLab() as lab, new_broker(host=lab.broker_ip) as broker:
        ensure_topics(broker.bootstrap, names=[cfg.stream.input_topic, t.records(cfg.stream.name), t.releases,
                                               t.deadletter, t.metrics, t.aggregates])

        def send(part):
            return lambda: replay(broker.bootstrap, cfg.stream.input_topic, part, cfg.stream.privacy_unit,
                                  progress=False)
        fig = netns.run_partition(lab, broker.bootstrap, cfg_path, cfg.stream.name, send(events[:half]),
                                  send(events[half:]), len(events), 4, tmp_path, cut_s=10.0)
        report = audit_from_kafka(broker.bootstrap, cfg_path, secret_env, idle_s=1.5)
        contents = release_contents(broker.bootstrap)

    # B took every partition while A was cut off (run_partition waits for it), then A came back
    assert fig["takeover_s"] < 60 and fig["partitions_a_before_cut"] and fig["partitions_a_after_rejoin"], fig
    assert fig["a_fenced"] >= 1, fig                 # the transaction A held when cut off was refused
    assert fig["a_transactions_committed"] > 0, fig  # after its rejoin (it committed none before the cut)
    assert fig["halts"] == 0 and fig["worker_crashes"] == 0, fig
    assert fig["accounted"]["accounted"] == len(events), fig
    assert contents and all(len(c) == 1 for c in contents.values()), "a release id with two contents"
    assert report.passed, report.format_text()       # duplicates: no record published twice; m-invariance; DP
    s = report.summary
    assert s["events_in"] == len(events) == s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"]
    assert {"duplicates", "m_invariance", "dp"} <= set(report.checks)
