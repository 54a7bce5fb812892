"""The local cache of committed headers is only a cache: a disk that cannot take it degrades the worker to the
broker's state alone with one warning each way, never a crash loop."""
from __future__ import annotations

import logging
import os
from types import SimpleNamespace

from stream_anon.kafka.state_cache import CommittedCache

def test_a_full_cache_disk_warns_once_and_the_worker_goes_on(tmp_path, caplog, monkeypatch):
    cache = CommittedCache(tmp_path, "app", "oyster")
    ps = SimpleNamespace(partition=0, seq=1, offset=9, input_topic_id="T", lineage="La")
    cache.write(ps)
    assert cache.read(0) == {"seq": 1, "offset": 9, "input_topic_id": "T", "lineage": "La"}
    real_replace = os.replace

    def full(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", full)
    with caplog.at_level(logging.WARNING, logger="stream_anon.worker"):
        for seq in range(2, 6):
            cache.write(SimpleNamespace(partition=0, seq=seq, offset=10 * seq, input_topic_id="T", lineage="La"))
        monkeypatch.setattr(os, "replace", real_replace)
        cache.write(SimpleNamespace(partition=0, seq=6, offset=60, input_topic_id="T", lineage="La"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "No space left on device" in lines[0] and "broker's state alone" in lines[0]
    assert lines[1].endswith("written again")
    assert cache.read(0)["seq"] == 6

def test_an_unreadable_cache_file_is_no_cache(tmp_path, caplog):
    cache = CommittedCache(tmp_path, "app", "oyster")
    path = cache.path(0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"seq": 3, "off')                  # cut short by a full disk
    with caplog.at_level(logging.WARNING, logger="stream_anon.worker"):
        assert cache.read(0) is None
    assert "unreadable" in caplog.records[0].getMessage()

def test_no_cache_directory_is_no_cache():
    cache = CommittedCache(None, "app", "oyster")
    cache.write(SimpleNamespace(partition=0, seq=1, offset=1, input_topic_id=None, lineage="La"))
    assert cache.read(0) is None and cache.lineages() == {}


def test_the_lineages_of_a_stream_are_found_under_every_app_id_of_the_state_directory(tmp_path):
    """A new app id on the same state directory still sees the lineage its predecessor committed in (a lost state
    topic must not let the stream start over silently: stream_anon.kafka.lineage)."""
    CommittedCache(tmp_path, "old-app", "oyster").write(
        SimpleNamespace(partition=2, seq=4, offset=40, input_topic_id="T", lineage="La"))
    CommittedCache(tmp_path, "old-app", "other").write(
        SimpleNamespace(partition=0, seq=4, offset=40, input_topic_id="T", lineage="Lother"))
    CommittedCache(tmp_path, "old-app", "oyster").write(
        SimpleNamespace(partition=3, seq=0, offset=-1, input_topic_id="T", lineage="Lnever"))   # nothing committed
    found = CommittedCache(tmp_path, "new-app", "oyster").lineages()
    assert list(found) == ["La"] and "old-app/oyster-p2.committed.json" in found["La"]


def test_a_barrier_that_does_not_come_back_is_reported_with_what_was_read(broker):
    """read_to_barriers on a real broker: a barrier committed comes back; one never written is reported after the
    wait with what was read of its partition (the recovery then fences the partition again, then gives up)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from stream_anon.worker import state as st
    from stream_anon.kafka.state_cache import read_to_barriers
    from stream_anon.kafka.transactions import fence_and_barrier

    cfg = {"bootstrap.servers": broker.bootstrap, "logger": logging.getLogger("stream_anon.kafka.client")}
    admin = AdminClient(cfg)
    for f in admin.create_topics([NewTopic("app-state", 2, 1)]).values():
        f.result(30)
    prod = Producer({**cfg, "transactional.id": "app-p0"})
    nonce = fence_and_barrier(prod, "app-state", "s", 0)
    logs, missing = read_to_barriers(cfg, "app-state-reader", "app-state", {0: nonce, 1: b"never-written"}, 2.0)
    assert set(logs) == {0, 1} and set(missing) == {1}
    assert missing[1].startswith("0 values read, position ") and "offsets 0-0" in missing[1]
    logs, missing = read_to_barriers(cfg, "app-state-reader", "app-state", {0: nonce}, 2.0)
    assert missing == {} and not logs[0].values
    assert st.barrier_nonce(st.encode_barrier(nonce)) == nonce
