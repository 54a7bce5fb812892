"""A configuration changed on existing state is never taken silently: the partition halts with one line per changed
guarantee setting, unless the operator accepts the change (``--accept-config-change``); then every published class
is retired from reuse, open windows are re-windowed under a new ``window_s``, the change is written into the next
release manifest, buffered records are recoded under a changed hierarchy or domain, and m, the privacy unit, the
event time and the input mapping are refused in place (they need a new state; DP changes:
tests/dp/test_dp_config_change.py). The audit given the configs in force judges each release by the settings it was
made under: a quasi-identifier's bounds, a severity rule, a field moved from the sensitive to the dropped ones, and,
after a privacy unit change, the superseded lineage by its own unit."""
from __future__ import annotations

import copy
import json
import sys
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import copy_hierarchies  # noqa: E402

from stream_anon import contract, crypto  # noqa: E402
from stream_anon.audit import AuditConfig, audit  # noqa: E402
from stream_anon.calibrate import toml_text  # noqa: E402
from stream_anon.config import load_config, parse_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.worker import state as st  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402
from stream_anon.worker.partition import ConfigChangeRefused, check_change  # noqa: E402
from stream_anon.render import TOPICS  # noqa: E402

SECRET = b"config-change-secret-0123456789abcdef"


def parsed(raw: dict, allow_outside_paths: bool = False):
    """A config document of the bundled configs' directory (its hierarchies are there)."""
    return parse_config(raw, base_dir=contract.configs_dir(), allow_outside_paths=allow_outside_paths)


def oyster_raw(**anonymization) -> dict:
    path = contract.config_path("oyster")
    raw = tomllib.loads(path.read_text())
    raw.pop("dp", None)
    raw.pop("aggregates", None)
    raw["anonymization"].update(anonymization)
    return raw


def messages(n: int) -> list[tuple[int, bytes]]:
    return [(i, json.dumps(e).encode()) for i, e in enumerate(load_events("oyster", limit=n))]


def committed_record(core: WorkerCore, msgs) -> tuple[bytes, object]:
    ps = core.parts.get(0) or core.open_partition(0)
    core.process(ps, msgs)
    rec = core.committed(ps, ps.offset)
    return st.encode_state(rec), ps


def test_k_lowered_halts_with_one_line_naming_the_setting():
    core = WorkerCore(parsed(oyster_raw(k=10)), "app", SECRET)
    value, ps = committed_record(core, messages(1500))
    lower = WorkerCore(parsed(oyster_raw(k=3)), "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=lower.kid,
                          settings=lower.settings)
    assert rec.halt == st.HALT_CONFIG_CHANGED and rec.doc is None
    assert rec.changes == ["anonymization.k 10 -> 3"] and rec.detail == "anonymization.k 10 -> 3"
    same = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=core.kid,
                           settings=core.settings)
    assert same.halt is None and same.changes == []


def test_an_accepted_change_retires_published_classes_and_is_written_into_the_next_manifest():
    msgs = messages(3000)
    core = WorkerCore(parsed(oyster_raw(k=10)), "app", SECRET)
    value, ps = committed_record(core, msgs[:1500])
    assert len(ps.engine.registry) > 0
    higher = WorkerCore(parsed(oyster_raw(k=12)), "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=higher.kid,
                          settings=higher.settings, accept_config_change=True)
    assert rec.halt is None and rec.changes == ["anonymization.k 10 -> 12"]
    resumed = higher.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    assert len(resumed.engine.registry) == 0                        # no class that met k = 10 is reused
    out = higher.process(resumed, msgs[1500:])
    manifests = [json.loads(v) for t, _, v in out.messages if t == TOPICS.releases]
    assert manifests and manifests[0]["settings_changed"] == ["anonymization.k 10 -> 12"]
    assert all("settings_changed" not in m for m in manifests[1:])
    assert min(c["individuals"] for m in manifests for c in m["classes"]) >= 12
    # the state now carries the new settings and no change left to publish: the next restart is a plain one
    again = st.encode_state(higher.committed(resumed, resumed.offset))
    later = st.choose_state([value, again], marker=resumed.seq, committed_input=resumed.offset + 1,
                            kid=higher.kid, settings=higher.settings)
    assert later.halt is None and later.changes == [] and "settings_changes" not in later.doc


