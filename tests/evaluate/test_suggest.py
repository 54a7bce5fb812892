"""``stream-anon calibrate --suggest``: closed-form figures from the sample (stream_anon/suggest.py), then the
search that runs candidates through the engine (stream_anon/suggest_search.py)."""
from __future__ import annotations

import copy
from pathlib import Path

from stream_anon.config import load_config, parse_config
from stream_anon.suggest import apply, closed_form, suggest
from stream_anon.suggest_search import (LATENESS, MAX_DELAY, STRATEGY, STRATEGY_PARAMS, WINDOW, apply_settings,
                                        run_settings, search, split_by_time, spread_windows, with_settings)

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_500_000_000        # 2017-07-14T02:40:00Z


def _events(n_units, per_unit, step_s, lat0=40.70, span_deg=0.05, shuffle_lag_s=0, stagger_s=1):
    out = []
    for i in range(per_unit):
        for u in range(n_units):
            t = T0 + i * step_s + u * stagger_s
            if shuffle_lag_s and i % 10 == 5:
                t -= shuffle_lag_s           # every 10th round arrives late
            out.append({"event_id": f"e{i}-{u}", "event_type": "position", "vehicle_id": f"v{u}", "event_time": t,
                        "latitude": lat0 + span_deg * ((u * 7 + i) % 13) / 13,
                        "longitude": -74.0 + span_deg * ((u * 5 + i) % 11) / 11})
    return out


def _by_key(suggestions):
    return {s.key: s for s in suggestions}


def _config(window_s=600, max_delay_s=600, k=3, stream=None, **anonymization):
    """A box-geopoint stream of the built-in event shape over the synthetic events' day."""
    return parse_config({
        "stream": {"name": "t", "kind": "vehicle", "input_topic": "raw.t", "privacy_unit": "vehicle_id",
                   "event_time": "event_time", "event_types": ["position"], **(stream or {})},
        "anonymization": {"k": k, "window_s": window_s, "max_delay_s": max_delay_s, **anonymization},
        "quasi_identifiers": [
            {"name": "time", "field": "event_time", "kind": "timestamp", "lower": "2017-07-14T02:00:00+00:00",
             "upper": "2017-07-15T02:00:00+00:00"},
            {"name": "position", "field": ["latitude", "longitude"], "kind": "geopoint", "lower": [40.69, -74.01],
             "upper": [40.76, -73.94]}],
        "sensitive": {"fields": []}})


def test_h3_coarsest_resolution_is_the_last_cell_smaller_than_the_domain():
    from stream_anon.engine.space import h3_domain_cells
    cfg = load_config(ROOT / "configs" / "citibike-h3.toml")
    q = next(q for q in cfg.quasi_identifiers if q.h3)
    wide = with_settings(cfg, {f"quasi_identifiers.{q.name}.lower": [40.0, -74.8],
                               f"quasi_identifiers.{q.name}.upper": [41.2, -73.2]})
    for c in (cfg, wide):
        qq = next(x for x in c.quasi_identifiers if x.name == q.name)
        r = _by_key(closed_form(c, _events(10, 5, 600)))[f"quasi_identifiers.{q.name}.resolutions"]
        n = h3_domain_cells(tuple(qq.lower), tuple(qq.upper), qq.h3[1])
        coarsest, finest = r.value
        assert finest == qq.h3[1]
        assert 7.0 ** (finest - coarsest) - 1 < n - 1 <= 7.0 ** (finest - coarsest + 1) - 1   # NCP < 1; one up: 1
        assert f"{n} cells of resolution {finest}" in r.figures
    assert _by_key(closed_form(wide, []))[f"quasi_identifiers.{q.name}.resolutions"].value[0] < \
        _by_key(closed_form(cfg, []))[f"quasi_identifiers.{q.name}.resolutions"].value[0]  # larger domain: coarser


def test_closed_form_window_and_lateness_follow_the_sample():
    cfg = load_config(ROOT / "configs" / "citibike-h3.toml")
    # 30 units every 600 s: 2k distinct units within the shortest candidate holding them
    many = _by_key(closed_form(cfg, _events(30, 40, 600)))["anonymization.window_s"].value
    few = _by_key(closed_form(cfg, _events(4, 40, 600)))["anonymization.window_s"].value
    assert many <= 900 and few > many       # fewer units than 2k: no short window reaches the target
    late = _by_key(closed_form(cfg, _events(30, 40, 600, shuffle_lag_s=3000)))["stream.allowed_lateness_s"]
    # round 5 is sent 3000 s early in time, after round 4 (whose last event is at +4*600+29 s): lags up to 2429 s
    assert late.value == 2460 and "p99" in late.figures and "10.0% of the sample arrives later" in late.figures
    on_time = _by_key(closed_form(cfg, _events(30, 40, 600)))["stream.allowed_lateness_s"]
    assert on_time.value <= 60


