"""``stream-anon replay`` produces to the topic its config names: ``--topic`` defaults to the config's
``[stream] input_topic``, and a ``--topic`` the config does not name is refused (one line, nothing produced, no
topic created by the broker's auto-creation) unless ``--other-topic`` says it is meant. On the embedded broker."""
from __future__ import annotations

import json
import sys
from pathlib import Path


from stream_anon.cli import main

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import read_all  # noqa: E402

EVENTS = 20


def _topics(bootstrap: str) -> set[str]:
    import logging

    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": bootstrap, "logger": logging.getLogger("stream_anon.kafka.client")})
    return set(client.list_topics(timeout=10).topics)


def _replay(capsys, bootstrap: str, *args: str) -> tuple[int, list[str], list[str]]:
    rc = main(["replay", "--dataset", "oyster", "--events", str(EVENTS), "--broker", bootstrap, "--quiet", *args])
    out = capsys.readouterr()
    return rc, out.out.splitlines(), [line for line in out.err.splitlines() if line.strip()]


def test_replay_goes_to_the_configs_input_topic_and_refuses_another_unless_asked(broker, secret_env, capsys):
    b = broker.bootstrap
    assert main(["topics", "apply", "--broker", b, "--config", "oyster"]) == 0
    capsys.readouterr()

    rc, _, err = _replay(capsys, b, "--config", "oyster", "--topic", "raw.fare.oyter")
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("stream-anon replay: --topic raw.fare.oyter: ") and "raw.fare.oyster" in err[0] \
        and "--other-topic" in err[0], err[0]
    assert "raw.fare.oyter" not in _topics(b)

    rc, out, err = _replay(capsys, b, "--config", "oyster")           # no --topic: the config's input topic
    assert rc == 0 and json.loads(out[-1])["events"] == EVENTS, err
    assert len(read_all(b, "raw.fare.oyster", min_count=EVENTS)) == EVENTS

    rc, out, err = _replay(capsys, b, "--config", "oyster", "--topic", "raw.fare.oyster")     # named: as before
    assert rc == 0 and json.loads(out[-1])["events"] == EVENTS, err

    rc, out, err = _replay(capsys, b, "--config", "oyster", "--topic", "raw.fare.copy", "--other-topic")
    assert rc == 0 and json.loads(out[-1])["events"] == EVENTS, err
    assert len(read_all(b, "raw.fare.copy", min_count=EVENTS)) == EVENTS
    assert len(read_all(b, "raw.fare.oyster", min_count=2 * EVENTS)) == 2 * EVENTS

    rc, _, err = _replay(capsys, b)                                    # neither a config nor a topic
    assert rc == 2 and len(err) == 1 and "--config" in err[0] and "--topic" in err[0], err
