"""Privacy criteria apart from search (stream_anon.criteria): what each criterion computes on known classes, their
parameter validation, the [[anonymization.criteria]] syntax, and the k-anonymous former's enforcement against
strategies that ignore the criteria (a faulty strategy costs utility, never privacy)."""
from __future__ import annotations

import json
import math
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from stream_anon.audit import AuditConfig, audit
from stream_anon.calibrate import toml_text
from stream_anon.config import load_config, with_files_beside
from stream_anon.criteria import (Classes, Column, DistinctLDiversity, EntropyLDiversity, FrequencyLDiversity,
                                  KIndividuals, SeverityRule, parse_criteria)
from stream_anon.datasets import load_events
from stream_anon.engine import Engine
from stream_anon.errors import ConfigError
from stream_anon.formers.kanon import KAnonymousFormer
from stream_anon.strategies import make_strategy

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"criteria-test-secret-0123456789"


def classes(*groups, units=None) -> Classes:
    """Classes of the given value lists; one individual per record unless ``units`` (one list per class)."""
    values = [v for g in groups for v in g]
    units = np.arange(len(values)) if units is None else np.array([u for us in units for u in us])
    bounds = np.cumsum([0] + [len(g) for g in groups])
    return Classes.of([np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])], units,
                      {"s": Column.encode(values)})


# --------------------------------------------------------------------------------------------- the criteria
def test_l_diversity_variants_on_known_classes():
    dominated = ["a"] * 6 + ["b", "c"]                 # 3 distinct, entropy 0.736 < log 3, top share 0.75
    uniform = ["a", "b", "c"] * 2                        # entropy exactly log 3, top share 1/3
    c = classes(dominated, uniform, ["a", "a", "a"])
    assert DistinctLDiversity("s", 3).holds(c).tolist() == [True, True, False]
    assert EntropyLDiversity("s", 3).holds(c).tolist() == [False, True, False]
    assert FrequencyLDiversity("s", 3).holds(c).tolist() == [False, True, False]
    assert EntropyLDiversity("s", 2).holds(c).tolist() == [True, True, False]      # exp(0.736) = 2.09 >= 2
    h = -(0.75 * math.log(0.75) + 2 * 0.125 * math.log(0.125))
    assert EntropyLDiversity("s", math.exp(h) - 1e-6).holds(c).tolist()[0]
    assert not EntropyLDiversity("s", math.exp(h) + 1e-6).holds(c).tolist()[0]


def test_distributions_count_individuals_not_records():
    # one individual with five "a" records among four others with "b": 1 of 5 individuals holds "a"
    c = classes(["a"] * 5 + ["b"] * 4, units=[[0] * 5 + [1, 2, 3, 4]])
    assert FrequencyLDiversity("s", 1.25).holds(c).tolist() == [True]       # top share 4/5 <= 1/1.25
    assert not FrequencyLDiversity("s", 1.3).holds(c)[0]
    assert KIndividuals(5).holds(c).tolist() == [True] and not KIndividuals(6).holds(c)[0]
    # counted in records "a" would be the top value at 5/9
    records = classes(["a"] * 5 + ["b"] * 4)
    assert FrequencyLDiversity("s", 1.8).holds(records)[0] and not FrequencyLDiversity("s", 1.8).holds(c)[0]


def test_null_is_a_value_and_booleans_are_not_numbers():
    assert Column.encode([None, None, 1, 1.0, True, "1"]).codes.tolist() == [0, 0, 1, 1, 2, 3]
    assert not DistinctLDiversity("s", 2).holds(classes([None, None]))[0]
    assert DistinctLDiversity("s", 2).holds(classes([None, "x"]))[0]


