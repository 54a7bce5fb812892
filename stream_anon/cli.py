"""``stream-anon`` command line: demo, worker, replay, topics, check, audit, report, aggregates, calibrate,
evaluate."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from stream_anon import connection as kafka_connection
from stream_anon import logsetup
from stream_anon.cli_kafka import BrokerUnreachable, add_connection_arguments, config_file, connect
from stream_anon.cli_replay import cmd_replay
from stream_anon.helptext import with_defaults
from stream_anon.contract import resolve_config
from stream_anon.extras import missing_extra
from stream_anon.validation import ALLOW_OUTSIDE_FLAG, ALLOW_OUTSIDE_HELP

DATASET_CHOICES = ("oyster", "citibike", "obd2", "oyster-cards")
CONFIG_HELP = "stream config: a TOML file, or the name of a bundled config (oyster, citibike, obd2, oyster-cards)"


def _cmd_demo(args) -> int:
    from stream_anon.demo import run_demo
    return run_demo(args.dataset, events=args.events, k=args.k, report_path=args.report, timeout_s=args.timeout,
                    dp=args.dp, m=args.m)


def _cmd_broker(args) -> int:
    from stream_anon.broker import serve
    return serve(port=args.port, host=args.host)


def _cmd_topics_apply(args) -> int:
    from stream_anon.config import load_config
    from stream_anon.kafka.topics import apply_declared_retention, apply_plan, apply_topics, declared_retention, \
        load_topic_definitions
    configs = [config_file(c) for c in args.config or ()]
    if args.app_id is not None and len(configs) != 1:
        print(f"stream-anon topics apply: --app-id {args.app_id}: the state topic belongs to one stream; give one "
              "--config", file=sys.stderr)
        return 2
    # with --config: the shared topics and those streams' (input topic with the declared partition count and
    # retention: an existing input topic's retention.ms is set to [stream] input_retention_s)
    streams = [load_config(path, args.allow_outside_paths) for path in configs]
    conn = connect(args, config_path=configs[0] if len(configs) == 1 else None)
    defs = apply_plan(load_topic_definitions(args.dir), streams, app_id=args.app_id)
    result = apply_topics(conn, defs)
    for name, status in sorted(result.items()):
        print(f"{name}: {status}")
    for name, status in apply_declared_retention(conn, declared_retention(streams)).items():
        print(f"{name}: {status}")
    return 0


def _cmd_monitoring(args) -> int:
    from stream_anon.monitoring import paths
    for name, path in paths().items():
        print(f"{name}: {path}")
    return 0


def _cmd_topics_list(args) -> int:
    from stream_anon.kafka.topics import load_topic_definitions
    for t in sorted(load_topic_definitions(args.dir).values(), key=lambda t: t.name):
        value = f"schema {t.value_schema.name}" if t.value_schema else t.value
        print(f"{t.name}\tpartitions={t.partitions}\tretention_ms={t.retention_ms}\t{value}")
    return 0


def audited_configs(args) -> tuple[Path, list[Path]]:
    """The stream config of ``audit`` / ``report`` and its ``--earlier-config`` files, each refused as the worker
    refuses it, before any broker is asked: the worker's validation (stream_anon.config.load_config, the one place
    a config is judged valid) runs first, then the audit's own reading, which stays apart from the engine's code
    (stream_anon.audit imports nothing of config) and so cannot judge validity itself. Before, the audit accepted
    k = 0 or a NaN window and judged nothing."""
    from stream_anon.audit import AuditConfig
    from stream_anon.config import ConfigError, load_config
    config_path = config_file(args.config)
    earlier = [config_file(p) for p in args.earlier_config]
    for given, path in zip((args.config, *args.earlier_config), (config_path, *earlier)):
        try:
            load_config(path, args.allow_outside_paths)
            AuditConfig.from_toml(path, args.allow_outside_paths)
        except (OSError, ValueError) as exc:      # ConfigError is a ValueError; named with the file, as the worker's
            raise ConfigError(f"{given}: {exc}") from exc
    return config_path, earlier


def _cmd_audit(args) -> int:
    from stream_anon import crypto
    from stream_anon.audit.kafka_source import audit_from_kafka
    config_path, earlier = audited_configs(args)
    secret = crypto.load_secret()
    env = args.previous_secret_env
    previous = [crypto.load_secret(env, env + "_FILE")] if os.environ.get(env) or os.environ.get(env + "_FILE") \
        else []
    conn = connect(args, config_path=config_path)
    report = audit_from_kafka(conn, config_path, secret, raw_topic=args.raw_topic,
                              idle_s=args.idle, health=True, max_prosecutor_risk=args.max_prosecutor_risk,
                              previous_secrets=previous, allow_outside_paths=args.allow_outside_paths,
                              earlier_configs=earlier)
    print(report.format_text())
    if args.report:
        Path(args.report).write_text(json.dumps(report.to_dict(), indent=2))
    return audit_exit_status(report, args.fail_on_alert, args.fail_on_open)


def _cmd_check(args) -> int:
    from stream_anon import preflight
    config_path = resolve_config(args.config)
    # --timeout: where the connection options give one (the bound of every broker request), else the check's own
    result = preflight.run(config_path, kafka_connection.from_args(args, config_path=config_path),
                           app_id=args.app_id, allow_outside_paths=args.allow_outside_paths, named=args.config,
                           timeout_s=getattr(args, "timeout", None) or preflight.TIMEOUT_S)
    for line in result.lines():
        print(line)
    return result.exit_status


def _cmd_report(args) -> int:
    from stream_anon import crypto
    from stream_anon.report import report_from_kafka, write
    config_path, earlier = audited_configs(args)
    secret = crypto.load_secret()
    conn = connect(args, config_path=config_path)
    report = report_from_kafka(conn, config_path, secret, raw_topic=args.raw_topic, idle_s=args.idle,
                               allow_outside_paths=args.allow_outside_paths, earlier_configs=earlier)
    write(report, args.out, args.json)
    s = report.summary
    print(f"stream-anon report: wrote {args.out} ({len(report.html):,} bytes); audit {s['verdict']}"
          + (f": {s['verdict_reason']}" if s.get("verdict_reason") else "")
          + (f"; wrote {args.json}" if args.json else ""))
    return 0


def _risk_limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a number in (0, 1], got {text!r}")
    return value


def audit_exit_status(report, fail_on_alert: bool = False, fail_on_open: bool = False) -> int:
    """0 PASSED, 1 FAILED (a check failed), 4 NOT PASSED (nothing published, or more suppressed than
    max_suppression_ratio), 3 alerts with ``--fail-on-alert``, 5 events in windows still open with
    ``--fail-on-open`` (docs/operations.md, Audit)."""
    if report.verdict == "FAILED" or (not report.passed and report.verdict != "NOT PASSED"):
        return 1
    if report.verdict == "NOT PASSED":
        print(f"stream-anon audit: NOT PASSED: {report.verdict_reason}", file=sys.stderr)
        return 4
    alerts = (report.health or {}).get("alerts", {})
    if fail_on_alert and alerts:
        print("stream-anon audit: --fail-on-alert: alerts on anon.metrics: "
              + ", ".join(f"{k} x{v}" for k, v in sorted(alerts.items())), file=sys.stderr)
        return 3
    n_open = (report.summary or {}).get("open") or 0
    if fail_on_open and n_open:
        print(f"stream-anon audit: --fail-on-open: {n_open} events in windows not released yet (oldest "
              f"{report.summary.get('open_oldest')})", file=sys.stderr)
        return 5
    return 0


def _cmd_aggregates(args) -> int:
    from stream_anon.config import load_config
    from stream_anon.kafka.aggregates_view import run_view
    if not 0 < args.level < 1:
        print(f"stream-anon aggregates: --level must be in (0, 1), got {args.level}", file=sys.stderr)
        return 2
    config_path = config_file(args.config)
    config = load_config(config_path, args.allow_outside_paths)
    if config.dp is None:
        print(f"stream-anon aggregates: {args.config}: the stream has no [dp] / [[aggregates]] tables",
              file=sys.stderr)
        return 2
    conn = connect(args, config_path=config_path)
    counts = run_view(conn, config.stream.name, fmt=args.format, out_path=args.out, level=args.level,
                      incomplete=args.incomplete, idle_s=args.idle)
    print(f"stream-anon aggregates: {counts['rows_read']:,} partition rows of {len(counts['partitions'])} "
          f"partitions -> {counts['merged_rows']:,} merged rows"
          + (f" ({counts['incomplete_held_back']:,} of windows not closed by every partition held back; "
             "--incomplete shows them)" if counts["incomplete_held_back"] else ""), file=sys.stderr)
    return 0


def _cmd_calibrate(args) -> int:
    from stream_anon.calibrate import calibrate
    from stream_anon.datasets import load_events
    from stream_anon.kafka.replay import read_jsonl
    source = resolve_config(args.config)
    if args.dataset:
        events = load_events(args.dataset, limit=args.events, full=args.full)
    elif not args.file or not Path(args.file).exists():
        raise FileNotFoundError(f"calibration sample not found: {args.file}")
    else:
        from stream_anon.config import load_config
        spec = load_config(source, args.allow_outside_paths).input
        if spec.legacy:
            events = read_jsonl(args.file)
        else:   # a mapped [input]: the file read through the mapping (records it rejects do not calibrate)
            from stream_anon.inputs import decode_file
            # a fixed key for the ids of an event_key: the suggestions' runs are the same every time
            events, rejected = decode_file(args.file, spec, framing=args.framing, secret=b"stream-anon calibrate")
            if rejected:
                print(f"calibrate: {len(rejected)} records rejected by the mapping, e.g. {rejected[0][2]}",
                      file=sys.stderr)
    bounds = calibrate(source, events, args.out, margin=args.margin, allow_outside_paths=args.allow_outside_paths)
    for name, (lo, hi) in bounds.items():
        print(f"{name}: [{lo}, {hi}]")
    if args.suggest or args.apply_suggestions:
        _suggest(args.out, events, args.apply_suggestions, args.max_delay_limit_s, args.train_share)
    print(f"wrote {args.out}")
    return 0


def _suggest(out, events, write: bool, max_delay_limit_s: float | None, train_share: float) -> None:
    """Settings suggested from the sample (stream_anon.suggest), with their figures and the search's candidates;
    written into ``out`` when asked (the bounds just calibrated stay)."""
    from stream_anon.calibrate import write_suggestions
    from stream_anon.config import load_config
    from stream_anon.suggest import apply, suggest, search_report

    out = Path(out)
    suggestions, result = suggest(load_config(out), events, max_delay_limit_s=max_delay_limit_s,
                                  train_share=train_share)
    for line in search_report(suggestions, result):
        print(line)
    if write:
        write_suggestions(out, lambda doc: apply(doc, suggestions))
        load_config(out)


def _cmd_evaluate(args) -> int:
    from stream_anon.evaluate import BASELINES, run
    from stream_anon.strategies import STRATEGIES

    strategies = list(STRATEGIES) if args.strategies == "all" else [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        print(f"stream-anon evaluate: unknown strategies {unknown} (registered: {sorted(STRATEGIES)})",
              file=sys.stderr)
        return 2
    try:
        ks = [int(k) for k in args.k.split(",") if k]
    except ValueError:
        print(f"stream-anon evaluate: --k must be comma-separated integers, got {args.k!r}", file=sys.stderr)
        return 2
    baselines = () if args.no_baselines else BASELINES
    if args.file or args.config:
        if not (args.file and args.config) or args.dataset:
            print("stream-anon evaluate: your own data needs --config and --file (and no --dataset)", file=sys.stderr)
            return 2
        if not Path(args.file).exists():
            print(f"stream-anon evaluate: {args.file}: no such file or directory", file=sys.stderr)
            return 2
        from stream_anon.evaluate import run_own
        res = run_own(resolve_config(args.config), args.file, strategies, ks, args.out, seed=args.seed,
                      baselines=baselines, allow_outside_paths=args.allow_outside_paths)
        from stream_anon.evaluate import comparison_table
        print(comparison_table(res["comparison"]), end="")
        print(f"wrote {args.out}/: {', '.join(sorted(p.name for p in Path(args.out).iterdir()))}")
        return 0
    if not args.dataset:
        print("stream-anon evaluate: give --dataset NAME, or --config C --file F for your own data", file=sys.stderr)
        return 2
    run(args.dataset, strategies, ks, args.out, l=args.l, full=args.full, limit=args.limit,
        encoding=args.encoding, seed=args.seed, baselines=baselines, fit_time_bounds=args.fit_time_bounds)
    print(f"wrote {args.out}/: {', '.join(sorted(p.name for p in Path(args.out).iterdir()))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stream-anon", description=(
        "Streaming anonymizer for vehicle telemetry and fare events: k-anonymous releases counted in distinct "
        "individuals, with every input event accounted for."))
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="real events through an embedded broker, a worker and the audit",
                       description="Start the embedded broker, replay N real events, anonymize, audit, report.")
    d.add_argument("--dataset", choices=DATASET_CHOICES, default="oyster",
                   help="bundled dataset and its config (default: oyster)")
    d.add_argument("--events", type=int, default=None, help="number of events (default: the whole bundled slice)")
    d.add_argument("--k", type=int, default=None, help="override k of configs/<dataset>.toml (default: its k)")
    d.add_argument("--m", type=int, default=None,
                   help="m-invariance: every class m-unique, one signature per individual across releases "
                        "(oyster-cards: default m of its config; citibike: bikes and their fleet contract); adds "
                        "m, checker verdict, counterfeits and intersection-attack figures to the report")
    d.add_argument("--report", default=None, help="write the JSON report here")
    d.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for full accounting")
    d.add_argument("--dp", action="store_true",
                   help="also publish the differentially private aggregates of the config on anon.aggregates and "
                        "report budget and running-count error (report key 'dp')")
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (Tansu) until Ctrl-C/SIGTERM",
                       description="Start the embedded Tansu broker (in memory: topics are lost when it stops) on "
                                   "--port or a free loopback port, print 'bootstrap=HOST:PORT' on stdout, run until "
                                   "SIGINT or SIGTERM, then stop it. For local use and tests, not production.")
    b.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    b.add_argument("--host", default="127.0.0.1", help="listen and advertise address (default: 127.0.0.1)")
    b.set_defaults(func=_cmd_broker)

    w = sub.add_parser("worker", help="run the anonymization worker (see `stream-anon worker --help`)",
                       add_help=False)
    w.set_defaults(func=None)

    r = sub.add_parser("replay", help="produce events to a topic with a progress bar",
                       description="Produce events keyed by the keyed pseudonym of the privacy unit. With a --config "
                                   "whose [input] maps a format, a CSV or JSONL FILE is produced record by record "
                                   "as it is (the worker maps it); binary formats from a .pb file (one message), "
                                   "a directory of them, or a length-delimited file.")
    r.add_argument("file", nargs="?", help="JSONL file of events; with a mapped [input]: a CSV, JSONL or binary "
                                           "file, or a directory of them")
    r.add_argument("--file", dest="file_opt", default=None, help="same as FILE")
    r.add_argument("--topic", default=None,
                   help="topic to produce the events to (default: the --config's [stream] input_topic; another topic "
                        "needs --other-topic)")
    r.add_argument("--other-topic", action="store_true",
                   help="produce to a --topic that is not the --config's input topic (a broker that creates topics "
                        "on first use creates it)")
    add_connection_arguments(r)
    r.add_argument("--dataset", choices=DATASET_CHOICES, help="replay a bundled dataset instead of a file")
    r.add_argument("--full", action="store_true", help="with --dataset: the full file under ../shared/data")
    r.add_argument("--events", type=int, default=None, help="produce only the first N events (default: all)")
    r.add_argument("--config", help=CONFIG_HELP + "; its privacy unit keys the messages")
    r.add_argument("--key-field", default=None, help="privacy-unit field when no --config is given")
    r.add_argument("--framing", choices=("auto", "records", "lines", "message", "delimited"), default="auto",
                   help="how a file holds the messages of a mapped [input] (auto: by name and format; *.pb: one "
                        "message, *.pbd: varint length-delimited, *.jsonl: lines)")
    r.add_argument("--order", choices=("name", "mtime"), default="name",
                   help="FILE is a directory: its files in name or modification-time order")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_replay)

    t = sub.add_parser("topics", help="topic administration")
    tsub = t.add_subparsers(dest="topics_command", required=True)
    ta = tsub.add_parser("apply", help="create the defined topics (idempotent)")
    add_connection_arguments(ta)
    ta.add_argument("--dir", default=None, help="topic definitions directory (default: the bundled definitions)")
    ta.add_argument("--config", action="append", default=None,
                    help=CONFIG_HELP + "; create only the shared topics and this stream's, its input topic with "
                                       "the stream's [stream] partitions and its retention.ms set to [stream] "
                                       "input_retention_s when declared (repeatable; without it: every defined "
                                       "topic)")
    ta.add_argument("--app-id", default=None,
                    help="with one --config: also create the state topic <ID>-state of the worker with that app id, "
                         "as the worker would (compacted, max.message.bytes=1048576), for a worker that may not "
                         "create topics")
    ta.set_defaults(func=_cmd_topics_apply)
    tl = tsub.add_parser("list", help="print the topic definitions (no broker needed)")
    tl.add_argument("--dir", default=None, help="topic definitions directory (default: the bundled definitions)")
    tl.set_defaults(func=_cmd_topics_list)

    mo = sub.add_parser("monitoring", help="print the paths of the shipped Grafana dashboard and Prometheus alert rules",
                        description="Print where the installed package keeps its Grafana dashboard (JSON) and "
                                    "Prometheus alert rules (YAML): import the one, add the other to rule_files.")
    mo.set_defaults(func=_cmd_monitoring)

    a = sub.add_parser("audit", help="verify the output topics against the raw topic (independent of the engine)",
                       description="Needs STREAM_ANON_SECRET. Exit status 0 PASSED, 1 FAILED (a check failed), "
                                   "4 NOT PASSED (nothing published, or more suppressed than "
                                   "max_suppression_ratio), 3 and 5 with --fail-on-alert / --fail-on-open, 2 not run "
                                   "(a config, secret or connection error, or no broker answer within --timeout).")
    a.add_argument("--config", required=True, help=CONFIG_HELP)
    add_connection_arguments(a)
    a.add_argument("--raw-topic", default=None, help="default: the config's input topic")
    a.add_argument("--idle", type=float, default=3.0, help="quiet seconds that mark the end of a topic")
    a.add_argument("--report", default=None, help="write the audit report as JSON here")
    a.add_argument("--previous-secret-env", default="STREAM_ANON_PREVIOUS_SECRET", metavar="VAR",
                   help="after a key rotation: the variable holding the previous secret (or VAR_FILE naming its "
                        "file); when set, releases under either key are audited as one stream (default: "
                        "%(default)s)")
    a.add_argument("--earlier-config", action="append", default=[], metavar="OLD.toml",
                   help="after an accepted configuration change (worker --accept-config-change): the config in force "
                        "before it (repeatable, one per change). Each release is judged by the config whose k, "
                        "l-diversity criteria, hierarchies and numeric granularities were in force when it was made, "
                        "as its partition's manifests record them; a release made under settings no given config "
                        "has fails the check that reads them, naming the setting (docs/operations.md)")
    a.add_argument("--fail-on-alert", action="store_true",
                   help="exit 3 when an alert (e.g. suppression_limit_exceeded) was published on anon.metrics, "
                        "even if every check passed (events in windows still open are no alert)")
    a.add_argument("--max-prosecutor-risk", type=_risk_limit, default=None, metavar="R",
                   help="fail (exit 1, check 'risk') when a release's highest prosecutor risk is above R, i.e. it "
                        "holds a class of fewer than 1/R individuals (e.g. 0.1: at least 10)")
    a.add_argument("--fail-on-open", action="store_true",
                   help="exit 5 when events wait in windows not released yet (reported as open, never as lost)")
    a.set_defaults(func=_cmd_audit)

    ck = sub.add_parser("check", help="pre-flight of a stream: config, secret and key id, topics, retention, rights",
                        description="Needs STREAM_ANON_SECRET, as the worker. Checks before a worker starts: the "
                                    "config loads, the secret is strong and its key id is the one the stream's last "
                                    "releases carry, the stream's topics exist with the expected partition counts and "
                                    "message size limits, the input topic's retention is within [stream] "
                                    "input_retention_s and not shorter than max_delay_s, and the principal's rights "
                                    "on the topics where the broker tells them. One line per finding; exit 0 when "
                                    "there is none, 1 otherwise (docs/operations.md, Pre-flight check).")
    ck.add_argument("--config", required=True, help=CONFIG_HELP)
    kafka_connection.add_arguments(ck)
    ck.add_argument("--app-id", default=None, help="the worker's app id, whose state topic <ID>-state is checked "
                                                   "(default: stream-anon-<stream>, as the worker's)")
    ck.set_defaults(func=_cmd_check)

    rp = sub.add_parser("report", help="one self-contained HTML page: figures, plots and a DPO summary of a stream",
                        description="Needs STREAM_ANON_SECRET. Reads the raw topic, the output topics and "
                                    "anon.metrics as the audit does, runs the audit, and writes one HTML file (inline "
                                    "SVG plots, no script, nothing fetched): class sizes, NCP and suppression, "
                                    "re-identification risk, DP budget, query error, dead letters and alerts, and a "
                                    "summary for a data protection officer (docs/report.md). Exit 0 when written, "
                                    "whatever the audit's verdict (the page states it); 2 when it could not run (a "
                                    "config, secret or connection error, or no broker answer within --timeout).")
    rp.add_argument("--config", required=True, help=CONFIG_HELP)
    add_connection_arguments(rp)
    rp.add_argument("--out", required=True, help="write the HTML page here")
    rp.add_argument("--json", default=None, help="also write the summary, the figures and the audit report as JSON")
    rp.add_argument("--raw-topic", default=None, help="default: the config's input topic")
    rp.add_argument("--idle", type=float, default=3.0, help="quiet seconds that mark the end of a topic")
    rp.add_argument("--earlier-config", action="append", default=[], metavar="OLD.toml",
                    help="the config in force before an accepted configuration change (repeatable): the audit the "
                         "page states judges each release by the config in force when it was made (as stream-anon "
                         "audit --earlier-config)")
    rp.set_defaults(func=_cmd_report)

    g = sub.add_parser("aggregates", help="the stream's DP aggregates, one merged figure per window and key",
                       description="Read the stream's rows on anon.aggregates (read_committed, until the topic is "
                                   "quiet) and merge the input partitions' rows: value = sum over partitions, "
                                   "noise_std = combined standard deviation of the noise, interval = where the true "
                                   "value lies with probability --level, partitions = the partitions summed.")
    g.add_argument("--config", required=True, help=CONFIG_HELP)
    add_connection_arguments(g)
    g.add_argument("--format", choices=("jsonl", "csv"), default="jsonl",
                   help="one JSON object per merged row (default) or CSV")
    g.add_argument("--out", default=None, help="write here (default: stdout)")
    g.add_argument("--level", type=float, default=0.95, help="coverage of the stated interval (default 0.95)")
    g.add_argument("--incomplete", action="store_true",
                   help="also rows of windows some partition has not published yet (complete = false: they "
                        "lack that partition's figure)")
    g.add_argument("--idle", type=float, default=3.0, help="quiet seconds that mark the end of the topic")
    g.set_defaults(func=_cmd_aggregates)

    c = sub.add_parser("calibrate", help="write fixed domain bounds from a sample into a config file",
                       description="Bounds never drift with the stream: calibrate once, review, deploy.")
    c.add_argument("--config", required=True, help=CONFIG_HELP)
    c.add_argument("--out", required=True, help="write the calibrated config (TOML) here")
    c.add_argument("--dataset", choices=DATASET_CHOICES, help="calibrate from a bundled dataset (or --file)")
    c.add_argument("--file", help="sample: JSONL events, or a file (or directory) of a mapped [input]")
    c.add_argument("--full", action="store_true", help="with --dataset: the full file under ../shared/data")
    c.add_argument("--events", type=int, default=None, help="calibrate from the first N events (default: all)")
    c.add_argument("--margin", type=float, default=0.0, help="widen each range by this share on both sides")
    c.add_argument("--file-framing", dest="framing", default="auto",
                   choices=("auto", "records", "lines", "message", "delimited"),
                   help="how --file holds the messages of a mapped [input] (as for replay --framing)")
    c.add_argument("--suggest", action="store_true",
                   help="also suggest settings from the sample: closed-form figures (coarsest H3 resolution, "
                        "window for k, lateness from the arrival lag), then candidates around them run through the "
                        "engine on the earlier part of the sample; the lowest NCP with no more suppression wins, "
                        "reported on the later part")
    c.add_argument("--apply-suggestions", action="store_true", help="write the suggested settings into --out")
    c.add_argument("--max-delay-limit-s", type=float, default=None,
                   help="with --suggest: the longest max_delay_s a candidate may have (default: the config's: the "
                        "latency the stream promises)")
    c.add_argument("--train-share", type=float, default=0.5,
                   help="with --suggest: share of the sample (by event time, the earlier part) that chooses; the "
                        "rest reports the figures of the choice (default 0.5)")
    c.set_defaults(func=_cmd_calibrate)

    e = sub.add_parser("evaluate", help="compare strategies: privacy, utility, attack recall, plots",
                       description="Batch-anonymize a dataset with each strategy at each k (k in distinct "
                                   "individuals); write results.json, results.md and PNG plots to --out.")
    e.add_argument("--dataset", choices=("adult",) + tuple(d for d in DATASET_CHOICES if d != "oyster-cards"),
                   default=None, help="a bundled dataset (or --config and --file for your own data)")
    e.add_argument("--config", default=None, help=CONFIG_HELP + "; with --file: evaluate your own data through its "
                                                  "[input] mapping")
    e.add_argument("--file", default=None, help="CSV or JSONL file of your own events (with --config)")
    e.add_argument("--strategies", default="all", help="comma-separated registered names (default: all)")
    e.add_argument("--k", default="2,5,10", help="comma-separated k values")
    e.add_argument("--l", type=int, default=None, help="l for strategies that take it; rows report l_satisfied")
    e.add_argument("--out", required=True, help="output directory")
    e.add_argument("--full", action="store_true", help="the full file under ../shared/data (default: bundled slice)")
    e.add_argument("--limit", type=int, default=None, help="first N records only")
    e.add_argument("--encoding", choices=("hierarchy", "codes"), default="hierarchy",
                   help="adult: ARX hierarchies, or the Mondrian reference's integer codes")
    e.add_argument("--seed", type=int, default=0, help="random seed of the strategies and attacks (default 0)")
    e.add_argument("--no-baselines", action="store_true", help="skip the raw and k-in-records baselines")
    e.add_argument("--fit-time-bounds", action="store_true",
                   help="timestamp QI bounds = the data's first and last hour (evaluate a full file longer than "
                        "the configured period instead of rejecting its events)")
    e.set_defaults(func=_cmd_evaluate)
    for sp in (r, ta, ck, a, rp, g, c, e):       # the commands that read a stream config
        sp.add_argument(ALLOW_OUTSIDE_FLAG, action="store_true", help=ALLOW_OUTSIDE_HELP)
    for sp in (d, b, r, ta, tl, mo, ck, a, rp, g, c, e):
        logsetup.add_arguments(sp)
        sp.add_argument("--loglevel", default="warning", help="log level (default: warning)")
    return with_defaults(p)


def _bundled_config_resolved(argv: list[str]) -> list[str]:
    """``--config NAME`` of a bundled config -> ``--config <its path>`` (the worker parses its own options)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = str(resolve_config(out[i + 1]))
        elif arg.startswith("--config="):
            out[i] = "--config=" + str(resolve_config(arg.split("=", 1)[1]))
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:    # a core install running a command of an extra (stream_anon.extras)
        message = missing_extra(exc)
        if message is None:
            raise
        print(f"stream-anon {argv[0] if argv else ''}: {message}", file=sys.stderr)
        return 2


def _main(argv: list) -> int:
    if argv and argv[0] == "worker":
        from stream_anon.kafka.app import worker_main
        return worker_main(_bundled_config_resolved(argv[1:]))
    args = build_parser().parse_args(argv)
    logsetup.setup_logging(args.loglevel, args.log_format)
    command = " ".join(filter(None, (args.command, getattr(args, "topics_command", None))))
    try:
        return args.func(args)
    except BrokerUnreachable as exc:
        print(f"stream-anon {command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a clear one-line error for configuration and secret problems
        from stream_anon.config import ConfigError
        from stream_anon.contract import ContractError
        from stream_anon.crypto import SecretError
        if isinstance(exc, (ConfigError, ContractError, SecretError, FileNotFoundError,
                            kafka_connection.ConnectionSettingsError)):
            print(f"stream-anon {command}: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
