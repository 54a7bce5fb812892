"""The messages a file (or a directory of files) holds for a stream's ``[input]`` format: what ``stream-anon
replay``, ``calibrate`` and ``evaluate`` read from the files users have.

Framings (``framing``; ``auto`` picks by the file name and format):

- ``records``: a CSV file's records (the header checked against ``input.columns``; each record re-serialized as
  one CSV line). Auto for format csv.
- ``lines``: one message per non-empty line (JSONL, protojson Payloads). Auto for format json, and for
  tesla-fleet-telemetry files named ``*.jsonl``/``*.json``/``*.txt`` (optionally ``.gz``).
- ``message``: the whole file is one binary message (a GTFS-realtime ``FeedMessage`` snapshot, one Tesla
  ``Payload``). Auto for the binary formats' files named ``*.pb``, ``*.bin``, ``*.proto`` or with no suffix.
- ``delimited``: binary messages, each preceded by its length as a varint (protobuf's ``writeDelimitedTo``,
  Java ``parseDelimitedFrom``, Go ``protodelim``). Auto for ``*.pbd``, ``*.ld``, ``*.delimited``.

A directory: its files (hidden ones skipped), each read with the framing its name gives, in name order or in
modification-time order (``order = "mtime"``, ties broken by name).

A file that cannot be read (missing, not UTF-8 where text is expected, a CSV header that differs from
``input.columns``, a broken length prefix) raises ValueError naming the file (the CLI prints it as one line and
exits 2); a message that is readable but not of the format goes to the topic and is dead-lettered by the worker.
"""
from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path
from typing import Iterator

from stream_anon.inputs.mapping import InputSpec

FRAMINGS = ("auto", "records", "lines", "message", "delimited")
ORDERS = ("name", "mtime")
BINARY_FORMATS = ("tesla-fleet-telemetry", "gtfs-realtime")
_TEXT_SUFFIXES = (".jsonl", ".json", ".txt", ".ndjson")
_MESSAGE_SUFFIXES = (".pb", ".bin", ".proto", ".protobuf", "")
_DELIMITED_SUFFIXES = (".pbd", ".ld", ".delimited")
MAX_MESSAGE_BYTES = 64 << 20     # a length prefix above this is a broken framing, not a message


def framing_of(path: Path, spec: InputSpec, framing: str = "auto") -> str:
    """The framing of one file (``auto`` resolved by its name and the format)."""
    if framing not in FRAMINGS:
        raise ValueError(f"framing {framing!r}: expected one of {', '.join(FRAMINGS)}")
    if framing != "auto":
        return framing
    if spec.format == "csv":
        return "records"
    if spec.format == "json":
        return "lines"
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    suffix = Path(name).suffix.lower()
    if spec.format == "tesla-fleet-telemetry" and suffix in _TEXT_SUFFIXES:
        return "lines"
    if suffix in _DELIMITED_SUFFIXES:
        return "delimited"
    if suffix in _MESSAGE_SUFFIXES:
        return "message"
    raise ValueError(f"{path}: cannot tell how the {spec.format} messages are framed from the name "
                     f"(*.pb: one message, *.pbd: length-delimited, *.jsonl: lines); give --framing")


def _files(path: Path, order: str) -> list[Path]:
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if not path.is_dir():
        return [path]
    files = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
    if not files:
        raise ValueError(f"{path}: the directory holds no files")
    if order == "mtime":
        return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))
    return sorted(files, key=lambda p: p.name)


def file_messages(path, spec: InputSpec, framing: str = "auto", order: str = "name") -> Iterator[bytes]:
    """The messages of a file or a directory of files, in order (see the module docstring)."""
    for f in _files(Path(path), order):
        how = framing_of(f, spec, framing)
        if how in ("records", "lines") and spec.format == "gtfs-realtime":
            raise ValueError(f"{f}: {spec.format} messages are binary: framing 'message' or 'delimited'")
        if how == "records" and spec.format != "csv":
            raise ValueError(f"{f}: framing 'records' is for format csv")
        try:
            if how == "records":
                yield from _csv_records(f, spec)
            elif how == "lines":
                yield from _lines(f)
            else:
                data = _read_bytes(f)
                yield from ([data] if how == "message" else _delimited(data, f))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{f}: not UTF-8 text ({exc.reason} at byte {exc.start}); a binary file needs "
                             f"framing 'message' or 'delimited'") from None
        except (OSError, EOFError, csv.Error) as exc:
            raise ValueError(f"{f}: cannot read: {exc}") from None


def _open_text(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _read_bytes(path: Path) -> bytes:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return fh.read()
    return path.read_bytes()


def _csv_records(path: Path, spec: InputSpec) -> Iterator[bytes]:
    with _open_text(path) as fh:
        reader = csv.reader(fh, delimiter=spec.delimiter)
        header = next(reader, None)
        if header is None:
            return
        if tuple(header) != spec.columns:
            raise ValueError(f"{path}: header {header} differs from input.columns {list(spec.columns)}")
        for row in reader:
            if not row:
                continue
            buf = io.StringIO()
            csv.writer(buf, delimiter=spec.delimiter, lineterminator="").writerow(row)
            yield buf.getvalue().encode("utf-8")


def _lines(path: Path) -> Iterator[bytes]:
    with _open_text(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                yield line.encode("utf-8")


def _delimited(data: bytes, path: Path) -> Iterator[bytes]:
    """Varint length-prefixed messages; a prefix that is cut off or overruns the file is a broken framing.

    >>> list(_delimited(b"\\x02ab\\x00\\x01c", Path("x")))
    [b'ab', b'', b'c']
    """
    pos, n = 0, len(data)
    while pos < n:
        start, length, shift = pos, 0, 0
        while True:
            if pos >= n or shift > 63:
                raise ValueError(f"{path}: length-delimited framing broken at byte {start}: the length prefix "
                                 "is cut off")
            b = data[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if length > MAX_MESSAGE_BYTES or pos + length > n:
            raise ValueError(f"{path}: length-delimited framing broken at byte {start}: a message of {length} "
                             f"bytes overruns the file ({n - pos} bytes left)")
        yield data[pos:pos + length]
        pos += length


def write_delimited(messages, path) -> None:
    """Write messages with varint length prefixes (the framing :func:`file_messages` reads as ``delimited``)."""
    with open(path, "wb") as fh:
        for m in messages:
            n = len(m)
            prefix = bytearray()
            while True:
                b = n & 0x7F
                n >>= 7
                prefix.append(b | (0x80 if n else 0))
                if not n:
                    break
            fh.write(bytes(prefix) + m)