def test_m_is_refused_even_when_accepted_and_named_beside_an_accepted_dp_change():
    cards = load_config(contract.config_path("oyster-cards"))
    core = WorkerCore(cards, "app", SECRET)
    events = load_events("oyster-cards", limit=1500)
    value, ps = committed_record(core, [(i, json.dumps(e).encode()) for i, e in enumerate(events)])
    raw = copy.deepcopy(cards.raw)
    raw["anonymization"]["m"] = 2
    raw["dp"]["epsilon_per_period"] = raw["dp"]["epsilon_per_period"] * 5       # epsilon x5: DP changes apply
    for aggregate in raw["aggregates"]:                                          # (tests/dp/test_dp_config_change.py)
        aggregate["epsilon"] = aggregate["epsilon"] * 5
    changed = WorkerCore(parsed(raw),
                         "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=changed.kid,
                          settings=changed.settings, accept_config_change=True)
    assert "anonymization.m 3 -> 2" in rec.changes and any(c.startswith("aggregates.") for c in rec.changes)
    with pytest.raises(ConfigChangeRefused) as refused:
        changed.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    assert str(refused.value) == ("anonymization.m 3 -> 2: m binds every individual's signature: changing it needs "
                                  "a new state (a new app id and --new-lineage: docs/operations.md, Lineage)")


def test_a_new_window_length_re_windows_the_open_windows_and_every_event_is_accounted():
    msgs = messages(4000)
    first = WorkerCore(parsed(oyster_raw(window_s=900, max_delay_s=1800)), "app", SECRET)
    out = []
    ps = first.open_partition(0)
    out += first.process(ps, msgs[:2100]).messages
    value = st.encode_state(first.committed(ps, ps.offset))
    assert len(ps.engine.windows) > 0                               # windows open across the change
    config = parsed(oyster_raw(window_s=600, max_delay_s=1800))
    second = WorkerCore(config, "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=second.kid,
                          settings=second.settings, accept_config_change=True)
    assert rec.changes == ["anonymization.window_s 900.0 -> 600.0"]
    resumed = second.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    assert all(min(p["times"]) >= w * 600 and max(p["times"]) < (w + 1) * 600
               for w, p in resumed.engine.windows.windows.items())
    out += second.process(resumed, msgs[2100:]).messages
    out += second.flush(resumed).messages
    outputs = {"records": [], "manifests": [], "deadletters": []}
    for topic, _, value in out:
        kind = {TOPICS.releases: "manifests", TOPICS.deadletter: "deadletters"}.get(topic)
        if topic == TOPICS.records("oyster"):
            kind = "records"
        if kind:
            outputs[kind].append(json.loads(value))
    raw = [(("raw.fare.oyster", 0, off), v) for off, v in msgs]
    path = contract.config_path("oyster")
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(path))
    acc = report.checks["accounting"]
    assert report.checks["k"]["passed"] and acc["passed"] and acc["lost"] == 0
    assert acc["published"] + acc["suppressed"] + acc["dead_lettered"] == 4000


def test_a_quasi_identifier_change_waits_for_the_buffered_records():
    msgs = messages(1500)
    core = WorkerCore(parsed(oyster_raw()), "app", SECRET)
    value, ps = committed_record(core, msgs)
    raw = oyster_raw()
    time_qi = next(q for q in raw["quasi_identifiers"] if q["kind"] == "timestamp")
    time_qi["upper"] = "2009-11-11T06:00:00+00:00"
    changed = WorkerCore(parsed(raw), "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=changed.kid,
                          settings=changed.settings, accept_config_change=True)
    assert len(rec.changes) == 1 and rec.changes[0].startswith(f"quasi_identifiers.{time_qi['name']}.upper ")
    with pytest.raises(ConfigChangeRefused, match="buffered records are coded under the old quasi-identifiers"):
        changed.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    # once the worker has released everything (an idle flush), the same change is taken
    core.flush(ps)
    flushed = st.encode_state(core.committed(ps, ps.offset))
    rec = st.choose_state([value, flushed], marker=ps.seq, committed_input=ps.offset + 1, kid=changed.kid,
                          settings=changed.settings, accept_config_change=True)
    resumed = changed.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    assert resumed.engine.deferred == 0 and resumed.settings_changes == rec.changes


