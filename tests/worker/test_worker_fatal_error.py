"""A fatal Kafka client error under a running worker (issue 43 item 13): the broker is reset (stopped, its data
gone, restarted on the same port) while the worker runs. The worker's idempotent lineage producer then meets
OUT_OF_ORDER_SEQUENCE_NUMBER, a fatal librdkafka error. Before: a traceback in the kafka-loop thread and exit 0, so
a supervisor that restarts on failure left the worker down. Now: one ERROR line naming the error and exit 70, and
the worker a supervisor restarts halts its partitions (state_topic_reset) instead of publishing a new history."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import setup_stream, synthetic_fares, wait_for  # noqa: E402

from stream_anon.broker import EmbeddedBroker, free_port  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.supervise import start_worker_process, stop_worker_process  # noqa: E402

N = 400


def _readyz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (urllib.error.URLError, OSError):
        return 0, {}


def exit_and_errors(worker, log_path: Path, timeout_s: float = 90) -> tuple[int | None, str, list[str]]:
    """The worker's exit status (None: still running after ``timeout_s``, then stopped), its log, and the log's
    ERROR lines of the worker."""
    try:
        code = worker.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop_worker_process(worker)
    log = log_path.read_text()
    return code, log, [line for line in log.splitlines() if " ERROR stream_anon.worker: " in line]


def test_a_broker_reset_under_a_running_worker_exits_70_with_one_line_and_the_restart_halts(tmp_path, secret_env,
                                                                                            broker_of_its_own):
    name, app_id, state = "fatal", "fatal-app", tmp_path / "state"
    events = synthetic_fares(N, seed=7)
    broker = EmbeddedBroker().start()
    try:
        path, cfg = setup_stream(tmp_path, broker.bootstrap, name)
        replay(broker.bootstrap, cfg.stream.input_topic, events[: N // 2], "journey_id", progress=False)
        port = free_port()
        worker = start_worker_process(path, broker.bootstrap, state, app_id, 1.0, tmp_path / "w1.log",
                                      extra=["--web-port", str(port), "--metrics-interval", "1"])
        try:
            wait_for(lambda: _readyz(port)[0] == 200, 60, "the worker ready")
            time.sleep(3)                                 # a few transactions, and the lineage barrier, written
            broker.stop()                                 # memory storage: its data goes with it
            time.sleep(3)
            broker = EmbeddedBroker(port=broker.port).start()
            setup_stream(tmp_path, broker.bootstrap, name)
            replay(broker.bootstrap, cfg.stream.input_topic, events[N // 2:], "journey_id", progress=False)
        finally:
            code, log, errors = exit_and_errors(worker, tmp_path / "w1.log")
        assert code == 70, log[-4000:]
        assert "Traceback" not in log and "Exception in thread" not in log, log[-4000:]
        assert len(errors) == 1, errors
        assert "the Kafka loop stopped (fatal Kafka client error " in errors[0] \
            and "exiting with status 70" in errors[0], errors[0]

        # what the supervisor's restart finds: the broker lost the partitions' state, the state directory did not
        port = free_port()
        worker = start_worker_process(path, broker.bootstrap, state, app_id, 1.0, tmp_path / "w2.log",
                                      extra=["--web-port", str(port), "--metrics-interval", "1"])
        try:
            def halted():
                code, body = _readyz(port)
                return body if code == 503 and len(body.get("halted", {})) == 4 else None
            body = wait_for(halted, 90, "the restarted worker's partitions halted")
            assert worker.poll() is None                  # up, not ready: /readyz says why
        finally:
            stop_worker_process(worker)
        assert {h["reason"] for h in body["halted"].values()} == {"state_topic_reset"}, body
    finally:
        broker.stop()


def test_a_session_timeout_the_broker_refuses_stops_the_worker_naming_the_setting(tmp_path, secret_env,
                                                                                   apache_kafka_tools):
    """Apache Kafka at its default ``group.min.session.timeout.ms`` (6 s) refuses a worker's 2 s: the worker stops
    at its first group join (exit 70, one ERROR line naming the error and the setting), never retrying for ever."""
    with apache_kafka_tools(server_properties={"group.min.session.timeout.ms": "6000"}) as kafka:
        path, cfg = setup_stream(tmp_path, kafka.bootstrap, "refused")
        replay(kafka.bootstrap, cfg.stream.input_topic, synthetic_fares(50, seed=3), "journey_id", progress=False)
        worker = start_worker_process(path, kafka.bootstrap, tmp_path / "state", "refused-app", 1.0,
                                      tmp_path / "w.log", extra=["--session-timeout", "2"])
        code, log, errors = exit_and_errors(worker, tmp_path / "w.log")
    assert code == 70, log[-4000:]
    assert len(errors) == 1 and "INVALID_SESSION_TIMEOUT" in errors[0] and "--session-timeout" in errors[0] \
        and "exiting with status 70" in errors[0], errors
    assert "Traceback" not in log, log[-4000:]
