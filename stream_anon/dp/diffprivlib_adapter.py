"""diffprivlib's mechanisms as the DP release path uses them: every access to diffprivlib's internals is here.

The noise of every release comes from a diffprivlib mechanism (:func:`make_mechanism`): ``Geometric`` (Ghosh,
Roughgarden & Sundararajan, *Universally Utility-Maximizing Privacy Mechanisms*, STOC 2009) for integers,
``Snapping`` (Mironov, *On Significance of the Least Significant Bits for Differential Privacy*, CCS 2012) for real
values, ``Laplace`` (Dwork, McSherry, Nissim & Smith, TCC 2006) for reference and tests only. A window releases
hundreds to thousands of cells at once, and ``randomise`` draws one value per call; so two samplers are written
here that draw a whole array from the mechanism's own parts, and one formula mirrors a computation diffprivlib
does not expose:

* :func:`geometric_noise`: ``Geometric.randomise``'s inverse-CDF formula on an array of uniforms, with the
  mechanism's private ``_scale``; the same uniforms in the same order and the same floating-point operations, so
  the same values as the loop over ``randomise`` (checked value by value by the pin test);
* :func:`draw_noise`: for ``Laplace``, the private static ``_laplace_sampler`` (Holohan & Braghin 2021) on arrays of
  uniforms from the mechanism's private generator ``_rng`` (the same distribution as ``randomise``, other draws);
* :func:`snapping_grid`: the output grid ``Lambda`` of ``Snapping.randomise`` (Mironov 2012, section 5.2), which
  diffprivlib computes inside ``randomise`` from its effective epsilon.

These were written for diffprivlib :data:`DIFFPRIVLIB_VERSION`. ``tests/dp/test_diffprivlib_adapter.py`` fails on any
other version and checks that every private used here still exists and behaves as assumed: upgrade diffprivlib
only together with this module and that test.

>>> a = geometric_noise(np.random.RandomState(5), 0.3, 2, 6)
>>> m = Geometric(epsilon=0.3, sensitivity=2, random_state=np.random.RandomState(5))
>>> a.tolist() == [float(m.randomise(0)) for _ in range(6)]
True
"""
from __future__ import annotations

import functools
import math

import numpy as np
from diffprivlib.mechanisms import Geometric, Laplace, Snapping
from diffprivlib.mechanisms.base import DPMechanism

DIFFPRIVLIB_VERSION = "0.6.6"
SNAP_BOUND = 2.0 ** 30     # Snapping's clamp, in units of the sensitivity: far above any count or sum released


def make_mechanism(noise: str, epsilon: float, sensitivity: float, random_state=None) -> DPMechanism:
    """A diffprivlib mechanism: ``Geometric`` for integers (counts, and sums in units of their resolution),
    ``Snapping`` for real values, ``Laplace`` for reference and tests only: sampled on doubles, its output's
    low-order bits reveal the input (Mironov's attack), so no release path uses it. Geometric noise is unbiased
    and symmetric, so sums of node noises in a tree stay unbiased; Snapping clamps at ``+-SNAP_BOUND *
    sensitivity`` (never reached)."""
    if noise == "snapping":
        bound = SNAP_BOUND * float(sensitivity)
        return Snapping(epsilon=float(epsilon), sensitivity=float(sensitivity), lower=-bound, upper=bound,
                        random_state=random_state)
    if noise == "geometric":
        if float(sensitivity) != int(sensitivity):
            raise ValueError(f"geometric noise needs an integer sensitivity, got {sensitivity}")
        return Geometric(epsilon=float(epsilon), sensitivity=int(sensitivity), random_state=random_state)
    if noise == "laplace":
        return Laplace(epsilon=float(epsilon), sensitivity=float(sensitivity), random_state=random_state)
    raise ValueError(f"noise: expected 'geometric' or 'laplace', got {noise!r}")


@functools.lru_cache(maxsize=1024)
def geometric_scale(epsilon: float, sensitivity: int) -> float:
    """diffprivlib's private ``Geometric._scale`` (``-epsilon / sensitivity`` after its checks of both)."""
    return Geometric(epsilon=epsilon, sensitivity=sensitivity)._scale


def geometric_noise(random_state: np.random.RandomState, epsilon: float, sensitivity: int, n: int) -> np.ndarray:
    """``n`` draws of ``Geometric(epsilon, sensitivity, random_state).randomise(0)`` in one pass: the inverse CDF
    ``sgn * floor(log(sgn * u) / scale)`` with ``u = (U - 1/2)(1 + e^scale)``, as ``randomise`` computes it, on
    ``n`` uniforms ``U`` drawn at once from ``random_state`` (the stream ``n`` calls of ``randomise`` read)."""
    scale = geometric_scale(float(epsilon), int(sensitivity))
    u = random_state.random_sample(n) - 0.5
    u *= 1 + np.exp(scale)
    sgn = np.where(u < 0, -1.0, 1.0)
    with np.errstate(divide="ignore"):
        out = np.round(sgn * np.floor(np.log(sgn * u) / scale))
    if not np.isfinite(out).all():       # U == 1/2 exactly: randomise's int() of an infinity raises
        raise OverflowError("cannot convert float infinity to integer")
    return out + 0.0                      # -0.0 -> 0.0, as int() then float() gives


def draw_noise(mech: DPMechanism, n: int) -> np.ndarray:
    """``n`` independent noise values of ``mech`` (its ``randomise(0)``), in bulk for a seeded ``Geometric`` (the
    same values, :func:`geometric_noise`) and a seeded pure ``Laplace`` (``_laplace_sampler`` on uniforms from the
    mechanism's generator: the same distribution); any other mechanism is called value by value."""
    rng = mech._rng
    if type(mech) is Geometric and isinstance(rng, np.random.RandomState):
        return geometric_noise(rng, mech.epsilon, mech.sensitivity, n)
    if type(mech) is Laplace and isinstance(rng, np.random.RandomState) and mech.delta == 0:
        u = rng.random_sample((4, n))
        scale = mech.sensitivity / mech.epsilon
        return -scale * Laplace._laplace_sampler(u[0], u[1], u[2], u[3])
    return np.fromiter((mech.randomise(0) for _ in range(n)), dtype=float, count=n)


def snapping_grid(epsilon: float, sensitivity: float) -> float:
    """Snapping's output grid ``Lambda``: the smallest power of two >= ``1/epsilon'``, in units of the
    sensitivity (Mironov 2012, section 5.2), where ``epsilon'`` is diffprivlib's effective epsilon for the bounds
    of :func:`make_mechanism` (slightly below ``epsilon``, so an epsilon whose inverse is a power of two gets twice
    that grid)."""
    eta = np.finfo(float).epsneg
    eff = (float(epsilon) - 2 * eta) / (1 + 12 * SNAP_BOUND * eta)
    return 2.0 ** math.ceil(math.log2(1.0 / eff)) * float(sensitivity)
