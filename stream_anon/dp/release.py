"""Noisy release: an aggregate's bounded cell values through its counters, and the released block of rows. Step 5
of the walk of a DP value (:mod:`stream_anon.dp`).

**Plan** (:func:`plan_aggregate`, once per aggregate): the aggregate's epsilon is split over its components (count,
sum, numerator, denominator: sequential composition, Dwork & Roth 2014, Theorem 3.16) and its outputs
(``per_window``, ``running``), and the running-total mechanism is chosen (:func:`~stream_anon.dp.continual.
choose_mechanism`: per-window noising, the binary tree of Chan, Shi & Song 2011, or their hybrid mechanism).

**Noise** (:meth:`Releaser.release`): each component goes through its counters
(:mod:`~stream_anon.dp.continual`), drawing from a generator seeded by ``HMAC(seed, aggregate, component, output,
release)``: a restarted worker re-produces identical releases (so the ledger's idempotent reservation is sound:
re-publishing the same values leaks nothing new), and without the secret seed the noise cannot be predicted.

**Block** (:class:`ReleasedCells`): one release of one output as the fields its rows share (aggregate, window,
mechanism, epsilon, noise scale, interval method) and, per cell, its numbers laid out by a :class:`CellLayout`
(value, 95% interval of the noise, for a mean or ratio its components and bounds). Intervals: exact for one draw of
geometric or Laplace noise, the normal approximation for a sum of draws, the delta method for a ratio of two noisy
components (post-processing of the released values: no budget).
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, cast

import numpy as np

from stream_anon.dp.cells import CellLabels
from stream_anon.dp.continual import (BinaryTreeCounter, HybridCounter, PerWindowCounter, Z95, _Counter,
                                      choose_mechanism, noise_ci95_half_width)
from stream_anon.dp.specs import AggregateSpec


# -- plan -------------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    """How one aggregate is released: which counters, which epsilon each, which running mechanism."""
    spec: AggregateSpec
    running_mechanism: str | None        # None when output == per_window
    window_epsilon: float                # per component, per-window counter (0: no per-window counter)
    running_epsilon: float               # per component, running counter (0: running = prefix of per-window)
    reason: str
    release_epsilon: float = 0.0         # charged to the worst-case unit by one release (all components)
    sens_factor: int = 1                 # windows of one unit one release can hold: min(release_every, W)


def release_epsilon(spec: AggregateSpec, max_windows: int | None = None) -> tuple[float, int]:
    """(epsilon one release of the aggregate charges the worst-case unit, ``m``: the unit's windows one release
    can hold) under :func:`plan_aggregate`'s calibration (``max_windows``: the stream's ``W``, None without a
    period)."""
    if max_windows is not None and spec.max_windows is not None:
        max_windows = spec.max_windows
    m = 1 if max_windows is None else min(spec.release_every, max_windows)
    return (spec.epsilon if max_windows is None else spec.epsilon * m / max_windows), m


def plan_aggregate(spec: AggregateSpec, max_windows: int | None = None) -> Plan:
    """Split the aggregate's epsilon over its components and outputs and pick the running mechanism.

    Without a period (``max_windows=None``): ``spec.epsilon`` per window. Period mode: a unit contributes to at
    most ``W = max_windows`` windows of a period, so to at most ``W`` releases, each holding at most ``m =
    min(release_every, W)`` of its windows (sensitivity ``m`` times the per-window one); noise calibrated to
    ``epsilon * m / W`` per release keeps the unit's loss over the whole period at ``epsilon`` (the sum over
    its releases; Dwork & Roth 2014, Theorem 3.16), whatever the number of windows in the period."""
    eps, m = release_epsilon(spec, max_windows)
    eps_c = eps / len(spec.components)
    if spec.output == "per_window":
        return Plan(spec, None, eps_c, 0.0, "per-window output only", eps, m)
    sens = max(spec.component_sensitivity(c) for c in spec.components) * m
    noise = spec.component_noise(spec.components[0])
    if spec.mechanism == "auto":
        exact = noise == "geometric" and float(sens).is_integer()
        choice = choose_mechanism(spec.horizon_windows, eps_c, sens, noise if exact else "laplace", spec.output)
        mech, reason = choice["mechanism"], choice["reason"]
    else:
        mech, reason = spec.mechanism, "configured"
    if mech == "per_window":                  # running totals are prefix sums of the per-window releases
        return Plan(spec, "per_window", eps_c, 0.0, reason, eps, m)
    if spec.output == "both":
        return Plan(spec, mech, eps_c / 2, eps_c / 2, reason, eps, m)
    return Plan(spec, mech, 0.0, eps_c, reason, eps, m)


def new_counters(spec: AggregateSpec, plan: Plan) -> dict[str, dict[str, _Counter]]:
    """Component -> ``window`` and/or ``running`` counter of the plan, over the aggregate's cells, at t = 0."""
    n = len(spec.domain)
    out: dict[str, dict[str, _Counter]] = {}
    for comp in spec.components:
        sens, noise = spec.component_sensitivity(comp) * plan.sens_factor, spec.component_noise(comp)
        res = spec.component_resolution(comp)
        c: dict[str, _Counter] = {}
        if plan.window_epsilon > 0:
            c["window"] = PerWindowCounter(n, plan.window_epsilon, sens, noise, res)
        if plan.running_epsilon > 0:
            if plan.running_mechanism == "binary_tree":
                # binary_tree has a horizon (parse_aggregate, _with_horizon); the counter checks it anyway
                horizon = cast(int, spec.horizon_windows)
                c["running"] = BinaryTreeCounter(n, plan.running_epsilon, sens, noise, horizon, res)
            else:
                c["running"] = HybridCounter(n, plan.running_epsilon, sens, noise, res)
        out[comp] = c
    return out


