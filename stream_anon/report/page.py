"""The report as one self-contained HTML page: inline CSS, inline SVG plots, no script, no link to anything
outside the file. Every figure the summary states is in an element with ``data-figure="<name>"`` (the value as
the audit reports it), and the whole summary and the figures are embedded as JSON (``<script
type="application/json" id="report-data">``, data only: nothing runs) for tools that read the page.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from html import escape

from stream_anon.numbers import plain, risk, share

from .plots import RISK_LABELS, marketer_label

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:1100px;color:#222;
line-height:1.4;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.25rem;margin-top:2rem;border-bottom:1px solid #ddd}
h3{font-size:1.05rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}
td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}th{background:#f3f3f3}
.verdict{display:inline-block;padding:.2rem .6rem;border-radius:.3rem;font-weight:bold;color:#fff}
.PASSED{background:#2e7d32}.FAILED{background:#c62828}.NOT{background:#ef6c00}
figure{margin:1rem 0 2rem}figcaption{font-size:.85rem;color:#555;max-width:60rem}
figure svg{max-width:100%;height:auto}.muted{color:#777}code{background:#f5f5f5;padding:0 .2rem}
"""

PLOTS = (  # (id, title, caption)
    ("class-sizes", "Class sizes",
     "Distinct individuals behind each published class over all the releases it appears in (the audit's count; "
     "the dashed line is k)."),
    ("ncp-suppression", "Information loss and suppression over time",
     "Per release: mean normalized certainty penalty of its real records (0: exact, 1: the whole domain), and "
     "below, on a scale of its own, the share of the events it placed that it suppressed; the dotted line there is "
     "max_suppression_ratio."),
    ("risk", "Re-identification risk over time",
     "Per release, over its own individuals, each at risk 1/f, f the individuals of its class (a reused class "
     "counts every individual published in it so far): the prosecutor's highest risk 1/min f and average (the "
     "expected share of the release's individuals re-identified), and the journalist's average against a declared "
     "[risk] population; the marketer risk is the journalist average with a population, the prosecutor average "
     "without one. The dotted line is [risk] threshold."),
    ("dp-budget", "DP budget per period",
     "Per period: the epsilon the worst unit can have been charged per aggregate, recomputed by the audit from "
     "the rows' declared noise, and what is left of the period's budget."),
    ("query-error", "Query error",
     "The analyst's workload (area x hour, station x hour, product x day range counts, seeded cells drawn from "
     "the events): mean relative error per release and per family over the run, for the published records and "
     "for offline Mondrian on the same events per window and on the whole table."),
    ("deadletters-alerts", "Dead letters and alerts by reason",
     "Dead letters (deduplicated by source offset) by the kind of their reason, and alert messages on "
     "anon.metrics by name (a new stream's first lineage_started is expected, not counted)."),
)


def _fig(name: str, value, fmt=plain) -> str:
    """A figure as a person reads it (``fmt``: :mod:`stream_anon.numbers`), its exact value in ``data-value``."""
    return (f'<span data-figure="{escape(name)}" data-value="{escape(json.dumps(value, default=str))}">'
            f"{escape(fmt(value) if value is not None else '-')}</span>")


def _cell(v) -> str:
    return "-" if v is None else plain(v, 4) if isinstance(v, float) else str(v)


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    head = "".join(f"<th>{escape(title)}</th>" for _, title in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(r.get(key)))}</td>" for key, _ in columns) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def at_risk_sentence(k, threshold) -> str:
    """What the share at risk means, and why it is 100% by construction when k < 1 / threshold."""
    if not threshold:
        return "Every individual with any risk counts as at risk ([risk] threshold 0)."
    below = 1 / threshold
    text = (f"An individual is at risk when its risk 1/f is above the threshold {plain(float(threshold))}, i.e. "
            f"its class holds fewer than {plain(float(below))} individuals")
    if k is not None and k < below:
        return text + (f"; with k = {k} below {plain(float(below))}, a class can meet k and still be at risk, so the "
                       f"share is 100% whenever every class holds fewer than {plain(float(below))}: expected, not a "
                       f"fault (raise k, or set [risk] threshold = {plain(1 / k)}, for a share that tells classes "
                       "apart).")
    return text + "."


