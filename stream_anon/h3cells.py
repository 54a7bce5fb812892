"""H3 cells of positions over a range of resolutions, computed once per distinct position.

The engine asks for a position's cells many times: a record waits through several closes, the H3 strategy cuts
its buffer along every resolution at each close, and every class publishes the finest cell its members share.
h3 has no vectorized call, so each distinct ``(lat, lon, rmin, rmax)`` is computed once (``latlng_to_cell`` at
each resolution: H3 children do not tile their parent, so a coarser cell is never derived from a finer one) and
kept in a bounded cache; fleets repeat positions (stations, depots, parked vehicles).

>>> cells = cells_of_points(np.array([40.7128, 40.7128]), np.array([-74.006, -74.006]), 7, 9)
>>> cells.shape, bool((cells[0] == cells[1]).all())
((2, 3), True)
>>> common_cell(np.array([40.7128]), np.array([-74.006]), (7, 9)) == h3_package().latlng_to_cell(40.7128, -74.006, 9)
True
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np


def h3_package():
    import h3       # only streams with an H3 geopoint need the package (checked when their config loads)
    return h3


@lru_cache(maxsize=1 << 18)
def cells_of_point(lat: float, lon: float, rmin: int, rmax: int) -> tuple[int, ...]:
    """H3 cell ids (integers: below 2**63, the top bit is reserved) of one position at resolutions rmin..rmax."""
    from h3.api.basic_int import latlng_to_cell as to_cell
    return tuple(to_cell(lat, lon, r) for r in range(rmin, rmax + 1))


def cells_of_points(lat: np.ndarray, lon: np.ndarray, rmin: int, rmax: int) -> np.ndarray:
    """(n, rmax - rmin + 1) int64: each position's cell at each resolution; column j is resolution rmin + j."""
    lat = np.asarray(lat, dtype=float)
    lon = np.asarray(lon, dtype=float)
    if len(lat) == 0:
        return np.empty((0, rmax - rmin + 1), dtype=np.int64)
    # one cache lookup per distinct position (complex numbers sort as (lat, lon) pairs)
    pts, inverse = np.unique(lat + 1j * lon, return_inverse=True)
    per_point = np.array([cells_of_point(p.real, p.imag, rmin, rmax) for p in pts.tolist()], dtype=np.int64)
    return per_point[inverse.reshape(-1)]


def common_cell(lat: np.ndarray, lon: np.ndarray, resolutions: tuple[int, int]) -> str | None:
    """The cell (string form) of the finest resolution in [rmin, rmax] holding every position, or None (none does).
    Every resolution is searched: H3 children do not tile their parent exactly, so sharing a cell at one resolution
    does not imply sharing one at every coarser resolution (tests/engine/test_h3.py)."""
    if not len(lat):
        return None
    return common_cells(lat, lon, np.zeros(1, dtype=np.int64), resolutions)[0]


def common_cells(lat: np.ndarray, lon: np.ndarray, starts: np.ndarray, resolutions: tuple[int, int]) -> list:
    """:func:`common_cell` of each group of positions (group j: ``starts[j]`` up to the next start; none empty),
    all groups at once."""
    if not len(starts):
        return []
    rmin, rmax = resolutions
    cells = cells_of_points(lat, lon, rmin, rmax)
    low = np.minimum.reduceat(cells, starts, axis=0)
    shared = low == np.maximum.reduceat(cells, starts, axis=0)          # (groups, resolutions)
    finest = shared.shape[1] - 1 - np.argmax(shared[:, ::-1], axis=1)
    ids = low[np.arange(len(starts)), finest].tolist()
    to_str = h3_package().int_to_str
    return [to_str(c) if ok else None for c, ok in zip(ids, shared.any(axis=1).tolist())]