def test_severity_rule_reproduces_the_papers_examples():
    sev = {"Theft": 5, "Embezzlement": 3, "Robbery": 7, "Drunken Driving": 5, "Murder": 25}
    rule = SeverityRule("s", sev, k_min=5, cap=5)
    example3 = ["Theft", "Embezzlement", "Robbery", "Drunken Driving", "Theft"]       # AS_e 5 > l_e 4
    diverse = ["Theft", "Embezzlement", "Robbery", "Drunken Driving", "Disorderly Conduct"]  # AS_e 4.6 <= l_e 5
    sev["Disorderly Conduct"] = 3
    rule = SeverityRule("s", sev, k_min=5, cap=5)
    assert rule.holds(classes(example3, diverse)).tolist() == [False, True]
    sizes = SeverityRule("s", sev, k_min=5, diversity=False)
    murder = ["Murder"] + ["Theft", "Embezzlement", "Robbery", "Drunken Driving"] * 6
    assert sizes.holds(classes(murder[:24], murder)).tolist() == [False, True]   # a Murder needs 25 people
    assert SeverityRule("s", "crime", k_min=5).severity["Murder"] == 25.0
    assert SeverityRule("s", {"x": 2}, k_min=3).scores(["x", "y", None]).tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("build, message", [
    (lambda: DistinctLDiversity("s", 0), r"l: must be in \[1, 1000000\], got 0"),
    (lambda: DistinctLDiversity("s", 2.5), "l: expected an integer"),
    (lambda: EntropyLDiversity("s", float("nan")), "l: expected a finite number"),
    (lambda: FrequencyLDiversity("s", True), "l: expected a number, got boolean"),
    (lambda: DistinctLDiversity("", 2), "field: expected a non-empty string"),
    (lambda: SeverityRule("s", "crimes"), "severity: unknown preset"),
    (lambda: SeverityRule("s", {"a": -1}), r"severity.a: must be in \(0, 1000000\], got -1"),
    (lambda: SeverityRule("s", {"a": 1}, cap=0), r"cap: must be in \[1, 1000000\], got 0"),
    (lambda: SeverityRule("s", {"a": 1}, default_severity=float("inf")), "default_severity: expected a finite number"),
    (lambda: KIndividuals(0), "k: a positive integer"),
])
def test_parameters_are_validated(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --------------------------------------------------------------------------------------------- configuration
SENSITIVE = ("fare_product", "product_category")


@pytest.mark.parametrize("raw, m, message", [
    ([{"kind": "distinct_l_diversty", "field": "fare_product", "l": 3}], None,
     r"anonymization.criteria\[0\].kind: must be one of .*; did you mean distinct_l_diversity\?"),
    ([{"kind": "entropy_l_diversity", "field": "fare_product", "l": 3, "weigth": 1}], None,
     r"anonymization.criteria\[0\].weigth: unknown key; known: field, kind, l"),
    ([{"kind": "distinct_l_diversity", "field": "fare_product"}], None, r"criteria\[0\].l: missing"),
    ([{"kind": "distinct_l_diversity", "field": "card_id", "l": 3}], None,
     r"criteria\[0\].field: 'card_id' is not listed in sensitive.fields"),
    ([{"kind": "distinct_l_diversity", "field": "fare_product", "l": 0}], None, r"criteria\[0\].l: must be in \[1, "),
    ([{"kind": "k", "field": "fare_product"}], None, r"criteria\[0\].kind: k is anonymization.k"),
    ([{"kind": "severity", "field": "fare_product", "severity": {"PAYG": "high"}}], None,
     r"criteria\[0\].severity.PAYG: expected a number"),
    ([{"kind": "distinct_l_diversity", "field": "fare_product", "l": 2}] * 2, None,
     r"criteria\[1\]: a second distinct_l_diversity on 'fare_product'"),
    ([{"kind": "distinct_l_diversity", "field": "product_category", "l": 2}], 3,
     "anonymization.criteria: not combinable with anonymization.m"),
    ({"kind": "distinct_l_diversity"}, None, r"expected \[\[anonymization.criteria\]\] tables"),
])
def test_config_errors_name_the_key(raw, m, message):
    with pytest.raises(ConfigError, match=message):
        parse_criteria(raw, k=10, sensitive=SENSITIVE, m=m)


def test_severity_k_min_comes_from_k_and_the_map():
    (rule,) = parse_criteria([{"kind": "severity", "field": "fare_product", "severity": {"PAYG": 12, "x": 20}}],
                             k=10, sensitive=SENSITIVE)
    assert rule.k_min == 12 and rule.reason == "severity_rule_not_met:fare_product"


def stream_config(tmp_path: Path, name: str = "stream", criteria=None, dataset: str = "oyster",
                  stream: dict | None = None, **anonymization) -> Path:
    """configs/<dataset>.toml without its DP tables, with ``[[anonymization.criteria]]`` and overrides (of
    ``[stream]`` and ``[anonymization]``)."""
    src = ROOT / "configs" / f"{dataset}.toml"
    raw = tomllib.loads(src.read_text())
    raw.pop("dp", None)
    raw.pop("aggregates", None)
    with_files_beside(raw, src.parent, tmp_path)
    raw["stream"].update(stream or {})
    raw["anonymization"].update(anonymization)
    if criteria is not None:
        raw["anonymization"]["criteria"] = criteria
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_text(raw))
    return path