def regrouped(tmp_path) -> tuple[str, str]:
    """The location hierarchy with every third Zone 2 station moved to Zone 3 and one station removed."""
    path = contract.config_path("oyster").parent / "hierarchies" / "oyster_location.json"
    h = json.loads(path.read_text())
    rail = h["tree"]["*"]["Rail"]
    moved = rail["Zones 1-2"]["Zone 2"][::3]
    rail["Zones 1-2"]["Zone 2"] = [s for s in rail["Zones 1-2"]["Zone 2"] if s not in moved]
    rail["Zones 3-4"]["Zone 3"] = moved[1:] + rail["Zones 3-4"]["Zone 3"]       # moved[0] is gone
    out = tmp_path / "regrouped.json"
    out.write_text(json.dumps(h))
    return str(out), moved[0]


def test_a_regrouped_hierarchy_recodes_the_buffered_records_to_their_own_leaves(tmp_path):
    events = load_events("oyster", limit=1500)
    core = WorkerCore(parsed(oyster_raw()), "app", SECRET)
    value, ps = committed_record(core, messages(1500))
    assert len(ps.engine.buffer) > 0
    path, removed = regrouped(tmp_path)
    raw = oyster_raw()
    next(q for q in raw["quasi_identifiers"] if q["name"] == "location")["hierarchy"] = path
    changed = WorkerCore(parsed(raw, allow_outside_paths=True), "app", SECRET)      # the new file is in tmp_path
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=changed.kid,
                          settings=changed.settings, accept_config_change=True)
    assert [c.split(" ")[0] for c in rec.changes] == ["quasi_identifiers.location.hierarchy"]
    resumed = changed.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    # every buffered record's code names its own station (or route) in the new hierarchy; a removed one: missing
    by_token = {crypto.audit_token(SECRET, e["event_id"]): e.get("station") or e.get("bus_route") for e in events}
    d = sum(q.dims for q in changed.config.quasi_identifiers[:[q.name for q in changed.config.quasi_identifiers]
                                                              .index("location")])
    leaves = resumed.engine.space.qis[1].hierarchy.leaves
    buf = resumed.engine.buffer
    missing = resumed.engine.space.missing_code[d]
    for token, code in zip(buf.tokens, buf.X[:, d].tolist()):
        want = by_token[token]
        assert (code == missing) if want in (None, removed) else leaves[int(code)] == want
    assert len(buf) > 0 and resumed.settings_changes == rec.changes


def test_a_sensitive_domain_change_re_checks_the_buffered_values():
    core = WorkerCore(parsed(oyster_raw()), "app", SECRET)
    value, ps = committed_record(core, messages(1500))
    order = [d.field for d in ps.engine.reader.domains]          # the order of a record's sensitive values
    fare, category = order.index("full_fare_pence"), order.index("product_category")
    fares = [s[fare] for s in ps.engine.buffer.sensitive]
    assert any(f is not None and f > 50 for f in fares) and any(f is not None and f <= 50 for f in fares)
    raw = oyster_raw()
    raw["sensitive"]["domains"]["full_fare_pence"]["upper"] = 50                  # narrowed
    raw["sensitive"]["domains"]["product_category"]["values"].remove("staff")       # "staff" -> "other"
    changed = WorkerCore(parsed(raw), "app", SECRET)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=changed.kid,
                          settings=changed.settings, accept_config_change=True)
    resumed = changed.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    assert [d.field for d in resumed.engine.reader.domains] == order
    after = resumed.engine.buffer.sensitive
    assert all(s[fare] is None or s[fare] <= 50 for s in after)
    assert sum(s[fare] is None for s in after) == sum(f is None or f > 50 for f in fares)        # refused: null
    assert "staff" not in {s[category] for s in after}
    buffered = set(resumed.engine.buffer.tokens)
    out = changed.process(resumed, messages(3000)[1500:])
    out.messages += changed.flush(resumed).messages
    # only events read after the change meet the new domain at the door; every buffered record is placed
    dead = [json.loads(v) for t, _, v in out.messages if t == TOPICS.deadletter]
    assert dead and all(d["source"]["offset"] >= 1500 for d in dead)
    placed = {json.loads(v)["audit_token"] for t, _, v in out.messages if t == TOPICS.records("oyster")}
    for t, _, v in out.messages:
        if t == TOPICS.releases:
            placed.update(tok for toks in json.loads(v)["suppressed_tokens"].values() for tok in toks)
    assert buffered <= placed


