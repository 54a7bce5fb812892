"""One privacy unit, one input partition: where each unit's events must arrive, and the events that did not.

Every guarantee that is kept per partition assumes that a unit's events all reach one partition: k counted in
distinct individuals, m-invariance signatures, and above all the DP budget, which each partition's ledger charges
apart (parallel composition over disjoint sets of units: McSherry, *Privacy Integrated Queries*, SIGMOD 2009,
Theorem 4). A unit whose events arrive on two partitions is charged on two ledgers that each say "within budget"
while the unit's loss is their sum. So the worker checks, for every event, that its unit belongs on the partition it
arrived on, and never lets a misplaced event reach the engine or the aggregates: it is dead-lettered
(:data:`WRONG_PARTITION`) and an alert raised. Dead-lettering the event rather than halting the partition: one
misrouted event must not stop a stream, and a producer that keys every event wrongly shows at once as a dead letter
rate and an alert.

Where a unit belongs: the partition Kafka's default partitioner gives to the unit's Kafka key, the keyed pseudonym
:func:`stream_anon.crypto.pseudonym` (``murmur2(key) & 0x7fffffff mod partitions``, the Java client's and
kafka-python's default; librdkafka clients need ``partitioner = murmur2_random``). ``stream-anon replay`` produces
this way (docs/inputs.md, "Keys and partitions").

>>> murmur2([b"21", b"foobar"]).tolist() == [-973932308, -790332482]    # Kafka's own test vectors
True
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stream_anon import crypto

WRONG_PARTITION = "wrong_partition"
CACHE_MAX = 1 << 20             # units whose partition is remembered (a dict of ~100 MB at most)

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


def murmur2(keys: list[bytes]) -> np.ndarray:
    """Kafka's murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``) of each key, as a signed 32-bit int,
    vectorized over keys of one length at a time (a unit's pseudonym is always 64 bytes)."""
    out = np.empty(len(keys), dtype=np.int32)
    by_length: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        by_length.setdefault(len(k), []).append(i)
    for length, idx in by_length.items():
        out[idx] = _murmur2_same_length([keys[i] for i in idx], length)
    return out


def _murmur2_same_length(keys: list[bytes], length: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        data = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), length)
        h = np.full(len(keys), (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
        blocks = length // 4
        words = data[:, :blocks * 4].copy().view("<u4")
        for j in range(blocks):
            k = words[:, j] * _M
            k ^= k >> np.uint32(24)
            k *= _M
            h *= _M
            h ^= k
        tail = data[:, blocks * 4:].astype(np.uint32)
        rest = length % 4
        if rest:
            if rest == 3:
                h ^= tail[:, 2] << np.uint32(16)
            if rest >= 2:
                h ^= tail[:, 1] << np.uint32(8)
            h ^= tail[:, 0]
            h *= _M
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
    return h.view(np.int32)


def partitions_for(keys: list[bytes], n_partitions: int) -> np.ndarray:
    """The partition Kafka's default partitioner gives each key (``toPositive(murmur2(key)) % n``)."""
    return (murmur2(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)).astype(np.int64) % int(n_partitions)


class UnitPlacement:
    """Which partition of ``n_partitions`` each unit's events must arrive on (module docstring), remembered per unit
    value. ``unit_field``: the dotted path of the privacy unit."""

    def __init__(self, secret: bytes, unit_field: str, n_partitions: int):
        if n_partitions < 1:
            raise ValueError(f"n_partitions: at least 1, got {n_partitions}")
        self.secret, self.unit_field, self.n_partitions = secret, unit_field, int(n_partitions)
        self._path = tuple(unit_field.split("."))
        self._home: dict = {}

    def home(self, units: list) -> list[int]:
        """Each unit value's partition."""
        new = [u for u in dict.fromkeys(units) if u not in self._home]
        if new:
            if len(self._home) + len(new) > CACHE_MAX:
                self._home.clear()
            keys = crypto.pseudonym_keys(self.secret, new)
            self._home.update(zip(new, partitions_for(keys, self.n_partitions).tolist()))
        home = self._home
        return [home[u] for u in units]

    def misplaced(self, events: Sequence, partition: int, columns: dict | None = None) -> list[tuple[int, int]]:
        """(index, the partition it belongs on) of each event whose unit belongs on another partition. Events
        without a unit are left to the reader (which dead-letters them with their own reason). ``columns``: the
        events' top-level fields as columns, when the input checks gave them (the unit is then read there, and
        events decoded to columns are not parsed one by one)."""
        if self.n_partitions == 1:
            return []
        if columns is not None and len(self._path) == 1 and self._path[0] in columns:
            values = columns[self._path[0]]
        else:
            values = []
            for e in events:
                u = e
                for part in self._path:
                    u = u.get(part) if isinstance(u, dict) else None
                values.append(u)
        idx = [i for i, u in enumerate(values) if u is not None and not isinstance(u, (dict, list))]
        units = [values[i] for i in idx] if len(idx) < len(values) else list(values)
        return [(i, p) for i, p in zip(idx, self.home(units)) if p != partition]

    def take_misplaced(self, batch, partition: int) -> list[tuple]:
        """Remove from ``batch`` (a :class:`~stream_anon.worker.input_checks.InputBatch`) the events whose unit
        belongs on another partition; returns ``(source, event, dead letter reason)`` of each."""
        wrong = self.misplaced(batch.events, partition, batch.columns)
        if not wrong:
            return []
        out = [(batch.sources[i], batch.events[i], f"{WRONG_PARTITION}: its privacy unit belongs on partition {home} "
                f"of {self.n_partitions} (produce keyed by the unit's pseudonym: docs/inputs.md)") for i, home in wrong]
        drop = {i for i, _ in wrong}
        keep = [i for i in range(len(batch.events)) if i not in drop]
        batch.events = [batch.events[i] for i in keep]
        batch.sources = [batch.sources[i] for i in keep]
        if batch.columns is not None:
            batch.columns = {f: [col[i] for i in keep] for f, col in batch.columns.items()}
        return out

