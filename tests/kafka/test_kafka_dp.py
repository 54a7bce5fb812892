"""DP aggregates in the streaming worker (issue 4): restarts, budget exhaustion, contribution cuts, key domains.

The Kafka tests run real worker subprocesses against a real broker (Tansu and Apache Kafka). What the worker published
is checked against an independent recount in plain Python (:func:`independent_recount`, no stream_anon.dp or
stream_anon.kafka code): the raw topic read back partition by partition, in offset order, gives each partition's
windows (the watermark rule), the bounded true counts and fare sums per window and cell, the epsilon a ledger
must hold (one charge per aggregate and window: a restart may not spend twice) and the noise the rows must state;
the published values must be the true values plus noise of that size. Re-produced copies of a row must be
identical (same row_id, same value: no fresh noise on a restart). Contribution cuts are checked against a plain
count of events per (journey, event-time window).
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import ROUTES, START, ZONES, read_all, synthetic_fares, wait_for, write_stream_config  # noqa: E402

from stream_anon.config import load_config  # noqa: E402
from stream_anon.dp import BudgetLedger  # noqa: E402
from stream_anon import checkpoint
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.worker.aggregates import AGGREGATES_TOPIC, PartitionAggregates, needed_fields  # noqa: E402

WINDOW_S = 900
DP_TOML = '''
[dp]
epsilon_budget = {budget}
start = "2009-11-09T06:00:00+00:00"   # the synthetic fares' first window: the schedule starts there

[[aggregates]]
name = "taps_per_zone"
kind = "count"
epsilon = {epsilon}
max_contributions = 1          # a journey's tap-in and tap-out in one window: the second is cut
output = "both"
horizon_windows = 16
[[aggregates.group_by]]
name = "zone"
field = ["station", "bus_route"]
hierarchy = "hierarchies/test_location.json"
level = "zone"
[[aggregates.group_by]]
name = "event_type"
field = "event_type"
values = ["tap_in", "tap_out", "bus_boarding"]

[[aggregates]]
name = "fares_running"
kind = "sum"
value = "full_fare_pence"
lower = 0
upper = 500
epsilon = {epsilon}
max_contributions = 2
output = "running"
mechanism = "binary_tree"
horizon_windows = 64
'''


def dp_stream_config(directory: Path, name: str, budget: float, epsilon: float = 0.1) -> Path:
    """``epsilon``: per window, of each of the two aggregates."""
    path = write_stream_config(directory, name, f"raw.test.{name}", window_s=WINDOW_S)
    path.write_text(path.read_text() + DP_TOML.format(budget=budget, epsilon=epsilon))
    return path


class DPGlue:
    """The worker's DP path without Kafka: the engine closes the windows, PartitionAggregates releases them;
    ``checkpoint`` is what the worker writes (engine state, with the open window's fields, and the DP state:
    aggregator and ledger), as it reads it back."""

    def __init__(self, cfg, partition: int, secret: bytes, state: dict | None = None):
        carried = needed_fields(cfg)
        self.engine = Engine(cfg, partition=partition, secret=secret, carried=carried) if state is None else \
            Engine.restore(cfg, partition, secret, *state["engine"], carried=carried)
        self.pa = PartitionAggregates(cfg, partition, secret)
        if state is not None:
            self.pa.load_state(*state["dp"])
        self.ledger = self.pa.ledger

    def process(self, events):
        return self.pa.close_windows(self.engine.process(events).windows)

    def flush(self):
        return self.pa.close_windows(self.engine.flush().windows)

    def checkpoint(self) -> dict:
        return {"engine": checkpoint.roundtrip(*checkpoint.full_state(self.engine)),
                "dp": checkpoint.roundtrip(*checkpoint.full_state(self.pa))}


def aggregate_directly(cfg, secret: bytes, raw_by_partition: dict[int, list[dict]]) -> dict:
    """Rows by row_id of the worker's aggregation run directly (no broker) on the given input."""
    rows = {}
    for p, events in raw_by_partition.items():
        pa = DPGlue(cfg, p, secret)
        for r in pa.process(events)[0] + pa.flush()[0]:
            assert r["row_id"] not in rows
            rows[r["row_id"]] = r
    return rows


# ------------------------------------------------------------------------------------------------ independent recount
# DP_TOML's aggregates, written out again by hand: taps per (zone, event type), at most one tap per journey and
# window, two-sided geometric noise of epsilon per window (16-window horizon: per-window noising, the running
# rows are prefix sums); fares clamped to [0, 500], at most two per journey and window, summed and released as a
# running total by a binary tree over 64 windows with Laplace noise. The recount tests use epsilon 2: noise small
# enough that the published counts pin down the true ones (std 0.6), large enough that a fresh draw on a
# restart would differ in many cells (a draw is non-zero with probability 0.24).
RECOUNT_EPS = 2.0
TAP_TYPES = ("tap_in", "tap_out", "bus_boarding")
ZONE_OF = {**{s: z for z, stations in ZONES.items() for s in stations}, **{r: "Routes 1-20" for r in ROUTES}}
TAP_CELLS = [f"{z}|{t}" for z in (*ZONES, "Routes 1-20") for t in TAP_TYPES]
FARE_SENSITIVITY = 500 * 2
TREE_LEVELS = int(math.log2(64)) + 1


def geometric_std(eps: float) -> float:
    """Standard deviation of the two-sided geometric noise of sensitivity 1: sqrt(2q) / (1 - q), q = e^-eps."""
    return math.sqrt(2 * math.exp(-eps)) / (1 - math.exp(-eps))


