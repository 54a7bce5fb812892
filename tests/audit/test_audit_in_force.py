"""The audit judges each release by the settings in force when it was made (stream_anon/audit/in_force.py), no
broker: the walk over a partition's manifests (two changes in a row, an unrecorded change, an earlier config that
matches nothing, a k change and a hierarchy change in one manifest), a whole audit across a regrouped hierarchy with
and without ``--earlier-config``, and the audit's settings agree with the worker's (stream_anon/guarantees.py) on
every bundled config and hierarchy. The broker run: tests/kafka/test_config_change_dp_kafka.py."""
from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import copy_hierarchies  # noqa: E402
from test_audit import SECRET, cfg, scenario  # noqa: E402

from stream_anon import contract, guarantees  # noqa: E402
from stream_anon.audit import AuditConfig, Hierarchy, QISpec, audit  # noqa: E402
from stream_anon.audit.in_force import ANY, TRACKED, audit_settings, read_value, same, settings_in_force  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.hierarchy import Hierarchy as EngineHierarchy  # noqa: E402
from stream_anon.render import Renderer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TREE = {"*": {"Rail": {"Zone 1": ["Aldgate", "Bank"], "Zone 3": ["Ealing"]}, "Bus": {"Routes 1-99": ["7"]}}}
MOVED = {"*": {"Rail": {"Zone 1": ["Bank"], "Zone 3": ["Aldgate", "Ealing"]}, "Bus": {"Routes 1-99": ["7"]}}}
RENAMED = {"*": {"Rail": {"Zone 1": ["Aldgate", "Bank"], "Zone 3": ["Ealing"]}, "Bus": {"Routes": ["7"]}}}
HIER = "quasi_identifiers.location.hierarchy"


def digest(tree) -> str:
    return Hierarchy(tree).content_digest()


def config(k: int, tree, name: str) -> AuditConfig:
    return AuditConfig(k=k, privacy_unit="card", quasi_identifiers=[QISpec("location", "station", "station", tree)],
                       source=name)


def manifests(*changes: list[str], partition: int = 0) -> list[dict]:
    """One manifest per entry, seq 1.. in order; entry i carries the change lines given for it."""
    return [{"release_id": f"p{partition}-{i + 1}", "partition": partition, "seq": i + 1,
             **({"settings_changed": lines} if lines else {})} for i, lines in enumerate(changes)]


def test_two_changes_in_a_row_give_each_release_the_config_in_force():
    k_down, regroup = "anonymization.k 10 -> 5", f"{HIER} {digest(TREE)} -> {digest(MOVED)}"
    ms = manifests([], [], [k_down], [], [regroup], [])
    newest, middle, first = config(5, MOVED, "new"), config(5, TREE, "middle"), config(10, TREE, "first")
    s = settings_in_force(ms, [newest, middle, first])
    assert {rid: s.config_of(rid).source for rid in s.k_of} == {
        "p0-6": "new", "p0-5": "new", "p0-4": "middle", "p0-3": "middle", "p0-2": "first", "p0-1": "first"}
    assert s.k_of == {"p0-6": 5, "p0-5": 5, "p0-4": 5, "p0-3": 5, "p0-2": 10, "p0-1": 10}
    assert s.problems == [] and [c["change"] for c in s.changes] == [k_down, regroup]
    assert [(e["config"], e["releases"]) for e in s.judged_by()] == [("new", 2), ("middle", 2), ("first", 2)]
    # without the middle config, the releases between the changes were made under a hierarchy no config has
    s = settings_in_force(ms, [newest, first])
    assert s.config_index["p0-4"] is None and s.unmatched["p0-4"] == {HIER: digest(TREE)}
    assert s.config_of("p0-4").k == 5 and s.config_of("p0-2").source == "first"
    assert [(e["line"].split(" was")[0], e["releases"]) for e in s.unmatched_lines("coverage")] == [
        ("coverage: release p0-4", 2)]
    # a k change alone needs no earlier config: the releases before it are judged with the k in force then
    s = settings_in_force(manifests([], [k_down]), [config(5, TREE, "new")])
    assert s.config_index["p0-1"] is None and "p0-1" not in s.unmatched and s.config_of("p0-1").k == 10
    assert s.judged_by()[1] == {"config": None, "releases": 1, "unjudged": 0, "k": [10]}


