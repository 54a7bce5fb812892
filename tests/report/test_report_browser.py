"""``stream-anon report`` end to end: the bundled oyster-cards stream with its DP aggregates (as ``stream-anon
demo --dataset oyster-cards --dp`` runs it), a few events dead-lettered on purpose, its raw events on the real
(embedded Tansu) broker and the worker core's outputs of the same messages produced to the output topics (the
worker's transactions are not what this test is about; the report's reads are); then ``stream-anon audit --report``
and ``stream-anon report`` on those topics, and the page opened in a real headless Chromium (Debian's chromium and
chromium-driver, driven by selenium): it loads with no console error, every plot is drawn, the summary's figures
are the audit's, and nothing is fetched."""
from __future__ import annotations

import json
import re
import shutil
import tomllib

import pytest

from stream_anon import contract
from stream_anon.calibrate import toml_text
from stream_anon.cli import main
from stream_anon.config import with_files_beside
from stream_anon.datasets import load_events
from stream_anon.audit.kafka_source import read_topic
from stream_anon.config import load_config
from stream_anon.worker.core import WorkerCore
from stream_anon.kafka.replay import replay
from stream_anon.kafka.retention import confluent_admin, set_topic_retention
from stream_anon.kafka.topics import ensure_topics
from stream_anon.report.page import PLOTS

pytestmark = pytest.mark.one_broker        # its broker tests on one broker (tests/conftest.py)

N_EVENTS = 2000
SECRET = "report-browser-secret-0123456789abcdef"
NAME = "rcards"
STATEMENT = {"purpose": "fare planning from anonymized taps", "controller": "Transit Authority <dpo@example.org>",
             "recipients": ["planning team", "open data portal"], "retention": "records 2 years, raw 7 days"}


def _config(tmp_path):
    """The bundled oyster-cards config with its DP aggregates, under a stream name of its own and a [report]."""
    src = contract.config_path("oyster-cards")
    raw = tomllib.loads(src.read_text())
    with_files_beside(raw, src.parent, tmp_path)
    raw["stream"].update(name=NAME, input_topic=f"raw.test.{NAME}", input_retention_s=604800)
    raw["report"] = STATEMENT
    path = tmp_path / f"{NAME}.toml"
    path.write_text(toml_text(raw))
    return path, raw


@pytest.fixture(scope="module")
def published(module_broker, tmp_path_factory):
    """(config path, audit JSON, report JSON, HTML path) of one run."""
    import os
    tmp = tmp_path_factory.mktemp("report")
    os.environ["STREAM_ANON_SECRET"] = secret = SECRET
    try:
        path, raw = _config(tmp)
        topic = raw["stream"]["input_topic"]
        ensure_topics(module_broker.bootstrap, names=[topic, f"anon.{NAME}.records", "anon.releases", "anon.deadletter",
                                               "anon.metrics", "anon.aggregates"],
                      default_partitions={topic: 1, f"anon.{NAME}.records": 1})
        set_topic_retention(confluent_admin(module_broker.bootstrap), topic, 3_600_000)   # 1 h, within the declared 7 days
        events = load_events("oyster-cards", limit=N_EVENTS)
        for e in events[:5]:        # five fares outside the declared domain: five dead letters
            e["full_fare_pence"] = 99999
        replay(module_broker.bootstrap, topic, events, "card_id", progress=False, secret=secret.encode())
        # the worker core on the raw topic's messages as they were produced (one partition, offsets 0..N-1)
        read = read_topic(module_broker.bootstrap, topic, idle_s=1.0)
        assert [src[2] for src, _ in read] == list(range(N_EVENTS))
        cfg = load_config(path)
        core = WorkerCore(cfg, f"{NAME}-app", secret.encode())
        out = core.handle([(p, off, value) for (_, p, off), value in read]) + core.flush_all()
        by_topic: dict = {}
        for out_topic, key, value in out:
            by_topic.setdefault(out_topic, []).append((key, value))
        for out_topic, pairs in by_topic.items():
            replay(module_broker.bootstrap, out_topic, [], None, progress=False, raw_payloads=pairs)
        common = ["--config", str(path), "--broker", module_broker.bootstrap, "--idle", "1"]
        assert main(["audit", *common, "--report", str(tmp / "audit.json")]) == 0
        html = tmp / "report.html"
        assert main(["report", *common, "--out", str(html), "--json", str(tmp / "report.json")]) == 0
        return path, json.loads((tmp / "audit.json").read_text()), json.loads((tmp / "report.json").read_text()), html
    finally:
        os.environ.pop("STREAM_ANON_SECRET", None)


