"""Positions along H3 (issue 13 item 4): configuration, the finest common cell, NCP in cells, exact reuse, and the
audit's own H3 coverage test (which imports h3, not the engine)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

h3 = pytest.importorskip("h3")

from stream_anon.audit import audit  # noqa: E402
from stream_anon.audit.config import AuditConfig  # noqa: E402
from stream_anon.audit.primitives import QISpec, cover_test  # noqa: E402
from stream_anon.config import load_config, parse_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.engine.space import common_cell, h3_ncp, inner_box  # noqa: E402
from stream_anon.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"test-secret-h3-0123456789"


def geo_config(**geo):
    return parse_config({
        "stream": {"name": "g", "kind": "vehicle", "input_topic": "raw.g", "privacy_unit": "unit",
                   "event_time": "time", "event_types": ["reading"]},
        "anonymization": {"k": 3, "window_s": 60, "max_delay_s": 60},
        "quasi_identifiers": [{"name": "pos", "field": ["lat", "lon"], "kind": "geopoint",
                               "lower": [40.69, -74.10], "upper": [40.76, -74.03], **geo}],
        "sensitive": {"fields": []}})


def test_config_keys():
    q = geo_config(hierarchy="h3", resolutions=[5, 12]).quasi_identifiers[0]
    assert q.h3 == (5, 12) and q.grid is None
    assert geo_config().quasi_identifiers[0].h3 is None
    for bad, msg in (({"hierarchy": "h3"}, "resolutions"), ({"hierarchy": "h3", "resolutions": [12, 5]}, "min <= max"),
                     ({"hierarchy": "h3", "resolutions": [5, 16]}, "resolutions"),
                     ({"hierarchy": "h3", "resolutions": [5.0, 9]}, "resolutions"),
                     ({"hierarchy": "s2", "resolutions": [5, 9]}, "hierarchy"),
                     ({"resolutions": [5, 9]}, "only meaningful"),
                     ({"hierarchy": "h3", "resolutions": [5, 9], "grid_deg": 0.01}, "grid_deg")):
        with pytest.raises(ConfigError, match=msg):
            geo_config(**bad)


def test_common_cell_is_the_finest_cell_holding_every_point():
    rng = np.random.default_rng(0)
    for _ in range(200):
        c = rng.uniform([40.70, -74.09], [40.75, -74.04])
        pts = c + rng.normal(0, 10 ** rng.uniform(-5, -2), (int(rng.integers(1, 6)), 2))
        cell = common_cell(pts[:, 0], pts[:, 1], (3, 13))
        assert cell is not None
        r = h3.get_resolution(cell)
        assert all(h3.latlng_to_cell(a, o, r) == cell for a, o in pts)
        if r < 13:      # not all in one cell one resolution finer
            assert len({h3.latlng_to_cell(a, o, r + 1) for a, o in pts}) > 1
    # no common cell at rmin: None (the whole domain)
    assert common_cell(np.array([40.7, -33.9]), np.array([-74.0, 151.2]), (2, 5)) is None


def test_inner_box_lies_in_its_cell():
    rng = np.random.default_rng(1)
    for _ in range(30):
        cell = h3.latlng_to_cell(*rng.uniform([40.70, -74.09], [40.75, -74.04]), int(rng.integers(5, 13)))
        (a0, a1), (o0, o1) = inner_box(cell)
        r = h3.get_resolution(cell)
        for a in np.linspace(a0, a1, 7):
            for o in np.linspace(o0, o1, 7):
                assert h3.latlng_to_cell(a, o, r) == cell
        assert a1 > a0 and o1 > o0


def test_ncp_counts_cells():
    space = Engine(geo_config(hierarchy="h3", resolutions=[5, 12]), secret=SECRET).space
    _, _, _, rmax, n = space.h3_qis[0]
    fine = h3.latlng_to_cell(40.72, -74.06, 12)
    assert h3_ncp(fine, rmax, n) == 0.0 and h3_ncp(None, rmax, n) == 1.0
    assert h3_ncp(h3.cell_to_parent(fine, 11), rmax, n) == pytest.approx(6 / (n - 1))
    # N: resolution-12 cells of a 7.8 km x 5.9 km box (~46 km2 / 307 m2)
    assert 120_000 < n < 180_000


@pytest.fixture(scope="module")
def citibike_h3():
    config = load_config(ROOT / "configs" / "citibike-h3.toml")
    events = load_events("citibike")[:4000]
    engine = Engine(config, secret=SECRET)
    result = engine.process(events)
    result.extend(engine.flush())
    return config, events, result.releases


def test_releases_publish_h3_cells_and_the_audit_passes(citibike_h3):
    config, events, releases = citibike_h3
    records = [r for rel in releases for r in rel.records]
    assert records and all(set(r["qi"]["start"]) <= {"h3", "resolution"} for r in records)
    resolutions = {r["qi"]["start"].get("resolution") for r in records}
    assert resolutions - {None} and all(5 <= x <= 12 for x in resolutions - {None})
    raw = [(("raw.vehicle.citibike", 0, i), json.dumps(e)) for i, e in enumerate(events)]
    outputs = {"records": records, "manifests": [rel.manifest() for rel in releases], "deadletters": []}
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(ROOT / "configs" / "citibike-h3.toml"))
    assert report.passed, report.format_text()
    assert report.checks["coverage"]["qi_values_checked"] == 4 * len(records)
    # the audit is not vacuous: a neighbouring cell of the right resolution fails coverage
    bad = copy.deepcopy(records)
    cell = bad[0]["qi"]["start"]["h3"]
    bad[0]["qi"]["start"]["h3"] = next(c for c in h3.grid_disk(cell, 1) if c != cell)
    report = audit(raw, {**outputs, "records": bad}, SECRET,
                   AuditConfig.from_toml(ROOT / "configs" / "citibike-h3.toml"))
    assert not report.checks["coverage"]["passed"]


def test_audit_cover_test_for_cells():
    q = QISpec("pos", ["lat", "lon"], "geopoint", None, [40.69, -74.10], [40.76, -74.03])
    cell = h3.latlng_to_cell(40.72, -74.06, 9)
    assert cover_test(q, {"h3": cell, "resolution": 9}, (40.72, -74.06))[0]
    assert not cover_test(q, {"h3": cell, "resolution": 8}, (40.72, -74.06))[0]         # resolution disagrees
    assert not cover_test(q, {"h3": cell}, (40.74, -74.04))[0]                          # elsewhere
    assert not cover_test(q, {"h3": "not-a-cell"}, (40.72, -74.06))[0]
    assert cover_test(q, {"h3": "*"}, (40.72, -74.06))[0] and cover_test(q, {"h3": "*"}, (None, None))[0]
    assert not cover_test(q, {"h3": cell}, (None, None))[0]                             # a null needs "*"


def test_reuse_into_an_h3_class_needs_the_record_in_its_cell():
    engine = Engine(geo_config(hierarchy="h3", resolutions=[5, 12]), secret=SECRET)
    space = engine.space
    cell = h3.latlng_to_cell(40.72, -74.06, 10)
    inside = np.array(h3.cell_to_latlng(cell))
    # a point inside the cell's bounding box but outside the hexagon (near a corner of the box)
    b = np.array(h3.cell_to_boundary(cell))
    corner = np.array([b[:, 0].max(), b[:, 1].max()]) - 1e-7
    assert h3.latlng_to_cell(*corner, 10) != cell
    gen = {"pos": {"h3": cell, "resolution": 10}}
    assert space.in_published_cells(inside, gen) and not space.in_published_cells(corner, gen)
    assert space.in_published_cells(corner, {"pos": {"h3": "*"}})
    # the engine's reuse filter drops the corner record, keeps the inside one
    (a0, a1), (o0, o1) = inner_box(cell)
    engine.registry.register(np.array([[a0, o0]]), np.array([[a1, o1]]), ["c0"], [gen], np.array([0.1]), 0.0)
    assert engine.registry.cover(np.array([inside, corner])).ravel().tolist() == [True, False]
    kept = engine.registry.exact_cover({0: [0, 1]}, np.array([inside, corner]))
    assert kept == {0: [0]}