def test_two_k_changes_in_a_row_in_two_manifests_or_stated_together_in_one():
    """k 10 -> 3, then 3 -> 6: each release judged by the k it was made under, whether a release came between the
    two changes or not (then its manifest states both, oldest first)."""
    down, up = "anonymization.k 10 -> 3", "anonymization.k 3 -> 6"
    apart = manifests([], [down], [], [up])
    for m, k in zip(apart, (10, 3, 3, 6)):
        m["k"] = k
    s = settings_in_force(apart, [config(6, TREE, "new")])
    assert s.k_of == {"p0-4": 6, "p0-3": 3, "p0-2": 3, "p0-1": 10} and s.problems == []
    assert [c["change"] for c in s.k_changes] == [down, up]
    together = manifests([], [down, up])
    for m, k in zip(together, (10, 6)):
        m["k"] = k
    s = settings_in_force(together, [config(6, TREE, "new")])
    assert s.k_of == {"p0-2": 6, "p0-1": 10} and s.problems == []
    assert sorted(c["change"] for c in s.k_changes) == [down, up]
    assert s.config_of("p0-1").k == 10


def test_an_unrecorded_change_is_a_consistency_violation():
    ms = manifests([], [], [])
    for m, k in zip(ms, (10, 5, 5)):
        m["k"] = k                                      # k went 10 -> 5 at release 2 with no settings_changed
    s = settings_in_force(ms, [config(5, TREE, "new"), config(10, TREE, "old")])
    assert s.problems == [("manifest k differs from the k in force", {"release_id": "p0-1", "manifest_k": 10, "k": 5})]
    assert s.config_of("p0-1").source == "new"          # nothing recorded: judged by the settings in force
    # a recorded change whose new side is not the setting in force (the audit given the old hierarchy)
    ms = manifests([], [f"{HIER} {digest(TREE)} -> {digest(MOVED)}"])
    s = settings_in_force(ms, [config(5, TREE, "old")])
    assert [name for name, _ in s.problems] == ["recorded change does not lead to the setting in force"]


def test_an_earlier_config_that_matches_nothing_judges_nothing_and_coverage_names_the_setting():
    ms = manifests([], [], [f"{HIER} {digest(TREE)} -> {digest(MOVED)}"], []) \
        + manifests([], [f"{HIER} {digest(TREE)} -> {digest(MOVED)}"], partition=1)
    s = settings_in_force(ms, [config(5, MOVED, "new"), config(5, RENAMED, "other")])
    assert [(e["config"], e["releases"]) for e in s.judged_by()] == [("new", 3), ("other", 0), (None, 3)]
    assert s.unmatched["p0-2"] == {HIER: digest(TREE)} and s.skipped("p0-2", "coverage") == {HIER}
    lines = s.unmatched_lines("coverage")
    assert [(e["line"], e["releases"]) for e in lines] == [
        (f"coverage: release p0-2 was made under {HIER} {digest(TREE)} ; give the config in force then with "
         "--earlier-config", 3)]
    assert s.unmatched_lines("leaks") == s.unmatched_lines("l_diversity") == []


def test_a_k_change_and_a_hierarchy_change_in_one_manifest():
    ms = manifests([], [], ["anonymization.k 10 -> 5", f"{HIER} {digest(TREE)} -> {digest(MOVED)}"], [])
    new, old = config(5, MOVED, "new"), config(10, TREE, "old")
    s = settings_in_force(ms, [new, old])
    assert [s.config_of(f"p0-{i}").source for i in (1, 2, 3, 4)] == ["old", "old", "new", "new"]
    assert s.problems == [] and len(s.changes) == 2
    # given only a config of the old k and another hierarchy, nothing matches the releases before: the k check
    # still has their k; coverage names the hierarchy
    s = settings_in_force(ms, [new, config(10, RENAMED, "other")])
    assert s.config_index["p0-1"] is None and s.k_of["p0-1"] == 10 and s.config_of("p0-1").k == 10
    assert s.unmatched["p0-1"] == {HIER: digest(TREE)}


