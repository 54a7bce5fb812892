"""Population uniqueness from a sample's class sizes: the Pitman, Zayatz and SNB models and Dankar et al.'s rule
for choosing between them (Dankar, El Emam, Neisa & Roffey, "Estimating the re-identification risk of clinical
data sets", BMC Medical Informatics and Decision Making 12:66, 2012), the rule ARX applies
(``RiskModelPopulationUniqueness``).

Input: the histogram of the sample's equivalence class sizes (size -> number of classes), the sample size n (the
individuals counted in the classes) and the population size N (sampling fraction f = n / N). Output: the estimated
number of population uniques (individuals alone in their class in the whole population); as a share, divided by
N (ARX's ``getFractionOfUniqueTuples``).

- **Pitman** (Hoshino, "Applying Pitman's sampling formula to microdata disclosure risk assessment", J. Official
  Statistics 17(4), 2001): the class sizes follow Pitman's sampling formula with parameters theta and alpha,
  estimated by maximum likelihood (two equations, solved by Newton's method from Hoshino's moment estimates);
  population uniques = Gamma(theta + 1) / Gamma(theta + alpha) * N ** alpha.
- **Zayatz** ("Estimation of the percent of unique population elements on a microdata file using the sample",
  US Census Bureau SRD report 91/08, 1991): the probability that a sample unique is a population unique is
  ``(c1/u) P(1 | N, 1, n) / sum_j (c_j/u) P(1 | N, j, n)`` with P(1 | N, j, n) the hypergeometric probability of
  drawing exactly one member of a class of j in a sample of n out of N; population uniques = c1 * that / f.
- **SNB** (Chen & Keller-McNulty, "Estimation of identification disclosure risk in microdata", J. Official
  Statistics 14(1), 1998): the K population class sizes are 1 + a negative binomial (alpha, beta); with Bernoulli
  sampling of fraction f the expected numbers of sample classes of size 1 and 2 are
  ``K f (beta/(1-d))**alpha (1 + alpha d/(1-d))`` and
  ``K alpha beta**alpha f**2 (1-beta) (2 - (1-alpha) d) / (2 (1-d)**(alpha+2))``, d = (1-f)(1-beta); alpha and
  beta solve these equal to c1 and c2; K is Shlosser's estimate of the number of non-empty population classes
  (the form D_Sh3 of Haas, Naughton, Seshadri & Stokes, VLDB 1995); population uniques = K beta**alpha.
- **Dankar's rule**: no sample unique -> 0; f <= 0.1 -> Pitman (Zayatz when Pitman has no valid estimate);
  f > 0.1 -> the smaller of Zayatz and SNB (Zayatz when SNB has no valid estimate). An estimate is valid when it
  is a finite positive number of at most N uniques.

The SNB equations here are the model's own (tests/privacy/test_risk.py checks both against sums over the model's
distribution). ARX 3.x multiplies the second by ``(1-d)**(alpha+2)`` instead of dividing and adds ``-1`` per
histogram entry inside a sum of Shlosser's estimator; on ARX's Adult table its solver then finds no SNB root and
its rule falls back to Zayatz for f > 0.1, where this module may choose SNB. Pitman and Zayatz reproduce ARX's
published figures on that table (tests/privacy/test_risk.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

PITMAN, ZAYATZ, SNB, NONE = "pitman", "zayatz", "snb", "none"
DANKAR_SAMPLING_FRACTION = 0.1      # at or below: Pitman; above: min(Zayatz, SNB)
ACCURACY = 1e-9                     # Newton's method stops when both equations are within this (relative)
MAX_ITERATIONS = 200


@dataclass(frozen=True)
class PopulationUniqueness:
    """Estimated population uniques (numbers of individuals, None: no valid estimate) by each model, the model
    Dankar's rule chose and its estimate, and the population size they are counted in."""

    population: float
    pitman: float | None
    zayatz: float | None
    snb: float | None
    model: str
    uniques: float

    @property
    def share(self) -> float:
        """Share of the population that is unique (ARX's fraction of unique tuples)."""
        return self.uniques / self.population if self.population else 0.0

    def as_dict(self, digits: int = 6) -> dict:
        def r(x):
            return None if x is None else round(x / self.population, digits)
        return {"model": self.model, "share": round(self.share, digits), "pitman": r(self.pitman),
                "zayatz": r(self.zayatz), "snb": r(self.snb)}