def test_a_stream_config_loads_its_criteria_and_refuses_them_with_m(tmp_path):
    cfg = load_config(stream_config(tmp_path, criteria=[{"kind": "distinct_l_diversity", "field": "fare_product",
                                                         "l": 3}]))
    assert cfg.anonymization.criteria == (DistinctLDiversity("fare_product", 3),)
    assert load_config(ROOT / "configs" / "oyster.toml").anonymization.criteria == ()
    with pytest.raises(ConfigError, match="anonymization.criteria: not combinable with anonymization.m"):
        load_config(stream_config(tmp_path, criteria=[{"kind": "distinct_l_diversity", "field": "fare_product",
                                                       "l": 3}], m=3))
    audit_view = AuditConfig.from_toml(stream_config(tmp_path, criteria=[
        {"kind": "entropy_l_diversity", "field": "fare_product", "l": 2.5}]))
    assert [(c.kind, c.field, c.l) for c in audit_view.criteria] == [("entropy_l_diversity", "fare_product", 2.5)]


# --------------------------------------------------------------------------------------------- enforcement
class Homogeneous:
    """A faulty strategy: classes of k individuals that share one sensitive value (the worst for l-diversity)."""
    name = "homogeneous"
    uses_sensitive = True

    def __init__(self, field: str):
        self.field = field

    def form_classes(self, X, units, k, space, rng=None, sensitive=None):
        values = np.array([str(v) for v in sensitive[self.field]], dtype=object)
        out = []
        for v in sorted(set(values)):
            rows, start = np.flatnonzero(values == v), 0
            for end in range(1, len(rows) + 1):
                if len(set(units[rows[start:end]].tolist())) >= k:
                    out.append(rows[start:end])
                    start = end
        return out


def homogeneous_former(cfg):
    a = cfg.anonymization
    return KAnonymousFormer(Homogeneous("fare_product"), a.k, a.max_class_ncp, a.reuse, cfg.sensitive, a.criteria)


@dataclass
class Run:
    result: object
    records: list
    manifests: list
    report: object


def audited(path: Path, events, former_of=None, view: Path | None = None) -> Run:
    """The engine on ``events`` with the config at ``path``, flushed, and the audit of its output (with the
    config at ``view``, default the same)."""
    cfg = load_config(path)
    engine = Engine(cfg, secret=SECRET, former=former_of(cfg) if former_of else None)
    result = engine.process(events)
    result.extend(engine.flush())
    records = [r for rel in result.releases for r in rel.records]
    manifests = [rel.manifest() for rel in result.releases]
    raw = [((cfg.stream.input_topic, 0, i), json.dumps(e)) for i, e in enumerate(events)]
    report = audit(raw, {"records": records, "manifests": manifests, "deadletters": []}, SECRET,
                   AuditConfig.from_toml(view or path))
    return Run(result, records, manifests, report)


def failures(report) -> dict:
    return {c: r["violations_by_kind"] for c, r in report.checks.items() if not r["passed"]}


