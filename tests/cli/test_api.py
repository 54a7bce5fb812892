"""The in-process API (stream_anon.api, docs/api.md): the same records, manifests and DP rows as the worker for the
same input, secret and config, and every event in exactly one place."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import orjson
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import copy_hierarchies, read_all, synthetic_fares, write_stream_config  # noqa: E402

import stream_anon  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402

pytestmark = pytest.mark.one_broker        # its broker tests on one broker (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
SECRET = "api-test-secret-" + "0123456789abcdef" * 2
# fields stamped with the wall clock when a message is written: the worker's and the API's differ
WALL_CLOCK = {"created_at", "received_at"}       # of a manifest, of a dead letter
NOT_COMPARED = WALL_CLOCK | {"lineage_started"}


def renamed_oyster(directory: Path, name: str) -> Path:
    """configs/oyster.toml (k-anonymity and DP aggregates) as stream ``name`` on topic raw.test.<name>."""
    text = (ROOT / "configs" / "oyster.toml").read_text()
    text = text.replace('name = "oyster"', f'name = "{name}"').replace('input_topic = "raw.fare.oyster"',
                                                                       f'input_topic = "raw.test.{name}"')
    directory.mkdir(parents=True, exist_ok=True)
    copy_hierarchies(directory)
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def python_blocks(path: Path) -> str:
    """The ``python`` code blocks of a markdown document, in order, as one script."""
    import re
    return "\n".join(re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M))


DOCUMENTED = [ROOT / "docs" / "api.md", ROOT / "README.md"]


@pytest.mark.parametrize("doc", DOCUMENTED, ids=lambda p: p.name)
def test_the_documented_examples_run_as_written(doc, monkeypatch, capsys):
    monkeypatch.delenv("STREAM_ANON_SECRET", raising=False)       # the examples pass their secret
    script = python_blocks(doc)
    assert "stream_anon.anonymize(" in script and "audit_result(" in script
    exec(compile(script, str(doc), "exec"), {"__name__": "__doc_example__"})
    assert "'published'" in capsys.readouterr().out


def comparable(doc: dict) -> bytes:
    """A message without its wall-clock stamps and lineage note, canonical bytes."""
    return orjson.dumps({k: v for k, v in doc.items() if k not in NOT_COMPARED}, option=orjson.OPT_SORT_KEYS)


def test_every_event_is_in_exactly_one_place_and_the_audit_passes(tmp_path):
    """Bad input among good: each event published, suppressed or dead-lettered once, none deferred at the end."""
    path = write_stream_config(tmp_path, "api", "raw.api")
    events = synthetic_fares(1200, seed=3)
    bad = [b"{not json", orjson.dumps({**events[5], "event_id": "BAD-1", "event_type": "teleport"})]
    result = stream_anon.anonymize([*events, *bad], path, secret=SECRET)
    counts = result.counts()
    assert counts["events"] == len(events) + len(bad) == counts["accounted"]
    assert counts["deferred"] == 0 and counts["dead_lettered"] == len(result.dead_letters) == 2
    assert len(result.records) == counts["published"] > 0
    assert sorted(d["reason"].split(":")[0] for d in result.dead_letters) == ["malformed JSON", "schema"]
    tokens = Counter(r["audit_token"] for r in result.records)
    assert max(tokens.values()) == 1
    report = stream_anon.audit_result(result, path, secret=SECRET)
    assert report.verdict == "PASSED", report.checks
    assert report.summary["events_in"] == counts["events"] and report.summary["lost"] == 0


def test_the_audit_fails_a_tampered_result(tmp_path):
    path = write_stream_config(tmp_path, "api", "raw.api")
    result = stream_anon.anonymize(synthetic_fares(800, seed=4), path, secret=SECRET)
    dropped = stream_anon.Result(**{**vars(result), "records": result.records[1:]})
    assert stream_anon.audit_result(dropped, path, secret=SECRET).verdict == "FAILED"


def test_a_dataframe_gives_what_its_events_give():
    events = load_events("oyster", limit=1500)
    frame = pd.DataFrame(events)
    frame["event_time"] = pd.to_datetime(frame["event_time"])          # a DataFrame user's timestamps
    from_events = stream_anon.anonymize(events, "oyster", secret=SECRET)
    from_frame = stream_anon.anonymize(frame, "oyster", secret=SECRET)
    assert from_frame.records == from_events.records and from_frame.dp_rows == from_events.dp_rows
    assert len(from_frame.frame()) == len(from_frame.records)


def test_a_missing_or_weak_secret_is_refused_in_one_line(monkeypatch):
    from stream_anon.crypto import SecretError

    monkeypatch.delenv("STREAM_ANON_SECRET", raising=False)
    monkeypatch.delenv("STREAM_ANON_SECRET_FILE", raising=False)
    for secret in (None, "short"):
        with pytest.raises(SecretError) as err:
            stream_anon.anonymize([], "oyster", secret=secret)
        assert "\n" not in str(err.value)


def test_importing_stream_anon_imports_no_kafka_client():
    import subprocess

    code = ("import sys, stream_anon; stream_anon.anonymize; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'kafka', 'faust', 'aiokafka', "
            "'confluent_kafka', 'calfkit', 'prometheus_client', 'mode'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_api_gives_the_workers_records_manifests_and_dp_rows(broker, tmp_path, secret_env):
    """The worker through a real broker (4 input partitions, replayed keyed by unit, flushed on idle input) and
    the API over the same events, secret and config: the same records, manifests and DP rows, byte for byte but
    for wall-clock stamps."""
    from stream_anon.kafka.replay import replay
    from stream_anon.kafka.supervise import run_until_accounted
    from stream_anon.kafka.topics import ensure_topics

    n = 3000
    path = renamed_oyster(tmp_path / "cfg", "apicmp")
    cfg = load_config(path)
    events = load_events("oyster", limit=n)
    ensure_topics(broker.bootstrap, names=[cfg.stream.input_topic, "anon.apicmp.records", "anon.releases",
                                           "anon.deadletter", "anon.metrics", "anon.aggregates"],
                  default_partitions={cfg.stream.input_topic: 4, "anon.apicmp.records": 1})
    # two dead letters too, keyed by their unit (JSON objects with one) as replay keys events
    bad = [orjson.dumps({**events[7], "event_type": "teleport"}), orjson.dumps({**events[9], "event_time": "soon"})]
    rep = replay(broker.bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False,
                 secret=secret_env, raw_payloads=bad)
    assert rep["events"] == n and rep["raw"] == 2 and len(rep["partitions"]) == 4
    acc = run_until_accounted(path, broker.bootstrap, tmp_path / "state", n + 2, timeout_s=120,
                              log_path=tmp_path / "worker.log")
    assert acc["accounted"] == n + 2 and acc["deferred"] == 0 and acc["dead_lettered"] == 2

    def topic(name, stream=None):
        return [doc for _, doc, _, _ in read_all(broker.bootstrap, name, stream=stream)]

    worker = {"records": topic("anon.apicmp.records"), "manifests": topic("anon.releases", "apicmp"),
              "dp_rows": [d for d in topic("anon.aggregates", "apicmp") if "row_id" in d],
              "dead_letters": topic("anon.deadletter", "apicmp")}
    lineage, = {m["lineage"] for m in worker["manifests"]}        # the worker's: release ids and DP noise use it
    api = stream_anon.anonymize([*events, *bad], path, secret=secret_env, partitions=4, lineage=lineage)
    # the worker's first release of each partition notes the lineage it started (the API starts none)
    assert sum("lineage_started" in m for m in worker["manifests"]) == 4
    assert api.counts()["accounted"] == n + 2 and {k: acc[k] for k in ("published", "suppressed", "dead_lettered")} \
        == {k: api.counts()[k] for k in ("published", "suppressed", "dead_lettered")}
    for part, docs in worker.items():
        mine = getattr(api, part)
        assert Counter(map(comparable, docs)) == Counter(map(comparable, mine)), part
    assert len(worker["records"]) == acc["published"] > 0 and len(worker["dp_rows"]) > 0
