"""``stream-anon report``: one self-contained HTML page on what a stream published, for the people who decide
whether it may run (a data protection officer) and those who use its output (an analyst).

It reads what the audit reads (the raw topic, the output topics and anon.metrics:
:func:`stream_anon.audit.kafka_source.read_inputs`), runs the audit on it (:func:`stream_anon.audit.
audit_with_context`) and draws every figure from the audit's counts (:mod:`.figures`): the summary's figures are the
audit's. Plots (:mod:`.plots`, matplotlib to inline SVG), the DPO summary (:mod:`.summary`) and the page
(:mod:`.page`) follow. docs/report.md says what the page shows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_anon.progress import steps

from . import figures as _figures
from . import page, plots
from . import summary as _summary


@dataclass
class Report:
    html: str
    summary: dict
    figures: dict
    audit: Any              # the AuditReport the figures come from

    def to_dict(self) -> dict:
        return {"summary": self.summary, "figures": self.figures, "audit": self.audit.to_dict()}


def build_report(config_path, raw: list, outputs: Any, secret: bytes, metrics: list[dict] | None = None,
                 query_seed: int = 0, broker_retention: dict | None = None,
                 allow_outside_paths: bool = False, earlier_configs=(), reread=None) -> Report:
    """The report of one stream from what was read (as :func:`stream_anon.audit.audit` takes it, ``reread`` too);
    ``broker_retention``: topic -> the ``retention.ms`` the broker states (:func:`broker_retention`);
    ``allow_outside_paths``: the files the config names may lie outside its directory tree; ``earlier_configs``:
    the paths of the configs in force before accepted configuration changes (the audit's ``--earlier-config``)."""
    from stream_anon.audit import AuditConfig, audit_with_context
    from stream_anon.config import load_config

    config = load_config(config_path, allow_outside_paths)
    earlier = [AuditConfig.from_toml(p, allow_outside_paths) for p in earlier_configs]
    report, ctx = audit_with_context(raw, outputs, secret, AuditConfig.from_toml(config_path, allow_outside_paths),
                                     alerts=metrics, earlier_configs=earlier, reread=reread)
    figs: dict[str, Any]
    if ctx is None:      # outputs under another secret: nothing can be counted, the page says why
        figs = {"releases": [], "class_sizes": [], "risk": [], "dp_budget": None, "query_error": None,
                "deadletters_by_reason": {}, "alerts_by_name": {}}
    else:
        figs = _figures.compute(report, ctx, config, query_seed=query_seed)
    summ = _summary.summary(config, report, ctx, figs, broker_retention)
    a = config.anonymization
    draw = {"class-sizes": lambda: plots.class_sizes(figs, a.k),
            "ncp-suppression": lambda: plots.ncp_suppression(figs, a.max_suppression_ratio),
            "risk": lambda: plots.risk(figs), "dp-budget": lambda: plots.dp_budget(figs),
            "query-error": lambda: plots.query_error(figs), "deadletters-alerts": lambda: plots.deadletters_alerts(figs)}
    svgs = {pid: draw[pid]() for pid in steps(draw, "drawing the plots", unit="plot")}
    return Report(page.render(summ, figs, svgs), summ, figs, report)


def report_from_kafka(bootstrap, config_path, secret: bytes | str, raw_topic: str | None = None,
                      idle_s: float = 3.0, max_wait_s: float = 120.0, allow_outside_paths: bool = False,
                      earlier_configs=()) -> Report:
    """Read the stream's topics from the broker as the audit does, then :func:`build_report`."""
    from stream_anon.audit.kafka_source import read_inputs

    from stream_anon.config import load_config
    from stream_anon.kafka.topics import stream_topic_defs

    secret = secret.encode() if isinstance(secret, str) else secret
    read = read_inputs(bootstrap, config_path, secret, raw_topic, idle_s, max_wait_s, metrics=True,
                       allow_outside_paths=allow_outside_paths)
    retention = broker_retention(bootstrap, list(stream_topic_defs(load_config(config_path, allow_outside_paths))))
    return build_report(config_path, read.raw, read.outputs, secret, read.metrics, broker_retention=retention,
                        allow_outside_paths=allow_outside_paths, earlier_configs=earlier_configs, reread=read.reread)


def broker_retention(bootstrap, topics: list[str]) -> dict:
    """Topic -> the ``retention.ms`` the broker states for it (None: not stated; a text: why it could not be
    read), read as the worker's retention guard reads it (:mod:`stream_anon.kafka.retention`)."""
    from stream_anon.kafka.retention import confluent_admin, topic_retention_ms

    admin = confluent_admin(bootstrap)
    out: dict = {}
    for topic in topics:
        try:
            out[topic] = topic_retention_ms(admin, topic)
        except Exception as exc:        # noqa: BLE001 - any broker answer short of a value: said, not raised
            out[topic] = f"could not be read ({type(exc).__name__})"
    return out


def write(report: Report, html_path, json_path=None) -> None:
    Path(html_path).parent.mkdir(parents=True, exist_ok=True)
    Path(html_path).write_text(report.html, encoding="utf-8")
    if json_path:
        Path(json_path).write_text(json.dumps(report.to_dict(), indent=1, default=str))


__all__ = ["Report", "build_report", "report_from_kafka", "write"]
