"""Differentially private aggregates (issue 4): noise distribution, continual counters, budget ledger across
restarts, contribution bounding, data-independent key sets, and the thesis's Table 4.14 relation.
All randomness is seeded; the file runs in well under a minute."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from stream_anon.errors import ConfigError
from stream_anon.dp import (BinaryTreeCounter, BudgetExhausted, BudgetExhaustedError, BudgetLedger, DPAggregator,
                            HybridCounter, PerWindowCounter, bound_contributions, choose_mechanism, clamp,
                            draw_noise, make_mechanism, parse_dp_config, split_outputs)
from stream_anon.checkpoint import Composite, full_state
from stream_anon.dp.continual import noise_ci95_half_width, theoretical_running_mse


def _raw(aggregates, budget=10.0):
    return {"stream": {"name": "t", "privacy_unit": "card", "event_time": "event_time"},
            "dp": {"epsilon_budget": budget}, "aggregates": aggregates}


LINES = {"name": "line", "field": "line", "values": ["a", "b", "c"]}


def _count(name="n", epsilon=0.5, mc=2, **kw):
    return {"name": name, "kind": "count", "epsilon": epsilon, "max_contributions": mc, "group_by": [LINES], **kw}


# -- noise distribution ---------------------------------------------------------------------------------------
def test_laplace_noise_matches_theoretical_scale_ks():
    mech = make_mechanism("laplace", epsilon=0.5, sensitivity=2.0, random_state=np.random.RandomState(1))
    vec = draw_noise(mech, 20000)                                   # vectorized path (diffprivlib's sampler)
    p_vec = stats.kstest(vec, stats.laplace(scale=4.0).cdf).pvalue
    loop_mech = make_mechanism("laplace", 0.5, 2.0, np.random.RandomState(2))
    loop = np.array([loop_mech.randomise(0.0) for _ in range(5000)])   # diffprivlib's own randomise
    p_loop = stats.kstest(loop, stats.laplace(scale=4.0).cdf).pvalue
    p_same = stats.ks_2samp(vec, loop).pvalue
    print(f"KS p-values: vectorized {p_vec:.3f}, randomise {p_loop:.3f}, two-sample {p_same:.3f}")
    assert p_vec > 0.01 and p_loop > 0.01 and p_same > 0.01
    assert abs(np.mean(np.abs(vec)) - 4.0) < 0.1                     # E|Lap(b)| = b


def test_tree_node_noise_has_scale_levels_over_epsilon_ks():
    c = BinaryTreeCounter(n_cells=20000, epsilon=1.0, sensitivity=1, noise="laplace", horizon=2 ** 12)
    assert c.levels == 13 and c.node_scale == 13.0
    out = c.update(np.zeros(20000), np.random.RandomState(3))       # t = 1: one node, noise only
    p = stats.kstest(out, stats.laplace(scale=13.0).cdf).pvalue
    print(f"KS p-value tree node noise: {p:.3f}")
    assert p > 0.01


def test_geometric_noise_matches_two_sided_geometric_chi_square():
    eps = 0.7
    mech = make_mechanism("geometric", eps, 1, np.random.RandomState(4))
    x = draw_noise(mech, 20000).astype(int)
    q = math.exp(-eps)
    ks = np.arange(-8, 9)
    pmf = (1 - q) / (1 + q) * q ** np.abs(ks)
    obs = np.array([(x == k).sum() for k in ks] + [(np.abs(x) > 8).sum()])
    exp = np.append(pmf, 1 - pmf.sum()) * len(x)
    p = stats.chisquare(obs, exp).pvalue
    print(f"chi-square p-value geometric: {p:.3f}")
    assert p > 0.01
    assert abs(x.var() - mech.variance(0)) / mech.variance(0) < 0.05
    h = noise_ci95_half_width("geometric", eps, 1)
    assert np.mean(np.abs(x) <= h) >= 0.945


# -- continual counters ---------------------------------------------------------------------------------------
def _run(counter, true_increments, seed):
    rs = np.random.RandomState(seed)
    return np.array([counter.update(x, rs) for x in true_increments])


def test_binary_tree_running_count_error_matches_theory_and_beats_per_window():
    T, cells, eps = 2 ** 12, 200, 1.0
    rng = np.random.default_rng(5)
    inc = rng.poisson(3.0, size=(T, cells)).astype(float)
    truth = inc.cumsum(axis=0)
    tree = BinaryTreeCounter(cells, eps, 1, "laplace", horizon=T)
    naive = PerWindowCounter(cells, eps, 1, "laplace")
    err_tree = _run(tree, inc, 6) - truth
    err_naive = _run(naive, inc, 7) - truth
    rmse_tree, rmse_naive = np.sqrt(np.mean(err_tree ** 2)), np.sqrt(np.mean(err_naive ** 2))
    theory_tree = math.sqrt(theoretical_running_mse("binary_tree", T, eps, 1, "laplace"))
    theory_naive = math.sqrt(theoretical_running_mse("per_window", T, eps, 1, "laplace"))
    std_T = err_tree[-1].std()                                       # at t = T: one node of each level
    print(f"2^12 windows: tree RMSE {rmse_tree:.1f} (theory {theory_tree:.1f}), per-window {rmse_naive:.1f} "
          f"(theory {theory_naive:.1f}); std at T {std_T:.1f} vs {math.sqrt(tree.running_variance(T)):.1f}")
    assert abs(rmse_tree / theory_tree - 1) < 0.20
    assert abs(std_T / math.sqrt(tree.running_variance(T)) - 1) < 0.20
    assert abs(rmse_naive / theory_naive - 1) < 0.20
    assert rmse_tree < 0.8 * rmse_naive
    assert all(bin(t).count("1") <= tree.levels for t in range(1, T + 1))   # at most L nodes per prefix


def test_hybrid_counter_unknown_horizon_error_matches_theory():
    T, cells = 2 ** 10 + 37, 200
    inc = np.ones((T, cells))
    h = HybridCounter(cells, 1.0, 1, "laplace")
    err = _run(h, inc, 8) - inc.cumsum(axis=0)
    theory = math.sqrt(np.mean([h.running_variance(t) for t in range(1, T + 1)]))
    assert abs(np.sqrt(np.mean(err ** 2)) / theory - 1) < 0.20


def test_tree_rolls_over_past_horizon_and_state_round_trips_through_json():
    inc = np.arange(1, 41, dtype=float).reshape(20, 2)
    a = BinaryTreeCounter(2, 1.0, 1, "geometric", horizon=8)
    full = [a.update(x, np.random.RandomState(i)) for i, x in enumerate(inc)]
    b = BinaryTreeCounter(2, 1.0, 1, "geometric", horizon=8)
    part = [b.update(x, np.random.RandomState(i)) for i, x in enumerate(inc[:11])]
    saved = json.loads(json.dumps(b.state_core()))
    b = BinaryTreeCounter(2, 1.0, 1, "geometric", horizon=8)
    b.load_state(saved)
    part += [b.update(x, np.random.RandomState(i + 11)) for i, x in enumerate(inc[11:])]
    np.testing.assert_array_equal(np.array(full), np.array(part))
    assert b.running_terms(16) == 2 and b.running_terms(17) == 3
    for cls in (PerWindowCounter, HybridCounter):
        c = cls(2, 1.0, 1, "laplace")
        for t in range(3):                  # the hybrid's tree exists from t = 3 (between two powers of two)
            c.update([1, 2], np.random.RandomState(t))
        d = cls(2, 1.0, 1, "laplace")
        d.load_state(json.loads(json.dumps(c.state_core())))
        np.testing.assert_array_equal(c.update([1, 1], np.random.RandomState(9)),
                                      d.update([1, 1], np.random.RandomState(9)))
        assert c.state_core() == d.state_core()
    # a state calibrated to another epsilon is not continued: its noise would not match what the ledger charges
    with pytest.raises(ValueError, match="other parameters"):
        BinaryTreeCounter(2, 0.5, 1, "geometric", horizon=8).load_state(saved)
    with pytest.raises(ValueError, match="other parameters"):
        BinaryTreeCounter(2, 1.0, 1, "geometric", horizon=16).load_state(saved)


def test_mechanism_chosen_from_horizon_and_stated_in_output():
    assert choose_mechanism(2 ** 8, 1.0, 1, "geometric")["mechanism"] == "per_window"
    assert choose_mechanism(2 ** 12, 1.0, 1, "geometric")["mechanism"] == "binary_tree"
    assert choose_mechanism(None, 1.0, 1, "geometric")["mechanism"] == "hybrid"
    cfg = parse_dp_config(_raw([_count("short", output="running", horizon_windows=2 ** 8),
                                _count("long", output="running", horizon_windows=2 ** 12),
                                _count("open", output="running")], budget=100))
    rows = DPAggregator(cfg, BudgetLedger(None, 100), seed=1).process_window(0, [])
    mech = {r["aggregate"]: r["mechanism"] for r in rows}
    assert mech == {"short": "per_window/geometric", "long": "binary_tree/geometric", "open": "hybrid/geometric"}
    assert all("theoretical" in r["mechanism_reason"] or r["aggregate"] == "open" for r in rows)


# -- budget ledger --------------------------------------------------------------------------------------------
EVENTS = [{"card": c, "line": l} for c, l in [("x", "a"), ("y", "a"), ("z", "b"), ("x", "a"), ("x", "b")]]


def _restarted(cfg, saved=None):
    """An aggregator and its ledger as the worker holds them (one state), from a saved state (core, tables)."""
    ledger = BudgetLedger(None, cfg.epsilon_budget)
    agg = DPAggregator(cfg, ledger, seed=b"s")
    parts = Composite({"aggregator": agg, "ledger": ledger})
    if saved is not None:
        parts.load_state(json.loads(json.dumps(saved[0])), saved[1])
    return agg, ledger, parts


def test_budget_never_exceeded_across_restart():
    cfg = parse_dp_config(_raw([_count(epsilon=0.3)], budget=1.0))
    agg, ledger, parts = _restarted(cfg)
    agg.process_window(0, EVENTS)
    checkpoint = json.loads(json.dumps(full_state(parts)[0])), {}       # committed after window 0
    agg.process_window(1, EVENTS)
    first_w2 = agg.process_window(2, EVENTS)
    assert ledger.spent == pytest.approx(0.9)
    # crash before the next commit: windows 1 and 2 are re-produced from the committed state
    agg2, ledger2, parts2 = _restarted(cfg, checkpoint)
    assert ledger2.spent == pytest.approx(0.3)
    agg2.process_window(1, EVENTS)
    again_w2 = agg2.process_window(2, EVENTS)
    assert [r["value"] for r in again_w2] == [r["value"] for r in first_w2]   # identical: no new information
    assert ledger2.spent == pytest.approx(0.9) and len(ledger2) == 3         # no double spend
    rows = agg2.process_window(3, EVENTS)                                     # 1.2 > 1.0: stop
    aggs, events = split_outputs(rows)
    assert aggs == [] and [e["type"] for e in events] == ["budget_exhausted"]
    assert ledger2.spent <= 1.0
    agg3, ledger3, _ = _restarted(cfg, full_state(parts2))
    assert agg3.process_window(4, EVENTS) == []                               # stays stopped, one event only
    assert ledger3.spent == pytest.approx(0.9) and ledger3.is_stopped("n")


def test_the_ledger_has_no_file():
    """The ledger lives in the partition's state, committed with the rows that spend it; a file beside it could
    disagree with the committed rows."""
    with pytest.raises(TypeError, match="partition's state"):
        BudgetLedger("ledger.json", 1.0)


def test_overspend_attempt_yields_budget_exhausted():
    ledger = BudgetLedger(None, 1.0)
    for w in range(10):
        assert ledger.reserve("a", w, 0.1).ok                               # 10 x 0.1 fits 1.0 exactly
    out = ledger.reserve("b", 0, 0.05)
    assert isinstance(out, BudgetExhausted) and out.event()["type"] == "budget_exhausted"
    with pytest.raises(BudgetExhaustedError):
        ledger.reserve("c", 0, 0.5, raise_on_exhausted=True)
    cfg = parse_dp_config(_raw([_count(epsilon=2.0)], budget=2.0))
    agg = DPAggregator(cfg, BudgetLedger(None, 2.0), seed=0)
    assert len(agg.process_window(0, EVENTS)) == 3
    ev = agg.process_window(1, EVENTS)
    assert [e["type"] for e in ev] == ["budget_exhausted"] and ev[0]["aggregate"] == "n"
    assert agg.metrics["budget_exhausted_events"] == 1


# -- contribution bounding, clamping, domains -----------------------------------------------------------------
def test_contribution_bounding_enforced_and_reported():
    keep, cut = bound_contributions(["u"] * 10 + ["v"], 2)
    assert keep.tolist() == [True, True] + [False] * 8 + [True] and cut == 8
    assert clamp([5000, -1], 0, 1000).tolist() == [1000.0, 0.0]
    cfg = parse_dp_config(_raw([
        _count("n", epsilon=1e6, mc=2),
        {"name": "s", "kind": "sum", "value": "fare", "lower": 0, "upper": 1000, "epsilon": 1e6,
         "max_contributions": 1, "group_by": [LINES]}], budget=1e7))
    agg = DPAggregator(cfg, BudgetLedger(None, 1e7), seed=0)
    events = [{"card": "u", "line": "a", "fare": 5000}] * 10 + [{"card": "v", "line": "b", "fare": 7}]
    rows = {(r["aggregate"], r["group_key"]): r for r in agg.process_window(0, events)}
    assert rows[("n", "a")]["value"] == 2 and rows[("n", "b")]["value"] == 1   # eps huge: noise ~ 0
    assert rows[("s", "a")]["value"] == pytest.approx(1000, abs=0.01)          # one event, clamped
    assert rows[("n", "a")]["sensitivity"] == 2 and rows[("s", "a")]["sensitivity"] == 1000
    assert agg.metrics["contributions_cut"] == {"n": 8, "s": 9}
    assert agg.window_metrics["contributions_cut"] == {"n": 8, "s": 9}


def test_output_keys_are_the_configured_domain_not_the_data(tmp_path):
    hier = tmp_path / "h.json"
    hier.write_text(json.dumps({"name": "h", "levels": ["value", "zone", "*"],
                                "tree": {"*": {"Z1": ["s1", "s2"], "Z2": ["s3"], "Z3": ["s4"]}}}))
    cfg = parse_dp_config(_raw([
        {"name": "z", "kind": "count", "epsilon": 0.5, "max_contributions": 1, "output": "both",
         "horizon_windows": 2 ** 16,         # "both": the tree needs half the budget, wins only here
         "group_by": [{"name": "zone", "field": "station", "hierarchy": "h.json", "level": "zone"},
                      {"name": "hour", "kind": "hour"}]},
        {"name": "m", "kind": "mean", "value": "fare", "lower": 0, "upper": 10, "epsilon": 0.5,
         "max_contributions": 1, "group_by": [LINES]},
        {"name": "r", "kind": "ratio", "value": "ok", "numerator_values": [True], "epsilon": 0.5,
         "max_contributions": 1},
        {"name": "h", "kind": "histogram", "value": "fare", "bins": [0, 5, 10], "epsilon": 0.5,
         "max_contributions": 1}], budget=100), tmp_path)
    d1 = [{"card": "a", "station": "s1", "event_time": "2009-11-09T07:01:00+00:00", "line": "a", "fare": 3,
           "ok": True}]
    d2 = [{"card": f"c{i}", "station": "s4", "event_time": "2009-11-09T19:01:00+00:00", "line": "c",
           "fare": 9, "ok": False} for i in range(50)] + [{"card": "q", "station": "nowhere"}]
    keys = []
    for data in (d1, d2):
        rows = DPAggregator(cfg, BudgetLedger(None, 100), seed=3).process_window(7, data)
        keys.append(sorted((r["aggregate"], r["output"], r["group_key"]) for r in rows))
    assert keys[0] == keys[1]
    assert len([k for k in keys[0] if k[0] == "z"]) == 2 * 3 * 24          # both outputs x 3 zones x 24 hours
    rows = DPAggregator(cfg, BudgetLedger(None, 100), seed=3).process_window(7, d2)
    row = next(r for r in rows if r["aggregate"] == "z")
    for k in ("window", "aggregate", "group", "value", "epsilon", "mechanism", "noise_scale", "sensitivity",
              "ci95", "noise_ci95"):
        assert k in row
    assert {r["mechanism"] for r in rows if r["aggregate"] == "z"} == {"per_window/geometric",
                                                                       "binary_tree/geometric"}


def test_spec_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError,
                       match=r"^aggregates\.taps_per_station\.epsilon: must be in \(0, 1000000000\], got 0"):
        parse_dp_config(_raw([_count("taps_per_station", epsilon=0)]))
    with pytest.raises(ConfigError, match=r"^aggregates\.n\.max_contributions"):
        parse_dp_config(_raw([_count(mc=0)]))
    with pytest.raises(ConfigError, match=r"^aggregates\.n\.group_by\[0\]\.kind"):
        parse_dp_config(_raw([_count(group_by=[{"name": "station", "field": "station"}])]))
    with pytest.raises(ConfigError, match=r"^aggregates\.s\.lower"):
        parse_dp_config(_raw([{"name": "s", "kind": "sum", "value": "v", "epsilon": 1, "max_contributions": 1}]))
    with pytest.raises(ConfigError, match=r"^aggregates\.n\.mechanism"):
        parse_dp_config(_raw([_count(mechanism="binary_tree")]))
    with pytest.raises(ConfigError, match=r"^dp\.epsilon_budget"):
        parse_dp_config({**_raw([]), "dp": {"epsilon_budget": -1}})


def test_oyster_example_config_runs_on_real_events():
    from stream_anon.datasets import load_events
    from stream_anon.dp.specs import load_dp_config
    from stream_anon.events import parse_event_time
    cfg = load_dp_config("configs/oyster.toml")
    events = load_events("oyster", limit=3000)
    agg = DPAggregator(cfg, BudgetLedger(None, cfg.epsilon_budget), seed=b"k")
    by_window: dict[int, list] = {}
    for e in events:
        by_window.setdefault(int(parse_event_time(e["event_time"]) // 900), []).append(e)
    rows = []
    for w in sorted(by_window):
        rows += agg.process_window(w, by_window[w])
    assert cfg.start_window < min(by_window)          # the schedule starts at midnight, before the first tap
    n_windows = max(by_window) - cfg.start_window + 1  # every window from the schedule's start, with events or not
    per_window = sum(len(s.domain) * (2 if s.output == "both" else 1) for s in cfg.aggregates)
    assert len(rows) == n_windows * per_window
    assert 0 < agg.ledger.spent <= cfg.epsilon_budget
    json.dumps(rows)


# -- thesis Table 4.14 ----------------------------------------------------------------------------------------
# Table 4.14 of the thesis (../shared/papers/004_57f69dc18ae0f7e2.txt): KPI sensitivity and the mean relative error
# |y - y'| / y over 100,000 runs, as printed; the true KPI values y are Table 4.10's ("UD" rows of the raw data).
TABLE_4_14 = {            # KPI: (sensitivity, true KPI, {epsilon: printed mean relative error})
    "Overall": (0.03, 0.4215, {10.0: "0.007", 1.0: "0.07", 0.1: "0.57"}),
    "Electric": (0.0466, 0.3805, {10.0: "0.01", 1.0: "0.12", 0.1: "0.79"}),
    "Gas": (0.0496, 0.4736, {10.0: "0.01", 1.0: "0.1", 0.1: "0.66"}),
    "Hybrid": (0.3889, 0.3889, {10.0: "0.1", 1.0: "0.71", 0.1: "1.2"}),
}
# cells where the printed value is not sensitivity / (epsilon * KPI) at the printed precision (see the docstring)
FORMULA_DISAGREES = {("Overall", 0.1), ("Electric", 0.1), ("Gas", 0.1), ("Hybrid", 1.0), ("Hybrid", 0.1)}
CELLS = [(kpi, eps) for kpi, (_, _, printed) in TABLE_4_14.items() for eps in printed]


def _half_unit(printed: str) -> float:
    """Half a unit of the last printed digit: the rounding the thesis applied."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return 0.5 * 10 ** -decimals