def independent_recount(raw_by_partition: dict[int, list[dict]]) -> dict[int, dict]:
    """Per partition: windows (first..last, gaps included), bounded tap counts per (window, cell), bounded fare
    sums per window. An event joins the window of the partition's watermark (largest event time so far)."""
    out = {}
    for p, events in raw_by_partition.items():
        mark = -math.inf
        taps, fares = Counter(), Counter()
        seen_tap, seen_fare = Counter(), Counter()
        windows = []
        for e in events:
            mark = max(mark, datetime.fromisoformat(e["event_time"]).timestamp())
            w = int(mark // WINDOW_S)
            windows.append(w)
            who = (w, e["journey_id"])
            seen_tap[who] += 1
            if seen_tap[who] <= 1:
                taps[(w, f"{ZONE_OF[e['station'] or e['bus_route']]}|{e['event_type']}")] += 1
            seen_fare[who] += 1
            if seen_fare[who] <= 2:
                fares[w] += min(max(e["full_fare_pence"], 0), 500)
        start = int(START.timestamp() // WINDOW_S)        # the schedule's start (DP_TOML's dp.start)
        out[p] = {"windows": list(range(start, max(windows) + 1)), "taps": taps, "fares": fares}
    return out


def check_rows_against_recount(by_id: dict, recount: dict[int, dict], ledgers: dict[int, BudgetLedger],
                               eps: float) -> None:
    """The published rows, and each partition's ledger, against :func:`independent_recount` (``eps``: the
    configured epsilon per window of each aggregate)."""
    noise_std = geometric_std(eps)
    tail = math.ceil(math.log(1e-9) / -eps)        # P(|noise| > tail) < 1e-9 per cell
    expected_keys = set()
    for p, rc in recount.items():
        for w in rc["windows"]:
            expected_keys |= {(p, "taps_per_zone", o, w, c) for o in ("per_window", "running") for c in TAP_CELLS}
            expected_keys.add((p, "fares_running", "running", w, ""))
    got = {(r["partition"], r["aggregate"], r["output"], r["window"], r["group_key"]): r for r in by_id.values()}
    assert len(got) == len(by_id), "two releases of one (partition, aggregate, output, window, key)"
    assert set(got) == expected_keys, (sorted(set(got) - expected_keys)[:5], sorted(expected_keys - set(got))[:5])
    assert all(r["release"] == str(r["window"]) for r in by_id.values()), "a window released twice"

    residuals, covered = [], 0
    for p, rc in recount.items():
        # one charge of epsilon per aggregate and window, whatever the restarts
        assert ledgers[p].spent == pytest.approx(2 * eps * len(rc["windows"])), f"partition {p}: ledger"
        assert len(ledgers[p]) == 2 * len(rc["windows"]), f"partition {p}: ledger entries"
        for c in TAP_CELLS:
            per_window = np.array([got[(p, "taps_per_zone", "per_window", w, c)]["value"] for w in rc["windows"]])
            running = np.array([got[(p, "taps_per_zone", "running", w, c)]["value"] for w in rc["windows"]])
            np.testing.assert_allclose(running, np.cumsum(per_window))     # post-processing, no second noise
            truth = np.array([rc["taps"][(w, c)] for w in rc["windows"]])
            residuals.extend(per_window - truth)
            for w, v in zip(rc["windows"], per_window):
                row = got[(p, "taps_per_zone", "per_window", w, c)]
                assert row["noise_std"] == pytest.approx(noise_std) and row["epsilon_window"] == eps
                assert abs(v - rc["taps"][(w, c)]) <= tail, (p, w, c, v, rc["taps"][(w, c)])
                covered += row["ci95"][0] <= rc["taps"][(w, c)] <= row["ci95"][1]
        true_total = np.cumsum([rc["fares"][w] for w in rc["windows"]])
        for t, (w, total) in enumerate(zip(rc["windows"], true_total), start=1):
            row = got[(p, "fares_running", "running", w, "")]
            # the running total at window t sums one tree node per set bit of t, each Laplace(levels * 1000 / eps)
            std = math.sqrt(2 * bin(t).count("1")) * TREE_LEVELS * FARE_SENSITIVITY / eps
            assert row["noise_std"] == pytest.approx(std), (p, w, t)
            assert abs(row["value"] - total) < 6 * std, (p, w, row["value"], total)
    residuals = np.array(residuals, dtype=float)
    n = len(residuals)
    print(f"tap residuals: n {n}, mean {residuals.mean():.2f}, std {residuals.std():.2f} "
          f"(noise std {noise_std:.2f}), ci95 coverage {covered / n:.3f}")
    assert np.all(residuals == np.round(residuals)), "count noise is integer"
    assert abs(residuals.mean()) < 4 * noise_std / math.sqrt(n), "published counts are biased"
    assert abs(residuals.std() / noise_std - 1) < 0.2, "published noise is not of the stated size"
    assert covered / n > 0.92


# ------------------------------------------------------------------------------------------------ no broker
def test_restart_from_checkpoint_republishes_identical_rows_and_spends_nothing_twice(tmp_path):
    cfg = load_config(dp_stream_config(tmp_path, "dpunit", budget=50.0))
    events = synthetic_fares(1200, seed=31)
    secret = b"unit-secret-0123456789abcdef"
    straight = DPGlue(cfg, 0, secret)
    expected = straight.process(events)[0] + straight.flush()[0]

    first = DPGlue(cfg, 0, secret)
    published = first.process(events[:500])[0]
    saved = first.checkpoint()                                    # committed with the rows before it
    published += first.process(events[500:900])[0]                # seen (e.g. an aborted transaction), then lost
    spent_at_crash = first.ledger.spent
    resumed = DPGlue(cfg, 0, secret, state=saved)
    assert resumed.ledger.spent < spent_at_crash
    replayed = resumed.process(events[500:])[0] + resumed.flush()[0]
    by_id = {r["row_id"]: r for r in expected}
    assert len(by_id) == len(expected)
    copies = Counter(r["row_id"] for r in published + replayed)
    assert any(c == 2 for c in copies.values()), "the replay re-produced windows published before the crash"
    for r in published + replayed:
        assert r == by_id[r["row_id"]], "a re-produced row differs from the uncrashed run"
    assert set(copies) == set(by_id)
    assert resumed.ledger.spent == pytest.approx(straight.ledger.spent)
    assert spent_at_crash <= resumed.ledger.spent <= 50.0
    assert len(resumed.ledger) == len(straight.ledger)


def _ledger_of(glue: "DPGlue", state: dict) -> dict:
    """``state`` with the ledger of ``glue`` in place of its own."""
    core, tables = state["dp"]
    return {**state, "dp": ({**core, "ledger": json.loads(json.dumps(glue.ledger.state_core()))}, tables)}


def test_window_reclosed_with_other_events_is_a_second_paid_release_with_fresh_noise(tmp_path):
    """An idle flush closes window 06:00 early and releases it; the engine then resumes from a state before the
    flush while the ledger knows the release, and more events of that window arrive, so it closes with other
    content. Re-using the first release's noise would publish the exact difference of the true counts (the noise
    cancels); the ledger keys the release by a digest of its content, so this one is charged again and drawn from
    fresh noise."""
    cfg = load_config(dp_stream_config(tmp_path, "dpflush", budget=50.0))
    events = [e for e in synthetic_fares(1200, seed=38) if e["event_time"] < "2009-11-09T06:15"]
    early, late = events[:len(events) // 2], events[len(events) // 2:]
    closer = {**events[-1], "event_id": "closer", "journey_id": "closer", "event_time": "2009-11-09T06:16:00+00:00"}
    secret = b"flush-secret-0123456789abcdef"
    first = DPGlue(cfg, 0, secret)
    first.process(early)
    saved = first.checkpoint()
    flushed = first.flush()[0]
    spent_first = first.ledger.spent
    second = DPGlue(cfg, 0, secret, state=_ledger_of(first, saved))
    reclosed = second.process(late + [closer])[0]
    key = ("taps_per_zone", "per_window")
    a = {r["group_key"]: r for r in flushed if (r["aggregate"], r["output"]) == key}
    b = {r["group_key"]: r for r in reclosed if (r["aggregate"], r["output"]) == key}
    assert {r["window"] for r in a.values()} == {r["window"] for r in b.values()}
    assert not ({r["row_id"] for r in a.values()} & {r["row_id"] for r in b.values()})
    assert {r["release"] for r in b.values()} == {f"{next(iter(a.values()))['window']}~1"}
    assert second.ledger.spent == pytest.approx(2 * spent_first), "the second release is charged"
    bus = "Routes 1-20|bus_boarding"                 # one boarding per bus journey: no contribution cut
    true_diff = sum(e["event_type"] == "bus_boarding" for e in late)
    assert b[bus]["value"] - a[bus]["value"] != true_diff, "fresh noise: the true difference stays hidden"
    # the same content again (a plain replay) spends nothing and republishes the same rows
    third = DPGlue(cfg, 0, secret, state=_ledger_of(second, saved))
    assert third.process(late + [closer])[0] == reclosed and third.ledger.spent == second.ledger.spent


def test_partition_aggregates_match_an_independent_recount(tmp_path):
    """The aggregation the worker runs, fed directly (four partitions, no broker), against the plain recount."""
    cfg = load_config(dp_stream_config(tmp_path, "dprecount", budget=1000.0, epsilon=RECOUNT_EPS))
    events = synthetic_fares(4000, seed=40)
    journeys = sorted({e["journey_id"] for e in events})
    part_of = {j: i % 4 for i, j in enumerate(journeys)}        # one journey, one partition (as keyed on Kafka)
    parts = {p: [e for e in events if part_of[e["journey_id"]] == p] for p in range(4)}
    secret = b"recount-secret-0123456789abcdef"
    rows, ledgers = {}, {}
    for p, evs in parts.items():
        pa = DPGlue(cfg, p, secret)
        for r in pa.process(evs)[0] + pa.flush()[0]:
            rows[r["row_id"]] = r
        ledgers[p] = pa.ledger
    check_rows_against_recount(rows, independent_recount(parts), ledgers, RECOUNT_EPS)


def _reference_cells(spec, unit_field, flats):
    """Per-event reference of the bounded true values (written out plainly, independent of the bulk code)."""
    seen, out = Counter(), defaultdict(float)
    for f in flats:
        if any(f.get(k) not in allowed for k, allowed in spec.where):
            continue
        key = tuple(g.key_of(f) for g in spec.group_by)
        unit = f.get(unit_field)
        if unit is None or any(k is None for k in key):
            continue
        v = f.get(spec.value_field) if spec.value_field else None
        if spec.value_field and (v is None or (spec.kind != "ratio" and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)))):
            continue
        seen[unit] += 1
        if seen[unit] > spec.max_contributions:
            continue
        if spec.kind == "histogram":
            b = min(max(int(np.searchsorted(spec.bins, v, side="right")) - 1, 0), len(spec.bins) - 2)
            key = key + (spec.bin_labels[b],)
        cell = spec.domain.index(key)
        if spec.kind in ("count", "histogram"):
            out[("count", cell)] += 1
        elif spec.kind in ("sum", "mean"):
            out[("sum", cell)] += min(max(float(v), spec.lower), spec.upper)
            out[("count", cell)] += spec.kind == "mean"
        else:
            out[("numerator", cell)] += v in spec.numerator_values
            out[("denominator", cell)] += 1
    return out


def test_bulk_cell_values_match_a_per_event_reference_on_messy_input():
    """configs/oyster.toml's five aggregates on Oyster events with broken fields mixed in: missing units and
    stations, unknown stations, unhashable and non-numeric values, NaN, bools, numeric and naive times."""
    from stream_anon.datasets import load_events
    from stream_anon.dp import DPAggregator
    from stream_anon.events import flatten

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "oyster.toml")
    rng = np.random.default_rng(39)
    events = [flatten(e) for e in load_events("oyster", limit=3000)]
    breakers = [("journey_id", None), ("station", None), ("station", "Atlantis"), ("station", ["list"]),
                ("bus_route", {"x": 1}), ("full_fare_pence", "lots"), ("full_fare_pence", float("nan")),
                ("full_fare_pence", True), ("full_fare_pence", 99999), ("daily_capping", None),
                ("event_time", "2009-11-09T07:00:00"), ("event_time", 1257750000), ("event_type", "teleport"),
                ("product_category", None)]
    for e in events:
        if rng.random() < 0.3:
            field_name, value = breakers[rng.integers(len(breakers))]
            e[field_name] = value
    agg = DPAggregator(cfg.dp, BudgetLedger(None, cfg.dp.epsilon_budget), seed=b"reference")
    for spec in cfg.dp.aggregates:
        got = agg.true_values(spec.name, events)
        ref = _reference_cells(spec, cfg.dp.privacy_unit, events)
        for comp, arr in got.items():
            expect = np.array([ref.get((comp, i), 0.0) for i in range(len(spec.domain))])
            assert np.allclose(arr, expect), (spec.name, comp)
        assert sum(arr.sum() for arr in got.values()) > 0, spec.name


