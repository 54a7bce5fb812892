"""Empirical DP audit (issue 39): a distinguishing test on neighbouring inputs, after Jagielski, Ullman & Oprea,
*Auditing Differentially Private Machine Learning*, NeurIPS 2020, and Nasr et al., *Adversary Instantiation*,
IEEE S&P 2021. Writes bench/results/dp_audit.json.

Neighbours: D = one partition's events of a real Oyster day (oyster-cards built from the full Monday file when
``../shared/data`` is present, else the bundled slice) without a target card, D' = the same with every event of
the target. The target is a worst case of the bounds: 8 windows of 2 hours, each with ``--journeys`` journeys (tap
in, tap out at one station, full fare at the mean's upper clamp, capped), so every aggregate of
configs/oyster-cards.toml takes all it can from it (W windows, C events per window, one cell).

Library path: the configuration through stream_anon.config.load_config; per side one DPAggregator with its
BudgetLedger over the partition's windows (those holding events, as the worker's engine closes them; the
aggregator releases skipped ones), recording what each release is given (:func:`run_partition`): bounding,
window caps, schedule and ledger are the product's and do not depend on the noise. Then, per trial and side, a
fresh secret gives the partition's noise seed (stream_anon.crypto.dp_noise_seed, as the worker derives it) and
the releases whose bounded values differ between D and D' go again through the product's Releaser and new
counters (:func:`replay`): the per-window values do not depend on the counters' state (each release's noise is
drawn from HMAC(seed, aggregate, component, output, release)). The other releases are the same on both sides
and their noise is independent of these, so they carry no information about the target; running rows are prefix
sums of the per-window ones (post-processing). Both are checked (``checks``): whole DPAggregator runs with the
trial's seed give the replayed values, and their running rows are the per-window prefix sums.

Distinguisher: the log-likelihood ratio of D' against D over the published values that differ, from each row's
``noise_scale`` (two-sided geometric: ``(|y - x_D| - |y - x_D'|) / scale``), summed per aggregate and over all
aggregates (the whole release). "Present" iff it is >= a threshold chosen on the first half of each side's
trials (the one whose bound is largest there); FPR and FNR on the second half give two-sided 95% Clopper-Pearson
upper bounds (each misses with probability 0.025: the bound holds with 95% confidence) and
``epsilon_lb = max(log((1 - FNR_u) / FPR_u), log((1 - FPR_u) / FNR_u))`` (delta = 0).

Naive controls (``naive_<P>``): the same card keyed by journey over P partitions (journey j on partition j mod
P), each partition an aggregator with its own ledger and seed, the observer seeing every partition's rows: each
partition bounds the card on its own, so the release spends up to P times its claim. Their bounds must exceed
the claims where ours must not.

Structural (:func:`structural_check`, section ``structural``): neighbouring inputs must give the same set of DP
rows, for a unit whose only event is the earliest of its partition, the latest, or alone in an hour: through the
worker's core with the release schedule (every case identical), and through the aggregator without a declared
start (the schedule before issue 39: it differs where the unit's event is the partition's first).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_dp_audit.py [--cards 50000] [--trials 20000]
        [--cases ours,naive_2] [--out bench/results/dp_audit.json] [--structural-only]
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import orjson
from scipy.stats import beta

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stream_anon import crypto  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import DATASETS, oyster_cards  # noqa: E402
from stream_anon.dp import BudgetLedger, DPAggregator  # noqa: E402
from stream_anon.dp.release import ReleasedCells, Releaser, new_counters  # noqa: E402
from stream_anon.events import parse_event_time  # noqa: E402
from stream_anon.worker.aggregates import AGGREGATES_TOPIC  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402

CONFIG = REPO / "configs" / "oyster-cards.toml"
TARGET = "oyc-card-audit-target"
STRUCTURAL_UNIT = "oyc-card-audit-structural"
TARGET_HOUR = 8             # the target's 8 windows: 08:00-10:00 London time (GMT in November)
TARGET_WINDOWS = 8          # the largest W of the configuration (fare_histogram)
FARE = 1000                 # the mean's upper clamp (worst case of the bounds, not a real 2009 fare)


# -- statistics ---------------------------------------------------------------------------------------------------
def clopper_pearson(k, n, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided ``1 - alpha`` Clopper-Pearson interval of a binomial proportion (``k`` of ``n``), elementwise:
    the ``alpha/2`` and ``1 - alpha/2`` quantiles of Beta(k, n-k+1) and Beta(k+1, n-k)."""
    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(k <= 0, 0.0, beta.ppf(alpha / 2, np.maximum(k, 1e-300), n - k + 1))
        hi = np.where(k >= n, 1.0, beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1e-300)))
    return lo, hi


