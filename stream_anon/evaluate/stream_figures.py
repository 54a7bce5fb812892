"""Figures of a stream's published output for the demo report (``stream-anon demo``), including the attacks run on
it, which is why they live in the evaluation package (no production module imports an attack):

- :func:`read_dp_report`: the DP aggregates read back from the broker against the true values (error figures of
  :mod:`stream_anon.dp.report`) and the membership inference attack on them (:func:`membership_auc`);
- :func:`minvariance_report`: the independent m-invariance verdict and the intersection attack on our releases
  and on naive per-window k-anonymous, l-diverse releases of the same events.
"""
from __future__ import annotations

import json

import numpy as np

from stream_anon.audit.kafka_source import _parallel, read_topic
from stream_anon.dp.merge import merge_rows
from stream_anon.dp.report import (aggregate_rmse, membership_setting, release_relative_errors, running_count_errors,
                                   true_window_values)
from stream_anon.dp.specs import DPConfig
from stream_anon.engine import event_windows, get_path
from stream_anon.engine.space import parse_time
from stream_anon.render import TOPICS

# the count whose relative error the demo reports (hourly tap-ins per zone, oyster-cards)
RELATIVE_ERROR_AGGREGATE = "tap_ins_zone_hour"


def read_dp_report(bootstrap: str, config, idle_s: float = 1.0, attack: bool = True) -> dict:
    """The ``dp`` section of the demo report, from what is on the broker: ``anon.aggregates`` (the analyst's view:
    :func:`stream_anon.kafka.aggregates_view.read_rows`) and ``anon.metrics`` (deduplicated by (partition,
    window) / (partition, aggregate)), and the raw input topic, read partition by partition in offset order
    (dead-lettered offsets left out) for the true values.

    Headline error figures: the first count aggregate with both outputs (else the first running count);
    ``running_counts`` has every running count aggregate; ``aggregates_rmse`` every aggregate's merged releases
    against the unbounded truth; ``membership_inference`` (``attack``) the attack of
    :func:`membership_auc` on the raw events of the first period.
    """
    from stream_anon.kafka.aggregates_view import ledger_charge_by_period, read_rows

    stream, dp = config.stream.name, config.dp

    # the four topics read side by side (each read waits for its topic to go quiet)
    read = _parallel({"rows": (read_rows, (bootstrap, stream), {"idle_s": idle_s}),
                      **{topic: (read_topic, (bootstrap, topic), {"idle_s": idle_s})
                         for topic in (TOPICS.metrics, TOPICS.deadletter, config.stream.input_topic)}})

    def docs(topic):
        for src, value in read[topic]:
            try:
                yield src, json.loads(value)
            except ValueError:
                continue

    rows = read["rows"]
    windows_m, exhausted = {}, {}
    for _, d in docs(TOPICS.metrics):
        if d.get("stream") != stream:
            continue
        if d.get("type") == "dp_window":
            windows_m[(d["partition"], d["window"])] = d
        elif d.get("type") == "budget_exhausted":
            exhausted[(d["partition"], d["aggregate"])] = d
    dead = {(d["source"]["partition"], d["source"]["offset"]) for _, d in docs(TOPICS.deadletter)
            if d.get("stream") == stream and d.get("source")}
    raw: dict[int, list] = {}
    for (_, p, off), d in sorted(docs(config.stream.input_topic), key=lambda x: x[0]):
        if (p, off) not in dead:
            raw.setdefault(p, []).append(d)

    by_partition = {p: windows_by_event_time(evs, config) for p, evs in raw.items()}
    running = []
    for spec in dp.aggregates:
        if spec.kind != "count" or spec.output == "per_window":
            continue
        truth = {(p, w): x["count"] for p, ws in by_partition.items()
                 for w, x in true_window_values(dp, spec.name, ws).items()}
        running.append(running_count_errors([r for r in rows.values() if r["aggregate"] == spec.name], truth, spec))
    head = next((e for e in running if "naive_count_rmse" in e), running[0] if running else {})
    spent = [d["epsilon_spent"] for d in windows_m.values()]
    per_period = {p: v for p, v in ledger_charge_by_period(rows.values()).items() if p is not None}
    merged = merge_rows(rows.values())
    stream_windows = dict(windows_by_event_time([e for evs in raw.values() for e in evs], config))
    relative = release_relative_errors(dp, merged, stream_windows, RELATIVE_ERROR_AGGREGATE)
    attack_result = membership_auc(dp, stream_windows) if attack else None
    cut: dict[str, int] = {}
    for d in windows_m.values():
        for a, n in d["contributions_cut"].items():
            cut[a] = cut.get(a, 0) + n
    return {
        "epsilon_budget": dp.epsilon_budget,
        "privacy_unit": dp.privacy_unit if dp.unit == "individual" else dp.unit,
        "period": dp.period,
        "epsilon_spent_max_individual": max(spent, default=0.0),
        "epsilon_spent_max_individual_by_period": per_period,
        "aggregates_published": len(rows),
        "merged_rows": len(merged),
        "membership_inference_auc": attack_result and attack_result["auc_default_budget"],
        "membership_inference_auc_no_noise": attack_result and attack_result["auc_no_noise"],
        "membership_inference": attack_result,
        "relative_error": relative,
        "aggregates_rmse": aggregate_rmse(dp, merged, stream_windows),
        "budget_exhausted_events": len(exhausted),
        "continual_count_rmse": head.get("continual_count_rmse"),
        "continual_count_rmse_theory": head.get("continual_count_rmse_theory"),
        "naive_count_rmse": head.get("naive_count_rmse"),
        "windows": head.get("windows"),
        "error_aggregate": head.get("aggregate"),
        "mechanism": head.get("mechanism"),
        "contributions_cut": cut,
        "budget_exhausted": sorted(f"{a} (partition {p}, window {d['window']})" for (p, a), d in exhausted.items()),
        "running_counts": running,
        "notes": {
            "epsilon_spent_max_individual": "largest ledger total of a partition: every release is charged to "
                                            "every individual of the partition (worst case), and an individual "
                                            "lives in one partition",
            "error": "stream-wide running counts (sum over partitions) against the true bounded counts of the "
                     "same windows, over the windows every partition published; theory = root mean of the noise "
                     "variances stated on the rows; naive = prefix sums of the per-window rows (identical to the "
                     "continual figure when the configured horizon selects per-window noising, e.g. 96 windows)",
            "aggregates_published": "distinct rows (row_id) on anon.aggregates, every partition, output and key; "
                                    "merged_rows: one per window and key (stream-anon aggregates)",
            "epsilon_spent_max_individual_by_period": "per period (e.g. day): the largest ledger charge of a "
                                                      "partition through its last release of the period",
            "membership_inference_auc": "likelihood-ratio membership test (Pyrgelis et al., NDSS 2018) on the count "
                                        "aggregates of the first period: AUC of telling whether a known card is in a "
                                        "group of cards from the group's releases at the configured budget (0.5: "
                                        "guessing); _no_noise: the same on the noise-free bounded counts",
            "relative_error": "|released - true| / true of the merged hourly releases of tap_ins_zone_hour per zone "
                              "against the unbounded true count, over the zone-hours with at least min_true_count "
                              "taps (the bundled slice is a sample: few or no zone-hours reach 500)",
            "aggregates_rmse": "RMSE of each aggregate's merged releases against the unbounded truth (counts in "
                               "events, means in pence, ratios as shares)",
        },
    }