def test_the_workers_serialized_rows_are_the_aggregate_rows():
    """The worker serializes a release's shared fields once and each cell's from its numbers
    (``PartitionAggregates.messages``); parsed back, its values must be exactly the rows of ``close_windows``
    (dicts, serialized one by one), in the same order, for the five kinds of configs/oyster.toml (counts, a
    mean and a ratio with their components, a histogram) over a day crossing midnight (a new period)."""
    from stream_anon.datasets import load_events
    from stream_anon.render import json_bytes as dumps

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "oyster.toml")
    events = load_events("oyster")
    secret = b"serialization-secret-0123456789abcdef"
    as_rows = DPGlue(cfg, 0, secret)
    as_bytes = PartitionAggregates(cfg, 0, secret)
    engine = Engine(cfg, partition=0, secret=secret, carried=needed_fields(cfg))
    rows, values = [], []
    for start in range(0, len(events), 5000):
        rows += as_rows.process(events[start:start + 5000])[0]
        out, n = as_bytes.messages(engine.process(events[start:start + 5000]).windows, dumps, "anon.metrics").result()
        values += [v for topic, _, v in out if topic == AGGREGATES_TOPIC]
        assert n == sum(topic == AGGREGATES_TOPIC for topic, _, _ in out)
    rows += as_rows.flush()[0]
    out, _ = as_bytes.messages(engine.flush().windows, dumps, "anon.metrics").result()
    values += [v for topic, _, v in out if topic == AGGREGATES_TOPIC]
    parsed = [json.loads(v) for v in values]
    assert len(rows) > 1000 and {r["kind"] for r in rows} == {"count", "mean", "histogram", "ratio"}
    assert parsed == [json.loads(dumps(r)) for r in rows]
    assert all(p["row_id"].endswith("/" + p["group_key"]) for p in parsed)


