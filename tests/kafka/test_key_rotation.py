"""Key rotation (issue 28): a worker with another secret halts its partitions (``key_changed``); ``--rotate-key``
with the previous secret (read only) resumes a state that nothing keyed by the old key still depends on, and
refuses one that does (``key_rotation_refused``: buffered records, open windows, m-invariance signatures, an open
DP period); the manifests after the rotation carry the new key id, and the audit given both secrets passes on the
whole stream."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import START, read_all, setup_stream, synthetic_fares, write_stream_config  # noqa: E402

from stream_anon import crypto  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.worker import state as st  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402
from stream_anon.worker.partition import KeyRotationRefused  # noqa: E402

OLD = b"old-secret-0123456789abcdef0123456789"
NEW = b"new-secret-9876543210fedcba9876543210"


def _messages(events, start=0):
    return [(start + i, json.dumps(e).encode()) for i, e in enumerate(events)]


def _state(core: WorkerCore, ps) -> tuple[list[bytes], int]:
    rec = core.committed(ps, ps.offset)
    return [st.encode_state(r) for r in ps.chain], rec.seq


def test_rotation_needs_the_previous_key_and_a_state_with_nothing_buffered(tmp_path):
    cfg = load_config(write_stream_config(tmp_path, "rot", "raw.rot"))
    old = WorkerCore(cfg, "app", OLD)
    ps = old.open_partition(0)
    old.process(ps, _messages(synthetic_fares(400, seed=5)))
    values, marker = _state(old, ps)
    new = WorkerCore(cfg, "app", NEW)
    # another key and no rotation asked (or another previous key): halted, naming both ids and the step
    for rotate_from in (None, crypto.key_id(b"third-secret-0123456789abcdef0123456")):
        rec = st.choose_state(values, marker, ps.offset + 1, kid=new.kid, rotate_from=rotate_from)
        assert rec.halt == st.HALT_KEY_CHANGED and old.kid in rec.detail and new.kid in rec.detail
    rec = st.choose_state(values, marker, ps.offset + 1, kid=new.kid, rotate_from=old.kid)
    assert rec.halt is None and rec.rotated_from == old.kid
    assert ps.engine.deferred > 0
    with pytest.raises(KeyRotationRefused, match="buffered records under the old key"):
        new.open_partition(0, rec.doc, rec.tables, rec.base_seq, rotated_from=rec.rotated_from)

    old.flush(ps)                              # everything released: nothing keyed by the old key is pending
    values, marker = _state(old, ps)
    rec = st.choose_state(values, marker, ps.offset + 1, kid=new.kid, rotate_from=old.kid)
    assert "engine/seen_events" in rec.tables
    rotated = new.open_partition(0, rec.doc, rec.tables, rec.base_seq, rotated_from=rec.rotated_from)
    assert rotated.notes == {"key_rotated": {"from": old.kid, "to": new.kid}}
    assert len(rotated.engine.seen_events) == 0          # the old key's event hashes are of no use to the new key
    later = synthetic_fares(400, seed=6, start=START.replace(hour=12))
    messages = new.process(rotated, _messages(later, ps.offset + 1)).messages + new.flush(rotated).messages
    manifests = [json.loads(v) for t, _, v in messages if t == "anon.releases"]
    assert manifests and all(m["kid"] == new.kid for m in manifests)
    assert manifests[0]["key_rotated"] == {"from": old.kid, "to": new.kid}
    assert all("key_rotated" not in m for m in manifests[1:])
    assert new.committed(rotated, rotated.offset).doc["kid"] == new.kid


def test_rotation_is_refused_for_m_invariance_signatures_and_inside_a_dp_period():
    from stream_anon import contract

    for name, why in (("oyster-cards", "m-invariance signatures"), ("oyster", "DP period")):
        cfg = load_config(contract.config_path(name))
        old = WorkerCore(cfg, "app", OLD)
        ps = old.open_partition(0)
        events = [json.loads(m) for m in contract_events(name, 300)]
        old.process(ps, _messages(events))
        old.flush(ps)
        values, marker = _state(old, ps)
        rec = st.choose_state(values, marker, ps.offset + 1, kid=crypto.key_id(NEW), rotate_from=old.kid)
        with pytest.raises(KeyRotationRefused, match=why):
            WorkerCore(cfg, "app", NEW).open_partition(0, rec.doc, rec.tables, rec.base_seq,
                                                       rotated_from=rec.rotated_from)
        old.close()


def contract_events(name: str, n: int) -> list[bytes]:
    from stream_anon.datasets import load_events
    return [json.dumps(e).encode() for e in load_events(name, limit=n)]


def test_a_rotated_key_halts_without_the_step_and_with_it_the_whole_stream_is_audited(broker, tmp_path,
                                                                                      monkeypatch):
    """Phase 1 under the old secret, flushed; phase 2 produced under the new one. A worker with the new secret
    halts (key_changed); with --rotate-key and the previous secret it resumes (a key_rotated alert per partition on
    anon.metrics); the manifests after the rotation carry the new key id; the audit needs both secrets and then
    passes on both phases."""
    from stream_anon.audit.kafka_source import audit_from_kafka
    from stream_anon.kafka.replay import replay
    from stream_anon.kafka.supervise import run_until_accounted
    from test_lineage import _halted_with

    monkeypatch.setenv("STREAM_ANON_SECRET", OLD.decode())
    name = "keyrotation"
    path, cfg = setup_stream(tmp_path, broker.bootstrap, name)
    events = synthetic_fares(800, seed=43)
    first, second = events[:400], events[400:]
    replay(broker.bootstrap, cfg.stream.input_topic, first, "journey_id", progress=False, secret=OLD)
    state, app_id = tmp_path / "state", "rotation-app"
    run_until_accounted(path, broker.bootstrap, state, 400, timeout_s=90, app_id=app_id, flush_when_idle_s=1.0,
                        log_path=tmp_path / "w1.log")
    replay(broker.bootstrap, cfg.stream.input_topic, second, "journey_id", progress=False, secret=NEW)

    monkeypatch.setenv("STREAM_ANON_SECRET", NEW.decode())
    _halted_with(path, broker.bootstrap, state, app_id, tmp_path / "w2.log", {"key_changed"})
    assert f"written with key id {crypto.key_id(OLD)}, this worker's secret is key id {crypto.key_id(NEW)}" in \
        (tmp_path / "w2.log").read_text()

    monkeypatch.setenv("STREAM_ANON_PREVIOUS_SECRET", OLD.decode())
    run_until_accounted(path, broker.bootstrap, state, 800, timeout_s=90, app_id=app_id, flush_when_idle_s=1.0,
                        log_path=tmp_path / "w3.log", extra=["--rotate-key"])
    manifests = [m for _, m, _, _ in read_all(broker.bootstrap, "anon.releases", stream=name)]
    kids = {m["kid"] for m in manifests}
    assert kids == {crypto.key_id(OLD), crypto.key_id(NEW)}
    rotated = [m for m in manifests if "key_rotated" in m]
    assert rotated and all(m["key_rotated"] == {"from": crypto.key_id(OLD), "to": crypto.key_id(NEW)}
                           for m in rotated)
    for m in rotated:       # every release of the partition after its rotation carries the new key id
        assert all(n["kid"] == crypto.key_id(NEW) for n in manifests
                   if n["partition"] == m["partition"] and n["seq"] >= m["seq"])

    alerts = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.metrics", stream=name)
              if d.get("alert") == "key_rotated"]
    assert {(a["partition"], a["from"], a["to"]) for a in alerts} == {(p, crypto.key_id(OLD), crypto.key_id(NEW))
                                                                      for p in range(4)}

    alone = audit_from_kafka(broker.bootstrap, path, NEW, idle_s=1.0)
    assert alone.verdict == "FAILED" and list(alone.checks) == ["key"]
    assert f"carry key id {crypto.key_id(OLD)}" in alone.verdict_reason
    report = audit_from_kafka(broker.bootstrap, path, NEW, idle_s=1.0, previous_secrets=[OLD])
    assert report.passed, report.format_text()
    assert report.summary["events_in"] == 800 and report.summary["lost"] == 0
