"""``stream-anon report`` without a broker: the worker core's outputs for the bundled Citi Bike stream (no DP) handed
to :func:`stream_anon.report.build_report` as the audit takes them. The figures against independent counts (risk per
release from each class's individuals recounted here, the placed events), what the DPO summary says of fields,
retention and settings, and a release made under other settings."""
from __future__ import annotations

import copy
import json
import math
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from stream_anon import contract, crypto
from stream_anon.audit import AuditOutputs
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.worker.core import WorkerCore
from stream_anon.render import TOPICS
from stream_anon.report import build_report
from stream_anon.report.page import PLOTS

SECRET = b"report-unit-secret-0123456789abcdef"
N = 2500


@pytest.fixture(scope="module")
def run():
    path = contract.config_path("citibike")
    cfg = load_config(path)
    events = load_events("citibike", limit=N)
    events[0]["signals"]["trip_duration_s"] = -5          # outside its domain: one dead letter
    core = WorkerCore(cfg, "app", SECRET)
    out = core.handle([(0, i, orjson.dumps(e)) for i, e in enumerate(events)]) + core.flush_all()
    outputs, metrics = AuditOutputs(), []
    parts = {TOPICS.records(cfg.stream.name): outputs.records, TOPICS.releases: outputs.manifests,
             TOPICS.deadletter: outputs.deadletters, TOPICS.metrics: metrics}
    for topic, _key, value in out:
        parts[topic].append(json.loads(value))
    raw = [((cfg.stream.input_topic, 0, i), orjson.dumps(e)) for i, e in enumerate(events)]
    return path, cfg, events, raw, outputs, metrics


@pytest.fixture(scope="module")
def page(run):
    path, _, _, raw, outputs, metrics = run
    return build_report(path, raw, outputs, SECRET, metrics)


def test_risk_per_release_from_the_classes_individuals(run, page):
    _, cfg, events, _, outputs, _ = run
    unit = {crypto.audit_token(SECRET, e["event_id"]): e["vehicle_id"] for e in events}
    so_far, highest = defaultdict(set), {}
    for m in sorted(outputs.manifests, key=lambda m: m["seq"]):
        mine = [r for r in outputs.records if r["release_id"] == m["release_id"]]
        for r in mine:
            so_far[r["class_id"]].add(unit[r["audit_token"]])
        sizes = [len(so_far[c]) for c in {r["class_id"] for r in mine}]
        if sizes:
            highest[m["release_id"]] = round(1 / min(sizes), 6)
    got = {r["release_id"]: r["prosecutor"]["highest"] for r in page.figures["risk"]}
    assert got == highest and len(got) > 20
    assert page.summary["risk"]["prosecutor_highest"] == max(highest.values()) <= 1 / cfg.anonymization.k


def test_figures_count_what_the_audit_counted(page):
    a = page.audit.summary
    assert a["events_in"] == N and a["dead_lettered"] == 1
    assert sum(r["published"] for r in page.figures["releases"]) == a["published"]
    assert len(page.figures["class_sizes"]) == a["classes"] and min(page.figures["class_sizes"]) == a["min_individuals"]
    q = page.figures["query_error"]
    assert q["events"] == a["published"] + a["suppressed"] and "dp" not in q
    assert page.figures["deadletters_by_reason"] == page.audit.health["deadletters_by_reason"]
    assert page.figures["dp_budget"] is None


def test_every_plot_but_the_dp_budget_is_drawn_for_a_stream_without_dp(page):
    for pid, _, _ in PLOTS:
        drawn = f'<figure id="plot-{pid}"><h3>' in page.html
        assert drawn
        assert (f'data-empty="{pid}"' in page.html) == (pid == "dp-budget"), pid
    assert page.html.count("<svg") == len(PLOTS) - 1


def test_the_summary_says_what_leaves_and_for_how_long(run, page):
    _, cfg, _, _, _, _ = run
    s = page.summary
    fields = {f["field"]: f for f in s["fields"]}
    assert fields["latitude, longitude"]["form"].startswith("generalized with its class: a latitude/longitude box")
    assert "one of 2 declared values" in fields["payload.usertype"]["form"]
    assert fields["vehicle_id"]["topic"] == "none" and fields["trip_id"]["form"] == "removed; never published"
    retention = {r["topic"]: r for r in s["retention"]}
    assert retention[cfg.stream.input_topic]["declared"].startswith("not declared")
    assert retention["anon.deadletter"]["retention"].startswith("30 days")
    assert s["statement"] == {"purpose": None, "controller": None, "recipients": [], "retention": None}
    assert s["guarantees"]["releases_match"] and s["guarantees"]["key_ids"] == {crypto.key_id(SECRET): len(
        page.figures["releases"]) + 1}        # every manifest and the dead letter


