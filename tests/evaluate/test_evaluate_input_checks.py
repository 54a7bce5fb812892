"""``stream-anon evaluate --config --file`` applies the worker's input checks (issue 29, item 5): on files holding
events the worker dead-letters (sensitive values outside ``[sensitive.domains]``, unreadable rows, unknown event
types, times outside the quasi-identifier's domain, oversized messages, duplicates, far-future times), evaluate
rejects the same events, for the same reasons, as the worker's core fed the messages ``stream-anon replay``
sends, and reports the count by reason."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

from stream_anon.config import load_config
from stream_anon.evaluate import read_own_events
from stream_anon.worker.core import WorkerCore
from stream_anon.worker.stats import reason_kind
from stream_anon.render import TOPICS

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"evaluate-input-checks-secret-0123456789"


def _worker_deadletters(config, messages: list[bytes]) -> list[tuple[object, str]]:
    """(source, reason kind) of every dead letter the worker's core writes for ``messages`` on one partition, fed
    in batches of 500 as a consumer would hand them over."""
    core = WorkerCore(config, "evaluate-checks", SECRET)
    out = []
    for start in range(0, len(messages), 500):
        out += core.handle([(0, off, raw) for off, raw in enumerate(messages[start:start + 500], start)])
    out += core.flush_all()
    dead = [json.loads(v) for topic, _k, v in out if topic == TOPICS.deadletter]
    return sorted(((d["source"]["offset"], d["source"]["index"]) if "index" in d["source"] else d["source"]["offset"],
                   reason_kind(d["reason"])) for d in dead)


def _evaluate_rejections(checked) -> list[tuple[object, str]]:
    return sorted((source, reason_kind(reason)) for source, reason in checked.reasons)


def test_mapped_csv_with_domains(tmp_path, capsys):
    """configs/inputs/oyster-csv.toml (fares declared in [0, 2000]) on 1,500 rows of the bundled slice with bad
    rows put in among them."""
    from stream_anon.kafka.replay import mapped_messages
    path = ROOT / "configs" / "inputs" / "oyster-csv.toml"
    config = load_config(path)
    lines = gzip.open(ROOT / "data" / "oyster_slice.csv.gz", "rt", encoding="utf-8").read().splitlines()[:1501]
    header, rows = lines[0], lines[1:]
    cols = header.split(",")
    bad = []
    for i in range(9):                       # the full fare outside its declared domain
        r = rows[100 + 50 * i].split(",")
        r[cols.index("ffare")] = "5000"
        bad.append(",".join(r))
    r = rows[20].split(",")
    r[cols.index("event_type")] = "TELEPORT"  # no event type the lookup knows
    bad.append(",".join(r))
    r = rows[30].split(",")
    r[cols.index("time")] = "31:00"          # after the time quasi-identifier's upper bound (30:00)
    bad.append(",".join(r))
    r = rows[40].split(",")
    r[cols.index("ffare")] = "a lot"         # not an integer
    bad.append(",".join(r))
    bad.append("Mon,05:00,ENDTRIP")          # a row cut short
    r = rows[60].split(",")
    r[cols.index("station")] = "X" * 5000    # larger than [limits] max_event_bytes
    bad.append(",".join(r))
    mixed = rows[:]
    for j, row in enumerate(bad):
        mixed.insert(37 * (j + 1), row)
    data = tmp_path / "taps.csv"
    data.write_text("\n".join([header, *mixed]) + "\n")

    checked = read_own_events(config, data)
    assert checked.events_in == len(mixed) == 1500 + len(bad)
    assert checked.rejected["sensitive full_fare_pence"] == 9
    assert checked.n_rejected >= len(bad) and checked.n_rejected + len(checked.events) == checked.events_in
    # the worker, fed what `stream-anon replay` sends for the file, dead-letters the same events for the same reasons
    messages = [raw for _key, raw in mapped_messages(data, config, SECRET)]
    assert len(messages) == len(mixed)
    assert _evaluate_rejections(checked) == _worker_deadletters(config, messages)

    from stream_anon.cli import main
    out = tmp_path / "eval"
    assert main(["evaluate", "--config", str(path), "--file", str(data), "--k", "10", "--strategies", "mondrian",
                 "--no-baselines", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{checked.events_in} events, {checked.n_rejected} rejected by the worker's input checks (" in printed
    assert "sensitive full_fare_pence 9" in printed
    report = json.loads((out / "input_checks.json").read_text())
    assert report["rejected_by_reason"] == dict(checked.rejected) and report["accepted"] == len(checked.events)
    row = json.loads((out / "comparison.json").read_text())[0]
    assert row["streaming_events"] == row["n"] == len(checked.events)       # the engine saw only accepted events


def test_builtin_jsonl_with_domains_duplicates_and_future_times(tmp_path):
    """configs/oyster.toml (the built-in event shape, schema-checked) on JSON lines: a fare outside its domain,
    malformed JSON, a wrong kind, a schema failure, a resent event and a time far beyond the stream
    (max_future_s 6 h)."""
    from stream_anon.datasets import load_events
    config = load_config(ROOT / "configs" / "oyster.toml")
    assert config.stream.max_future_s == 21600
    events = load_events("oyster", limit=800)
    lines = [json.dumps(e) for e in events]
    fare = dict(events[10], event_id="bad-fare", full_fare_pence=999999)
    future = dict(events[11], event_id="far-future", event_time="2009-11-10T05:00:00+00:00")
    wrong_kind = dict(events[12], event_id="wrong-kind", kind="vehicle")
    no_type = {k: v for k, v in events[13].items() if k != "event_type"} | {"event_id": "no-type"}
    extra = [json.dumps(fare), json.dumps(future), json.dumps(wrong_kind), json.dumps(no_type), "{not json",
             json.dumps(events[5])]           # the last: a resent event (same event id)
    for j, line in enumerate(extra):
        lines.insert(100 * (j + 1), line)
    data = tmp_path / "events.jsonl"
    data.write_text("\n".join(lines) + "\n")

    checked = read_own_events(config, data)
    kinds = Counter(checked.rejected)
    assert kinds["sensitive full_fare_pence"] == 1 and kinds["duplicate_event"] == 1
    assert kinds["future_event_time"] == 1 and kinds["malformed JSON"] == 1 and kinds["wrong kind"] == 1
    assert checked.n_rejected >= len(extra)
    messages = [line.encode() for line in lines]
    assert _evaluate_rejections(checked) == _worker_deadletters(config, messages)