# ---------------------------------------------------------------- every setting the audit reads, release by release
def bundled_raw(name: str, **stream) -> dict:
    """A bundled config's document without its DP aggregates, ``stream``: [stream] keys replaced."""
    raw = tomllib.loads(contract.config_path(name).read_text())
    raw.pop("dp", None)
    raw.pop("aggregates", None)
    raw["stream"].update(stream)
    return raw


def window_split(events: list[dict], window_s: float) -> int:
    """The index of the first event of the window after the middle event's: a flush before it leaves no later event
    late."""
    seconds = [datetime.fromisoformat(e["event_time"]).timestamp() for e in events]
    boundary = (seconds[len(events) // 2] // window_s + 1) * window_s
    return next(i for i, t in enumerate(seconds) if t >= boundary)


def collect(messages, stream: str, into: dict | None = None) -> dict:
    into = into if into is not None else {"records": [], "manifests": [], "deadletters": []}
    kinds = {TOPICS.releases: "manifests", TOPICS.deadletter: "deadletters", TOPICS.records(stream): "records"}
    for topic, _, value in messages:
        if topic in kinds:
            into[kinds[topic]].append(json.loads(value))
    return into


def across(old_raw: dict, new_raw: dict, events: list[dict]) -> tuple[dict, st.Recovery]:
    """The first part of ``events`` under ``old_raw``, flushed (a quasi-identifier or sensitive field changes only
    with nothing buffered), the change accepted, the rest under ``new_raw``: the outputs, and the recovery without
    the step."""
    stream = old_raw["stream"]["name"]
    msgs = [(i, json.dumps(e).encode()) for i, e in enumerate(events)]
    split = window_split(events, old_raw["anonymization"]["window_s"])
    old = WorkerCore(parsed(old_raw), "app", SECRET)
    ps = old.open_partition(0)
    out = collect(old.process(ps, msgs[:split]).messages + old.flush(ps).messages, stream)
    value = st.encode_state(old.committed(ps, ps.offset))
    new = WorkerCore(parsed(new_raw), "app", SECRET)
    halted = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=new.kid, settings=new.settings)
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=new.kid, settings=new.settings,
                          accept_config_change=True)
    resumed = new.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    collect(new.process(resumed, msgs[split:]).messages + new.flush(resumed).messages, stream, out)
    return out, halted


def audit_config(tmp_path, name: str, raw: dict) -> AuditConfig:
    copy_hierarchies(tmp_path)
    (tmp_path / name).write_text(toml_text(raw))
    return AuditConfig.from_toml(tmp_path / name)


def raw_events(events: list[dict], topic: str) -> list:
    return [((topic, 0, i), json.dumps(e).encode()) for i, e in enumerate(events)]


def failed(report) -> dict:
    return {name: check["violations_by_kind"] for name, check in report.checks.items() if not check["passed"]}


