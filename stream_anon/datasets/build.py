"""Regenerate the committed data artifacts from the full files in ``../shared/data`` (a development tool: run
it in a checkout, where ``stream_anon.data`` and ``stream_anon.configs`` are the repository's ``data/`` and
``configs/``).

- the raw-format slices under ``data/`` (``data/ATTRIBUTION.md`` records the cuts) and the Adult hierarchies;
- ``configs/hierarchies/oyster_location.json`` (from the full Monday file, so every station and route of the
  day is a leaf).

A user's clone has no ``../shared``, so tests and the demo read these slices with the same adapters as the full
files. Slices are prefixes of the originals (same header, same row order), so event ids derived from row indices
agree between slice and full file. Run ``python -m stream_anon.datasets.build``.
"""
from __future__ import annotations

import gzip
import io
import shutil
from pathlib import Path
from typing import Callable

from stream_anon.datasets import DATASETS, adult, oyster

OYSTER_BEFORE = "07:30"      # Oyster: every row before 07:30, i.e. the night, early morning and start of the peak
CITIBIKE_TRIPS = 20_000      # Citi Bike: the first 20,000 trips (January to mid-February 2017)


def write_prefix(src: str | Path, dst: str | Path, keep: Callable[[int, str], bool]) -> int:
    """Copy the header and the leading data lines for which ``keep(index, line)`` holds; returns their count.

    Written gzip with mtime 0 so regenerating gives byte-identical files. Lines are copied verbatim; neither
    file has quoted newlines.
    """
    n = 0
    with gzip.open(src, "rt", newline="") as fin, \
            gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as raw, \
            io.TextIOWrapper(raw, encoding="utf-8", newline="") as fout:
        fout.write(fin.readline())
        for line in fin:
            if not keep(n, line):
                break
            fout.write(line)
            n += 1
    return n


def write_adult_slice() -> int:
    """Write the bundled Adult prefix (``adult.SLICE_ROWS`` rows) and copy ARX's hierarchies next to it."""
    n = write_prefix(adult.FULL_PATH, adult.SLICE_PATH, lambda i, line: i < adult.SLICE_ROWS)
    adult.SLICE_HIERARCHIES.mkdir(parents=True, exist_ok=True)
    for c in adult.COLUMNS:
        name = f"adult_hierarchy_{c}.csv"
        shutil.copyfile(adult.FULL_HIERARCHIES / name, adult.SLICE_HIERARCHIES / name)
    return n


def main() -> None:
    fares, citibike = DATASETS["oyster"], DATASETS["citibike"]
    n = write_prefix(fares.full_path, fares.slice_path, lambda i, line: line.split(",", 2)[1] < OYSTER_BEFORE)
    print(f"oyster: {n} rows -> {fares.slice_path}")
    n = write_prefix(citibike.full_path, citibike.slice_path, lambda i, line: i < CITIBIKE_TRIPS)
    print(f"citibike: {n} rows -> {citibike.slice_path}")
    oyster.build_location_hierarchy(fares.full_path)
    print(f"oyster location hierarchy -> {oyster.HIERARCHY_PATH}")
    n = write_adult_slice()
    print(f"adult: {n} rows -> {adult.SLICE_PATH} (+ hierarchies in {adult.SLICE_HIERARCHIES})")


if __name__ == "__main__":
    main()
