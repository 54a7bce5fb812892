"""The in-process API: events or a DataFrame in, the worker's outputs out, without Kafka.

``anonymize(events, config)`` runs the worker's own pipeline (:class:`~stream_anon.worker.core.WorkerCore`: input
checks, engine, DP aggregates, rendering) over the events, as if they had been produced to the stream's input
topic and consumed by one worker that then flushed on idle input, and returns what the worker would have
published on each output topic, decoded: a :class:`Result`. ``audit_result(result, config)`` is the independent
audit (:mod:`stream_anon.audit`) of the same objects. Nothing here imports a Kafka client (``pip install
stream-anon`` without the ``service`` extra serves it); docs/api.md is the guide, its examples run as tests.

>>> import stream_anon
>>> from stream_anon.datasets import load_events
>>> secret = "doctest-secret-" + "0123456789abcdef" * 2
>>> result = stream_anon.anonymize(load_events("oyster", limit=3000), "oyster", secret=secret)
>>> counts = result.counts()
>>> counts["events"] == counts["published"] + counts["suppressed"] + counts["dead_lettered"] + counts["deferred"]
True
>>> counts["events"], counts["deferred"], len(result.records) == counts["published"]
(3000, 0, True)
>>> stream_anon.audit_result(result, "oyster", secret=secret).verdict
'PASSED'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, Iterable

import orjson

from stream_anon import crypto
from stream_anon.config import StreamConfig, load_config
from stream_anon.contract import resolve_config
# the worker's Kafka-free core and its input encoding (importing these modules imports no Kafka client)
from stream_anon.worker.core import WorkerCore
from stream_anon.worker.placement import partitions_for
from stream_anon.kafka.replay import encode_event, json_object, unit_key_fn
from stream_anon.render import TOPICS, release_accounting

BATCH_MESSAGES = 5000     # messages handed to the core at a time (its output does not depend on the cut)


@dataclass(frozen=True)
class Result:
    """What the worker publishes for the input, one list per output topic (docs/contracts.md section 5), each
    message decoded from JSON: ``records`` (``anon.<stream>.records``), ``manifests`` (``anon.releases``: one
    per release, accounting for every event of it), ``dp_rows`` (``anon.aggregates``), ``dead_letters``
    (``anon.deadletter``) and ``metrics`` (``anon.metrics``: release metrics and alerts). ``inputs``: the input as
    the worker read it, ``((topic, partition, offset), payload bytes)``, which the audit re-reads."""
    stream: str
    records: list[dict]
    manifests: list[dict]
    dp_rows: list[dict]
    dead_letters: list[dict]
    metrics: list[dict]
    inputs: list[tuple] = field(repr=False)
    events_in: int = 0       # events read from the input (a message of a mapped [input] may hold several)

    def counts(self) -> dict:
        """Where each input event went: ``published`` (a record of a class of at least k individuals),
        ``suppressed`` (by reason in ``suppressed_by_reason``), ``dead_lettered``, ``deferred`` (held for a later
        window: 0 here, as the input's end flushes every window); they add up to ``events``."""
        return {"events": self.events_in, **release_accounting(self.manifests, self.dead_letters)}

    def frame(self):
        """The published records as a pandas DataFrame, one row per record, nested fields dotted
        (``pandas.json_normalize``)."""
        import pandas as pd
        return pd.json_normalize(self.records)


def anonymize(events: Any, config: str | Path | StreamConfig, secret: bytes | str | None = None,
              partitions: int = 1, lineage: str | None = None) -> Result:
    """The worker's output for ``events`` under ``config`` (a path, a bundled stream name such as ``"oyster"``, or
    a loaded :class:`~stream_anon.config.StreamConfig`) and ``secret`` (default: ``$STREAM_ANON_SECRET`` or the file
    ``$STREAM_ANON_SECRET_FILE`` names, as for the worker).

    ``events``: event dicts (the JSON shape of docs/inputs.md), raw payloads (bytes or str, e.g. the lines of a
    mapped ``[input]``), or a pandas DataFrame (one event per row; missing values left out, timestamps in ISO
    8601). ``partitions``: of the input topic the worker would read, each event on its privacy unit's partition
    as ``stream-anon replay`` produces it (the output is that of the worker over such a topic). ``lineage``: the
    worker's lineage id the output belongs to (its release ids, DP row ids and DP noise depend on it; the
    ``lineage`` of a worker's manifest reproduces that worker's output), None for none."""
    cfg = config if isinstance(config, StreamConfig) else load_config(resolve_config(config))
    key = _secret(secret)
    core = WorkerCore(cfg, app_id=f"stream-anon-{cfg.stream.name}", secret=key)
    messages = input_messages(events, cfg, key, partitions)
    for p in range(partitions):          # a worker owns every partition of its input topic, with data or not
        core.open_partition(p, lineage=lineage)
    output = []
    for start in range(0, len(messages), BATCH_MESSAGES):
        output += core.handle(messages[start:start + BATCH_MESSAGES])
    output += core.flush_all()
    by_topic: dict[str, list] = {}
    for topic, _key, value in output:
        by_topic.setdefault(topic, []).append(orjson.loads(value))
    topic = cfg.stream.input_topic
    return Result(stream=cfg.stream.name, records=by_topic.pop(TOPICS.records(cfg.stream.name), []),
                  manifests=by_topic.pop(TOPICS.releases, []), dp_rows=by_topic.pop(TOPICS.aggregates, []),
                  dead_letters=by_topic.pop(TOPICS.deadletter, []), metrics=by_topic.pop(TOPICS.metrics, []),
                  inputs=[((topic, p, off), raw) for p, off, raw in messages],
                  events_in=core.stats.totals["events_in"])


def audit_result(result: Result, config: str | Path | StreamConfig, secret: bytes | str | None = None,
                 **options):
    """The audit's report (:class:`stream_anon.audit.AuditReport`: ``verdict``, ``passed``, ``checks``,
    ``summary``) of ``result`` against ``config`` and ``secret`` (as for :func:`anonymize`): what ``stream-anon
    audit`` finds on the worker's topics. ``options``: those of :func:`stream_anon.audit.audit`
    (``max_prosecutor_risk``, ``previous_secrets``, ``earlier_configs``)."""
    from stream_anon.audit import AuditConfig, AuditOutputs, audit
    from stream_anon.audit.inputs import raw_decoder

    cfg = config if isinstance(config, StreamConfig) else load_config(resolve_config(config))
    if cfg.source is None:
        raise ValueError("audit_result: the config must come from a file (the audit reads its TOML)")
    if cfg.stream.name != result.stream:
        raise ValueError(f"audit_result: the result is of stream {result.stream!r}, the config of "
                         f"{cfg.stream.name!r}")
    key = _secret(secret)
    raw = result.inputs
    decode = raw_decoder(cfg.source, key, cfg.allow_outside_paths)
    if decode is not None:
        raw = decode(raw)
    outputs = AuditOutputs(records=list(result.records), manifests=list(result.manifests),
                           deadletters=list(result.dead_letters), aggregates=list(result.dp_rows))
    return audit(raw, outputs, key, AuditConfig.from_toml(cfg.source, cfg.allow_outside_paths),
                 alerts=result.metrics, **options)


def input_messages(events: Any, config: StreamConfig, secret: bytes, partitions: int = 1) -> list[tuple]:
    """``(partition, offset, payload bytes)`` of each event, as ``stream-anon replay`` would produce them to an
    empty input topic of ``partitions`` partitions (events serialized as replay does, each on its unit's
    partition, offsets counting from 0 per partition)."""
    if partitions < 1:
        raise ValueError(f"partitions: at least 1, got {partitions}")
    payloads = [_payload(e) for e in _rows(events)]
    home = [0] * len(payloads)
    if partitions > 1:
        unit_of = unit_key_fn(config.stream.privacy_unit)
        units = [unit_of(json_object(p)) for p in payloads]
        keyed = [i for i, u in enumerate(units) if u is not None]
        places = partitions_for(crypto.pseudonym_keys(secret, [units[i] for i in keyed]), partitions).tolist()
        for i, p in zip(keyed, places):
            home[i] = p
    next_offset = [0] * partitions
    out = []
    for p, raw in zip(home, payloads):
        out.append((p, next_offset[p], raw))
        next_offset[p] += 1
    return out


def _secret(secret: bytes | str | None) -> bytes:
    if secret is None:
        return crypto.load_secret()
    return crypto.check_secret(secret.encode() if isinstance(secret, str) else secret, "secret")


def _rows(events: Any) -> Iterable:
    """The events of a DataFrame (one dict per row, its missing values left out) or of any iterable."""
    if hasattr(events, "to_dict") and hasattr(events, "columns"):        # a pandas DataFrame
        return ({k: _plain(v) for k, v in row.items() if not _missing(v)} for row in events.to_dict("records"))
    return events


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NaTType"


def _plain(value):
    """A DataFrame cell as JSON has it: timestamps in ISO 8601, numpy scalars as Python numbers."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict, str, bytes)) else value


def _payload(event) -> bytes:
    if isinstance(event, bytes):
        return event
    if isinstance(event, str):
        return event.encode("utf-8")
    return encode_event(event)


__all__ = ["Result", "anonymize", "audit_result", "input_messages"]