def windows_by_event_time(events: list, config) -> list[tuple[int, list]]:
    """One partition's events grouped by the engine's window rule (the window of their event time), in order."""
    times = [parse_time(get_path(e, config.stream.event_time)) for e in events]
    kept = [(t, e) for t, e in zip(times, events) if t is not None]
    if not kept:
        return []
    marks = event_windows(np.array([t for t, _ in kept]), config.anonymization.window_s).tolist()
    by_window: dict[int, list] = {}
    for w, (_, e) in zip(marks, kept):
        by_window.setdefault(w, []).append(e)
    return sorted(by_window.items())


def membership_auc(dp: DPConfig, events_by_w: dict[int, list], max_cards: int = 3000, seed: int = 14,
                   targets: int = 8, group_size: int = 20, trials: int = 30) -> dict | None:
    """Membership inference (stream_anon.attacks.membership, Knock-Knock style likelihood-ratio test) against
    the count aggregates of ``dp`` over the first period of the events (:func:`membership_setting`): can the
    adversary who knows a unit's events tell whether it is in a group of ``group_size`` units from the group's
    releases? AUC without noise (the bounded true counts) and through the release path at the configured
    budget, over ``targets`` units with at least 3 counted events and ``trials`` games each. None when
    :func:`membership_setting` is, or when there are too few units."""
    from stream_anon.attacks.membership import membership_game

    rng = np.random.default_rng(seed)
    setting = membership_setting(dp, events_by_w, max_cards, rng)
    if setting is None:
        return None
    names, period, units, vec, release = setting
    active = np.flatnonzero(vec.sum(1) >= 3)
    if len(active) < targets or len(units) <= group_size:
        return None
    chosen = rng.choice(active, targets, replace=False)
    clear = membership_game(vec, chosen, group_size, trials, lambda m: vec[m].sum(0), np.random.default_rng(seed + 1))
    noisy = membership_game(vec, chosen, group_size, trials, release, np.random.default_rng(seed + 1))
    return {"aggregates": names, "period": period, "units": len(units), "group_size": group_size,
            "targets": targets, "games": noisy["games"], "auc_no_noise": clear["auc"],
            "auc_default_budget": noisy["auc"]}


