"""``stream-anon replay``: events from a file or a bundled dataset to the stream's input topic (the config's, unless
``--other-topic`` says another is meant)."""
from __future__ import annotations

import json
import sys

from stream_anon.cli_kafka import config_file, connect


def cmd_replay(args) -> int:
    args.file = args.file or args.file_opt
    from stream_anon import crypto
    from stream_anon.config import load_config
    from stream_anon.kafka.replay import read_jsonl, replay, unit_key_fn

    secret = crypto.load_secret()
    config_path = config_file(args.config) if args.config else None
    config = load_config(config_path, args.allow_outside_paths) if config_path else None
    topic = _replay_topic(args, config)
    if topic is None:
        return 2
    # the events are read before the broker is asked: a file's problem is found without one
    pairs = events = None
    if args.file and config is not None and not config.input.legacy:
        # a mapped [input]: the file's records go to the topic as they are; the worker maps them
        from stream_anon.kafka.replay import mapped_messages
        try:
            pairs = mapped_messages(args.file, config, secret, limit=args.events, framing=args.framing,
                                    order=args.order)
        except ValueError as exc:
            print(f"stream-anon replay: {exc}", file=sys.stderr)
            return 2
    elif args.file and str(args.file).endswith((".csv", ".csv.gz")):
        print("stream-anon replay: a CSV file needs --config with an [input] mapping (format = \"csv\")",
              file=sys.stderr)
        return 2
    elif args.dataset:
        from stream_anon.datasets import load_events
        events = load_events(args.dataset, limit=args.events, full=args.full)
    elif args.file:
        try:
            events = read_jsonl(args.file)[: args.events]
        except (OSError, ValueError) as exc:     # not JSONL text (UnicodeDecodeError, JSONDecodeError): one line
            print(f"stream-anon replay: {args.file}: not a JSONL file of events ({type(exc).__name__}: "
                  f"{str(exc)[:120]}); binary messages need --config with their [input] format", file=sys.stderr)
            return 2
    else:
        print("stream-anon replay: give a JSONL FILE or --dataset NAME", file=sys.stderr)
        return 2
    conn = connect(args, config_path=config_path)
    if pairs is not None:
        counts = replay(conn, topic, [], key_fn=None, raw_payloads=pairs, secret=secret,
                        progress=not args.quiet, total=len(pairs))
    else:
        assert events is not None           # read above unless the file's messages were mapped (pairs)
        unit = config.stream.privacy_unit if config is not None else args.key_field
        counts = replay(conn, topic, events, key_fn=unit_key_fn(unit) if unit else None, secret=secret,
                        progress=not args.quiet)
    print(json.dumps(counts))
    return 0


def _replay_topic(args, config) -> str | None:
    """The topic replay produces to: the config's input topic, unless ``--topic`` names another and
    ``--other-topic`` says that is meant (a misspelled topic would otherwise be created and never read by the
    worker). None after one line saying why not."""
    if config is None:
        if not args.topic:
            print("stream-anon replay: give --config (its input topic is the default) or --topic", file=sys.stderr)
        return args.topic
    named = config.stream.input_topic
    if args.topic is None or args.topic == named:
        return named
    if args.other_topic:
        return args.topic
    print(f"stream-anon replay: --topic {args.topic}: the stream {config.stream.name} reads {named} ([stream] "
          f"input_topic of {args.config}); leave --topic out to produce there, or add --other-topic to produce to "
          f"{args.topic}", file=sys.stderr)
    return None