def test_the_page_is_self_contained(published):
    _, _, _, html = published
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") == len(PLOTS)
    # nothing fetched: no external reference, no script that runs, no stylesheet or image link
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", text)
    assert "<link" not in text and "<img" not in text and "<iframe" not in text
    assert re.findall(r"<script[^>]*>", text) == ['<script type="application/json" id="report-data">']


def test_report_figures_are_the_audits(published):
    _, audit, report, _ = published
    s, a = report["summary"], audit["summary"]
    assert a["events_in"] == N_EVENTS and a["dead_lettered"] == 5 and audit["verdict"] == "PASSED"
    assert s["verdict"] == audit["verdict"]
    assert s["counts"] == {k: a.get(k) for k in s["counts"]}
    assert s["ncp"] == audit["health"]["ncp"] and s["class_individuals"] == audit["health"]["class_individuals"]
    assert s["deadletters"]["by_reason"] == audit["health"]["deadletters_by_reason"]
    assert sum(s["deadletters"]["by_reason"].values()) == 5
    assert s["dp"]["worst_unit_charge"] == audit["checks"]["dp"]["worst_unit_charge"] > 0
    f = report["figures"]
    assert sorted(f["class_sizes"]) == f["class_sizes"] and len(f["class_sizes"]) == a["classes"]
    assert min(f["class_sizes"]) == a["min_individuals"] >= 10
    assert len(f["releases"]) == a["releases"] == len(f["risk"])
    assert s["risk"]["prosecutor_highest"] == max(r["prosecutor"]["highest"] for r in f["risk"]) <= 0.1
    assert s["risk"]["prosecutor"] == audit["risk"]["summary"]["prosecutor"] and f["risk"] == sorted(
        audit["risk"]["per_release"], key=lambda r: (r["window_start"], r["release_id"]))
    # DP budget per period: the audit's recomputed charges, within each aggregate's epsilon and the budget
    budget = f["dp_budget"]
    assert budget["spent_by_period"] == audit["checks"]["dp"]["spent_by_period"]
    for period in budget["spent_by_period"].values():
        assert period["total"] <= budget["budget"] + 1e-9
        assert all(v <= budget["epsilon"][name] + 1e-9 for name, v in period["aggregates"].items())
    # the query error over the events the stream placed (published or suppressed; not the dead letters)
    q = f["query_error"]
    assert q["events"] == a["published"] + a["suppressed"]
    assert set(q["run"]) == {"streaming", "offline_windows", "offline_table"}
    assert 0 < q["run"]["streaming"]["all"]["mean"] and q["run"]["streaming"]["all"]["queries"] > 100
    assert "tap_ins_zone_hour" in q["dp"] and q["dp"]["tap_ins_zone_hour"]["realized"]["by_threshold"]
    # the DPO summary: the guarantees the releases were made under, and the deployment's statement
    g = s["guarantees"]
    assert g["releases_match"] and g["releases_by_fingerprint"] == {g["fingerprint"]: a["releases"]}
    assert s["statement"] == STATEMENT
    raw_topic = next(r for r in s["retention"] if r["topic"] == f"raw.test.{NAME}")
    assert raw_topic["declared"].startswith("604800 s") and "keeps data 3600 s, within the declared" in \
        raw_topic["declared"]
    assert raw_topic["broker"] == "1 h (retention.ms = 3600000)"
    deadletter = next(r for r in s["retention"] if r["topic"] == "anon.deadletter")
    assert deadletter["broker"] == deadletter["retention"] == "30 days (retention.ms = 2592000000)"


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "Debian's chromium and chromium-driver are needed (.ci/run installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=options)
    yield d
    d.quit()


