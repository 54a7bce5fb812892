"""What every command that talks to Kafka shares: the config file it names (found, or one line saying it is not),
its ``--timeout``, and its connection once the broker has answered (or one line naming the broker: no client's own
wait and traceback)."""
from __future__ import annotations

import os
from pathlib import Path

from stream_anon import connection as kafka_connection
from stream_anon.contract import resolve_config


class BrokerUnreachable(Exception):
    """The command's broker did not answer within ``--timeout``; the message is the one line to print."""


def connect(args, config_path=None) -> kafka_connection.KafkaConnection:
    """The command's Kafka connection, once its broker has answered a metadata request within ``--timeout``."""
    conn = kafka_connection.from_args(args, config_path=config_path)
    unreachable = kafka_connection.broker_unreachable(conn, args.timeout)
    if unreachable:
        raise BrokerUnreachable(unreachable)
    return conn


def config_file(text: str) -> Path:
    """``--config TEXT``: an existing file, or the name of a bundled config; anything else is one line saying the
    config file is not found (before any connection setting is read from it)."""
    from stream_anon.config import ConfigError
    from stream_anon.contract import config_names

    path = resolve_config(text)
    if not path.is_file():
        bundled = "" if path.suffix or os.sep in str(text) else \
            f" (nor the name of a bundled config: {', '.join(config_names())})"
        raise ConfigError(f"config file not found: {text}{bundled}")
    return path


def add_connection_arguments(parser) -> None:
    """The Kafka connection options and ``--timeout`` of a command that talks to Kafka."""
    kafka_connection.add_arguments(parser)
    parser.add_argument("--timeout", type=kafka_connection.timeout_seconds, default=kafka_connection.BROKER_TIMEOUT_S,
                        metavar="SECONDS",
                        help="seconds to wait for the broker's first answer; none: one line naming the broker and "
                             f"exit 2 (default: {kafka_connection.BROKER_TIMEOUT_S:g})")
