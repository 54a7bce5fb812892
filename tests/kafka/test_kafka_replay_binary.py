"""``stream-anon replay`` of binary files through a real broker (Tansu and Apache Kafka), the worker and the independent
audit, for both binary formats: one ``.pb`` message, a directory of ``.pb`` files and a varint length-delimited file,
all replayed onto one raw topic; accounting exact and the audit passes."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("google.transit")
sys.path.insert(0, str(Path(__file__).parents[1]))
from test_kafka_inputs import _expected_events, run_and_audit, stream_copy  # noqa: E402

from stream_anon.cli import main  # noqa: E402
from stream_anon.inputs.files import write_delimited  # noqa: E402
from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.one_broker]     # one_broker: tests/conftest.py


def _three_shapes(messages: list[bytes], tmp_path) -> list[Path]:
    """messages[0] as one .pb file, the first half of the rest as a directory of .pb files, the other half as a
    length-delimited file."""
    one = tmp_path / "first.pb"
    one.write_bytes(messages[0])
    rest = messages[1:]
    half = len(rest) // 2
    d = tmp_path / "snapshots"
    d.mkdir()
    for i, m in enumerate(rest[:half]):
        (d / f"{i:06d}.pb").write_bytes(m)
    ld = tmp_path / "rest.pbd"
    write_delimited(rest[half:], ld)
    return [one, d, ld]


@pytest.mark.parametrize("bundled,messages_of", [
    ("citibike-gtfs", lambda: gtfs_feeds(limit=3000)),
    ("obd2-tesla", lambda: tesla_payloads("protobuf")[::5]),
])
def test_binary_files_replayed_through_worker_and_audit(bundled, messages_of, broker, tmp_path, secret_env):
    name = f"{bundled}-files"
    path, cfg = stream_copy(tmp_path, bundled, name, broker.bootstrap, partitions=1)
    messages = messages_of()
    for f in _three_shapes(messages, tmp_path):
        assert main(["replay", str(f), "--config", str(path), "--topic", cfg.stream.input_topic,
                     "--broker", broker.bootstrap, "--quiet"]) == 0, f
    expected = _expected_events(cfg, messages)
    acc, report, s = run_and_audit(path, broker.bootstrap, tmp_path, secret_env, expected)
    assert s["published"] > 0.8 * expected and s["min_individuals"] >= cfg.anonymization.k
    print(f"{bundled} files e2e:", acc, "audit:",
          {k: s[k] for k in ("events_in", "published", "suppressed", "dead_lettered")})


def test_resends_through_worker_and_audit(broker, tmp_path, secret_env):
    """The same Payloads twice, the second copies marked ``is_resend``, with ``event_key``: each event published
    once, every copy of an accepted event a ``duplicate_event`` dead letter."""
    import tomllib

    from _kafka_helpers import read_all
    from test_event_key import TESLA_KEY, with_resends

    from stream_anon.calibrate import toml_text
    from stream_anon.inputs import Decoder

    path, cfg = stream_copy(tmp_path, "obd2-tesla", "tesla-resend", broker.bootstrap, partitions=1)
    raw = tomllib.loads(path.read_text())
    raw["input"]["event_key"] = TESLA_KEY
    path.write_text(toml_text(raw))
    originals = tesla_payloads("protobuf", limit=1500)
    messages, _copies = with_resends(originals)
    ld = tmp_path / "with-resends.pbd"
    write_delimited(messages, ld)
    assert main(["replay", str(ld), "--config", str(path), "--topic", cfg.stream.input_topic,
                 "--broker", broker.bootstrap, "--quiet"]) == 0
    dec = Decoder(cfg.input)
    readable = sum(1 for i, m in enumerate(originals[:-20]) if dec.decode(m, "t", 0, i).reasons == [None])
    acc, report, s = run_and_audit(path, broker.bootstrap, tmp_path, secret_env, len(messages))
    deads = [d["reason"] for _, d, _, _ in read_all(broker.bootstrap, "anon.deadletter", stream="tesla-resend")]
    assert deads.count("duplicate_event") == readable > 1000
    assert s["published"] + s["suppressed"] + s["deferred"] == len(messages) - len(deads)
    print("resends e2e:", acc, "duplicate_event:", deads.count("duplicate_event"))