# -- the released block -----------------------------------------------------------------------------------------
class CellLayout:
    """The fields a cell takes from its numbers, in order: ``(name, shape)`` with shape ``None`` for a number, an
    int ``n`` for a list of ``n`` numbers, a tuple of names for an object of numbers. Both forms of a cell come
    from it: the dict of :meth:`fields_of` and the JSON ``template`` (a ``%b`` per number)."""

    def __init__(self, fields):
        self.fields = tuple(fields)
        self.per_cell = sum(1 if shape is None else shape if isinstance(shape, int) else len(shape)
                            for _, shape in self.fields)
        piece = lambda text: json.dumps(text).encode().replace(b"%", b"%%")      # noqa: E731
        parts = []
        for name, shape in self.fields:
            if shape is None:
                value = b"%b"
            elif isinstance(shape, int):
                value = b"[" + b",".join([b"%b"] * shape) + b"]"
            else:
                value = b"{" + b",".join(piece(c) + b":%b" for c in shape) + b"}"
            parts.append(b"," + piece(name) + b":" + value)
        self.template = b"".join(parts)

    def fields_of(self, numbers) -> dict:
        out, i = {}, 0
        for name, shape in self.fields:
            if shape is None:
                out[name], i = numbers[i], i + 1
            elif isinstance(shape, int):
                out[name], i = list(numbers[i:i + shape]), i + shape
            else:
                out[name], i = dict(zip(shape, numbers[i:i + len(shape)])), i + len(shape)
        return out


# a count, sum or histogram cell; a mean or ratio cell (its two components by name)
ONE_COMPONENT = CellLayout([("value", None), ("ci95", 2)])


@functools.lru_cache(maxsize=None)
def two_components(c0: str, c1: str) -> CellLayout:
    return CellLayout([("value", None), ("components", (c0, c1)), ("noise_ci95", 2), ("ci95", 2), ("bounds", 2)])


