"""Utility an analyst recognises (issue 29): the relative error of the analyst's workload
(:mod:`stream_anon.evaluate.workload`) on what the stream published, release by release and over the run, beside
offline Mondrian asked the same queries about the same events, on the same windows and on the whole table; and the
error of the DP aggregates: realized where the truth is at hand, stated (the rows' intervals) otherwise.

One entry point for every caller: ``stream-anon evaluate --config --file`` and bench/bench_query_error.py run the
streaming engine in process (:func:`placement_from_engine`), ``stream-anon report`` takes what the topics hold
(:class:`Placement` built from the audit's context); :func:`query_error` measures either.

The events measured are those the stream placed (published or suppressed): dead-lettered events are no part of the
table, events of windows still open not yet part of the run. Suppressed events count in the truth and answer
nothing; counterfeit records of an m-invariant release answer like real ones (an analyst cannot tell them apart).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stream_anon.evaluate.workload import PER_FAMILY, QuerySpace, analyst_workload, box_answers, summarize


@dataclass
class Placement:
    """What a stream did with its events: the placed events (in input order) and the release that placed each
    (index into ``releases``), the published records and the release of each, and the releases (``release_id``,
    ``partition``, ``window_start``). ``dp_rows``: the DP aggregate rows, when the stream has any."""

    events: list[dict]
    event_release: np.ndarray
    records: list[dict]
    record_release: np.ndarray
    releases: list[dict]
    dp_rows: list[dict] = field(default_factory=list)


def placement_from_engine(config, events: list[dict], secret: bytes = b"evaluate-utility-secret-0123456789",
                          batch: int = 5000) -> Placement:
    """Run the streaming engine over ``events`` in input order (one partition, flushed at the end, as
    ``streaming_ncp`` does), with the DP aggregates of a stream that has them, and place every event."""
    import orjson

    from stream_anon import crypto
    from stream_anon.engine import Engine

    dp = config.dp is not None and bool(config.dp.aggregates)
    aggregates = None
    if dp:
        from stream_anon.worker.aggregates import PartitionAggregates, needed_fields
        engine = Engine(config, partition=0, secret=secret, carried=needed_fields(config))
        aggregates = PartitionAggregates(config, 0, secret)
    else:
        engine = Engine(config, partition=0, secret=secret)
    results = [engine.process(events[i:i + batch]) for i in range(0, len(events), batch)] + [engine.flush()]
    index: dict[str, int] = {}
    for i, e in enumerate(events):
        eid = e.get("event_id")
        if isinstance(eid, str) and eid:
            index.setdefault(crypto.audit_token(secret, eid), i)
    placed: dict[int, int] = {}
    records, record_release, rows = [], [], []
    releases: list[dict] = []
    for res in results:
        for rel in res.releases:
            r = len(releases)
            releases.append({"release_id": rel.release_id, "partition": rel.partition,
                             "window_start": float(rel.window_start)})
            for payload in rel.record_payloads(orjson.dumps):
                rec = orjson.loads(payload)
                records.append(rec)
                record_release.append(r)
                if rec["audit_token"] in index:
                    placed[index[rec["audit_token"]]] = r
            for tokens in rel.suppressed_tokens.values():
                placed.update({index[t]: r for t in tokens if t in index})
        if aggregates is not None:
            rows += aggregates.close_windows(res.windows)[0]
    order = sorted(placed)
    return Placement([events[i] for i in order], np.array([placed[i] for i in order], dtype=np.int64), records,
                     np.array(record_release, dtype=np.int64), releases, rows)


def _table_boxes(qs: QuerySpace, table, anon, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The published boxes of an offline release (:class:`~stream_anon.evaluate.batch.Anonymized`) of the rows of
    ``X``: each kept row's class box and its own product value; and which rows were kept."""
    kept = anon.record_class >= 0
    cls = anon.record_class[kept]
    lo = np.column_stack([anon.lo[cls], X[kept, -1]])
    hi = np.column_stack([anon.hi[cls], X[kept, -1]])
    return lo, hi, kept


