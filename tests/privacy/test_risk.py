"""Re-identification risk figures (stream_anon.risk) against hand-computed tables, the population-uniqueness
models against ARX's published figures on its Adult table, and the SNB equations against sums over the model."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from stream_anon.risk import RiskSettings, journalist_class_risk, pitman, population_uniqueness, release_risk, snb, \
    zayatz
from stream_anon.risk.population import shlosser

GOLDEN = Path(__file__).parents[1] / "golden" / "arx_adult_class_sizes.json"
ADULT_ROWS = 30162


# ------------------------------------------------------------------------------------------------ prosecutor
def test_prosecutor_figures_of_a_hand_built_release():
    """Classes of 2, 3, 5, 10 individuals (n = 20, J = 4): highest 1/2, average J/n = 0.2, at risk above 0.25:
    the 2 + 3 individuals of the classes of 2 and 3 (risks 0.5 and 0.333), 5/20."""
    r = release_risk([2, 3, 5, 10], RiskSettings(threshold=0.25))
    assert r["classes"] == 4 and r["individuals"] == 20
    assert r["prosecutor"] == {"highest": 0.5, "average": 0.2, "records_at_risk": 0.25}
    assert r["marketer"] == 0.2 and "journalist" not in r


def test_average_is_the_mean_of_the_individuals_risks():
    """ARX's success rate: sum over individuals of 1/f_j over n equals J/n."""
    sizes = [10, 10, 11, 17, 23, 40]
    r = release_risk(sizes)
    by_individual = sum(f * (1 / f) for f in sizes) / sum(sizes)
    assert r["prosecutor"]["average"] == round(by_individual, 6) == round(6 / 111, 6)
    assert r["prosecutor"]["highest"] == 0.1
    assert r["prosecutor"]["records_at_risk"] == 0.0           # 1/10 is not above 0.1


def test_threshold_is_strict_and_a_class_of_five_is_at_risk():
    r = release_risk([5, 10, 10, 25], RiskSettings(threshold=0.1))
    assert r["prosecutor"]["highest"] == 0.2
    assert r["prosecutor"]["records_at_risk"] == round(5 / 50, 6)


def test_no_individuals_no_figures():
    assert release_risk([]) is None and release_risk([0, 0]) is None


@pytest.mark.parametrize("bad", [dict(population=10, sampling_fraction=0.5), dict(population=0),
                                 dict(sampling_fraction=0.0), dict(sampling_fraction=1.5), dict(threshold=2.0)])
def test_settings_refused(bad):
    with pytest.raises(ValueError):
        RiskSettings(**bad)


# ------------------------------------------------------------------------------------------------ journalist
def _series(f: int, pi: float, terms: int = 200_000) -> float:
    """E[1/F | f] summed term by term: F = f + X, X ~ NB(f, pi): P(F = h) = C(h-1, f-1) pi**f (1-pi)**(h-f)."""
    from scipy.special import gammaln
    h = np.arange(f, f + terms, dtype=float)
    logp = gammaln(h) - gammaln(f) - gammaln(h - f + 1) + f * math.log(pi) + (h - f) * math.log1p(-pi)
    return float(np.sum(np.exp(logp) / h))


@pytest.mark.parametrize("f", [1, 2, 3, 10, 50, 63, 64, 100, 300])
@pytest.mark.parametrize("pi", [0.001, 0.05, 0.5, 0.9])
def test_journalist_class_risk_equals_the_series(f, pi):
    assert journalist_class_risk(f, pi) == pytest.approx(_series(f, pi, 400_000 if pi < 0.01 else 20_000),
                                                         rel=1e-7)


@pytest.mark.parametrize("f", [1, 2, 5, 40, 63, 64, 100, 1000])
def test_journalist_class_risk_at_a_tiny_sampling_fraction(f):
    """pi = 1e-8: f = 1 has the closed form; f >= 2 tends to pi / (f - 1) (Gauss's 2F1(1, 1; f + 1; 1) =
    f / (f - 1))."""
    pi = 1e-8
    expected = -pi * math.log(pi) / (1 - pi) if f == 1 else pi / (f - 1)
    assert journalist_class_risk(f, pi) == pytest.approx(expected, rel=1e-5)