class ReleasedCells:
    """One release of one aggregate output (``per_window`` or ``running``) as a block: the fields its rows share
    (:attr:`common`) and, per cell of the aggregate's domain, its own (``group``, ``group_key`` from its
    :class:`~stream_anon.dp.cells.CellLabels`, and its numbers in the order of its :class:`CellLayout`).
    :meth:`rows` gives the ``aggregate`` rows (one per cell); the worker serializes the shared fields once per
    release and each cell's fields from the numbers (:meth:`cell_fragments`), with no dict per row (a window's
    releases have ~300 rows, one for every 4 events of the Oyster stream)."""

    __slots__ = ("common", "labels", "numbers", "layout")

    def __init__(self, common: dict, labels: CellLabels, numbers: list, layout: CellLayout):
        self.common, self.labels, self.numbers, self.layout = common, labels, numbers, layout

    def __len__(self) -> int:
        return len(self.labels.pairs)

    def rows(self) -> list[dict]:
        """The release's ``aggregate`` rows, one per cell of the domain (new dicts the caller may change)."""
        k, nums, common, fields = self.layout.per_cell, self.numbers, self.common, self.layout.fields_of
        return [{**common, "group": dict(group), "group_key": key, **fields(nums[i * k:(i + 1) * k])}
                for i, (group, key) in enumerate(self.labels.pairs)]

    def cell_fragments(self, dumps) -> list[bytes]:
        """Per cell, the JSON members of its own fields (``"group":...,"group_key":...,"value":...``, no braces).
        ``dumps``: a compact JSON serializer returning bytes (numbers are serialized by it, all in one call: a JSON
        number never holds a comma)."""
        k = self.layout.per_cell
        nums = dumps(self.numbers)[1:-1].split(b",")
        template = self.layout.template
        return [lab + template % tuple(nums[i * k:(i + 1) * k]) for i, lab in enumerate(self.labels.json)]


class WindowStarts(dict):
    """Window index -> ISO-8601 UTC time of the window's start, computed once."""

    def __init__(self, window_s: float):
        super().__init__()
        self.window_s = window_s

    def __missing__(self, w: int) -> str:
        self[w] = value = iso_time(w * self.window_s)
        return value


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


class RowWriter:
    """The ``anon.aggregates`` rows of one partition, in both forms: :meth:`row` (a dict) and :meth:`values` (the
    same rows serialized, a release's shared fields once): the one place the DP row is written. To a block's rows
    it adds the partition, the lineage, the window's bounds, the ledger's total through the window and the budget
    in force, and ``row_id`` (the dedupe key: a re-produced row is identical)."""

    def __init__(self, stream: str, partition: int, lineage: str | None, window_s: float, ledger):
        self.stream, self.partition, self.lineage, self.window_s = stream, partition, lineage, window_s
        self.ledger = ledger

    def window_starts(self) -> WindowStarts:
        return WindowStarts(self.window_s)

    def _fields(self, r: dict, spent_through: float, iso: WindowStarts) -> dict:
        """The fields a partition adds to a block's row (all but ``row_id`` are the release's)."""
        lineage = {"lineage": self.lineage} if self.lineage else {}
        return {**lineage, "partition": self.partition, "window_start": iso[r.get("span_start_window", r["window"])],
                "window_end": iso[r["window"] + 1], "ledger_epsilon_spent": spent_through,
                # the budget in force at the release (a gap window released with a later one may be of a period
                # whose budget an accepted change has since raised: stream_anon.dp.transition)
                "ledger_epsilon_budget": r.get("ledger_epsilon_budget", self.ledger.epsilon_budget)}

    def _row_id_prefix(self, r: dict) -> str:
        # release: "<window>", or "<window>~<n>" for a paid re-release of a window re-closed with other content
        lineage = f"{self.lineage}/" if self.lineage else ""
        return f"{self.stream}/{lineage}p{self.partition}/{r['aggregate']}/{r['output']}/w{r['release']}/"

    def row(self, r: dict, spent_through: float, iso: WindowStarts | None = None) -> dict:
        """One row: a block's row (:meth:`ReleasedCells.rows`) plus the partition's fields and ``row_id``.
        ``iso``: window index -> ISO time of its start (a window's rows share a few)."""
        iso = self.window_starts() if iso is None else iso
        row = {**r, **self._fields(r, spent_through, iso)}
        row["row_id"] = self._row_id_prefix(r) + r["group_key"]
        return row

    def values(self, released: list, spent: dict, iso: WindowStarts, dumps) -> list[bytes]:
        """:meth:`row` of each row of the releases, serialized: per release its fields once, then each cell's
        (:meth:`ReleasedCells.cell_fragments`) and ``row_id``. ``spent``: window -> the ledger's total through it."""
        values = []
        for block in released:
            common = block.common
            head = dumps({**common, **self._fields(common, spent[common["window"]], iso)})[:-1] + b","
            id_head = b',"row_id":' + dumps(self._row_id_prefix(common))[:-1]     # a JSON string, still open
            values.extend([head + cell + id_head + key + b"}"
                           for cell, key in zip(block.cell_fragments(dumps), block.labels.key_tails)])
        return values