def epsilon_lower_bound(fp, fn, n_absent, n_present, alpha: float = 0.05):
    """``max(log((1 - FNR_u) / FPR_u), log((1 - FPR_u) / FNR_u))`` with the Clopper-Pearson upper bounds of the
    false positive rate (``fp`` of ``n_absent`` trials on D) and the false negative rate (``fn`` of ``n_present``
    on D'); delta = 0. Can be negative (no evidence)."""
    fpr_u = clopper_pearson(fp, n_absent, alpha)[1]
    fnr_u = clopper_pearson(fn, n_present, alpha)[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1 - fnr_u, 0.0) / fpr_u)
        b = np.log(np.maximum(1 - fpr_u, 0.0) / fnr_u)
    return np.nan_to_num(np.maximum(a, b), nan=-np.inf)


def threshold_scan(s_absent: np.ndarray, s_present: np.ndarray, thresholds: np.ndarray, alpha: float = 0.05):
    """For each threshold t, the test "present iff s >= t": (false positives, false negatives, epsilon bound)."""
    a, p = np.sort(s_absent), np.sort(s_present)
    fp = len(a) - np.searchsorted(a, thresholds, side="left")
    fn = np.searchsorted(p, thresholds, side="left")
    return fp, fn, epsilon_lower_bound(fp, fn, len(a), len(p), alpha)


def audit_scores(s_absent: np.ndarray, s_present: np.ndarray, alpha: float = 0.05) -> dict:
    """The threshold chosen on the first half of each side's trials, FPR/FNR and the bound on the second half."""
    ha, hp = len(s_absent) // 2, len(s_present) // 2
    cal_a, cal_p, test_a, test_p = s_absent[:ha], s_present[:hp], s_absent[ha:], s_present[hp:]
    cand = np.unique(np.concatenate([cal_a, cal_p]))
    _, _, lb_cal = threshold_scan(cal_a, cal_p, cand, alpha)
    best = int(np.argmax(lb_cal))
    t = cand[best]
    fp, fn, lb = threshold_scan(test_a, test_p, np.array([t]), alpha)
    fp, fn, lb = int(fp[0]), int(fn[0]), float(lb[0])
    fpr_u = float(clopper_pearson(fp, len(test_a), alpha)[1])
    fnr_u = float(clopper_pearson(fn, len(test_p), alpha)[1])
    return {"epsilon_lb": max(lb, 0.0), "epsilon_lb_raw": lb, "threshold": float(t),
            "calibration": {"trials_absent": ha, "trials_present": hp, "epsilon_lb": float(lb_cal[best])},
            "test": {"trials_absent": len(test_a), "trials_present": len(test_p), "false_positives": fp,
                     "false_negatives": fn, "fpr": fp / len(test_a), "fnr": fn / len(test_p),
                     "fpr_upper": fpr_u, "fnr_upper": fnr_u}}


