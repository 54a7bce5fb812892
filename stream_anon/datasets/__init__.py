"""Adapters from the real public datasets to input events (docs/contracts.md section 1).

Each dataset has a small raw-format slice shipped inside the package (``stream_anon.data``, the repository's
``data/``; a user's clone has no ``../shared``; see ``data/ATTRIBUTION.md``) and, on a development machine, the
full file under ``../shared/data`` next to the checkout (overridable with ``STREAM_ANON_SHARED_DATA``). Both are
read by the same adapter.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, NamedTuple

from stream_anon import contract
from stream_anon.datasets import citibike, obd2, oyster, oyster_cards

# Full files of a development machine (never shipped): ../shared/data beside the repository checkout.
SHARED_DATA = Path(os.environ.get("STREAM_ANON_SHARED_DATA",
                                  Path(__file__).resolve().parents[3] / "shared" / "data"))


class Dataset(NamedTuple):
    read: Callable[..., list[dict]]   # read_events(path, limit=None) -> list of events
    slice_path: Path                  # bundled raw-format slice
    full_path: Path                   # full file; may be absent
    derived: bool = False             # events built from the file's rows (not one event per raw row)


DATASETS = {
    "oyster": Dataset(oyster.read_events, oyster.SLICE_PATH,
                      SHARED_DATA / "oyster" / "oyster_events_mon.csv.gz"),
    "citibike": Dataset(citibike.read_events, contract.data_path("citibike_slice.csv.gz"),
                        SHARED_DATA / "citibike_jc" / "citibike_jc_trips.csv.gz"),
    "obd2": Dataset(obd2.read_events, contract.data_path("obd2_19drivers.csv.gz"),
                    SHARED_DATA / "obd2" / "obd2_19drivers.csv.gz"),
    # demo: the real Oyster journeys of the slice (or full Monday file) grouped into persistent synthetic cards
    # (stream_anon.datasets.oyster_cards, OysterCardsParams defaults); the privacy unit comes back release after
    # release, which is what m-invariance is about
    "oyster-cards": Dataset(oyster_cards.read_events, oyster.SLICE_PATH,
                            SHARED_DATA / "oyster" / "oyster_events_mon.csv.gz", derived=True),
}


def load_events(name: str, limit: int | None = None, full: bool = False) -> list[dict]:
    """Events of dataset ``name`` from its bundled slice, or from the full file when ``full``."""
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r} (expected one of {sorted(DATASETS)})")
    dataset = DATASETS[name]
    path = dataset.full_path if full else dataset.slice_path
    if not path.exists():
        raise FileNotFoundError(f"dataset {name!r}: {path} not found" +
                                (" (full data lives in ../shared/data, absent from a plain clone)" if full else ""))
    return dataset.read(path, limit=limit)