def test_criteria_and_granularity_are_compared_and_unreadable_criteria_match_any_config():
    line = 'anonymization.criteria[0] {"field": "fare", "kind": "distinct_l_diversity", "l": 2} -> (absent)'
    assert read_value("anonymization.criteria[0]", line.split(" ", 1)[1].split(" -> ")[0]) == \
        ("distinct_l_diversity", "fare", 2.0)
    assert read_value("anonymization.criteria[0]", '{"cap": null, "default_severity": null, "diversity": tr...') is ANY
    assert same(read_value("quasi_identifiers.fare.granularity", "10.0"), 10.0)
    # a criterion removed: the releases before it need a config with that criterion
    from stream_anon.audit.config import LDiversitySpec
    new = AuditConfig(k=5, privacy_unit="card", source="new")
    old = dataclasses.replace(new, criteria=[LDiversitySpec("distinct_l_diversity", "fare", 2.0)], source="old")
    s = settings_in_force(manifests([], [line], []), [new])
    assert s.unmatched["p0-1"] == {"anonymization.criteria[0]": line.split(" ", 1)[1].split(" -> ")[0]}
    assert s.unmatched_lines("l_diversity")[0]["line"].startswith("l_diversity: release p0-1 was made under "
                                                                  "anonymization.criteria[0] {")
    assert settings_in_force(manifests([], [line], []), [new, old]).config_of("p0-1").source == "old"


def regrouped_outputs():
    """test_audit's scenario with the location hierarchy regrouped between its two releases (Aldgate moved from
    Zone 1 to Zone 3): release 1's label "Zone 1" for Aldgate covers it only under the hierarchy in force then."""
    raw, out = scenario()
    out = copy.deepcopy(out)
    r2 = out["manifests"][1]
    for r in out["records"]:
        if r["class_id"] == r2["classes"][1]["class_id"]:
            r["qi"]["location"]["label"] = "Rail"         # class 2 of release 2 (Aldgate, Bank) under the new tree
    r2["classes"][1]["generalization"]["location"]["label"] = "Rail"
    r2["settings_changed"] = [f"{HIER} {digest(TREE)} -> {digest(MOVED)}"]
    return raw, out


def with_tree(tree, name: str) -> AuditConfig:
    c = cfg()
    return dataclasses.replace(c, quasi_identifiers=[dataclasses.replace(q, hierarchy=Hierarchy(tree))
                                                     if q.name == "location" else q for q in c.quasi_identifiers],
                               source=name)


def test_the_audit_across_a_regrouped_hierarchy_passes_with_the_earlier_config_and_names_it_without():
    raw, out = regrouped_outputs()
    new, old = with_tree(MOVED, "new.toml"), with_tree(TREE, "old.toml")
    report = audit(raw, out, SECRET, new, earlier_configs=[old])
    assert report.passed, report.format_text()
    assert "  settings in force: new.toml judged 1 release; earlier config old.toml judged 1 release" in \
        report.format_text().splitlines()
    line = (f"coverage: release test-p0-000001 was made under {HIER} {digest(TREE)} ; give the config in force then "
            "with --earlier-config")
    for earlier in ([], [with_tree(RENAMED, "other.toml")]):
        report = audit(raw, out, SECRET, new, earlier_configs=earlier)
        assert [n for n, c in report.checks.items() if not c["passed"]] == ["coverage"], report.format_text()
        assert [e["line"] for e in report.checks["coverage"]["examples"]] == [line]
        assert f"      - {line}" in report.format_text().splitlines()
        assert json.dumps(report.to_dict())
    # judged under the new hierarchy alone (today's behaviour), release 1's Aldgate label would fail as a cover
    assert not audit(raw, {**out, "manifests": [{k: v for k, v in m.items() if k != "settings_changed"}
                                                for m in out["manifests"]]}, SECRET, new).passed


# ------------------------------------------------------------------ the audit's settings agree with the worker's
def _worker_value(key: str, value) -> object:
    """A worker's setting as the audit reads it from a change line (guarantees.changes shows it)."""
    line = guarantees.changes({key: value}, {})[0]
    return read_value(key, line.split(" ", 1)[1].rsplit(" -> ", 1)[0])


