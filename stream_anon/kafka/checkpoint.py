"""Per-partition checkpoints of the worker (docs/contracts.md section 6).

``<state_dir>/<app_id>/<stream>-p<partition>.json`` holds ``{"version", "app_id", "stream", "topic", "partition",
"offset", "state", "written_at"}``: the engine state after processing every input offset <= ``offset``. Writes are
atomic (temporary file in the same directory, fsync, ``os.replace``, fsync of the directory), so a crash leaves
either the old or the new checkpoint, never a torn one. The worker acknowledges input to faust only after the
checkpoint covering it is on disk, so faust never commits an offset past the checkpoint; on restart the worker skips
input offsets <= the checkpointed one (faust's committed offset may lag the checkpoint).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

VERSION = 1


class CheckpointError(RuntimeError):
    pass


@dataclass
class Checkpoint:
    offset: int            # last input offset whose effects are in ``state`` (and whose outputs were delivered)
    state: dict
    stream: str
    topic: str
    partition: int
    app_id: str
    written_at: float = 0.0


def checkpoint_path(state_dir: str | Path, app_id: str, stream: str, partition: int) -> Path:
    return Path(state_dir) / app_id / f"{stream}-p{partition}.json"


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


def write_checkpoint(state_dir: str | Path, app_id: str, stream: str, topic: str, partition: int, offset: int,
                     state: dict) -> Path:
    """Atomically write the checkpoint of one partition."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"version": VERSION, "app_id": app_id, "stream": stream, "topic": topic, "partition": partition,
           "offset": int(offset), "written_at": time.time(), "state": state}
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
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
    return path


def read_checkpoint(state_dir: str | Path, app_id: str, stream: str, partition: int) -> Checkpoint | None:
    """The checkpoint of one partition, or None if there is none."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("version") != VERSION:
            raise CheckpointError(f"{path}: unsupported checkpoint version {doc.get('version')!r}")
        return Checkpoint(offset=int(doc["offset"]), state=doc["state"], stream=doc["stream"], topic=doc["topic"],
                          partition=int(doc["partition"]), app_id=doc["app_id"],
                          written_at=float(doc.get("written_at", 0.0)))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint: {exc}") from exc


def checkpointed_offset(state_dir: str | Path, app_id: str, stream: str, partition: int) -> int:
    """Last checkpointed input offset of a partition, -1 if none (read without keeping the state)."""
    cp = read_checkpoint(state_dir, app_id, stream, partition)
    return -1 if cp is None else cp.offset