def test_journalist_class_risk_hand_values():
    # f = 1: -pi ln(pi) / (1 - pi); pi = 0.1 -> 0.1 * 2.302585 / 0.9 = 0.255843
    assert journalist_class_risk(1, 0.1) == pytest.approx(0.1 * math.log(10) / 0.9, rel=1e-12)
    # f = 2, pi = 1/2: sum_h (h-1) / (h 2**h) over h >= 2 = 1 - ln 2 = 0.306853
    assert journalist_class_risk(2, 0.5) == pytest.approx(1 - math.log(2), rel=1e-12)
    assert journalist_class_risk(7, 1.0) == 1 / 7


def test_journalist_figures_of_a_release_against_a_population():
    """Classes 2 and 2 (n = 4) from a population of 8 (pi = 1/2): each class risk 1 - ln 2 = 0.306853; the
    marketer figure is their average; no sample unique, so no population unique."""
    r = release_risk([2, 2], RiskSettings(population=8, threshold=0.3))
    j = r["journalist"]
    assert j["population"] == 8 and j["sampling_fraction"] == 0.5
    assert j["highest"] == j["average"] == round(1 - math.log(2), 6) == r["marketer"]
    assert j["records_at_risk"] == 1.0
    assert j["population_uniqueness"]["share"] == 0.0 and j["population_uniqueness"]["model"] == "none"
    assert r["prosecutor"]["highest"] == 0.5 > j["highest"]


def test_sampling_fraction_declares_the_population():
    a = release_risk([3, 4, 5], RiskSettings(sampling_fraction=0.25))
    b = release_risk([3, 4, 5], RiskSettings(population=48))
    assert a["journalist"] == b["journalist"]


# ------------------------------------------------------------------------------------------------ population models
def _adult() -> dict[int, int]:
    return {int(k): v for k, v in json.loads(GOLDEN.read_text()).items()}


def test_golden_histogram_is_arx_adult():
    """The class-size histogram of ARX's adult.csv over its nine hierarchy attributes (the QIs of ARX's
    TestRiskMetrics): n = 30,162 and the sample uniqueness ARX asserts (0.5142895033485844). Recomputed from the
    full table when it is present (STREAM_ANON_SHARED_DATA)."""
    h = _adult()
    assert sum(s * c for s, c in h.items()) == ADULT_ROWS
    assert h[1] / ADULT_ROWS == 0.5142895033485844
    from stream_anon.datasets import adult
    if not adult.FULL_PATH.exists():
        pytest.skip("full Adult table not present")
    import pandas as pd
    df = pd.read_csv(adult.FULL_PATH, sep=";", dtype=str)
    counts = df.groupby(list(df.columns)).size().value_counts()
    assert {int(k): int(v) for k, v in counts.items()} == h


def _four_digits(x: float) -> int:
    """ARX's comparison: truncated to four decimals (TestRiskMetrics.compareUniqueness)."""
    return int(x * 10000)


@pytest.mark.parametrize("fraction, model, arx", [
    (0.1, pitman, 0.27684993883653597),     # ARX TestRiskMetrics.testDecisionRule2, Dankar -> Pitman
    (0.1, zayatz, 0.3207402393466189),      # ... the Zayatz branch of the same assertion
    (0.2, zayatz, 0.3577099234829125),      # f = 0.2: ARX's rule falls back to Zayatz (no SNB root)
    (0.01, pitman, 0.1446083531167384),     # f = 0.01, Dankar -> Pitman
    (1.0, zayatz, 0.5142895033485844),      # f = 1: the sample uniques
])
def test_models_reproduce_arx_adult_figures(fraction, model, arx):
    population = ADULT_ROWS / fraction
    share = model(_adult(), population) / population
    assert _four_digits(share) == _four_digits(arx)
    assert share == pytest.approx(arx, rel=1e-9)        # closer than ARX's rounding: the same equations