CRITERIA = """
[[anonymization.criteria]]
kind = "distinct_l_diversity"
field = "product_category"
l = 2

[[anonymization.criteria]]
kind = "entropy_l_diversity"
field = "full_fare_pence"
l = 1.5

[[anonymization.criteria]]
kind = "severity"
field = "fare_product"
severity = { PAYG = 2, Other = 3 }
"""


INPUTS = sorted(f"inputs/{p.stem}" for p in (ROOT / "configs" / "inputs").glob("*.toml"))


@pytest.mark.parametrize("name", [*contract.config_names(), *INPUTS, "oyster with criteria"])
def test_the_audit_computes_the_settings_it_compares_as_the_worker_records_them(name, tmp_path):
    path = ROOT / "configs" / f"{name}.toml" if name.startswith("inputs/") else contract.config_path(name.split(" ")[0])
    if name.endswith("criteria"):                       # no bundled config has [[anonymization.criteria]]
        copy_hierarchies(tmp_path)
        path = tmp_path / "criteria.toml"
        path.write_text(contract.config_path("oyster").read_text() + CRITERIA)
    audit_config, worker_config = AuditConfig.from_toml(path), load_config(path)
    ours, theirs = audit_settings(audit_config), guarantees.settings(worker_config)
    # the input reading the manifests state (the renderer's) is the one the audit reads from the config
    assert audit_config.input_digest == Renderer(worker_config, b"s").input_digest
    compared = {key for key in theirs if TRACKED.match(key)}
    assert compared == set(ours)
    for key in compared:
        value = _worker_value(key, theirs[key])
        assert value is not ANY and same(value, ours[key]), (name, key, theirs[key], ours[key])
    if name.endswith("criteria"):                       # every criterion is read, the severity rule whole
        assert [_worker_value(f"anonymization.criteria[{i}]", theirs[f"anonymization.criteria[{i}]"])
                for i in range(3)] == [("distinct_l_diversity", "product_category", 2.0),
                                       ("entropy_l_diversity", "full_fare_pence", 1.5),
                                       ("severity", "fare_product", (("Other", 3.0), ("PAYG", 2.0)), 10, 3.0, None, 1,
                                        True)]


def test_the_hierarchy_digest_formulas_agree_on_the_bundled_hierarchies(tmp_path):
    files = sorted((ROOT / "configs" / "hierarchies").glob("*.json"))
    arx = tmp_path / "arx.csv"                          # the ARX format (value;parent;...;*), children out of order
    arx.write_text("Bank;Zone 1;Rail;*\nEaling;Zone 3;Rail;*\nAldgate;Zone 1;Rail;*\n7;Routes;Bus;*\n")
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps({"tree": MOVED}))
    assert len(files) >= 4
    digests = set()
    for path in [*files, arx, moved]:
        engine = EngineHierarchy.from_arx_csv(path) if path.suffix == ".csv" else EngineHierarchy.from_json(path)
        ours = Hierarchy.load(path).content_digest()
        assert ours == guarantees._plain(engine), path
        digests.add(ours)
    assert len(digests) == len(files) + 2


def test_a_settings_fingerprint_that_changes_without_a_recorded_change_is_a_consistency_violation():
    """The worker fences every setting it digests: another fingerprint at a release that records no change is a
    change made around the fence (a setting the worker did not record, or manifests of two configs mixed)."""
    ms = manifests([], [], [], ["anonymization.k 10 -> 5"])
    for m, fp in zip(ms, ("sha256:aa", "sha256:aa", "sha256:bb", "sha256:cc")):
        m["settings_fingerprint"] = fp
    s = settings_in_force(ms, [config(5, TREE, "new"), config(10, TREE, "old")])
    assert s.problems == [("settings fingerprint changed without a recorded change",
                           {"release_id": "p0-3", "fingerprint": "sha256:bb", "before": "sha256:aa",
                            "release_before": "p0-2"})]
    # the same change recorded where the fingerprint changes: nothing to report
    ms[2]["settings_changed"], ms[3]["settings_fingerprint"] = ms[3].pop("settings_changed"), "sha256:bb"
    assert settings_in_force(ms, [config(5, TREE, "new"), config(10, TREE, "old")]).problems == []
