"""The report's plots: matplotlib figures rendered to SVG text, inlined into the page (no file, no network).

Each plot is a function ``figures -> SVG text | None`` (None: nothing to draw, e.g. no DP aggregates); every SVG
gets ids of its own (matplotlib's ``svg.hashsalt`` set to the plot's name) so several can live in one page. Text
stays text (``svg.fonttype = none``): the page is searchable and small.

What a reader must not misread: every plot area has one scale, in one unit (no twin axes: a limit drawn on the
right-hand scale read against the left-hand one looked like a breach), named in its SVG id
(``<plot>/<n>/axes/<unit>``); a limit or threshold line is drawn in the plot area of its unit, its id
``<plot>/<n>/ref/<x|y>/<value>``; tick labels never overprint (:func:`_thin_labels`); counts have integer ticks;
numbers are written by :mod:`stream_anon.numbers` (no scientific notation, shares as percentages).
tests/report/test_report_browser.py checks these in Chromium on what the page shows.
"""
from __future__ import annotations

import io
from datetime import datetime

import numpy as np

from stream_anon.numbers import plain

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
    fig.canvas.draw()           # lays the tick labels out where the SVG will draw them
    for i, ax in enumerate(fig.axes):
        _thin_labels(ax.xaxis)
        _thin_labels(ax.yaxis)
        for artist in [ax, *ax.lines]:      # ids unique in the page, by which readers find units and limits
            if artist.get_gid():
                artist.set_gid(f"{name}/{i}/{artist.get_gid()}")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"stream-anon-{name}"}):
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]          # no XML prolog or doctype inside HTML


def _times(values) -> list[datetime | None]:
    out: list[datetime | None] = []
    for v in values:
        try:
            out.append(datetime.fromisoformat(str(v)))
        except ValueError:
            out.append(None)
    return out


def _thin_labels(axis) -> None:
    """Hide tick labels until no two visible ones overlap, keeping every n-th (n the smallest that fits), as
    matplotlib's renderer laid them out (the figure drawn)."""
    labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    step = 1
    boxes = [t.get_window_extent() for t in labels]
    for step in range(1, len(labels) + 1):
        kept = boxes[::step]
        if not any(a.overlaps(b) for a, b in zip(kept, kept[1:])):
            break
    for i, t in enumerate(labels):
        t.set_visible(i % step == 0)


def _unit(ax, unit: str, percent: bool = False, integer: bool = False, axis: str = "y") -> None:
    """One scale per plot area, its unit (that of ``axis``, the value axis) named in the area's id; its tick
    labels plain numbers (percentages for a share, integers for a count)."""
    ax.set_gid(f"axes/{unit.replace(' ', '-')}")
    _ticks(ax.yaxis if axis == "y" else ax.xaxis, percent, integer)


def _ticks(axis, percent: bool = False, integer: bool = False) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter
    if integer:
        axis.set_major_locator(MaxNLocator(integer=True))
    axis.set_major_formatter(PercentFormatter(1.0, decimals=None) if percent else
                             FuncFormatter(lambda v, _pos: plain(float(v))))


def _ref(ax, axis: str, value: float, **style):
    """A limit or threshold line on the scale of its unit (``axis`` x or y of ``ax``)."""
    line = (ax.axhline if axis == "y" else ax.axvline)(value, **style)
    line.set_gid(f"ref/{axis}/{value!r}")
    return line