def minvariance_report(config, config_path, audit_report, records: list[dict], events: list[dict],
                       secret: bytes) -> dict:
    """The m-invariance part of the demo report: the independent checker's verdict (run by the audit on every
    release) and the intersection attack on our releases and on naive per-window k-anonymous, l-diverse (l = m)
    releases of the same events (stream_anon.attacks.intersection)."""
    from stream_anon.attacks.intersection import intersection_attack, naive_kl_releases
    from stream_anon.audit import AuditConfig

    a, s = config.anonymization, audit_report.summary
    chk = audit_report.checks.get("m_invariance", {"passed": False})
    unit, invariant = config.stream.privacy_unit, config.invariant_sensitive
    ours = intersection_attack(records, events, secret, privacy_unit=unit, invariant=invariant)
    naive, _ = naive_kl_releases(events, a.k, a.m, secret=secret, privacy_unit=unit, invariant=invariant,
                                 window_s=a.window_s, quasi_identifiers=AuditConfig.from_toml(config_path)
                                 .quasi_identifiers, sensitive_fields=[invariant], stream=f"naive-{config.stream.name}")
    leak = intersection_attack(naive, events, secret, privacy_unit=unit, invariant=invariant)

    def rnd(x):
        return None if x is None else round(float(x), 4)

    individuals = s.get("m_invariance_individuals") or 0
    return {
        "m": a.m, "invariant": invariant, "m_invariance_passed": bool(chk["passed"]),
        "signature_changes": s.get("signature_changes"), "counterfeit_individuals": s.get("counterfeit_individuals"),
        "counterfeit_lower_bound": s.get("counterfeit_lower_bound"),
        "counterfeit_records": s.get("counterfeit_records"),
        "counterfeit_records_share": rnd(s.get("counterfeit_records", 0) / max(1, s["records"])),
        "intersection_attack": {
            "naive_success_rate": rnd(leak["success_rate"]), "naive_mean_candidates": rnd(leak["mean_candidates"]),
            "success_rate": rnd(ours["success_rate"]), "mean_candidates": rnd(ours["mean_candidates"]),
            "min_candidates": ours["min_candidates"], "targets": ours["targets"], "naive_targets": leak["targets"],
            "individuals": individuals,
            "adversary": "knows which class holds the target in every release it appears in; intersects the "
                         "classes' sets of published invariant values (pinned = one value left)",
            "naive": f"per-window k = {a.k} (distinct individuals), distinct l = {a.m} diversity, no invariance",
        },
    }