def judged_across(tmp_path, old_raw: dict, new_raw: dict, events: list[dict], key: str, check: str) -> dict:
    """Run ``events`` across the change, then audit: with the new config and the old one as --earlier-config the
    stream passes (releases before the change judged by the old config); with the new config alone the check that
    reads ``key`` fails in one line per changed setting it reads, naming the value the releases before were made
    under. The outputs."""
    out, halted = across(old_raw, new_raw, events)
    assert halted.halt == st.HALT_CONFIG_CHANGED and key in [c.split(" ")[0] for c in halted.changes], halted.changes
    changed = [m for m in out["manifests"] if m.get("settings_changed")]
    assert len(changed) == 1 and changed[0]["settings_changed"] == halted.changes
    raw = raw_events(events, old_raw["stream"]["input_topic"])
    new, old = audit_config(tmp_path, "new.toml", new_raw), audit_config(tmp_path, "old.toml", old_raw)
    report = audit(raw, out, SECRET, new, earlier_configs=[old])
    assert report.verdict == "PASSED", report.format_text()
    earlier = [e for e in report.summary["settings_in_force"] if e["earlier"]]
    assert earlier and earlier[0]["releases"] == out["manifests"].index(changed[0])   # every release before the change
    alone = audit(raw, out, SECRET, new)
    named = [e["line"].split(" was made under ")[1].split(" ")[0]
             for e in alone.checks[check]["examples"] if e.get("line")]
    assert key in named and set(named) <= {c.split(" ")[0] for c in halted.changes}, alone.format_text()
    assert check in failed(alone)
    return out


def test_a_quasi_identifiers_bound_changed_is_judged_by_the_bounds_of_each_release(tmp_path):
    """citibike's birth year lower bound 1931 -> 1920: a class holding a trip without a birth year publishes the
    whole domain, [1931, 1999] before the change; under the new bounds that interval does not cover it."""
    events = load_events("citibike", limit=3000)
    assert any((e.get("signals") or {}).get("birth_year") is None for e in events)
    old_raw, new_raw = bundled_raw("citibike"), bundled_raw("citibike")
    next(q for q in new_raw["quasi_identifiers"] if q["name"] == "birth_year")["lower"] = 1920
    out = judged_across(tmp_path, old_raw, new_raw, events, "quasi_identifiers.birth_year.lower", "coverage")
    assert out["manifests"][0]["settings_fingerprint"] != out["manifests"][-1]["settings_fingerprint"]


SEVERITY = {"kind": "severity", "field": "fare_product", "severity": {"PAYG": 2, "Other": 3}}


def test_a_severity_rule_changed_is_judged_by_the_rule_of_each_release(tmp_path):
    """oyster's severity rule on fare_product gets a disabled person's pass at 12: the classes made before under
    the old rule (a Freedom Pass (Disabled) among 10 individuals) would fail the new one."""
    events = load_events("oyster", limit=3000)
    old_raw, new_raw = bundled_raw("oyster"), bundled_raw("oyster")
    old_raw["anonymization"]["criteria"] = [SEVERITY]
    new_raw["anonymization"]["criteria"] = [{**SEVERITY, "severity": {**SEVERITY["severity"],
                                                                      "Freedom Pass (Disabled)": 12}}]
    out = judged_across(tmp_path, old_raw, new_raw, events, "anonymization.criteria[0]", "severity")
    # the whole rule is in the manifest (not cut), so the audit tells the two rules apart
    assert '"Freedom Pass (Disabled)": 12.0' in next(m for m in out["manifests"] if m.get("settings_changed"))[
        "settings_changed"][0]


def test_a_field_moved_from_the_sensitive_to_the_dropped_ones_is_judged_by_the_fields_of_each_release(tmp_path):
    """oyster's fare_product stops being published (dropped as an identifier): its values in the releases before
    were published under the old config, where they were sensitive values; after, any would be a leak."""
    events = load_events("oyster", limit=3000)
    old_raw, new_raw = bundled_raw("oyster"), bundled_raw("oyster")
    new_raw["sensitive"]["fields"].remove("fare_product")
    del new_raw["sensitive"]["domains"]["fare_product"]
    new_raw["identifiers"]["drop"].append("fare_product")
    out = judged_across(tmp_path, old_raw, new_raw, events, "identifiers.drop", "leaks")
    after = out["manifests"].index(next(m for m in out["manifests"] if m.get("settings_changed")))
    later = {m["release_id"] for m in out["manifests"][after:]}
    assert all("fare_product" not in r["sensitive"] for r in out["records"] if r["release_id"] in later)
    assert any("fare_product" in r["sensitive"] for r in out["records"] if r["release_id"] not in later)


def cards_raw(unit: str) -> dict:
    """oyster-cards without DP and m (unit: its privacy unit)."""
    raw = bundled_raw("oyster-cards", privacy_unit=unit)
    del raw["anonymization"]["m"], raw["sensitive"]["invariant"]
    return raw


