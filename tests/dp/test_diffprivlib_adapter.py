"""The diffprivlib version :mod:`stream_anon.dp.diffprivlib_adapter` was written for, and every private of
diffprivlib it uses: that it still exists and behaves as the adapter assumes. A failure here means: read the new
diffprivlib's mechanisms, adapt the adapter, then change ``DIFFPRIVLIB_VERSION``."""
from __future__ import annotations

import inspect

import diffprivlib
import numpy as np
import pytest
from diffprivlib.mechanisms import Geometric, Laplace, Snapping
from scipy import stats

from stream_anon.dp import diffprivlib_adapter as adapter

CASES = [(0.3, 2, 5), (1.0, 1, 11), (0.05, 7, 3), (2.5, 1, 0)]      # (epsilon, sensitivity, seed)


def test_diffprivlib_is_the_version_the_adapter_was_written_for():
    assert diffprivlib.__version__ == adapter.DIFFPRIVLIB_VERSION, (
        f"diffprivlib {diffprivlib.__version__} is installed, stream_anon/dp/diffprivlib_adapter.py was written for "
        f"{adapter.DIFFPRIVLIB_VERSION}: check the privates it uses (this file) and update DIFFPRIVLIB_VERSION")


def test_the_privates_used_exist():
    m = Geometric(epsilon=0.5, sensitivity=2, random_state=np.random.RandomState(0))
    assert isinstance(m._rng, np.random.RandomState), "a seeded mechanism's generator: Geometric._rng"
    assert m._scale == -0.25, "Geometric._scale: -epsilon / sensitivity"
    lap = Laplace(epsilon=0.5, sensitivity=1.0, random_state=np.random.RandomState(0))
    assert isinstance(lap._rng, np.random.RandomState), "Laplace._rng"
    assert isinstance(inspect.getattr_static(Laplace, "_laplace_sampler"), staticmethod), \
        "Laplace._laplace_sampler: a static function of four uniforms"
    snap = Snapping(epsilon=0.5, sensitivity=1.0, lower=-8.0, upper=8.0)
    assert callable(snap.effective_epsilon) and callable(Snapping._get_nearest_power_of_2)


@pytest.mark.parametrize("epsilon,sensitivity,seed", CASES)
def test_geometric_noise_is_randomise_value_for_value(epsilon, sensitivity, seed):
    """The bulk sampler reads the same uniforms in the same order and computes the same floating-point operations
    as ``Geometric.randomise``: the same values, one numpy call for the whole array."""
    n = 500
    got = adapter.geometric_noise(np.random.RandomState(seed), epsilon, sensitivity, n)
    m = Geometric(epsilon=epsilon, sensitivity=sensitivity, random_state=np.random.RandomState(seed))
    want = [float(m.randomise(0)) for _ in range(n)]
    assert got.tolist() == want
    assert not np.signbit(got[got == 0]).any(), "no negative zero (randomise gives int 0)"
    mech = adapter.make_mechanism("geometric", epsilon, sensitivity, np.random.RandomState(seed))
    assert adapter.draw_noise(mech, n).tolist() == want


def test_laplace_sampler_is_the_one_randomise_applies_to_four_uniforms():
    """``Laplace.randomise(v)`` is ``v - scale * _laplace_sampler(u1, u2, u3, u4)`` on four uniforms of its
    generator: the adapter applies the same function to arrays of uniforms."""
    for seed in range(20):
        rs = np.random.RandomState(seed)
        u = [rs.random() for _ in range(4)]
        m = Laplace(epsilon=0.7, sensitivity=2.0, random_state=np.random.RandomState(seed))
        assert m.randomise(3.0) == pytest.approx(3.0 - 2.0 / 0.7 * Laplace._laplace_sampler(*u), abs=1e-12)
    mech = adapter.make_mechanism("laplace", 0.7, 2.0, np.random.RandomState(1))
    draws = adapter.draw_noise(mech, 20000)
    assert stats.kstest(draws, stats.laplace(scale=2.0 / 0.7).cdf).pvalue > 0.01


@pytest.mark.parametrize("epsilon,sensitivity", [(0.5, 1.0), (0.25, 3.0), (0.3, 500.0), (1.0, 0.5)])
def test_snapping_grid_is_the_grid_of_randomise(epsilon, sensitivity):
    """``Lambda`` as diffprivlib computes it inside ``Snapping.randomise`` for the adapter's bounds, and every
    output on that grid (an epsilon whose inverse is a power of two gets twice that grid: the effective epsilon
    is slightly below it)."""
    mech = adapter.make_mechanism("snapping", epsilon, sensitivity, np.random.RandomState(4))
    lam = Snapping._get_nearest_power_of_2(1.0 / mech.effective_epsilon()) * sensitivity
    assert adapter.snapping_grid(epsilon, sensitivity) == lam
    out = np.array([mech.randomise(12.3) for _ in range(200)])
    assert np.allclose(out / lam, np.round(out / lam), atol=1e-9)
    inverse = 1 / epsilon
    if inverse.is_integer() and int(inverse) & (int(inverse) - 1) == 0:
        assert lam == 2 * sensitivity * inverse
