"""Your own data: a file read through a stream config's ``[input]`` mapping, the streaming engine's NCP
on it and offline Mondrian on the same windows or on the whole table, for ``stream-anon evaluate --config C --file F``
(:func:`stream_anon.evaluate.commands.run_own`).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stream_anon.evaluate.batch import Anonymized, anonymize
from stream_anon.evaluate.tables import EvalTable

EVALUATE_SECRET = b"evaluate"      # keys the audit tokens (hence the duplicate check) and derived event ids


@dataclass
class CheckedInput:
    """A file through the worker's input checks: ``events`` (those the worker's engine would take, in file
    order), ``events_in`` (input events counted as the worker counts them: a message that cannot be read is one,
    a message of N events N), ``rejected`` (the dead-lettered ones by the kind of their reason, the label of
    ``stream_anon_dead_letters_total``) and ``reasons`` (each dead letter's full reason, by input position)."""

    events: list[dict]
    events_in: int
    rejected: Counter
    reasons: list[tuple[object, str]]

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())


def read_own_events(config, path, framing: str = "auto", secret: bytes = EVALUATE_SECRET) -> CheckedInput:
    """The messages of a file (CSV/JSONL/binary, framed as ``stream-anon replay`` sends them) through every input
    check the worker applies (:class:`stream_anon.worker.input_checks.InputBatch`: size, JSON, kind and schema of
    the built-in shape, or the ``[input]`` mapping; then the engine's reader: event type, privacy unit, time,
    quasi-identifier domains, ``[sensitive.domains]``, ``duplicate_event`` and ``future_event_time``), judged as
    one partition in file order (the worker judges the last two per partition)."""
    from stream_anon.engine import Engine
    from stream_anon.inputs import Decoder
    from stream_anon.inputs.files import file_messages
    from stream_anon.worker.input_checks import InputBatch
    from stream_anon.worker.stats import reason_kind

    messages = list(enumerate(file_messages(path, config.input, framing)))
    decoder = None if config.input.legacy else Decoder(config.input, config.limits.max_event_bytes, secret)
    batch = InputBatch(messages, config, decoder, Path(path).name, 0)
    reasons = [(source, reason) for source, reason, *_ in batch.rejected]
    _records, rejected = Engine(config, partition=0, secret=secret).read(batch.events)
    dropped = {i for i, _ in rejected}
    reasons += [(batch.sources[i], reason) for i, reason in rejected]
    events = [e for i, e in enumerate(batch.events) if i not in dropped]
    return CheckedInput(events, batch.n, Counter(reason_kind(r) for _, r in reasons), reasons)


def _record_ncp(table: EvalTable, anon: Anonymized) -> np.ndarray:
    """Per-record NCP with the engine's definition (``QISpace.ncp`` of the snapped class box); suppressed = 1."""
    out = np.ones(table.n)
    kept = anon.record_class >= 0
    if kept.any():
        out[kept] = table.space.ncp(anon.lo, anon.hi)[anon.record_class[kept]]
    return out


def _subset(table: EvalTable, idx: np.ndarray) -> EvalTable:
    return EvalTable(table.name, table.space, table.X[idx], table.units[idx],
                     table.original.iloc[idx].reset_index(drop=True), table.columns, table.weights,
                     table.hierarchies, table.bounds, table.sensitive)


def streaming_ncp(config, events: list[dict], secret: bytes = b"evaluate") -> dict:
    """Run the streaming engine over ``events`` in file order (one partition), flush, and measure: NCP over every
    event the engine accepted (published records at their class's NCP, suppressed = 1), NCP of the published
    records, suppression ratio, releases."""
    from stream_anon.engine import Engine

    engine = Engine(config, partition=0, secret=secret)
    t0 = time.perf_counter()
    res = engine.process(events)
    res.extend(engine.flush())
    runtime = time.perf_counter() - t0
    ncp_sum, published, suppressed = 0.0, 0, 0
    for rel in res.releases:
        real = rel.record_ncp if rel.record_counterfeit is None else rel.record_ncp[~rel.record_counterfeit]
        ncp_sum += float(real.sum())
        published += len(real)
        suppressed += sum(len(v) for v in rel.suppressed_tokens.values())
    n = published + suppressed
    return {"events": len(events), "rejected": len(res.rejected), "releases": len(res.releases),
            "published": published, "suppressed": suppressed,
            "ncp": (ncp_sum + suppressed) / n if n else None,
            "ncp_released": ncp_sum / published if published else None,
            "suppression_ratio": suppressed / n if n else None, "runtime_s": runtime}


def offline_release(table: EvalTable, k: int, window_s: float | None = None, seed: int = 0) -> Anonymized:
    """Offline Mondrian (k in distinct individuals) on the whole table, or per window of the streaming engine
    (``event_windows``: the window of each record's event time, the engine's definition) when ``window_s`` is
    given: one :class:`Anonymized` over every row (the windows' classes numbered one after the other)."""
    from stream_anon.engine import event_windows
    from stream_anon.strategies.mondrian import Mondrian

    if window_s is None:
        groups = [np.arange(table.n)]
    else:
        assert table.times is not None              # a table of events (table_from_events) has their times
        known = np.isfinite(table.times)
        w = event_windows(np.where(known, table.times, 0.0), window_s)
        w[~known] = np.iinfo(np.int64).min          # records without a time: one group of their own
        groups = [np.flatnonzero(w == x) for x in np.unique(w)]
    record_class = np.full(table.n, -1, dtype=np.int64)
    los: list[np.ndarray] = []
    his: list[np.ndarray] = []
    labels: list = []
    runtime = 0.0
    for idx in groups:
        anon = anonymize(_subset(table, idx), Mondrian(), k, seed)
        kept = anon.record_class >= 0
        record_class[idx[kept]] = anon.record_class[kept] + sum(len(x) for x in los)
        los.append(anon.lo)
        his.append(anon.hi)
        labels += anon.labels
        runtime += anon.runtime_s
    D = table.space.dims
    return Anonymized(record_class, np.concatenate(los) if los else np.empty((0, D)),
                      np.concatenate(his) if his else np.empty((0, D)), labels, runtime, windows=len(groups))


def offline_mondrian(table: EvalTable, k: int, window_s: float | None = None, seed: int = 0) -> dict:
    """NCP (suppressed = 1) and suppression of :func:`offline_release`."""
    t0 = time.perf_counter()
    anon = offline_release(table, k, window_s, seed)
    ncp = _record_ncp(table, anon)
    return {"ncp": float(ncp.mean()) if table.n else None, "windows": anon.windows,
            "suppression_ratio": float((anon.record_class < 0).mean()) if table.n else None,
            "runtime_s": time.perf_counter() - t0}
