"""Per-partition local checkpoints of the worker (docs/contracts.md section 6): a snapshot plus an append-only
delta log, so that a checkpoint costs what changed since the last one, not everything the engine ever saw.

Files, in ``<state_dir>/<app_id>/``:

``<stream>-p<partition>.json`` -- the **snapshot**. Line 1: a JSON header ``{"version", "app_id", "stream",
  "topic", "partition", "offset", "written_at", "generation", "core_bytes", "tables": [{"name", "dtype", "n"}]}``;
  then ``core_bytes`` of JSON (the engine's :meth:`~stream_anon.engine.Engine.state_core`, with the DP state under
  ``"dp"``); then, per table in header order, ``n`` little-endian int64 keys and ``n`` records of ``dtype`` (numpy
  ``dtype.descr``). Written atomically (temporary file in the same directory, fsync, ``os.replace``, fsync of the
  directory): a crash leaves the old or the new snapshot, never a torn one.

``<stream>-p<partition>.log`` -- the **delta log**, appended after the snapshot. Each record: ``b"SADL"``, header
  length (uint32 LE), payload length (uint64 LE), CRC-32 of header + payload (uint32 LE), the JSON header
  ``{"generation", "offset", "written_at", "core_bytes", "tables": [{"name", "dtype", "n_put", "n_del"}]}``, and the
  payload: the new core (JSON, in full: it is bounded), then per table the keys put, their records and the keys
  deleted (:meth:`~stream_anon.engine.Engine.state_changes`). A record is fsynced before the worker acknowledges
  the input it covers. Reading stops at the first record that is short, has a bad magic or a bad CRC (a **torn**
  append, e.g. a crash mid-write): it and anything after it are ignored, never applied, and the checkpoint is the
  snapshot plus the records before it (the input after that offset is simply processed again). Records of another
  generation (a log left over from before a compaction) are ignored too.

**Compaction**: when the log would outgrow the snapshot (``log + record > max(snapshot, COMPACT_MIN_BYTES)``) the
writer writes a new snapshot (new generation) and empties the log, so the log never holds more than about one
snapshot and a checkpoint's amortized cost is proportional to what changed. After a process loads a partition (or
after a failed write) its first write is a snapshot.

The offset in the newest valid record (else the snapshot's) is the last input offset whose effects are in the
state and whose outputs were delivered. The worker acknowledges input to faust only after the checkpoint covering
it is on disk, so faust never commits an offset past the checkpoint; on restart the worker skips input offsets <=
the checkpointed one (faust's committed offset may lag the checkpoint).
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

VERSION = 3
MAGIC = b"SADL"
_REC = struct.Struct("<4sIQI")        # magic, header length, payload length, crc32
COMPACT_MIN_BYTES = 256 * 1024        # below this the log is never compacted into a new snapshot


class CheckpointError(RuntimeError):
    pass


@dataclass
class Checkpoint:
    offset: int            # last input offset whose effects are in the state (and whose outputs were delivered)
    core: dict             # Engine.state_core() (+ "dp"), after every valid delta
    stream: str
    topic: str
    partition: int
    app_id: str
    written_at: float = 0.0
    tables: dict = field(default_factory=dict)     # name -> (int64 keys sorted, structured records)
    deltas: int = 0        # delta records applied on top of the snapshot
    torn: bool = False     # a torn or corrupt delta record was found (and ignored with everything after it)

    @property
    def state(self) -> dict:
        """Core and tables as one JSON document (the shape of :meth:`Engine.state_dict`)."""
        if not self.tables:
            return self.core
        from stream_anon.engine.state import compose_state
        return compose_state(self.core, self.tables)


def checkpoint_path(state_dir: str | Path, app_id: str, stream: str, partition: int) -> Path:
    return Path(state_dir) / app_id / f"{stream}-p{partition}.json"


def log_path(state_dir: str | Path, app_id: str, stream: str, partition: int) -> Path:
    return Path(state_dir) / app_id / f"{stream}-p{partition}.log"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _dump(obj) -> bytes:
    """JSON with orjson (~8x faster than json here). It writes non-finite floats as null where json would refuse
    them; the engine keeps none in its state (an empty watermark is stored as null on purpose, and NaN/Infinity
    literals are rejected when input is parsed)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _dtype(descr) -> np.dtype:
    return np.dtype([tuple(f) for f in descr])


def _le(a: np.ndarray) -> bytes:
    """Little-endian bytes of an array (keys are int64; records are stored with their little-endian descr)."""
    return np.ascontiguousarray(a).tobytes()


def _table_bytes(rows: np.ndarray) -> tuple[list, bytes]:
    dt = rows.dtype.newbyteorder("<") if rows.dtype.byteorder == ">" else rows.dtype
    return dt.descr, np.ascontiguousarray(rows.astype(dt, copy=False)).tobytes()


# ------------------------------------------------------------------------------------------------- the writer
@dataclass
class _Writer:
    """What this process last wrote for one partition (to append deltas without re-reading the files)."""
    generation: str
    snapshot_bytes: int
    log_bytes: int
    offset: int
    stat: tuple            # (snapshot inode, snapshot size, snapshot mtime_ns, log size)