def test_a_release_made_under_other_settings_shows_its_fingerprint(run, page):
    from types import SimpleNamespace

    from stream_anon.report.page import render
    from stream_anon.report.summary import guarantees_in_force
    _, cfg, _, _, outputs, _ = run
    manifests = copy.deepcopy(outputs.manifests)
    manifests[0]["settings_fingerprint"] = "sha256:0000000000000000"
    g = guarantees_in_force(cfg, SimpleNamespace(manifests=manifests, deadletters=[]))
    assert not g["releases_match"] and g["releases_by_fingerprint"]["sha256:0000000000000000"] == 1
    assert g["releases_by_fingerprint"][g["fingerprint"]] == len(manifests) - 1
    html = render({**page.summary, "guarantees": g}, page.figures, {})
    assert "releases carry other fingerprints: " in html and "sha256:0000000000000000 (1)" in html


# ------------------------------------------------------------------------------------------------ a DP stream
def _worker_run(cfg, events):
    """The worker core's outputs for ``events`` on partition 0, as the audit takes them."""
    core = WorkerCore(cfg, "app", SECRET)
    out = core.handle([(0, i, orjson.dumps(e)) for i, e in enumerate(events)]) + core.flush_all()
    outputs, metrics = AuditOutputs(), []
    parts = {TOPICS.records(cfg.stream.name): outputs.records, TOPICS.releases: outputs.manifests,
             TOPICS.deadletter: outputs.deadletters, TOPICS.metrics: metrics, TOPICS.aggregates: outputs.aggregates}
    for topic, _key, value in out:
        parts[topic].append(json.loads(value))
    raw = [((cfg.stream.input_topic, 0, i), orjson.dumps(e)) for i, e in enumerate(events)]
    return raw, outputs, metrics


@pytest.fixture(scope="module")
def dp_page():
    """oyster-cards (five aggregates: hourly counts, daily mean, histogram and ratio): a third of the first day's
    events and 200 of the second's, which close the first day's daily releases."""
    path = contract.config_path("oyster-cards")
    cfg = load_config(path)
    by_day: dict[str, list] = defaultdict(list)
    for e in load_events("oyster-cards"):
        by_day[e["event_time"][:10]].append(e)
    first, second = sorted(by_day)[:2]
    events = by_day[first][::3] + by_day[second][:200]
    raw, outputs, metrics = _worker_run(cfg, events)
    return cfg, outputs, build_report(path, raw, outputs, SECRET, metrics), events


def test_the_dp_section_lists_every_aggregate_of_the_config(dp_page):
    """Each aggregate of the config has its entry and its row in the page's DP table, with the number of merged
    rows it published (recounted here from the aggregates topic), whatever its kind and output."""
    from stream_anon.dp.merge import merge_rows
    cfg, outputs, page, _ = dp_page
    names = [s.name for s in cfg.dp.aggregates]
    assert len(names) == 5
    dp = page.figures["query_error"]["dp"]
    assert list(dp) == names
    merged = merge_rows(outputs.aggregates)
    for s in cfg.dp.aggregates:
        e = dp[s.name]
        output = "per_window" if s.output in ("per_window", "both") else "running"
        assert e["kind"] == s.kind and e["output"] == output
        assert e["rows"] == sum(m["aggregate"] == s.name and m["output"] == output for m in merged) > 0, s.name
        assert e["realized"]["rmse"] is not None and e["noise_rms"] > 0
    table = page.html[page.html.index("<h3>DP aggregates</h3>"):]
    table = table[:table.index("</table>")]
    assert [n for n in names if f"<tr><td>{n}</td>" in table] == names


def _parents(tree, parent=None, out=None) -> dict:
    """Label -> parent label of the hierarchy file's tree (dicts of lists of leaves)."""
    out = {} if out is None else out
    if isinstance(tree, dict):
        for label, sub in tree.items():
            out[label] = parent
            _parents(sub, label, out)
    else:
        for leaf in tree:
            out[leaf] = parent
    return out


