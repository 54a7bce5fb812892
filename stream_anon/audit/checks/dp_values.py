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

import math
from collections import defaultdict
from typing import Any, TypedDict

import numpy as np

from ..check import AuditContext, ViolationLog
from ..dp_values import DPValues, bounded_values, calibration, noise_seed, noisy, partition_windows

REL_TOL = 1e-9


class _Stats(TypedDict, total=False):
    """The check's figures while it runs (``errors`` leaves them for ``realized_error`` at the end)."""
    rows_recomputed: int
    late_events: int
    largest_difference: float
    errors: dict[str, dict[str, list]]      # aggregate -> output -> [rows, sum of squared errors]


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
        dpv = ctx.config.dp_values
        assert dpv is not None                              # applies() holds
        # partition -> (aggregate, output, release) -> rows
        rows_by: defaultdict[Any, defaultdict[tuple, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for r in ctx.aggregates:
            rows_by[r.get("partition")][(r.get("aggregate"), r.get("output"), str(r.get("release")))].append(r)
        skipped: dict[str, int] = defaultdict(int)
        new_lineage = any((m.get("lineage_started") or {}).get("supersedes") for m in ctx.manifests
                          if isinstance(m.get("lineage_started"), dict))
        ends = {}
        stats: _Stats = {"rows_recomputed": 0, "late_events": 0, "largest_difference": 0.0}
        for partition, blocks in sorted(rows_by.items(), key=lambda kv: str(kv[0])):
            windows = [r["window"] for b in blocks.values() for r in b if isinstance(r.get("window"), int)]
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
                   skipped: dict, stats: _Stats) -> None:
        dead = {d.get("source", {}).get("offset") for d in ctx.deadletters
                if isinstance(d.get("source"), dict) and d["source"].get("partition") == partition
                and d["source"].get("index") is None}
        events = sorted(((raw.source[2], raw.event, raw.token) for raw in ctx.raws
                         if raw.source is not None and raw.source[1] == partition and raw.event is not None
                         and raw.source[2] not in dead and len(raw.source) == 3), key=lambda e: e[0])
        start = dpv.start_window
        first_row = min(r["window"] for b in blocks.values() for r in b)
        if start is not None and first_row != self._first_release(dpv, start):
            log.fail("schedule start", line=f"dp_values: partition {partition} publishes from window {first_row}, the "
                     f"schedule from {start}", partition=partition, first=first_row, start=start)
        seed = noise_seed(ctx.secret, dpv.stream, partition, lineage)
        # a release's truth is of the events that had arrived when it was made: the whole input, or the input up to
        # a flush (a window released by a flush's clock takes no later event)
        candidates = []
        for bound in [*flush_bounds(ctx, partition, events), None]:
            mine = events if bound is None else [e for e in events if e[0] <= bound]
            windows, late = partition_windows(mine, dpv)
            candidates.append(self._expected(dpv, windows, seed, start if start is not None else first_row, end))
        stats["late_events"] += late
        for key, rows in blocks.items():
            spec = dpv.aggregates.get(key[0])
            if spec is None or all(key not in c for c in candidates):
                log.fail("row outside the schedule", line=f"dp_values: partition {partition} {key[0]} {key[1]} "
                         f"release {key[2]}: {len(rows)} rows the schedule has no release for", partition=partition,
                         aggregate=key[0], release=key[2])
                continue
            if not str(rows[0].get("mechanism", "")).startswith("per_window"):
                skipped[f"mechanism {rows[0].get('mechanism')}"] += len(rows)
                continue
            self._block(log, partition, spec, key, rows, [c[key] for c in candidates if key in c], stats)

    @staticmethod
    def _first_release(dpv: DPValues, start: int) -> int:
        """The first window that holds a row: the first release of any aggregate from ``start``."""
        if dpv.period is None:
            return start
        _, first, n = dpv.period_bounds(start)
        return min(first + min(s.release_every, n) - 1 for s in dpv.aggregates.values())

    def _expected(self, dpv: DPValues, windows: dict, seed: bytes, first: int, end: int) -> dict:
        """(aggregate, output, release) -> group key -> (noisy components, bounded true components) of every
        release of the schedule from window ``first`` to ``end``, from ``windows`` (steps 2-4)."""
        period_mode = dpv.period is not None
        out: dict[tuple, dict] = {}
        state: dict[str, dict[str, dict]] = {}
        label: object = ()              # no period yet (a label is a str, or None in legacy mode)
        for w in range(first, end + 1):
            lab, first_w, n = dpv.period_bounds(w)
            if lab != label:            # a new period (legacy mode: one for the whole stream)
                state = {name: {"used": {}, "pending": {}, "running": {}, "true_running": {}}
                         for name in dpv.aggregates}
                label = lab
            for name, spec in dpv.aggregates.items():
                st = state[name]
                x = bounded_values(spec, windows.get(w, []), dpv.unit_field, st["used"],
                                   spec.max_windows if period_mode else None)
                for c, cells in x.items():
                    acc = st["pending"].setdefault(c, {})
                    for k, v in cells.items():
                        acc[k] = acc.get(k, 0.0) + v
                if period_mode and not ((w - first_w + 1) % spec.release_every == 0 or w - first_w == n - 1):
                    continue
                release, pending, st["pending"] = str(w), st["pending"], {}
                keys = spec.group_keys()
                eps, m = calibration(spec, period_mode)
                noisy_w: dict[str, np.ndarray] = {}
                true_w: dict[str, np.ndarray] = {}
                for comp in spec.components:
                    true_w[comp] = np.array([pending.get(comp, {}).get(k, 0.0) for k in keys])
                    noisy_w[comp] = noisy(seed, spec, comp, release, true_w[comp], eps, m)
                    for running, arr in ((st["running"], noisy_w[comp]), (st["true_running"], true_w[comp])):
                        running[comp] = arr if comp not in running else running[comp] + arr
                for output in ("per_window", "running"):
                    if spec.output not in (output, "both"):
                        continue
                    vals = noisy_w if output == "per_window" else dict(st["running"])
                    truth = true_w if output == "per_window" else dict(st["true_running"])
                    out[(name, output, release)] = {k: ({c: vals[c][i] for c in vals}, {c: truth[c][i] for c in truth})
                                                    for i, k in enumerate(keys)}
        return out

    def _block(self, log, partition, spec, key, rows: list, candidates: list, stats: _Stats) -> None:
        """One release's rows against the recomputed cells of each candidate truth (a row passes with any)."""
        name, output, release = key
        cells = candidates[0]
        by_key = defaultdict(list)
        for r in rows:
            by_key[r.get("group_key")].append(r)
        missing = [k for k in cells if k not in by_key]
        if missing:
            log.fail("cells missing", line=f"dp_values: partition {partition} {name} {output} release {release}: "
                     f"{len(missing)} of {len(cells)} cells missing", partition=partition, aggregate=name,
                     release=release)
        for gk, cell_rows in by_key.items():
            if gk not in cells:
                log.fail("row outside the schedule", line=f"dp_values: partition {partition} {name} {output} release "
                         f"{release}: cell {gk!r} is not in the configured domain", partition=partition,
                         aggregate=name, release=release, group_key=gk)
                continue
            if len(cell_rows) > 1:
                log.fail("second row for a cell", line=f"dp_values: partition {partition} {name} {output} release "
                         f"{release} cell {gk}: {len(cell_rows)} rows (row ids "
                         f"{sorted(str(r.get('row_id')) for r in cell_rows)[:3]}): a second draw", partition=partition,
                         aggregate=name, release=release, group_key=gk)
            for r in cell_rows:
                match = next((c[gk] for c in candidates if _matches(spec, r, c[gk][0])), None)
                if match is None:
                    self._differs(log, partition, spec, output, release, gk, r, candidates[-1][gk][0], stats)
                else:
                    stats["rows_recomputed"] += 1
                    _note_error(stats, spec, output, r, match[1])

    @staticmethod
    def _differs(log, partition, spec, output, release, gk, row, want: dict, stats: _Stats) -> None:
        shown = _shown(spec, want)
        try:
            diff = abs(float(row.get("value")) - float(shown["value"]))
            stats["largest_difference"] = max(stats["largest_difference"], diff)
        except (TypeError, ValueError):
            pass
        got = {**(row.get("components") or {}), "value": row.get("value")} if len(spec.components) > 1 \
            else row.get("value")
        log.fail("value differs", line=f"dp_values: partition {partition} {spec.name} {output} release {release} "
                 f"cell {gk}: published {got} != recomputed {shown if len(spec.components) > 1 else shown['value']} "
                 f"(row {row.get('row_id')})", partition=partition, aggregate=spec.name, release=release,
                 group_key=gk)


def _shown(spec, want: dict) -> dict:
    """The row's numbers as the worker shows them: the value (a geometric count rounded), and for a mean or ratio
    its components and the clipped ratio."""
    comps = spec.components
    if len(comps) == 1:
        v = want[comps[0]]
        return {"value": float(np.rint(v)) if spec.noise == "geometric" else float(v)}
    a, b = float(want[comps[0]]), float(want[comps[1]])
    lo, hi = (0.0, 1.0) if spec.kind == "ratio" else (spec.lower, spec.upper)
    return {comps[0]: a, comps[1]: b, "value": min(max(a / max(b, 1.0), lo), hi)}


def _matches(spec, row: dict, want: dict) -> bool:
    shown = _shown(spec, want)
    if len(spec.components) == 1:
        return _close(row.get("value"), shown["value"])
    components = row.get("components")
    parts = components if isinstance(components, dict) else {}
    return all(_close(parts.get(c), shown[c]) for c in spec.components) and _close(row.get("value"), shown["value"])


def flush_bounds(ctx, partition, events: list) -> list[int]:
    """The last input offset each flush of the partition had read (manifests with ``flushed``): the largest offset
    of the events resolved in its releases or before them (a flush resolves every record it holds)."""
    seq_of = {m.get("release_id"): m.get("seq") for m in ctx.manifests if m.get("partition") == partition}
    flushes = sorted({m.get("seq") for m in ctx.manifests if m.get("partition") == partition and m.get("flushed")
                      and isinstance(m.get("seq"), int)})
    if not flushes:
        return []
    resolved: dict[str, int] = {}                 # token -> seq of the release that resolved it
    for r in ctx.records:
        s = seq_of.get(r.get("release_id"))
        if s is not None and r.get("audit_token"):
            resolved[r["audit_token"]] = s
    for m in ctx.manifests:
        if m.get("partition") == partition and isinstance(m.get("seq"), int):
            for tokens in (m.get("suppressed_tokens") or {}).values():
                for t in tokens:
                    resolved[t] = m["seq"]
    out = []
    for f in flushes:
        offsets = [off for off, _, token in events if resolved.get(token, math.inf) <= f]
        if offsets:
            out.append(max(offsets))
    return sorted(set(out))


def _true_value(spec, truth: dict) -> float:
    """What a row's ``value`` estimates, from the bounded true components: the count or sum, or the clipped
    ratio of a mean or ratio."""
    comps = spec.components
    if len(comps) == 1:
        return float(truth[comps[0]])
    lo, hi = (0.0, 1.0) if spec.kind == "ratio" else (spec.lower, spec.upper)
    return min(max(truth[comps[0]] / max(truth[comps[1]], 1.0), lo), hi)


def _note_error(stats: _Stats, spec, output: str, row: dict, truth: dict) -> None:
    try:
        err = float(row["value"]) - float(_true_value(spec, truth))
    except (KeyError, TypeError, ValueError):       # no value (KeyError), null or not a number
        return
    acc = stats.setdefault("errors", {}).setdefault(spec.name, {}).setdefault(output, [0, 0.0])
    acc[0] += 1
    acc[1] += err * err


def realized_error(errors: dict) -> dict:
    """Aggregate -> output -> (rows, RMSE of the published values against the recomputed bounded true values:
    the error the noise made, per partition's row)."""
    return {name: {o: {"rows": n, "rmse": round((sq / n) ** 0.5, 6) if n else None} for o, (n, sq) in outs.items()}
            for name, outs in errors.items()}

