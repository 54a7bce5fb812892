"""Per-partition checkpoints of the worker (docs/contracts.md section 6).

``<state_dir>/<app_id>/<stream>-p<partition>.json`` holds two JSON documents, one per line: a header
``{"version", "app_id", "stream", "topic", "partition", "offset", "written_at"}`` and then the engine state after
processing every input offset <= ``offset``. The header comes first so that the offset can be read without parsing
the state (the worker checks it before every write; parsing a large state there cost 10% of its time). Writes are
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

import orjson

VERSION = 2


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


def _dump_state(state: dict) -> bytes:
    """The state as JSON. orjson is ~8x faster than json here (the state holds the open window's buffer), but it
    writes non-finite floats as null where json would refuse them. The engine keeps none in its state: an empty
    watermark is stored as null on purpose, and NaN/Infinity literals are rejected when input is parsed."""
    return orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def write_checkpoint(state_dir: str | Path, app_id: str, stream: str, topic: str, partition: int, offset: int,
                     state: dict) -> Path:
    """Atomically write the checkpoint of one partition."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"version": VERSION, "app_id": app_id, "stream": stream, "topic": topic, "partition": partition,
              "offset": int(offset), "written_at": time.time()}
    data = b"\n".join((json.dumps(header, separators=(",", ":")).encode("utf-8"), _dump_state(state)))
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


def _read_header(path: Path, fh) -> dict:
    try:
        header = json.loads(fh.readline())
        if header.get("version") != VERSION:
            raise CheckpointError(f"{path}: unsupported checkpoint version {header.get('version')!r}")
        int(header["offset"])
        return header
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint header: {exc}") from exc


def read_checkpoint(state_dir: str | Path, app_id: str, stream: str, partition: int) -> Checkpoint | None:
    """The checkpoint of one partition, or None if there is none."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return None
    with fh:
        header = _read_header(path, fh)
        try:
            state = orjson.loads(fh.read())
            return Checkpoint(offset=int(header["offset"]), state=state, stream=header["stream"],
                              topic=header["topic"], partition=int(header["partition"]), app_id=header["app_id"],
                              written_at=float(header.get("written_at", 0.0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: unreadable checkpoint: {exc}") from exc


def checkpointed_offset(state_dir: str | Path, app_id: str, stream: str, partition: int) -> int:
    """Last checkpointed input offset of a partition, -1 if none (reads the header line only)."""
    path = checkpoint_path(state_dir, app_id, stream, partition)
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return -1
    with fh:
        return int(_read_header(path, fh)["offset"])
