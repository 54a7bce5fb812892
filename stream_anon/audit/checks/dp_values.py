"""Check ``dp_values``: every published DP row is the audit's own recomputation (:mod:`..dp_values`: the bounded
true value from the raw topic plus the noise the secret determines), and the rows that exist are exactly the
schedule's (every partition from the start's period to one common last window, every cell of each release).

Findings, one line each: ``value differs`` (a value, a component or the shown ratio is not the recomputed one: noise
lowered or removed, a value changed), ``second row for a cell`` (another row id for the same cell of a release: a
second draw the ledger never charged), ``row outside the schedule`` (a release, a window or a cell the schedule does
not have), ``schedule start`` (a partition's rows do not start at the schedule's first window), ``schedule end``
(partitions end at different windows), ``cells missing`` (a release with some of its cells). Figures: rows
recomputed, rows not recomputed and why (``not_recomputed``), late events, the largest difference.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..check import AuditContext, ViolationLog
from ..dp_values import DPValues, bounded_values, calibration, noise_seed, noisy, partition_windows

REL_TOL = 1e-9


def _close(a, b) -> bool:
    try:
        return abs(float(a) - float(b)) <= REL_TOL * max(1.0, abs(float(b)))
    except (TypeError, ValueError):
        return False


class DPValuesCheck:
    name = "dp_values"

    def applies(self, ctx: AuditContext) -> bool:
        return ctx.config.dp_values is not None and bool(ctx.aggregates)

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        dpv: DPValues = ctx.config.dp_values
        rows_by = defaultdict(lambda: defaultdict(list))     # partition -> (aggregate, output, release) -> rows
        for r in ctx.aggregates:
            rows_by[r.get("partition")][(r.get("aggregate"), r.get("output"), str(r.get("release")))].append(r)
        skipped: dict[str, int] = defaultdict(int)
        new_lineage = any((m.get("lineage_started") or {}).get("supersedes") for m in ctx.manifests
                          if isinstance(m.get("lineage_started"), dict))
        ends = {}
        stats = {"rows_recomputed": 0, "late_events": 0, "largest_difference": 0.0}
        for partition, blocks in sorted(rows_by.items(), key=lambda kv: str(kv[0])):
            windows = [r.get("window") for b in blocks.values() for r in b if isinstance(r.get("window"), int)]
            if not windows:
                continue
            ends[partition] = max(windows)
            lineage = next((r.get("lineage") for b in blocks.values() for r in b), None)
            n_rows = sum(len(b) for b in blocks.values())
            if new_lineage:
                skipped["a lineage that superseded another (its input may start mid-topic)"] += n_rows
                continue
            if any(r.get("settings_changed") for b in blocks.values() for r in b) or \
                    any(m.get("settings_changed") for m in ctx.manifests if m.get("partition") == partition):
                skipped["a partition whose rows state an accepted settings change"] += n_rows
                continue
            self._partition(ctx, dpv, log, partition, lineage, blocks, max(windows), skipped, stats)
        if len(set(ends.values())) > 1:
            log.fail("schedule end", line=f"dp_values: partitions end at different windows {dict(sorted(ends.items(), key=str))}: "
                     f"the schedule follows one clock", ends={str(k): v for k, v in ends.items()})
        errors = stats.pop("errors", {})
        log.details.update(**stats, not_recomputed=dict(skipped), rows=len(ctx.aggregates),
                           realized_error=realized_error(errors))
        return log.result()

    def _partition(self, ctx, dpv: DPValues, log: ViolationLog, partition, lineage, blocks: dict, end: int,
                   skipped: dict, stats: dict) -> None:
        dead = {d.get("source", {}).get("offset") for d in ctx.deadletters
                if isinstance(d.get("source"), dict) and d["source"].get("partition") == partition
                and d["source"].get("index") is None}
        events = sorted(((raw.source[2], raw.event, raw.token) for raw in ctx.raws
                         if raw.source is not None and raw.source[1] == partition and raw.event is not None
                         and raw.source[2] not in dead and len(raw.source) == 3), key=lambda e: e[0])
        windows, late = partition_windows(events, dpv)
        stats["late_events"] += late
        seed = noise_seed(ctx.secret, dpv.stream, partition, lineage)
        start = dpv.start_window
        first_row = min(r["window"] for b in blocks.values() for r in b)
        if start is not None and first_row != self._first_release(dpv, start):
            log.fail("schedule start", line=f"dp_values: partition {partition} publishes from window {first_row}, the "
                     f"schedule from {start}", partition=partition, first=first_row, start=start)
        period_mode = dpv.period is not None
        state: dict = {}
        label = None
        expected_blocks = set()
        for w in range(start if start is not None else first_row, end + 1):
            lab, first, n = dpv.period_bounds(w)
            if lab != label or not period_mode:
                if lab != label:
                    state = {name: {"used": {}, "pending": {}, "running": {}} for name in dpv.aggregates}
                label = lab
            for name, spec in dpv.aggregates.items():
                st = state[name]
                x = bounded_values(spec, windows.get(w, []), dpv.unit_field, st["used"],
                                   spec.max_windows if period_mode else None)
                if not period_mode:
                    st["pending"] = x
                else:
                    for c, cells in x.items():
                        acc = st["pending"].setdefault(c, {})
                        for k, v in cells.items():
                            acc[k] = acc.get(k, 0.0) + v
                if period_mode and not ((w - first + 1) % spec.release_every == 0 or w - first == n - 1):
                    continue
                release = str(w)
                pending, st["pending"] = st["pending"], {}
                outputs = [o for o in ("per_window", "running")
                           if spec.output == o or spec.output == "both"]
                for output in outputs:
                    expected_blocks.add((name, output, release))
                self._release(log, partition, spec, release, pending, st, blocks, outputs, seed, period_mode,
                              skipped, stats)
        for key, rows in blocks.items():
            if key not in expected_blocks:
                log.fail("row outside the schedule", line=f"dp_values: partition {partition} {key[0]} {key[1]} "
                         f"release {key[2]}: {len(rows)} rows the schedule has no release for", partition=partition,
                         aggregate=key[0], release=key[2])

    @staticmethod
    def _first_release(dpv: DPValues, start: int) -> int:
        """The first window that holds a row: the first release of any aggregate from ``start``."""
        if dpv.period is None:
            return start
        _, first, n = dpv.period_bounds(start)
        return min(first + min(s.release_every, n) - 1 for s in dpv.aggregates.values())

    def _release(self, log, partition, spec, release, pending: dict, st: dict, blocks: dict, outputs, seed,
                 period_mode: bool, skipped: dict, stats: dict) -> None:
        keys = spec.group_keys()
        eps, m = calibration(spec, period_mode)
        window_values, true_values = {}, {}
        for comp in spec.components:
            x = np.array([pending.get(comp, {}).get(k, 0.0) for k in keys])
            true_values[comp] = x
            window_values[comp] = noisy(seed, spec, comp, release, x, eps, m)
            run = st["running"].get(comp)
            st["running"][comp] = window_values[comp] if run is None else run + window_values[comp]
            st.setdefault("true_running", {})[comp] = x if run is None else st["true_running"][comp] + x
        for output in outputs:
            rows = blocks.get((spec.name, output, release))
            if not rows:
                continue                              # a stopped aggregate publishes nothing (its budget)
            if not str(rows[0].get("mechanism", "")).startswith("per_window"):
                skipped[f"mechanism {rows[0].get('mechanism')}"] += len(rows)
                continue
            values = window_values if output == "per_window" else {c: st["running"][c] for c in spec.components}
            truth = true_values if output == "per_window" else {c: st["true_running"][c] for c in spec.components}
            by_key = defaultdict(list)
            for r in rows:
                by_key[r.get("group_key")].append(r)
            missing = [k for k in keys if k not in by_key]
            if missing:
                log.fail("cells missing", line=f"dp_values: partition {partition} {spec.name} {output} release "
                         f"{release}: {len(missing)} of {len(keys)} cells missing", partition=partition,
                         aggregate=spec.name, release=release)
            index = {k: i for i, k in enumerate(keys)}
            for gk, cell_rows in by_key.items():
                if gk not in index:
                    log.fail("row outside the schedule", line=f"dp_values: partition {partition} {spec.name} "
                             f"{output} release {release}: cell {gk!r} is not in the configured domain",
                             partition=partition, aggregate=spec.name, release=release, group_key=gk)
                    continue
                i = index[gk]
                if len(cell_rows) > 1:
                    log.fail("second row for a cell", line=f"dp_values: partition {partition} {spec.name} {output} "
                             f"release {release} cell {gk}: {len(cell_rows)} rows (row ids "
                             f"{sorted(str(r.get('row_id')) for r in cell_rows)[:3]}): a second draw", partition=partition,
                             aggregate=spec.name, release=release, group_key=gk)
                for r in cell_rows:
                    self._compare(log, partition, spec, output, release, gk, r, {c: values[c][i] for c in values},
                                  stats)
                    _note_error(stats, spec, output, r, {c: truth[c][i] for c in truth})

    @staticmethod
    def _compare(log, partition, spec, output, release, gk, row, want: dict, stats: dict) -> None:
        comps = spec.components
        if len(comps) == 1:
            exp = want[comps[0]]
            ok = _close(row.get("value"), np.rint(exp) if spec.noise == "geometric" else exp)
            got, shown = row.get("value"), exp
        else:
            a, b = want[comps[0]], want[comps[1]]
            lo, hi = (0.0, 1.0) if spec.kind == "ratio" else (spec.lower, spec.upper)
            ratio = min(max(a / max(b, 1.0), lo), hi)
            parts = row.get("components") if isinstance(row.get("components"), dict) else {}
            ok = _close(parts.get(comps[0]), a) and _close(parts.get(comps[1]), b) and _close(row.get("value"), ratio)
            got, shown = {**parts, "value": row.get("value")}, {comps[0]: a, comps[1]: b, "value": ratio}
        if ok:
            stats["rows_recomputed"] += 1
            return
        try:
            diff = abs(float(row.get("value")) - float(shown if len(comps) == 1 else shown["value"]))
            stats["largest_difference"] = max(stats["largest_difference"], diff)
        except (TypeError, ValueError):
            pass
        log.fail("value differs", line=f"dp_values: partition {partition} {spec.name} {output} release {release} "
                 f"cell {gk}: published {got} != recomputed {shown} (row {row.get('row_id')})", partition=partition,
                 aggregate=spec.name, release=release, group_key=gk)


def _true_value(spec, truth: dict) -> float:
    """What a row's ``value`` estimates, from the bounded true components: the count or sum, or the clipped
    ratio of a mean or ratio."""
    comps = spec.components
    if len(comps) == 1:
        return float(truth[comps[0]])
    lo, hi = (0.0, 1.0) if spec.kind == "ratio" else (spec.lower, spec.upper)
    return min(max(truth[comps[0]] / max(truth[comps[1]], 1.0), lo), hi)


def _note_error(stats: dict, spec, output: str, row: dict, truth: dict) -> None:
    try:
        err = float(row.get("value")) - float(_true_value(spec, truth))
    except (TypeError, ValueError):
        return
    acc = stats.setdefault("errors", {}).setdefault(spec.name, {}).setdefault(output, [0, 0.0])
    acc[0] += 1
    acc[1] += err * err


def realized_error(errors: dict) -> dict:
    """Aggregate -> output -> (rows, RMSE of the published values against the recomputed bounded true values:
    the error the noise made, per partition's row)."""
    return {name: {o: {"rows": n, "rmse": round((sq / n) ** 0.5, 6) if n else None} for o, (n, sq) in outs.items()}
            for name, outs in errors.items()}

