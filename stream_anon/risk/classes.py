"""Re-identification risk of one release from its class sizes, counted in distinct individuals as k is.

A release publishes records in J classes; class j holds f_j distinct individuals over every release it appears in
(a class reused from an earlier release counts its earlier members too: they share its published box). The
release's **own individuals** are the n distinct individuals it publishes records of; individual i's class size
f_i is that of the class holding its records (the smallest, when its records lie in several classes of the
release: an attacker links it through the class that narrows it most). Three attacker models (El Emam & Dankar,
"Protecting privacy using k-anonymity", JAMIA 15(5), 2008; ARX's risk analysis):

**Prosecutor** (the attacker knows the target is in the release and which class matches its quasi-identifiers):
the target is one of f_i individuals, risk 1/f_i.

- ``highest``: 1 / min f_j;
- ``average``: the expected share of the release's own individuals re-identified by an attacker who links every
  one of them, (1/n) sum_i 1/f_i. Without reuse and with every individual in one class it is J / n, ARX's
  "success rate";
- ``records_at_risk``: the share of the release's own individuals whose risk 1/f_i is above ``threshold``.

**Journalist** (the attacker does not know whether the target is in the release; a population of N individuals
is declared, sampling fraction pi = m / N, m = sum_j f_j the individuals the release's classes hold): the risk of
an individual in a class of f is E[1/F | f], F the class's size in the population, under the negative binomial
posterior F - f ~ NB(f, pi) of a uniform prior and Bernoulli sampling (Benedetti & Franconi 1998; the "individual
risk" of mu-ARGUS and sdcMicro): ``E[1/F | f] = pi**f / f * 2F1(f, f; f + 1; 1 - pi)``, ``-pi ln(pi) / (1 - pi)``
for f = 1, 1/f at pi = 1. ``highest``, ``average`` and ``records_at_risk`` over the own individuals as for the
prosecutor, and the share of the population that is unique on the release's classes (:mod:`.population`, Dankar
et al.'s rule).

**Marketer** (the attacker links every record against an identification database and is content with the share
re-identified): without a declared population the database holds the release's individuals and the figure is
the prosecutor's ``average`` (ARX's sample-based marketer risk); with one, the journalist ``average`` (El Emam &
Dankar's marketer risk against the population).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .population import population_uniqueness

DIGITS = 6                      # figures are rounded to this many decimals where published
HYP2F1_MAX_CLASS = 64           # E[1/F | f]: scipy's 2F1 below this class size, the series from it on
SERIES_TERMS = 400
DEFAULT_THRESHOLD = 0.1         # [risk] threshold: a class of fewer than 10 individuals is "at risk"


@dataclass(frozen=True)
class RiskSettings:
    """What a stream declares in its ``[risk]`` table: the population the releases are drawn from (``population``
    individuals, or the ``sampling_fraction`` of each release; neither: no journalist figures) and the risk above
    which an individual counts as at risk."""

    population: int | None = None
    sampling_fraction: float | None = None
    threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if self.population is not None and self.sampling_fraction is not None:
            raise ValueError("risk: give population or sampling_fraction, not both")
        if self.population is not None and self.population < 1:
            raise ValueError(f"risk.population: at least 1, got {self.population}")
        if self.sampling_fraction is not None and not 0 < self.sampling_fraction <= 1:
            raise ValueError(f"risk.sampling_fraction: in (0, 1], got {self.sampling_fraction}")
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"risk.threshold: in [0, 1], got {self.threshold}")

    def population_of(self, n: int) -> float | None:
        """The population a release of n individuals is drawn from (at least n), None when none is declared."""
        if self.population is not None:
            return float(max(self.population, n))
        if self.sampling_fraction is not None:
            return n / self.sampling_fraction
        return None


def journalist_class_risk(f: int, pi: float) -> float:
    """E[1/F | f] for a class of f sampled individuals at sampling fraction pi (module docstring).

    >>> round(journalist_class_risk(1, 0.5), 6), round(-0.5 * math.log(0.5) / 0.5, 6)
    (0.693147, 0.693147)
    >>> journalist_class_risk(4, 1.0)
    0.25
    """
    if f < 1:
        raise ValueError(f"class size {f}: at least 1")
    if pi >= 1:
        return 1.0 / f
    if f == 1:
        return -pi * math.log(pi) / (1 - pi)
    # Euler's transformation: pi**f / f * 2F1(f, f; f + 1; z) = pi / f * 2F1(1, 1; f + 1; z), z = 1 - pi, whose
    # series sum_k k! / (f + 1)_k z**k has positive terms. Summing it needs ~40 / pi terms for a small class, so
    # there scipy's 2F1 (exact to ~1e-12 against the series for f < 100 at pi from 1e-12 to 1, in microseconds);
    # from f = 64 on the k-th term is below 1 / C(f + k, k) at any pi (< 1e-17 by k = 20), and the series of
    # SERIES_TERMS terms is exact where scipy's 2F1 returns NaN (f >= 100 at a small pi)
    z = 1.0 - pi
    if f < HYP2F1_MAX_CLASS:
        from scipy.special import hyp2f1
        value = pi / f * float(hyp2f1(1.0, 1.0, f + 1.0, z))
    else:
        k = np.arange(SERIES_TERMS - 1, dtype=float)
        value = pi / f * float(np.sum(np.cumprod(np.concatenate(([1.0], (k + 1) * z / (f + 1 + k))))))
    return min(value, 1.0 / f)


def _summary(individuals: Counter, risk_of, threshold: float, n: int) -> dict:
    """``individuals``: class size -> individuals of that size (n in all)."""
    risks = {f: risk_of(f) for f in individuals}
    return {"highest": round(max(risks.values()), DIGITS),
            "average": round(sum(c * risks[f] for f, c in individuals.items()) / n, DIGITS),
            "records_at_risk": round(sum(c for f, c in individuals.items() if risks[f] > threshold) / n, DIGITS)}


def release_risk(class_sizes: Iterable[int], settings: RiskSettings = RiskSettings(),
                 individual_sizes: Iterable[int] | None = None) -> dict | None:
    """The risk figures of a release whose classes hold ``class_sizes`` distinct individuals over their releases
    (classes of 0 are left out); ``individual_sizes``: one entry per distinct individual the release itself
    publishes, the size of its (smallest) class, default: each class of f gives f individuals of size f (every
    class new, every individual in one class). ``individuals``: the release's own individuals;
    ``individuals_in_classes``: those its classes hold over their releases. None for a release without
    individuals.

    >>> r = release_risk([2, 3, 5])
    >>> r["prosecutor"], r["marketer"]
    ({'highest': 0.5, 'average': 0.3, 'records_at_risk': 1.0}, 0.3)
    >>> release_risk([3, 2], individual_sizes=[3, 2, 2])["prosecutor"]["average"]      # a reused class of 3, 1 new
    0.444444
    """
    sizes = Counter(int(f) for f in class_sizes if int(f) > 0)
    held = sum(f * c for f, c in sizes.items())
    if individual_sizes is None:
        own = Counter({f: f * c for f, c in sizes.items()})
    else:
        own = Counter(int(f) for f in individual_sizes if int(f) > 0)
    n = sum(own.values())
    if not n or not held:
        return None
    t = settings.threshold
    prosecutor = _summary(own, lambda f: 1.0 / f, t, n)
    out = {"classes": sum(sizes.values()), "individuals": n, "individuals_in_classes": held, "threshold": t,
           "prosecutor": prosecutor, "marketer": prosecutor["average"]}
    population = settings.population_of(held)
    if population is not None:
        pi = held / population
        journalist = _summary(own, lambda f: journalist_class_risk(f, pi), t, n)
        journalist["population"] = int(round(population))
        journalist["sampling_fraction"] = round(pi, DIGITS)
        journalist["population_uniqueness"] = population_uniqueness(sizes, population).as_dict(DIGITS)
        out["journalist"] = journalist
        out["marketer"] = journalist["average"]
    return out
