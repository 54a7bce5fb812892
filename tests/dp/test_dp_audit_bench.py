"""The statistics of bench/bench_dp_audit.py (issue 39's empirical DP audit): its Clopper-Pearson intervals against
scipy's beta quantiles, closed forms and a published value, and its epsilon lower bound on mechanisms of known
epsilon: below the truth at 0.5, near it at 2, and above the claim when one unit's data reaches the observer
through two independent releases (so the audit can fail). Fast: numpy draws only, no aggregator."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import beta

from stream_anon.dp.diffprivlib_adapter import draw_noise, geometric_noise, make_mechanism

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_dp_audit", ROOT / "bench" / "bench_dp_audit.py")
audit = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = audit          # its dataclasses look their module up while the file runs
_spec.loader.exec_module(audit)

TRIALS = 20_000          # per side, as the bench: half calibrates the threshold, half is tested


@pytest.mark.parametrize("k,n", [(0, 10), (1, 10), (5, 10), (10, 10), (37, 1000), (4_990, 10_000), (9_999, 10_000)])
def test_clopper_pearson_is_the_beta_quantiles(k, n):
    lo, hi = audit.clopper_pearson(k, n)
    assert float(lo) == pytest.approx(0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1), abs=1e-12)
    assert float(hi) == pytest.approx(1.0 if k == n else beta.ppf(0.975, k + 1, n - k), abs=1e-12)
    assert float(lo) <= k / n <= float(hi)


def test_clopper_pearson_closed_forms_and_a_published_value():
    n = 50
    assert float(audit.clopper_pearson(0, n)[1]) == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-10)
    assert float(audit.clopper_pearson(n, n)[0]) == pytest.approx(0.025 ** (1 / n), rel=1e-10)
    lo, hi = audit.clopper_pearson(5, 10)           # the exact interval of 5/10 (e.g. statsmodels' "beta")
    assert (float(lo), float(hi)) == pytest.approx((0.187086, 0.812914), abs=1e-6)
    lo, hi = audit.clopper_pearson(np.array([0, 5]), np.array([10, 10]), alpha=0.1)   # vectorized, other level
    assert hi.tolist() == pytest.approx([1 - 0.05 ** 0.1, beta.ppf(0.95, 6, 5)], rel=1e-10)


def test_epsilon_lower_bound_is_the_formula():
    fp, fn, n = 300, 6_000, 10_000
    fpr_u, fnr_u = beta.ppf(0.975, fp + 1, n - fp), beta.ppf(0.975, fn + 1, n - fn)
    expected = max(math.log((1 - fnr_u) / fpr_u), math.log((1 - fpr_u) / fnr_u))
    assert float(audit.epsilon_lower_bound(fp, fn, n, n)) == pytest.approx(expected, rel=1e-12)
    assert float(audit.epsilon_lower_bound(n // 2, n // 2, n, n)) < 0       # a coin flip: no evidence


def _geometric_pair(epsilon: float, sensitivity: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Outputs of the product's geometric sampler on neighbouring counts 0 and ``sensitivity`` (the pair whose
    privacy loss is exactly ``epsilon``)."""
    rs = np.random.RandomState(seed)
    return (geometric_noise(rs, epsilon, sensitivity, TRIALS),
            sensitivity + geometric_noise(rs, epsilon, sensitivity, TRIALS))


def _laplace_pair(epsilon: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    mech = make_mechanism("laplace", epsilon, 1.0, np.random.RandomState(seed))
    return draw_noise(mech, TRIALS), 1.0 + draw_noise(mech, TRIALS)


@pytest.mark.parametrize("pair", ["geometric", "laplace"])
def test_bound_stays_below_a_true_epsilon_of_half(pair):
    d, d1 = _geometric_pair(0.5, 4, seed=1) if pair == "geometric" else _laplace_pair(0.5, seed=1)
    res = audit.audit_scores(d, d1)
    assert 0.25 < res["epsilon_lb"] <= 0.5, res
    assert res["test"]["trials_absent"] == res["test"]["trials_present"] == TRIALS // 2


@pytest.mark.parametrize("pair", ["geometric", "laplace"])
def test_bound_finds_a_true_epsilon_of_two(pair):
    d, d1 = _geometric_pair(2.0, 1, seed=2) if pair == "geometric" else _laplace_pair(2.0, seed=2)
    res = audit.audit_scores(d, d1)
    assert 1.4 < res["epsilon_lb"] <= 2.0, res


def test_two_independent_views_exceed_the_claim_of_one():
    """The naive control in small: a unit bounded per partition reaches the observer through two releases at 0.5
    each; the likelihood ratio over both (the bench's :func:`llr`) proves more than the 0.5 claimed."""
    a0, a1 = _geometric_pair(0.5, 4, seed=3)
    b0, b1 = _geometric_pair(0.5, 4, seed=4)
    qs = [{"x_absent": 0.0, "x_present": 4.0, "noise_scale": 8.0}] * 2
    s0 = audit.llr(np.column_stack([a0, b0]), qs).sum(axis=1)
    s1 = audit.llr(np.column_stack([a1, b1]), qs).sum(axis=1)
    res = audit.audit_scores(s0, s1)
    assert 0.5 < res["epsilon_lb"] <= 1.0, res
    one = audit.audit_scores(audit.llr(a0[:, None], qs[:1])[:, 0], audit.llr(a1[:, None], qs[:1])[:, 0])
    assert one["epsilon_lb"] <= 0.5, one
