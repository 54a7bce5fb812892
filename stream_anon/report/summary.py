"""The summary a data protection officer can attach to an impact assessment: the audit's verdict and figures, the
unit of privacy, the guarantees in force (with the settings' fingerprint and the key ids the releases carry), what
leaves the system and in which form, what dead letters hold, how long each topic keeps data, and the deployment's
own statements (``[report]``: purpose, controller, recipients, retention). A JSON-ready dict; :mod:`.page` renders
it. Every figure is the audit's (its summary, health and checks), never recounted here.
"""
from __future__ import annotations

from collections import Counter

from stream_anon import guarantees
from stream_anon.numbers import plain
from stream_anon.render import DEADLETTER_PAYLOAD_MAX

DAY_MS = 86_400_000


def _retention(ms: int | None) -> str:
    if ms is None:
        return "not declared (the broker's default)"
    if ms < 0:
        return "kept forever (retention.ms = -1)"
    days = ms / DAY_MS
    return f"{days:g} days (retention.ms = {ms})" if days >= 1 else f"{ms / 3_600_000:g} h (retention.ms = {ms})"


def _qi_form(qi, granularity: float) -> str:
    if qi.kind == "timestamp":
        return f"time interval [from, to), at least {granularity:g} s wide, snapped to {granularity:g} s"
    if qi.kind in ("categorical", "station"):
        name = qi.hierarchy.name or "given"
        return f"a node of the hierarchy {name} ({qi.hierarchy.n_leaves} leaves): a value or a group"
    if qi.kind == "geopoint" and qi.h3 is not None:
        return f"an H3 cell of resolution {qi.h3[0]}..{qi.h3[1]}, or * (the whole area)"
    if qi.kind == "geopoint":
        return "a latitude/longitude box holding every member of the class"
    return "a numeric interval [from, to] holding every member of the class"


def _sensitive_form(field: str, domains: dict) -> str:
    d = domains.get(field)
    if d is None or d.type == "scalar":
        return "as it is (null, boolean, number or short text)"
    if d.type == "category":
        other = f"; any other value published as {d.other!r}" if d.other else "; any other value dead-lettered"
        return f"as it is, one of {len(d.values)} declared values{other}"
    if d.type == "number":
        return f"as it is, a number in [{d.lower:g}, {d.upper:g}]" + (" (integer)" if d.integer else "") + \
            "; outside: dead-lettered"
    if d.type == "boolean":
        return "as it is (true / false / null)"
    return f"as it is, text of at most {d.max_length} characters"


def fields_out(config) -> list[dict]:
    """Every field of an event and how it leaves the system (or that it does not)."""
    a = config.anonymization
    out = [{"field": ", ".join(qi.fields), "role": f"quasi-identifier {qi.name}", "topic": "records",
            "form": "generalized with its class: " + _qi_form(qi, a.time_granularity_s)}
           for qi in config.quasi_identifiers]
    domains = {d.field: d for d in config.domains}
    out += [{"field": f, "role": "sensitive" + (" (invariant: m-invariance)" if f == config.invariant_sensitive else ""),
             "topic": "records", "form": _sensitive_form(f, domains)} for f in config.sensitive]
    out.append({"field": config.stream.privacy_unit, "role": "privacy unit", "topic": "none",
                "form": "never published; keyed pseudonym (HMAC) in dead letters only"})
    out += [{"field": f, "role": "identifier (pseudonymize)", "topic": "dead letters",
             "form": "keyed pseudonym (HMAC) in dead letters; never in records"} for f in config.pseudonymize]
    out += [{"field": f, "role": "identifier (drop)", "topic": "none", "form": "removed; never published"}
            for f in config.drop if f not in (config.stream.privacy_unit, "event_id")]
    out.append({"field": "event_id", "role": "event id", "topic": "records, dead letters",
                "form": "only as its audit token HMAC(secret, event id), which links a record to its raw event for a "
                        "holder of the secret only" + ("; the id itself is removed from dead letters"
                                                       if "event_id" in config.drop else "")})
    if config.dp is not None:
        for s in config.dp.aggregates:
            keys = ", ".join(g.name for g in s.group_by) or "no grouping"
            out.append({"field": s.value_field or "(events)", "role": f"DP aggregate {s.name}",
                        "topic": "aggregates", "form": f"{s.kind} per window by {keys}, with noise (epsilon "
                                                      f"{plain(float(s.epsilon), 6)} per {config.dp.privacy_unit} per "
                                                      f"{config.dp.period or 'run'})"})
    out.append({"field": "every other field", "role": "", "topic": "dead letters only",
                "form": "not published in records or aggregates"})
    return out