def test_apply_writes_the_suggestions_and_none_removes_a_key():
    import tomllib
    raw = tomllib.loads((ROOT / "configs" / "citibike-h3.toml").read_text())
    cfg = load_config(ROOT / "configs" / "citibike-h3.toml")
    s = closed_form(cfg, _events(30, 40, 600))
    out = apply(raw, s)
    by = _by_key(s)
    assert out["anonymization"]["window_s"] == by["anonymization.window_s"].value
    assert out["stream"]["allowed_lateness_s"] == by["stream.allowed_lateness_s"].value
    assert any(q.get("resolutions") == by[f"quasi_identifiers.{q['name']}.resolutions"].value
               for q in out["quasi_identifiers"] if q.get("hierarchy") == "h3")
    doc = apply_settings({"anonymization": {"strategy": "grouping", "strategy_params": {"l": 2}}},
                         {STRATEGY: "mondrian", STRATEGY_PARAMS: None})
    assert doc == {"anonymization": {"strategy": "mondrian"}}


def test_split_by_time_keeps_the_order_and_cuts_at_the_quantile():
    cfg = _config()
    events = _events(5, 20, 600)[::-1]                 # arrival order: latest first
    train, held, cut = split_by_time(cfg, events, 0.25)
    assert len(train) + len(held) == len(events) and abs(len(train) - 25) <= 5
    assert max(e["event_time"] for e in train) == cut < min(e["event_time"] for e in held)
    assert train == [e for e in events if e["event_time"] <= cut]        # the sample's order kept