@pytest.mark.parametrize("kind, l", [("distinct_l_diversity", 3), ("entropy_l_diversity", 2.5)])
def test_a_strategy_ignoring_l_costs_utility_never_privacy(tmp_path, kind, l):
    events = load_events("oyster", limit=3000)
    ours_path = stream_config(tmp_path, "ours", criteria=[{"kind": kind, "field": "fare_product", "l": l}])
    # the faulty strategy with no criterion configured publishes its homogeneous classes: the audit, told the
    # criterion, fails them (its check has teeth on this input) while k holds
    naive = audited(stream_config(tmp_path, "naive", criteria=[]), events, homogeneous_former, view=ours_path)
    assert naive.records and naive.report.checks["k"]["passed"]
    assert not naive.report.checks["l_diversity"]["passed"]
    # with the criterion the former merges the strategy's classes until they hold
    ours = audited(ours_path, events, homogeneous_former)
    assert ours.report.passed, failures(ours.report)
    assert len(ours.records) >= 0.9 * len(naive.records)      # repaired by merging, not dropped


def test_a_window_that_cannot_be_diverse_is_suppressed_with_the_criterions_reason(tmp_path):
    events = [e for e in load_events("oyster", limit=4000) if e.get("fare_product") == "PAYG"]
    path = stream_config(tmp_path, criteria=[{"kind": "distinct_l_diversity", "field": "fare_product", "l": 2}])
    run = audited(path, events)
    # every check holds, and a run that published nothing is NOT PASSED (docs/operations.md, Audit)
    assert not run.records and all(c["passed"] for c in run.report.checks.values()), failures(run.report)
    assert run.report.verdict == "NOT PASSED" and run.report.verdict_reason.startswith("nothing published")
    reasons = Counter()
    for rel in run.result.releases:
        reasons.update({r: len(t) for r, t in rel.suppressed_tokens.items()})
    assert set(reasons) <= {"distinct_l_diversity_not_met:fare_product", "fewer_than_k_individuals_by_deadline"}
    assert reasons["distinct_l_diversity_not_met:fare_product"] > 0.9 * len(events)
    # before its deadline a record of a failing class waits (deferred), it is not suppressed at once
    first = run.result.releases[0]
    assert first.deferred_tokens and not first.suppressed_tokens


@pytest.mark.parametrize("kind, l, reused", [("distinct_l_diversity", 3, True), ("entropy_l_diversity", 2, False),
                                             ("severity", None, False)])
def test_reuse_of_earlier_classes_only_with_monotone_criteria(tmp_path, kind, l, reused):
    """Late events (every 40th held back to the end) go into an earlier class that covers them
    (``late_policy = "next_release"``): a distinct-l class stays distinct-l (values only add up); an entropy or
    severity class could break, so the former reuses nothing and the late events are suppressed."""
    crit = {"kind": kind, "field": "fare_product"}
    crit.update({"l": l} if l else {"severity": {"Freedom Pass (Disabled)": 12, "PAYG": 1}, "default_severity": 2})
    events = load_events("oyster", limit=6000)
    events = [e for i, e in enumerate(events) if i % 40] + events[::40]
    run = audited(stream_config(tmp_path, criteria=[crit]), events)
    n_reused = sum(c["reused"] for m in run.manifests for c in m["classes"])
    assert (n_reused > 0) == reused
    assert run.report.passed, failures(run.report)
    check = "severity" if kind == "severity" else "l_diversity"
    assert run.report.checks[check]["classes"] > 0


def test_no_criteria_forms_the_same_classes_as_the_strategy_alone(tmp_path):
    """Behaviour preserved: with no criteria the former publishes exactly the strategy's k-classes."""
    events = load_events("oyster", limit=3000)
    cfg = load_config(stream_config(tmp_path))
    strategy = make_strategy("mondrian")
    a = cfg.anonymization
    plain = Engine(cfg, secret=SECRET, former=KAnonymousFormer(strategy, a.k, a.max_class_ncp, a.reuse,
                                                               cfg.sensitive))
    default = Engine(cfg, secret=SECRET)
    out = []
    for engine in (plain, default):
        res = engine.process(events)
        res.extend(engine.flush())
        out.append([r for rel in res.releases for r in rel.records])
    assert out[0] == out[1] and out[0]