def test_the_realized_noise_is_measured_against_the_bounded_truth_recounted_from_the_raw_topic(dp_page):
    """``tap_ins_zone_hour`` (tap-ins per fare zone, released hourly: 4 windows of 15 min; each card at most one
    tap-in per window and its first 4 windows of the day) recounted here in plain Python from the raw events: the
    report's realized noise of its per-window rows is the RMSE against that recount."""
    cfg, outputs, page, events = dp_page
    parent = _parents(json.loads((Path(cfg.source).parent / "hierarchies" / "oyster_location.json")
                                 .read_text())["tree"])
    used: dict = defaultdict(int)                               # (day, card) -> windows used
    per_window: dict = defaultdict(list)
    for e in events:
        if e["event_type"] == "tap_in" and e.get("station") in parent:
            t = datetime.fromisoformat(e["event_time"]).timestamp()
            per_window[int(t // 900)].append(e)
    counts: dict = defaultdict(float)
    for w in sorted(per_window):
        day = datetime.fromtimestamp(w * 900, timezone.utc).date()   # London is UTC in November
        seen = set()
        for e in per_window[w]:
            card = e["card_id"]
            if card in seen:
                continue
            if used[(day, card)] >= 4:
                continue
            used[(day, card)] += 1
            seen.add(card)
            release = w - w % 4 + 3                                   # the hour's last window
            counts[(release, parent[e["station"]])] += 1
    errors = [r["value"] - counts[(r["window"], r["group_key"])] for r in outputs.aggregates
              if r["aggregate"] == "tap_ins_zone_hour" and r["output"] == "per_window"]
    want = math.sqrt(sum(x * x for x in errors) / len(errors))
    got = page.figures["query_error"]["dp"]["tap_ins_zone_hour"]["realized_noise"]
    assert got["rows"] == len(errors) > 100
    assert got["rmse"] == pytest.approx(want, abs=1e-6)
    assert "realized noise (per partition)" in page.html


def test_the_share_published_as_the_whole_domain_is_recounted_from_the_records(run, page):
    """Issue 46: per quasi-identifier (times aside), the share of published records whose value covers the
    declared bounds, over the run, recounted here from the records and the TOML's bounds; on the page as a table."""
    path, _, _, _, outputs, _ = run
    import tomllib
    qis = {q["name"]: q for q in tomllib.loads(Path(path).read_text())["quasi_identifiers"]
           if q["kind"] != "timestamp"}

    def whole(q, v):
        if q["kind"] == "geopoint":
            return (v["lat"][0] <= q["lower"][0] and v["lat"][1] >= q["upper"][0]
                    and v["lon"][0] <= q["lower"][1] and v["lon"][1] >= q["upper"][1])
        return v["from"] <= q["lower"] and v["to"] >= q["upper"]

    shares = {name: round(sum(whole(q, r["qi"][name]) for r in outputs.records) / len(outputs.records), 6)
              for name, q in qis.items()}
    got = {row["qi"]: row["whole_domain"] for row in page.figures["generalization"]}
    assert got == shares and any(shares.values())
    assert "Generalization per quasi-identifier" in page.html


def _report_import_closure() -> dict[str, set[str]]:
    """Third-party top-level module -> the stream_anon modules that import it, over every module the report's
    package imports (followed through stream_anon's own modules; imports inside functions included)."""
    import ast
    import sys

    pkg_root = Path(__file__).resolve().parents[2]

    def file_of(module: str) -> Path | None:
        base = pkg_root.joinpath(*module.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.is_file():
                return p
        return None

    todo = [f"stream_anon.report.{p.stem}" if p.stem != "__init__" else "stream_anon.report"
            for p in (pkg_root / "stream_anon" / "report").glob("*.py")]
    seen, third = set(), defaultdict(set)
    while todo:
        module = todo.pop()
        path = file_of(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "stream_anon":
                    todo.append(name)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    third[top].add(module)
    return third


def test_the_report_needs_nothing_outside_its_extras():
    """``pip install 'stream-anon[service,report]'`` runs ``stream-anon report`` (it reads Kafka and draws plots):
    every third-party module the report's code reaches is provided by a distribution named in ``[project]
    dependencies`` or those two extras."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    core = {canonicalize_name(Requirement(r).name) for r in [*pyproject["project"]["dependencies"],
                                                             *pyproject["project"]["optional-dependencies"]["service"],
                                                             *pyproject["project"]["optional-dependencies"]["report"]]}
    provided = metadata.packages_distributions()
    third = _report_import_closure()
    assert "numpy" in third and "matplotlib" in third        # the walk reaches the plots' imports
    missing = {top: sorted(users) for top, users in third.items()
               if not {canonicalize_name(d) for d in provided.get(top, ())} & core}
    assert not missing, f"imported by the report but in neither the core nor its extras: {missing}"