def query_error(config, placement: Placement, seed: int = 0, per_family: int = PER_FAMILY, offline: bool = True,
                k: int | None = None) -> dict:
    """The analyst's workload on ``placement``: ``workload`` (families, queries, a few cells each), ``run`` (per
    variant: :func:`~stream_anon.evaluate.workload.summarize` over the run), ``per_release`` (per release: the
    events it placed and, per variant, the summary over the queries with a true count in that release) and
    ``dp`` (:func:`dp_errors`). Variants: ``streaming`` (the published records), and with ``offline``
    ``offline_windows`` / ``offline_table`` (Mondrian at ``k``, default the config's, on the same events per
    engine window / all at once, each kept row answered by its class's box)."""
    from stream_anon.evaluate.own_stream import offline_release
    from stream_anon.evaluate.tables import table_from_events

    qs = QuerySpace.of(config)
    X, ok = qs.points(placement.events)
    if not ok.all():       # the engine places only events inside the domains; a report may read others: left out
        placement = Placement([e for e, good in zip(placement.events, ok) if good], placement.event_release[ok],
                              placement.records, placement.record_release, placement.releases, placement.dp_rows)
        X = X[ok]
    workload = analyst_workload(qs, X, seed=seed, per_family=per_family)
    R = len(placement.releases)
    truth = box_answers(qs.kinds, X, X, workload.lo, workload.hi, group=placement.event_release, n_groups=R)
    lo, hi = qs.boxes(placement.records)
    answers = {"streaming": box_answers(qs.kinds, lo, hi, workload.lo, workload.hi,
                                        group=placement.record_release, n_groups=R)}
    extra = {}
    if offline and len(X):
        table = table_from_events(config.stream.name, config, placement.events)
        k = config.anonymization.k if k is None else k
        for name, window_s in (("offline_windows", config.anonymization.window_s), ("offline_table", None)):
            anon = offline_release(table, k, window_s, seed)
            blo, bhi, kept = _table_boxes(qs, table, anon, X)
            answers[name] = box_answers(qs.kinds, blo, bhi, workload.lo, workload.hi,
                                        group=placement.event_release[kept], n_groups=R)
            extra[name] = {"suppressed": int((~kept).sum()), "windows": anon.windows}
    per_release = []
    for r, rel in enumerate(placement.releases):
        n = int((placement.event_release == r).sum())
        per_release.append({**rel, "events": n,
                            **{name: summarize(workload, a[r], truth[r]) for name, a in answers.items()}})
    out = {"workload": {"seed": seed, "per_family": per_family, "families": list(workload.families),
                        "queries": {f: int((workload.family == f).sum()) for f in workload.families},
                        "examples": {f: [lab for lab, fam in zip(workload.label, workload.family) if fam == f][:3]
                                     for f in workload.families}},
           "events": len(placement.events), "not_encoded": int((~ok).sum()), "published_records": len(placement.records), "releases": R, "k":
           config.anonymization.k if k is None else k,
           "run": {name: summarize(workload, a.sum(0), truth.sum(0)) for name, a in answers.items()},
           "offline": extra, "per_release": per_release}
    if config.dp is not None and config.dp.aggregates:       # every aggregate, those without rows too
        out["dp"] = dp_errors(config, placement.dp_rows, placement.events)
    return out


def dp_errors(config, rows: list[dict], events: list[dict] | None = None, level: float = 0.95) -> dict:
    """One entry per aggregate of the config, in its order, whether or not it published rows (merged over
    partitions, :func:`stream_anon.dp.merge.merge_rows`): ``kind``, ``output`` (the rows measured: per-window rows
    where the aggregate has them, else its running rows), ``rows``, ``unit`` (events, a share, or the value
    field's unit), ``noise_rms`` (root mean square of the rows' stated noise std: the RMSE an unbiased release
    has), ``stated_half_width`` (median half-width of the rows' ``level`` intervals) and, for counts and sums,
    ``stated_relative`` (relative to the released value, rows whose value is at least 1). With the ``events``
    (the truth): ``realized``, the RMSE against the unbounded true values (:func:`stream_anon.dp.report.
    aggregate_rmse`) and, for count aggregates with per-window rows, the relative error over the cells with at
    least 1 and 10 true events (:func:`stream_anon.dp.report.release_relative_errors`)."""
    from stream_anon.dp.merge import merge_rows
    from stream_anon.dp.report import aggregate_rmse, release_relative_errors

    merged = merge_rows(rows, level=level)
    by_w = None
    if events is not None:
        from stream_anon.evaluate.stream_figures import windows_by_event_time
        by_w = dict(windows_by_event_time(events, config))
    rmse = aggregate_rmse(config.dp, merged, by_w) if by_w is not None else {}
    out = {}
    for spec in config.dp.aggregates:
        mine = [m for m in merged if m["aggregate"] == spec.name]
        output = "per_window" if any(m["output"] == "per_window" for m in mine) else "running"
        rs = [m for m in mine if m["output"] == output]
        entry = {"kind": spec.kind, "output": output, "rows": len(rs), "level": level,
                 "unit": "events" if spec.kind in ("count", "histogram") else "share" if spec.kind == "ratio"
                 else f"{spec.value_field} (its unit)"}
        out[spec.name] = entry
        if not rs:
            entry.update(noise_rms=None, stated_half_width=None, stated_relative=None)
            continue
        half = np.array([(m["interval"][1] - m["interval"][0]) / 2 for m in rs])
        value = np.array([m["value"] for m in rs], dtype=float)
        if "components" in rs[0]:        # mean / ratio: the delta method's std of the ratio, from the interval
            from statistics import NormalDist
            std = half / NormalDist().inv_cdf(0.5 + level / 2)
        else:
            std = np.array([m["noise_std"] for m in rs], dtype=float)
        big = value >= 1
        entry.update(noise_rms=round(float(np.sqrt(np.mean(std ** 2))), 4),
                     stated_half_width=round(float(np.median(half)), 4),
                     stated_relative=round(float(np.median(half[big] / value[big])), 4)
                     if spec.kind in ("count", "histogram", "sum") and big.any() else None)
        if by_w is None:
            continue
        got = rmse.get(spec.name) or {}
        entry["realized"] = {"rmse": None if got.get("rmse") is None else round(got["rmse"], 4),
                             "cells": got.get("cells", 0)}
        if spec.kind == "count" and output == "per_window":
            realized = release_relative_errors(config.dp, merged, by_w, spec.name, thresholds=(10, 1))
            if realized:
                entry["realized"]["by_threshold"] = [
                    {k: t[k] for k in ("min_true_count", "cells", "median_relative_error", "mean_relative_error",
                                       "within_10pct")} for t in realized["by_threshold"]]
    return out
