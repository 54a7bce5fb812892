"""h3-mondrian (issue 44): classes formed along the H3 hierarchy hold k distinct individuals, every member's
position lies in the class's published cell, no published cell is coarser than the domain, and on the bundled
H3 configs in-process few positions are the whole domain."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

h3 = pytest.importorskip("h3")

from stream_anon.audit import audit  # noqa: E402
from stream_anon.audit.config import AuditConfig  # noqa: E402
from stream_anon.config import load_config, parse_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.engine.space import QISpace, common_cell, parse_time  # noqa: E402
from stream_anon.strategies import make_strategy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"test-secret-h3-mondrian-0123456789"
LOWER, UPPER = [40.69, -74.10], [40.76, -74.03]


def space(resolutions=(5, 12)) -> QISpace:
    return QISpace(parse_config({
        "stream": {"name": "g", "kind": "vehicle", "input_topic": "raw.g", "privacy_unit": "unit",
                   "event_time": "time", "event_types": ["reading"]},
        "anonymization": {"k": 3, "window_s": 60, "max_delay_s": 60, "strategy": "h3-mondrian"},
        "quasi_identifiers": [{"name": "pos", "field": ["lat", "lon"], "kind": "geopoint", "lower": LOWER,
                               "upper": UPPER, "hierarchy": "h3", "resolutions": list(resolutions)},
                              {"name": "speed", "field": "speed", "kind": "numeric", "lower": 0, "upper": 200}],
        "sensitive": {"fields": []}}))


def synthetic(seed: int):
    """Vehicles around a few centres, each with many points (one vehicle's points must count once)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform([40.70, -74.09], [40.75, -74.04], (4, 2))
    rows, units = [], []
    for unit in range(int(rng.integers(6, 25))):
        c = centres[rng.integers(len(centres))]
        for _ in range(int(rng.integers(1, 30))):
            rows.append([*(c + rng.normal(0, 10 ** rng.uniform(-4, -2.3), 2)), rng.uniform(0, 200)])
            units.append(unit)
    X = np.clip(np.array(rows), [*LOWER, 0], [*UPPER, 200])
    return X, np.array(units, dtype=np.int64)


@pytest.mark.parametrize("seed", range(30))
def test_classes_hold_k_individuals_in_one_cell_no_coarser_than_the_domain(seed):
    sp = space()
    X, units = synthetic(seed)
    start = next(r for r in range(5, 13) if (7.0 ** (12 - r) - 1) / (sp.h3_qis[0][4] - 1) < 1)
    classes = make_strategy("h3-mondrian").form_classes(X, units, 3, sp, None)
    placed = np.concatenate(classes) if classes else np.zeros(0, dtype=np.int64)
    assert len(placed) == len(set(placed.tolist())) == len(X)         # every record, once (nothing lost)
    for c in classes:
        assert len(np.unique(units[c])) >= 3
        cell = common_cell(X[c, 0], X[c, 1], (start, 12))                 # None: a class left at the root
        if cell is not None:
            assert all(h3.latlng_to_cell(a, o, h3.get_resolution(cell)) == cell for a, o in X[c, :2])


def test_one_vehicles_points_count_once():
    sp = space()
    a, b = h3.cell_to_latlng(h3.latlng_to_cell(40.72, -74.06, 9)), h3.cell_to_latlng(
        h3.latlng_to_cell(40.74, -74.04, 9))
    # cell a: vehicle 0 with 40 points and vehicle 1; cell b: vehicles 2, 3, 4
    X = np.array([[*a, 10.0]] * 40 + [[*a, 20.0]] + [[*b, 30.0]] * 3)
    units = np.array([0] * 40 + [1, 2, 3, 4])
    classes = make_strategy("h3-mondrian").form_classes(X, units, 3, sp, None)
    for c in classes:
        assert len(np.unique(units[c])) >= 3
    # cell a's 41 records are no class of their own: they pool with cell b's at a coarser level
    assert len(classes) == 1 and len(classes[0]) == len(X)


def run_bundled(dataset: str):
    config = load_config(ROOT / "configs" / f"{dataset}-h3.toml")
    events = sorted(load_events(dataset), key=lambda e: parse_time(e["event_time"]))
    engine = Engine(config, secret=SECRET)
    releases = []
    for i in range(0, len(events), 1000):
        releases += engine.process(events[i:i + 1000]).releases
    releases += engine.flush().releases
    return config, events, releases


@pytest.mark.parametrize("dataset", ["obd2", "citibike"])
def test_bundled_h3_configs_publish_real_cells(dataset):
    config, events, releases = run_bundled(dataset)
    records = [r for rel in releases for r in rel.records]
    raw = [((config.stream.input_topic, 0, i), json.dumps(e)) for i, e in enumerate(events)]
    report = audit(raw, {"records": records, "manifests": [rel.manifest() for rel in releases], "deadletters": []},
                   SECRET, AuditConfig.from_toml(ROOT / "configs" / f"{dataset}-h3.toml"))
    assert report.passed, report.format_text()          # k, coverage (h3 itself), suppression within the limit
    whole = report.health["whole_domain"]["run"]
    for q in config.quasi_identifiers:
        if q.h3 is None:
            continue
        published = [r["qi"][q.name] for r in records]
        assert whole[q.name] <= 0.05, (q.name, whole)
        # no cell coarser than the domain: every published cell's NCP (area share) below 1
        cells = {p["h3"] for p in published if p["h3"] != "*"}
        (la0, lo0), (la1, lo1) = q.lower, q.upper
        domain = (la1 - la0) * 111.32 * (lo1 - lo0) * 111.32 * np.cos(np.radians((la0 + la1) / 2))
        assert max(h3.cell_area(c, "km^2") for c in cells) <= domain, q.name
        resolutions = [p["resolution"] for p in published if p["h3"] != "*"]
        positions = report.health["h3_positions"]["run"][q.name]
        assert np.mean(resolutions) >= 7
        assert positions["mean_resolution"] == pytest.approx(np.mean(resolutions), abs=1e-3)
        assert positions["records"] == len(records) and 0 < positions["ncp"] < 0.2


def test_a_class_at_the_whole_domain_waits_when_not_due_and_is_withheld_when_asked():
    sp = space()
    cells = [h3.cell_to_latlng(h3.latlng_to_cell(*c, 7)) for c in ((40.70, -74.09), (40.745, -74.04))]
    # two far apart cells of two vehicles each: with k = 3 no cell holds a class, so the class is the whole domain
    X = np.array([[*cells[i // 2], 10.0 * i] for i in range(4)])
    units = np.arange(4)
    strategy = make_strategy("h3-mondrian")
    assert [c.tolist() for c in strategy.form_classes(X, units, 3, sp, None)] == [[0, 1, 2, 3]]
    assert strategy.form_classes(X, units, 3, sp, None, due=np.zeros(4, bool)) == []        # all wait
    # due ones need the company of those not due (2 due vehicles < k): the whole part is published
    assert [c.tolist() for c in strategy.form_classes(X, units, 3, sp, None, due=np.array([1, 1, 0, 0], bool))] \
        == [[0, 1, 2, 3]]
    # 3 due vehicles form the class alone; the 4th waits
    assert [c.tolist() for c in strategy.form_classes(X, units, 3, sp, None, due=np.array([1, 1, 1, 0], bool))] \
        == [[0, 1, 2]]
    withhold = make_strategy("h3-mondrian", {"whole_domain": "withhold"})
    assert withhold.form_classes(X, units, 3, sp, None, due=np.ones(4, bool)) == []
