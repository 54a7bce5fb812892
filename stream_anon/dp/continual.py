"""Continual release of running totals under differential privacy, on diffprivlib's mechanisms.

Three counters with one API (``update(x, random_state) -> noisy running total``, ``running_variance(t)``, and the
checkpoint's ``state_core()`` / ``load_state()``), vectorized over the cells of an aggregate (one entry of ``x`` per
group key). The noise comes from diffprivlib's mechanisms (``Geometric`` for integer counts and sums, ``Snapping``
for real values), drawn in bulk by :mod:`stream_anon.dp.diffprivlib_adapter`: its geometric sampler is
diffprivlib's inverse-CDF formula written for arrays (the same values as ``randomise``, one numpy call per window
instead of one Python call per cell), and every use of diffprivlib's internals is there.

- :class:`PerWindowCounter`: each window's value gets fresh noise ``Lap(sensitivity/epsilon)``; the running total
  is the prefix sum of the noisy values (post-processing, free), with error growing like ``sqrt(t)``.
- :class:`BinaryTreeCounter`: the binary (tree) mechanism of Chan, Shi & Song, *Private and Continual Release of
  Statistics*, ACM TISSEC 2011, and Dwork, Naor, Pitassi & Rothblum, *Differential Privacy under Continual
  Observation*, STOC 2010. For a horizon of ``T`` windows, ``L = floor(log2 T) + 1``; every dyadic partial sum
  ("p-sum") gets noise of scale ``L * sensitivity / epsilon`` (epsilon/L per node); each window is in at most
  ``L`` nodes, so each window's data costs ``epsilon`` in total, and a prefix sum adds at most ``L`` nodes
  (``popcount(t)``): error ``O(log^1.5 T / epsilon)``. Past the horizon a new tree starts on top of the last
  noisy total.
- :class:`HybridCounter`: Chan et al.'s hybrid mechanism for an unknown horizon: a logarithmic mechanism at
  epsilon/2 releases the total at t = 1, 2, 4, 8, ... and a binary tree at epsilon/2 with horizon ``2^k`` counts
  inside the block ``(2^k, 2^(k+1))``.

:func:`choose_mechanism` compares the theoretical mean-squared error of the running totals over the configured
horizon and picks per-window noising for short horizons (below about 2^11 windows at equal epsilon).

>>> import numpy as np
>>> c = BinaryTreeCounter(n_cells=2, epsilon=1.0, sensitivity=1, noise="laplace", horizon=8)
>>> c.levels, c.node_scale
(4, 4.0)
>>> out = c.update(np.array([3, 0]), np.random.RandomState(0))
>>> out.shape, c.t, c.running_variance(c.t) == 32.0
((2,), 1, True)
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from stream_anon.dp.diffprivlib_adapter import draw_noise, geometric_noise, make_mechanism, snapping_grid

Z95 = 1.959963984540054


# -- noise of one draw ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)     # a pure function of its arguments, asked for at every release
def noise_variance(noise: str, epsilon: float, sensitivity: float) -> float:
    """Variance of one draw, from diffprivlib (``2 b^2`` for Laplace; the two-sided geometric's variance).
    Snapping (no variance in diffprivlib): Laplace's ``2 b^2`` plus ``Lambda^2 / 12`` for the rounding to the
    grid (rounding error taken as uniform; checked by test_dp_noise)."""
    if noise == "snapping":
        b = float(sensitivity) / float(epsilon)
        return 2 * b * b + snapping_grid(epsilon, sensitivity) ** 2 / 12
    return float(make_mechanism(noise, epsilon, sensitivity, random_state=0).variance(0))


def noise_ci95_half_width(noise: str, epsilon: float, sensitivity: float) -> float:
    """Exact half-width ``h`` with ``P(|noise| <= h) >= 0.95`` for one draw.

    Laplace(b): ``P(|X| > h) = exp(-h/b)``, so ``h = b ln 20``. Two-sided geometric with ``p = exp(-eps/sens)``:
    ``P(|X| > k) = 2 p^(k+1) / (1 + p)``; the smallest such integer ``k``.
    """
    if noise == "laplace":
        return float(sensitivity) / float(epsilon) * math.log(20.0)
    if noise == "snapping":             # Laplace's band widened by half a grid step (the rounding)
        return float(sensitivity) / float(epsilon) * math.log(20.0) + snapping_grid(epsilon, sensitivity) / 2
    p = math.exp(-float(epsilon) / float(sensitivity))
    if p <= 0.0:
        return 0.0
    k = max(0, math.ceil(math.log(0.025 * (1 + p)) / math.log(p) - 1))
    while 2 * p ** (k + 1) / (1 + p) > 0.05:          # guard against rounding
        k += 1
    return float(k)


def sum_ci95_half_width(n_terms: int, noise: str, epsilon: float, sensitivity: float) -> float:
    """95% half-width of a sum of ``n_terms`` i.i.d. draws: exact for one draw, normal approximation
    (``1.96 * sqrt(n * var)``) for several (a sum of Laplaces is close to normal after a few terms; for few
    terms the normal band is slightly narrower than exact, which the output labels ``ci95_method``)."""
    if n_terms <= 0:
        return 0.0
    if n_terms == 1:
        return noise_ci95_half_width(noise, epsilon, sensitivity)
    return Z95 * math.sqrt(n_terms * noise_variance(noise, epsilon, sensitivity))


# -- counters -------------------------------------------------------------------------------------------------
class _Counter:
    name = ""

    def __init__(self, n_cells: int, epsilon: float, sensitivity: float, noise: str, resolution: float = 1.0):
        if isinstance(n_cells, bool) or not isinstance(n_cells, (int, np.integer)) or n_cells < 1:
            raise ValueError(f"n_cells: must be a positive integer, got {n_cells!r}")
        if not (isinstance(epsilon, (int, float)) and epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon: must be > 0, got {epsilon!r}")
        if not (isinstance(sensitivity, (int, float)) and sensitivity > 0):
            raise ValueError(f"sensitivity: must be > 0, got {sensitivity!r}")
        if noise not in ("geometric", "laplace", "snapping"):
            raise ValueError(f"noise: expected 'geometric', 'snapping' or 'laplace', got {noise!r}")
        if not (isinstance(resolution, (int, float)) and resolution > 0):
            raise ValueError(f"resolution: must be > 0, got {resolution!r}")
        steps = float(sensitivity) / float(resolution)
        if noise == "geometric" and abs(steps - round(steps)) > 1e-9:
            raise ValueError(f"sensitivity: geometric noise needs a whole number of resolution steps, got "
                             f"{sensitivity!r} / {resolution!r}")
        self.n_cells, self.epsilon, self.sensitivity, self.noise = int(n_cells), float(epsilon), sensitivity, noise
        self.resolution = float(resolution)
        self.t = 0

    def _noisy(self, values, epsilon: float, random_state) -> np.ndarray:
        """``values`` (one per cell) plus fresh noise of this counter's mechanism at ``epsilon``.

        geometric: integer noise on values in units of ``resolution`` (exact: integers below 2^53 are exact
        doubles); snapping: diffprivlib's ``Snapping.randomise`` on each value (it rounds the value and the noisy
        result to its grid, which is what defeats Mironov's attack, so it cannot be an added noise vector);
        laplace: reference only (not floating-point safe)."""
        values = np.asarray(values, dtype=float)
        if self.noise == "snapping":
            mech = make_mechanism("snapping", epsilon, self.sensitivity, random_state)
            return np.fromiter((mech.randomise(float(v)) for v in values), dtype=float, count=len(values))
        if self.noise == "geometric" and isinstance(random_state, np.random.RandomState):
            # the draws of make_mechanism("geometric", ...) + draw_noise, without a mechanism per window
            sens = self.sensitivity if self.resolution == 1.0 else round(float(self.sensitivity) / self.resolution)
            if float(sens) != int(sens):
                raise ValueError(f"geometric noise needs an integer sensitivity, got {sens}")
            noise = geometric_noise(random_state, epsilon, int(sens), len(values))
            if self.resolution != 1.0:
                return (np.round(values / self.resolution) + noise) * self.resolution
            return values + noise
        if self.noise == "geometric" and self.resolution != 1.0:
            mech = make_mechanism("geometric", epsilon, round(float(self.sensitivity) / self.resolution),
                                  random_state)
            steps = np.round(values / self.resolution)
            return (steps + draw_noise(mech, len(values))) * self.resolution
        return values + draw_noise(make_mechanism(self.noise, epsilon, self.sensitivity, random_state), len(values))

    def variance(self, epsilon: float) -> float:
        """Variance of one noise draw of this counter at ``epsilon`` (in the values' units)."""
        if self.noise == "geometric" and self.resolution != 1.0:
            return noise_variance("geometric", epsilon, round(float(self.sensitivity) / self.resolution)) \
                * self.resolution ** 2
        return noise_variance(self.noise, epsilon, self.sensitivity)

    # -- checkpoint: a part without keyed tables (O(levels x cells) numbers, bounded by the configuration) ------
    def parameters(self) -> dict:
        """What the noise is calibrated to; a saved state is loaded only into a counter of the same."""
        return {"mechanism": self.name, "n_cells": self.n_cells, "epsilon": self.epsilon,
                "sensitivity": self.sensitivity, "noise": self.noise, "resolution": self.resolution}

    def matches(self, core: dict) -> bool:
        """Whether ``core`` (a :meth:`state_core`) was written by a counter of this one's parameters."""
        return all(core.get(k) == v for k, v in self.parameters().items())

    def state_core(self) -> dict:
        return {**self.parameters(), "t": self.t, **self._progress()}

    def state_tables(self) -> dict:
        return {}

    def load_state(self, core: dict, tables=None) -> None:
        """Continue from ``core``: refused (ValueError) when it was written with other parameters, since the noise
        still to come must be calibrated to the epsilon the ledger charges."""
        if not self.matches(core):
            raise ValueError(f"counter state of other parameters: {({k: core.get(k) for k in self.parameters()})}, "
                             f"this counter {self.parameters()}")
        self.t = int(core["t"])
        self._load_progress(core)

    def _progress(self) -> dict:
        raise NotImplementedError

    def _load_progress(self, core: dict) -> None:
        raise NotImplementedError

    def _check_x(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if x.shape != (self.n_cells,):
            raise ValueError(f"x: expected shape ({self.n_cells},), got {x.shape}")
        return x



class PerWindowCounter(_Counter):
    """Fresh ``noise(sensitivity/epsilon)`` for each window; running total = prefix sum of the noisy values.

    >>> c = PerWindowCounter(1, epsilon=1.0, sensitivity=1, noise="laplace")
    >>> _ = c.update([5], np.random.RandomState(1)); c.running_variance(4)
    8.0
    """
    name = "per_window"

    def __init__(self, n_cells, epsilon, sensitivity, noise, resolution=1.0) -> None:
        super().__init__(n_cells, epsilon, sensitivity, noise, resolution)
        self.running = np.zeros(self.n_cells)
        self.last_window = np.zeros(self.n_cells)

    @property
    def node_scale(self) -> float:
        return float(self.sensitivity) / self.epsilon

    def update(self, x, random_state) -> np.ndarray:
        """Add one window; returns the noisy running total (the noisy window value is ``last_window``)."""
        x = self._check_x(x)
        self.last_window = self._noisy(x, self.epsilon, random_state)
        self.running = self.running + self.last_window
        self.t += 1
        return self.running.copy()

    def window_variance(self) -> float:
        return self.variance(self.epsilon)

    def running_variance(self, t: int) -> float:
        return t * self.window_variance()

    def running_terms(self, t: int) -> int:
        return t

    def _progress(self) -> dict:
        return {"running": self.running.tolist(), "last_window": self.last_window.tolist()}

    def _load_progress(self, s: dict) -> None:
        self.running, self.last_window = np.array(s["running"], float), np.array(s["last_window"], float)


class BinaryTreeCounter(_Counter):
    """Binary mechanism (Chan, Shi & Song 2011, Algorithm 2; Dwork et al. 2010) for ``horizon`` windows.

    At step ``t`` with lowest set bit ``i``, the p-sum ``alpha_i = sum_{j<i} alpha_j + x_t`` (covering the last
    ``2^i`` windows) gets noise of scale ``L * sensitivity / epsilon`` and the lower p-sums are cleared; the
    released running total is the sum of the noisy p-sums at the set bits of ``t`` (``popcount(t) <= L`` nodes).
    Only ``L`` p-sums per cell are kept, so the state is ``O(L * cells)`` and JSON-serializable.
    """
    name = "binary_tree"

    def __init__(self, n_cells, epsilon, sensitivity, noise, horizon: int, resolution=1.0):
        super().__init__(n_cells, epsilon, sensitivity, noise, resolution)
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"horizon: must be a positive integer, got {horizon!r}")
        self.horizon = int(horizon)
        self.levels = int(math.floor(math.log2(self.horizon))) + 1
        self.node_epsilon = self.epsilon / self.levels
        self.alpha = np.zeros((self.levels, self.n_cells))
        self.alpha_hat = np.zeros((self.levels, self.n_cells))
        self.base = np.zeros(self.n_cells)       # noisy total of earlier trees (after the horizon is reached)
        self.epochs = 0
        self.t_epoch = 0

    @property
    def node_scale(self) -> float:
        return self.levels * float(self.sensitivity) / self.epsilon

    def update(self, x, random_state) -> np.ndarray:
        x = self._check_x(x)
        if self.t_epoch == self.horizon:          # horizon reached: a new tree on top of the noisy total
            self.base = self._prefix()
            self.alpha[:] = 0
            self.alpha_hat[:] = 0
            self.t_epoch = 0
            self.epochs += 1
        self.t_epoch += 1
        self.t += 1
        i = (self.t_epoch & -self.t_epoch).bit_length() - 1
        self.alpha[i] = self.alpha[:i].sum(axis=0) + x
        self.alpha[:i] = 0
        self.alpha_hat[:i] = 0
        self.alpha_hat[i] = self._noisy(self.alpha[i], self.node_epsilon, random_state)
        return self._prefix()

    def _prefix(self) -> np.ndarray:
        bits = [j for j in range(self.levels) if (self.t_epoch >> j) & 1]
        return self.base + (self.alpha_hat[bits].sum(axis=0) if bits else 0.0)

    def node_variance(self) -> float:
        return self.variance(self.node_epsilon)

    def running_terms(self, t: int) -> int:
        """Number of noisy p-sums in the running total at step ``t`` (earlier trees included)."""
        epochs, rest = divmod(t, self.horizon)
        if rest == 0 and epochs:
            epochs, rest = epochs - 1, self.horizon
        return epochs * bin(self.horizon).count("1") + bin(rest).count("1")

    def running_variance(self, t: int) -> float:
        return self.running_terms(t) * self.node_variance()

    def parameters(self) -> dict:
        return {**super().parameters(), "horizon": self.horizon}

    def _progress(self) -> dict:
        return {"t_epoch": self.t_epoch, "epochs": self.epochs, "alpha": self.alpha.tolist(),
                "alpha_hat": self.alpha_hat.tolist(), "base": self.base.tolist()}

    def _load_progress(self, s: dict) -> None:
        self.t_epoch, self.epochs = int(s["t_epoch"]), int(s["epochs"])
        self.alpha = np.array(s["alpha"], float).reshape(self.levels, self.n_cells)
        self.alpha_hat = np.array(s["alpha_hat"], float).reshape(self.levels, self.n_cells)
        self.base = np.array(s["base"], float)


class HybridCounter(_Counter):
    """Hybrid mechanism (Chan, Shi & Song 2011, section 4) for streams without a known horizon.

    Half of epsilon goes to a logarithmic mechanism: ``beta += x_t`` every step and, when ``t`` is a power of two,
    ``beta += noise(2 sens/eps)`` and ``beta`` is released. The other half runs, inside each block
    ``(2^k, 2^(k+1))``, a :class:`BinaryTreeCounter` with horizon ``2^k``; between powers of two the release is
    ``beta(2^k) + tree_k(t - 2^k)``. Every window is in one logarithmic increment and one tree: epsilon in total.
    Error ``O(log^1.5 t / epsilon)`` at every ``t`` without knowing the horizon.
    """
    name = "hybrid"

    def __init__(self, n_cells, epsilon, sensitivity, noise, resolution=1.0) -> None:
        super().__init__(n_cells, epsilon, sensitivity, noise, resolution)
        self.beta = np.zeros(self.n_cells)
        self.beta_snap = np.zeros(self.n_cells)
        self.tree: BinaryTreeCounter | None = None

    @property
    def node_scale(self) -> float:
        """Noise scale of the logarithmic mechanism's increments (the tree nodes use ``tree.node_scale``)."""
        return 2.0 * float(self.sensitivity) / self.epsilon

    def update(self, x, random_state) -> np.ndarray:
        x = self._check_x(x)
        self.t += 1
        self.beta = self.beta + x
        if self.t & (self.t - 1) == 0:             # power of two: logarithmic mechanism releases
            self.beta = self._noisy(self.beta, self.epsilon / 2, random_state)
            self.beta_snap = self.beta.copy()
            self.tree = BinaryTreeCounter(self.n_cells, self.epsilon / 2, self.sensitivity, self.noise,
                                          horizon=self.t, resolution=self.resolution)
            return self.beta_snap.copy()
        assert self.tree is not None            # made at t = 1, a power of two (or restored with t)
        return self.beta_snap + self.tree.update(x, random_state)

    def running_terms(self, t: int) -> tuple[int, int]:
        k = t.bit_length() - 1
        return k + 1, bin(t - (1 << k)).count("1")

    def running_variance(self, t: int) -> float:
        if t < 1:
            return 0.0
        n_log, n_tree = self.running_terms(t)
        k = t.bit_length() - 1
        var = n_log * self.variance(self.epsilon / 2)
        if n_tree:
            var += n_tree * self.variance(self.epsilon / 2 / (k + 1))
        return var

    def _progress(self) -> dict:
        return {"beta": self.beta.tolist(), "beta_snap": self.beta_snap.tolist(),
                "tree": self.tree.state_core() if self.tree else None}

    def _load_progress(self, s: dict) -> None:
        self.beta, self.beta_snap = np.array(s["beta"], float), np.array(s["beta_snap"], float)
        self.tree = None
        if s["tree"] is not None:        # the current block's tree: horizon 2^k, at epsilon/2 (update())
            self.tree = BinaryTreeCounter(self.n_cells, self.epsilon / 2, self.sensitivity, self.noise,
                                          horizon=int(s["tree"]["horizon"]), resolution=self.resolution)
            self.tree.load_state(s["tree"])


# -- theory and choice ----------------------------------------------------------------------------------------
def mean_popcount(horizon: int) -> float:
    """Mean number of set bits of t over t = 1..horizon (exact, O(log T))."""
    total, n = 0, horizon + 1                      # count set bits over 0..horizon
    for j in range(horizon.bit_length()):
        cycle = 1 << (j + 1)
        total += (n // cycle) * (1 << j) + max(0, n % cycle - (1 << j))
    return total / horizon


def theoretical_running_mse(mechanism: str, horizon: int, epsilon: float, sensitivity: float, noise: str) -> float:
    """Mean over t = 1..horizon of the variance of the running total's noise.

    per_window: ``(T+1)/2 * Var(noise(sens/eps))``; binary_tree: ``mean popcount(t) * Var(noise(L sens/eps))``;
    hybrid: the exact mean of :meth:`HybridCounter.running_variance`.
    """
    if mechanism == "per_window":
        return (horizon + 1) / 2 * noise_variance(noise, epsilon, sensitivity)
    if mechanism == "binary_tree":
        levels = int(math.floor(math.log2(horizon))) + 1
        return mean_popcount(horizon) * noise_variance(noise, epsilon / levels, sensitivity)
    if mechanism == "hybrid":
        h = HybridCounter(1, epsilon, sensitivity, noise)
        return float(np.mean([h.running_variance(t) for t in range(1, horizon + 1)]))
    raise ValueError(f"mechanism: unknown {mechanism!r}")


def choose_mechanism(horizon: int | None, epsilon: float, sensitivity: float, noise: str,
                     output: str = "running") -> dict[str, Any]:
    """Pick the running-total mechanism with the smaller theoretical mean-squared error over the horizon.

    ``output="both"``: per-window noising at epsilon gives both outputs (the running total is post-processing),
    while a tree needs the budget split (epsilon/2 for the per-window values, epsilon/2 for the tree); the
    comparison uses those epsilons. An unknown horizon (``None``) gives ``hybrid``.

    >>> choose_mechanism(2**8, 1.0, 1, "laplace")["mechanism"], choose_mechanism(2**12, 1.0, 1, "laplace")["mechanism"]
    ('per_window', 'binary_tree')
    """
    if horizon is None:
        return {"mechanism": "hybrid", "reason": "unknown horizon"}
    tree_eps = epsilon / 2 if output == "both" else epsilon
    naive = theoretical_running_mse("per_window", horizon, epsilon, sensitivity, noise)
    tree = theoretical_running_mse("binary_tree", horizon, tree_eps, sensitivity, noise)
    return {"mechanism": "binary_tree" if tree < naive else "per_window",
            "running_rmse_per_window": math.sqrt(naive), "running_rmse_binary_tree": math.sqrt(tree),
            "reason": f"theoretical running RMSE over {horizon} windows: per_window {math.sqrt(naive):.3g}, "
                      f"binary_tree {math.sqrt(tree):.3g}"}
