"""What docs/configuration.md says about mapped sources (issue 43 item 12), run: a source without an individual id
(``privacy_unit = "event_id"`` with an ``event_key``: each record its own individual), and which source values
match a hierarchy's leaves (an integer matches the leaf of its decimal text; a float does not). The
worker core publishes, the independent audit passes, and the documents say so."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_inputs import _audit, _run_core  # noqa: E402

from stream_anon.config import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()

ROUTES = {"name": "routes", "levels": ["value", "group", "*"],
          "tree": {"*": {"1-5": ["1", "2", "3", "4", "5"], "6-10": ["6", "7", "8", "9", "10"]}}}


def _config(tmp_path: Path, unit: str, route_cast: str, event_key: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "routes.json").write_text(json.dumps(ROUTES))
    unit_field = "" if unit == "event_id" else f'{unit} = "card"\n'
    path = tmp_path / "taps.toml"
    path.write_text(f'''
[stream]
name = "taps"
kind = "fare"
input_topic = "raw.taps"
privacy_unit = "{unit}"
event_time = "t"
event_types = ["tap"]

[input]
format = "csv"
columns = ["card", "t", "route", "fare"]
{event_key}

[input.fields]
{unit_field}t = {{ path = "t", time_format = "epoch_s" }}
route = {{ path = "route", cast = "{route_cast}" }}
fare = {{ path = "fare", cast = "int" }}

[anonymization]
k = 3
window_s = 3600
max_delay_s = 3600

[[quasi_identifiers]]
name = "route"
field = "route"
kind = "categorical"
hierarchy = "routes.json"

[[quasi_identifiers]]
name = "time"
field = "t"
kind = "timestamp"
lower = "2023-11-14T00:00:00+00:00"
upper = "2023-11-16T00:00:00+00:00"

[sensitive]
fields = ["fare"]

[identifiers]
drop = ["event_id"{', "card"' if unit != "event_id" else ""}]
''')
    return path


def _taps(n: int = 120, cards: int = 4) -> list[bytes]:
    """CSV lines of taps in time order: few cards (each tapping many times), routes 1-10."""
    t0 = 1_700_000_000
    return [f"C{i % cards},{t0 + 20 * i},{1 + i % 10},{150 + 10 * (i % 3)}".encode() for i in range(n)]


def _released(out, name: str) -> tuple[list[dict], list[dict], list[dict]]:
    docs = {"records": [], "releases": [], "deadletter": []}
    for topic, _, value in out:
        key = "records" if topic == f"anon.{name}.records" else topic.split(".", 1)[1]
        docs.setdefault(key, []).append(json.loads(value))
    return docs["records"], docs["releases"], docs["deadletter"]


def test_each_record_its_own_individual(tmp_path):
    """With ``privacy_unit = "event_id"`` and an ``event_key`` (no card id mapped as the unit) every tap is an
    individual of its own: a class's individuals are its records; a copy of a tap is a duplicate, not a new one."""
    cfg_path = _config(tmp_path, "event_id", "int", 'event_key = ["card", "t"]')
    cfg = load_config(cfg_path)
    messages = _taps()
    out, counts = _run_core(cfg, messages, tmp_path)
    records, manifests, dead = _released(out, "taps")
    assert not dead and counts["published"] == len(messages) == len(records)
    for m in manifests:
        assert all(c["individuals"] == c["records"] >= 3 for c in m["classes"])   # one record, one individual
    assert all("card" not in r["sensitive"] and "card" not in r["qi"] for r in records)
    assert _audit(cfg_path, cfg, messages, out).passed
    # the same records again under their event_key: duplicates, not new individuals
    again, _ = _run_core(cfg, messages + messages[:10], tmp_path)
    assert sum(json.loads(v)["reason"] == "duplicate_event" for t, _, v in again if t == "anon.deadletter") == 10
    assert 'privacy_unit = "event_id"' in CONFIGURATION and "each record is its own individual" in CONFIGURATION


def test_integer_source_values_match_string_leaves_floats_do_not(tmp_path):
    int_path = _config(tmp_path / "int", "event_id", "int", 'event_key = ["card", "t"]')
    out, counts = _run_core(load_config(int_path), _taps(), tmp_path)
    assert counts["published"] == 120 and not _released(out, "taps")[2]
    float_path = _config(tmp_path / "float", "event_id", "float", 'event_key = ["card", "t"]')
    cfg = load_config(float_path)
    out, counts = _run_core(cfg, _taps(), tmp_path)
    dead = _released(out, "taps")[2]
    assert len(dead) == 120 and {d["reason"] for d in dead} == {"route: value is not in hierarchy 'routes'"}
    assert _audit(float_path, cfg, _taps(), out).summary["dead_lettered"] == 120       # the audit agrees
    assert "an integer by its decimal text (`7` matches `\"7\"`" in CONFIGURATION


def test_max_future_s_chosen_longer_than_the_longest_gap(tmp_path):
    """docs/configuration.md, Choosing max_future_s: shorter than a gap of the stream (here a 10-hour night), every
    event after the gap is dead-lettered ``future_event_time`` (a rejected event moves nothing, so the morning never
    catches up); longer than the gap, nothing is."""
    evening, morning = _taps(60), _taps(60)
    night = 10 * 3600
    morning = [b"".join((line.split(b",")[0], b",", str(int(line.split(b",")[1]) + night + 1200).encode(), b",",
                         b",".join(line.split(b",")[2:]))) for line in morning]
    for max_future_s, lost in ((3600, 60), (12 * 3600, 0)):
        path = _config(tmp_path / str(max_future_s), "event_id", "int", 'event_key = ["card", "t"]')
        path.write_text(path.read_text().replace('event_types = ["tap"]',
                                                 f'event_types = ["tap"]\nmax_future_s = {max_future_s}'))
        out, _ = _run_core(load_config(path), evening + morning, tmp_path)
        reasons = [d["reason"].split(":")[0] for d in _released(out, "taps")[2]]
        assert reasons == ["future_event_time"] * lost, (max_future_s, reasons[:3])
    assert "**Choosing `max_future_s`.** Set it longer than the longest stretch of event time" in CONFIGURATION
