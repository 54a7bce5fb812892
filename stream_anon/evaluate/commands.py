"""The bodies of ``stream-anon evaluate``: a bundled dataset (:func:`run`) or your own file through a stream config
(:func:`run_own`): load, evaluate, write.
"""
from __future__ import annotations

import json
from pathlib import Path

from stream_anon.evaluate.batch import BASELINES, evaluate
from stream_anon.evaluate.own_stream import offline_mondrian, read_own_events, streaming_ncp
from stream_anon.evaluate.report import _fmt, _json_default, comparison_table, write_outputs
from stream_anon.evaluate.tables import load_table, table_from_events
from stream_anon.evaluate.utility import placement_from_engine, query_error

def run(dataset: str, strategies: list[str], ks: list[int], out: str | Path, l: int | None = None,
        full: bool = False, limit: int | None = None, encoding: str = "hierarchy", seed: int = 0,
        baselines=BASELINES, progress=print, fit_time_bounds: bool = False) -> list[dict]:
    """Load, evaluate, write: the body of ``stream-anon evaluate``."""
    if any(k < 1 for k in ks):
        raise ValueError(f"evaluate: every k must be >= 1, got {ks}")
    if l is not None and l < 1:
        raise ValueError(f"evaluate: l must be >= 1, got {l}")
    table = load_table(dataset, full=full, limit=limit, encoding=encoding, fit_time_bounds=fit_time_bounds)
    rows = evaluate(table, strategies, ks, l=l, seed=seed, baselines=baselines, progress=progress)
    write_outputs(rows, out)
    return rows


def run_own(config_path, file, strategies: list[str], ks: list[int], out, seed: int = 0,
            baselines=BASELINES, progress=print, allow_outside_paths: bool = False) -> dict:
    """``stream-anon evaluate --config C --file F``: the file through the config's mapping; per k, the streaming
    engine with each strategy against offline Mondrian on the same windows and on the whole table (NCP with the
    engine's definition, suppressed records at 1, and the mean relative error of the analyst's workload,
    :func:`stream_anon.evaluate.utility.query_error`, whose figures per family and release go to
    ``query_error.json``); plus the batch rows of :func:`evaluate` on the whole table."""
    from stream_anon.config import ConfigError, load_config

    config = load_config(config_path, allow_outside_paths)
    checked = read_own_events(config, file)
    events = checked.events
    table = table_from_events(config.stream.name, config, events)
    progress(f"{file}: {checked.events_in} events, {checked.n_rejected} rejected by the worker's input checks"
             f"{rejected_text(checked.rejected)}; {table.n} in the table")
    comparison, query_errors = [], []
    for k in ks:
        off_w = offline_mondrian(table, k, config.anonymization.window_s, seed)
        off_t = offline_mondrian(table, k, None, seed)
        offline_error = None
        for name in strategies:
            row = {"strategy": name, "k": k, "n": table.n, "windows": off_w["windows"],
                   "offline_mondrian_windows_ncp": off_w["ncp"], "offline_mondrian_table_ncp": off_t["ncp"],
                   "offline_mondrian_windows_suppression": off_w["suppression_ratio"]}
            try:
                cfg = config.replace_anonymization(strategy=name, k=k)
                s = streaming_ncp(cfg, events)
                row.update({f"streaming_{key}": v for key, v in s.items()})
                # the analyst's workload on the same events: offline Mondrian's answers once per k
                q = query_error(cfg, placement_from_engine(cfg, events), seed=seed, offline=offline_error is None)
                offline_error = offline_error or {v: q["run"][v] for v in ("offline_windows", "offline_table")}
                q["run"].update(offline_error)
                row.update({f"{v}_query_error": q["run"][v]["all"]["mean"] for v in q["run"]})
                query_errors.append({"strategy": name, "k": k, **q})
            except (ConfigError, ValueError) as exc:
                row["error"] = str(exc)
            comparison.append(row)
            progress(_own_summary(row))
    rows = evaluate(table, strategies, ks, seed=seed, baselines=baselines, progress=progress)
    written = write_outputs(rows, out)
    out = Path(out)
    (out / "comparison.json").write_text(json.dumps(comparison, indent=1, default=_json_default) + "\n")
    (out / "comparison.md").write_text(comparison_table(comparison))
    checks = {"file": str(file), "events_in": checked.events_in, "accepted": len(events),
              "rejected": checked.n_rejected, "rejected_by_reason": dict(checked.rejected.most_common())}
    (out / "input_checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    (out / "query_error.json").write_text(json.dumps(query_errors, indent=1, default=_json_default) + "\n")
    return {"comparison": comparison, "rows": rows, "input_checks": checks, "query_errors": query_errors,
            "written": written + [out / "comparison.json", out / "comparison.md", out / "input_checks.json",
                                  out / "query_error.json"]}


def rejected_text(by_reason) -> str:
    """`` (reason n, ...)`` of the rejected events, most frequent first; empty when none.

    >>> rejected_text({"sensitive full_fare_pence": 9, "malformed JSON": 1})
    ' (sensitive full_fare_pence 9, malformed JSON 1)'
    """
    ranked = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return f" ({', '.join(f'{reason} {n}' for reason, n in ranked)})" if ranked else ""


def _own_summary(row: dict) -> str:
    if "error" in row:
        return f"{row['strategy']} k={row['k']}: error: {row['error']}"
    return (f"{row['strategy']} k={row['k']}: streaming ncp={_fmt(row['streaming_ncp'])} "
            f"(supp {_fmt(row['streaming_suppression_ratio'])}, {row['streaming_releases']} releases) | offline "
            f"Mondrian same windows ncp={_fmt(row['offline_mondrian_windows_ncp'])} "
            f"({row['windows']} windows), whole table ncp={_fmt(row['offline_mondrian_table_ncp'])}; query error "
            f"{_fmt(row.get('streaming_query_error'))} | {_fmt(row.get('offline_windows_query_error'))} | "
            f"{_fmt(row.get('offline_table_query_error'))}")
