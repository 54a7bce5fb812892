"""What an operator sees of a worker at the default log level (its lifecycle lines, no client internals, no
terminal control bytes in a file), and ``topics apply --config X`` creating only the shared topics and X's."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import setup_stream, synthetic_fares, wait_for, write_stream_config  # noqa: E402

from stream_anon import __version__, crypto  # noqa: E402
from stream_anon.broker import free_port  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.supervise import start_worker_process, stop_worker_process  # noqa: E402
from stream_anon.kafka.topics import apply_plan, existing_partitions, load_topic_definitions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHARED = {"anon.releases", "anon.deadletter", "anon.metrics", "anon.aggregates"}


def test_apply_plan_with_a_config_is_the_shared_topics_and_that_streams():
    defs = load_topic_definitions()
    plan = apply_plan(defs, [load_config(ROOT / "configs" / "citibike.toml")])
    assert set(plan) == SHARED | {"raw.vehicle.citibike", "anon.citibike.records"}
    assert set(apply_plan(defs)) == set(defs)        # without a config: every defined topic


def test_topics_apply_config_creates_only_the_shared_topics_and_the_streams(broker, tmp_path):
    path = write_stream_config(tmp_path, "mystream", "raw.test.mystream")
    before = set(existing_partitions(broker.bootstrap))
    out = subprocess.run([sys.executable, "-m", "stream_anon.cli", "topics", "apply", "--broker", broker.bootstrap,
                          "--config", str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    applied = {line.split(":")[0] for line in out.stdout.splitlines() if line.strip()}
    expected = SHARED | {"raw.test.mystream", "anon.mystream.records"}
    assert applied == expected
    created = set(existing_partitions(broker.bootstrap)) - before
    assert {"raw.test.mystream", "anon.mystream.records"} <= created <= expected
    assert not created & {"raw.vehicle.obd2", "anon.obd2.records", "raw.fare.oyster-cards"}


def test_worker_lifecycle_lines_at_the_default_level_and_no_control_bytes(broker, tmp_path, secret_env):
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "lifelog")
    replay(broker.bootstrap, cfg.stream.input_topic, synthetic_fares(500, seed=7), "journey_id", progress=False)
    log_path, port = tmp_path / "w.log", free_port()
    # no --loglevel: the default; stdout and stderr are a file
    w = start_worker_process(path, broker.bootstrap, tmp_path / "state", "lifelog-app", 2.0, log_path,
                             extra=["--web-port", str(port)])
    try:
        wait_for(lambda: "ready:" in log_path.read_text(errors="replace"), 90, "the ready line")
        time.sleep(1.0)
    finally:
        assert stop_worker_process(w, timeout_s=60) == 0
    raw = log_path.read_bytes()
    text = raw.decode()
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", raw.replace(b"\n", b"")), "control bytes in the log file"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    key = crypto.key_id(secret_env)
    started = [ln for ln in lines if "stream_anon.worker: started:" in ln]
    assert len(started) == 1 and __version__ in started[0] and "stream lifelog" in started[0] and key in started[0]
    assert any("partitions assigned: [0, 1, 2, 3]" in ln for ln in lines)
    for word in ("ready:", "stopping:", "stopped:", "partitions revoked:"):
        assert sum(f"stream_anon.worker: {word}" in ln for ln in lines) == 1, (word, text[-3000:])
    order = [next(i for i, ln in enumerate(lines) if w in ln) for w in ("started:", "ready:", "stopping:", "stopped:")]
    assert order == sorted(order)
    third_party = [ln for ln in lines if re.search(r"\] INFO (kafka|faust|mode|aiokafka|aiohttp)\b", ln)]
    assert third_party == []
    assert all(re.match(r"^\[[^]]+\] (INFO|WARNING|ERROR) ", ln) for ln in lines), text[-3000:]


def test_third_party_info_shows_only_at_debug():
    import logging

    from stream_anon import logsetup
    try:
        logsetup.setup_logging("info")
        assert not logging.getLogger("kafka.conn").isEnabledFor(logging.INFO)
        assert logging.getLogger("stream_anon.worker").isEnabledFor(logging.INFO)
        assert logging.getLogger("kafka.conn").isEnabledFor(logging.WARNING)
        logsetup.setup_logging("debug")
        assert logging.getLogger("faust.app").isEnabledFor(logging.DEBUG)
    finally:
        logsetup.setup_logging("warning")
