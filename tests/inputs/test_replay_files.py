"""Files of binary messages for ``stream-anon replay`` (stream_anon/inputs/files.py): one ``.pb`` message, a
directory of them (name or modification-time order), a varint length-delimited file; any file replay cannot read
is one line on stderr and exit 2 (no broker needed: the file is read before anything is produced). The same
files through a real broker, the worker and the audit: tests/kafka/test_kafka_replay_binary.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("google.transit")

from stream_anon.cli import main  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.inputs import file_messages  # noqa: E402
from stream_anon.inputs.files import write_delimited  # noqa: E402
from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"gtfs": ROOT / "configs" / "inputs" / "citibike-gtfs.toml",
           "tesla": ROOT / "configs" / "inputs" / "obd2-tesla.toml"}


def _messages(kind: str) -> list[bytes]:
    return gtfs_feeds(limit=600) if kind == "gtfs" else tesla_payloads("protobuf", limit=60)


@pytest.mark.parametrize("kind", ["gtfs", "tesla"])
def test_pb_file_directory_and_delimited_give_the_messages(kind, tmp_path):
    spec = load_config(CONFIGS[kind]).input
    msgs = _messages(kind)
    assert len(msgs) > 5
    one = tmp_path / "one.pb"
    one.write_bytes(msgs[0])
    assert list(file_messages(one, spec)) == msgs[:1]
    d = tmp_path / "dir"
    d.mkdir()
    for i, m in enumerate(msgs):        # names in reverse time order: name order and mtime order differ
        f = d / f"{len(msgs) - i:05d}.pb"
        f.write_bytes(m)
        os.utime(f, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    (d / ".hidden").write_bytes(b"junk")
    assert list(file_messages(d, spec, order="mtime")) == msgs
    assert list(file_messages(d, spec, order="name")) == msgs[::-1]
    ld = tmp_path / "all.pbd"
    write_delimited(msgs, ld)
    assert list(file_messages(ld, spec)) == msgs
    assert list(file_messages(tmp_path / "all.pbd", spec, framing="delimited")) == msgs


def test_tesla_protojson_lines_stay_lines(tmp_path):
    spec = load_config(CONFIGS["tesla"]).input
    js = tesla_payloads("json", limit=20)
    f = tmp_path / "payloads.jsonl"
    f.write_bytes(b"\n".join(js) + b"\n")
    assert list(file_messages(f, spec)) == js


def _replay(capsys, *args) -> tuple[int, list[str]]:
    topic = [] if "--config" in args else ["--topic", "raw.never"]      # with a config: its input topic
    rc = main(["replay", *map(str, args), *topic, "--broker", "127.0.0.1:1", "--quiet"])
    return rc, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_unreadable_files_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STREAM_ANON_SECRET", "test-secret-0123456789abcdef0123456789")
    msgs = _messages("gtfs")
    gtfs, tesla = CONFIGS["gtfs"], CONFIGS["tesla"]
    ld = tmp_path / "feeds.pbd"
    write_delimited(msgs, ld)
    cut = tmp_path / "cut.pbd"
    cut.write_bytes(ld.read_bytes()[:-10])
    pb = tmp_path / "feed.pb"
    pb.write_bytes(msgs[0])
    odd = tmp_path / "feed.dat"
    odd.write_bytes(msgs[0])
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    tesla_pb = tmp_path / "payloads.jsonl"
    tesla_pb.write_bytes(b"\xff\xfe" + tesla_payloads("protobuf", limit=3)[0])
    cases = [
        ((cut, "--config", gtfs), "length-delimited framing broken at byte"),
        ((ld, "--config", gtfs, "--framing", "message"), "none of its 1 messages is a gtfs-realtime message"),
        ((odd, "--config", gtfs), "cannot tell how the gtfs-realtime messages are framed"),
        ((tmp_path / "missing.pb", "--config", gtfs), "no such file or directory"),
        ((empty_dir, "--config", gtfs), "the directory holds no files"),
        ((pb, "--config", gtfs, "--framing", "lines"), "gtfs-realtime messages are binary"),
        ((tesla_pb, "--config", tesla), "not UTF-8 text"),
        ((pb,), "not a JSONL file of events"),                   # no --config: binary needs the [input] format
    ]
    for args, needle in cases:
        rc, err = _replay(capsys, *args)
        assert rc == 2 and len(err) == 1, (args, err)
        assert err[0].startswith("stream-anon replay: ") and needle in err[0], (args, err)
