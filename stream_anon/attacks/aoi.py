"""Homogeneity attack on positions: the thesis's Privacy Demonstrator (Singer 2023, seed 004, Sec. 4.3.2 and
4.4.4, Figure 4.7).

Positions are cropped after the fourth decimal (12.123456 -> 12.1234): a cell of 1e-4 degree, "about a house".
An individual's **areas of interest** (AOIs) are the cells of all its raw records. For every individual D the
adversary (who knows who is in the data and D's quasi-identifiers) takes the candidates grouped with D, i.e. the
individuals of every class holding a record of D, and guesses the cells that **every** candidate of such a class
visited; D's recall is the share of D's AOIs in the guess. Reported: compromised individuals (recall > 0) out of
those with positions, maximum and mean recall (Tables 4.10-4.13).

Generalised releases [ours, the thesis only attacks exact positions]: a released position reveals a cell only
when the published value pins it to one cell (a box inside one cell, or a station leaf with known coordinates);
wider boxes reveal nothing. Within a class, records are attributed to their candidate the way the thesis's
DriverID does (the strongest adversary: it is an upper bound when the release carries no pseudonym).

>>> import numpy as np
>>> # two drivers share a class (as in Figure 4.7); driver 1 visited cells a-e, driver 2 b, d, f, g, h:
>>> # the guess {b, d} holds 2 of each driver's 5 AOIs
>>> rec_unit = np.array([1, 1, 1, 1, 1, 2, 2, 2, 2, 2])
>>> rec_cell = np.array(list("abcdebdfgh"))
>>> res = aoi_attack(rec_unit, np.zeros(10, int), rec_unit, rec_cell, np.arange(10), rec_cell)
>>> res.compromised, res.individuals, res.max_recall
(2, 2, 0.4)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

CELL_DECIMALS = 4


def cell_ids(lat, lon, decimals: int = CELL_DECIMALS) -> np.ndarray:
    """Cell of each (lat, lon): both coordinates cropped (truncated toward zero) after ``decimals`` places,
    as a string id ``"lat_i,lon_i"`` (integers of 10^-decimals degree); NaN positions give None."""
    lat = np.asarray(lat, dtype=float)
    lon = np.asarray(lon, dtype=float)
    scale = 10.0 ** decimals
    ok = np.isfinite(lat) & np.isfinite(lon)
    # the small epsilon keeps 12.1234 (stored as 12.12339999...) in its own cell
    lat, lon = np.where(ok, lat, 0.0), np.where(ok, lon, 0.0)
    a = np.trunc(lat * scale + np.sign(lat) * 1e-6).astype(np.int64)
    b = np.trunc(lon * scale + np.sign(lon) * 1e-6).astype(np.int64)
    return np.array([f"{x},{y}" if o else None for x, y, o in zip(a, b, ok)], dtype=object)


def box_cells(lat_lo, lat_hi, lon_lo, lon_hi, decimals: int = CELL_DECIMALS) -> np.ndarray:
    """The cell a published box pins down (both corners in the same cell), else None."""
    lo = cell_ids(lat_lo, lon_lo, decimals)
    hi = cell_ids(lat_hi, lon_hi, decimals)
    return np.array([a if a is not None and a == b else None for a, b in zip(lo, hi)], dtype=object)


@dataclass
class AOIResult:
    individuals: int          # individuals with at least one AOI (the thesis's 13 drivers with positions)
    compromised: int          # individuals with at least one AOI guessed
    max_recall: float
    mean_recall: float
    recall: pd.Series         # per individual

    @property
    def compromised_ratio(self) -> float:
        return self.compromised / self.individuals if self.individuals else 0.0

    def to_dict(self, prefix: str = "aoi_") -> dict:
        return {f"{prefix}individuals": self.individuals, f"{prefix}compromised": self.compromised,
                f"{prefix}compromised_ratio": self.compromised_ratio, f"{prefix}max_recall": self.max_recall,
                f"{prefix}mean_recall": self.mean_recall}


def aoi_attack(raw_unit, raw_class, pos_record_unit, pos_cell_true, pos_record, pos_cell_released
               ) -> AOIResult:
    """Run the attack.

    - ``raw_unit`` (n,): individual of every input record; ``raw_class`` (n,): its released class, or -1 /
      None when suppressed (a class is a set of records published under one generalization);
    - ``pos_record_unit``, ``pos_cell_true``: one entry per raw position (a record may hold several, e.g.
      start and end station): its individual and true cell (``cell_ids``) -> the AOIs;
    - ``pos_record``, ``pos_cell_released``: per raw position, its record index and the cell the release
      reveals for it (None: not revealed).
    """
    raw_unit = np.asarray(raw_unit)
    raw_class = pd.Series(raw_class, dtype=object).to_numpy()
    truth = pd.DataFrame({"unit": pos_record_unit, "cell": pos_cell_true}).dropna().drop_duplicates()
    aoi_count = truth.groupby("unit").size()
    # candidates: distinct individuals per class (every released record counts, with or without a position)
    released = pd.DataFrame({"cls": raw_class, "unit": raw_unit})
    released = released[released["cls"].map(lambda c: c is not None and c != -1)]
    n_candidates = released.drop_duplicates().groupby("cls").size()
    pos_record = np.asarray(pos_record)
    shown = pd.DataFrame({"cls": raw_class[pos_record], "unit": raw_unit[pos_record], "cell": pos_cell_released})
    shown = shown[shown["cls"].map(lambda c: c is not None and c != -1) & shown["cell"].notna()].drop_duplicates()
    # a cell is guessed in a class when every candidate of the class visited it there
    per_cell = shown.groupby(["cls", "cell"]).size().rename("visitors").reset_index()
    per_cell["candidates"] = per_cell["cls"].map(n_candidates)
    homogeneous = per_cell[per_cell["visitors"] == per_cell["candidates"]][["cls", "cell"]]
    membership = released.drop_duplicates()
    guesses = membership.merge(homogeneous, on="cls")[["unit", "cell"]].drop_duplicates()
    hits = guesses.merge(truth, on=["unit", "cell"]).groupby("unit").size()
    recall = (hits.reindex(aoi_count.index, fill_value=0) / aoi_count).astype(float)
    return AOIResult(individuals=int(len(recall)), compromised=int((recall > 0).sum()),
                     max_recall=float(recall.max()) if len(recall) else 0.0,
                     mean_recall=float(recall.mean()) if len(recall) else 0.0, recall=recall)
