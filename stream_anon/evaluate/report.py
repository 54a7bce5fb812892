"""Outputs of ``stream-anon evaluate``: the results table in Markdown, PNG plots against k, ``results.json``, and the
comparison table of a user's own stream.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stream_anon.evaluate.batch import BASELINES

TABLE_COLUMNS = (("dataset", "dataset", "{}"), ("strategy", "strategy", "{}"), ("k", "k", "{}"),
                 ("ncp", "NCP", "{:.4f}"), ("ncp_released", "NCP (released)", "{:.4f}"),
                 ("suppression_ratio", "suppression", "{:.4f}"), ("min_k", "min k", "{}"),
                 ("classes", "classes", "{}"), ("runtime_s", "runtime s", "{:.2f}"),
                 ("count_query_error", "COUNT err", "{:.3f}"), ("kpi_error", "KPI err", "{:.4f}"),
                 ("aoi_compromised", "AOI compromised", "{}"), ("aoi_max_recall", "AOI max recall", "{:.3f}"),
                 ("aoi_mean_recall", "AOI mean recall", "{:.3f}"), ("criteria_held", "criteria held", "{}"),
                 ("unmet_by_table", "unmet by the whole table", "{}"), ("error", "error", "{}"))


def markdown_table(rows: list[dict]) -> str:
    cols = [c for c in TABLE_COLUMNS if any(c[0] in r for r in rows)]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            if key == "aoi_compromised" and v is not None:
                cells.append(f"{v}/{r['aoi_individuals']}")
            elif v is None or (isinstance(v, float) and not np.isfinite(v)) or v == []:
                cells.append("-")
            elif isinstance(v, list):
                cells.append(", ".join(map(str, v)))
            else:
                cells.append(fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path) -> list[Path]:
    """PNG plots against k per strategy; baselines without k (raw) as dashed horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [("ncp_vs_k.png", [("ncp", "NCP (suppressed = 1)")], "information loss"),
               ("suppression_vs_k.png", [("suppression_ratio", "suppression ratio")], "suppression"),
               ("count_query_error_vs_k.png", [("count_query_error", "mean relative error")], "COUNT-query error"),
               ("aoi_recall_vs_k.png", [("aoi_mean_recall", "mean recall"), ("aoi_max_recall", "max recall")],
                "AOI homogeneity attack (Privacy Demonstrator)")]
    written = []
    datasets = sorted({r["dataset"] for r in rows})
    for fname, metrics, title in figures:
        if not any(metrics[0][0] in r for r in rows):
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
        for ax, (key, label) in zip(axes[0], metrics):
            for strategy in dict.fromkeys(r["strategy"] for r in rows):
                pts = sorted((r["k"], r[key]) for r in rows
                             if r["strategy"] == strategy and r["k"] is not None and r.get(key) is not None)
                flat = [r[key] for r in rows if r["strategy"] == strategy and r["k"] is None and key in r]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=strategy,
                            linestyle="--" if strategy in BASELINES else "-")
                for v in flat:
                    ax.axhline(v, color="grey", linestyle=":", label=f"{strategy}")
            ax.set_xlabel("k (distinct individuals per class)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{title}: {', '.join(datasets)}")
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def write_outputs(rows: list[dict], out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=_json_default) + "\n")
    (out / "results.md").write_text(markdown_table(rows))
    return [out / "results.json", out / "results.md", *plot(rows, out)]


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    raise TypeError(f"not JSON serializable: {type(v).__name__}")


def _fmt(v, f="{:.4f}"):
    return "-" if v is None else f.format(v)


def comparison_table(rows: list[dict]) -> str:
    lines = ["| strategy | k | records | streaming NCP | streaming suppression | releases | offline Mondrian, "
             "same windows | offline Mondrian, whole table | query error: streaming / same windows / whole table "
             "| error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        errors = " / ".join(_fmt(r.get(f"{v}_query_error"), "{:.3f}")
                            for v in ("streaming", "offline_windows", "offline_table"))
        lines.append(f"| {r['strategy']} | {r['k']} | {r['n']} | {_fmt(r.get('streaming_ncp'))} | "
                     f"{_fmt(r.get('streaming_suppression_ratio'))} | {r.get('streaming_releases', '-')} | "
                     f"{_fmt(r['offline_mondrian_windows_ncp'])} | {_fmt(r['offline_mondrian_table_ncp'])} | "
                     f"{errors} | {r.get('error', '')} |")
    return "\n".join(lines) + "\n"
