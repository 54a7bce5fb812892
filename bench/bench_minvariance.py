"""m-invariance benchmark (issue 3), writing bench/results/minvariance.json.

On the oyster-cards stream (real Oyster journeys grouped into 2,000 persistent cards over 3 days; the bundled slice,
and the full Monday pool when ../shared/data is present) and on the real Citi Bike bikes, for m = 2, 3, 4, the SAME
stream is released four ways by the engine (one partition, k of the config):

* ``k_only``        the engine without m (k-anonymous classes; the product category is still published);
* ``m_unique``      every release m-unique on its own, no signature kept (``make_former(config, invariance=False)``;
                    no configuration key reaches it): the
                    "non-invariant release" the cost of invariance is measured against;
* ``m_invariant``   the m-invariant releases (``stream_anon.formers.minvariant``);
* ``naive_kl``      the attack's baseline: per-window k-anonymous, distinct l = m diverse groups
                    (``stream_anon.attacks.intersection.naive_kl_releases``).

Reported per run: counterfeit individuals and records (share of the class individuals / of the published
records), the lower bound the value distribution forces (sum over releases of max(0, m c - n), from the independent
checker) and their ratio (issue target: <= 1.5), mean NCP of the real records and its ratio to ``m_unique`` and to
``k_only`` (issue target: <= 1.2 of the non-invariant release), suppression, the checker's verdict, the intersection
attack (share of cards pinned to one value, mean candidates, minimum) and engine throughput (best of 3, one core).
A sweep of ``split_tolerance`` at m = 2 and 3 (slice) shows the counterfeit/loss trade-off of the split rule, with
and without invariance.

    .venv/bin/python bench/bench_minvariance.py [--quick]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

from stream_anon.attacks.intersection import intersection_attack, naive_kl_releases  # noqa: E402
from stream_anon.audit import AuditConfig, MInvarianceConfig, check_m_invariance  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import DATASETS, load_events, oyster_cards  # noqa: E402
from stream_anon.engine import Engine, make_former, get_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"bench-secret-minvariance-0123456789"


def run_engine(config, events, repeat: int = 1, invariance: bool = True):
    """(releases, best seconds) of process + flush over the whole stream."""
    best, releases = float("inf"), None
    for _ in range(repeat):
        engine = Engine(config, secret=SECRET, former=make_former(config, invariance=invariance))
        t0 = time.perf_counter()
        rel = engine.process(events).releases + engine.flush().releases
        best = min(best, time.perf_counter() - t0)
        releases = rel
    return releases, best


def r4(x):
    return None if x is None else round(float(x), 4)


def measure(name, config, events, unit, invariant, m, repeat, attack_qis=None, invariance=True):
    releases, seconds = run_engine(config, events, repeat, invariance)
    records = [r for rel in releases for r in rel.records]
    manifests = [rel.manifest() for rel in releases]
    published = sum(rel.published for rel in releases)
    suppressed = Counter()
    for rel in releases:
        suppressed.update(rel.suppressed)
    ncp = sum(rel.ncp_mean * rel.published for rel in releases) / published if published else None
    class_individuals = sum(c.individuals for rel in releases for c in rel.classes)
    cf_ind = sum(c.counterfeit_individuals for rel in releases for c in rel.classes)
    cf_rec = sum(rel.counterfeit_records for rel in releases)
    check = check_m_invariance(records, manifests, events, SECRET, MInvarianceConfig(m, unit, invariant))
    lb = check.summary["counterfeit_lower_bound"]
    attack = intersection_attack(records, events, SECRET, privacy_unit=unit, invariant=invariant)
    out = {
        "run": name, "releases": len(releases), "classes": sum(len(rel.classes) for rel in releases),
        "published": published, "suppressed": sum(suppressed.values()), "suppressed_by_reason": dict(suppressed),
        "suppression_share": r4(sum(suppressed.values()) / len(events)),
        "mean_ncp": r4(ncp),
        "counterfeit_individuals": cf_ind, "counterfeit_records": cf_rec,
        "counterfeit_individual_share": r4(cf_ind / (class_individuals + cf_ind)) if class_individuals else 0.0,
        "counterfeit_record_share": r4(cf_rec / (published + cf_rec)) if published else 0.0,
        "counterfeit_lower_bound": lb, "counterfeit_vs_lower_bound": r4(cf_ind / lb) if lb else None,
        "checker": {"passed": check.passed, "m_unique": check.checks["m_uniqueness"]["passed"],
                    "signature_changes": check.summary["signature_changes"]},
        "attack": {"targets": attack["targets"], "pinned": attack["pinned"],
                   "success_rate": r4(attack["success_rate"]), "mean_candidates": r4(attack["mean_candidates"]),
                   "min_candidates": attack["min_candidates"]},
        "seconds": round(seconds, 3), "throughput_eps": round(len(events) / seconds),
    }
    if attack_qis is not None:
        qi = intersection_attack(records, events, SECRET, privacy_unit=unit, invariant=invariant, knowledge="qi",
                                 quasi_identifiers=attack_qis)
        out["attack_qi_knowledge"] = {"success_rate": r4(qi["success_rate"]),
                                      "mean_candidates": r4(qi["mean_candidates"]),
                                      "min_candidates": qi["min_candidates"]}
    return out


def naive(events, k, m, unit, invariant, window_s, qis):
    records, _ = naive_kl_releases(events, k, m, secret=SECRET, privacy_unit=unit, invariant=invariant,
                                   window_s=window_s, quasi_identifiers=qis, sensitive_fields=[invariant])
    attack = intersection_attack(records, events, SECRET, privacy_unit=unit, invariant=invariant)
    return {"run": "naive_kl", "l": m, "attack": {"targets": attack["targets"], "pinned": attack["pinned"],
                                                  "success_rate": r4(attack["success_rate"]),
                                                  "mean_candidates": r4(attack["mean_candidates"]),
                                                  "min_candidates": attack["min_candidates"]}}


def stream_block(label, config_path, events, ms, repeat, sweep: bool, qi_attack: bool):
    base = load_config(config_path)
    a = base.anonymization
    unit, invariant = base.stream.privacy_unit, base.invariant_sensitive
    qis = AuditConfig.from_toml(config_path).quasi_identifiers
    plain = base.replace_anonymization(m=None)
    k_only = {m: measure("k_only", plain, events, unit, invariant, m, repeat) for m in ms}
    block = {"stream": label, "events": len(events), "individuals": len({get_path(e, unit) for e in events}),
             "k": a.k, "window_s": a.window_s, "max_delay_s": a.max_delay_s, "invariant": invariant, "by_m": {}}
    for m in ms:
        print(f"[{label}] m = {m}", flush=True)
        inv = measure("m_invariant", base.replace_anonymization(m=m), events, unit, invariant, m, repeat,
                      attack_qis=qis if qi_attack else None)
        uniq = measure("m_unique", base.replace_anonymization(m=m), events, unit,
                       invariant, m, repeat, invariance=False)
        kk = k_only[m]
        row = {
            "m_invariant": inv, "m_unique": uniq, "k_only": kk,
            "naive_kl": naive(events, a.k, m, unit, invariant, a.window_s, qis),
            "targets": {
                "counterfeits_vs_lower_bound": inv["counterfeit_vs_lower_bound"],
                "counterfeits_target_1_5_met": (inv["counterfeit_individuals"]
                                                <= 1.5 * inv["counterfeit_lower_bound"]),
                "ncp_vs_m_unique": r4(inv["mean_ncp"] / uniq["mean_ncp"]) if uniq["mean_ncp"] else None,
                "ncp_vs_m_unique_target_1_2_met": inv["mean_ncp"] <= 1.2 * uniq["mean_ncp"],
                "ncp_vs_k_only": r4(inv["mean_ncp"] / kk["mean_ncp"]) if kk["mean_ncp"] else None,
                "ncp_vs_k_only_target_1_2_met": inv["mean_ncp"] <= 1.2 * kk["mean_ncp"],
                "throughput_vs_k_only": r4(inv["throughput_eps"] / kk["throughput_eps"]),
            },
        }
        block["by_m"][str(m)] = row
        t = row["targets"]
        print(f"  invariant: cf {inv['counterfeit_individuals']} vs lb {inv['counterfeit_lower_bound']} "
              f"({t['counterfeits_vs_lower_bound']}), ncp {inv['mean_ncp']} (x{t['ncp_vs_m_unique']} m-unique, "
              f"x{t['ncp_vs_k_only']} k-only), attack {inv['attack']['success_rate']} / naive "
              f"{row['naive_kl']['attack']['success_rate']} / m-unique {uniq['attack']['success_rate']} / k-only "
              f"{kk['attack']['success_rate']}, {inv['throughput_eps']} ev/s", flush=True)
    if sweep:
        block["split_tolerance_sweep"] = {}
        for m in (2, 3):
            rows = block["split_tolerance_sweep"][str(m)] = []
            for tol in (0, 1, 2, 4, 8, 1000):
                inv = measure("m_invariant", base.replace_anonymization(m=m, m_params={"split_tolerance": tol}),
                              events, unit, invariant, m, 1)
                uniq = measure("m_unique", base.replace_anonymization(
                    m=m, m_params={"split_tolerance": tol}), events, unit, invariant, m, 1, invariance=False)
                rows.append({
                    "split_tolerance": tol, "mean_ncp": inv["mean_ncp"], "m_unique_mean_ncp": uniq["mean_ncp"],
                    "ncp_vs_m_unique": r4(inv["mean_ncp"] / uniq["mean_ncp"]),
                    "counterfeit_individual_share": inv["counterfeit_individual_share"],
                    "m_unique_counterfeit_individual_share": uniq["counterfeit_individual_share"],
                    "counterfeit_lower_bound": inv["counterfeit_lower_bound"],
                    "counterfeit_vs_lower_bound": inv["counterfeit_vs_lower_bound"],
                    "attack_min_candidates": inv["attack"]["min_candidates"],
                    "m_unique_attack_success_rate": uniq["attack"]["success_rate"]})
                print(f"  m = {m}, tolerance {tol}: ncp {inv['mean_ncp']} (m-unique {uniq['mean_ncp']}), cf share "
                      f"{inv['counterfeit_individual_share']} ({inv['counterfeit_vs_lower_bound']}x lb)", flush=True)
    return block


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="slice only, one timing repeat, no sweep")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "minvariance.json"))
    args = ap.parse_args()
    repeat = 1 if args.quick else 3
    ms = (2, 3, 4)
    cards_cfg = ROOT / "configs" / "oyster-cards.toml"
    t0 = time.time()
    streams = []
    slice_events = oyster_cards.read_events()
    streams.append(stream_block("oyster-cards (slice)", cards_cfg, slice_events, ms, repeat, sweep=not args.quick,
                                qi_attack=not args.quick))
    full = DATASETS["oyster-cards"].full_path
    if full.exists() and not args.quick:
        streams.append(stream_block("oyster-cards (full Monday pool)", cards_cfg, oyster_cards.read_events(full),
                                    ms, repeat, sweep=False, qi_attack=False))
    streams.append(stream_block("citibike (bikes, slice)", ROOT / "configs" / "citibike.toml",
                                load_events("citibike"), ms, repeat, sweep=False, qi_attack=False))
    doc = {
        "benchmark": "m-invariance (issue 3)",
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "threads": "numpy pinned to 1"},
        "oyster_cards_params": oyster_cards.OysterCardsParams().__dict__,
        "notes": {
            "counterfeit_lower_bound": "sum over releases of max(0, m*c - n): n real individuals of the release, c "
                                       "of them holding its most common value (the checker's figure)",
            "mean_ncp": "mean NCP of the real records (counterfeit records carry their class's NCP but are no data)",
            "m_unique": "each release m-unique on its own, classes choose their values, no signature kept: the "
                        "non-invariant release; the intersection attack works on it again",
            "attack": "knowledge='class': the adversary knows which class holds the target in every release; "
                      "knowledge='qi': it knows the target's raw QIs and takes every covering class",
            "why_ncp_is_high": "m-uniqueness forces classes to mix fare products, and products follow the mode: "
                               "rail taps are 52% travelcard and 42% PAYG (bus & tram passes never tap rail), so a "
                               "rail-only class is m-unique only with ~50% counterfeits; the split rule keeps "
                               "counterfeits near the lower bound by mixing rail and bus, which generalizes both "
                               "location and event type to the root. The sweep shows the trade-off.",
            "m2": "with m = 2 the lower bound is about 0 (no product above half of a release), so no invariant "
                  "release meets 1.5 x the bound: whenever the members of a signature present in a release miss "
                  "one of its values, a counterfeit is unavoidable. Signatures have m + 1 = 3 values (2 would "
                  "need exactly balanced classes) and every class must hold all 3: a rail-only class cannot hold "
                  "a bus & tram pass, where a per-release m-unique class just uses {travelcard, payg}; at every "
                  "split tolerance invariance costs about 1.5x its loss.",
        },
        "streams": streams,
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out} in {doc['seconds']} s")


if __name__ == "__main__":
    main()
