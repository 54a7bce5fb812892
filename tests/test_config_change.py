"""A configuration changed on existing state is never taken silently: the partition halts with one line per changed
guarantee setting, unless the operator accepts the change (``--accept-config-change``); then every published class
is retired from reuse, open windows are re-windowed under a new ``window_s``, the change is written into the next
release manifest, buffered records are recoded under a changed hierarchy or domain, and m is refused in place (it
needs a new state; DP changes: tests/test_dp_config_change.py)."""
from __future__ import annotations

import copy
import json
import tomllib

import pytest

from stream_anon import contract, crypto
from stream_anon.audit import AuditConfig, audit
from stream_anon.config import load_config, parse_config
from stream_anon.datasets import load_events
from stream_anon.kafka import state as st
from stream_anon.kafka.core import WorkerCore
from stream_anon.kafka.partition import ConfigChangeRefused
from stream_anon.render import TOPICS

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
    for aggregate in raw["aggregates"]:                                          # (tests/test_dp_config_change.py)
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