def test_a_privacy_unit_changed_halts_is_refused_in_place_and_a_new_lineage_is_judged_by_each_unit(tmp_path):
    """oyster-cards from the journey to the card as the unit of privacy: halted without the step, refused with it
    (k, signatures and ledgers count the old unit); a new lineage under the card places every event again, and the
    audit with the new config judges the superseded lineage by the journey its manifests state (by the card, its
    classes of 10 journeys hold fewer cards)."""
    events = load_events("oyster-cards", limit=3000)
    msgs = [(i, json.dumps(e).encode()) for i, e in enumerate(events)]
    first = WorkerCore(parsed(cards_raw("journey_id")), "app", SECRET)
    ps = first.open_partition(0, lineage="L1")
    out = collect(first.process(ps, msgs).messages + first.flush(ps).messages, "oyster-cards")
    value = st.encode_state(first.committed(ps, ps.offset))
    cards = WorkerCore(parsed(cards_raw("card_id")), "app", SECRET)
    kw = dict(marker=ps.seq, committed_input=ps.offset + 1, kid=cards.kid, settings=cards.settings)
    halted = st.choose_state([value], **kw)
    assert halted.halt == st.HALT_CONFIG_CHANGED and halted.changes == ["stream.privacy_unit journey_id -> card_id"]
    rec = st.choose_state([value], accept_config_change=True, **kw)
    with pytest.raises(ConfigChangeRefused, match=r"^stream.privacy_unit journey_id -> card_id: k, the m-invariance "
                                                   r"signatures and the DP ledgers count .* --new-lineage"):
        cards.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    # the step: a new lineage (a new app id and --new-lineage; here its partition opened as the worker opens it)
    notes = {"lineage_started": {"lineage": "L2", "supersedes": ["L1"], "reason": "privacy unit changed"}}
    ps2 = cards.open_partition(0, lineage="L2", notes=notes)
    collect(cards.process(ps2, msgs).messages + cards.flush(ps2).messages, "oyster-cards", out)
    assert {m["privacy_unit"] for m in out["manifests"]} == {"journey_id", "card_id"}
    raw = raw_events(events, "raw.fare.oyster-cards")
    report = audit(raw, out, SECRET, audit_config(tmp_path, "cards.toml", cards_raw("card_id")))
    lineages = report.summary["lineages"]
    assert report.verdict == "PASSED" and {n: f["verdict"] for n, f in lineages.items()} == {
        "L1": "PASSED", "L2": "PASSED"}, report.format_text()
    assert lineages["L1"]["judged_by_its_own"] == ["stream.privacy_unit journey_id (the config: card_id)"]
    # judged by the card, the journeys' lineage fails k: the unit its manifests state is what makes it pass
    unstated = {**out, "manifests": [{k: v for k, v in m.items() if k != "privacy_unit"} for m in out["manifests"]]}
    report = audit(raw, unstated, SECRET, audit_config(tmp_path, "cards.toml", cards_raw("card_id")))
    assert "k [L1]" in failed(report) and "k [L2]" not in failed(report)


def test_the_unit_the_event_time_the_input_mapping_and_with_m_the_invariant_are_refused_in_place():
    """Refused even when accepted, each in one line naming the step; a state written before these settings were
    recorded (no stream.privacy_unit in it) takes their first recording."""
    old = {"stream.privacy_unit": "card_id", "stream.event_time": "event_time", "anonymization.m": 3,
           "sensitive.invariant": "product_category", "input.format": "csv"}
    new = {**old, "stream.privacy_unit": "journey_id", "stream.event_time": "tapped_at",
           "sensitive.invariant": "full_fare_pence", "input.format": "json"}
    from stream_anon import guarantees
    lines = guarantees.changes(old, new)
    with pytest.raises(ConfigChangeRefused) as refused:
        check_change(lines, {}, old, new)
    named = [part.split(":")[0] for part in str(refused.value).split("; ")]
    assert named == lines and str(refused.value).count("a new app id and --new-lineage") == 4
    before = {"anonymization.m": None}                   # a state that never recorded the stream's settings
    check_change(guarantees.changes(before, {**new, "anonymization.m": None, "sensitive.invariant": None}), {},
                 before, {**new, "anonymization.m": None})