def test_the_page_in_chromium(published, browser):
    _, audit, report, html = published
    browser.get(html.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    # every plot is drawn: an SVG with marks of its own, laid out at a visible size
    for pid, _, _ in PLOTS:
        drawn = browser.execute_script(
            "const f = document.getElementById(arguments[0]); const s = f && f.querySelector('svg');"
            "if (!s) return null; const r = s.getBoundingClientRect();"
            "return [r.width, r.height, s.querySelectorAll('path, rect, use, line, polyline').length];",
            f"plot-{pid}")
        assert drawn is not None, f"plot {pid} missing"
        assert drawn[0] > 200 and drawn[1] > 100 and drawn[2] > 10, (pid, drawn)
    # what the page shows is what the audit counted (the exact value in data-value, the text as a person reads it)
    shown = browser.execute_script(
        "const o = {}; for (const e of document.querySelectorAll('[data-figure]')) o[e.dataset.figure] = "
        "[e.textContent, e.dataset.value === undefined ? null : JSON.parse(e.dataset.value)]; return o;")
    a = audit["summary"]
    for key in ("events_in", "published", "suppressed", "dead_lettered", "releases", "classes", "min_individuals",
                "k"):
        assert shown[key] == [str(a[key]), a[key]], key
    assert shown["verdict"][0] == audit["verdict"]
    assert shown["ncp_mean"][1] == audit["health"]["ncp"]["mean"]
    assert shown["dp_worst_unit_charge"][1] == audit["checks"]["dp"]["worst_unit_charge"]
    p = audit["risk"]["summary"]["prosecutor"]
    assert [shown[k][1] for k in ("prosecutor_highest", "prosecutor_average", "records_at_risk")] == \
        [p["highest"], p["average"], p["records_at_risk"]]
    assert shown["records_at_risk"][0] == f"{p['records_at_risk'] * 100:g}%"          # a share, as a percentage
    assert shown["intersection_risk"][1] == audit["risk"]["summary"]["intersection_risk"]
    assert shown["settings_fingerprint"][0] == report["summary"]["guarantees"]["fingerprint"]
    # the marketer risk is the prosecutor average here (no [risk] population), named so in the summary and legend
    assert shown["marketer"][0] == shown["prosecutor_average"][0]
    data = json.loads(browser.execute_script("return document.getElementById('report-data').textContent"))
    assert data["summary"]["counts"] == report["summary"]["counts"]
    text = browser.find_element("tag name", "body").text
    assert STATEMENT["controller"] in text and "open data portal" in text
    assert "undefined topic" not in text
    _plots_read_right(browser, {"ncp-suppression": ("share-suppressed", "y"), "risk": ("risk", "y"),
                                "dp-budget": ("epsilon", "y"), "class-sizes": ("classes", "x")})


# Per plot in the page: the text boxes of tick labels that overlap (per axis), the plot areas (an SVG group per
# matplotlib Axes, its id naming its unit, or matplotlib's own axes_N without one) and every limit line: the value
# its position reads on the tick labels of its own plot area's axis, and that area's unit.
PLOT_GEOMETRY_JS = """
const rect = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
const meet = (a, b) => Math.min(a[2], b[2]) - Math.max(a[0], b[0]) > 0.5 && Math.min(a[3], b[3]) - Math.max(a[1], b[1]) > 0.5;
const number = t => { const x = parseFloat(t.replace(/[,%\u2212]/g, m => m === '\u2212' ? '-' : ''));
                      return t.includes('%') ? x / 100 : x; };
const out = {};
for (const fig of document.querySelectorAll('figure[id^="plot-"]')) {
  const svg = fig.querySelector('svg'); if (!svg) continue;
  const res = {overlaps: [], areas: [], refs: []};
  for (const axis of svg.querySelectorAll('g[id^="matplotlib.axis"]')) {
    const texts = [...axis.querySelectorAll('text')].map(t => [t.textContent, rect(t)]);
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++)
      if (meet(texts[i][1], texts[j][1])) res.overlaps.push([texts[i][0], texts[j][0]]);
  }
  for (const ax of svg.querySelectorAll('g[id^="axes_"], g[id*="/axes/"]')) {
    // the plot area: its background and spines (a twin axes draws no background of its own)
    const area = [...ax.querySelectorAll(':scope > g[id^="patch_"] > path')].map(rect).reduce(
      (u, r) => [Math.min(u[0], r[0]), Math.min(u[1], r[1]), Math.max(u[2], r[2]), Math.max(u[3], r[3])]);
    const unit = ax.id.includes('/axes/') ? ax.id.split('/axes/')[1] : null;
    res.areas.push([unit, area]);
    const axes = ax.querySelectorAll(':scope > g[id^="matplotlib.axis"]');
    for (const ref of ax.querySelectorAll('g[id*="/ref/"]')) {
      const [dir, value] = ref.id.split('/ref/')[1].split('/');
      const ticks = [...axes[dir === 'x' ? 0 : 1].querySelectorAll('g[id^="' + dir + 'tick_"]')]
        .filter(t => t.querySelector('text')).map(t => {
          const m = rect(t.querySelector('use')); const v = number(t.querySelector('text').textContent);
          return [dir === 'x' ? (m[0] + m[2]) / 2 : (m[1] + m[3]) / 2, v]; });
      const l = rect(ref.querySelector('path')); const at = dir === 'x' ? (l[0] + l[2]) / 2 : (l[1] + l[3]) / 2;
      const [a, b] = [ticks[0], ticks[ticks.length - 1]];
      res.refs.push({unit, dir, value: parseFloat(value), read: a[1] + (at - a[0]) * (b[1] - a[1]) / (b[0] - a[0]),
                     span: Math.abs(b[1] - a[1]), inside: dir === 'x' ? area[0] <= at && at <= area[2]
                                                                       : area[1] <= at && at <= area[3]});
    }
  }
  out[fig.id.slice(5)] = res;
}
return out;
"""
SCIENTIFIC = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?e[-+]\d+(?![\w])", re.IGNORECASE)


def _plots_read_right(browser, refs: dict) -> None:
    """What a reader sees: no tick label overprints another, every plot area has one scale whose unit it names
    (no twin axes: no two areas overlap), every limit line reads its own value on the scale of its unit
    (``refs``: plot -> (unit, axis) of its limit line), and no number in the page is in scientific notation."""
    geometry = browser.execute_script(PLOT_GEOMETRY_JS)
    assert set(refs) <= set(geometry), geometry.keys()
    problems = []           # every one found, so that a failure shows all that a reader would misread
    for pid, g in geometry.items():
        if g["overlaps"]:
            problems.append((pid, f"{len(g['overlaps'])} pairs of tick labels overprint", g["overlaps"][:3]))
        for i, (_, a) in enumerate(g["areas"]):
            problems += [(pid, "two scales over one plot area", a, b) for _, b in g["areas"][i + 1:]
                         if min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])]
        problems += [(pid, "a plot area names no unit") for unit, _ in g["areas"] if not unit]
    for pid, (unit, axis) in refs.items():
        lines = geometry[pid]["refs"]
        if [(r["unit"], r["dir"]) for r in lines] != [(unit, axis)]:
            problems.append((pid, f"the limit line is not on the {axis} scale of {unit}", lines))
        problems += [(pid, "the limit line reads another value on its scale", r) for r in lines
                     if not (r["inside"] and abs(r["read"] - r["value"]) <= 0.02 * r["span"])]
    text = browser.execute_script("return document.body.innerText + ' ' + [...document.querySelectorAll('svg text')]"
                                  ".map(t => t.textContent).join(' ')")
    problems += [("page", "scientific notation", x) for x in SCIENTIFIC.findall(text)]
    assert not problems, "\n".join(map(str, problems[:40]))


