"""Log output of the worker and the ``stream-anon`` commands: text lines (default) or one JSON object per line
(``--log-format json``, python-json-logger) for log collectors.

>>> import io, json, logging
>>> buf = io.StringIO()
>>> handler = make_handler("json", stream=buf)
>>> rec = logging.LogRecord("stream_anon.worker", logging.WARNING, __file__, 1, "alert %s", ("x",), None)
>>> doc = json.loads(handler.format(rec))
>>> doc["levelname"], doc["name"], doc["message"]
('WARNING', 'stream_anon.worker', 'alert x')
"""
from __future__ import annotations

import logging
import sys

FORMATS = ("text", "json")
TEXT_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"


def _json_formatter() -> logging.Formatter:
    try:
        from pythonjsonlogger.json import JsonFormatter          # python-json-logger >= 3
    except ImportError:  # pragma: no cover - older releases
        from pythonjsonlogger.jsonlogger import JsonFormatter
    return JsonFormatter(JSON_FIELDS, timestamp=False)


_SECRETS: set[str] = set()


def register_secret(value: str | None) -> None:
    """A value that must never appear in a log line (Kafka passwords: kafka-python logs its whole configuration,
    passwords included, at DEBUG). Values shorter than 4 characters are not registered (they would mangle
    ordinary text)."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


class RedactSecrets(logging.Filter):
    """Replaces registered secrets by ``***`` in every record's message and arguments.

    >>> register_secret("hunter22")
    >>> rec = logging.LogRecord("kafka", logging.DEBUG, __file__, 1, "config %s", ({"sasl_plain_password": "hunter22"},), None)
    >>> RedactSecrets().filter(rec), rec.getMessage()
    (True, "config {'sasl_plain_password': '***'}")
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not _SECRETS:
            return True
        msg = record.getMessage()
        if any(s in msg for s in _SECRETS):
            for s in _SECRETS:
                msg = msg.replace(s, "***")
            record.msg, record.args = msg, None
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            for s in _SECRETS:
                text = text.replace(s, "***")
            record.exc_text = text
        return True


def make_handler(fmt: str = "text", stream=None) -> logging.Handler:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_json_formatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RedactSecrets())
    return handler


# Loggers of the libraries the worker and the commands run on: their INFO lines are client internals (connections,
# metadata, group protocol), shown only when the level asked for is DEBUG; their warnings and errors always show.
THIRD_PARTY = ("kafka", "faust", "mode", "aiokafka", "aiohttp", "asyncio", "urllib3", "venusian", "yarl")


class ClosedSocketReadRace(logging.Filter):
    """Drops kafka-python 3.0.12's traceback when a connection it is closing still had a read pending (its read task
    calls ``recv`` on the socket ``close`` set to None: ``AttributeError``, logged at ERROR though nothing failed);
    shown at DEBUG. A workaround for that library's defect, on its ``kafka.net.transport`` logger only.

    >>> import sys
    >>> try:
    ...     None.recv(4096)
    ... except AttributeError:
    ...     rec = logging.LogRecord("kafka.net.transport", logging.ERROR, __file__, 1, "x: Error receiving", (),
    ...                             sys.exc_info())
    >>> logging.getLogger("kafka").setLevel(logging.WARNING)
    >>> ClosedSocketReadRace().filter(rec)
    False
    """

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if isinstance(err, AttributeError) and "'NoneType' object has no attribute 'recv'" in str(err):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def setup_logging(level: str = "warning", fmt: str = "text") -> None:
    """Configure the root logger once (replaces handlers set before, e.g. by a library); the loggers of
    :data:`THIRD_PARTY` at WARNING unless ``level`` is DEBUG."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(make_handler(fmt))
    lvl = getattr(logging, str(level).upper(), logging.INFO)
    root.setLevel(lvl)
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(lvl if lvl <= logging.DEBUG else max(lvl, logging.WARNING))
    transport = logging.getLogger("kafka.net.transport")
    if not any(isinstance(f, ClosedSocketReadRace) for f in transport.filters):
        transport.addFilter(ClosedSocketReadRace())


def add_arguments(parser) -> None:
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="log lines as text (default) or one JSON object per line")
