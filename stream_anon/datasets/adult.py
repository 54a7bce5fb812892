"""UCI Adult as shipped with ARX (30,162 complete rows) and ARX's generalization hierarchies.

The k-anonymity literature's benchmark table (Mondrian, LeFevre et al. ICDE 2006; CASTLE, Cao et al. ICDE 2008).
One row is one person, so k counted in individuals equals k counted in records here.

- ``read_adult(path)``: the semicolon-separated table, ``age`` as int, every other column as str;
- ``load_hierarchies(dir)``: ``Hierarchy`` per column from ``adult_hierarchy_<column>.csv`` (ARX format);
- ``QUASI_IDENTIFIERS``: the eight columns other than ``salary-class``, the same eight as the public Mondrian
  reference implementation that published NCP 12.19% at k = 10 (age, workclass, education (= education_num),
  marital status, occupation, race, sex, native country; salary class is its sensitive attribute);
- ``SLICE_PATH`` / ``FULL_PATH``: the bundled 2,000-row prefix (``data/ATTRIBUTION.md``) and the full file.

>>> df = read_adult(SLICE_PATH, limit=2)
>>> df[["age", "education", "salary-class"]].values.tolist()
[[39, 'Bachelors', '<=50K'], [50, 'Bachelors', '<=50K']]
>>> load_hierarchies(SLICE_HIERARCHIES)["education"].n_leaves
16
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from stream_anon import contract
from stream_anon.datasets import SHARED_DATA
from stream_anon.hierarchy import Hierarchy

COLUMNS = ("sex", "age", "race", "marital-status", "education", "native-country", "workclass", "occupation",
           "salary-class")
QUASI_IDENTIFIERS = ("age", "workclass", "education", "marital-status", "occupation", "race", "sex",
                     "native-country")
NUMERIC = ("age",)
SENSITIVE = "salary-class"
SLICE_ROWS = 2000

SLICE_PATH = contract.data_path("adult_slice.csv.gz")
SLICE_HIERARCHIES = contract.data_path("adult_hierarchies")
FULL_PATH = SHARED_DATA / "adult" / "adult.csv.gz"
FULL_HIERARCHIES = SHARED_DATA / "adult"


def read_adult(path: str | Path = SLICE_PATH, limit: int | None = None) -> pd.DataFrame:
    """The table in file order (index 0..n-1); ``age`` int, the other columns str."""
    df = pd.read_csv(path, sep=";", dtype=str, keep_default_na=False, nrows=limit)
    missing = [c for c in COLUMNS if c not in df]
    if missing:
        raise ValueError(f"adult: {path} lacks columns {missing}")
    df["age"] = df["age"].astype(int)
    return df[list(COLUMNS)]


def load_hierarchies(directory: str | Path = SLICE_HIERARCHIES, columns=COLUMNS) -> dict[str, Hierarchy]:
    """``{column: Hierarchy}`` from ARX's ``adult_hierarchy_<column>.csv`` files in ``directory``."""
    directory = Path(directory)
    return {c: Hierarchy.from_arx_csv(directory / f"adult_hierarchy_{c}.csv") for c in columns}


def paths(full: bool = False) -> tuple[Path, Path]:
    """(table, hierarchy directory): the bundled slice, or with ``full`` the files under ``../shared/data``."""
    table, hierarchies = (FULL_PATH, FULL_HIERARCHIES) if full else (SLICE_PATH, SLICE_HIERARCHIES)
    if not table.exists():
        raise FileNotFoundError(f"dataset 'adult': {table} not found" +
                                (" (full data lives in ../shared/data, absent from a plain clone)" if full else ""))
    return table, hierarchies