def test_plots_of_a_long_run_with_small_risks_read_right_in_chromium(published, browser, tmp_path):
    """The issue's stream: 32 DP periods (their labels overprinted), risks of a few in a million (written 2e-06),
    a marketer risk against a declared population beside the prosecutor average, and k = 5 below 1 / threshold
    (every individual at risk: the page says why). Drawn from this run's figures, reshaped so."""
    import copy

    from stream_anon.report import page, plots
    _, _, report, _ = published
    f, s = copy.deepcopy(report["figures"]), copy.deepcopy(report["summary"])
    day = next(iter(f["dp_budget"]["spent_by_period"].values()))
    f["dp_budget"]["spent_by_period"] = {f"2024-{1 + i // 28:02d}-{1 + i % 28:02d}": day for i in range(32)}
    population = {"highest": 4e-06, "average": 2e-06, "records_at_risk": 0.0, "population": 9_000_000,
                  "sampling_fraction": 0.0002, "population_uniqueness": {"share": 1e-07}}
    for r in f["risk"]:
        r["journalist"], r["marketer"] = population, population["average"]
    s["risk"].update(marketer=2e-06, journalist={**population, "population_uniqueness_max": 1e-07})
    s["risk"]["prosecutor"]["records_at_risk"] = 1.0
    s["counts"]["k"] = 5
    f["alerts_by_name"] = {"suppression_limit_exceeded": 3, "raw_retention_exceeded": 1}
    svgs = {"class-sizes": plots.class_sizes(f, 5), "ncp-suppression": plots.ncp_suppression(f, 0.05),
            "risk": plots.risk(f), "dp-budget": plots.dp_budget(f), "query-error": plots.query_error(f),
            "deadletters-alerts": plots.deadletters_alerts(f)}
    html = tmp_path / "long.html"
    html.write_text(page.render(s, f, svgs))
    browser.get(html.as_uri())
    _plots_read_right(browser, {"ncp-suppression": ("share-suppressed", "y"), "risk": ("risk", "y"),
                                "dp-budget": ("epsilon", "y"), "class-sizes": ("classes", "x")})
    shown = browser.execute_script(
        "const o = {}; for (const e of document.querySelectorAll('[data-figure]')) o[e.dataset.figure] = "
        "e.textContent; return o;")
    assert shown["marketer"] == shown["journalist_average"] == "0.000002 (1 in 500,000)"
    assert shown["records_at_risk"] == "100%" and shown["population_uniqueness_max"] == "0.00001%"
    text = browser.find_element("tag name", "body").text
    assert "with k = 5 below 10, a class can meet k and still be at risk, so the share is 100%" in text
    assert "marketer risk = journalist average (expected share re-identified)" in text
    legend = browser.execute_script("return [...document.querySelectorAll('#plot-risk svg text')]"
                                    ".map(t => t.textContent)")
    assert "marketer risk = journalist average (expected share re-identified)" in legend
    ticks = browser.execute_script("return [...document.querySelectorAll('#plot-deadletters-alerts svg "
                                   "g[id^=\"matplotlib.axis\"] text')].map(t => t.textContent)")
    assert ticks and all(not re.fullmatch(r"\d+\.\d+", t) for t in ticks), ticks      # counts: integer ticks