def test_averaging_restarted_releases_recovers_nothing(tmp_path):
    """Attack: re-run the same window many times (crash loops) and average what was published. With fresh
    noise per run (naive: a random seed per process) the average converges to the true count; with the noise
    derived from the secret, every copy is identical and the average is no better than one release."""
    cfg = load_config(dp_stream_config(tmp_path, "dpavg", budget=1e6))
    events = [e for e in synthetic_fares(600, seed=32) if e["event_time"] < "2009-11-09T06:15"]
    events.append({**events[-1], "event_id": "closer", "journey_id": "closer",
                   "event_time": "2009-11-09T06:16:00+00:00"})       # moves the watermark: window 06:00 closes
    truth = Counter(e["event_type"] for e in events[:-1] if e["bus_route"])["bus_boarding"]   # Routes cell

    def bus_cell(secret: bytes) -> float:
        pa = DPGlue(cfg, 0, secret)
        rows, _ = pa.process(events)
        return next(r["value"] for r in rows if r["aggregate"] == "taps_per_zone" and r["output"] == "per_window"
                    and r["group_key"] == "Routes 1-20|bus_boarding")

    runs = 300
    naive = [bus_cell(os.urandom(16)) for _ in range(runs)]
    ours = [bus_cell(b"the-stream-secret-0123456789") for _ in range(runs)]
    scale = 1 / 0.1          # sensitivity 1 / epsilon 0.1 (16 windows: per-window noising serves both outputs)
    assert abs(np.mean(naive) - truth) < scale / 3, "the attack works against fresh noise per restart"
    assert len(set(ours)) == 1, "our restarts republish the same noisy value"
    # one release's noise (two-sided geometric, scale 10) has a standard deviation of about 14
    assert np.std(naive) > 10


def test_every_row_is_committed_with_the_ledger_spend_that_pays_for_it(tmp_path):
    """The worker writes a batch's rows and its state (with the ledger) in one transaction: drive WorkerCore
    (the worker without Kafka) batch by batch and check that the state committed with each batch's rows has
    already reserved every (aggregate, window) those rows release."""
    from stream_anon.worker.core import WorkerCore

    cfg = load_config(dp_stream_config(tmp_path, "dporder", budget=50.0))
    core = WorkerCore(cfg, "app", b"order-secret-0123456789abcdef")
    events = synthetic_fares(800, seed=33)
    checked = []
    for i in range(0, len(events), 100):
        out = core.handle([(0, i + j, json.dumps(e).encode()) for j, e in enumerate(events[i:i + 100])])
        ledger = BudgetLedger(None, 50.0)
        ledger.load_state(core.parts[0].committed_state()[0]["dp"]["ledger"], {})
        for topic, _, value in out:
            if topic == AGGREGATES_TOPIC:
                row = json.loads(value)
                assert ledger.reserved(row["aggregate"], row["window"]) == pytest.approx(row["epsilon_window"])
                checked.append(row["row_id"])
    assert len(checked) > 50 and core.stats.totals["aggregate_rows"] == len(checked)