_WRITERS: dict[Path, _Writer] = {}
_LOCK = threading.Lock()


def _stat(path: Path, log: Path) -> tuple:
    try:
        s = path.stat()
    except FileNotFoundError:
        return (None, None, None, None)
    try:
        lsize = log.stat().st_size
    except FileNotFoundError:
        lsize = 0
    return (s.st_ino, s.st_size, s.st_mtime_ns, lsize)


def _atomic_write(path: Path, chunks) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    size = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for c in chunks:
                fh.write(c)
                size += len(c)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return size


def _write_snapshot(state_dir, app_id, stream, topic, partition, offset, core: dict, tables: dict) -> Path:
    path = checkpoint_path(state_dir, app_id, stream, partition)
    log = log_path(state_dir, app_id, stream, partition)
    core_b = _dump(core)
    specs, blobs = [], []
    for name, (keys, rows) in tables.items():
        descr, data = _table_bytes(rows)
        specs.append({"name": name, "dtype": descr, "n": int(len(keys))})
        blobs += [_le(np.asarray(keys, dtype="<i8")), data]
    generation = uuid.uuid4().hex
    header = {"version": VERSION, "app_id": app_id, "stream": stream, "topic": topic, "partition": partition,
              "offset": int(offset), "written_at": time.time(), "generation": generation,
              "core_bytes": len(core_b), "tables": specs}
    size = _atomic_write(path, [json.dumps(header, separators=(",", ":")).encode("utf-8"), b"\n", core_b, *blobs])
    # the old log belongs to the previous generation: empty it (if we crash before, its records are ignored)
    if log.exists():
        with open(log, "wb") as fh:
            fh.flush()
            os.fsync(fh.fileno())
    _WRITERS[path] = _Writer(generation, size, 0, int(offset), _stat(path, log))
    return path


def write_checkpoint(state_dir: str | Path, app_id: str, stream: str, topic: str, partition: int, offset: int,
                     state: dict, tables: dict | None = None) -> Path:
    """Atomically write a full snapshot of one partition (``state``: the core; ``tables``: full keyed tables)
    and empty its delta log."""
    with _LOCK:
        return _write_snapshot(state_dir, app_id, stream, topic, partition, offset, state, tables or {})