# -- the stream -----------------------------------------------------------------------------------------------------
def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def day_events(cards: int) -> tuple[list[dict], str, int, int, str]:
    """The first London day of the oyster-cards stream: (events with their window ``_w``, period, first window,
    windows in the period, source)."""
    ds = DATASETS["oyster-cards"]
    full = ds.full_path.exists()
    params = oyster_cards.OysterCardsParams(cards=cards, days=1) if full else oyster_cards.OysterCardsParams(days=1)
    events = oyster_cards.read_events(ds.full_path if full else None, params)
    window_s = load_config(CONFIG).dp.window_s
    for e in events:
        e["_w"] = int(parse_event_time(e["event_time"]) // window_s)
    clock = load_config(CONFIG).dp.clock
    label, first, n = clock.period_of(events[0]["_w"])
    source = f"oyster-cards, {params.cards} cards, " + ("full Monday file" if full else "bundled slice")
    return [e for e in events if first <= e["_w"] < first + n], label, first, n, source


def target_events(first_w: int, window_s: float, station: str, journeys: int, card: str = TARGET) -> list[dict]:
    """The target card: TARGET_WINDOWS windows from TARGET_HOUR, each with ``journeys`` journeys at ``station``
    (taps in at minutes 0.., out at minutes 5..: in arrival order its taps in come first, so every aggregate's C
    events of a window fall in one cell)."""
    out = []
    for k in range(TARGET_WINDOWS):
        w = first_w + TARGET_HOUR * int(3600 // window_s) + k
        for j in range(journeys):
            base = {"kind": "fare", "journey_id": f"audit-{k}-{j}", "card_id": card, "subsystem": "LUL",
                    "station": station, "bus_route": None, "fare_product": "PAYG", "product_category": "payg",
                    "_w": w, "_journey": j}
            out.append({**base, "event_id": f"audit-{k}-{j}-in", "event_type": "tap_in",
                        "event_time": iso(w * window_s + 60 * j), "full_fare_pence": None,
                        "discounted_fare_pence": None, "daily_capping": None})
            out.append({**base, "event_id": f"audit-{k}-{j}-out", "event_type": "tap_out",
                        "event_time": iso(w * window_s + 300 + 60 * j), "full_fare_pence": FARE,
                        "discounted_fare_pence": FARE, "daily_capping": True})
    return out


def by_window(events: list[dict]) -> dict[int, list[dict]]:
    """Window -> its events in arrival (event time) order."""
    out: dict[int, list[dict]] = {}
    for e in sorted(events, key=lambda e: (e["_w"], parse_event_time(e["event_time"]))):
        out.setdefault(e["_w"], []).append(e)
    return out


def partition_of(card: str, partitions: int) -> int:
    return zlib.crc32(card.encode()) % partitions        # as bench_dp_budget.py: one card, one partition


# -- the library path ---------------------------------------------------------------------------------------------
@dataclass
class Recorded:
    """One partition's pass through DPAggregator: what each release was given, its rows, ledger and aggregator."""
    releases: list          # (spec, plan, window, bounded values, release key, extra fields)
    rows: list
    ledger: BudgetLedger
    agg: DPAggregator


def run_partition(dp, windows: dict[int, list], seed: bytes, stream: str, record: bool = True) -> Recorded:
    """The partition's windows (those holding events, in order) through DPAggregator; with ``record``, the
    arguments of every Releaser.release call (the bounded values are copied: they do not depend on the noise)."""
    ledger = BudgetLedger(None, dp.epsilon_budget)
    agg = DPAggregator(dp, ledger, seed=seed, stream=stream)
    releases: list = []
    if record:
        release = agg.releaser.release

        def recording(spec, plan, counters, w, x, key, extra=None):
            releases.append((spec, plan, w, {c: np.array(v, dtype=float) for c, v in x.items()}, key,
                             dict(extra or {})))
            return release(spec, plan, counters, w, x, key, extra)
        agg.releaser.release = recording
    rows: list = []
    for w in sorted(windows):
        rows.extend(agg.process_window(w, windows[w], flat=True))
    return Recorded(releases, rows, ledger, agg)


@dataclass
class Item:
    """A release whose bounded values differ between D and D': the cells that differ, both sides' values."""
    partition: int
    spec: object
    plan: object
    window: int
    release: str
    extra: dict
    x: dict                 # side ("absent", "present") -> component -> values per cell
    cells: np.ndarray


def differing(partition: int, absent: Recorded, present: Recorded) -> list[Item]:
    ka = [(s.name, key) for s, _, _, _, key, _ in absent.releases]
    kp = [(s.name, key) for s, _, _, _, key, _ in present.releases]
    if ka != kp:
        raise RuntimeError(f"partition {partition}: D and D' made different releases ({len(ka)} vs {len(kp)}): a "
                           "structural difference, see the structural section")
    items = []
    for (spec, plan, w, xa, key, extra), (_, _, _, xp, _, _) in zip(absent.releases, present.releases):
        cells = np.unique(np.concatenate([np.flatnonzero(xa[c] != xp[c]) for c in spec.components]))
        if len(cells):
            items.append(Item(partition, spec, plan, w, key, extra, {"absent": xa, "present": xp}, cells))
    return items


def cell_numbers(block: ReleasedCells, cell: int, comps) -> list[float]:
    """The published number of each component of one cell (``value``, or ``components`` of a mean / ratio)."""
    k = block.layout.per_cell
    fields = block.layout.fields_of(block.numbers[cell * k:(cell + 1) * k])
    return [float(fields["value"])] if len(comps) == 1 else [float(fields["components"][c]) for c in comps]


def replay(items: list[Item], side: str, secret: bytes, stream: str, labels) -> tuple[list[float], bytes]:
    """One trial: every item released again through the product's Releaser (the partition's seed from
    ``secret``) and new counters; the published numbers of the differing cells, and a digest of every number of
    every replayed block (to show no two trials share noise)."""
    out: list[float] = []
    digest = hashlib.sha256()
    releasers: dict[int, Releaser] = {}
    for it in items:
        rel = releasers.get(it.partition)
        if rel is None:
            rel = releasers[it.partition] = Releaser(crypto.dp_noise_seed(secret, stream, it.partition), stream,
                                                     labels)
        blocks = rel.release(it.spec, it.plan, new_counters(it.spec, it.plan), it.window, it.x[side], it.release,
                             it.extra)
        block = next((b for b in blocks if b.common["output"] == "per_window"), None)
        if block is None:
            raise NotImplementedError(f"{it.spec.name}: running-only outputs are not audited here")
        digest.update(np.asarray(block.numbers, dtype=float).tobytes())
        for cell in it.cells:
            out.extend(cell_numbers(block, int(cell), it.spec.components))
    return out, digest.digest()


def quantities(items: list[Item], stream: str, labels) -> list[dict]:
    """What the attacker reads, in :func:`replay`'s order: one published number per (item, cell, component),
    with its expected value on each side and the noise scale its row states (``noise_scale``)."""
    out = []
    for it in items:
        rel = Releaser(b"scale", stream, labels)
        block = next(b for b in rel.release(it.spec, it.plan, new_counters(it.spec, it.plan), it.window,
                                            it.x["absent"], it.release, it.extra)
                     if b.common["output"] == "per_window")
        scales = block.common["noise_scale"]
        for cell in it.cells:
            for comp in it.spec.components:
                scale = scales[comp] if isinstance(scales, dict) else scales
                out.append({"partition": it.partition, "aggregate": it.spec.name, "release": it.release,
                            "group_key": labels(it.spec).pairs[int(cell)][1], "component": comp,
                            "x_absent": float(it.x["absent"][comp][cell]),
                            "x_present": float(it.x["present"][comp][cell]), "noise_scale": float(scale)})
    return out


def trial_secret(seed: int, case: str, side: str, trial: int) -> bytes:
    """A fresh stream secret per trial (what a new secret does to the noise), reproducible from ``--seed``."""
    return hashlib.sha256(f"dp-audit/{seed}/{case}/{side}/{trial}".encode()).digest()


def run_trials(items, qs, trials: int, seed: int, case: str, stream: str, labels) -> dict:
    """Every trial of both sides: published numbers (trials x quantities), digests, seconds."""
    obs, digests, secrets = {}, {}, {}
    t0 = time.perf_counter()
    for side in ("absent", "present"):
        vals = np.empty((trials, len(qs)))
        dig, sec = [], []
        for t in range(trials):
            s = trial_secret(seed, case, side, t)
            vals[t], d = replay(items, side, s, stream, labels)
            dig.append(d)
            sec.append(s)
        obs[side], digests[side], secrets[side] = vals, dig, sec
    return {"obs": obs, "digests": digests, "secrets": secrets, "seconds": time.perf_counter() - t0}


def llr(obs: np.ndarray, qs: list[dict]) -> np.ndarray:
    """Per trial and quantity: log P(y | D') - log P(y | D) for two-sided geometric noise of the row's scale."""
    x0 = np.array([q["x_absent"] for q in qs])
    x1 = np.array([q["x_present"] for q in qs])
    b = np.array([q["noise_scale"] for q in qs])
    return (np.abs(obs - x0) - np.abs(obs - x1)) / b


def case_figures(run: dict, qs: list[dict], claims: dict[str, float], budget: float, alpha: float) -> dict:
    """Per aggregate and for the whole release: the claim, the bound, and this pair's exact epsilon."""
    la, lp = llr(run["obs"]["absent"], qs), llr(run["obs"]["present"], qs)
    names = [q["aggregate"] for q in qs]
    out: dict = {"aggregates": {}}
    groups = [(n, [i for i, m in enumerate(names) if m == n]) for n in claims if n in names]
    for name, cols in groups + [("whole_release", list(range(len(qs))))]:
        res = audit_scores(la[:, cols].sum(axis=1), lp[:, cols].sum(axis=1), alpha)
        claim = budget if name == "whole_release" else claims[name]
        pair = sum(abs(qs[i]["x_present"] - qs[i]["x_absent"]) / qs[i]["noise_scale"] for i in cols)
        res = {"claim": claim, **res, "pair_epsilon": pair, "published_numbers": len(cols),
               "at_or_below_claim": res["epsilon_lb"] <= claim + 1e-12}
        if name == "whole_release":
            out["whole_release"] = res
        else:
            out["aggregates"][name] = res
    for name in claims:                          # an aggregate the target does not change: nothing to audit
        out["aggregates"].setdefault(name, {"claim": claims[name], "epsilon_lb": 0.0,
                                            "note": "the target changes none of its published numbers"})
    return out


def noise_checks(run: dict, qs: list[dict]) -> dict:
    """Fresh noise: distinct secrets and block digests in every trial; the noise's spread against its scale."""
    out = {}
    for side in ("absent", "present"):
        n = len(run["secrets"][side])
        x = np.array([q["x_" + side] for q in qs])
        noise = run["obs"][side] - x
        b = np.array([q["noise_scale"] for q in qs])
        p = np.exp(-1.0 / b)                               # two-sided geometric: Var = 2p / (1 - p)^2
        expected_sd = np.sqrt(2 * p / (1 - p) ** 2)
        out[side] = {"trials": n, "distinct_secrets": len(set(run["secrets"][side])),
                     "distinct_noise_digests": len(set(run["digests"][side])),
                     "noise_mean_over_scale": [round(float(v), 4) for v in noise.mean(axis=0) / b],
                     "noise_sd_over_expected": [round(float(v), 4) for v in noise.std(axis=0) / expected_sd]}
    out["no_reuse"] = all(out[s]["distinct_noise_digests"] == out[s]["trials"] == out[s]["distinct_secrets"]
                          for s in ("absent", "present")) and \
        not set(run["digests"]["absent"]) & set(run["digests"]["present"])
    return out


def aggregator_checks(dp, parts: dict, items: list[Item], qs: list[dict], run: dict, seed: int, case: str,
                      stream: str, k: int) -> dict:
    """For the first ``k`` trials of each side, whole DPAggregator runs of every partition with the trial's seed:
    their rows give the replayed numbers, and their running rows are the per-window prefix sums."""
    mismatches, compared, prefix_bad, prefix_rows = 0, 0, 0, 0
    for side in ("absent", "present"):
        for t in range(k):
            secret = trial_secret(seed, case, side, t)
            got = {}
            for p, windows in parts.items():
                rows = run_partition(dp, windows[side], crypto.dp_noise_seed(secret, stream, p), stream,
                                     record=False).rows
                for r in rows:
                    if r["type"] == "aggregate":
                        got[(p, r["aggregate"], r["output"], r["release"], r["group_key"])] = r
                prefix_bad_p, n = running_prefix_errors(rows)
                prefix_bad += prefix_bad_p
                prefix_rows += n
            for j, q in enumerate(qs):
                r = got[(q["partition"], q["aggregate"], "per_window", q["release"], q["group_key"])]
                v = r["value"] if "components" not in r else r["components"][q["component"]]
                compared += 1
                mismatches += float(v) != float(run["obs"][side][t, j])
    return {"trials_per_side": k, "numbers_compared": compared, "mismatches": mismatches,
            "running_rows_checked": prefix_rows, "running_rows_not_prefix_sums": prefix_bad}


def running_prefix_errors(rows: list[dict]) -> tuple[int, int]:
    """Running rows whose value is not the sum of the per-window values released so far (same cell)."""
    acc: dict = {}
    bad = n = 0
    for r in rows:
        if r["type"] != "aggregate" or "components" in r:
            continue
        key = (r["aggregate"], r["group_key"])
        if r["output"] == "per_window":
            acc[key] = acc.get(key, 0.0) + r["value"]
        else:
            n += 1
            bad += abs(acc.get(key, 0.0) - r["value"]) > 1e-9
    return bad, n


# -- structural -----------------------------------------------------------------------------------------------------
def row_key(r: dict):
    """A DP row's identity: its ``row_id`` (the worker's rows) or (partition, aggregate, output, window, release,
    group key) (the library's)."""
    if "row_id" in r:
        return r["row_id"]
    return (r.get("partition"), r["aggregate"], r["output"], r["window"], r["release"], r["group_key"])


def structural_check(rows_a: list[dict], rows_b: list[dict]) -> dict:
    """Neighbouring inputs must publish the same set of DP rows (ids and keys): the rows only one side has."""
    ka = {row_key(r) for r in rows_a if r.get("type", "aggregate") == "aggregate"}
    kb = {row_key(r) for r in rows_b if r.get("type", "aggregate") == "aggregate"}
    only_a, only_b = sorted(ka - kb, key=str), sorted(kb - ka, key=str)
    return {"rows_absent": len(ka), "rows_present": len(kb), "only_absent": len(only_a),
            "only_present": len(only_b), "identical": not only_a and not only_b,
            "examples_only_absent": [list(k) if isinstance(k, tuple) else k for k in only_a[:3]],
            "examples_only_present": [list(k) if isinstance(k, tuple) else k for k in only_b[:3]]}


def structural_cases(events: list[dict], first_w: int, n_w: int, window_s: float, station: str) -> dict:
    """PLACEHOLDER (lead engineer, issue 39 schedule fix): the structural cases, each (D events, D' events) of one
    partition. Add cases here; after the fix every one must give ``identical: true``. Today's three: the unit's
    only event (a tap in) is the earliest of its partition (an hour before the first), the latest (after the last,
    in the last minute of that hour, so in the window that closes its hourly releases; inside the period), or alone
    in an hour (the middle hour of the partition's span, its other events removed from both sides)."""
    times = [parse_event_time(e["event_time"]) for e in events]
    start, end = first_w * window_s, (first_w + n_w) * window_s

    def unit(ts: float) -> dict:
        return {"event_id": "audit-structural", "kind": "fare", "event_type": "tap_in", "event_time": iso(ts),
                "journey_id": "audit-structural", "card_id": STRUCTURAL_UNIT, "subsystem": "LUL",
                "station": station, "bus_route": None, "fare_product": "PAYG", "product_category": "payg",
                "full_fare_pence": None, "discounted_fare_pence": None, "daily_capping": None,
                "_w": int(ts // window_s)}
    last = max(times)
    hour_end = start + ((last - start) // 3600 + 1) * 3600     # hourly releases are due at its last window
    latest = min(end - 1, max(last + 60, hour_end - 60))
    quiet_lo = start + ((min(times) + last) / 2 - start) // 3600 * 3600
    quiet_hi = quiet_lo + 3600
    quiet = [e for e, t in zip(events, times) if not quiet_lo <= t < quiet_hi]
    return {"earliest": (events, events + [unit(max(start, min(times) - 3600))]),
            "latest": (events, events + [unit(latest)]),
            "alone_in_an_hour": (quiet, quiet + [unit(quiet_lo + 1200)])}


def worker_rows(cfg, events: list[dict], partition: int) -> list[dict]:
    """The DP rows the worker's core publishes for ``events`` on one partition, flushed at the end (the release
    schedule of docs/privacy.md, Which DP rows exist: from the declared start to the end of the clock's period)."""
    core = WorkerCore(cfg, "dp-audit-structural", b"structural-secret-0123456789abcdef")
    core.open_partition(partition)
    ordered = sorted(events, key=lambda e: parse_event_time(e["event_time"]))
    msgs = [(partition, i, orjson.dumps({k: v for k, v in e.items() if not k.startswith("_")}))
            for i, e in enumerate(ordered)]
    out = core.handle(msgs) + core.flush_all()
    return [orjson.loads(v) for t, _, v in out if t == AGGREGATES_TOPIC]


def structural(cfg, stream: str, sources: dict, station: str, window_s: float) -> dict:
    """Each case of :func:`structural_cases` on each source (events of one partition, first window, windows,
    partition): ``naive``, DPAggregator over the windows holding events from the first one (the schedule before
    issue 39: it started where the partition's data started); ``worker``, the worker's core with the schedule."""
    out = {"paths": {"naive": "DPAggregator without a declared start, over the windows holding events",
                     "worker": "WorkerCore, one partition, every event then flush_all (dp.start and the clock)"},
           "cases": {}}
    naive_dp = dataclasses.replace(cfg.dp, start=None)
    for src, (events, first_w, n_w, p) in sources.items():
        for case, (a, b) in structural_cases(events, first_w, n_w, window_s, station).items():
            ra, rb = ([{**r, "partition": p} for r in run_partition(naive_dp, by_window(x), b"structural", stream,
                                                                     record=False).rows] for x in (a, b))
            naive = structural_check(ra, rb)
            worker = structural_check(worker_rows(cfg, a, p), worker_rows(cfg, b, p))
            unit_t = [e for e in b if e["card_id"] == STRUCTURAL_UNIT][0]["event_time"]
            out["cases"].setdefault(src, {})[case] = {
                "naive": naive, "worker": worker, "events_absent": len(a), "unit_event_time": unit_t,
                "first_event": min(e["event_time"] for e in a), "last_event": max(e["event_time"] for e in a)}
    out["worker_all_identical"] = all(c["worker"]["identical"] for s in out["cases"].values() for c in s.values())
    out["naive_differs_in"] = sorted(f"{s}: {c}" for s, cs in out["cases"].items() for c, v in cs.items()
                                     if not v["naive"]["identical"])
    return out


# -- main -------------------------------------------------------------------------------------------------------------
def split(events: list[dict], target: list[dict], partitions: int, target_partition) -> dict:
    """Partition -> {"absent": windows, "present": windows}: the day's cards by card, the target's events on
    ``target_partition(event)``; only partitions holding some of the target (the others are equal on both sides)."""
    parts = {}
    for p in sorted({target_partition(e) for e in target}):
        mine = [e for e in events if partition_of(e["card_id"], partitions) == p]
        parts[p] = {"absent": by_window(mine),
                    "present": by_window(mine + [e for e in target if target_partition(e) == p])}
    return parts


def run_case(dp, case: str, parts: dict, args, stream: str, claims: dict) -> dict:
    t0 = time.perf_counter()
    recs = {p: {s: run_partition(dp, w[s], f"record-{case}-{p}".encode(), stream) for s in w}
            for p, w in parts.items()}
    items = [it for p, r in recs.items() for it in differing(p, r["absent"], r["present"])]
    labels = recs[min(recs)]["absent"].agg.cells.labels
    qs = quantities(items, stream, labels)
    record_s = time.perf_counter() - t0
    run = run_trials(items, qs, args.trials, args.seed, case, stream, labels)
    res = case_figures(run, qs, claims, dp.epsilon_budget, args.alpha)
    t1 = time.perf_counter()
    checks = {"noise": noise_checks(run, qs),
              "aggregator_vs_replay": aggregator_checks(dp, parts, items, qs, run, args.seed, case, stream,
                                                        args.check_trials)}
    checks["seconds"] = round(time.perf_counter() - t1, 1)
    ledgers = {p: {s: {"spent_by_period": r[s].ledger.spent_by_period(),
                       "budget_exhausted_events": r[s].agg.metrics["budget_exhausted_events"]} for s in r}
               for p, r in recs.items()}
    return {"partitions_with_target": sorted(parts),
            "events": {p: {s: sum(map(len, w[s].values())) for s in w} for p, w in parts.items()},
            "releases_replayed_per_trial": len(items), "published_numbers": qs, **res, "ledgers": ledgers,
            "checks": checks, "seconds": {"record": round(record_s, 1), "trials": round(run["seconds"], 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cards", type=int, default=50000)
    ap.add_argument("--partitions", type=int, default=4, help="partitions of the day (ours: one card, one)")
    ap.add_argument("--trials", type=int, default=20000, help="per side; half calibrates, half tests")
    ap.add_argument("--cases", default="ours,naive_2",
                    help="ours and naive_<P> controls (naive_4 alone takes ~8 min: --cases naive_4 --out ...)")
    ap.add_argument("--journeys", type=int, default=4, help="the target's journeys per window")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--check-trials", type=int, default=3, help="trials per side re-run as whole aggregators")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "dp_audit.json"))
    ap.add_argument("--structural-only", action="store_true",
                    help="recompute only the structural section of --out (the trials are left as they are)")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if any(c != "ours" and not (c.startswith("naive_") and c[6:].isdigit()) for c in cases):
        ap.error(f"--cases: ours or naive_<partitions>, got {args.cases!r}")
    naive = [int(c[6:]) for c in cases if c != "ours"]
    if args.journeys < max(naive + [2]):
        ap.error("--journeys must be at least the largest naive partition count (one journey per partition)")
    t_start = time.perf_counter()
    cfg = load_config(CONFIG)
    dp, stream = cfg.dp, cfg.stream.name
    claims = {s.name: s.epsilon for s in dp.aggregates}
    events, label, first_w, n_w, source = day_events(args.cards)
    window_s = dp.window_s
    station = Counter(e["station"] for e in events if e["event_type"] == "tap_in").most_common(1)[0][0]
    target = target_events(first_w, window_s, station, args.journeys)
    tp = partition_of(TARGET, args.partitions)
    result = {"command": "PYTHONPATH=$PWD .venv/bin/python bench/bench_dp_audit.py " + " ".join(sys.argv[1:]),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                       text=True).stdout.strip(),
              "machine": platform.machine(), "python": platform.python_version(),
              "config": "configs/oyster-cards.toml (stream_anon.config.load_config)",
              "stream": {"dataset": source, "period": label, "events_in_day": len(events),
                         "partitions": args.partitions, "target_partition": tp},
              "target": {"card": TARGET, "station": station, "windows": TARGET_WINDOWS,
                         "from": target[0]["event_time"], "journeys_per_window": args.journeys,
                         "events": len(target), "full_fare_pence": FARE,
                         "why": "a worst case of the bounds: every aggregate takes W windows and C events per "
                                "window of it, all in one cell (journeys at once are not physical; the naive "
                                "controls put one journey of each window on each partition)"},
              "method": {
                  "trials_per_side": args.trials, "calibration_trials_per_side": args.trials // 2,
                  "test_trials_per_side": args.trials - args.trials // 2, "alpha": args.alpha,
                  "distinguisher": "log-likelihood ratio of D' against D (two-sided geometric of each row's "
                                   "noise_scale) summed over the published numbers that differ; present iff >= a "
                                   "threshold chosen on the calibration half (largest bound there)",
                  "bound": "two-sided 95% Clopper-Pearson upper bounds of FPR and FNR on the test half; "
                           "epsilon_lb = max(log((1-FNR_u)/FPR_u), log((1-FPR_u)/FNR_u)), delta = 0, shown "
                           "as 0 when negative (epsilon_lb_raw)",
                  "release_path": "per side one DPAggregator + BudgetLedger pass records each Releaser.release "
                                  "call (bounded values, plan, release key: independent of the noise); per trial "
                                  "the releases whose bounded values differ go again through a new Releaser "
                                  "seeded with crypto.dp_noise_seed(fresh secret, stream, partition) and "
                                  "new_counters; checks.aggregator_vs_replay re-runs whole aggregators",
                  "fresh_noise": "secret = sha256('dp-audit/<seed>/<case>/<side>/<trial>'); checks.noise counts "
                                 "distinct secrets and distinct digests of every replayed block"}}
    print(f"{source}: {len(events)} events in {label}; target partition {tp}", flush=True)

    for key in ([] if args.structural_only else cases):
        if key == "ours":
            result[key] = run_case(dp, key, split(events, target, args.partitions, lambda e: tp), args, stream,
                                   claims)
            result[key]["how"] = (f"the card on one of {args.partitions} partitions (as the worker keys input by "
                                  "the unit); the other partitions are equal on both sides")
        else:
            p = int(key[6:])
            result[key] = run_case(dp, key, split(events, target, p, lambda e, p=p: e["_journey"] % p), args,
                                   stream, claims)
            result[key]["how"] = (f"the same card keyed by journey over {p} partitions (journey j on partition j "
                                  f"mod {p}), each an aggregator with its own ledger and seed; the observer reads "
                                  "every partition's rows")
        print(key, {k: round(v["epsilon_lb"], 3) for k, v in result[key]["aggregates"].items()},
              round(result[key]["whole_release"]["epsilon_lb"], 3), result[key]["seconds"], flush=True)

    mine = [e for e in events if partition_of(e["card_id"], args.partitions) == tp]
    slice_events = oyster_cards.read_events(None, oyster_cards.OysterCardsParams(days=1))   # ends at 07:30
    for e in slice_events:
        e["_w"] = int(parse_event_time(e["event_time"]) // window_s)
    slice_events = [e for e in slice_events if first_w <= e["_w"] < first_w + n_w]
    result["structural"] = structural(cfg, stream, {f"day, partition {tp}": (mine, first_w, n_w, tp),
                                                   "bundled slice, first day": (slice_events, first_w, n_w, 0)},
                                      station, window_s)
    print("structural", {s: {c: {k: (v[k]["only_absent"], v[k]["only_present"]) for k in ("naive", "worker")}
                             for c, v in cs.items()} for s, cs in result["structural"]["cases"].items()}, flush=True)

    if args.structural_only:
        kept = json.loads(Path(args.out).read_text())
        kept["structural"] = result["structural"]
        kept["summary"]["structural_worker_all_identical"] = result["structural"]["worker_all_identical"]
        kept["summary"].pop("structural_all_identical", None)
        kept["structural_command"] = result["command"]
        Path(args.out).write_text(json.dumps(kept, indent=1, default=str) + "\n")
        print(json.dumps(kept["summary"], indent=1))
        return
    result["summary"] = {key: {k: {"claim": v["claim"], "epsilon_lb": round(v["epsilon_lb"], 4),
                                   **({"at_or_below_claim": v["epsilon_lb"] <= v["claim"]} if key == "ours" else
                                      {"exceeds_claim": v["epsilon_lb"] > v["claim"]}),
                                   "trials_tested_per_side": v.get("test", {}).get("trials_absent")}
                               for k, v in [*result[key]["aggregates"].items(),
                                            ("whole_release", result[key]["whole_release"])]}
                         for key in cases}
    if "ours" in cases:
        result["summary"]["ours_all_at_or_below_claim"] = all(v["at_or_below_claim"]
                                                              for v in result["summary"]["ours"].values())
    result["summary"]["structural_worker_all_identical"] = result["structural"]["worker_all_identical"]
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result["summary"], indent=1), f"\nwall {result['wall_s']} s")


if __name__ == "__main__":
    main()
