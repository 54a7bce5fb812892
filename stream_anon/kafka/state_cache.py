"""What a recovering worker reads besides the committed offsets: the partitions' state records up to a barrier it
committed itself (:func:`read_to_barriers`), and the local cache of the last committed header per partition
(:class:`CommittedCache`), which tells a broker or state topic that lost its data from a partition that never had
any (:func:`stream_anon.worker.state.choose_state`)."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stream_anon.worker import state as st
from stream_anon.render import json_bytes

BARRIER_WAIT_S = 120           # in all, over the first read and the one after fencing again
BARRIER_REFENCE_S = 20          # a barrier not back by then: fence the partition's transactional id again
POLL_S = 0.05           # a recovery reader's poll: it lasts its whole timeout unless its batch fills
log = logging.getLogger("stream_anon.worker")
client_log = logging.getLogger("stream_anon.kafka.client")


def read_to_barriers(client_config: dict, group_id: str, state_topic: str, nonces: dict[int, bytes],
                     wait_s: float = BARRIER_WAIT_S) -> tuple[dict[int, st.StateLog], dict[int, str]]:
    """Read each partition of the state topic from the beginning until its barrier (``nonces[p]``) comes back,
    for at most ``wait_s``: (the logs read, and for each partition whose barrier did not come back, what was read
    of it, as one line)."""
    reader = Consumer({**client_config, "group.id": group_id, "enable.auto.commit": False,
                       "isolation.level": "read_committed", "logger": client_log})
    logs = {p: st.StateLog() for p in nonces}
    waiting = set(nonces)
    try:
        # the topic's metadata first: assigned before its leader is known, the reader waits out librdkafka's 500 ms
        # offset query timer
        reader.list_topics(state_topic, timeout=30)
        reader.assign([TopicPartition(state_topic, p, OFFSET_BEGINNING) for p in nonces])
        deadline = time.monotonic() + wait_s
        while waiting and time.monotonic() < deadline:
            for m in reader.consume(num_messages=1000, timeout=POLL_S):
                p = m.partition()
                if m.error() is not None or p not in waiting:
                    continue
                v = m.value()
                if v is None:        # a tombstone: neither a barrier nor a state record (StateLog.add skips it too)
                    continue
                if st.barrier_nonce(v) == nonces[p]:
                    waiting.discard(p)
                    reader.pause([TopicPartition(state_topic, p)])
                else:
                    logs[p].add(v)
        missing = {}
        for tp in (reader.position([TopicPartition(state_topic, p) for p in sorted(waiting)]) if waiting else []):
            try:
                low, high = reader.get_watermark_offsets(tp, timeout=5)
                offsets = f"{low}-{high}"
            except Exception as exc:  # noqa: BLE001 - only for the line that says what was read
                offsets = f"?-unknown ({exc})"
            missing[tp.partition] = (f"{len(logs[tp.partition].values)} values read, position {tp.offset}, "
                                     f"offsets {offsets}")
        return logs, missing
    finally:
        reader.close()


def read_state_logs(fence, client_config: dict, group_id: str, state_topic: str, parts) -> dict[int, st.StateLog]:
    """The partitions' state logs up to a barrier each: ``fence(p)`` initializes the partition's transactional id
    and commits a barrier (its nonce). A barrier not back within :data:`BARRIER_REFENCE_S` is written again after
    fencing again (that ends a transaction of the id left open or held back on the broker); one still missing after
    :data:`BARRIER_WAIT_S` in all stops the recovery (RuntimeError saying what was read of the partition)."""
    def read(parts, wait_s):
        logs, missing = read_to_barriers(client_config, group_id, state_topic, {p: fence(p) for p in parts}, wait_s)
        return logs, missing, "; ".join(f"{p}: {what}" for p, what in sorted(missing.items()))

    logs, missing, what = read(parts, BARRIER_REFENCE_S)
    if missing:
        log.warning("partitions %s: the state barrier did not come back within %s s (%s): fencing them again",
                    sorted(missing), BARRIER_REFENCE_S, what)
        more, missing, what = read(sorted(missing), BARRIER_WAIT_S - BARRIER_REFENCE_S)
        logs.update(more)
    if missing:
        raise RuntimeError(f"partitions {sorted(missing)}: the state barrier did not come back within "
                           f"{BARRIER_WAIT_S} s ({what})")
    return logs


class CommittedCache:
    """``<cache_dir>/<app_id>/<stream>-p<p>.committed.json``: the last committed ``{seq, offset, input_topic_id,
    lineage}`` of each partition (None: no cache directory)."""

    def __init__(self, cache_dir, app_id: str, stream: str):
        self.root = None if cache_dir is None else Path(cache_dir)
        self.dir = None if cache_dir is None else Path(cache_dir) / app_id
        self.stream = stream
        self.failing: str | None = None         # why the last write failed (None: it did not)

    def path(self, p: int) -> Path | None:
        return None if self.dir is None else self.dir / f"{self.stream}-p{p}.committed.json"

    def write(self, ps) -> None:
        """Record the partition's committed header. The cache only helps to notice a broker reset: a disk that
        cannot take it (full, read-only) degrades the worker to the broker's state alone, with one WARNING when
        writing starts failing and one when it works again, never a stop."""
        path = self.path(ps.partition)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(json_bytes({"seq": ps.seq, "offset": ps.offset, "input_topic_id": ps.input_topic_id,
                                        "lineage": ps.lineage}))
            os.replace(tmp, path)
        except OSError as exc:
            if self.failing is None:
                log.warning("local state cache %s not written (%s): recovery relies on the broker's state alone "
                            "until it can be written again; a broker reset would then not be detected",
                            self.dir, exc.strerror or type(exc).__name__)
            self.failing = exc.strerror or type(exc).__name__
            return
        if self.failing is not None:
            log.warning("local state cache %s written again", self.dir)
            self.failing = None

    def read(self, p: int) -> dict | None:
        path = self.path(p)
        try:
            return None if path is None or not path.exists() else orjson.loads(path.read_bytes())
        except (OSError, ValueError) as exc:       # unreadable or cut short (a full disk): no cache, said once
            log.warning("local state cache %s unreadable (%s): recovering from the broker's state alone", path,
                        type(exc).__name__)
            return None

    def lineages(self) -> dict[str, str]:
        """Lineage -> where this state directory names it for the stream: the committed headers of every app id
        under it (``<app_id>/<stream>-p<p>.committed.json``), so a new app id on the same directory still sees the
        lineage of the one before (:mod:`stream_anon.kafka.lineage`)."""
        if self.root is None:
            return {}
        out: dict[str, str] = {}
        try:
            paths = sorted(self.root.glob(f"*/{self.stream}-p*.committed.json"))
        except OSError:
            return out
        for path in paths:
            try:
                doc = orjson.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("seq", 0) > 0:
                out.setdefault(str(doc.get("lineage")), f"local state cache {path}")
        return out