def write_state(state_dir: str | Path, app_id: str, stream: str, topic: str, partition: int, offset: int,
                core: dict, tables, changes) -> tuple[Path, str, int]:
    """Checkpoint one partition: a delta record when this process wrote the previous checkpoint of the partition
    and the log stays smaller than the snapshot, else a new snapshot. ``tables()`` returns the full keyed tables,
    ``changes()`` what changed since its previous call (:meth:`Engine.state_tables` / :meth:`Engine.state_changes`);
    ``changes`` is called exactly once per write so that the next delta starts where this checkpoint ends.
    Returns (path, "delta" or "snapshot", bytes written)."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    log = log_path(state_dir, app_id, stream, partition)
    with _LOCK:
        w = _WRITERS.pop(path, None)           # popped: any failure below leaves "next write is a snapshot"
        if w is None or _stat(path, log) != w.stat:
            full = tables()
            changes()                          # the snapshot is the new base of the change log
            _write_snapshot(state_dir, app_id, stream, topic, partition, offset, core, full)
            return path, "snapshot", _WRITERS[path].snapshot_bytes
        delta = changes()
        core_b = _dump(core)
        specs, blobs = [], []
        for name, (keys, rows) in delta.items():
            if name.endswith(":deleted"):
                continue
            deleted = delta.get(name + ":deleted", (np.empty(0, np.int64), None))[0]
            descr, data = _table_bytes(rows)
            specs.append({"name": name, "dtype": descr, "n_put": int(len(keys)), "n_del": int(len(deleted))})
            blobs += [_le(np.asarray(keys, dtype="<i8")), data, _le(np.asarray(deleted, dtype="<i8"))]
        header = json.dumps({"generation": w.generation, "offset": int(offset), "written_at": time.time(),
                             "core_bytes": len(core_b), "tables": specs}, separators=(",", ":")).encode()
        payload = b"".join([core_b, *blobs])
        crc = zlib.crc32(payload, zlib.crc32(header))
        record = _REC.pack(MAGIC, len(header), len(payload), crc) + header + payload
        if w.log_bytes + len(record) > max(w.snapshot_bytes, COMPACT_MIN_BYTES):
            # compaction: the log would outgrow the snapshot; the delta just taken is inside the new snapshot
            _write_snapshot(state_dir, app_id, stream, topic, partition, offset, core, tables())
            return path, "snapshot", _WRITERS[path].snapshot_bytes
        with open(log, "ab") as fh:
            if fh.tell() != w.log_bytes:       # someone else touched the log: start over from a snapshot
                raise CheckpointError(f"{log}: unexpected size {fh.tell()} (expected {w.log_bytes})")
            fh.write(record)
            fh.flush()
            os.fsync(fh.fileno())
        w.log_bytes += len(record)
        w.offset = int(offset)
        w.stat = _stat(path, log)
        _WRITERS[path] = w
        return path, "delta", len(record)


def forget_writer(state_dir: str | Path, app_id: str, stream: str, partition: int) -> None:
    """The next write of this partition is a snapshot (called whenever the partition's state is (re)loaded)."""
    with _LOCK:
        _WRITERS.pop(checkpoint_path(state_dir, app_id, stream, partition), None)


# ------------------------------------------------------------------------------------------------- the reader
def _read_header(path: Path, fh) -> dict:
    try:
        header = json.loads(fh.readline())
        if header.get("version") not in (2, VERSION):
            raise CheckpointError(f"{path}: unsupported checkpoint version {header.get('version')!r}")
        int(header["offset"])
        return header
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint header: {exc}") from exc


def _records(log: Path, generation: str):
    """Valid delta records of ``generation`` in order: (header, payload); stops at the first torn one. The last
    item is (None, torn flag)."""
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        yield None, False
        return
    pos, n = 0, len(data)
    while pos < n:
        if n - pos < _REC.size:
            yield None, True
            return
        magic, hlen, plen, crc = _REC.unpack_from(data, pos)
        end = pos + _REC.size + hlen + plen
        if magic != MAGIC or end > n:
            yield None, True
            return
        hb = data[pos + _REC.size: pos + _REC.size + hlen]
        pb = data[pos + _REC.size + hlen: end]
        if zlib.crc32(pb, zlib.crc32(hb)) != crc:
            yield None, True
            return
        try:
            header = json.loads(hb)
        except ValueError:
            yield None, True
            return
        if header.get("generation") == generation:
            yield header, pb
        pos = end
    yield None, False


def read_checkpoint(state_dir: str | Path, app_id: str, stream: str, partition: int) -> Checkpoint | None:
    """The checkpoint of one partition (snapshot + every valid delta), or None if there is none."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return None
    with fh:
        header = _read_header(path, fh)
        rest = fh.read()
    try:
        if header["version"] == 2:
            core, tables = orjson.loads(rest), {}
            generation = None
        else:
            nb = int(header["core_bytes"])
            core = orjson.loads(rest[:nb])
            pos = nb
            tables = {}
            for spec in header["tables"]:
                dt, n = _dtype(spec["dtype"]), int(spec["n"])
                keys = np.frombuffer(rest, dtype="<i8", count=n, offset=pos).astype(np.int64)
                pos += 8 * n
                rows = np.frombuffer(rest, dtype=dt, count=n, offset=pos).copy()
                pos += dt.itemsize * n
                tables[spec["name"]] = (keys, rows)
            if pos != len(rest):
                raise ValueError(f"{len(rest) - pos} bytes beyond the declared tables")
            generation = header["generation"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint: {exc}") from exc
    cp = Checkpoint(offset=int(header["offset"]), core=core, stream=header["stream"], topic=header["topic"],
                    partition=int(header["partition"]), app_id=header["app_id"],
                    written_at=float(header.get("written_at", 0.0)), tables=tables)
    if generation is None:
        return cp
    from stream_anon.engine.state import KeyedTable
    live = {}
    for rec, payload in _records(log_path(state_dir, app_id, stream, partition), generation):
        if rec is None:
            cp.torn = bool(payload)
            break
        nb = int(rec["core_bytes"])
        cp.core = orjson.loads(payload[:nb])
        pos = nb
        for spec in rec["tables"]:
            dt, n_put, n_del = _dtype(spec["dtype"]), int(spec["n_put"]), int(spec["n_del"])
            keys = np.frombuffer(payload, dtype="<i8", count=n_put, offset=pos).astype(np.int64)
            pos += 8 * n_put
            rows = np.frombuffer(payload, dtype=dt, count=n_put, offset=pos)
            pos += dt.itemsize * n_put
            deleted = np.frombuffer(payload, dtype="<i8", count=n_del, offset=pos).astype(np.int64)
            pos += 8 * n_del
            t = live.get(spec["name"])
            if t is None:
                t = live[spec["name"]] = KeyedTable(dt)
                if spec["name"] in cp.tables:
                    t.load(*cp.tables[spec["name"]])
            t.delete(deleted)
            t.put(keys, rows)
        cp.offset = int(rec["offset"])
        cp.written_at = float(rec.get("written_at", cp.written_at))
        cp.deltas += 1
    for name, t in live.items():
        cp.tables[name] = t.snapshot()
    return cp


def checkpointed_offset(state_dir: str | Path, app_id: str, stream: str, partition: int) -> int:
    """Last checkpointed input offset of a partition, -1 if none. Answered from memory when the files are as this
    process last wrote them (the worker asks before every write); otherwise the snapshot's header and the log's
    record headers are read (the tables are not decoded)."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    log = log_path(state_dir, app_id, stream, partition)
    w = _WRITERS.get(path)
    if w is not None and _stat(path, log) == w.stat:
        return w.offset
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return -1
    with fh:
        header = _read_header(path, fh)
    offset = int(header["offset"])
    if header["version"] == 2:
        return offset
    for rec, _ in _records(log, header["generation"]):
        if rec is None:
            break
        offset = int(rec["offset"])
    return offset