def _histogram(sizes: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray]:
    items = sorted((int(s), int(c)) for s, c in sizes.items() if int(c) > 0 and int(s) > 0)
    return (np.array([s for s, _ in items], dtype=float), np.array([c for _, c in items], dtype=float))


def _valid(x: float | None, population: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) and 0 < x <= population else None


def _newton(fun: Callable[[np.ndarray], np.ndarray], start, inside: Callable[[np.ndarray], bool]) -> np.ndarray | None:
    """A root of the 2-equation system ``fun`` near ``start``: Newton's method with a central-difference Jacobian,
    each step halved until the point stays ``inside`` the parameters' domain. None when it does not converge."""
    x = np.asarray(start, dtype=float)
    if not inside(x):
        return None
    for _ in range(MAX_ITERATIONS):
        fx = fun(x)
        if not np.all(np.isfinite(fx)):
            return None
        if np.max(np.abs(fx)) < ACCURACY:
            return x
        jac = np.empty((2, 2))
        for j in range(2):
            h = 1e-6 * max(1.0, abs(x[j]))
            e = np.zeros(2)
            e[j] = h
            lo, hi = x - e, x + e
            if not inside(lo):
                lo = x
            if not inside(hi):
                hi = x
            jac[:, j] = (fun(hi) - fun(lo)) / (hi[j] - lo[j])
        try:
            step = np.linalg.solve(jac, -fx)
        except np.linalg.LinAlgError:
            return None
        if not np.all(np.isfinite(step)):
            return None
        for _ in range(60):
            if inside(x + step):
                break
            step = step / 2
        else:
            return None
        x = x + step
    return None


def pitman(sizes: Mapping[int, int], population: float) -> float | None:
    """Population uniques by Pitman's sampling formula (Hoshino 2001), None without a valid estimate."""
    from scipy.special import digamma, gammaln

    s, c = _histogram(sizes)
    n, u = float((s * c).sum()), float(c.sum())
    c1 = float(c[s == 1].sum())
    c2 = float(c[s == 2].sum()) or 1.0          # no class of 2: Hoshino's start with c2 = 1 (overestimates)
    if c1 == 0 or u < 2:
        return None
    # Hoshino's moment estimates as the starting point
    cc = c1 * (c1 - 1) / c2
    den = 2 * c1 * u + c1 * cc - n * cc
    if den == 0:
        return None
    theta = (n * u * cc - c1 * (n - 1) * (2 * u + cc)) / den
    alpha = (theta * (c1 - n) + (n - 1) * c1) / (n * u)
    big, counts = s[s != 1], c[s != 1]

    def equations(x: np.ndarray) -> np.ndarray:
        t, a = x
        o1 = (digamma(t / a + u) - digamma(t / a + 1)) / a          # sum_{i<u} 1/(t + i a)
        o2 = digamma(n + t) - digamma(t + 1)                          # sum_{i<n} 1/(t + i)
        o3 = (u - 1) / a - t / a * o1                                 # sum_{i<u} i/(t + i a)
        o4 = float(np.sum(counts * (digamma(big - a) - digamma(1 - a))))   # sum_j c_j sum_{k<j} 1/(k - a)
        return np.array([(o1 - o2) / max(abs(o2), 1e-300), (o3 - o4) / max(abs(o4), abs(o3), 1e-300)])

    root = _newton(equations, (theta, alpha), lambda x: x[0] >= 0 and 0 < x[1] < 1)
    if root is None:
        return None
    t, a = root
    return _valid(math.exp(gammaln(t + 1) - gammaln(t + a) + a * math.log(population)), population)