def _time_axis(ax) -> None:
    import matplotlib.dates as mdates
    locator = mdates.AutoDateLocator(maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
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
    _ref(ax, "x", k, color="#c44e52", linestyle="--", label=f"k = {k}")
    ax.set_xlabel("distinct individuals per class")
    ax.set_ylabel("classes")
    _unit(ax, "classes", integer=True)
    _ticks(ax.xaxis, integer=True)
    ax.set_title(f"Class sizes ({len(sizes)} classes)")
    ax.legend()
    return _svg(fig, "class-sizes")


def ncp_suppression(fig_data: dict, max_ratio: float) -> str | None:
    rel = [r for r in fig_data["releases"] if r["ncp_mean"] is not None]
    if not rel:
        return None
    plt = _plt()
    t = _times(r["window_start"] for r in rel)
    # two plot areas, one unit each: the suppression limit is read on the suppression scale only
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7, 4.4), sharex=True)
    ax.plot(t, [r["ncp_mean"] for r in rel], ".-", color="#1f77b4", label="NCP (mean of the release)")
    ax.set_ylabel("NCP")
    ax.set_ylim(0, min(1.0, max(r["ncp_mean"] for r in rel) * 1.15) or 1.0)
    _unit(ax, "NCP")
    ax.grid(alpha=0.3)
    ratios = [r["suppression_ratio"] or 0 for r in rel]
    bx.plot(t, ratios, "x", color="#d62728", label="suppressed / placed")
    _ref(bx, "y", max_ratio, color="#d62728", linestyle=":", label=f"max_suppression_ratio {max_ratio:.4g}")
    bx.set_ylabel("suppressed")
    bx.set_ylim(0, max([max_ratio] + ratios) * 1.25)
    _unit(bx, "share suppressed", percent=True)
    bx.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _time_axis(bx)
    ax.set_title(f"Information loss and suppression per release ({len(rel)} releases)")
    return _svg(fig, "ncp-suppression")


RISK_LABELS = {   # the page's summary rows name these figures alike
    "highest": "prosecutor risk, highest (1 / smallest class)",
    "average": "prosecutor risk, average (expected share re-identified)",
}


def marketer_label(journalist: bool) -> str:
    """The name of the marketer risk: with a declared population (``journalist`` figures) it is the journalist
    average, without one the prosecutor average (:mod:`stream_anon.risk.classes`); the page's summary row and the
    risk plot's legend both say it so."""
    return ("marketer risk = journalist average" if journalist else
            "marketer risk = prosecutor average") + " (expected share re-identified)"


def risk(fig_data: dict) -> str | None:
    per = fig_data["risk"]
    if not per:
        return None
    plt = _plt()
    t = _times(r["window_start"] for r in per)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    journalist = bool(per[0].get("journalist"))
    ax.plot(t, [r["prosecutor"]["highest"] for r in per], ".-", label=RISK_LABELS["highest"])
    ax.plot(t, [r["prosecutor"]["average"] for r in per], ".-",
            label=RISK_LABELS["average"] if journalist else marketer_label(False))
    if journalist:
        ax.plot(t, [r["journalist"]["average"] for r in per], ".-", label=marketer_label(True))
    threshold = per[0]["threshold"]
    _ref(ax, "y", threshold, color="grey", linestyle=":", label=f"threshold {plain(float(threshold))}")
    ax.set_ylabel("re-identification risk")
    ax.set_ylim(0, max(0.05, threshold * 1.15, max(r["prosecutor"]["highest"] for r in per) * 1.15))
    _unit(ax, "risk")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
    x = np.arange(len(periods))
    bottom = np.zeros(len(periods))
    for name in names:
        v = np.array([b["spent_by_period"][p]["aggregates"].get(name, 0.0) for p in periods])
        ax.bar(x, v, bottom=bottom, label=f"{name} (epsilon {plain(float(b['epsilon'][name]))})")
        bottom += v
    left = np.clip(b["budget"] - np.array([b["spent_by_period"][p]["total"] for p in periods]), 0, None)
    ax.bar(x, left, bottom=bottom, color="white", edgecolor="grey", hatch="//", label="left")
    _ref(ax, "y", b["budget"], color="black", linestyle=":",
         label=f"budget {plain(float(b['budget']))} per {b['period'] or 'run'}")
    ax.set_ylim(0, max(b["budget"], float(np.max(bottom + left))) * 1.12)
    ax.set_xticks(x, periods, fontsize=8)       # every period's label; _svg thins those that would overprint
    ax.set_ylabel(f"epsilon per {b['unit']}")
    _unit(ax, "epsilon")
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
    _unit(ax, "relative error")
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
    _unit(bx, "relative error")
    bx.grid(axis="y", alpha=0.3)
    return _svg(fig, "query-error")


def deadletters_alerts(fig_data: dict) -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.0))
    for ax, key, title in ((axes[0], "deadletters_by_reason", "Dead letters by reason"),
                           (axes[1], "alerts_by_name", "Alerts on anon.metrics by name")):
        items = sorted((fig_data.get(key) or {}).items(), key=lambda kv: kv[1])
        _unit(ax, "dead letters" if key.startswith("dead") else "alerts", integer=True, axis="x")
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