@pytest.mark.parametrize("fraction, arx", [(0.1, 0.27684993883653597), (0.01, 0.1446083531167384),
                                           (1.0, 0.5142895033485844)])
def test_dankar_rule_reproduces_arx(fraction, arx):
    pu = population_uniqueness(_adult(), ADULT_ROWS / fraction)
    assert _four_digits(pu.share) == _four_digits(arx)
    assert pu.model == ("pitman" if fraction <= 0.1 else "zayatz")


def test_dankar_rule_above_a_tenth_takes_the_smaller_of_zayatz_and_snb():
    """At f = 0.2 the SNB equations (checked below against the model) have a root on Adult; its estimate is below
    Zayatz's (ARX's 0.3577), so the rule takes it."""
    population = ADULT_ROWS / 0.2
    pu = population_uniqueness(_adult(), population)
    assert pu.snb is not None and pu.zayatz is not None
    assert pu.model == "snb" and pu.uniques == pu.snb < pu.zayatz
    assert 0 < pu.share < _adult()[1] / ADULT_ROWS


def test_no_sample_unique_no_population_unique():
    """ARX: after 2-anonymization the population uniqueness is 0 (testDecisionRule)."""
    pu = population_uniqueness({2: 10, 3: 4}, 1000)
    assert pu.share == 0 and pu.model == "none"


def test_snb_equations_are_the_model():
    """The expected numbers of sample classes of size 1 and 2 that snb() solves for, against sums over the
    shifted negative binomial population sizes thinned by Bernoulli sampling."""
    from scipy.stats import binom, nbinom
    a, b, f = 0.4, 0.25, 0.15
    x = np.arange(0, 20000)
    px = nbinom.pmf(x, a, b)
    size = 1 + x
    p1, p2 = float(np.sum(px * binom.pmf(1, size, f))), float(np.sum(px * binom.pmf(2, size, f)))
    d = (1 - f) * (1 - b)
    assert p1 == pytest.approx(f * (b / (1 - d)) ** a * (1 + a * d / (1 - d)), rel=1e-10)
    assert p2 == pytest.approx(a * b ** a * f * f * (1 - b) * (2 - (1 - a) * d) / (2 * (1 - d) ** (a + 2)), rel=1e-10)


def test_snb_recovers_a_population_drawn_from_its_model():
    """A large population of K classes of sizes 1 + NB(alpha, beta), sampled at f: SNB's estimate of the
    population uniques is within 15% of the true number (the sampling's noise)."""
    rng = np.random.default_rng(3)
    k, a, b, f = 200_000, 0.6, 0.3, 0.3
    sizes = 1 + rng.negative_binomial(a, b, size=k)
    sample = rng.binomial(sizes, f)
    hist = dict(zip(*np.unique(sample[sample > 0], return_counts=True)))
    truth = int((sizes == 1).sum())
    est = snb({int(s): int(c) for s, c in hist.items()}, float(sizes.sum()))
    assert est == pytest.approx(truth, rel=0.15)


def test_shlosser_hand_computed():
    """Two classes of 1 and one of 2 at q = 1/2: d = 3, f1 = 2;
    a = 2*(1/4)*(3/4)**0 + 1*2*(1/4)*(3/4)... written out: sum_i i q^2 (1-q^2)^(i-1) f_i = 1*0.25*1*2 + 2*0.25*0.75*1
    = 0.875; b = sum (1-q)^i ((1+q)^i - 1) f_i = 0.5*0.5*2 + 0.25*1.25*1 = 0.8125;
    num = sum (1-q)^i f_i = 1 + 0.25 = 1.25; den = sum i q (1-q)^(i-1) f_i = 1 + 0.5 = 1.5."""
    expected = 3 + 2 * (0.875 / 0.8125) * (1.25 / 1.5) ** 2
    assert shlosser({1: 2, 2: 1}, 0.5) == pytest.approx(expected, rel=1e-12)


def test_population_smaller_than_the_sample_refused():
    with pytest.raises(ValueError):
        population_uniqueness({1: 5}, 3)
