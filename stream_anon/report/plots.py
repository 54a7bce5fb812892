"""The report's plots: matplotlib figures rendered to SVG text, inlined into the page (no file, no network).

Each plot is a function ``figures -> SVG text | None`` (None: nothing to draw, e.g. no DP aggregates); every SVG
gets ids of its own (matplotlib's ``svg.hashsalt`` set to the plot's name) so several can live in one page. Text
stays text (``svg.fonttype = none``): the page is searchable and small.
"""
from __future__ import annotations

import io
from datetime import datetime

import numpy as np

COLORS = {"streaming": "#1f77b4", "offline_windows": "#ff7f0e", "offline_table": "#2ca02c"}
VARIANT_LABELS = {"streaming": "streaming releases", "offline_windows": "offline Mondrian, same windows",
                  "offline_table": "offline Mondrian, whole table"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _svg(fig, name: str) -> str:
    import matplotlib
    plt = _plt()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"stream-anon-{name}"}):
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]          # no XML prolog or doctype inside HTML


def _times(values) -> list:
    out = []
    for v in values:
        try:
            out.append(datetime.fromisoformat(str(v)))
        except ValueError:
            out.append(None)
    return out


def _time_axis(ax) -> None:
    import matplotlib.dates as mdates
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(mdates.AutoDateLocator()))
    ax.grid(alpha=0.3)


def class_sizes(fig_data: dict, k: int) -> str | None:
    sizes = fig_data["class_sizes"]
    if not sizes:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    top = max(sizes)
    bins = np.arange(0.5, top + 1.5, max(1, (top + 39) // 40))
    ax.hist(sizes, bins=bins, color="#4c72b0")
    ax.axvline(k, color="#c44e52", linestyle="--", label=f"k = {k}")
    ax.set_xlabel("distinct individuals per class")
    ax.set_ylabel("classes")
    ax.set_title(f"Class sizes ({len(sizes)} classes)")
    ax.legend()
    return _svg(fig, "class-sizes")


def ncp_suppression(fig_data: dict, max_ratio: float) -> str | None:
    rel = [r for r in fig_data["releases"] if r["ncp_mean"] is not None]
    if not rel:
        return None
    plt = _plt()
    t = _times(r["window_start"] for r in rel)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(t, [r["ncp_mean"] for r in rel], ".-", color="#1f77b4", label="NCP (mean of the release)")
    ax.set_ylabel("NCP")
    ax2 = ax.twinx()
    ax2.plot(t, [r["suppression_ratio"] or 0 for r in rel], "x", color="#d62728", label="suppression ratio")
    ax2.axhline(max_ratio, color="#d62728", linestyle=":", label=f"max_suppression_ratio {max_ratio:g}")
    ax2.set_ylabel("suppressed / placed")
    ax2.set_ylim(0, max([max_ratio] + [r["suppression_ratio"] or 0 for r in rel]) * 1.25)
    lines = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
    ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.12, 1.0))
    _time_axis(ax)
    ax.set_title(f"Information loss and suppression per release ({len(rel)} releases)")
    return _svg(fig, "ncp-suppression")


def risk(fig_data: dict) -> str | None:
    per = fig_data["risk"]
    if not per:
        return None
    plt = _plt()
    t = _times(r["window_start"] for r in per)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(t, [r["prosecutor"]["highest"] for r in per], ".-", label="prosecutor, highest (1 / smallest class)")
    ax.plot(t, [r["prosecutor"]["average"] for r in per], ".-", label="prosecutor, average (= marketer)")
    if per[0].get("journalist"):
        ax.plot(t, [r["journalist"]["average"] for r in per], ".-", label="journalist, average")
    ax.axhline(per[0]["threshold"], color="grey", linestyle=":", label=f"threshold {per[0]['threshold']:g}")
    ax.set_ylabel("re-identification risk")
    ax.set_ylim(0, max(0.05, max(r["prosecutor"]["highest"] for r in per) * 1.15))
    ax.legend(fontsize=8)
    _time_axis(ax)
    ax.set_title("Re-identification risk per release")
    return _svg(fig, "risk")


def dp_budget(fig_data: dict) -> str | None:
    b = fig_data.get("dp_budget")
    if not b or not b["spent_by_period"]:
        return None
    plt = _plt()
    periods = list(b["spent_by_period"])
    names = list(b["epsilon"])
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = np.zeros(len(periods))
    for name in names:
        v = np.array([b["spent_by_period"][p]["aggregates"].get(name, 0.0) for p in periods])
        ax.bar(periods, v, bottom=bottom, label=f"{name} (epsilon {b['epsilon'][name]:g})")
        bottom += v
    left = np.clip(b["budget"] - np.array([b["spent_by_period"][p]["total"] for p in periods]), 0, None)
    ax.bar(periods, left, bottom=bottom, color="white", edgecolor="grey", hatch="//", label="left")
    ax.axhline(b["budget"], color="black", linestyle=":", label=f"budget {b['budget']:g} per {b['period'] or 'run'}")
    ax.set_ylabel(f"epsilon per {b['unit']}")
    ax.set_title("DP budget per period: worst unit's charge per aggregate (audit)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(fig, "dp-budget")


def query_error(fig_data: dict) -> str | None:
    q = fig_data.get("query_error")
    if not q or not q["per_release"]:
        return None
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    per = [r for r in q["per_release"] if r["streaming"]["all"]["mean"] is not None]
    t = _times(r["window_start"] for r in per)
    for v in q["run"]:
        ax.plot(t, [r[v]["all"]["mean"] for r in per], ".-" if v == "streaming" else ".:", color=COLORS[v],
                label=VARIANT_LABELS[v])
    ax.set_ylabel("mean relative error")
    ax.set_title("Workload error per release")
    ax.legend(fontsize=7)
    _time_axis(ax)
    families = q["workload"]["families"]
    x = np.arange(len(families))
    width = 0.8 / max(1, len(q["run"]))
    for i, v in enumerate(q["run"]):
        ax_vals = [q["run"][v][f]["mean"] or 0 for f in families]
        bx.bar(x + i * width, ax_vals, width, color=COLORS[v], label=VARIANT_LABELS[v])
    bx.set_xticks(x + width * (len(q["run"]) - 1) / 2, families, fontsize=8)
    bx.set_title("Over the run, per query family")
    bx.grid(axis="y", alpha=0.3)
    return _svg(fig, "query-error")


def deadletters_alerts(fig_data: dict) -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.0))
    for ax, key, title in ((axes[0], "deadletters_by_reason", "Dead letters by reason"),
                           (axes[1], "alerts_by_name", "Alerts on anon.metrics by name")):
        items = sorted((fig_data.get(key) or {}).items(), key=lambda kv: kv[1])
        if items:
            ax.barh([k for k, _ in items], [v for _, v in items], color="#8172b2")
            for i, (_, v) in enumerate(items):
                ax.text(v, i, f" {v}", va="center", fontsize=8)
        else:
            ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
        ax.set_title(title)
        ax.tick_params(axis="y", labelsize=8)
    return _svg(fig, "deadletters-alerts")
