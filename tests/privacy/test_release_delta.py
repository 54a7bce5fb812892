"""k against a reader of the releases in order (issue 46): a reused class's additions in one release hold k
individuals. The attack (stream_anon.attacks.release_delta) singles targets out of a naive engine's releases (reuse
without the rule) and finds no candidate set below k in ours; the audit's ``release_delta`` check fails the naive
output and passes ours. Late citibike trips under ``late_policy = "next_release"`` are reused into earlier classes."""
from __future__ import annotations

import json

import numpy as np
import pytest

import stream_anon.engine.decide as engine_module
from stream_anon.attacks.release_delta import entries_of, release_delta_attack
from stream_anon.audit import audit
from stream_anon.audit.config import AuditConfig
from stream_anon.config import load_config, parse_config
from stream_anon.datasets import load_events
from stream_anon.engine.space import parse_time
from stream_anon.formers.base import SUPPRESSED_THIN_REUSE
from test_lateness import SECRET, releases_of

CONFIG = "configs/citibike.toml"


def late_trips():
    """(config, events): 4,000 citibike trips arriving up to 4 h late (lateness 30 min, late records go to a
    covering earlier class)."""
    base = load_config(CONFIG)
    raw = {**base.raw, "stream": {**base.raw["stream"], "allowed_lateness_s": 1800, "late_policy": "next_release"},
           "anonymization": {**base.raw["anonymization"], "reuse_horizon_s": 86400}}
    cfg = parse_config(raw, base_dir=base.source.parent, source=base.source)
    events = load_events("citibike")[:4000]
    rng = np.random.default_rng(0)
    return cfg, [events[i] for i in np.argsort([parse_time(e["event_time"]) + rng.uniform(0, 4 * 3600)
                                                for e in events], kind="stable")]


def naive_reuse(monkeypatch):
    """The engine without the rule: every reused entry published, whatever its individuals."""
    monkeypatch.setattr(engine_module, "thin_reuse_entries", lambda reused, units, k: np.zeros(0, np.int64))


def late_trips_run(naive: bool, monkeypatch) -> tuple[list, list, dict]:
    cfg, arrival = late_trips()
    if naive:
        naive_reuse(monkeypatch)
    rels, _, _ = releases_of(cfg, arrival, batch=250)
    monkeypatch.undo()
    raw_msgs = [(("raw.vehicle.citibike", 0, i), json.dumps(e)) for i, e in enumerate(arrival)]
    outputs = {"records": [x for r in rels for x in r.records], "manifests": [r.manifest() for r in rels],
               "deadletters": []}
    return rels, arrival, audit_of(raw_msgs, outputs)


def audit_of(raw_msgs, outputs):
    acfg = AuditConfig.from_toml(CONFIG)
    acfg.max_suppression_ratio = 0.25       # the shuffled arrival suppresses late trips on purpose
    return audit(raw_msgs, outputs, SECRET, acfg)


def attack(rels, events, k):
    from stream_anon import crypto
    field = load_config(CONFIG).stream.privacy_unit
    unit = {crypto.audit_token(SECRET, e["event_id"]): e[field] for e in events}
    return release_delta_attack(entries_of([x for r in rels for x in r.records],
                                           lambda r: unit.get(r["audit_token"])), k=k)


@pytest.mark.parametrize("naive", [True, False], ids=["naive", "ours"])
def test_the_release_delta_attack_singles_out_newcomers_of_naive_reuse_only(naive, monkeypatch):
    k = load_config(CONFIG).anonymization.k
    rels, events, report = late_trips_run(naive, monkeypatch)
    assert sum(c.reused for r in rels for c in r.classes) > 0          # reuse happens in both
    res = attack(rels, events, k)
    check = report.checks["release_delta"]
    if naive:
        assert res["singled_out"] > 0 and res["min_candidates"] == 1
        assert not check["passed"] and check["entries_below_k"] == res["entries_below_k"] > 0
        assert check["examples"][0]["violation"] == "release adds fewer than k individuals to a reused class"
    else:
        assert res["singled_out"] == 0 and res["min_candidates"] >= k and res["entries_below_k"] == 0
        assert report.passed, report.format_text()
        assert check["min_candidates"] == res["min_candidates"] and check["targets"] == res["targets"]
        thin = sum(len(r.suppressed_tokens.get(SUPPRESSED_THIN_REUSE, ())) for r in rels)
        assert report.summary["suppressed_by_reason"][SUPPRESSED_THIN_REUSE] == thin > 0


@pytest.mark.parametrize("naive", [True, False], ids=["naive", "ours"])
def test_calibrate_suggest_judges_settings_by_the_attacks_smallest_candidate_set(naive, monkeypatch):
    from stream_anon.suggest_search import _admissible, run_settings

    cfg, events = late_trips()
    if naive:
        naive_reuse(monkeypatch)
    figures = run_settings(cfg, events)
    monkeypatch.undo()
    k = cfg.anonymization.k
    assert f"smallest candidate set {figures.min_candidates}" in figures.brief()
    if naive:       # as good as itself in every other figure, refused for the attack alone
        assert figures.min_candidates == 1 and not _admissible(figures, figures, k)
    else:
        assert figures.min_candidates >= k and _admissible(figures, figures, k)
