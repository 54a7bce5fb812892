"""Consistent estimates from redundant noisy releases (post-processing: no budget).

When several releases measure linear functions of the same cells (e.g. zone x hour counts, zone totals and hour
totals, each with its own noise), the weighted least-squares estimate of the cells, ``x = argmin sum_i (y_i -
a_i x)^2 / var_i``, is consistent (derived totals are exactly the sums of the estimated cells) and, for
unbiased independent noise, the minimum-variance linear unbiased estimate (Gauss-Markov). This is the
consistency step of Hay, Rastogi, Miklau & Suciu, *Boosting the Accuracy of Differentially Private Histograms
Through Consistency*, PVLDB 2010, solved directly (the domains here have hundreds of cells).

>>> import numpy as np
>>> A = np.array([[1, 0], [0, 1], [1, 1]], dtype=float)       # two cells and their total
>>> x, var = least_squares(A, np.array([10.0, 20.0, 33.0]), np.array([1.0, 1.0, 1.0]))
>>> np.round(x, 3).tolist(), np.round(var, 3).tolist()
([11.0, 21.0], [0.667, 0.667])
"""
from __future__ import annotations

import numpy as np


def least_squares(A: np.ndarray, y: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares cells ``x`` and the
    variance of each estimated cell. ``A``: measurements x cells (0/1 or any weights), ``y``: noisy measured
    values, ``var``: their noise variances (> 0). ``A`` must have full column rank."""
    A, y, var = np.asarray(A, dtype=float), np.asarray(y, dtype=float), np.asarray(var, dtype=float)
    if A.ndim != 2 or y.shape != (A.shape[0],) or var.shape != (A.shape[0],):
        raise ValueError(f"shapes: A {A.shape}, y {y.shape}, var {var.shape}")
    if np.any(var <= 0):
        raise ValueError("var: every measurement needs a positive noise variance")
    w = 1.0 / var
    normal = A.T @ (A * w[:, None])
    cov = np.linalg.inv(normal)
    x = cov @ (A.T @ (w * y))
    return x, np.diag(cov).copy()


def two_way(cells: np.ndarray, cell_var: float, row_totals: np.ndarray, row_var: float,
            col_totals: np.ndarray, col_var: float) -> tuple[np.ndarray, np.ndarray]:
    """Consistent (rows x cols) table from noisy cells and noisy row and column totals (e.g. zone x hour counts,
    zone totals, hour totals released separately). Returns the table and the variance of each cell; its row and
    column sums are the consistent totals."""
    cells = np.asarray(cells, dtype=float)
    r, c = cells.shape
    eye = np.eye(r * c)
    rows = np.kron(np.eye(r), np.ones((1, c)))
    cols = np.kron(np.ones((1, r)), np.eye(c))
    A = np.vstack([eye, rows, cols])
    y = np.concatenate([cells.ravel(), np.asarray(row_totals, float), np.asarray(col_totals, float)])
    var = np.concatenate([np.full(r * c, cell_var), np.full(r, row_var), np.full(c, col_var)])
    x, v = least_squares(A, y, var)
    return x.reshape(r, c), v.reshape(r, c)