def zayatz(sizes: Mapping[int, int], population: float) -> float | None:
    """Population uniques by Zayatz's model (1991), None without a valid estimate."""
    from scipy.stats import hypergeom

    s, c = _histogram(sizes)
    n, u = int((s * c).sum()), float(c.sum())
    c1 = float(c[s == 1].sum())
    if c1 == 0:
        return None
    big_n = int(round(population))
    one = float(hypergeom.pmf(1, big_n, s.astype(int), n) @ (c / u))
    if one <= 0:
        return None
    p_unique = (c1 / u) * float(hypergeom.pmf(1, big_n, 1, n)) / one
    return _valid(c1 * p_unique / (n / population), population)


def shlosser(sizes: Mapping[int, int], f: float) -> float | None:
    """Shlosser's estimate (form D_Sh3 of Haas et al. 1995) of the number of non-empty population classes."""
    s, c = _histogram(sizes)
    c1 = float(c[s == 1].sum())
    q = f
    a = float(np.sum(s * q * q * (1 - q * q) ** (s - 1) * c))
    b = float(np.sum((1 - q) ** s * ((1 + q) ** s - 1) * c))
    num = float(np.sum((1 - q) ** s * c))
    den = float(np.sum(s * q * (1 - q) ** (s - 1) * c))
    if b == 0 or den == 0:
        return None
    return float(c.sum()) + c1 * (a / b) * (num / den) ** 2


def snb(sizes: Mapping[int, int], population: float) -> float | None:
    """Population uniques by the shifted negative binomial model (Chen & Keller-McNulty 1998), None without a
    valid estimate."""
    s, c = _histogram(sizes)
    n = float((s * c).sum())
    c1, c2 = float(c[s == 1].sum()), float(c[s == 2].sum())
    f = n / population
    if c1 == 0 or c2 == 0 or not 0 < f < 1:
        return None
    k = shlosser(sizes, f)
    if k is None or not math.isfinite(k) or k <= 0:
        return None

    def equations(x: np.ndarray) -> np.ndarray:
        a, b = x
        d = (1 - f) * (1 - b)
        e1 = k * f * (b / (1 - d)) ** a * (1 + a * d / (1 - d))
        e2 = k * a * b ** a * f * f * (1 - b) * (2 - (1 - a) * d) / (2 * (1 - d) ** (a + 2))
        return np.array([e1 / c1 - 1, e2 / c2 - 1])

    def inside(x: np.ndarray) -> bool:
        return x[0] > 0 and 0 < x[1] < 1

    for a0 in (0.05, 0.2, 0.5, 1.0, 2.0, 5.0):          # a fixed grid of starts: the estimate is deterministic
        for b0 in (0.01, 0.1, 0.3, 0.6, 0.9):
            root = _newton(equations, (a0, b0), inside)
            if root is not None:
                return _valid(k * root[1] ** root[0], population)
    return None


def population_uniqueness(sizes: Mapping[int, int], population: float) -> PopulationUniqueness:
    """Every model's estimate and Dankar et al.'s choice for a sample with class sizes ``sizes`` (size -> number
    of classes) drawn from ``population`` individuals."""
    s, c = _histogram(sizes)
    n = float((s * c).sum())
    if population < n:
        raise ValueError(f"population {population} is smaller than the sample ({n:g} individuals)")
    if not (s == 1).any():
        return PopulationUniqueness(population, 0.0, 0.0, 0.0, NONE, 0.0)
    p, z = pitman(sizes, population), zayatz(sizes, population)
    b = snb(sizes, population)
    f = n / population
    if f <= DANKAR_SAMPLING_FRACTION:
        model, value = (PITMAN, p) if p is not None else (ZAYATZ, z)
    elif b is not None and (z is None or b < z):
        model, value = SNB, b
    else:
        model, value = ZAYATZ, z
    return PopulationUniqueness(population, p, z, b, model if value is not None else NONE, value or 0.0)