def _summary_html(s: dict) -> str:
    c = s["counts"]
    parts = ['<table><tr><th>figure (audit)</th><th>value</th></tr>']
    for key, label in (("events_in", "events in"), ("published", "published"), ("suppressed", "suppressed"),
                       ("dead_lettered", "dead-lettered"), ("deferred", "deferred"), ("open", "in open windows"),
                       ("lost", "lost"), ("releases", "releases"), ("classes", "classes"),
                       ("min_individuals", "smallest class (individuals)"), ("k", "k")):
        parts.append(f"<tr><td>{label}</td><td>{_fig(key, c.get(key))}</td></tr>")
    ncp = s.get("ncp") or {}
    parts.append(f"<tr><td>NCP of published records, mean / p95</td><td>{_fig('ncp_mean', ncp.get('mean'))} / "
                 f"{_fig('ncp_p95', ncp.get('p95'))}</td></tr>")
    r = s["risk"]
    p = r.get("prosecutor") or {}
    where = f" (in {escape(str(r['highest_release']))})" if r.get("highest_release") else ""
    rows = [(RISK_LABELS["highest"] + ", of any release", _fig("prosecutor_highest", r.get("prosecutor_highest"),
                                                                risk) + where),
            (RISK_LABELS["average"], _fig("prosecutor_average", p.get("average"), risk)),
            (f"share of individuals at risk (records_at_risk: risk above {plain(r.get('threshold'))})",
             _fig("records_at_risk", p.get("records_at_risk"), share))]
    j = r.get("journalist")
    if r.get("marketer") is not None:
        rows.append((marketer_label(bool(j)), _fig("marketer", r["marketer"], risk)))
    if j:
        rows += [("journalist risk, highest / average", f"{_fig('journalist_highest', j.get('highest'), risk)} / "
                                                        f"{_fig('journalist_average', j.get('average'), risk)}"),
                 ("journalist share of individuals at risk", _fig("journalist_records_at_risk",
                                                                 j.get("records_at_risk"), share)),
                 ("population uniqueness (largest share of a release's population unique)",
                  _fig("population_uniqueness_max", j.get("population_uniqueness_max"), share))]
    for label, value in rows:
        parts.append(f"<tr><td>{escape(label)}</td><td>{value}</td></tr>")
    parts.append(f'<tr><td colspan="2" class="muted" data-figure-note="records_at_risk">Over '
                 f"{r.get('releases', 0)} releases, averages weighted by their individuals. "
                 f"{escape(at_risk_sentence(c.get('k'), r.get('threshold')))}</td></tr>")
    if r.get("intersection_risk") is not None:
        parts.append(f"<tr><td>cross-release intersection attack (m-invariance): risk 1 / smallest candidate set"
                     f"</td><td>{_fig('intersection_risk', r['intersection_risk'], risk)}</td></tr>")
    if s.get("dp"):
        parts.append(f"<tr><td>DP: worst unit's charge in a period / budget</td><td>"
                     f"{_fig('dp_worst_unit_charge', s['dp']['worst_unit_charge'])} / {plain(s['dp']['budget'])}</td></tr>")
    if s.get("query_error"):
        q = s["query_error"]
        parts.append("<tr><td>query error over the run (mean relative): streaming / offline same windows / "
                     f"offline whole table</td><td>{_fig('query_error_streaming', q['streaming']['mean'])} / "
                     f"{_fig('query_error_offline_windows', q.get('offline_windows', {}).get('mean'))} / "
                     f"{_fig('query_error_offline_table', q.get('offline_table', {}).get('mean'))}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def _dpo_html(s: dict) -> str:
    g = s["guarantees"]
    unit = s["unit_of_privacy"]
    st = s["statement"]
    match = ("every release carries this fingerprint" if g["releases_match"] else
             "releases carry other fingerprints: " + ", ".join(f"{k} ({v})" for k, v in
                                                             g["releases_by_fingerprint"].items()) or "no release")
    out = ["<h3>Unit of privacy</h3><p>", f"Records: k is counted in distinct <code>{escape(unit['records'])}</code>.",
           f" DP aggregates: epsilon per {escape(unit['dp'])}." if unit["dp"] else "", "</p>",
           "<h3>Guarantees in force</h3><ul>", "".join(f"<li>{escape(x)}</li>" for x in g["lines"]), "</ul>",
           f"<p>Settings fingerprint of this configuration: {_fig('settings_fingerprint', g['fingerprint'])} "
           f"({g['settings']} settings; {escape(match)}). Key ids: ",
           escape(", ".join(f"{k} ({v} messages)" for k, v in g["key_ids"].items()) or "none carried"), ".",
           (" Settings changed and accepted during the run: " + escape("; ".join(g["settings_changed"])) + "."
            if g["settings_changed"] else ""), "</p>",
           "<h3>What leaves the system, and in which form</h3>",
           _table(s["fields"], [("field", "field"), ("role", "role"), ("topic", "where"), ("form", "form")]),
           "<h3>What dead letters hold</h3>", f"<p>{escape(s['deadletters']['hold'])}.</p>",
           _table([{"reason": k, "count": v} for k, v in s["deadletters"]["by_reason"].items()]
                  or [{"reason": "none in this run", "count": 0}], [("reason", "reason"), ("count", "dead letters")]),
           "<h3>Retention</h3>",
           _table(s["retention"], [("topic", "topic"), ("holds", "holds"), ("retention", "kept (topic plan)"),
                                   ("broker", "kept (the broker states)"), ("declared", "declared limit")]),
           "<h3>Declared by the deployment ([report])</h3><table>"]
    for key in ("purpose", "controller", "recipients", "retention"):
        v = st.get(key)
        v = ", ".join(v) if isinstance(v, list) else v
        out.append(f"<tr><th>{key}</th><td>{escape(v) if v else '<span class=muted>not stated</span>'}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _errors_html(figures: dict) -> str:
    q = figures.get("query_error")
    if not q:
        return "<p class=muted>No placed events: no query error.</p>"
    rows = []
    for v, summ in q["run"].items():
        for fam, x in summ.items():
            rows.append({"variant": v, "family": fam, **x})
    out = [f"<p>{sum(q['workload']['queries'].values())} queries (seed {q['workload']['seed']}) over "
           f"{q['events']:,} placed events; e.g. " +
           escape("; ".join(x for ex in q["workload"]["examples"].values() for x in ex[:1])) + ".</p>",
           _table(rows, [("variant", "release"), ("family", "family"), ("queries", "queries"), ("mean", "mean"),
                         ("median", "median"), ("p90", "p90")])]
    dp = q.get("dp")
    if dp:
        drows = []
        for name, e in dp.items():
            realized = e.get("realized") or {}
            by = "; ".join(f">= {t['min_true_count']}: median {t['median_relative_error']:.3f} over {t['cells']} cells"
                           for t in realized.get("by_threshold") or () if t["median_relative_error"] is not None)
            drows.append({"aggregate": name, "kind": f"{e['kind']}, {e['output']}", "unit": e["unit"],
                          "rows": e["rows"] or "none published", "noise": e["noise_rms"],
                          "stated": e["stated_half_width"], "stated_rel": e["stated_relative"],
                          "noise_real": (e.get("realized_noise") or {}).get("rmse"),
                          "rmse": realized.get("rmse"), "realized": by or None})
        out += ["<h3>DP aggregates</h3><p>Every aggregate of the configuration. Stated: the root mean square of "
                "the rows' noise standard deviations and the median half-width of their 95% intervals (in the "
                "aggregate's unit, and for counts and sums relative to the released value); realized noise: the "
                "RMSE of each partition's published values against the audit's recomputed bounded true values "
                "(the error the noise made; check dp_values); realized RMSE: the merged values against the "
                "unbounded true values of the raw topic's placed events (noise plus what contribution bounds and "
                "clamping cut), and for per-window counts the relative error over cells with at least 10 and 1 "
                "true events.</p>",
                _table(drows, [("aggregate", "aggregate"), ("kind", "kind, rows measured"), ("unit", "unit"),
                               ("rows", "merged rows"), ("noise", "stated noise (RMS std)"),
                               ("stated", "stated +-"), ("stated_rel", "stated relative"),
                               ("noise_real", "realized noise (per partition)"),
                               ("rmse", "realized RMSE (merged, vs unbounded)"),
                               ("realized", "realized relative error")])]
    return "".join(out)


def _generalization_html(figures: dict) -> str:
    rows = figures.get("generalization") or []
    if not rows:
        return ""
    return ("<h3>Generalization per quasi-identifier</h3><p>The share of published records whose value is the "
            "whole domain (it tells an analyst nothing of that attribute) over the run and in the release where "
            "it is highest; for a position published as H3 cells, the mean resolution of the cells (the whole "
            "domain left out) and the position NCP, the published cell's area over the domain's (1: the whole "
            "domain).</p>" +
            _table(rows, [("qi", "quasi-identifier"), ("whole_domain", "whole domain (run)"),
                          ("whole_domain_highest_release", "whole domain (highest release)"),
                          ("mean_resolution", "mean H3 resolution"), ("position_ncp", "position NCP")]))


def render(summary: dict, figures: dict, svgs: dict[str, str | None]) -> str:
    """The page: ``svgs`` maps each plot id of :data:`PLOTS` to its SVG (None: nothing to plot, said in words)."""
    verdict = summary["verdict"] or ""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    plots = []
    for pid, title, caption in PLOTS:
        svg = svgs.get(pid)
        body = svg if svg else f'<p class="muted" data-empty="{pid}">Nothing to plot for this stream.</p>'
        plots.append(f'<figure id="plot-{pid}"><h3>{escape(title)}</h3>{body}'
                     f"<figcaption>{escape(caption)}</figcaption></figure>")
        if pid == "query-error":
            plots.append(_errors_html(figures))
        if pid == "ncp-suppression":
            plots.append(_generalization_html(figures))
    data = json.dumps({"summary": summary, "figures": figures}, default=str).replace("</", "<\\/")
    reason = f" ({escape(summary['verdict_reason'])})" if summary.get("verdict_reason") else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>stream-anon report: '
            f"{escape(summary['stream'])}</title><style>{CSS}</style></head><body>"
            f"<h1>stream-anon report: {escape(summary['stream'])}</h1>"
            f'<p>Generated {when} from the output topics and the raw topic. Audit verdict: '
            f'<span class="verdict {escape(verdict.split()[0])}" data-figure="verdict">{escape(verdict)}</span>'
            f"{reason}</p><h2>Summary</h2>{_summary_html(summary)}"
            f"<h2>For the data protection officer</h2>{_dpo_html(summary)}"
            f"<h2>Figures</h2>{''.join(plots)}"
            f'<script type="application/json" id="report-data">{data}</script></body></html>')