def test_an_input_mapping_changed_is_refused_in_place_and_each_lineage_is_read_through_its_own(tmp_path):
    """configs/inputs/oyster-csv.toml reads the raw CSV's naive times in Europe/London; the new config reads them in
    Atlantic/Azores (an hour later in November). Refused in place (every event's values are read through the
    mapping); a new lineage reads the same raw messages the new way. The audit with the new config and the old one
    as --earlier-config reads each lineage's raw messages as that lineage did; without the old config the superseded
    lineage fails one check, ``input``, naming the reading its manifests state."""
    from stream_anon.audit.inputs import raw_decoder
    from stream_anon.inputs import file_messages
    root = contract.configs_dir()
    text = (root / "inputs" / "oyster-csv.toml").read_text().replace('"../', '"')     # its files beside it
    new_raw = tomllib.loads(text)
    new_raw["input"]["timezone"] = "Atlantic/Azores"
    copy_hierarchies(tmp_path)
    (tmp_path / "lookups").mkdir()
    for f in (root / "lookups").glob("*.csv"):
        (tmp_path / "lookups" / f.name).write_bytes(f.read_bytes())
    paths = {"old": tmp_path / "old.toml", "new": tmp_path / "new.toml"}
    paths["old"].write_text(text)
    paths["new"].write_text(toml_text(new_raw))
    old_cfg, new_cfg = load_config(paths["old"]), load_config(paths["new"])
    data = contract.configs_dir().parent / "data" / "oyster_slice.csv.gz"
    messages = list(file_messages(data, old_cfg.input))[:3000]
    msgs = list(enumerate(messages))
    first = WorkerCore(old_cfg, "app", SECRET)
    ps = first.open_partition(0, lineage="L1")
    out = collect(first.process(ps, msgs).messages + first.flush(ps).messages, "oyster-csv")
    value = st.encode_state(first.committed(ps, ps.offset))
    second = WorkerCore(new_cfg, "app", SECRET)
    kw = dict(marker=ps.seq, committed_input=ps.offset + 1, kid=second.kid, settings=second.settings)
    halted = st.choose_state([value], **kw)
    assert halted.halt == st.HALT_CONFIG_CHANGED and halted.changes and \
        all(c.startswith("input.") for c in halted.changes), halted.changes
    rec = st.choose_state([value], accept_config_change=True, **kw)
    with pytest.raises(ConfigChangeRefused, match="read through the mapping"):
        second.open_partition(0, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes)
    notes = {"lineage_started": {"lineage": "L2", "supersedes": ["L1"], "reason": "input mapping changed"}}
    ps2 = second.open_partition(0, lineage="L2", notes=notes)
    collect(second.process(ps2, msgs).messages + second.flush(ps2).messages, "oyster-csv", out)
    assert len({m["input_digest"] for m in out["manifests"]}) == 2

    raw = [(("raw.fare.oyster-csv", 0, i), m) for i, m in enumerate(messages)]

    def reread(config):
        return raw_decoder(config.source, SECRET)(raw)

    new, old = AuditConfig.from_toml(paths["new"]), AuditConfig.from_toml(paths["old"])
    report = audit(reread(new), out, SECRET, new, earlier_configs=[old], reread=reread)
    lineages = report.summary["lineages"]
    assert {n: f["verdict"] for n, f in lineages.items()} == {"L1": "PASSED", "L2": "PASSED"}, report.format_text()
    assert lineages["L1"]["judged_by_its_own"] == [f"input_digest {old.input_digest} (the config: {new.input_digest})"]
    # read the new way, the first lineage's times are an hour off its published intervals: said, and seen
    assert {"input [L1]", "coverage [L1]"} <= set(failed(audit(reread(new), out, SECRET, new, earlier_configs=[old])))
    alone = audit(reread(new), out, SECRET, new, reread=reread)
    assert failed(alone)["input [L1]"] == {"input read otherwise": 1} and "input [L2]" not in failed(alone)