def rows_of(released: Iterable) -> list[dict]:
    """Rows of :meth:`~stream_anon.dp.aggregator.DPAggregator.release_columns`' output: each block's rows, events
    as they are."""
    rows: list[dict] = []
    for r in released:
        rows.extend(r.rows() if isinstance(r, ReleasedCells) else [r])
    return rows


# -- noise --------------------------------------------------------------------------------------------------------
class Releaser:
    """The noisy releases of one aggregator's aggregates (module docstring). ``labels``: each aggregate's
    :class:`~stream_anon.dp.cells.CellLabels`."""

    def __init__(self, seed: bytes, stream: str, labels: Callable[[AggregateSpec], CellLabels]):
        self.seed, self.stream, self.labels = seed, stream, labels
        self._generator = np.random.RandomState()       # re-seeded per release and component (:meth:`generator`)

    def generator(self, *labels) -> np.random.RandomState:
        """The generator of one (aggregate, component, output, release), valid until the next call.

        Seeded with an HMAC keyed by the secret seed: the noise is reproducible by the holder of the secret (a
        restarted worker) and unpredictable to anyone else. One generator re-seeded each time: the same stream
        as a new ``RandomState(digest)``, at a fourteenth of the cost (constructing one costs ~150 us)."""
        digest = hmac.new(self.seed, b"stream-anon/dp\x00" + "\x00".join(map(str, labels)).encode(),
                          hashlib.sha256).digest()
        self._generator.seed(np.frombuffer(digest, dtype=np.uint32))
        return self._generator

    def release(self, spec: AggregateSpec, plan: Plan, counters: dict, w: int, x: dict[str, np.ndarray],
                release: str, extra: dict | None = None) -> list[ReleasedCells]:
        """The release's blocks (one per output) of the bounded cell values ``x`` (component -> values per cell),
        through the aggregate's ``counters`` (:func:`new_counters`; they advance). ``release``: the ledger key of
        this release (``"<w>"``, or ``"<w>~<n>"`` for a paid re-release); the noise is drawn from it. ``extra``:
        fields for every row (the period's)."""
        noisy: dict[str, dict[str, np.ndarray]] = {"per_window": {}, "running": {}}
        info: dict[str, dict[str, dict]] = {"per_window": {}, "running": {}}
        for comp in spec.components:
            c = counters[comp]
            noise = spec.component_noise(comp)
            if "window" in c:
                pw = c["window"]
                pw.update(x[comp], self.generator(spec.name, comp, "window", release))
                noisy["per_window"][comp] = pw.last_window
                info["per_window"][comp] = {
                    "epsilon": pw.epsilon, "scale": pw.node_scale, "var": pw.window_variance(),
                    "half": _half(pw, 1, pw.epsilon), "method": "exact",
                    "mechanism": f"per_window/{noise}"}
                if plan.running_mechanism == "per_window":
                    noisy["running"][comp] = pw.running
                    info["running"][comp] = {
                        "epsilon": 0.0, "scale": pw.node_scale, "var": pw.running_variance(pw.t),
                        "half": _half(pw, pw.t, pw.epsilon),
                        "method": "exact" if pw.t == 1 else "normal", "mechanism": f"per_window/{noise}",
                        "windows": pw.t}
            if "running" in c:
                rc = c["running"]
                noisy["running"][comp] = rc.update(x[comp], self.generator(spec.name, comp, "running", release))
                var = rc.running_variance(rc.t)
                if isinstance(rc, BinaryTreeCounter):
                    terms = rc.running_terms(rc.t)
                    half = _half(rc, terms, rc.node_epsilon)
                    method = "exact" if terms == 1 else "normal"
                else:
                    half, method = Z95 * math.sqrt(var), "normal"
                info["running"][comp] = {"epsilon": rc.epsilon, "scale": rc.node_scale, "var": var, "half": half,
                                         "method": method, "mechanism": f"{rc.name}/{noise}", "windows": rc.t}
        blocks = []
        for output in ("per_window", "running"):
            if not noisy[output] or (output == "per_window" and spec.output == "running"):
                continue
            blocks.append(self._block(spec, w, output, noisy[output], info[output], plan, release, extra))
        return blocks

    def _block(self, spec, w, output, noisy, info, plan, release: str, extra: dict | None) -> ReleasedCells:
        comps = spec.components
        first = info[comps[0]]
        eps = sum(i["epsilon"] for i in info.values())
        common = {"type": "aggregate", "stream": self.stream, "window": w, "aggregate": spec.name,
                  "kind": spec.kind, "output": output, "mechanism": first["mechanism"],
                  "mechanism_reason": plan.reason, "epsilon": eps, "epsilon_window": plan.release_epsilon,
                  "max_contributions": spec.max_contributions}
        if output == "running":
            common["windows_covered"] = first["windows"]
            if eps == 0.0:
                common["epsilon_note"] = "post-processing of the per-window releases"
        if len(comps) == 1:
            half = first["half"]
            common.update({"noise_scale": first["scale"], "noise_std": math.sqrt(first["var"]),
                           "sensitivity": spec.component_sensitivity(comps[0]) * plan.sens_factor,
                           "noise_ci95": [-half, half], "ci95_method": first["method"]})
            values = np.asarray(noisy[comps[0]], dtype=float)
            shown = np.rint(values).astype(np.int64).tolist() \
                if spec.component_noise(comps[0]) == "geometric" else values.tolist()
            numbers = np.column_stack([values, values - half, values + half]).ravel().tolist()
            numbers[0::3] = shown
            layout = ONE_COMPONENT
        else:
            c0, c1 = comps
            common.update({"noise_scale": {c: info[c]["scale"] for c in comps},
                           "noise_std": {c: math.sqrt(info[c]["var"]) for c in comps},
                           "sensitivity": {c: spec.component_sensitivity(c) * plan.sens_factor for c in comps},
                           "ci95_method": "delta"})
            a = np.asarray(noisy[c0], dtype=float)
            b = np.asarray(noisy[c1], dtype=float)
            lo, hi = (0.0, 1.0) if spec.kind == "ratio" else (float(spec.lower), float(spec.upper))
            d = np.maximum(b, 1.0)
            r = np.clip(a / d, lo, hi)
            # delta method on the noise only: Var(a/b) ~ (Var a + r^2 Var b) / b^2 (post-processing)
            half = Z95 * np.sqrt(info[c0]["var"] + r * r * info[c1]["var"]) / d
            numbers = np.column_stack([r, a, b, -half, half, np.maximum(lo, r - half), np.minimum(hi, r + half),
                                       np.full(len(r), lo), np.full(len(r), hi)]).ravel().tolist()
            layout = two_components(c0, c1)
        common["release"] = release
        if extra:
            common.update(extra)
        return ReleasedCells(common, self.labels(spec), numbers, layout)


def _half(counter: _Counter, terms: int, epsilon: float) -> float:
    """95% half-width of the noise of a sum of ``terms`` draws of ``counter`` at ``epsilon``: exact for one draw,
    normal approximation for several (see :func:`stream_anon.dp.continual.sum_ci95_half_width`)."""
    if terms <= 0:
        return 0.0
    if terms == 1:
        if counter.noise == "geometric" and counter.resolution != 1.0:
            steps = round(float(counter.sensitivity) / counter.resolution)
            return noise_ci95_half_width("geometric", epsilon, steps) * counter.resolution
        return noise_ci95_half_width(counter.noise, epsilon, counter.sensitivity)
    return Z95 * math.sqrt(terms * counter.variance(epsilon))