def test_strategies_are_judged_on_runs_of_consecutive_windows_spread_over_the_part():
    cfg = _config()
    events = _events(3, 100, 600)                         # 100 windows of 600 s, 3 events each
    part = spread_windows(cfg, events, 600, 1200, 12, small=0)
    wins = sorted({(e["event_time"] - T0) // 600 for e in part})
    assert len(wins) == 12 and wins[0] == 0 and wins[-1] == 99          # 4 runs of 3: a record can wait 1,200 s
    assert all(b - a == 1 for i, (a, b) in enumerate(zip(wins, wins[1:])) if i % 3 != 2)
    assert part == [e for e in events if (e["event_time"] - T0) // 600 in set(wins)]
    assert spread_windows(cfg, events, 600, 1200, 12) == events       # a small part is used whole


def test_search_finds_a_longer_window_within_the_latency_limit_and_reports_held_out():
    """Units report every 1,800 s, one every 300 s: a 600 s window holds 2 of them, too few for k = 3 (records
    wait, are suppressed); a longer window within max_delay_s <= 3,600 forms classes with no more suppression."""
    cfg = _config(window_s=600, max_delay_s=600)
    events = _events(6, 40, 1800, stagger_s=300)
    result = search(cfg, events, {WINDOW: 600}, max_delay_limit_s=3600, strategies=())
    base = result.figures(result.current)
    chosen = result.figures(result.chosen)
    assert result.chosen[WINDOW] > 600 and result.chosen[MAX_DELAY] <= 3600
    assert chosen.ncp < base.ncp and chosen.suppressed <= base.suppressed
    assert all(c.settings[MAX_DELAY] <= 3600 for c in result.candidates if c is not result.beyond_limit)
    assert result.beyond_limit.settings[MAX_DELAY] == 7200           # reported, never chosen
    h = result.held_out
    assert h["events"] + result.train["events"] == len(events)
    # the held-out figures are runs of the engine on the later part, not copies of the choosing part's
    later = split_by_time(cfg, events, 0.5)[1]
    assert (h["current"].ncp, h["current"].suppressed) == (run_settings(cfg, later).ncp,
                                                           run_settings(cfg, later).suppressed)
    assert h["chosen"].ncp == run_settings(with_settings(cfg, result.chosen), later).ncp != h["current"].ncp
    # deterministic: the same choice and figures again
    again = search(cfg, events, {WINDOW: 600}, max_delay_limit_s=3600, strategies=())
    assert again.chosen == result.chosen
    assert [(c.settings, c.figures.ncp, c.figures.suppressed) for c in again.candidates] == \
        [(c.settings, c.figures.ncp, c.figures.suppressed) for c in result.candidates]


def test_search_never_lengthens_max_delay_beyond_the_limit_nor_suppresses_more():
    """With the limit at the current 1,200 s the 1,800 s window does not fit; whatever the search takes (a
    window, a strategy) suppresses no more than the current settings on the same events and has the lowest NCP
    of those that do."""
    cfg = _config(window_s=600, max_delay_s=1200)
    result = search(cfg, _events(6, 40, 1800, stagger_s=300), {WINDOW: 600}, max_delay_limit_s=1200,
                     strategies=("mondrian", "utility-clustering"))
    assert result.chosen[MAX_DELAY] <= 1200 and result.chosen[WINDOW] <= 1200
    assert any(c.settings[STRATEGY] == "utility-clustering" for c in result.candidates)
    base, chosen = result.figures(result.current), result.figures(result.chosen)
    assert chosen.suppressed <= base.suppressed and chosen.ncp <= base.ncp
    windows = [c for c in result.candidates if c.part == "train" and c.settings[STRATEGY] == "mondrian"
               and c is not result.beyond_limit and c.figures.suppressed <= base.suppressed]
    assert chosen.ncp <= min(c.figures.ncp for c in windows)


def test_lateness_from_the_arrival_lag_is_taken_when_it_saves_late_events():
    """Every 10th round arrives 1,500 s behind: with no allowed lateness its events are late and suppressed; the
    closed-form lateness (the p99 lag) keeps them in their windows."""
    cfg = _config(window_s=600, max_delay_s=1200, stream={"late_policy": "suppress"})
    events = _events(10, 30, 600, shuffle_lag_s=1500)
    suggestions, result = suggest(cfg, events, strategies=())
    late = _by_key(suggestions)[LATENESS]
    assert late.closed_form > 0 and late.value == late.closed_form
    base, chosen = result.figures(result.current), result.figures(result.chosen)
    assert base.late_suppressed > 0 and chosen.late_suppressed == 0 and chosen.ncp < base.ncp
    assert result.held_out["chosen"].late_suppressed <= result.held_out["current"].late_suppressed


def test_suggest_values_come_from_the_search_with_the_closed_form_in_the_figures():
    cfg = _config(window_s=600, max_delay_s=600)
    suggestions, result = suggest(cfg, _events(6, 40, 1800, stagger_s=300), max_delay_limit_s=3600,
                                  strategies=())
    by = _by_key(suggestions)
    assert by[WINDOW].value == result.chosen[WINDOW] and by[WINDOW].current == 600
    assert f"closed form {by[WINDOW].closed_form}" in by[WINDOW].figures
    raw = apply(copy.deepcopy(cfg.raw), suggestions)
    assert parse_config(raw).anonymization.window_s == result.chosen[WINDOW]


def test_calibrate_apply_suggestions_writes_what_it_prints(tmp_path, capsys):
    from stream_anon.cli import main
    out = tmp_path / "obd2.toml"
    assert main(["calibrate", "--config", str(ROOT / "configs" / "obd2.toml"), "--dataset", "obd2", "--events", "1500",
                 "--out", str(out), "--apply-suggestions"]) == 0
    printed = capsys.readouterr().out
    assert "search: " in printed and "<- current" in printed and "held out (750 events" in printed
    cfg = load_config(out)
    suggested = dict(line[len("suggest "):].split(" (now ")[0].split(" = ", 1)
                     for line in printed.splitlines() if line.startswith("suggest "))
    assert suggested.get("anonymization.strategy", "mondrian") == cfg.anonymization.strategy
    assert float(suggested["anonymization.window_s"]) == cfg.anonymization.window_s
    assert float(suggested["anonymization.max_delay_s"]) == cfg.anonymization.max_delay_s <= 172800


def test_a_sample_out_of_event_time_order_is_named_with_what_to_do(tmp_path):
    """A file in unit order (vehicle after vehicle, each in time order; issue 43 item 8): nearly every event arrives
    behind one read before it. ``calibrate --suggest`` says the sample is not in event-time order, with the share
    measured and what to do, instead of keeping the lateness silently; the audit of that stream run in that order
    names lateness as the dominant cause of suppression. The same sample in time order gets no warning."""
    import json
    import sys

    from stream_anon.calibrate import toml_text
    from stream_anon.suggest import search_report
    sys.path.insert(0, str(Path(__file__).parents[1] / "inputs"))
    from test_inputs import _audit, _run_core

    cfg = _config(window_s=600, max_delay_s=600, stream={"late_policy": "suppress"})
    in_time = _events(8, 30, 600)
    by_unit = sorted(in_time, key=lambda e: e["vehicle_id"])
    suggestions, result = suggest(cfg, by_unit, strategies=())
    lines = search_report(suggestions, result)
    import re
    share = re.match(r"warning: the sample is not in event-time order: (\d+\.\d)% of its events arrive later than "
                     r"the current allowed_lateness_s = 0 s behind an event read before them", lines[-1])
    assert share and float(share.group(1)) > 80, lines[-1]
    assert "Sort the file by event time before replaying it" in lines[-1] and "raise stream.allowed_lateness_s" \
        in lines[-1]
    late = _by_key(suggestions)[LATENESS]
    assert "keeps the current value" not in late.figures and "out of event-time order" in late.figures
    assert not any(ln.startswith("warning:") for ln in search_report(*suggest(cfg, in_time, strategies=())))

    path = tmp_path / "t.toml"       # the sample as JSON messages through a mapped [input], in unit order
    fields = {f: f for f in ("vehicle_id", "event_time", "latitude", "longitude")}
    path.write_text(toml_text({**cfg.raw, "input": {"format": "json", "fields": fields}}))
    cfg = load_config(path)
    messages = [json.dumps(e).encode() for e in by_unit]
    out, _ = _run_core(cfg, messages, tmp_path)
    text = _audit(path, cfg, messages, out).format_text()
    assert "\n  most suppressed events are late: " in text and "sort the input by event time" in text, text