def test_running_count_error_matches_a_direct_computation_and_the_theory(tmp_path):
    """dp.report against (a) a direct RMSE on one partition and (b) the noise variance the rows state, averaged
    over 24 independent secrets (running counts over ~19 windows are correlated, so one run is too noisy)."""
    from stream_anon.dp.report import running_count_errors, true_window_values
    from stream_anon.engine.space import parse_time
    from stream_anon.evaluate.stream_figures import windows_by_event_time

    cfg = load_config(dp_stream_config(tmp_path, "dprep", budget=1e6))
    spec = cfg.dp.spec("taps_per_zone")
    events = synthetic_fares(2000, seed=37)
    windows = windows_by_event_time(events, cfg)
    truth = {(0, w): x["count"] for w, x in true_window_values(cfg.dp, "taps_per_zone", windows).items()}
    per_unit = Counter((int(parse_time(e["event_time"]) // WINDOW_S), e["journey_id"]) for e in events)
    assert sum(x.sum() for x in truth.values()) == 2000 - sum(n - 1 for n in per_unit.values() if n > 1)
    mse, var = [], []
    for i in range(24):
        pa = DPGlue(cfg, 0, f"secret-{i}-0123456789abcdef".encode())
        rows = [r for r in pa.process(events)[0] + pa.flush()[0] if r["aggregate"] == "taps_per_zone"]
        rep = running_count_errors(rows, truth, spec)
        ws = sorted({w for _, w in truth})
        cells = ["|".join(map(str, k)) for k in spec.domain]
        true_run = np.cumsum([truth[(0, w)] for w in ws], axis=0)
        got = np.array([[next(r["value"] for r in rows if r["window"] == w and r["output"] == "running"
                              and r["group_key"] == c) for c in cells] for w in ws])
        assert rep["windows"] == len(ws)
        assert rep["continual_count_rmse"] == pytest.approx(float(np.sqrt(np.mean((got - true_run) ** 2))))
        # per-window mechanism (16-window horizon): the running rows are the prefix sums of the per-window rows
        assert rep["naive_count_rmse"] == pytest.approx(rep["continual_count_rmse"])
        mse.append(rep["continual_count_rmse"] ** 2)
        var.append(rep["continual_count_rmse_theory"] ** 2)
    ratio = math.sqrt(np.mean(mse) / np.mean(var))
    print("measured / theoretical running RMSE:", ratio)
    assert 0.9 < ratio < 1.1


# ------------------------------------------------------------------------------------------------ real broker
def _read(bootstrap, topic, stream, min_count=0, committed=True):
    return [(doc, part, off) for _, doc, part, off in read_all(bootstrap, topic, stream=stream, min_count=min_count,
                                                               committed=committed)]


def _raw_by_partition(bootstrap, topic) -> dict[int, list[dict]]:
    out = defaultdict(list)
    for _, doc, part, off in sorted(read_all(bootstrap, topic), key=lambda x: (x[2], x[3])):
        out[part].append(doc)
    return dict(out)


def _setup(bootstrap, path):
    from stream_anon.kafka.topics import ensure_topics
    cfg = load_config(path)
    ensure_topics(bootstrap, names=[cfg.stream.input_topic, f"anon.{cfg.stream.name}.records", "anon.releases",
                                    "anon.deadletter", "anon.metrics", AGGREGATES_TOPIC],
                  default_partitions={cfg.stream.input_topic: 4, f"anon.{cfg.stream.name}.records": 1})
    return cfg


def _dedupe(rows):
    by_id, copies = {}, Counter()
    for doc, _, _ in rows:
        copies[doc["row_id"]] += 1
        if doc["row_id"] in by_id:
            assert doc == by_id[doc["row_id"]], f"{doc['row_id']}: re-produced with a different value"
        by_id[doc["row_id"]] = doc
    return by_id, copies


def _ledger(bootstrap, app_id, stream, partition, budget) -> BudgetLedger:
    """The partition's committed DP ledger, read from the worker's state topic."""
    from stream_anon.kafka.supervise import committed_states

    ledger = BudgetLedger(None, budget)
    doc = committed_states(bootstrap, app_id, stream, [partition]).get(partition)
    if doc is not None:
        ledger.load_state(doc["dp"]["ledger"], {})
    return ledger


def _domain_rows(by_id, cfg):
    """(partition, aggregate, output, window) -> group keys; each must hold the whole configured domain."""
    cells = defaultdict(list)
    for r in by_id.values():
        cells[(r["partition"], r["aggregate"], r["output"], r["window"])].append(r["group_key"])
    domains = {s.name: sorted("|".join(map(str, k)) for k in s.domain) for s in cfg.dp.aggregates}
    for (p, a, o, w), keys in cells.items():
        assert sorted(keys) == domains[a], (p, a, o, w)
    return cells


def test_worker_restart_never_overspends_nor_republishes_different_noise(broker, tmp_path, secret_env):
    from stream_anon.kafka.replay import replay
    from _worker_harness import start_worker_process
    from stream_anon.kafka.supervise import run_until_accounted

    path = dp_stream_config(tmp_path / "cfg", "dpcrash", budget=1000.0, epsilon=RECOUNT_EPS)
    cfg = _setup(broker.bootstrap, path)
    events = synthetic_fares(4000, seed=34)
    replay(broker.bootstrap, cfg.stream.input_topic, events, "journey_id", progress=False)
    state, app_id = tmp_path / "state", "dpcrash-app"
    # the worker dies (SIGKILL) inside its 6th transaction, its output and state sent but not committed
    env = {**os.environ, "STREAM_ANON_TEST_KILL_AFTER_BATCHES": "6"}
    p1 = start_worker_process(path, broker.bootstrap, state, app_id, None, tmp_path / "w1.log", env=env,
                              extra=["--batch-max", "250", "--batch-within", "0.2"])
    p1.wait(timeout=90)
    assert p1.returncode == -signal.SIGKILL
    ledgers_after_kill = {p: _ledger(broker.bootstrap, app_id, "dpcrash", p, 1000.0).spent for p in range(4)}
    assert sum(ledgers_after_kill.values()) > 0
    acc = run_until_accounted(path, broker.bootstrap, state, 4000, timeout_s=120, app_id=app_id,
                              flush_when_idle_s=5.0, log_path=tmp_path / "w2.log")
    assert acc["accounted"] == 4000

    raw = _raw_by_partition(broker.bootstrap, cfg.stream.input_topic)
    assert sum(map(len, raw.values())) == 4000 and set(raw) == {0, 1, 2, 3}
    recount = independent_recount(raw)
    n_rows = sum(len(rc["windows"]) * (2 * len(TAP_CELLS) + 1) for rc in recount.values())
    # with the killed worker's aborted rows (read_uncommitted): they must carry the same noise as the committed ones
    by_id, copies = _dedupe(_read(broker.bootstrap, AGGREGATES_TOPIC, "dpcrash", min_count=n_rows, committed=False))
    print("aggregate rows:", len(by_id), "re-produced:", sum(c > 1 for c in copies.values()),
          "ledgers after kill:", ledgers_after_kill)
    assert any(c > 1 for c in copies.values()), "the kill re-produced at least one window"
    ledgers = {p: _ledger(broker.bootstrap, app_id, "dpcrash", p, 1000.0) for p in range(4)}
    check_rows_against_recount(by_id, recount, ledgers, RECOUNT_EPS)
    _domain_rows(by_id, cfg)
    for p in range(4):
        assert ledgers[p].spent >= ledgers_after_kill[p]
    # contribution cuts on anon.metrics (deduped by partition and window) against a plain recount
    dpw = {(d["partition"], d["window"]): d for d, _, _ in _read(broker.bootstrap, "anon.metrics", "dpcrash")
           if d["type"] == "dp_window"}
    per_unit = Counter((int(datetime.fromisoformat(e["event_time"]).timestamp() // WINDOW_S), e["journey_id"])
                       for e in events)
    expected_cut = sum(n - 1 for n in per_unit.values() if n > 1)
    reported = sum(d["contributions_cut"].get("taps_per_zone", 0) for d in dpw.values())
    print("contributions cut: reported", reported, "recounted", expected_cut)
    assert expected_cut > 0 and reported == expected_cut
    assert sum(d["contributions_cut"].get("fares_running", 0) for d in dpw.values()) == 0


def test_sigterm_of_a_dp_worker_with_its_aggregates_process_exits_cleanly_and_a_restart_loses_nothing(
        broker, tmp_path, secret_env):
    """A DP worker with its aggregates process, stopped with SIGTERM mid-stream, exits cleanly (the releases under
    way settled on the way out), and after a restart every event is accounted and every row agrees with an
    independent recount and the ledgers."""
    from stream_anon.kafka.replay import replay
    from _kafka_helpers import state_offsets
    from _worker_harness import start_worker_process
    from stream_anon.kafka.supervise import run_until_accounted

    path = dp_stream_config(tmp_path / "cfg", "dpterm", budget=1000.0, epsilon=RECOUNT_EPS)
    cfg = _setup(broker.bootstrap, path)
    events = synthetic_fares(4000, seed=35)
    replay(broker.bootstrap, cfg.stream.input_topic, events[:2000], "journey_id", progress=False)
    state, app_id = tmp_path / "state", "dpterm-app"
    w = start_worker_process(path, broker.bootstrap, state, app_id, None, tmp_path / "w1.log",
                             extra=["--batch-max", "100", "--batch-within", "0.1", "--aggregates-process", "on"])
    wait_for(lambda: sum(v + 1 for v in state_offsets(broker.bootstrap, app_id, "dpterm").values()) > 0, 90,
             "first commits")
    replay(broker.bootstrap, cfg.stream.input_topic, events[2000:3000], "journey_id", progress=False)
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=60)
    log = (tmp_path / "w1.log").read_text()
    assert w.returncode == 0, log[-2000:]
    assert "settling the transactions in flight failed" not in log
    replay(broker.bootstrap, cfg.stream.input_topic, events[3000:], "journey_id", progress=False)
    acc = run_until_accounted(path, broker.bootstrap, state, 4000, timeout_s=120, app_id=app_id,
                              flush_when_idle_s=5.0, log_path=tmp_path / "w2.log")
    assert acc["accounted"] == 4000
    raw = _raw_by_partition(broker.bootstrap, cfg.stream.input_topic)
    recount = independent_recount(raw)
    # the idle flush releases every partition through the window of the worker's latest event (the schedule
    # follows the clock, not a partition's own data)
    last = max(rc["windows"][-1] for rc in recount.values())
    for rc in recount.values():
        rc["windows"] = list(range(rc["windows"][0], last + 1))
    n_rows = sum(len(rc["windows"]) * (2 * len(TAP_CELLS) + 1) for rc in recount.values())
    by_id, _ = _dedupe(_read(broker.bootstrap, AGGREGATES_TOPIC, "dpterm", min_count=n_rows))
    ledgers = {p: _ledger(broker.bootstrap, app_id, "dpterm", p, 1000.0) for p in range(4)}
    check_rows_against_recount(by_id, recount, ledgers, RECOUNT_EPS)
    _domain_rows(by_id, cfg)


@pytest.mark.one_broker
def test_tiny_budget_stops_aggregates_with_an_event_and_keys_do_not_depend_on_data(broker, tmp_path, secret_env):
    """Bus-only input (no rail tap at all) under a budget of 0.5: every rail key is still published, with noise,
    for the same key set as a different stream; after the budget the aggregates stop with budget_exhausted."""
    from stream_anon.kafka.replay import replay
    from stream_anon.kafka.supervise import run_until_accounted

    budget = 0.5
    path = dp_stream_config(tmp_path / "cfg", "dptiny", budget=budget)
    cfg = _setup(broker.bootstrap, path)
    events = [e for e in synthetic_fares(3000, seed=35) if e["event_type"] == "bus_boarding"]
    replay(broker.bootstrap, cfg.stream.input_topic, events, "journey_id", progress=False)
    acc = run_until_accounted(path, broker.bootstrap, tmp_path / "state", len(events), timeout_s=120,
                              app_id="dptiny-app", flush_when_idle_s=3.0, log_path=tmp_path / "w.log")
    assert acc["accounted"] == len(events)
    by_id, _ = _dedupe(_read(broker.bootstrap, AGGREGATES_TOPIC, "dptiny"))
    cells = _domain_rows(by_id, cfg)
    metrics = [d for d, _, _ in _read(broker.bootstrap, "anon.metrics", "dptiny")]
    exhausted = {(d["partition"], d["aggregate"]): d for d in metrics if d["type"] == "budget_exhausted"}
    partitions = {r["partition"] for r in by_id.values()}
    assert partitions == {0, 1, 2, 3}
    print("budget_exhausted:", sorted(exhausted))
    # every partition's ledger stops both aggregates: 0.2 per window, budget 0.5 -> two windows and a half
    assert set(exhausted) == {(p, a) for p in partitions for a in ("taps_per_zone", "fares_running")}
    for (p, a), ev in exhausted.items():
        assert ev["epsilon_spent"] + ev["epsilon_requested"] > budget * (1 + 1e-9)
        windows = sorted(w for (pp, aa, _, w) in cells if pp == p and aa == a)
        assert windows and max(windows) < int(ev["window"]), f"{a} p{p} published at or after its stop"
        disk = _ledger(broker.bootstrap, "dptiny-app", "dptiny", p, budget)
        assert disk.spent <= budget * (1 + 1e-9) and disk.is_stopped(a)
    n_windows = {p: len({w for (pp, _, _, w) in cells if pp == p}) for p in partitions}
    assert all(n == 3 for n in n_windows.values()), n_windows      # taps_per_zone 0.3 + fares 0.2 = 0.5
    # absent keys are published: no rail tap in the input, yet every rail cell has a (noisy) row
    rail = [r for r in by_id.values() if r["aggregate"] == "taps_per_zone" and r["group"]["zone"] == "Zone 1"]
    assert rail and {r["group"]["event_type"] for r in rail} == {"tap_in", "tap_out", "bus_boarding"}
    # the key set equals the one derived from the configuration alone, i.e. the same for any input
    keys = {(r["aggregate"], r["output"], r["group_key"]) for r in by_id.values()}
    from_config = {(s.name, o, "|".join(map(str, k))) for s in cfg.dp.aggregates
                   for o in (("per_window", "running") if s.output == "both" else (s.output,)) for k in s.domain}
    assert keys == from_config
    other = {(r["aggregate"], r["output"], r["group_key"]) for r in
             aggregate_directly(cfg, b"another-secret-0123456789abcdef", {0: synthetic_fares(500, seed=36)}).values()}
    assert other == keys, "a different input (rail and bus) gives the same key set"
    assert math.isfinite(sum(r["value"] for r in by_id.values()))
    # the demo's dp report, read back from the broker
    from stream_anon.evaluate.stream_figures import read_dp_report
    rep = read_dp_report(broker.bootstrap, cfg)
    print("dp report:", {k: v for k, v in rep.items() if k not in ("running_counts", "notes")})
    assert rep["aggregates_published"] == len(by_id) and rep["budget_exhausted_events"] == 8
    assert 0.4 < rep["epsilon_spent_max_individual"] <= budget * (1 + 1e-9)
    assert rep["windows"] >= 3 and rep["error_aggregate"] == "taps_per_zone"


@pytest.mark.one_broker
def test_aggregates_view_prints_one_figure_per_key_summed_over_partitions(broker, tmp_path, secret_env, capsys):
    """`stream-anon aggregates` on a 4-partition DP stream in mid-stream (a worker without an idle flush: each
    partition has released the windows its own watermark closed): each merged row is the sum of the partitions'
    rows (read back separately here), with the combined noise and an interval around it; windows some partition
    has not published are held back unless --incomplete."""
    import csv

    from stream_anon.cli import main
    from stream_anon.kafka.replay import replay
    from stream_anon.kafka.supervise import start_worker_process, stop_worker_process

    path = dp_stream_config(tmp_path / "cfg", "dpview", budget=1000.0, epsilon=1.0)
    cfg = _setup(broker.bootstrap, path)
    events = synthetic_fares(2000, seed=37)
    replay(broker.bootstrap, cfg.stream.input_topic, events, "journey_id", progress=False)
    proc = start_worker_process(path, broker.bootstrap, tmp_path / "state", "dpview-app", None, tmp_path / "w.log")
    try:
        seen = []

        def settled():        # the rows stop growing once every partition released what its watermark closed
            seen.append(len(_read(broker.bootstrap, AGGREGATES_TOPIC, "dpview")))
            return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] and seen[-1] > 0
        wait_for(settled, 120, "the worker's DP rows", lambda: seen[-3:])
    finally:
        stop_worker_process(proc)
    by_id, _ = _dedupe(_read(broker.bootstrap, AGGREGATES_TOPIC, "dpview"))
    parts: dict = defaultdict(list)
    for r in by_id.values():
        parts[(r["aggregate"], r["output"], r["window"], r["group_key"])].append(r)
    last = {p: max(r["window"] for r in by_id.values() if r["partition"] == p) for p in range(4)}
    assert len(set(last.values())) > 1, "the partitions end in different windows: the held-back rows are tested"

    def view(*extra):
        out = tmp_path / f"view{len(extra)}"
        assert main(["aggregates", "--config", str(path), "--broker", broker.bootstrap, "--idle", "1", "--out",
                     str(out), *extra]) == 0
        return out.read_text(), capsys.readouterr().err

    text, summary = view()
    complete = [json.loads(line) for line in text.splitlines()]
    text_all, _ = view("--incomplete", "--format", "jsonl")
    everything = [json.loads(line) for line in text_all.splitlines()]
    print(summary.strip())
    assert len(everything) == len(parts)                     # one figure per (aggregate, output, window, key)
    assert [m for m in everything if m["complete"]] == complete
    # complete: every partition has published the window (each ran through its own last window)
    assert {(m["aggregate"], m["output"], m["window"], m["group_key"]) for m in complete} == \
        {k for k in parts if k[2] <= min(last.values())}
    assert f"{len(everything) - len(complete):,} of windows not closed by every partition held back" in summary
    for m in everything:
        rs = parts[(m["aggregate"], m["output"], m["window"], m["group_key"])]
        assert m["partitions"] == sorted(r["partition"] for r in rs)
        assert m["value"] == pytest.approx(sum(r["value"] for r in rs))
        assert m["noise_std"] == pytest.approx(math.sqrt(sum(r["noise_std"] ** 2 for r in rs)))
        lo, hi = m["interval"]
        assert lo < m["value"] < hi and m["interval_level"] == 0.95
        assert m["interval_method"] == ("exact" if m["aggregate"] == "taps_per_zone" else "grid")  # fares: scale 7000
        assert m["window_start"] == min(r["window_start"] for r in rs)
    assert {m["partitions"] == [0, 1, 2, 3] for m in complete if m["window"] >= max(min(
        r["window"] for r in by_id.values() if r["partition"] == p) for p in range(4))} == {True}
    text_csv, _ = view("--format", "csv")
    table = list(csv.DictReader(text_csv.splitlines()))
    assert len(table) == len(complete)
    for row, m in zip(table, complete):
        assert (row["aggregate"], int(row["window"]), row["group_key"]) == (m["aggregate"], m["window"],
                                                                           m["group_key"])
        assert float(row["value"]) == pytest.approx(m["value"]) and json.loads(row["partitions"]) == m["partitions"]
        assert (float(row["interval_lo"]), float(row["interval_hi"])) == pytest.approx(tuple(m["interval"]))


@pytest.mark.slow
def test_demo_dp_report_on_an_oyster_cards_slice(tmp_path, broker_of_its_own):
    """`stream-anon demo --dataset oyster-cards --dp` on the first 3,000 events: the report's DP figures are
    there and within their ranges (budget per card and day kept, AUC a probability and below the noise-free
    attack's, relative errors and RMSE of every configured aggregate)."""
    from stream_anon.config import load_config
    from stream_anon.demo import run_demo

    report = tmp_path / "demo.json"
    assert run_demo("oyster-cards", events=3000, dp=True, report_path=str(report), timeout_s=300) == 0
    dp = json.loads(report.read_text())["dp"]
    print({k: v for k, v in dp.items() if k not in ("notes", "running_counts", "aggregates_rmse")})
    budget = load_config("configs/oyster-cards.toml").dp.epsilon_budget
    assert (dp["epsilon_budget"], dp["privacy_unit"], dp["period"]) == (budget, "card_id", "day")
    assert 0 < dp["epsilon_spent_max_individual"] <= budget * (1 + 1e-9)
    by_period = dp["epsilon_spent_max_individual_by_period"]
    assert by_period and max(by_period.values()) == pytest.approx(dp["epsilon_spent_max_individual"])
    assert 0 < dp["merged_rows"] < dp["aggregates_published"]
    auc, clear = dp["membership_inference_auc"], dp["membership_inference_auc_no_noise"]
    assert 0.0 <= auc <= 1.0 and 0.0 <= clear <= 1.0 and auc < clear
    assert dp["membership_inference"]["games"] == 480
    rel = dp["relative_error"]
    assert rel["aggregate"] == "tap_ins_zone_hour" and rel["cells"] > 0 and rel["rmse"] > 0
    assert [t["min_true_count"] for t in rel["by_threshold"]] == [500, 100]
    for t in rel["by_threshold"]:
        assert 0 <= t["within_10pct"] <= t["cells"]
        assert t["cells"] == 0 or 0 <= t["median_relative_error"] <= t["max_relative_error"]
    # the first 3,000 events end on the morning of day 0; the idle flush releases the day to its end by the clock
    # (docs/privacy.md, Which DP rows exist): the daily aggregates too, every one with its error
    names = {s.name for s in load_config("configs/oyster-cards.toml").dp.aggregates}
    assert set(dp["aggregates_rmse"]) == names and len(names) == 5
    # the demo's secret is random, so is its noise: a clipped ratio can come out exactly at its true values (0)
    assert all(math.isfinite(a["rmse"]) and a["rmse"] >= 0 for a in dp["aggregates_rmse"].values()), \
        {n: a["rmse"] for n, a in dp["aggregates_rmse"].items()}
