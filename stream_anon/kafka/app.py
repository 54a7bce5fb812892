"""The faust app: a thin adapter between Kafka and :class:`stream_anon.kafka.core.WorkerCore`.

One agent consumes the stream's input topic in batches (``stream.noack_take``) and hands each batch to the core;
it acknowledges the batch to faust only after the core has delivered its outputs and written its checkpoints
(faust commits only acked offsets). Timers publish throughput metrics and flush idle partitions (demo/replay).

Run: ``STREAM_ANON_SECRET=... stream-anon worker --config configs/oyster.toml --broker HOST:PORT``.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import faust

from stream_anon import crypto, logsetup
from stream_anon import connection as kafka_connection
from stream_anon.connection import as_connection
from stream_anon.config import load_config
from stream_anon.kafka import aggregates
from stream_anon.kafka.core import TOPICS, WorkerCore, dumps

log = logging.getLogger("stream_anon.worker")


def make_app(config, bootstrap: str, state_dir, app_id: str | None = None, secret: bytes | None = None,
             batch_max: int = 10000, batch_within_s: float = 0.5, metrics_interval_s: float = 5.0,
             flush_when_idle_s: float | None = None, web_port: int | None = None, raw_deadletters: bool = False):
    """A faust app with one agent on ``config.stream.input_topic`` (see the module docstring)."""
    app_id = app_id or f"stream-anon-{config.stream.name}"
    secret = secret if secret is not None else crypto.load_secret()
    state_dir = Path(state_dir)
    (state_dir / app_id).mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        **as_connection(bootstrap).faust_settings(),     # broker URL and, for TLS/SASL, broker_credentials
        store="memory://",
        datadir=str(state_dir / app_id / "faust-data"),
        web_enabled=web_port is not None,
        web_port=web_port or 6066,
        web_bind="127.0.0.1",
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=6.0,
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger=0.005,
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=8 * 1024 * 1024,
        topic_partitions=4,
        topic_replication_factor=1,
        stream_wait_empty=True,
        Monitor="stream_anon.kafka.lean_monitor:LeanMonitor",   # no per-message statistics (see that module)
        table_standby_replicas=0,
    )
    in_topic = app.topic(config.stream.input_topic, key_type=bytes, value_type=bytes,
                         key_serializer="raw", value_serializer="raw")

    async def send(topic: str, key: bytes, value: bytes):
        return await app.producer.send(topic, key, value, None, None, None)

    core = WorkerCore(config, state_dir, app_id, secret, send, flush_when_idle_s=flush_when_idle_s,
                      raw_deadletters=raw_deadletters)
    app.stream_anon_core = core  # for inspection

    @app.agent(in_topic, name=f"anonymize-{config.stream.name}", concurrency=1)
    async def anonymize(stream):
        async for events in stream.noack_take(batch_max, within=batch_within_s):
            msgs = [(e.message.partition, e.message.offset, e.message.value) for e in events]
            try:
                await core.process_batch(msgs)
            except Exception:
                # The engines may now hold state that is neither delivered nor checkpointed, and the batch is
                # unacked: a restarted agent in this process would never see it again. Exit hard (nothing of
                # this batch is acked or committed); the restarted worker resumes from the checkpoints.
                log.exception("batch failed: exiting so that a restart resumes from the last checkpoints")
                logging.shutdown()
                os._exit(70)
            # only now: every output delivered, every checkpoint on disk -> let faust commit these offsets
            for e in events:
                await stream.ack(e)

    @app.on_partitions_revoked.connect
    async def on_revoked(app_, revoked, **kwargs):
        core.drop([tp.partition for tp in revoked if tp.topic == config.stream.input_topic])

    @app.on_partitions_assigned.connect
    async def on_assigned(app_, assigned, **kwargs):
        core.assign([tp.partition for tp in assigned if tp.topic == config.stream.input_topic])

    @app.timer(metrics_interval_s)
    async def metrics():
        positions, highwaters = {}, {}
        try:
            for tp in app.consumer.assignment():
                if tp.topic != config.stream.input_topic:
                    continue
                highwaters[tp.partition] = app.consumer.highwater(tp)
                ps = core.parts.get(tp.partition)
                positions[tp.partition] = (ps.offset + 1) if ps else None
        except Exception:  # pragma: no cover - metrics never break processing
            pass
        doc = core.throughput_metric(positions, highwaters)
        try:
            await (await send(TOPICS.metrics, core.stream.encode(), dumps(doc)))
        except Exception as exc:  # pragma: no cover
            log.warning("metrics not delivered: %r", exc)

    if flush_when_idle_s:
        @app.timer(max(0.2, min(1.0, flush_when_idle_s / 2)))
        async def idle_flush():
            await core.flush_idle()

    return app


def _setup_logging(level: str, fmt: str = "text") -> None:
    logsetup.setup_logging(level, fmt)


def run_worker(config, bootstrap: str, state_dir, stop_when=None, app_id: str | None = None,
               secret: bytes | None = None, loglevel: str = "warning", check_interval_s: float = 0.5, **app_kwargs):
    """Run a faust worker in this process until SIGTERM/SIGINT or ``stop_when()`` returns true."""
    app = make_app(config, bootstrap, state_dir, app_id=app_id, secret=secret, **app_kwargs)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    if stop_when is not None:
        @app.timer(check_interval_s)
        async def _stop_check():
            if stop_when():
                schedule = getattr(worker, "_schedule_shutdown", None)
                if schedule is not None:
                    schedule(signal.SIGTERM)
                else:  # pragma: no cover
                    os.kill(os.getpid(), signal.SIGTERM)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    return app



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stream-anon worker", description="Run the faust anonymization worker.")
    p.add_argument("--config", required=True, help="stream configuration (TOML)")
    kafka_connection.add_arguments(p)
    p.add_argument("--state-dir", default="state", help="checkpoint directory (default: state)")
    p.add_argument("--app-id", default=None, help="faust app id / consumer group (default: stream-anon-<stream>)")
    p.add_argument("--batch-max", type=int, default=10000)
    p.add_argument("--batch-within", type=float, default=0.5, help="seconds to wait to fill a batch")
    p.add_argument("--metrics-interval", type=float, default=5.0)
    p.add_argument("--flush-when-idle", type=float, default=None,
                   help="flush a partition's engine after this many seconds without input (end of a replay/demo)")
    p.add_argument("--no-create-topics", action="store_true", help="do not apply topics/*.toml at start")
    p.add_argument("--deadletter-raw-payload", action="store_true",
                   help="keep payloads that are not JSON objects verbatim in dead letters (they may hold "
                        "identifiers; by default only their size and digest are kept)")
    p.add_argument("--loglevel", default="warning")
    logsetup.add_arguments(p)
    return p


def worker_main(argv=None) -> int:
    """``stream-anon worker --config FILE --broker HOST:PORT [--state-dir state] [--app-id ID]``."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.loglevel, args.log_format)
    try:
        secret = crypto.load_secret()
    except crypto.SecretError as exc:
        print(f"stream-anon worker: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:     # ConfigError is a ValueError
        print(f"stream-anon worker: {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        conn = kafka_connection.from_args(args, config_path=args.config)
    except kafka_connection.ConnectionSettingsError as exc:
        print(f"stream-anon worker: {exc}", file=sys.stderr)
        return 2
    log.info("Kafka connection: %s", conn.describe())
    if not args.no_create_topics:
        from stream_anon.kafka.topics import ensure_stream_topics
        # the input topic gets the stream's declared partition count ([stream] partitions), else its definition's
        ensure_stream_topics(conn, config)
    run_worker(config, conn, args.state_dir, app_id=args.app_id, secret=secret, loglevel=args.loglevel,
               batch_max=args.batch_max, batch_within_s=args.batch_within, metrics_interval_s=args.metrics_interval,
               flush_when_idle_s=args.flush_when_idle, raw_deadletters=args.deadletter_raw_payload)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
