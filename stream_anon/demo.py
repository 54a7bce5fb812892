"""``stream-anon demo``: real events through an embedded broker, a worker, and the independent audit.

Steps: start the embedded Tansu broker on a free loopback port, provision the topics, replay N real events of
the bundled slice (keyed by the pseudonymized privacy unit), run a worker until every replayed event is
accounted for (published, suppressed, dead-lettered or deferred), audit the output topics against the raw
topic, print a summary and write a JSON report. Exit status 1 when the audit fails. The attacks the report states
(intersection on m-invariant releases, membership inference on DP aggregates) come from
:mod:`stream_anon.evaluate.stream_figures`: no production module imports an attack.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

from stream_anon import contract, crypto
from stream_anon.calibrate import toml_text
from stream_anon.config import with_files_beside


def derived_config(dataset: str, out_dir: Path, dp: bool = True, **anonymization) -> Path:
    """Copy the bundled config of ``dataset`` (configs/<dataset>.toml) into out_dir with its files beside it
    (:func:`~stream_anon.config.with_files_beside`) and parameter overrides (``dp=False``: without the DP
    aggregate tables)."""
    src = contract.config_path(dataset)
    raw = tomllib.loads(src.read_text())
    if not dp:
        raw.pop("dp", None)
        raw.pop("aggregates", None)
    with_files_beside(raw, src.parent, out_dir)
    raw["anonymization"].update({k: v for k, v in anonymization.items() if v is not None})
    out = out_dir / f"{dataset}.toml"
    out.write_text(toml_text(raw))
    return out


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def latency_seconds(bootstrap: str, raw_topic: str, records_topic: str, secret: bytes) -> np.ndarray:
    """Wall-clock seconds from a raw event's produce time to its published record's produce time."""
    from stream_anon.audit.kafka_source import _parallel, read_topic

    read = _parallel({topic: (read_topic, (bootstrap, topic), {"idle_s": 1.0, "with_timestamps": True})
                      for topic in (raw_topic, records_topic)})       # side by side: each waits for quiet
    produced = {}
    for _src, value, ts in read[raw_topic]:
        try:
            produced[crypto.audit_token(secret, json.loads(value)["event_id"])] = ts
        except (ValueError, KeyError, TypeError):
            continue
    out = []
    for _src, value, ts in read[records_topic]:
        t0 = produced.get(json.loads(value).get("audit_token"))
        if t0 is not None:
            out.append((ts - t0) / 1000.0)
    return np.array(out)


def run_demo(dataset: str = "oyster", events: int | None = None, k: int | None = None,
             report_path: str | None = None, timeout_s: float = 600.0, full: bool = False,
             dp: bool = False, m: int | None = None) -> int:
    from stream_anon.audit.kafka_source import audit_from_kafka, read_outputs
    from stream_anon.broker import EmbeddedBroker
    from stream_anon.config import load_config
    from stream_anon.datasets import load_events
    from stream_anon.kafka.replay import replay, unit_key_fn
    from stream_anon.kafka.topics import apply_topics, load_topic_definitions
    from stream_anon.kafka.supervise import run_until_accounted

    secret = crypto.throwaway_secret()
    _say("generated a throwaway secret for this run (audit tokens cannot be mapped back after it exits); "
         "a real deployment reads STREAM_ANON_SECRET")
    work = Path(tempfile.mkdtemp(prefix="stream-anon-demo-"))
    config_path = derived_config(dataset, work, dp=dp, k=k, m=m)     # aggregates only with --dp
    config = load_config(config_path)
    if dp and config.dp is None:
        print(f"stream-anon demo: --dp: configs/{dataset}.toml has no [dp] / [[aggregates]] tables", file=sys.stderr)
        return 2
    data = load_events(dataset, limit=events, full=full)
    source = "the full file in ../shared/data" if full else "the bundled slice (data/ATTRIBUTION.md)"
    _say(f"dataset {dataset}: {len(data):,} real events from {source}; "
         f"k = {config.anonymization.k} distinct {config.stream.privacy_unit} per class")
    env_secret = os.environ.get(crypto.SECRET_ENV)
    os.environ[crypto.SECRET_ENV] = secret.decode()
    try:
        with EmbeddedBroker() as broker:
            _say(f"embedded Tansu broker on {broker.bootstrap}")
            apply_topics(broker.bootstrap, load_topic_definitions())
            t0 = time.monotonic()
            replay(broker.bootstrap, contract.Topics.raw(config), data,
                   key_fn=unit_key_fn(config.stream.privacy_unit), secret=secret, progress=True)
            replay_s = time.monotonic() - t0
            _say(f"replayed {len(data):,} events in {replay_s:.1f}s; starting a worker")
            acc = run_until_accounted(config_path, broker.bootstrap, work / "state", len(data), timeout_s=timeout_s,
                                      log_path=work / "worker.log", progress=True)
            _say("every event accounted for; auditing the output topics against the raw topic")
            # the worker has stopped: its topics are complete, a quiet second ends each read (as below)
            report = audit_from_kafka(broker.bootstrap, config_path, secret, idle_s=1.0)
            lat = latency_seconds(broker.bootstrap, contract.Topics.raw(config),
                                  contract.topics().records(config.stream.name), secret)
            published = read_outputs(broker.bootstrap, config.stream.name, idle_s=1.0)
            manifests = {m["release_id"]: m for m in published.manifests}
            if dp:
                from stream_anon.evaluate.stream_figures import read_dp_report
                dp_report = read_dp_report(broker.bootstrap, config)
    finally:
        if env_secret is None:
            os.environ.pop(crypto.SECRET_ENV, None)
        else:
            os.environ[crypto.SECRET_ENV] = env_secret
    s = report.summary
    # loss of the real records (a class's counterfeit records carry its NCP but are no data)
    real = [(c["records"] - c.get("counterfeit_records", 0), c["ncp"]) for m in manifests.values() for c in m["classes"]]
    n_rec = sum(n for n, _ in real)
    classes_ncp = round(sum(n * ncp for n, ncp in real) / n_rec, 4) if n_rec else None
    out = {
        "dataset": dataset, "k": config.anonymization.k, "events_in": s["events_in"], "published": s["published"],
        "suppressed": s["suppressed"], "suppressed_by_reason": s.get("suppressed_by_reason", {}),
        "dead_lettered": s["dead_lettered"], "deferred": s["deferred"], "releases": s["releases"],
        "classes": s["classes"], "min_individuals_per_class": s["min_individuals"], "mean_ncp": classes_ncp,
        "throughput_eps": acc.get("events_per_s"), "replay_eps": round(len(data) / replay_s),
        "latency_p50_s": round(float(np.percentile(lat, 50)), 3) if len(lat) else None,
        "latency_p99_s": round(float(np.percentile(lat, 99)), 3) if len(lat) else None,
        "audit_passed": report.passed,
        "audit": {name: {"passed": c["passed"], "violations": c.get("violations", 0)}
                  for name, c in report.checks.items()},
        "notes": {"throughput_eps": "input events / wall seconds from worker start until every event was "
                                    "accounted for (includes consumer-group join, ~3-4 s)",
                  "latency": "Kafka produce time of the raw event to produce time of its published record; "
                             "includes waiting for the event-time window to close (the replay is faster than "
                             "real time)"},
    }
    if config.anonymization.m is not None:
        from stream_anon.evaluate.stream_figures import minvariance_report
        out.update(minvariance_report(config, config_path, report, published.records, data, secret))
        _say(f"m-invariance (m = {out['m']}): checker {'PASSED' if out['m_invariance_passed'] else 'FAILED'}, "
             f"{out['signature_changes']} signature changes, {out['counterfeit_individuals']:,} counterfeit "
             f"individuals (lower bound {out['counterfeit_lower_bound']:,}), {out['counterfeit_records']:,} "
             f"counterfeit records; intersection attack pins {out['intersection_attack']['success_rate']:.1%} "
             f"(mean {out['intersection_attack']['mean_candidates']} candidates) vs "
             f"{out['intersection_attack']['naive_success_rate']:.1%} on naive per-window k/l releases")
    if dp:
        out["dp"] = dp_report
        _say(f"DP aggregates: {dp_report['aggregates_published']:,} rows, max epsilon per individual "
             f"{dp_report['epsilon_spent_max_individual']:.3g} of {dp_report['epsilon_budget']:g}, "
             f"{dp_report['budget_exhausted_events']} budget_exhausted; running-count RMSE "
             f"{dp_report['continual_count_rmse']} (theory {dp_report['continual_count_rmse_theory']}, naive "
             f"{dp_report['naive_count_rmse']}) over {dp_report['windows']} windows")
        if dp_report["membership_inference_auc"] is not None:
            _say(f"membership inference AUC {dp_report['membership_inference_auc']:.3f} at the budget "
                 f"({dp_report['membership_inference_auc_no_noise']:.3f} without noise; 0.5 is guessing)")
        for t in (dp_report["relative_error"] or {}).get("by_threshold", []):
            if t["cells"]:
                _say(f"{dp_report['relative_error']['aggregate']}: {t['within_10pct']} of {t['cells']} cells with "
                     f">= {t['min_true_count']} true events within 10% (max relative error "
                     f"{t['max_relative_error']:.1%}, median {t['median_relative_error']:.1%})")
            else:
                _say(f"{dp_report['relative_error']['aggregate']}: no cell with >= {t['min_true_count']} true events")
    print(report.format_text())
    print(f"\nstream-anon demo: {out['events_in']:,} events in -> {out['published']:,} published, "
          f"{out['suppressed']:,} suppressed, {out['dead_lettered']:,} dead-lettered, {out['deferred']:,} deferred; "
          f"{out['classes']:,} classes, min {out['min_individuals_per_class']} individuals (k = {out['k']}), "
          f"mean NCP {out['mean_ncp']}, {out['throughput_eps']} events/s; audit "
          f"{'PASSED' if report.passed else 'FAILED'}")
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(out, indent=2))
        print(f"report written to {report_path}")
    return 0 if report.passed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo())
