"""Cell keys and contribution bounding event by event: the rules :mod:`~stream_anon.dp.cells` and
:class:`~stream_anon.dp.contribution.Bounding` reproduce in numpy, applied where those decline a window (units that
are neither all text nor all integers, an unhashable filter value, a bool in an hour field), because there a dict's
notion of one value is not the per-event rule's. ``tests/dp/test_dp_columns.py`` holds the two paths equal.

>>> from stream_anon.dp.specs import parse_dp_config
>>> from stream_anon.dp.cells import CellKeys
>>> from stream_anon.dp.columns import WindowColumns
>>> from stream_anon.dp.contribution import Bounding, UnitKeys
>>> cfg = parse_dp_config({"stream": {"privacy_unit": "card"}, "dp": {"epsilon_budget": 1.0},
...     "aggregates": [{"name": "n", "kind": "count", "epsilon": 0.5, "max_contributions": 1,
...                     "group_by": [{"name": "line", "field": "line", "values": ["a", "b"]}]}]})
>>> wc = WindowColumns({"card": ["x", 1, "x", None], "line": ["a", "a", "a", "b"]})
>>> bounding = Bounding("card", UnitKeys(b"seed", "hash"), None)       # no period: no window cap
>>> x, stats = cell_values(cfg.aggregates[0], wc, CellKeys(), bounding, None)
>>> x["count"].tolist(), stats
([2.0, 0.0], {'contributions_cut': 1, 'out_of_domain': 0, 'missing': 1})
"""
from __future__ import annotations

import itertools
import math
from typing import cast

import numpy as np

from stream_anon.dp.cells import CellKeys
from stream_anon.dp.columns import WindowColumns
from stream_anon.dp.contribution import Bounding, WindowUnits, bound_contributions, cell_sums
from stream_anon.dp.specs import AggregateSpec
from stream_anon.events import UNIT_IDS


def cell_values(spec: AggregateSpec, wc: WindowColumns, cells: CellKeys, bounding: Bounding,
                window_units: WindowUnits | None, commit: bool = True) -> tuple[dict[str, np.ndarray], dict]:
    """:meth:`Bounding.bound` of :meth:`CellKeys.of_window`, event by event: (bounded true value of every cell
    per component, counts of what was left out)."""
    names = list(wc.columns)
    flats = [dict(zip(names, vals)) for vals in zip(*(wc.column(f) for f in names))] if names else \
        [{} for _ in range(wc.n)]
    index = cells.index(spec)
    if spec.where:
        flats = [f for f in flats if not any(f.get(k) not in allowed for k, allowed in spec.where)]
    event_unit = bounding.keys is None
    # read only when units are not events, and then a field's name
    unit_field = cast(str, UNIT_IDS if bounding.keys is not None and bounding.keys.scheme == "ids" else bounding.field)
    vf, ratio = spec.value_field, spec.kind == "ratio"
    all_units = list(range(len(flats))) if event_unit else [f.get(unit_field) for f in flats]
    keys = (zip(*(g.keys_of(flats) for g in spec.group_by)) if spec.group_by
            else itertools.repeat((), len(flats)))
    all_vals = [f.get(vf) for f in flats] if vf is not None else itertools.repeat(None, len(flats))
    idx, units, vals = [], [], []
    missing = ood = 0
    for unit, key, v in zip(all_units, keys, all_vals):
        if unit is None:
            missing += 1
            continue
        if None in key:                       # keys are domain values (str, int): never equal to None
            ood += 1
            continue
        if vf is not None and (v is None or (not ratio and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                            or not math.isfinite(v)))):
            missing += 1
            continue
        idx.append(index[key])
        units.append(unit)
        vals.append(v)
    extra = {}
    if bounding.caps is not None:
        wcut = ucut = 0
        if not event_unit and units:
            assert window_units is not None          # given in period mode, the only one with caps
            mask, wcut, ucut = bounding.window_cap(spec.name, units, commit, window_units)
            if wcut:
                idx = [i for i, k in zip(idx, mask) if k]
                units = [u for u, k in zip(units, mask) if k]
                vals = [v for v, k in zip(vals, mask) if k]
        extra = {"windows_cut": wcut, "units_window_capped": ucut}
    keep, cut = bound_contributions(units, spec.max_contributions)
    idx_a = np.asarray(idx, dtype=np.int64)
    if spec.kind == "histogram":            # values outside the edges are clamped into the end bins
        nb = len(spec.bins) - 1
        b = np.clip(np.searchsorted(spec.bins, np.asarray(vals, dtype=float), side="right") - 1, 0, nb - 1)
        idx_a = idx_a * nb + b.astype(np.int64)
    kept = None
    if spec.kind in ("sum", "mean"):
        kept = np.asarray([vals[i] for i in np.flatnonzero(keep)], dtype=float)
    elif spec.kind == "ratio":
        kept = np.asarray([vals[i] in spec.numerator_values for i in np.flatnonzero(keep)], dtype=float)
    x = cell_sums(spec, idx_a[keep], kept)
    return x, {"contributions_cut": cut, "out_of_domain": ood, "missing": missing, **extra}