def guarantees_in_force(config, ctx) -> dict:
    """The guarantee settings of the config, their fingerprint, and the fingerprints, key ids and accepted
    changes the releases and dead letters carry."""
    settings = guarantees.settings(config)
    mine = guarantees.fingerprint(settings)
    manifests = ctx.manifests if ctx is not None else []
    carried = Counter(m.get("settings_fingerprint") or "(none)" for m in manifests)
    kids = Counter(m.get("kid") for m in manifests if m.get("kid"))
    kids.update(d.get("kid") for d in (ctx.deadletters if ctx is not None else []) if d.get("kid"))
    a = config.anonymization
    lines = [f"k = {a.k}: every class holds at least {a.k} distinct {config.stream.privacy_unit} (over all its "
             "releases)",
             f"windows of {a.window_s:g} s; every event published or suppressed within {a.max_delay_s:g} s of its "
             f"event time; reuse of published classes: {a.reuse}"]
    lines += [f"criterion: {c!r}" for c in a.criteria]
    if a.m is not None:
        lines.append(f"m = {a.m}: m-invariance on {config.invariant_sensitive} (one signature per individual for "
                     f"{a.m_horizon_s:g} s after its last release)")
    if config.dp is not None:
        dp = config.dp
        lines.append(f"differential privacy: epsilon {plain(float(dp.epsilon_budget), 6)} per {dp.privacy_unit} per "
                     f"{dp.period or 'run'}" + (f" ({dp.timezone})" if getattr(dp, "timezone", None) else "") +
                     f", over {len(dp.aggregates)} aggregates")
    changed = sorted({c for m in manifests for c in m.get("settings_changed") or ()})
    return {"lines": lines, "fingerprint": mine, "settings": len(settings),
            "releases_by_fingerprint": dict(carried), "releases_match": bool(manifests) and set(carried) == {mine},
            "key_ids": dict(kids), "settings_changed": changed}


def retention(config, broker: dict | None = None) -> list[dict]:
    """How long each topic of the stream keeps data: the topic plan (``topics apply --config``), what the broker
    states (``broker``: topic -> retention.ms, None not stated, or why it could not be read) and the raw topic's
    declared limit (``[stream] input_retention_s``) with the retention guard's verdict on it."""
    from stream_anon.kafka.retention import RetentionCheck, declared_ms
    from stream_anon.kafka.topics import stream_topic_defs

    defs = stream_topic_defs(config)
    raw = config.stream.input_topic
    out = []
    for name, d in defs.items():
        row = {"topic": name, "holds": "raw events (identifying)" if name == raw else d.value or "",
               "retention": _retention(d.retention_ms)}
        stated = (broker or {}).get(name, "not read")
        if broker is not None:
            row["broker"] = stated if isinstance(stated, str) else _retention(stated) if stated is not None \
                else "not stated by the broker"
        if name == raw:
            declared = config.stream.input_retention_s
            row["declared"] = f"{declared:g} s ([stream] input_retention_s)" if declared else \
                "not declared ([stream] input_retention_s)"
            if declared and broker is not None:
                ms = declared_ms(declared)
                assert ms is not None           # declared is a number of seconds
                check = RetentionCheck(name, ms, stated if isinstance(stated, int) else None,
                                       error=stated if isinstance(stated, str) else None)
                row["declared"] += ": " + check.detail()
        out.append(row)
    return out


def _risk(report, per_release: list[dict]) -> dict:
    """The audit's risk summary of the run (``risk.summary``), with the release of the highest prosecutor risk."""
    s = dict((getattr(report, "risk", None) or {}).get("summary") or {})
    worst = max(per_release, key=lambda r: r["prosecutor"]["highest"], default=None)
    s["prosecutor_highest"] = (s.get("prosecutor") or {}).get("highest")
    s["highest_release"] = worst and worst["release_id"]
    return s


def summary(config, report, ctx, figures: dict, broker_retention: dict | None = None) -> dict:
    s, h = report.summary, report.health or {}
    risk = figures.get("risk") or []
    q = figures.get("query_error")
    sec = config.report
    return {
        "stream": config.stream.name,
        "verdict": report.verdict, "verdict_reason": report.verdict_reason,
        "counts": {k: s.get(k) for k in ("events_in", "published", "suppressed", "dead_lettered", "deferred",
                                         "open", "lost", "releases", "classes", "min_individuals", "k")},
        "ncp": h.get("ncp"), "class_individuals": h.get("class_individuals"),
        "risk": _risk(report, risk),
        "query_error": q and {v: q["run"][v]["all"] for v in q["run"]},
        "dp": figures.get("dp_budget") and {"budget": figures["dp_budget"]["budget"],
                                             "worst_unit_charge": figures["dp_budget"]["worst_unit_charge"]},
        "unit_of_privacy": {"records": config.stream.privacy_unit,
                            "dp": None if config.dp is None else f"{config.dp.privacy_unit} per "
                                                                 f"{config.dp.period or 'run'}"},
        "guarantees": guarantees_in_force(config, ctx),
        "fields": fields_out(config),
        "deadletters": {"by_reason": h.get("deadletters_by_reason") or {},
                        "hold": "each rejected event with its identifiers redacted (the privacy unit and the "
                                "pseudonymized fields replaced by keyed pseudonyms, dropped identifiers removed); "
                                "every other field as it was, NOT anonymized; cut to "
                                f"{DEADLETTER_PAYLOAD_MAX:,} characters; a payload that is not a JSON object is "
                                "withheld (size and digest only) unless the worker runs with --deadletter-raw-payload"},
        "retention": retention(config, broker_retention),
        "statement": {"purpose": sec.purpose, "controller": sec.controller, "recipients": list(sec.recipients),
                      "retention": sec.retention},
    }