@pytest.mark.parametrize("kpi, epsilon", CELLS, ids=[f"{k}-eps{e:g}" for k, e in CELLS])
def test_table_4_14_relative_error_is_sensitivity_over_epsilon_value(kpi, epsilon):
    """E|Lap(b)| = b with b = sensitivity / epsilon, so the mean relative error of the plain Laplace mechanism is
    sensitivity / (epsilon * KPI). Checked at every epsilon Table 4.14 prints (10, 1, 0.1), for its four KPIs.

    The printed value and the formula disagree in five cells (printed -> formula):
    Overall eps 0.1: 0.57 -> 0.71; Electric eps 0.1: 0.79 -> 1.22; Gas eps 0.1: 0.66 -> 1.05;
    Hybrid eps 1: 0.71 -> 1.00; Hybrid eps 0.1: 1.2 -> 10.0.
    The other seven agree at the printed precision (e.g. Overall: 0.007, 0.07 printed; 0.0071, 0.071 by the
    formula). The thesis truncates the mechanism's output to [0, 1] (section 4.4.3: "setting the lower bound to
    0 and the upper bound to 1"), which caps the error at max(y, 1 - y) and matters once b is comparable to the
    KPI; the formula holds for the untruncated mechanism. So the test asserts the formula for our (untruncated)
    Laplace noise in every cell, the formula against the printed value where they agree, and, where they
    disagree, that the truncated mechanism reproduces the printed value (the disagreement is the truncation,
    not a different noise scale)."""
    sensitivity, y, printed_cells = TABLE_4_14[kpi]
    printed = printed_cells[epsilon]
    tol = _half_unit(printed)
    formula = sensitivity / (epsilon * y)
    mech = make_mechanism("laplace", epsilon, sensitivity, np.random.RandomState(11))
    noise = draw_noise(mech, 200_000)
    rel = np.abs(noise) / y                                           # untruncated: |y' - y| / y
    truncated = np.abs(clamp(y + noise, 0.0, 1.0) - y) / y            # the thesis's released value, clipped
    se = rel.std() / math.sqrt(len(rel))
    se_t = truncated.std() / math.sqrt(len(truncated))
    print(f"{kpi} eps {epsilon}: printed {printed}, formula {formula:.4f}, untruncated {rel.mean():.4f}, "
          f"truncated {truncated.mean():.4f}")
    assert rel.mean() == pytest.approx(formula, abs=4 * se)            # our mechanism follows the formula
    assert abs(truncated.mean() - float(printed)) <= tol + 4 * se_t   # the truncated one gives the table
    agrees = abs(formula - float(printed)) <= tol
    assert agrees == ((kpi, epsilon) not in FORMULA_DISAGREES), \
        f"{kpi} eps {epsilon}: printed {printed}, formula {formula:.4f} (docstring out of date)"
