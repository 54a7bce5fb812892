"""The faust app: lifecycle, web endpoints, timers and signals for the worker's Kafka loop.

faust runs the process (signals, graceful stop, the web server on ``--web-port`` with ``/metrics``, ``/livez`` and
``/readyz``); the consume -> process -> produce path is :class:`stream_anon.kafka.loop.KafkaLoop`, one thread with
confluent-kafka batches and one transaction per partition batch. faust's own per-message consumer is not used
(its two asyncio tasks per message capped the worker at ~12,000 events/s before any processing).

Run: ``STREAM_ANON_SECRET=... stream-anon worker --config configs/oyster.toml --broker HOST:PORT``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

import faust
from confluent_kafka import KafkaError, KafkaException
from faust.app.base import BootStrategy
from mode import Service

from stream_anon import crypto, logsetup
from stream_anon.version import __version__
from stream_anon import connection as kafka_connection
from stream_anon.connection import KafkaConnection, as_connection, broker_unreachable
from stream_anon.config import load_config
from stream_anon.helptext import with_defaults
from stream_anon.worker.core import WorkerCore
from stream_anon.kafka.loop import COMPRESSIONS, DEFAULT_COMPRESSION, REFUSED_SETTINGS, SESSION_TIMEOUT_S, KafkaLoop, \
    group_timeouts
from stream_anon.worker.state import MIN_PART_BYTES, PART_MAX_BYTES, checked_part_bytes
from stream_anon.validation import ALLOW_OUTSIDE_FLAG, ALLOW_OUTSIDE_HELP
from stream_anon.kafka.observe import prometheus_text, readiness

log = logging.getLogger("stream_anon.worker")
BROKER_PROBE_S = 15.0          # the worker's wait for its broker at start (--broker-wait)
WEB_PORT_ENV = "STREAM_ANON_WEB_PORT"     # the default of --web-port (the image sets it for its HEALTHCHECK)


class _NoFaustKafka(BootStrategy):
    """faust without its Kafka clients (consumer, leader assignor, conductor, tables, producer): the loop consumes
    and produces with its own clients."""
    enable_kafka = False
    enable_kafka_consumer = False
    enable_kafka_producer = False


class WorkerApp(faust.App):
    # a class attribute: passed to the constructor it would only become a setting, and faust would still start
    # its consumer, which joins a consumer group of its own and holds the worker's stop for its session timeout
    BootStrategy = _NoFaustKafka
    # faust's service lines (Starting..., Stopping...) are the framework's: shown at DEBUG like the rest of faust
    logger = logging.getLogger("faust.app.stream_anon")

    stream_anon_core: WorkerCore          # set by make_app
    stream_anon_loop: KafkaLoop

    async def _wait_for_table_recovery_completed(self) -> bool:
        return False          # no faust tables: the partitions' state lives in the worker's state topic


def make_app(config, bootstrap: str | KafkaConnection, state_dir, app_id: str | None = None,
             secret: bytes | None = None, batch_max: int = 10000, batch_within_s: float = 0.5,
             metrics_interval_s: float = 5.0, flush_when_idle_s: float | None = None, web_port: int | None = None,
             raw_deadletters: bool = False, accept_input_reset: bool = False, client_config: dict | None = None,
             compression: str = DEFAULT_COMPRESSION, aggregates_process: str = "auto",
             accept_config_change: bool = False, new_lineage: bool = False, previous_secret: bytes | None = None,
             state_part_bytes: int = PART_MAX_BYTES, session_timeout_s: float = SESSION_TIMEOUT_S):
    """The faust app of one worker and its :class:`KafkaLoop` (``app.stream_anon_loop``). ``previous_secret``:
    the secret before a key rotation (``--rotate-key``): states written with it are resumed under ``secret``."""
    app_id = app_id or f"stream-anon-{config.stream.name}"
    worker_secret = secret if secret is not None else crypto.load_secret()   # a name of its own: bytes in on_start
    state_dir = Path(state_dir)
    (state_dir / app_id).mkdir(parents=True, exist_ok=True)
    app = WorkerApp(
        f"{app_id}.process",           # faust's own id: the consumer group of the loop is app_id
        **as_connection(bootstrap).faust_settings(),     # broker URL and, for TLS/SASL, broker_credentials
        store="memory://",
        datadir=str(state_dir / app_id / "faust-data"),
        web_enabled=web_port is not None,
        web_port=web_port or 6066,
        web_bind="127.0.0.1",
        Monitor="stream_anon.kafka.lean_monitor:LeanMonitor",
    )
    core = WorkerCore(config, app_id, worker_secret, flush_when_idle_s=flush_when_idle_s,
                      raw_deadletters=raw_deadletters, aggregates_process=use_aggregates_process(aggregates_process),
                      aggregates_setup=tune_gc)
    loop = KafkaLoop(core, {**as_connection(bootstrap).confluent(), **(client_config or {})}, batch_max=batch_max,
                     batch_within_s=batch_within_s, metrics_interval_s=metrics_interval_s,
                     accept_input_reset=accept_input_reset, cache_dir=state_dir, compression=compression,
                     accept_config_change=accept_config_change, new_lineage=new_lineage,
                     rotate_from=crypto.key_id(previous_secret) if previous_secret else None,
                     state_part_bytes=state_part_bytes, session_timeout_s=session_timeout_s)
    app.stream_anon_core, app.stream_anon_loop = core, loop

    @app.service
    class LoopService(Service):
        """Starts the loop's thread with the app; on stop (SIGTERM/SIGINT) lets it finish or abort the batch in
        flight (no partial commit) and leave the consumer group."""
        logger = logging.getLogger("mode.services.stream_anon")

        async def on_start(self) -> None:
            log.info("started: stream-anon %s, stream %s, app id %s, input %s, key id %s, web %s", __version__,
                     config.stream.name, app_id, config.stream.input_topic, crypto.key_id(worker_secret),
                     f"127.0.0.1:{web_port}" if web_port is not None else "off")
            self._thread = threading.Thread(target=loop.run, name="kafka-loop", daemon=True)
            self._thread.start()

        async def on_stop(self) -> None:
            log.info("stopping: finishing or aborting the batch in flight, leaving the consumer group")
            loop.stop()
            await self.loop.run_in_executor(None, self._thread.join, 60)
            log.info("stopped: %d transactions committed, %d aborted", loop.counters["transactions"],
                     loop.counters["aborted"])

    @app.timer(1.0)
    async def watch_loop():
        if loop.stopped.is_set() and not loop.stopping.is_set():
            log.error("the Kafka loop stopped (%s): exiting with status %d; a restarted worker recovers its "
                      "partitions from Kafka, or halts them with an alert when the broker lost their state "
                      "(docs/operations.md, Faults and what the worker does)", loop_failure(loop.error), LOOP_FAILED)
            os.kill(os.getpid(), signal.SIGTERM)

    @app.page("/metrics")
    async def metrics(web, request):
        return web.bytes(prometheus_text(core, loop), content_type="text/plain; version=0.0.4")

    @app.page("/livez")
    async def livez(web, request):
        alive = not loop.stopped.is_set()
        return web.json({"alive": alive}, status=200 if alive else 503)

    @app.page("/readyz")
    async def readyz(web, request):
        ok, detail = readiness(loop)
        return web.json({"ready": ok, **detail}, status=200 if ok else 503)

    return app


class _Worker(faust.Worker):
    async def _sentinel_task(self) -> None:
        # mode's worker lets the event loop run one more second before closing it; by then LoopService.on_stop has
        # joined the loop's thread (batch committed or aborted, consumer closed, producers flushed): a stop need not
        # wait that second
        await asyncio.sleep(0.05)


LOOP_FAILED = 70            # the worker's exit status when its loop failed (EX_SOFTWARE; docs/operations.md)


def loop_failure(exc) -> str:
    """What ended the loop, in a few words: a Kafka client's error by its code (fatal or not), else the exception."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(err, KafkaError):
        hint = REFUSED_SETTINGS.get(err.code())
        return f"{'fatal ' if err.fatal() else ''}Kafka client error {err.name()}: {err.str()}" + \
            (f": {hint}" if hint else "")
    return repr(exc)