def test_a_report_of_outputs_under_another_secret_says_so(published, module_broker):
    """The page of outputs the secret cannot audit: the audit's one line, and no figure counted from them."""
    from stream_anon.audit.kafka_source import read_inputs
    from stream_anon.report import build_report
    path, audit, _, _ = published
    other = b"another-secret-0123456789abcdef-xyz"
    read = read_inputs(module_broker.bootstrap, path, other, idle_s=1.0)
    page = build_report(path, read.raw, read.outputs, other, read.metrics)
    assert page.summary["verdict"] == "FAILED" and "this secret is key id" in page.summary["verdict_reason"]
    assert page.figures["class_sizes"] == [] and page.figures["query_error"] is None
    assert page.html.count("Nothing to plot") == len(PLOTS) - 1      # dead letters and alerts: "none" panels


def _run(argv: list[str], terminal: bool) -> tuple[int, str]:
    """``stream-anon ARGV`` in a process of its own, its stderr a terminal (a pty) or a pipe: (exit, stderr)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios
    import threading

    env = {**os.environ, "STREAM_ANON_SECRET": SECRET}
    cmd = [sys.executable, "-m", "stream_anon.cli", *argv]
    if not terminal:
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
        return done.returncode, done.stderr.decode()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))     # a terminal's size (0: no bar)
    chunks: list[bytes] = []

    def drain():            # read as it comes: a full pty buffer would block the bars
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    code = proc.wait(timeout=300)
    reader.join(10)
    os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("command", ["audit", "report"])
def test_progress_shows_on_a_terminal_and_stays_out_of_files(published, module_broker, tmp_path, command):
    """A long audit or report shows what it does on a terminal (tqdm bars on stderr: reading the topics until
    quiet, the checks, the plots) and writes no bar into a file or pipe."""
    path = published[0]
    argv = [command, "--config", str(path), "--broker", module_broker.bootstrap, "--idle", "1"]
    if command == "report":
        argv += ["--out", str(tmp_path / "r.html")]
    code, seen = _run(argv, terminal=True)
    assert code == 0, seen
    assert "reading rcards's topics" in seen and "auditing" in seen and "msg" in seen, seen[-2000:]
    if command == "report":
        assert "drawing the plots" in seen
    code, piped = _run(argv, terminal=False)
    assert code == 0 and "reading" not in piped and "auditing" not in piped and "\r" not in piped, piped[-2000:]
