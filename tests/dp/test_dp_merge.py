"""Issue 14 item 4: one figure per key. The merged row equals the sum of the partitions' rows, and its stated
interval covers the true value at the stated rate (over seeds)."""
from __future__ import annotations

import numpy as np
import pytest

from stream_anon.dp import BudgetLedger, DPAggregator, parse_dp_config
from stream_anon.dp.merge import marginal, merge_rows

DAY0_W = 1257724800 // 900
LINES = ["a", "b", "c"]


def _cfg(noise="auto"):
    return parse_dp_config({
        "stream": {"name": "t", "privacy_unit": "card", "event_time": "event_time"},
        "anonymization": {"window_s": 900},
        "dp": {"unit": "individual", "period": "day", "timezone": "Europe/London", "epsilon_per_period": 1.0,
               "max_windows_per_period": 16},
        "aggregates": [{"name": "n", "kind": "count", "epsilon": 1.0, "max_contributions": 1, "noise": noise,
                        "release_every_windows": 8, "output": "both",
                        "group_by": [{"name": "line", "field": "line", "values": LINES}]}]})


def _run(cfg, seed, partitions=4):
    """Rows of ``partitions`` aggregators (one per partition, own noise seed, disjoint cards) over a day, and the
    true per-release counts summed over partitions: (window, output, line) -> value."""
    rng = np.random.default_rng(seed)
    rows, truth = [], {}
    for p in range(partitions):
        agg = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=f"secret-{seed}-{p}".encode())
        acc = {k: 0 for k in LINES}
        run = {k: 0 for k in LINES}
        for i in range(96):
            n = rng.poisson(30)
            lines = rng.choice(LINES, size=n, p=[0.6, 0.3, 0.1])
            evs = [{"card": f"p{p}-w{i}-c{j}", "line": str(l)} for j, l in enumerate(lines)]
            for l in lines:
                acc[str(l)] += 1
            for r in agg.process_window(DAY0_W + i, evs):
                rows.append({**r, "partition": p, "row_id": f"t/p{p}/{r['aggregate']}/{r['output']}/w{r['release']}/"
                                                            f"{r['group_key']}"})
            if (i + 1) % 8 == 0:
                for k in LINES:
                    run[k] += acc[k]
                    for out, v in (("per_window", acc[k]), ("running", run[k])):
                        truth[(DAY0_W + i, out, k)] = truth.get((DAY0_W + i, out, k), 0) + v
                acc = {k: 0 for k in LINES}
    return rows, truth


def test_merged_value_is_the_sum_of_the_partitions_rows_and_duplicates_do_not_count():
    rows, _ = _run(_cfg(), seed=1)
    merged = merge_rows(rows + rows[:50])                       # re-produced rows (same row_id) are ignored
    assert len(merged) == 12 * 2 * len(LINES)
    for m in merged:
        parts = [r for r in rows if (r["window"], r["output"], r["group_key"]) == (m["window"], m["output"],
                                                                                   m["group_key"])]
        assert m["partitions"] == [0, 1, 2, 3]
        assert m["value"] == sum(r["value"] for r in parts)
        assert m["noise_std"] == pytest.approx(np.sqrt(sum(r["noise_std"] ** 2 for r in parts)))
        assert m["interval"][0] < m["value"] < m["interval"][1]
    tot = marginal([m for m in merged if m["output"] == "per_window"], over="line")
    assert len(tot) == 12 and all(t["group"] == {"line": "*"} and t["cells"] == 3 for t in tot)
    first = [m for m in merged if m["output"] == "per_window" and m["window"] == tot[0]["window"]]
    assert tot[0]["value"] == sum(m["value"] for m in first)   # consistent with the cells by construction


@pytest.mark.parametrize("noise,method", [("auto", "exact"), ("snapping", "normal")])
def test_stated_interval_covers_the_truth_at_the_stated_rate(noise, method):
    cfg = _cfg(noise)
    hits = total = 0
    widths = []
    for seed in range(10 if noise == "auto" else 6):
        rows, truth = _run(cfg, seed=100 + seed)
        for m in merge_rows(rows, level=0.9):
            assert m["interval_method"] == method
            t = truth[(m["window"], m["output"], m["group_key"])]
            hits += m["interval"][0] <= t <= m["interval"][1]
            total += 1
            widths.append(m["interval"][1] - m["interval"][0])
    rate = hits / total
    se = np.sqrt(0.9 * 0.1 / total)
    print(f"{noise}: coverage of the stated 90% interval {rate:.3f} over {total} merged cells, "
          f"mean width {np.mean(widths):.1f}")
    assert 0.9 - 3 * se <= rate <= 0.9 + 5 * se            # not below the level, and not vacuously wide


def test_least_squares_consistency_is_consistent_and_more_accurate():
    """Hay et al. 2010: zone x hour cells plus separately released zone and hour totals, combined by least
    squares, give a table whose sums equal the totals and whose cells are more accurate than the raw ones."""
    from stream_anon.dp.consistency import two_way
    rng = np.random.default_rng(7)
    truth = rng.poisson(50, size=(6, 8)).astype(float)
    raw_err, ls_err = [], []
    for _ in range(200):
        cells = truth + rng.laplace(0, 10, truth.shape)
        rows = truth.sum(1) + rng.laplace(0, 10, 6)
        cols = truth.sum(0) + rng.laplace(0, 10, 8)
        est, var = two_way(cells, 200.0, rows, 200.0, cols, 200.0)
        raw_err.append(np.mean((cells - truth) ** 2))
        ls_err.append(np.mean((est - truth) ** 2))
    assert np.mean(ls_err) < 0.9 * np.mean(raw_err)
    assert np.mean(ls_err) == pytest.approx(var.mean(), rel=0.1)        # stated variance matches
    est, _ = two_way(truth, 1.0, truth.sum(1), 1.0, truth.sum(0), 1.0)      # exact inputs are a fixed point
    np.testing.assert_allclose(est, truth, atol=1e-9)


def test_interval_of_large_scale_integer_noise_is_computed_on_a_grid_and_covers():
    """A clamped fare sum has geometric noise of scale in the thousands: point-by-point convolution would take
    hours; the grid interval states the method and still covers at the stated level (sampled noise)."""
    from stream_anon.dp.merge import _integer_noise_interval

    rng = np.random.default_rng(5)
    for scale, draws in ((300.0, 1), (7000.0, 2)):
        p = np.exp(-1 / scale)
        noise = (rng.geometric(1 - p, size=(200_000, draws)) - rng.geometric(1 - p, size=(200_000, draws))).sum(1)
        lo, hi, method = _integer_noise_interval([(scale, draws)] * 4 if draws == 2 else [(scale, draws)], 0.95)
        if draws == 2:
            noise = noise + sum((rng.geometric(1 - p, size=(200_000, draws)) -
                                 rng.geometric(1 - p, size=(200_000, draws))).sum(1) for _ in range(3))
        covered = np.mean((noise >= lo) & (noise <= hi))
        assert method == "grid" and 0.948 <= covered <= 0.96, (scale, draws, covered)
    assert _integer_noise_interval([(1.0, 3)], 0.95)[2] == "exact"