def _setup_logging(level: str, fmt: str = "text") -> None:
    logsetup.setup_logging(level, fmt)


GC_GEN0_THRESHOLD = 50_000     # allocations between young-generation collections (CPython's default: 700)


def tune_gc() -> None:
    """Fewer, cheaper cyclic garbage collections in the worker. A batch allocates a dict or list per event; at
    CPython's default (a young collection every 700 allocations, older ones every 10 of those) the collector ran
    thousands of times per batch and re-scanned everything alive. The objects of the start (modules, configuration,
    faust) are frozen out of the collector's generations, and a young collection waits for 50,000 allocations: the
    worker's data is mostly acyclic and freed by reference counting, so the memory held in cycles in between is
    small."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)


def run_worker(config, bootstrap: str | KafkaConnection, state_dir, app_id: str | None = None,
               secret: bytes | None = None, loglevel: str = "warning", **app_kwargs):
    """Run the worker in this process until SIGTERM/SIGINT (or until its loop fails: then exit code 70)."""
    app = make_app(config, bootstrap, state_dir, app_id=app_id, secret=secret, **app_kwargs)
    tune_gc()
    worker = _Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    if not worker.stdout.isatty():
        worker.spinner = None          # its cursor controls (\b, ESC[?25h) are for terminals only
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    if app.stream_anon_loop.error is not None:
        raise SystemExit(LOOP_FAILED)
    return app


AGGREGATES_PROCESS = ("auto", "on", "off")


def use_aggregates_process(choice: str) -> bool:
    """Whether the worker releases its DP aggregates in a second process (stream_anon.worker.aggregates_process):
    ``auto`` when the machine has a second CPU for it (on one CPU the process would only add its messages' cost)."""
    if choice not in AGGREGATES_PROCESS:
        raise ValueError(f"aggregates_process {choice!r}: one of {', '.join(AGGREGATES_PROCESS)}")
    return choice == "on" or (choice == "auto" and (os.cpu_count() or 1) >= 2)


SESSION_TIMEOUT_ENV = "STREAM_ANON_SESSION_TIMEOUT_S"


def _port(text: str) -> int:
    """A TCP port number (of ``--web-port`` or, as its default, ``$STREAM_ANON_WEB_PORT``)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: not a port number (also from {WEB_PORT_ENV})")
    return port


def _session_timeout(text: str) -> float:
    try:
        seconds = float(text)
        group_timeouts(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds between 1 and 300") from None
    return seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stream-anon worker", description="Run the anonymization worker.")
    p.add_argument("--config", required=True, help="stream configuration (TOML)")
    kafka_connection.add_arguments(p)
    p.add_argument("--state-dir", default="state", help="local cache of the committed state headers (detects a "
                   "broker reset; default: state)")
    p.add_argument("--app-id", default=None, help="app id: consumer group, state topic <ID>-state, transactional "
                   "ids (default: stream-anon-<stream>)")
    p.add_argument("--batch-max", type=int, default=10000,
                   help="most input messages consumed in one batch (default: 10000)")
    p.add_argument("--batch-within", type=float, default=0.5, help="seconds to wait to fill a batch")
    p.add_argument("--metrics-interval", type=float, default=5.0,
                   help="seconds between throughput metrics on anon.metrics and consumer lag reads (default: 5)")
    p.add_argument("--flush-when-idle", type=float, default=None,
                   help="flush a partition's engine after this many seconds without input (end of a replay/demo; "
                        "default: never, a window closes on later input)")
    p.add_argument("--no-create-topics", action="store_true", help="do not apply topics/*.toml at start")
    p.add_argument("--deadletter-raw-payload", action="store_true",
                   help="keep every field of a dead-lettered event (identifiers still redacted) and payloads that "
                        "are not JSON objects verbatim (they may hold identifiers); by default a dead letter holds "
                        "only what the output contract allows (docs/privacy.md, Dead letters)")
    # argparse converts a string default with the type: a bad $STREAM_ANON_WEB_PORT is refused as --web-port would be
    p.add_argument("--web-port", type=_port, default=os.environ.get(WEB_PORT_ENV) or None,
                   help="serve /metrics (Prometheus), /livez and /readyz on 127.0.0.1:PORT (default: "
                        f"${WEB_PORT_ENV}, which the image sets for its HEALTHCHECK; unset: no web server)")
    p.add_argument("--accept-input-reset", action="store_true",
                   help="operator decision: a partition halted because its input topic was re-created resumes "
                        "its state (signatures, DP ledger) from offset 0 of the new topic")
    p.add_argument("--accept-config-change", action="store_true",
                   help="operator decision: partitions whose state was written under other guarantee settings (k, "
                        "criteria, windows, quasi-identifiers, hierarchies, domains, DP budget and aggregates) resume "
                        "under the new ones; every published class is retired from reuse, buffered records are "
                        "recoded, a DP raise applies from the next period, and the change is written into the next "
                        "release manifest (m, the DP period and unit never change in place)")
    p.add_argument("--new-lineage", action="store_true",
                   help="operator decision: partitions halted because their state was lost (lineage_lost, "
                        "state_topic_reset) start empty in a new lineage of the stream: new release ids, a fresh DP "
                        "budget, written into the manifests (lineage_started); without a loss it does nothing")
    p.add_argument("--carry-budget", metavar="ROWS.jsonl", default=None,
                   help="with --new-lineage after a total loss: the anon.aggregates rows a consumer kept (JSONL); "
                        "each period's largest ledger_epsilon_spent is charged to the new lineage's ledgers, so a "
                        "period is never spent twice (docs/operations.md, Lineage)")
    p.add_argument("--rotate-key", action="store_true",
                   help="operator decision: partitions whose state was written with the previous secret "
                        "(STREAM_ANON_PREVIOUS_SECRET or STREAM_ANON_PREVIOUS_SECRET_FILE, read only) resume under "
                        "the current one, at a point where nothing is buffered (and at a DP period boundary); the "
                        "next manifest says key_rotated")
    p.add_argument("--aggregates-process", choices=AGGREGATES_PROCESS, default="auto",
                   help="release the DP aggregates in a second process, beside the engine (auto: when the machine "
                   "has 2 or more CPUs; streams without [dp] never start it)")
    p.add_argument("--compression", choices=COMPRESSIONS, default=DEFAULT_COMPRESSION,
                   help="compression of the batches the worker writes: output, dead letters, state (default: "
                        f"{DEFAULT_COMPRESSION})")
    p.add_argument(ALLOW_OUTSIDE_FLAG, action="store_true", help=ALLOW_OUTSIDE_HELP)
    p.add_argument("--state-part-bytes", type=int, default=PART_MAX_BYTES,
                   help="largest value written to the state topic: a longer state record is written as several "
                        f"(between {MIN_PART_BYTES} and the default {PART_MAX_BYTES}; lower it for a cluster whose "
                        "max.message.bytes is lower)")
    # --timeout: the name the other commands give the same wait
    p.add_argument("--broker-wait", "--timeout", dest="broker_wait", type=kafka_connection.timeout_seconds,
                   default=BROKER_PROBE_S, metavar="SECONDS",
                   help="seconds to wait at start for the broker to answer a metadata request; no answer: one line "
                        f"naming the broker and exit 2 (default: {BROKER_PROBE_S:g})")
    p.add_argument("--session-timeout", type=_session_timeout, metavar="SECONDS",
                   default=os.environ.get(SESSION_TIMEOUT_ENV) or str(SESSION_TIMEOUT_S),
                   help="consumer group session timeout: a worker silent this long loses its partitions (default: "
                        f"{SESSION_TIMEOUT_S:g}, or {SESSION_TIMEOUT_ENV}; Apache Kafka refuses less than its "
                        "group.min.session.timeout.ms, 6 s by default)")
    p.add_argument("--loglevel", default="info",
                   help="log level: debug (adds the Kafka and faust clients' internals), info (default: the "
                        "worker's lifecycle lines), warning, error")
    logsetup.add_arguments(p)
    return with_defaults(p)


def worker_main(argv=None) -> int:
    """``stream-anon worker --config FILE --broker HOST:PORT [--state-dir state] [--app-id ID]``."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.loglevel, args.log_format)
    try:
        secret = crypto.load_secret()
        previous = crypto.load_secret(crypto.PREVIOUS_SECRET_ENV, crypto.PREVIOUS_SECRET_FILE_ENV) \
            if args.rotate_key else None
    except crypto.SecretError as exc:
        print(f"stream-anon worker: {exc}", file=sys.stderr)
        return 2
    if previous is not None and crypto.key_id(previous) == crypto.key_id(secret):
        print("stream-anon worker: --rotate-key: the previous secret is the current one", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config, args.allow_outside_paths)
    except (OSError, ValueError) as exc:     # ConfigError is a ValueError
        print(f"stream-anon worker: {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.carry_budget:
        from stream_anon.dp.carry import read_carried, with_carried
        try:
            config = with_carried(config, read_carried(args.carry_budget))
        except ValueError as exc:
            print(f"stream-anon worker: {exc}", file=sys.stderr)
            return 2
    try:
        checked_part_bytes(args.state_part_bytes)
    except ValueError as exc:
        print(f"stream-anon worker: {exc}", file=sys.stderr)
        return 2
    try:
        conn = kafka_connection.from_args(args, config_path=args.config)
    except kafka_connection.ConnectionSettingsError as exc:
        print(f"stream-anon worker: {exc}", file=sys.stderr)
        return 2
    log.info("Kafka connection: %s", conn.describe())
    unreachable = broker_unreachable(conn, args.broker_wait)
    if unreachable:
        print(f"stream-anon worker: {unreachable}", file=sys.stderr)
        return 2
    if not args.no_create_topics:
        from stream_anon.kafka.topics import TopicMismatchWarning, ensure_stream_topics
        # the input topic gets the stream's declared partition count ([stream] partitions), else its definition's;
        # a partition mismatch is logged (as a WARNING line), not printed a second time as a Python warning
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TopicMismatchWarning)
            ensure_stream_topics(conn, config)
    run_worker(config, conn, args.state_dir, app_id=args.app_id, secret=secret, loglevel=args.loglevel,
               batch_max=args.batch_max, batch_within_s=args.batch_within, metrics_interval_s=args.metrics_interval,
               flush_when_idle_s=args.flush_when_idle, raw_deadletters=args.deadletter_raw_payload,
               web_port=args.web_port, accept_input_reset=args.accept_input_reset, compression=args.compression,
               accept_config_change=args.accept_config_change, new_lineage=args.new_lineage,
               previous_secret=previous, aggregates_process=args.aggregates_process,
               state_part_bytes=args.state_part_bytes, session_timeout_s=args.session_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
