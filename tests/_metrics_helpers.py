"""A DP worker with its web port on the embedded broker (the bundled oyster config on a real slice, renamed so
that it shares no topic with other tests), and readers of the Prometheus text format and the metrics reference."""
from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _kafka_helpers import wait_for  # noqa: E402

from stream_anon.broker import free_port  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.demo import derived_config  # noqa: E402
from stream_anon.kafka.supervise import OutputReader, start_worker_process  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "operations.md"
RETENTION_S = 86400          # [stream] input_retention_s of the DP worker


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:             # not listening (yet), or no answer in time
        return 0, ""


def dp_stream(tmp_path: Path, name: str):
    """(config path, config): configs/oyster.toml ([dp] per journey and day) as stream ``name``, its raw topic
    declared to keep events :data:`RETENTION_S`."""
    (tmp_path / "cfg").mkdir(parents=True, exist_ok=True)
    path = derived_config("oyster", tmp_path / "cfg", dp=True)
    text = path.read_text().replace('name = "oyster"', f'name = "{name}"', 1)
    # the raw topic's retention declared: the worker creates it so and its retention guard finds it within
    text = text.replace('input_topic = "raw.fare.oyster"', f'input_topic = "raw.test.{name}"\n'
                        f'input_retention_s = {RETENTION_S}', 1)
    path.write_text(text)
    return path, load_config(path)


def across_midnight(events: list[dict]) -> list[dict]:
    """``events`` (in time order) with their event times moved by one offset so that the middle one falls at the
    start of 2009-11-10 (London is on UTC in November): the DP aggregates of configs/oyster.toml (a period of a day)
    release the end of the 9th, in the batch that opens the 10th, and run into the 10th."""
    from datetime import datetime, timezone
    midnight = datetime(2009, 11, 10, tzinfo=timezone.utc)
    shift = midnight - datetime.fromisoformat(events[len(events) // 2]["event_time"])
    return [{**e, "event_time": (datetime.fromisoformat(e["event_time"]) + shift).isoformat()} for e in events]


def start_dp_worker(bootstrap: str, tmp_path: Path, name: str, events: list[dict]):
    """Replay ``events``, start a worker (flush when idle 2 s) and wait until every event is accounted; returns
    (process, web port, config)."""
    from stream_anon.kafka.replay import replay
    from stream_anon.kafka.topics import ensure_stream_topics

    path, cfg = dp_stream(tmp_path, name)
    ensure_stream_topics(bootstrap, cfg)
    replay(bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False)
    port = free_port()
    proc = start_worker_process(path, bootstrap, tmp_path / "state", f"{name}-app", 2.0, tmp_path / "w.log",
                                extra=["--web-port", str(port), "--metrics-interval", "1"])
    reader = OutputReader(bootstrap, name)
    try:
        def done():
            reader.poll(300)
            a = reader.accounting()
            return a if a["accounted"] >= len(events) and a["deferred"] == 0 else None
        wait_for(done, 240, f"{len(events)} events accounted")
    finally:
        reader.close()
    wait_for(lambda: get(port, "/readyz")[0] == 200, 60, "/readyz")
    return proc, port, cfg


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")


def families(text: str) -> dict[str, dict]:
    """Family name -> {"type", "labels": label names seen on its samples, "samples": [(name, labels, value)]}."""
    out: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            out[name] = {"type": kind, "labels": set(), "samples": []}
            current = name
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            out[current]["labels"].update(labels)
            out[current]["samples"].append((m.group(1), labels, float(m.group(4))))
    return out


def reference() -> dict[str, dict]:
    """The metrics reference table of docs/operations.md: series -> {"type", "labels"}."""
    text = REFERENCE.read_text()
    section = text[text.index("### Metrics reference"):]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("## ") or line.startswith("### "):
            break
        m = re.match(r"^\| `(stream_anon_\w+)` \| (\w+) \|([^|]*)\| ([^|]+) \| ([^|]+) \|$", line)
        if m:
            labels = {x.strip() for x in m.group(3).split(",") if x.strip()}
            rows[m.group(1)] = {"type": m.group(2), "labels": labels, "meaning": m.group(4).strip(),
                                "unit": m.group(5).strip()}
    return rows
